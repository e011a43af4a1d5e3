//! The admitted request on its way to the upstream: which server to dial next and how long
//! each wait may last within the route's deadline, whether a failed try goes to another server
//! (its cause among the route's `retry_on`, tries left, a server left, a place in the retry
//! budget), what every failed attempt was (each counted once), the target the upstream gets,
//! and what the response says it cost. Each attempt's end is told to the route's servers once
//! (a failed attempt, a `5xx` response head, or any other): what their passive health learns
//! from. The caller's limits were charged once, on admission: a retry never charges them again.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http::header::HeaderMap;
use http::Uri;

use super::{Exchange, Target};
use crate::exchange::answer::{Answer, ClientError, UpstreamError};
use crate::exchange::meters::RetryOutcome;
use crate::route::upstream::RetryCause;
use crate::upstream::budget::{RequestPlace, RetryBudget};
use crate::upstream::servers::Servers;

/// What the attempts to reach the upstream have found so far.
#[derive(Default)]
pub(super) struct Attempts {
    /// Servers whose try failed and was retried: not tried again for this request.
    failed: Vec<SocketAddr>,
    /// Its place among the requests in flight to the upstream (the retry budget's share),
    /// from its first dial to its end, and among the retries from its latest retry: given back
    /// to the route's budget when the exchange ends ([`Exchange::leave_retry_budget`]).
    request_place: Option<RequestPlace>,
    /// The server last chosen.
    pub(super) server: Option<SocketAddr>,
    /// The server of the attempt under way: `None` once no server was left to choose (a
    /// failure then is no server's).
    dialed: Option<SocketAddr>,
    /// The attempt under way has told its server how it ended (its passive health learns of
    /// each attempt once: a `5xx` head then a reset is one failure).
    told: bool,
    /// When the first attempt began.
    started: Option<Instant>,
    /// From the first attempt to the upstream's response head.
    pub(super) time: Option<Duration>,
    /// Why the last attempt failed.
    pub(super) error: Option<UpstreamError>,
    /// The read timeout of the last attempt (the route's, bounded by its deadline).
    pub(super) read_timeout: Option<Duration>,
}

/// How to reach the server chosen for the next attempt, in the exchange's terms: the TLS
/// material of the route's servers (`T`, the edge's) travels through it unread.
pub struct Dial<'a, T> {
    pub server: SocketAddr,
    pub tls: Option<&'a T>,
    /// HTTP/2 to the upstream (ALPN over TLS, prior knowledge in the clear).
    pub http2: bool,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Bounded by the route's deadline only.
    pub write_timeout: Option<Duration>,
}

