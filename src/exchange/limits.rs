//! One request's limits, from its keys to its end: the tier it met (chosen once), one record
//! per limit of that tier, and what the policy made of them. Asked, decided, read by the
//! answer and the headers, then consumed once by [`RequestLimits::end`]: each limit counted
//! under its own series, its slots given back and its response cost settled.

use std::sync::Arc;

use http::header::{HeaderMap, HeaderValue};

use crate::limiter::{
    deciding, paired_mut, Answered, Deciding, LimitRecord, LimitRecords, LimiterError, Outcome,
    Policy, Retry, Verdict,
};
use crate::route::keys::RequestFacts;
use crate::route::table::Route;
use crate::route::tiers::{Tier, TierId, TierLimit, Undecidable};

use super::meters::RouteMetrics;
use super::site::RouteRuntime;
use super::Seam;

/// One request's limits: the tier it meets, a record per limit of it, the verdict on them.
#[derive(Debug, Default)]
pub(crate) struct RequestLimits {
    /// Which of its route's tiers the request meets (by its consumer and plan).
    tier: TierId,
    /// That tier as a quota override changed it, while one applies (`route::overrides`).
    overridden: Option<Arc<Tier>>,
    /// One per limit of the tier; empty when the request was not asked (exempt, unlimited, or
    /// answered before its limits).
    records: LimitRecords,
    /// The policy's verdict; `None` when the request was answered before any limit.
    verdict: Option<Verdict>,
    /// The request was held for shaping and its client left: its units went back.
    abandoned: bool,
    /// Its slots were given back and its response settled: never twice.
    ended: bool,
}

/// What a request's limits said: its route, the tier it met, each limit's record, and what
/// answered. What the `RateLimit` headers, a `429`'s body and a gRPC answer are written from.
#[derive(Clone, Copy)]
pub struct LimitsSaid<'a> {
    pub route: &'a Route,
    tier: &'a Tier,
    records: &'a [LimitRecord],
    answered: Answered,
}

impl<'a> LimitsSaid<'a> {
    /// Each limit the request met, with what it said.
    pub fn iter(&self) -> impl Iterator<Item = (&'a TierLimit, &'a LimitRecord)> + 'a {
        self.tier.said(self.records).into_iter().flatten()
    }

    /// The limit that denied the request (the longest wait), if one did.
    pub fn denied(&self) -> Option<&'a TierLimit> {
        let (index, record) = deciding(self.records)?;
        let limit = self.tier.limits.get(index);
        limit.filter(|_| record.deciding == Some(Deciding::Denied))
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
    pub fn policy_header(&self) -> Option<&'a HeaderValue> {
        self.tier.policy_header.as_ref()
    }
}

/// The tier a request meets: `overridden`, or its route's tier `id`.
fn tier_met<'a>(overridden: &'a Option<Arc<Tier>>, id: TierId, route: &'a Route) -> &'a Tier {
    overridden.as_deref().unwrap_or_else(|| route.tiers.get(id))
}

impl RequestLimits {
    /// The request meets `tier` of its route, or `overridden`, that tier as a quota override
    /// changed it.
    pub fn meet(&mut self, (tier, overridden): (TierId, Option<Arc<Tier>>)) {
        self.tier = tier;
        self.overridden = overridden;
    }

    /// The id of the tier the request meets, and whether a quota override changes it.
    pub fn met(&self) -> (TierId, bool) {
        (self.tier, self.overridden.is_some())
    }

    /// One record per limit of its tier, once asked.
    pub fn records(&self) -> &[LimitRecord] {
        &self.records
    }

    /// Reads what each limit asked has left into its record, consuming nothing.
    pub async fn peek<E: Seam>(
        &mut self,
        route: &Route,
        policy: &Policy<E>,
    ) -> Result<(), LimiterError> {
        let tier = tier_met(&self.overridden, self.tier, route);
        match tier.asked(&mut self.records) {
            Some(mut asked) if !asked.limits.is_empty() => policy.peek(&mut asked).await,
            _ => Ok(()),
        }
    }

    /// The tier the request meets: the one place its id is looked up.
    pub fn tier<'a>(&'a self, route: &'a Route) -> &'a Tier {
        tier_met(&self.overridden, self.tier, route)
    }

