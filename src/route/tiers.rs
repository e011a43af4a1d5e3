//! A route's limits per kind of caller: the default set, each plan's, each
//! consumer's — compiled at load, so a request only picks one (most specific wins: a consumer's
//! own entry, then its plan's, then the route's default; the default never also applies to
//! a caller a plan or a consumer entry covers).

use std::collections::HashMap;
use std::sync::Arc;

use http::header::HeaderValue;

use crate::caller::consumers::{Consumer, PlanSlot};
use smallvec::SmallVec;

use crate::limiter::redis::script::Algorithms;
use crate::limiter::{
    fields, paired, paired_mut, Asked, Limit, LimitRecord, LimitRecords, LimitRules, Mismatch,
    PolicyLimit, Scope, LIMITS_INLINE,
};
use crate::route::keys::{Digest, LimitKey, MissingPart, RequestFacts, Rotation, RouteKeys};
use crate::route::pricing::CostHeaders;

/// Detail of the `400` for a request that lacks a part a limit is keyed on.
const MISSING_PART: &str =
    "The request lacks a header, query parameter or claim a rate limit is keyed on.";
/// Detail of the `400` for a cost header that is not a whole number within the cap.
const BAD_COST: &str = "The cost header must be a whole number within the limit's cost_max.";

/// A request that cannot be decided as sent (a key part it must have is missing, its cost
/// header is wrong): the detail of its `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Undecidable(pub &'static str);

/// One limit of a tier, with everything a request needs of it.
#[derive(Debug, Clone)]
pub struct TierLimit {
    /// The tier's parameters of the limit (a plan's or a consumer's entry, the route's
    /// shadow), and one gateway's share of it.
    pub limit: PolicyLimit,
    /// How its key is made.
    pub key: LimitKey,
    /// Where its costs are read.
    pub costs: CostHeaders,
    /// Its place in the route's list as written: the series it is counted under.
    pub position: Position,
}

/// A limit's place in its route's list as written: the `(route, limit)` series it is counted
/// under, whichever tier's parameters a request met it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position(pub u8);

/// One limit of a request's tier beside the request's record of it, from its ask to its end
/// (as the rate limit service's matched descriptors carry theirs): never joined by position.
/// The limit is shared with the tier, so a request keeps the limits it met across a reload.
#[derive(Debug, Clone)]
pub struct LimitMet {
    pub limit: Arc<TierLimit>,
    pub record: LimitRecord,
}

/// A request's limits, each beside its record, inline for routes of ordinary size.
pub type LimitsMet = SmallVec<[LimitMet; LIMITS_INLINE]>;

/// The limits one kind of caller meets on a route, with everything a request needs of them.
#[derive(Debug)]
pub struct Tier {
    /// Its limits, in the route's order: the only per-limit sequence of a tier.
    pub limits: Box<[Arc<TierLimit>]>,
    pub rules: LimitRules,
    /// The route's hash tag and key head (each tier runs its own round robin).
    pub keys: RouteKeys,
    /// `RateLimit-Policy` value, or `None` when the route sends no rate-limit headers: a caller
    /// sees its own tier's limits.
    pub policy_header: Option<HeaderValue>,
    /// Whether the route sends rate-limit headers (`policy_header` is `None` also when no
    /// limit is shown).
    pub rate_limit_headers: bool,
}

/// One limit's digest of a request, before the tag is known.
struct Pending<'a> {
    limit: &'a Arc<TierLimit>,
    digest: Digest,
}

impl Tier {
    /// A tier of no limits.
    pub fn none(keys: RouteKeys) -> Tier {
        Tier {
            limits: Box::new([]),
            rules: LimitRules::none(),
            keys,
            policy_header: None,
            rate_limit_headers: false,
        }
    }

    /// One record per limit of this tier: the request's key and cost for it (cost 0 for a
    /// limit skipped for lack of a key part, which is then only read). `Err` when the request
    /// cannot be decided as sent, with the detail of its `400`: a missing part first, then a
    /// bad cost.
    pub fn records(
        &self,
        facts: &RequestFacts<'_>,
        rotation: &Rotation,
    ) -> Result<LimitRecords, Undecidable> {
        let mut records = LimitRecords::new();
        self.each_record(facts, rotation, |_, record| records.push(record))?;
        Ok(records)
    }

