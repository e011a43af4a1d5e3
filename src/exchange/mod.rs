//! One request's lifecycle, without Pingora: [`Exchange::admit`] finds the route, who is calling
//! and what the request asks of each limit, asks the policy, and says whether the request goes
//! upstream (after its shaping delay) or what the gateway answers instead; the upstream steps
//! (`upstream.rs`) choose servers within the route's deadline and keep what the attempts and
//! the response said; [`Exchange::end`] counts the request and gives back or settles what it
//! took; `overrides` holds the quota overrides in force; `explain` tells what admission would
//! do with a request without doing it; `named` keys the limits of a caller an admin call names
//! instead of sending a request. The proxy (`edge::proxy`) only
//! converts Pingora's types in and renders [`Answer`]s out.

pub(crate) mod answer;
pub mod explain;
pub(crate) mod head;
pub(crate) mod limits;
pub(crate) mod meters;
pub mod named;
pub mod overrides;
pub mod rls;
pub(crate) mod site;
mod upstream;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::caller::address_lists::{AddressLists, Standing};
use crate::caller::consumers::{AuthFailure, AuthMode, Consumer, Credentials, PlanId};
use crate::exchange::answer::{
    Answer, ClientError, Decided, Unasked, UpstreamError, CLIENT_CLOSED,
};
use crate::limiter::adaptive::Permit;
use crate::limiter::per_thread::ThreadCopies;
use crate::limiter::{Backend, Limiter, Outcome, Policy, ReleaseSlots, SettleUnits, Verdict};
use crate::route::keys::{self, RequestFacts};
use crate::route::path;
use crate::route::table::Route;
use crate::route::tiers::Undecidable;
use crate::upstream::servers::Servers;
use limits::RequestLimits;
use meters::RouteMetrics;

pub use head::{Cut, Head, Target};
pub use limits::LimitsSaid;
pub use site::{Lasting, RouteRuntime, Site, SiteLease};
pub use upstream::Dial;

/// What routing found of a request besides its route (which the exchange holds): the host,
/// path and client its keys read.
struct Routed<'h> {
    host: Cow<'h, str>,
    path: Cow<'h, str>,
    client: IpAddr,
}

/// Takes a place among the requests the route's upstream holds at once (its adaptive
/// concurrency limit, at the priority of the caller's `plan`): before the limits, so a request
/// shed costs them nothing. `Ok(None)`: the route has no such limit; `Err`: shed. A caller
/// `exempt` by its address counts in flight but is never shed.
fn hold_place<S>(
    runtime: &RouteRuntime<S>,
    exempt: bool,
    plan: Option<PlanId>,
) -> Result<Option<Permit>, Answer> {
    let (Some(limiter), Some(adaptive)) = (&runtime.adaptive, &runtime.route.adaptive) else {
        return Ok(None);
    };
    if exempt {
        return Ok(Some(limiter.enter()));
    }
    match limiter.admit(adaptive.level(plan)) {
        Some(permit) => Ok(Some(permit)),
        None => {
            runtime.metrics.count_shed(plan);
            Err(Answer::Shed)
        }
    }
}

/// What a policy's engine must do for an exchange: decide, release slots, settle units, say
/// whether it answers (the production [`crate::limiter::Engine`], or a test's stand-in).
pub trait Seam: Limiter + ReleaseSlots + SettleUnits + Backend {}

impl<E: Limiter + ReleaseSlots + SettleUnits + Backend> Seam for E {}

/// What admission says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It goes upstream once `delay` (shaping, `max_delay`) has passed.
    Admitted { delay: Duration },
    /// The gateway answers it itself.
    Answered(Answer),
}

