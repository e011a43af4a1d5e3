//! Temporary overrides (the quota admin API's): of routes' limits (`/v1/quota/overrides`: a
//! limit lifted, `off`, or at another quota, for every caller of a route or for one consumer)
//! and of consumers' plans (`/v1/quota/plans`: a consumer on another plan), each until it
//! expires. The list in force comes from where the limits live (Redis, read by every gateway
//! every second, or this process: `exchange::overrides`); each configuration compiles it
//! ([`CompiledOverrides`]) into the tiers its requests then meet and the plan each overridden
//! consumer is on, so a request only looks them up, and only while some override is in force.
//! A consumer on another plan meets that plan's compiled tier on every route: exactly its
//! limits, nothing scaled.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::caller::consumers::{AuthMode, Consumer, PlanId, Plans, MAX_CONSUMER_ID};
use crate::limiter::Limit;
use crate::route::table::{Route, RouteTable, COMMON};
use crate::route::tiers::{Tier, TierId};

/// One override as stored and listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaOverride {
    pub route: String,
    pub limit: String,
    /// The consumer it is for; `None`: every caller of the route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// The quota in force: units per the limit's window (at most in flight, for concurrency);
    /// `None`: the limit is lifted (`off`).
    pub quota: Option<u64>,
    /// Who set it (the admin call's `X-Audit-Actor`), for the list and the audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
}

impl QuotaOverride {
    /// Which route, limit and consumer it is for: one override per field, a new one replaces
    /// the one in force. A JSON list, so no name can be mistaken for another.
    pub fn field(&self) -> String {
        let parts = (&self.route, &self.limit, &self.consumer);
        serde_json::to_string(&parts).unwrap_or_default()
    }

    /// Whether it applies on `route`: the route it names, or, for a common limit's (named
    /// [`COMMON`]: one bucket, one quota), every route that uses that limit.
    fn applies_on(&self, route: &Route) -> bool {
        match self.route == COMMON {
            true => route.tiers.uses_common(&self.limit),
            false => *self.route == *route.name,
        }
    }

    /// Checks it against `routes`: the route (every route using the common limit, for a common
    /// limit's) and its limit exist, the consumer's id is within bounds, and the limit can run
    /// at the quota. `Ok`: the limit as written.
    pub fn check<'r>(&self, routes: &'r RouteTable) -> Result<&'r Limit, Unfit> {
        let named = match self.route == COMMON {
            // A consumer's override needs a route using it that verifies callers.
            true => routes
                .in_file_order()
                .into_iter()
                .filter(|route| route.tiers.uses_common(&self.limit))
                .find(|route| route.auth.mode != AuthMode::Off || self.consumer.is_none())
                .or_else(|| routes.using_common(&self.limit)),
            false => routes.named(&self.route),
        };
        let route = named.ok_or_else(|| Unfit::NoRoute(self.route.clone()))?;
        let written = route
            .tiers
            .written()
            .find(|limit| *limit.name == *self.limit);
        let limit = written.ok_or_else(|| Unfit::NoLimit {
            route: self.route.clone(),
            limit: self.limit.clone(),
        })?;
        if let Some(id) = &self.consumer {
            if id.is_empty() || id.len() > MAX_CONSUMER_ID {
                return Err(Unfit::ConsumerBounds);
            }
            if route.auth.mode == AuthMode::Off {
                return Err(Unfit::NoConsumers(self.route.clone()));
            }
        }
        if let Some(quota) = self.quota {
            limit.with_quota(quota).map_err(Unfit::Quota)?;
        }
        Ok(limit)
    }
}

/// A consumer put on another plan, as stored and listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanOverride {
    pub consumer: String,
    /// The plan's name (one of `identity.plans`; a reload that removes it drops the override).
    pub plan: String,
    /// Who set it (the admin call's `X-Audit-Actor`), for the list and the audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
}

impl PlanOverride {
    /// Which consumer it is for: one plan override per consumer. A JSON object, never one of a
    /// limit override's fields (lists).
    pub fn field(&self) -> String {
        serde_json::json!({ "plan_of": self.consumer }).to_string()
    }
}

/// An override of either kind, as the overrides table stores it (the same table, bound and
/// epoch): a stored value is a limit's when it names a route and limit, else a plan's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Override {
    Limit(QuotaOverride),
    Plan(PlanOverride),
}