    /// [`Tier::records`], each beside its limit: what a request carries from its ask to its
    /// end.
    pub fn met(
        &self,
        facts: &RequestFacts<'_>,
        rotation: &Rotation,
    ) -> Result<LimitsMet, Undecidable> {
        let mut met = LimitsMet::new();
        self.each_record(facts, rotation, |limit, record| {
            let limit = Arc::clone(limit);
            met.push(LimitMet { limit, record });
        })?;
        Ok(met)
    }

    /// Makes the record of each limit, in order, and gives it to `keep` with its limit.
    fn each_record(
        &self,
        facts: &RequestFacts<'_>,
        rotation: &Rotation,
        mut keep: impl FnMut(&Arc<TierLimit>, LimitRecord),
    ) -> Result<(), Undecidable> {
        if self.limits.iter().all(|limit| limit.key.fixed().is_some()) {
            return self.fixed_records(facts, keep);
        }
        let pending = self
            .limits
            .iter()
            .map(|limit| {
                let digest = self.keys.digest(&limit.key, facts)?;
                Ok(Pending { limit, digest })
            })
            .collect::<Result<SmallVec<[Pending<'_>; LIMITS_INLINE]>, MissingPart>>()
            .map_err(|MissingPart| Undecidable(MISSING_PART))?;
        let giver = pending.iter().find(|p| p.limit.key.gives_tag());
        let tag = self.keys.tag(facts, giver.map(|p| &p.digest), rotation);
        for Pending { limit, digest } in &pending {
            let cost = cost_of(limit, facts)?;
            let key = self.keys.key(&tag, &limit.key, digest);
            keep(
                limit,
                LimitRecord::new(key, if digest.skipped { 0 } else { cost }),
            );
        }
        Ok(())
    }

    /// [`Tier::each_record`] of a tier whose every key was made at load (per-route limits):
    /// only the costs are the request's.
    fn fixed_records(
        &self,
        facts: &RequestFacts<'_>,
        mut keep: impl FnMut(&Arc<TierLimit>, LimitRecord),
    ) -> Result<(), Undecidable> {
        for limit in self.limits.iter() {
            let cost = cost_of(limit, facts)?;
            let key = limit.key.fixed().cloned().unwrap_or_default();
            keep(limit, LimitRecord::new(key, cost));
        }
        Ok(())
    }

    /// The policy's view of `met`, limits this tier's [`Tier::met`] made, each beside its
    /// record: under this tier's rules.
    pub fn asking<'a>(&'a self, met: &'a mut [LimitMet]) -> Asked<'a> {
        let pairs = met.iter_mut().map(|m| (&m.limit.limit, &mut m.record));
        Asked::new(&self.rules, pairs)
    }

    /// The policy's view of `records` (this tier's, one per limit, as [`Tier::records`] made
    /// them; tools and tests): `Err` when they are not one per limit.
    pub fn asked<'a>(&'a self, records: &'a mut [LimitRecord]) -> Result<Asked<'a>, Mismatch> {
        let pairs = paired_mut("a tier's limits and records", &self.limits, records)?;
        Ok(Asked::new(&self.rules, pairs.map(|(l, r)| (&l.limit, r))))
    }

    /// This tier's limits, each with the record of it among `records` (tools): `Err` when
    /// they are not one per limit.
    pub fn said<'a, 'r>(
        &'a self,
        records: &'r [LimitRecord],
    ) -> Result<impl Iterator<Item = (&'a TierLimit, &'r LimitRecord)>, Mismatch> {
        let pairs = paired("a tier's limits and records", &self.limits, records)?;
        Ok(pairs.map(|(limit, record)| (&**limit, record)))
    }

    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// This tier with `changes` (by the limit's place in its route): a limit lifted (`None`)
    /// or at another quota (`Some`); a limit it does not have is left alone. The rules and
    /// `RateLimit-Policy` are those of the new limits; keys and series stay the limits'.
    pub fn changed(&self, changes: &[(Position, Option<Limit>)], instances: u64) -> Tier {
        let change = |limit: &TierLimit| changes.iter().rev().find(|(at, _)| *at == limit.position);
        let limits: Box<[Arc<TierLimit>]> = self
            .limits
            .iter()
            .filter_map(|limit| match change(limit) {
                None => Some(Arc::clone(limit)),
                Some((_, None)) => None,
                Some((_, Some(changed))) => Some(Arc::new(TierLimit {
                    limit: PolicyLimit::new(changed.clone(), instances),
                    ..TierLimit::clone(limit)
                })),
            })
            .collect();
        let exact = || limits.iter().map(|l| &l.limit.exact);
        let headers = self.rate_limit_headers;
        Tier {
            policy_header: headers.then(|| policy_header(exact())).flatten(),
            rate_limit_headers: headers,
            rules: LimitRules::new(exact(), self.rules.failure_mode(), self.rules.deadline()),
            keys: self.keys.clone(),
            limits,
        }
    }
}

/// `"a";q=10;w=1, "b";q=100;w=60`: the IETF httpapi RateLimit-Policy list, built once.
/// Limits that are not rates (concurrency), shadow limits and hidden ones are not listed.
pub fn policy_header<'a>(limits: impl IntoIterator<Item = &'a Limit>) -> Option<HeaderValue> {
    let mut value = Vec::new();
    for limit in limits {
        if let Some((quota, window)) = limit.advertised_policy() {
            fields::push_policy_item(&mut value, &limit.name, quota, window);
        }
    }
    if value.is_empty() {
        return None;
    }
    // Names are checked to be a safe ASCII subset, so this cannot fail.
    HeaderValue::from_bytes(&value).ok()
}