/// One request, from its head to its end, under the configuration it started with; `S` is
/// what its routes' servers are (`upstream::servers::Servers`: Pingora's pools at the edge).
pub struct Exchange<S: Servers> {
    site: SiteLease<S>,
    started: Instant,
    route: Option<Arc<RouteRuntime<S>>>,
    target: Target,
    /// The normalized path when it differs from the one received: the upstream gets this one.
    normalized_path: Option<String>,
    /// The client the request is keyed on (the peer, or the first untrusted forwarding hop).
    client: Option<IpAddr>,
    /// Consistent-hashing key for the upstream pool.
    balance_key: [u8; 8],
    /// Its limits: the tier it meets, a record per limit, the verdict on them.
    limits: RequestLimits,
    /// What the gateway answers (or answered) instead of the upstream, once it knows.
    answer: Option<Answer>,
    /// The verified caller (`None`: anonymous, or the route does not verify callers).
    consumer: Option<Consumer>,
    /// The client's address is in an `allow` range: proxied without asking the limits.
    exempt: bool,
    /// When the route's `request_timeout` runs out.
    deadline: Option<Instant>,
    /// Request body bytes received so far, and when the last of them arrived.
    body_bytes: u64,
    body_at: Option<Instant>,
    /// Why the client failed the request, if it did.
    client_error: Option<ClientError>,
    upstream: upstream::Attempts,
    /// The routed request is counted in flight (its route's gauge) until it ends.
    in_flight: bool,
    /// Its place among the requests its route's upstream holds (adaptive concurrency), until
    /// the upstream's response head (or its failure, or the request's end).
    permit: Option<Permit>,
}

impl<S: Servers> Exchange<S> {
    /// Takes the request off its route's in-flight gauge, once.
    fn no_longer_in_flight(&mut self) {
        if std::mem::take(&mut self.in_flight) {
            if let Some(runtime) = &self.route {
                runtime.metrics.leave();
            }
        }
    }
}

/// A request dropped before its end (its connection gone mid-await) still leaves the gauge,
/// and every request gives its retry budget place back here.
impl<S: Servers> Drop for Exchange<S> {
    fn drop(&mut self) {
        self.no_longer_in_flight();
        self.leave_retry_budget();
    }
}

impl<S: Servers> Exchange<S> {
    /// A request that arrived at `started`, under `site`.
    pub fn new(site: SiteLease<S>, started: Instant) -> Exchange<S> {
        Exchange {
            site,
            started,
            route: None,
            target: Target::Origin,
            normalized_path: None,
            client: None,
            balance_key: [0; 8],
            limits: RequestLimits::default(),
            answer: None,
            consumer: None,
            exempt: false,
            deadline: None,
            body_bytes: 0,
            body_at: None,
            client_error: None,
            upstream: upstream::Attempts::default(),
            in_flight: false,
            permit: None,
        }
    }

    /// Route, client, keys, then the policy's verdict: whether the request goes upstream.
    pub async fn admit<E: Seam>(&mut self, policy: &Policy<E>, head: &Head<'_>) -> Admission {
        let prepared = self.prepare(head);
        if let Some(runtime) = &self.route {
            runtime.metrics.enter();
            self.in_flight = true;
        }
        if let Err(answer) = prepared {
            return self.answer(answer);
        }
        let Some(runtime) = self.route.as_deref() else {
            return self.answer(Answer::NoRoute);
        };
        self.deadline = runtime.route.request_timeout.map(|t| self.started + t);
        let plan = self.consumer.as_ref().and_then(|consumer| consumer.plan);
        match hold_place(runtime, self.exempt, plan) {
            Ok(permit) => self.permit = permit,
            Err(answer) => return self.answer(answer),
        }
        if self.exempt {
            return Admission::Admitted {
                delay: Duration::ZERO,
            };
        }
        let verdict = self.limits.decide(&runtime.route, policy).await;
        let refusal = Answer::refusing(verdict.outcome);
        let delay = verdict.delay;
        match refusal {
            Some(answer) => {
                // It will not reach the upstream: its place goes back at once.
                self.permit = None;
                self.answer(answer)
            }
            None => Admission::Admitted { delay },
        }
    }

    /// Finds the request's route, who is calling and what it asks of each limit; `Err` when
    /// the gateway answers the request itself.
    fn prepare(&mut self, head: &Head<'_>) -> Result<(), Answer> {
        let routed = self.route_request(head)?;
        let consumer = self.caller(self.routed()?, head)?;
        self.ask_limits(head, &routed, consumer, false)
    }