impl Override {
    /// Its field in the overrides table.
    pub fn field(&self) -> String {
        match self {
            Override::Limit(one) => one.field(),
            Override::Plan(one) => one.field(),
        }
    }

    /// Its kind, as the API lists it.
    pub fn kind(&self) -> &'static str {
        match self {
            Override::Limit(_) => "limit",
            Override::Plan(_) => "plan",
        }
    }
}

/// Why an override cannot apply to the routes it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    #[error("no route named {0:?}")]
    NoRoute(String),
    #[error("route {route:?} has no limit named {limit:?}")]
    NoLimit { route: String, limit: String },
    #[error("consumer: 1 to {MAX_CONSUMER_ID} bytes")]
    ConsumerBounds,
    #[error("route {0:?} does not verify callers (auth: off): no request of it has a consumer")]
    NoConsumers(String),
    /// The limit cannot run at the quota (in words).
    #[error("{0}")]
    Quota(String),
}

/// The overrides of one configuration: per route (by its index), the tiers its callers meet;
/// per consumer on another plan, that plan.
#[derive(Debug, Default)]
pub struct CompiledOverrides {
    /// The [`OverrideList`] version compiled.
    pub version: u64,
    by_route: HashMap<usize, RouteOverrides>,
    plans: HashMap<Box<str>, PlanId>,
}

/// One route's overridden tiers, each by [`TierId`]: those every caller meets, and those of
/// consumers with overrides of their own (the route's for everyone applying too).
#[derive(Debug, Default)]
struct RouteOverrides {
    everyone: Option<Box<[Arc<Tier>]>>,
    by_consumer: HashMap<Box<str>, Vec<(TierId, Arc<Tier>)>>,
}

impl CompiledOverrides {
    /// Compiles `list` for `routes` and `plans` (overrides of routes or limits they do not
    /// have are left out, and plans they do not have dropped with a warning: a reload may have
    /// removed them).
    pub fn compile(
        list: &[Override],
        (routes, plans): (&RouteTable, &Plans),
        instances: u64,
        version: u64,
    ) -> CompiledOverrides {
        let limits: Vec<&QuotaOverride> = list
            .iter()
            .filter_map(|one| match one {
                Override::Limit(one) => Some(one),
                Override::Plan(_) => None,
            })
            .collect();
        let mut by_route = HashMap::new();
        for route in routes.in_file_order() {
            let of_route: Vec<&QuotaOverride> = limits
                .iter()
                .copied()
                .filter(|o| o.applies_on(route))
                .collect();
            if !of_route.is_empty() {
                by_route.insert(route.index, RouteOverrides::of(route, &of_route, instances));
            }
        }
        CompiledOverrides {
            version,
            by_route,
            plans: plans_of(list, plans),
        }
    }

    /// The plan a consumer named `id` is on instead of its own, while a plan override applies.
    pub fn plan_of(&self, id: &str) -> Option<PlanId> {
        self.plans.get(id).copied()
    }

    /// Whether no override is in force.
    pub fn is_empty(&self) -> bool {
        self.by_route.is_empty() && self.plans.is_empty()
    }

    /// The tier a caller meets on `route` instead of its tier `tier`, if an override applies.
    pub fn tier(
        &self,
        route: &Route,
        tier: TierId,
        consumer: Option<&Consumer>,
    ) -> Option<Arc<Tier>> {
        let overrides = self.by_route.get(&route.index)?;
        let own = consumer.and_then(|c| overrides.by_consumer.get(&*c.id));
        if let Some(own) = own {
            let (_, met) = own.iter().find(|(id, _)| *id == tier)?;
            return Some(Arc::clone(met));
        }
        let everyone = overrides.everyone.as_ref()?;
        everyone.get(usize::from(tier.0)).cloned()
    }
}