/// What `facts` costs `limit`: `Err` for a cost header that is not a whole number within the
/// limit's cap.
fn cost_of(limit: &TierLimit, facts: &RequestFacts<'_>) -> Result<u64, Undecidable> {
    limit
        .limit
        .exact
        .cost
        .of(limit.costs.request(facts.headers))
        .map_err(|_| Undecidable(BAD_COST))
}

/// Which tier of its route a request meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierId(pub u16);

/// Every tier of one route, and which caller meets which.
#[derive(Debug)]
pub struct Tiers {
    /// `tiers[0]` is the route's default: every limit as written. Shared, so a request holds
    /// the tier it met to its end, whatever a reload does meanwhile.
    tiers: Box<[Arc<Tier>]>,
    /// Per plan, by its [`PlanSlot`], the tier its consumers meet.
    by_plan: Box<[TierId]>,
    /// Per overridden consumer, the tier it meets, by its plan as above.
    by_consumer: HashMap<Arc<str>, Box<[TierId]>>,
}

impl Tiers {
    /// No limits for anyone.
    pub fn unlimited() -> Tiers {
        Tiers::single(Tier::none(RouteKeys::new(
            "",
            "",
            crate::route::keys::KeySecret::new(""),
            &[],
        )))
    }

    /// One tier for everyone.
    pub fn single(tier: Tier) -> Tiers {
        Tiers {
            tiers: Box::new([Arc::new(tier)]),
            by_plan: Box::new([]),
            by_consumer: HashMap::new(),
        }
    }

    /// `tiers[0]` the default; `by_plan` and `by_consumer` index into `tiers` (checked by the
    /// config compiler, which builds them).
    pub fn new(
        tiers: Vec<Tier>,
        by_plan: Vec<TierId>,
        by_consumer: HashMap<Arc<str>, Box<[TierId]>>,
    ) -> Tiers {
        Tiers {
            tiers: tiers.into_iter().map(Arc::new).collect(),
            by_plan: by_plan.into(),
            by_consumer,
        }
    }

    /// The tier `consumer` meets (anonymous callers: the default).
    pub fn choose(&self, consumer: Option<&Consumer>) -> TierId {
        let Some(consumer) = consumer else {
            return TierId(0);
        };
        let slot = PlanSlot::of(consumer.plan);
        let by_plan = match self.by_consumer.get(&consumer.id) {
            Some(own) => own,
            None => &self.by_plan,
        };
        by_plan.get(slot.index()).copied().unwrap_or_default()
    }

    /// Which callers meet tier `id` by their plan (consumers with tiers of their own aside).
    pub fn plan_slots_of(&self, id: TierId) -> Vec<PlanSlot> {
        let plans = self.by_plan.len().saturating_sub(1);
        let meets =
            |slot: &PlanSlot| self.by_plan.get(slot.index()).copied().unwrap_or_default() == id;
        PlanSlot::all(plans).filter(meets).collect()
    }