    /// Checks the request's head, finds its route and its client, and the client's standing
    /// in the address lists. What it found stays in the exchange even when it refuses (a
    /// denied client's route).
    fn route_request<'h>(&mut self, head: &Head<'h>) -> Result<Routed<'h>, Answer> {
        let req = head.parts;
        if let Some(answer) = head::oversized(req, head.cut) {
            return Err(answer);
        }
        self.target = head::target(head)?;
        let host_header = head::check_host(req)?;
        let config = &self.site.config;
        let host = head::host_from(req, host_header);
        let path = match self.target {
            Target::Asterisk => Cow::Borrowed("/"),
            _ => path::normalize(req.uri.path(), config.paths)
                .map_err(|error| Answer::BadRequest(error.detail()))?,
        };
        let runtime = self
            .site
            .find(&host, &path, &req.method)
            .ok_or(Answer::NoRoute)?;
        let route = &runtime.route;
        self.route = Some(Arc::clone(runtime));
        self.normalized_path = matches!(path, Cow::Owned(_)).then(|| path.to_string());
        let client = config.trusted_proxies.client(head.peer, &req.headers);
        self.client = Some(client);
        let declared = head::declared_body_length(req);
        if route.max_body_bytes.is_some_and(|max| declared > Some(max)) {
            return Err(Answer::BodyTooLarge);
        }
        match AddressLists::standing(&config.addresses, &route.addresses, client) {
            Standing::Denied => return Err(Answer::Forbidden),
            Standing::Exempt => self.exempt = true,
            Standing::Limited => {}
        }
        Ok(Routed { host, path, client })
    }

    /// The tier `consumer` meets on the request's route, and what the request asks of each
    /// of its limits (none for an exempt client; `explaining`: nothing taken of the route's
    /// state). `Err`: the request cannot be decided as sent.
    fn ask_limits(
        &mut self,
        head: &Head<'_>,
        routed: &Routed<'_>,
        consumer: Option<Consumer>,
        explaining: bool,
    ) -> Result<(), Answer> {
        let req = head.parts;
        let route = &*self.route.as_ref().ok_or(Answer::Internal)?.route;
        self.consumer = consumer;
        let tier = self.site.tier_for(route, self.consumer.as_ref());
        self.limits.meet(tier);
        let facts = RequestFacts {
            client_ip: routed.client,
            method: req.method.as_str(),
            host: &routed.host,
            path: &routed.path,
            query: req.uri.query(),
            headers: &req.headers,
            route: &route.name,
            consumer: self.consumer.as_ref(),
            claim_names: self.site.config.consumers.claim_names(),
        };
        if let Some(parts) = route.upstream.hash_parts() {
            self.balance_key = keys::digest_parts(&facts, parts).to_be_bytes();
        }
        if self.limits.limited(route) && !self.exempt {
            let runtime = self.route.as_deref().ok_or(Answer::Internal)?;
            self.limits
                .ask(runtime, &facts, explaining)
                .map_err(|Undecidable(detail)| Answer::BadRequest(detail))?;
        }
        Ok(())
    }

    /// Who is calling, as the route asks (`auth:`): the verified consumer, `None` for an
    /// anonymous caller; `Err` when the caller is refused before any limit.
    fn caller(&self, route: &Route, head: &Head<'_>) -> Result<Option<Consumer>, Answer> {
        if route.auth.mode == AuthMode::Off {
            return Ok(None);
        }
        let credentials = Credentials {
            headers: &head.parts.headers,
            client_certificate: head.client_certificate,
        };
        let now = self.site.clock.now_us().max(0) as u64 / 1_000_000;
        let identified =
            self.site
                .config
                .consumers
                .identify(&credentials, now, self.site.jwt.as_deref());
        // A plan override puts the consumer on its plan before anything reads the plan.
        match identified.map(|found| found.map(|c| self.site.on_plan_in_force(c))) {
            Ok(Some(consumer)) if route.auth.admits(&consumer) => Ok(Some(consumer)),
            Ok(Some(_)) => Err(Answer::AuthFailed(AuthFailure::PlanNotAllowed)),
            Ok(None) if route.auth.mode == AuthMode::Required => {
                Err(Answer::AuthFailed(AuthFailure::Missing))
            }
            Ok(None) => Ok(None),
            Err(failure) => Err(Answer::AuthFailed(failure)),
        }
    }

    /// The request's route, once routing found it.
    fn routed(&self) -> Result<&Route, Answer> {
        let runtime = self.route.as_deref().ok_or(Answer::Internal)?;
        Ok(&runtime.route)
    }

    /// Keeps `answer` as what the gateway answers, and says so.
    fn answer(&mut self, answer: Answer) -> Admission {
        self.answer = Some(answer);
        Admission::Answered(answer)
    }

    /// The admitted request will not go upstream (its client left while it was held for
    /// shaping): the units it reserved go back.
    pub async fn abandon<E: Seam>(&mut self, policy: &Policy<E>) {
        if let Some(runtime) = &self.route {
            self.limits.abandon(&runtime.route, policy).await;
        }
    }

    /// The request has ended with `status` (`None`: nothing was answered): counts it, gives
    /// back its concurrency slots, and settles what its response said it cost.
    pub async fn end<E: Seam>(&mut self, policy: &Policy<E>, status: Option<u16>) {
        let decided = self.decided();
        let metrics = self.metrics();
        metrics.count(decided);
        let failure = match self.answer {
            Some(Answer::AuthFailed(failure)) => Some(failure),
            _ => None,
        };
        metrics.count_caller(
            self.consumer.as_ref().and_then(|c| c.plan),
            decided,
            failure,
        );
        if let Some(shown) = self.status_shown(status) {
            metrics.observe_duration(shown, self.elapsed());
        }
        if matches!(
            decided,
            Decided::Limiter(Outcome::Limited | Outcome::FallbackLimited)
        ) {
            self.note_limited();
        }
        if let (Some(sent), true) = (status, self.admitted()) {
            metrics.count_upstream_status(sent);
        }
        if let Some(upstream_time) = self.upstream.time {
            metrics.observe_upstream(upstream_time);
        }
        // A place still held (no response head came) goes back, unsampled.
        self.permit = None;
        if let Some(runtime) = &self.route {
            let route = (&*runtime.route, &runtime.metrics);
            self.limits.end(route, policy).await;
        }
        self.no_longer_in_flight();
    }

    /// The status the access log and the request duration show: the one sent, or `499`
    /// (nginx's "client closed request") when the client left before any was.
    pub fn status_shown(&self, sent: Option<u16>) -> Option<u16> {
        let closed = self.client_error == Some(ClientError::Closed);
        sent.or(closed.then_some(CLIENT_CLOSED))
    }

    /// Why the client failed the request, if it did.
    pub fn client_error(&self) -> Option<ClientError> {
        self.client_error
    }

    /// The request went (or goes) upstream.
    fn admitted(&self) -> bool {
        self.exempt || self.limits.verdict().is_some_and(Verdict::admitted)
    }

    /// Counts the key that denied the request, and its consumer, among the most limited (the
    /// dashboard's top-k): on denials only.
    fn note_limited(&self) {
        let Some(route) = self.route() else {
            return;
        };
        if let Some((limit, key)) = self.limits.denied_key() {
            if let Ok(key) = std::str::from_utf8(key) {
                self.site
                    .views
                    .limited_keys
                    .count(&[&route.name, "/", limit, " ", key]);
            }
        }
        if let Some(consumer) = &self.consumer {
            self.site.views.limited_consumers.count(&[&consumer.id]);
        }
    }

    /// The request's `decision` label.
    pub fn decided(&self) -> Decided {
        match (self.limits.verdict(), self.answer) {
            _ if self.exempt => Decided::Unasked(Unasked::Exempt),
            (Some(verdict), _) => Decided::Limiter(verdict.outcome),
            (None, answer) => Decided::Unasked(
                answer
                    .and_then(Answer::unasked)
                    .unwrap_or(Unasked::BadRequest),
            ),
        }
    }

    /// The route's metric handles, or those of unrouted requests.
    fn metrics(&self) -> &RouteMetrics {
        match &self.route {
            Some(runtime) => &runtime.metrics,
            None => self.site.metrics.unmatched(),
        }
    }

    /// The configuration the request started with.
    pub fn site(&self) -> &Site<S> {
        &self.site
    }

    /// How long the request has taken so far, by the site's clock.
    pub fn elapsed(&self) -> Duration {
        self.since(self.started)
    }

    /// The time since `then`, by the site's clock.
    fn since(&self, then: Instant) -> Duration {
        self.site.clock.instant().saturating_duration_since(then)
    }

    pub fn route(&self) -> Option<&Route> {
        self.route.as_deref().map(|runtime| &*runtime.route)
    }

    /// The `Host` its route sends upstream instead of the client's, this thread's copy.
    pub fn upstream_host(&self) -> Option<HeaderValue> {
        let runtime = self.route.as_deref()?;
        runtime.upstream_host.as_ref().map(ThreadCopies::get)
    }

    pub fn verdict(&self) -> Option<&Verdict> {
        self.limits.verdict()
    }

    /// What the gateway answers (or answered) instead of the upstream, if it does.
    pub fn answered(&self) -> Option<Answer> {
        self.answer
    }

    /// The route, the limits the request met and what they said, for a request its limits
    /// refused or admitted: what the `RateLimit` headers and a `429`'s body are written from.
    pub fn limits_said(&self) -> Option<LimitsSaid<'_>> {
        self.limits.said(self.route.as_deref()?)
    }

    /// The name of the limit that decided: the one that denied, or the shadow limit that
    /// would have.
    pub fn deciding_limit(&self) -> Option<&str> {
        self.limits.deciding_limit()
    }

    /// The failure mode that applied, when the limiter could not decide.
    pub fn failure_mode(&self) -> Option<&'static str> {
        self.limits.failure_mode(self.route()?)
    }

    /// The `WWW-Authenticate` challenge of `answer`, when it is a `401`.
    pub fn challenge(&self, answer: Answer) -> Option<&http::HeaderValue> {
        match answer {
            Answer::AuthFailed(failure) if failure.challenges() => {
                self.site.config.consumers.challenge(failure)
            }
            _ => None,
        }
    }

    /// The verified caller, if the route verifies callers and the request had a credential.
    pub fn consumer(&self) -> Option<&Consumer> {
        self.consumer.as_ref()
    }

    /// Why the caller was refused before any limit, if it was.
    pub fn auth_failure(&self) -> Option<AuthFailure> {
        match self.answer {
            Some(Answer::AuthFailed(failure)) => Some(failure),
            _ => None,
        }
    }

    /// The caller's plan's name, if it has one.
    pub fn plan(&self) -> Option<&str> {
        let plan = self.consumer.as_ref()?.plan?;
        Some(self.site.config.consumers.plans().name(plan))
    }

    pub fn target(&self) -> Target {
        self.target
    }

    /// The path routing and keys saw, when normalizing changed the one received.
    pub fn normalized_path(&self) -> Option<&str> {
        self.normalized_path.as_deref()
    }

    /// The client the request was keyed on.
    pub fn client(&self) -> Option<IpAddr> {
        self.client
    }

    /// Request body bytes received.
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// How long the limiter took.
    pub fn limiter_time(&self) -> Duration {
        self.limits
            .verdict()
            .map_or(Duration::ZERO, |verdict| verdict.limiter_time)
    }

    /// The last upstream server chosen, the time to its response head, and why the last
    /// attempt failed.
    pub fn upstream_summary(
        &self,
    ) -> (
        Option<std::net::SocketAddr>,
        Option<Duration>,
        Option<UpstreamError>,
    ) {
        (
            self.upstream.server,
            self.upstream.time,
            self.upstream.error,
        )
    }
}

#[cfg(test)]
mod tests;