impl RouteOverrides {
    /// The tiers of `route` its overrides `of_route` make.
    fn of(route: &Route, of_route: &[&QuotaOverride], instances: u64) -> RouteOverrides {
        let everyone: Vec<&QuotaOverride> = of_route
            .iter()
            .copied()
            .filter(|o| o.consumer.is_none())
            .collect();
        let mut compiled = RouteOverrides {
            everyone: (!everyone.is_empty()).then(|| tiers_with(route, &everyone, instances)),
            by_consumer: HashMap::new(),
        };
        for id in of_route.iter().filter_map(|o| o.consumer.as_deref()) {
            if compiled.by_consumer.contains_key(id) {
                continue;
            }
            let own = of_route
                .iter()
                .filter(|o| o.consumer.as_deref() == Some(id));
            let applied: Vec<&QuotaOverride> =
                everyone.iter().copied().chain(own.copied()).collect();
            // Only the tiers this consumer can meet (a few), not every tier of the route.
            let tiers = route
                .tiers
                .possible_for(id)
                .into_iter()
                .map(|tier| (tier, with(route.tiers.get(tier), &applied, instances)));
            compiled.by_consumer.insert(id.into(), tiers.collect());
        }
        compiled
    }
}

/// The plan of each consumer a plan override of `list` puts on one of `plans`; an override
/// naming a plan `plans` does not have is dropped, with a warning.
fn plans_of(list: &[Override], plans: &Plans) -> HashMap<Box<str>, PlanId> {
    let mut on = HashMap::new();
    for one in list {
        let Override::Plan(one) = one else { continue };
        match plans.find(&one.plan) {
            Some(plan) => {
                on.insert(one.consumer.as_str().into(), plan);
            }
            None => log::warn!(
                "plan override: consumer {:?} is put on plan {:?}, which the configuration no longer has; the override is ignored (remove it with DELETE /v1/quota/plans)",
                one.consumer,
                one.plan
            ),
        }
    }
    on
}

/// Every tier of `route` with `overrides` applied, in order.
fn tiers_with(route: &Route, overrides: &[&QuotaOverride], instances: u64) -> Box<[Arc<Tier>]> {
    let apply = |tier: &Arc<Tier>| with(tier, overrides, instances);
    route.tiers.all().iter().map(apply).collect()
}

/// `tier` with `overrides` applied (a later one wins for its limit).
fn with(tier: &Tier, overrides: &[&QuotaOverride], instances: u64) -> Arc<Tier> {
    let changes: Vec<_> = overrides
        .iter()
        .filter_map(|o| {
            let limit = tier
                .limits
                .iter()
                .find(|l| *l.limit.exact.name == *o.limit)?;
            let changed: Option<Limit> = match o.quota {
                None => None,
                Some(quota) => Some(limit.limit.exact.with_quota(quota).ok()?),
            };
            Some((limit.position, changed))
        })
        .collect();
    Arc::new(tier.changed(&changes, instances))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_is_read_back_as_its_kind_under_a_field_of_its_own() {
        let limit = Override::Limit(QuotaOverride {
            route: "api".into(),
            limit: "plan".into(),
            consumer: Some("acme".into()),
            quota: None,
            actor: None,
        });
        let plan = Override::Plan(PlanOverride {
            consumer: "acme".into(),
            plan: "pro".into(),
            actor: Some("ops".into()),
        });
        for one in [&limit, &plan] {
            let stored = serde_json::to_string(one).expect("JSON");
            let read: Override = serde_json::from_str(&stored).expect("an override");
            assert_eq!(&read, one);
        }
        assert_ne!(limit.field(), plan.field());
        assert_eq!((limit.kind(), plan.kind()), ("limit", "plan"));
    }

    #[test]
    fn a_plan_override_names_a_plan_of_the_configuration_or_is_dropped() {
        let plans = Plans::new(vec!["free".into(), "pro".into()], Some(PlanId(0)));
        let on = |consumer: &str, plan: &str| {
            Override::Plan(PlanOverride {
                consumer: consumer.into(),
                plan: plan.into(),
                actor: None,
            })
        };
        let list = [on("acme", "pro"), on("globex", "gold")];
        let routes = RouteTable::new(Vec::new());
        let compiled = CompiledOverrides::compile(&list, (&routes, &plans), 1, 7);
        assert_eq!(compiled.plan_of("acme"), Some(PlanId(1)));
        assert_eq!(compiled.plan_of("globex"), None, "a plan a reload removed");
        assert_eq!(compiled.plan_of("initech"), None);
        assert!(!compiled.is_empty());
    }
}