impl<S: Servers> Exchange<S> {
    /// The next server to try and how long each wait on it may last: every wait ends by the
    /// route's deadline. `Err` when none is left or the deadline has passed.
    pub fn dial(&mut self) -> Result<Dial<'_, S::Tls>, Answer> {
        self.refuse_if_late()?;
        if self.route.is_none() {
            return Err(self.fail(Answer::Internal));
        }
        let Some(runtime) = &self.route else {
            return Err(Answer::Internal);
        };
        let Some(server) = runtime
            .servers
            .pick(&self.balance_key, &self.upstream.failed)
        else {
            self.upstream.dialed = None;
            self.answer = Some(Answer::UpstreamUnreachable);
            return Err(Answer::UpstreamUnreachable);
        };
        self.upstream.server = Some(server);
        self.upstream.dialed = Some(server);
        self.upstream.told = false;
        if self.upstream.request_place.is_none() {
            self.upstream.request_place = runtime.servers.retry_budget().map(RetryBudget::request);
        }
        let now = self.site.clock.instant();
        self.upstream.started.get_or_insert(now);
        let left = self
            .deadline
            .map(|deadline| deadline.saturating_duration_since(now));
        let bounded = |timeout: Duration| left.map_or(timeout, |left| timeout.min(left));
        let settings = &runtime.route.upstream;
        let read_timeout = bounded(settings.read_timeout);
        self.upstream.read_timeout = Some(read_timeout);
        Ok(Dial {
            server,
            tls: runtime.servers.tls(),
            http2: settings.http2,
            connect_timeout: bounded(settings.connect_timeout),
            read_timeout,
            write_timeout: left,
        })
    }

    /// A try on `server` failed by `cause` (`kind`, when it is an upstream failure) for a
    /// request that can (`replayable`) or cannot be sent again whole: whether to try another
    /// server. `retried` says whether it will be tried again anyway (Pingora's rule: a reused
    /// connection that closed may never have seen the request). A try that is tried again is
    /// counted here; the last one is counted by [`Exchange::fail_upstream`].
    pub fn try_failed(
        &mut self,
        server: Option<SocketAddr>,
        kind: Option<UpstreamError>,
        cause: Option<RetryCause>,
        replayable: bool,
        retried: bool,
    ) -> bool {
        let retry = match (server, cause) {
            (Some(server), Some(cause)) => self.retry(server, cause, replayable),
            _ => false,
        };
        if retry || retried {
            if let Some(kind) = kind {
                self.count_upstream_error(kind, server);
            }
        }
        retry
    }

    /// The upstream answered `status` (a `502`, `503` or `504`; `retry_after`: with that
    /// header) to a request that can or cannot be sent again whole: whether to try it on
    /// another server instead of passing the answer on. A `503` with `Retry-After` is the
    /// upstream asking callers to wait: passed on, never retried. The server's passive health
    /// learns of a retried answer here (one passed on, from [`Exchange::response_head`]).
    pub fn try_answered(&mut self, status: u16, retry_after: bool, replayable: bool) -> bool {
        let (Some(cause), Some(server)) = (RetryCause::of_status(status), self.upstream.dialed)
        else {
            return false;
        };
        if (cause == RetryCause::Http503 && retry_after) || !self.retry(server, cause, replayable) {
            return false;
        }
        self.attempt_ended(server, true);
        true
    }

    /// Tells `server`, the server of the attempt under way, how the attempt ended: once per
    /// attempt.
    fn attempt_ended(&mut self, server: SocketAddr, failed: bool) {
        if std::mem::replace(&mut self.upstream.told, true) {
            return;
        }
        if let Some(runtime) = &self.route {
            runtime.servers.attempt_ended(server, failed);
        }
    }

    /// Whether the try on `server` that failed by `cause` is tried on another server: the
    /// route retries `cause` for this request, it has tries left, another server is left, and
    /// the upstream's retry budget has a place (taken here, kept to the request's end).
    fn retry(&mut self, server: SocketAddr, cause: RetryCause, replayable: bool) -> bool {
        let Some(runtime) = &self.route else {
            return false;
        };
        let policy = &runtime.route.upstream.retry;
        if !policy.allows(cause, replayable) || self.upstream.failed.len() >= policy.attempts {
            return false;
        }
        self.upstream.failed.push(server);
        if runtime
            .servers
            .pick(&self.balance_key, &self.upstream.failed)
            .is_none()
        {
            self.upstream.failed.pop();
            return false;
        }
        // Its place among the requests was taken when it first dialed.
        let budget = runtime.servers.retry_budget();
        if let (Some(place), Some(budget)) = (&mut self.upstream.request_place, budget) {
            if !budget.retry(place) {
                self.upstream.failed.pop();
                runtime.metrics.count_retry(RetryOutcome::BudgetExhausted);
                return false;
            }
        }
        runtime.metrics.count_retry(RetryOutcome::Retried);
        true
    }

    /// Gives the request's place in its upstream's retry budget back, once: the budget is the
    /// route's, which the exchange holds to its end.
    pub(super) fn leave_retry_budget(&mut self) {
        let place = self.upstream.request_place.take();
        let budget = self.route.as_ref().and_then(|r| r.servers.retry_budget());
        if let (Some(place), Some(budget)) = (place, budget) {
            budget.leave(place);
        }
    }

    /// The request could not be proxied: `kind` is why, when the upstream failed (counted
    /// here, once per request). What the client is answered: the answer already decided (a
    /// body too large, a deadline run out), or `fallback`.
    pub fn fail_upstream(&mut self, kind: Option<UpstreamError>, fallback: Answer) -> Answer {
        if let Some(kind) = kind {
            self.count_upstream_error(kind, self.upstream.dialed);
        }
        // A timed-out upstream is overloaded or hung: the adaptive limit is cut. Other
        // failures only give the place back.
        if let Some(permit) = self.permit.take() {
            if kind == Some(UpstreamError::Timeout) {
                permit.timed_out();
            }
        }
        *self.answer.get_or_insert(fallback)
    }

    /// The client has sent no body byte for at least the last attempt's whole read timeout
    /// (since its head arrived, if it sent none): an upstream that timed out meanwhile was
    /// waiting for the client, not the other way round. The caller knows whether body bytes
    /// are still owed.
    pub fn client_stalled(&self) -> bool {
        let Some(read_timeout) = self.upstream.read_timeout else {
            return false;
        };
        self.since(self.body_at.unwrap_or(self.started)) >= read_timeout
    }

    /// The client failed the request (`kind`), counted here, once per request. What it is
    /// answered: the answer already decided, or the kind's (`None`: it is gone).
    pub fn fail_client(&mut self, kind: ClientError) -> Option<Answer> {
        if self.client_error.is_none() {
            self.metrics().count_client_error(kind);
        }
        self.client_error = Some(kind);
        let answer = kind.answer()?;
        Some(*self.answer.get_or_insert(answer))
    }

    /// Counts a failed attempt of kind `kind` for the route, and for `server` when the
    /// attempt had one (whose passive health learns of it).
    fn count_upstream_error(&mut self, kind: UpstreamError, server: Option<SocketAddr>) {
        self.upstream.error = Some(kind);
        if let Some(runtime) = &self.route {
            runtime.metrics.count_upstream_error(kind, server);
        }
        if let Some(server) = server {
            self.attempt_ended(server, true);
        }
    }

    /// Keeps `answer` as the request's, and returns it (for a hook that stops the request).
    fn fail(&mut self, answer: Answer) -> Answer {
        *self.answer.get_or_insert(answer)
    }

    /// `504` once the route's `request_timeout` has run out.
    pub fn refuse_if_late(&mut self) -> Result<(), Answer> {
        match self.deadline {
            Some(deadline) if self.site.clock.instant() >= deadline => {
                Err(self.fail(Answer::UpstreamTimedOut))
            }
            _ => Ok(()),
        }
    }

    /// `bytes` more of the request body arrived: `413` once the route's `max_body_bytes` is
    /// exceeded, `504` once its deadline has passed.
    pub fn body_received(&mut self, bytes: usize) -> Result<(), Answer> {
        if bytes > 0 {
            self.body_at = Some(self.site.clock.instant());
        }
        self.body_bytes += bytes as u64;
        let max = self.route().and_then(|route| route.max_body_bytes);
        if max.is_some_and(|max| self.body_bytes > max) {
            return Err(self.fail(Answer::BodyTooLarge));
        }
        self.refuse_if_late()
    }

    /// The target the upstream gets, when it differs from `uri`: a normalized or rewritten
    /// path, or an absolute-form target (the upstream gets the origin form). `OPTIONS *` goes
    /// as it came.
    pub fn upstream_target(&self, uri: &Uri) -> Option<String> {
        let route = self.route()?;
        if self.target == Target::Asterisk {
            return None;
        }
        let decided = self.normalized_path.as_deref().unwrap_or(uri.path());
        let path = route.upstream.upstream_path(decided);
        let rewrite = path != uri.path() || self.target == Target::Absolute;
        rewrite.then(|| match uri.query() {
            Some(query) => format!("{path}?{query}"),
            None => path.into_owned(),
        })
    }

    /// The upstream's response head (`status`) arrived: the upstream time ends here, the
    /// server's passive health learns whether it failed (`5xx`), and its headers may say what
    /// the response cost.
    pub fn response_head(&mut self, status: u16, headers: &HeaderMap) {
        if self.upstream.time.is_none() {
            self.upstream.time = self.upstream.started.map(|started| self.since(started));
            if let Some(server) = self.upstream.dialed {
                self.attempt_ended(server, (500..600).contains(&status));
            }
        }
        // The upstream is done waiting on it (a stream or an upgraded connection may go on):
        // its latency is a sample of the adaptive limit, and its place goes back, as Envoy's.
        if let (Some(permit), Some(time)) = (self.permit.take(), self.upstream.time) {
            permit.answered(time);
        }
        self.read_cost_reports(headers);
    }

    /// Trailers (HTTP/2 and gRPC upstreams) may report what the response cost: a trailer
    /// overrides the header of the same name.
    pub fn response_trailers(&mut self, trailers: &HeaderMap) {
        self.read_cost_reports(trailers);
    }

    /// Reads what `headers` say the response cost, for each limit of the route priced by the
    /// response.
    fn read_cost_reports(&mut self, headers: &HeaderMap) {
        if let Some(runtime) = &self.route {
            self.limits.read_reports(&runtime.route, headers);
        }
    }
}