    /// Whether the request's tier has limits.
    pub fn limited(&self, route: &Route) -> bool {
        !self.tier(route).is_empty()
    }

    /// What the request asks of each limit of its tier (`explaining`: without taking a turn
    /// of its split limits' round robin). `Err`: the detail of its `400`.
    pub fn ask<S>(
        &mut self,
        runtime: &RouteRuntime<S>,
        facts: &RequestFacts<'_>,
        explaining: bool,
    ) -> Result<(), Undecidable> {
        let tier = self.tier(&runtime.route);
        let rotation = runtime.rotation(self.tier);
        self.records = match explaining {
            true => tier.records(facts, &rotation.copy())?,
            false => tier.records(facts, rotation)?,
        };
        Ok(())
    }

    /// The policy's verdict on the request's limits, kept.
    pub async fn decide<E: Seam>(&mut self, route: &Route, policy: &Policy<E>) -> &Verdict {
        let tier = tier_met(&self.overridden, self.tier, route);
        let verdict = match tier.asked(&mut self.records) {
            Some(mut asked) => policy.decide(&mut asked).await,
            // Records of another tier cannot be: they were made from this one.
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
        if let Some(verdict) = &self.verdict {
            let tier = tier_met(&self.overridden, self.tier, route);
            if let Some(mut asked) = tier.asked(&mut self.records) {
                policy.give_back_abandoned(&mut asked, verdict).await;
            }
        }
        self.abandoned = true;
    }

    /// Reads what `headers` (a response head, or its trailers) say the response cost, into the
    /// record of each limit priced by the response.
    pub fn read_reports(&mut self, route: &Route, headers: &HeaderMap) {
        let tier = tier_met(&self.overridden, self.tier, route);
        if !tier.rules.priced_by_response() {
            return;
        }
        for (limit, record) in paired_mut(&tier.limits, &mut self.records)
            .into_iter()
            .flatten()
        {
            let exact = &limit.limit.exact;
            limit.costs.read_report(exact, headers, &mut record.report);
        }
    }

    /// The request has ended: counts what each limit said (and what the response reported it
    /// cost), gives back its concurrency slots and settles its response's cost. Once.
    pub async fn end<E: Seam>(&mut self, route: &Route, meters: &RouteMetrics, policy: &Policy<E>) {
        let Some(verdict) = self.verdict.as_ref().filter(|_| !self.ended) else {
            return;
        };
        self.ended = true;
        let tier = tier_met(&self.overridden, self.tier, route);
        let reported = verdict.admitted() && !self.abandoned;
        for (limit, record) in tier.said(&self.records).into_iter().flatten() {
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
        if let Some(mut asked) = tier.asked(&mut self.records) {
            policy.end(&mut asked, verdict, self.abandoned).await;
        }
    }

    /// What the limits said, when a limiter decided them.
    pub fn said<'a>(&'a self, route: &'a Route) -> Option<LimitsSaid<'a>> {
        let answered = self.verdict.as_ref()?.answered?;
        Some(LimitsSaid {
            route,
            tier: self.tier(route),
            records: &self.records,
            answered,
        })
    }

    /// The name of the limit that decided: the one that denied, or the shadow limit that
    /// would have.
    pub fn deciding_limit<'a>(&'a self, route: &'a Route) -> Option<&'a str> {
        let (index, _) = deciding(&self.records)?;
        let limit = self.tier(route).limits.get(index)?;
        Some(&limit.limit.exact.name)
    }

    /// The limit that denied the request and the key it was asked at, if one did.
    pub fn denied_key<'a>(&'a self, route: &'a Route) -> Option<(&'a str, &'a [u8])> {
        let (index, record) = deciding(&self.records)?;
        let limit = self.tier(route).limits.get(index)?;
        (record.deciding == Some(Deciding::Denied))
            .then(|| (&*limit.limit.exact.name, &record.ask.key[..]))
    }

    /// The failure mode that applied, when the limiter could not decide.
    pub fn failure_mode(&self, route: &Route) -> Option<&'static str> {
        let verdict = self.verdict.as_ref()?;
        let mode = self.tier(route).rules.failure_mode();
        verdict.outcome.by_failure_mode().then(|| mode.label())
    }
}
