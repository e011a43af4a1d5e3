//! One request's limits, from its keys to its end: the tier it met (resolved once, and held
//! to the request's end whatever a reload does meanwhile), each limit of it beside the
//! request's record of it, and what the policy made of them. Asked, decided, read by the
//! answer and the headers, then consumed once by [`RequestLimits::end`]: each limit counted
//! under its own series, its slots given back and its response cost settled.

use std::sync::Arc;

use http::header::{HeaderMap, HeaderValue};

use crate::limiter::per_thread::ThreadCopies;
use crate::limiter::{
    deciding, Answered, Deciding, LimitRecord, LimiterError, Outcome, Policy, Retry, Verdict,
};
use crate::route::keys::RequestFacts;
use crate::route::table::Route;
use crate::route::tiers::{LimitMet, LimitsMet, Tier, TierId, TierLimit, Undecidable};

use super::meters::RouteMetrics;
use super::site::RouteRuntime;
use super::Seam;

/// One request's limits: the tier it meets, each limit of it beside its record, the verdict.
#[derive(Debug, Default)]
pub(crate) struct RequestLimits {
    /// The tier the request meets; `None` until it meets one.
    met: Option<Met>,
    /// Each limit of the tier beside the request's record of it; empty when the request was
    /// not asked (exempt, unlimited, or answered before its limits).
    limits: LimitsMet,
    /// The policy's verdict; `None` when the request was answered before any limit.
    verdict: Option<Verdict>,
    /// The request was held for shaping and its client left: its units went back.
    abandoned: bool,
    /// Its slots were given back and its response settled: never twice.
    ended: bool,
}

/// The tier a request met, resolved once: which of its route's tiers (by its consumer and
/// plan), and that tier as a quota override changed it, while one applies. The route's own
/// tier is borrowed through the route, which the exchange holds to the request's end: no
/// shared count is written for it per request.
#[derive(Debug)]
struct Met {
    id: TierId,
    overridden: Option<Arc<Tier>>,
}

impl Met {
    fn tier<'a>(&'a self, route: &'a Route) -> &'a Tier {
        match &self.overridden {
            Some(tier) => tier,
            None => route.tiers.shared(self.id),
        }
    }
}

/// What a request's limits said: its route, the tier it met, each limit with its record, and
/// what answered. What the `RateLimit` headers, a `429`'s body and a gRPC answer are written
/// from.
#[derive(Clone, Copy)]
pub struct LimitsSaid<'a> {
    pub route: &'a Route,
    tier: &'a Tier,
    /// The tier's `RateLimit-Policy` copied per thread (its route's runtime's); `None` for a
    /// tier a quota override changed, whose own value is cloned.
    policy: Option<&'a ThreadCopies<HeaderValue>>,
    limits: &'a [LimitMet],
    answered: Answered,
}

impl<'a> LimitsSaid<'a> {
    /// Each limit the request met, with what it said.
    pub fn iter(&self) -> impl Iterator<Item = (&'a TierLimit, &'a LimitRecord)> + 'a {
        pairs(self.limits)
    }

    /// The limit that denied the request (the longest wait), if one did.
    pub fn denied(&self) -> Option<&'a TierLimit> {
        let (limit, record) = deciding(self.iter())?;
        (record.deciding == Some(Deciding::Denied)).then_some(limit)
    }

    /// Every quota policy (a rate, not concurrency) that denied the request and that clients
    /// see (not shadow, not hidden): the `violated-policies` of its `429`.
    pub fn violated(&self) -> impl Iterator<Item = &'a TierLimit> + 'a {
        let denied = |(limit, record): (&'a TierLimit, &'a LimitRecord)| {
            let denied = record.status.as_ref().is_some_and(|s| !s.allowed);
            let advertised = limit.limit.exact.advertised_policy().is_some();
            (denied && advertised).then_some(limit)
        };
        self.iter().filter_map(denied)
    }

    /// When the request could pass.
    pub fn retry(&self) -> Retry {
        self.answered.retry
    }

    /// The `RateLimit-Policy` value of the tier, when the route sends rate-limit headers.
    pub fn policy_header(&self) -> Option<HeaderValue> {
        match self.policy {
            Some(copies) => Some(copies.get()),
            None => self.tier.policy_header.clone(),
        }
    }
}

/// Each limit of `limits` with the request's record of it.
fn pairs(limits: &[LimitMet]) -> impl Iterator<Item = (&TierLimit, &LimitRecord)> {
    limits.iter().map(|met| (&*met.limit, &met.record))
}

impl RequestLimits {
    /// The request meets tier `id` of its route, or `overridden`, that tier as a quota override
    /// changed it: resolved here, once, and held to the request's end (the route's own tiers
    /// through the route the exchange holds).
    pub fn meet(&mut self, (id, overridden): (TierId, Option<Arc<Tier>>)) {
        self.met = Some(Met { id, overridden });
    }

    /// The id of the tier the request meets, and whether a quota override changes it (the
    /// route's default, unchanged, before it meets one).
    pub fn met(&self) -> (TierId, bool) {
        self.met.as_ref().map_or((TierId::default(), false), |met| {
            (met.id, met.overridden.is_some())
        })
    }

    /// The tier the request meets (`route`'s default before it meets one).
    pub fn tier<'a>(&'a self, route: &'a Route) -> &'a Tier {
        match &self.met {
            Some(met) => met.tier(route),
            None => route.tiers.default(),
        }
    }