    /// Whether consumer `id` has tiers of its own (its own `consumers:` entries), not its plan's.
    pub fn has_own(&self, id: &str) -> bool {
        self.by_consumer.contains_key(id)
    }

    /// The tier `id` (the default for an id of another configuration).
    pub fn get(&self, id: TierId) -> &Tier {
        self.shared(id)
    }

    /// [`Tiers::get`], as the tier is shared: what a request holds to its end.
    pub fn shared(&self, id: TierId) -> &Arc<Tier> {
        let tiers = &self.tiers;
        tiers.get(usize::from(id.0)).unwrap_or(&tiers[0])
    }

    /// The tiers consumer `id` can meet, whatever its plan (its own row, or the plans').
    pub fn possible_for(&self, id: &str) -> Vec<TierId> {
        let row = self.by_consumer.get(id).unwrap_or(&self.by_plan);
        let mut ids: Vec<TierId> = row.iter().copied().chain([TierId(0)]).collect();
        ids.sort_by_key(|tier| tier.0);
        ids.dedup();
        ids
    }

    /// Every tier, by [`TierId`].
    pub fn all(&self) -> &[Arc<Tier>] {
        &self.tiers
    }

    /// The route's limits as written: every limit, in its order.
    pub fn default(&self) -> &Tier {
        &self.tiers[0]
    }

    /// The route's limits as written, in order: its default tier's (a plan's or a consumer's
    /// parameters aside, the `(route, limit)` series are these).
    pub fn written(&self) -> impl Iterator<Item = &Limit> {
        self.default().limits.iter().map(|l| &l.limit.exact)
    }

    /// Whether its limit named `name` is a common limit (one bucket over every route using it).
    pub fn uses_common(&self, name: &str) -> bool {
        let written = self.default().limits.iter();
        written
            .filter(|limit| limit.key.common())
            .any(|limit| *limit.limit.exact.name == *name)
    }

    /// The algorithms of its shared limits, in every tier: those its decisions may call in
    /// Redis (limits local to each gateway never are).
    pub fn algorithms(&self) -> Algorithms {
        let limits = self.tiers.iter().flat_map(|tier| tier.limits.iter());
        let shared = limits.filter(|l| l.limit.exact.scope == Scope::Shared);
        Algorithms::of_limits(shared.map(|l| &l.limit.exact))
    }

    /// How many tiers the route has (each runs its own [`Rotation`]).
    pub fn count(&self) -> usize {
        self.tiers.len()
    }

    /// Whether the route has any limit for any caller.
    pub fn limit_anything(&self) -> bool {
        self.tiers.iter().any(|tier| !tier.is_empty())
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::caller::consumers::test_consumer as consumer;
    use crate::route::keys::KeySecret;

    fn tier() -> Tier {
        Tier::none(RouteKeys::new("t", "r", KeySecret::new("s"), &[]))
    }

    #[test]
    fn the_most_specific_tier_wins() {
        // Plans free (0) and pro (1): pro has its own tier 1; consumer acme its own tier 2 on
        // any plan, and tier 3 on pro.
        let tiers = Tiers::new(
            vec![tier(), tier(), tier(), tier()],
            vec![TierId(0), TierId(0), TierId(1)],
            HashMap::from([(
                Arc::from("acme"),
                vec![TierId(2), TierId(2), TierId(3)].into_boxed_slice(),
            )]),
        );
        assert_eq!(tiers.choose(None), TierId(0));
        assert_eq!(tiers.choose(Some(&consumer("bob", None))), TierId(0));
        assert_eq!(tiers.choose(Some(&consumer("bob", Some(0)))), TierId(0));
        assert_eq!(tiers.choose(Some(&consumer("bob", Some(1)))), TierId(1));
        assert_eq!(tiers.choose(Some(&consumer("acme", Some(0)))), TierId(2));
        assert_eq!(tiers.choose(Some(&consumer("acme", Some(1)))), TierId(3));
        assert_eq!(tiers.choose(Some(&consumer("acme", None))), TierId(2));
    }

    #[test]
    fn a_single_tier_serves_everyone() {
        let tiers = Tiers::single(tier());
        assert_eq!(tiers.choose(Some(&consumer("x", Some(4)))), TierId(0));
        assert!(std::ptr::eq(tiers.get(TierId(9)), tiers.default()));
    }
}
