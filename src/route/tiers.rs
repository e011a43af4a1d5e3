//! A route's limits per kind of caller: the default set, each plan's, each overridden
//! consumer's — compiled at load, so a request only picks one (most specific wins: a consumer's
//! own override, then its plan's, then the route's default; the default never also applies to
//! a caller a plan or a consumer override covers).

use std::collections::HashMap;
use std::sync::Arc;

use http::header::HeaderValue;

use crate::caller::consumers::Consumer;
use crate::limiter::{Ask, Asks, Limit, LimitSet};
use crate::route::keys::{MissingPart, RequestFacts, Rotation, RouteKeys};
use crate::route::pricing::RoutePricing;

/// Detail of the `400` for a request that lacks a part a limit is keyed on.
const MISSING_PART: &str =
    "The request lacks a header, query parameter or claim a rate limit is keyed on.";
/// Detail of the `400` for a cost header that is not a whole number within the cap.
const BAD_COST: &str = "The cost header must be a whole number within the limit's cost_max.";

/// A request that cannot be decided as sent (a key part it must have is missing, its cost
/// header is wrong): the detail of its `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Undecidable(pub &'static str);

/// The limits one kind of caller meets on a route, with everything a request needs of them.
#[derive(Debug)]
pub struct Tier {
    pub limits: LimitSet,
    pub keys: RouteKeys,
    /// Where its priced limits read their costs.
    pub pricing: RoutePricing,
    /// `RateLimit-Policy` value, or `None` when the route sends no rate-limit headers: a caller
    /// sees its own tier's limits.
    pub policy_header: Option<HeaderValue>,
    /// Where each of its limits stands in the route's list (a plan may leave limits out).
    pub positions: Box<[u8]>,
}

impl Tier {
    /// What the request asks of each limit of this tier: its key and its cost (0 for a limit
    /// skipped for lack of a key part, which is then only read). `Err` when the request cannot
    /// be decided as sent, with the detail of its `400`.
    pub fn asks(&self, facts: &RequestFacts<'_>, rotation: &Rotation) -> Result<Asks, Undecidable> {
        let built = self
            .keys
            .build(facts, rotation)
            .map_err(|MissingPart| Undecidable(MISSING_PART))?;
        let mut asks = Asks::new();
        for (i, (limit, key)) in self.limits.limits().iter().zip(built.keys).enumerate() {
            let cost = limit
                .cost
                .of(self.pricing.request(i, facts.headers))
                .map_err(|_| Undecidable(BAD_COST))?;
            let skipped = built.skipped & (1 << i) != 0;
            asks.push(Ask {
                key,
                cost: if skipped { 0 } else { cost },
            });
        }
        Ok(asks)
    }

    /// The limit at `index` of this tier.
    pub fn limit(&self, index: usize) -> Option<&Limit> {
        self.limits.limits().get(index)
    }
}

/// Which tier of its route a request meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierId(pub u16);

/// Every tier of one route, and which caller meets which.
#[derive(Debug)]
pub struct Tiers {
    /// `tiers[0]` is the route's default: every limit as written.
    tiers: Box<[Tier]>,
    /// Per plan, by [`crate::caller::consumers::PlanId`] + 1 (0: no plan), the tier its consumers meet.
    by_plan: Box<[TierId]>,
    /// Per overridden consumer, the tier it meets, by its plan as above.
    by_consumer: HashMap<Arc<str>, Box<[TierId]>>,
}

impl Tiers {
    /// No limits for anyone.
    pub fn unlimited() -> Tiers {
        Tiers::single(Tier {
            limits: LimitSet::none(),
            keys: RouteKeys::new("", "", crate::route::keys::KeySecret::new(""), &[]),
            pricing: RoutePricing::default(),
            policy_header: None,
            positions: Box::new([]),
        })
    }

    /// One tier for everyone.
    pub fn single(tier: Tier) -> Tiers {
        Tiers {
            tiers: Box::new([tier]),
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
            tiers: tiers.into(),
            by_plan: by_plan.into(),
            by_consumer,
        }
    }

    /// The tier `consumer` meets (anonymous callers: the default).
    pub fn choose(&self, consumer: Option<&Consumer>) -> TierId {
        let Some(consumer) = consumer else {
            return TierId(0);
        };
        let plan = consumer.plan.map_or(0, |plan| usize::from(plan.0) + 1);
        let by_plan = match self.by_consumer.get(&consumer.id) {
            Some(own) => own,
            None => &self.by_plan,
        };
        by_plan.get(plan).copied().unwrap_or_default()
    }

    /// The tier `id` (the default for an id of another configuration).
    pub fn get(&self, id: TierId) -> &Tier {
        self.tiers
            .get(usize::from(id.0))
            .unwrap_or_else(|| self.default())
    }

    /// The route's limits as written: every limit, in its order.
    pub fn default(&self) -> &Tier {
        &self.tiers[0]
    }

    /// How many tiers the route has (each runs its own [`Rotation`]).
    pub fn count(&self) -> usize {
        self.tiers.len()
    }

    /// Whether the route has any limit for any caller.
    pub fn limit_anything(&self) -> bool {
        self.tiers.iter().any(|tier| !tier.limits.is_empty())
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::caller::consumers::test_consumer as consumer;
    use crate::route::keys::KeySecret;

    fn tier() -> Tier {
        Tier {
            limits: LimitSet::none(),
            keys: RouteKeys::new("t", "r", KeySecret::new("s"), &[]),
            pricing: RoutePricing::new(Vec::new()),
            policy_header: None,
            positions: Box::new([]),
        }
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