    /// Each limit of its tier with the record of it, once asked (`None` before).
    pub fn shown<'a>(
        &'a self,
        route: &'a Route,
    ) -> impl Iterator<Item = (&'a TierLimit, Option<&'a LimitRecord>)> + 'a {
        let asked = pairs(&self.limits).map(|(limit, record)| (limit, Some(record)));
        let tier = self.limits.is_empty().then(|| self.tier(route));
        let unasked = tier.into_iter().flat_map(|tier| tier.limits.iter());
        asked.chain(unasked.map(|limit| (&**limit, None)))
    }

    /// Reads what each limit asked of `route` has left into its record, consuming nothing.
    pub async fn peek<E: Seam>(
        &mut self,
        route: &Route,
        policy: &Policy<E>,
    ) -> Result<(), LimiterError> {
        let Some(met) = &self.met else {
            return Ok(());
        };
        match self.limits.is_empty() {
            true => Ok(()),
            false => {
                policy
                    .peek(&mut met.tier(route).asking(&mut self.limits))
                    .await
            }
        }
    }

    /// Whether the tier the request meets on `route` has limits.
    pub fn limited(&self, route: &Route) -> bool {
        self.met
            .as_ref()
            .is_some_and(|met| !met.tier(route).is_empty())
    }

    /// What the request asks of each limit of its tier (`explaining`: without taking a turn
    /// of its split limits' round robin). `Err`: the detail of its `400`.
    pub fn ask<S>(
        &mut self,
        runtime: &RouteRuntime<S>,
        facts: &RequestFacts<'_>,
        explaining: bool,
    ) -> Result<(), Undecidable> {
        let Some(met) = &self.met else {
            return Ok(());
        };
        let rotation = runtime.rotation(met.id);
        let tier = met.tier(&runtime.route);
        self.limits = match explaining {
            true => tier.met(facts, &rotation.copy())?,
            false => tier.met(facts, rotation)?,
        };
        Ok(())
    }

    /// The policy's verdict on the request's limits (of `route`), kept.
    pub async fn decide<E: Seam>(&mut self, route: &Route, policy: &Policy<E>) -> &Verdict {
        let verdict = match &self.met {
            Some(met) => {
                let asked = &mut met.tier(route).asking(&mut self.limits);
                policy.decide(asked).await
            }
            // A request decided before it met a tier cannot be (admission meets it first).
            None => Verdict::undecided(Outcome::ErrorDenied),
        };
        self.verdict.insert(verdict)
    }

    pub fn verdict(&self) -> Option<&Verdict> {
        self.verdict.as_ref()
    }

    /// The admitted request will not go upstream (its client left while it was held for
    /// shaping): the units it reserved go back.
    pub async fn abandon<E: Seam>(&mut self, route: &Route, policy: &Policy<E>) {
        if let (Some(verdict), Some(met)) = (&self.verdict, &self.met) {
            let asked = &mut met.tier(route).asking(&mut self.limits);
            policy.give_back_abandoned(asked, verdict).await;
        }
        self.abandoned = true;
    }

    /// Reads what `headers` (a response head, or its trailers) say the response cost, into the
    /// record of each limit of `route` priced by the response.
    pub fn read_reports(&mut self, route: &Route, headers: &HeaderMap) {
        let priced = |met: &Met| met.tier(route).rules.priced_by_response();
        if !self.met.as_ref().is_some_and(priced) {
            return;
        }
        for LimitMet { limit, record } in &mut self.limits {
            let exact = &limit.limit.exact;
            limit.costs.read_report(exact, headers, &mut record.report);
        }
    }

    /// The request has ended: counts what each limit said (and what the response reported it
    /// cost), gives back its concurrency slots and settles its response's cost. Once.
    pub async fn end<E: Seam>(
        &mut self,
        (route, meters): (&Route, &RouteMetrics),
        policy: &Policy<E>,
    ) {
        let Some(verdict) = self.verdict.as_ref().filter(|_| !self.ended) else {
            return;
        };
        self.ended = true;
        let reported = verdict.admitted() && !self.abandoned;
        for (limit, record) in pairs(&self.limits) {
            let Some(meters) = meters.limit(limit.position) else {
                continue;
            };
            if let Some(outcome) = record.outcome(&limit.limit.exact, verdict) {
                meters.count(outcome);
            }
            if reported {
                meters.count_report(record.report);
            }
        }
        if let Some(met) = &self.met {
            let asked = &mut met.tier(route).asking(&mut self.limits);
            policy.end(asked, verdict, self.abandoned).await;
        }
    }

    /// What the limits said, when a limiter decided them, on the route of `runtime`.
    pub fn said<'a, S>(&'a self, runtime: &'a RouteRuntime<S>) -> Option<LimitsSaid<'a>> {
        let answered = self.verdict.as_ref()?.answered?;
        let route = &*runtime.route;
        let policy = match &self.met {
            Some(Met {
                id,
                overridden: None,
            }) => runtime.policy_header(*id),
            _ => None,
        };
        Some(LimitsSaid {
            route,
            tier: self.tier(route),
            policy,
            limits: &self.limits,
            answered,
        })
    }

    /// The name of the limit that decided: the one that denied, or the shadow limit that
    /// would have.
    pub fn deciding_limit(&self) -> Option<&str> {
        let (limit, _) = deciding(pairs(&self.limits))?;
        Some(&limit.limit.exact.name)
    }

    /// The limit that denied the request and the key it was asked at, if one did.
    pub fn denied_key(&self) -> Option<(&str, &[u8])> {
        let (limit, record) = deciding(pairs(&self.limits))?;
        (record.deciding == Some(Deciding::Denied))
            .then(|| (&*limit.limit.exact.name, &record.ask.key[..]))
    }

    /// The failure mode that applied, when the limiter could not decide (`route`'s tier's).
    pub fn failure_mode(&self, route: &Route) -> Option<&'static str> {
        let verdict = self.verdict.as_ref()?;
        let mode = self.met.as_ref()?.tier(route).rules.failure_mode();
        verdict.outcome.by_failure_mode().then(|| mode.label())
    }
}
