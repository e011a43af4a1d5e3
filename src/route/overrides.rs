//! Temporary overrides of routes' limits (the quota admin API's `/v1/quota/overrides`): a limit
//! lifted (`off`) or at another quota, for every caller of a route or for one consumer, until
//! it expires. The list in force comes from where the limits live (Redis, read by every gateway
//! every second, or this process: `exchange::overrides`); each configuration compiles it into the
//! tiers its requests then meet ([`CompiledOverrides`]), so a request only looks its tier up,
//! and only while some override is in force.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::caller::consumers::{AuthMode, Consumer, MAX_CONSUMER_ID};
use crate::limiter::Limit;
use crate::route::table::{Route, RouteTable};
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

    /// Checks it against `routes`: the route and its limit exist, the consumer's id is within
    /// bounds, and the limit can run at the quota. `Ok`: the limit as written.
    pub fn check<'r>(&self, routes: &'r RouteTable) -> Result<&'r Limit, Unfit> {
        let route = routes
            .named(&self.route)
            .ok_or_else(|| Unfit::NoRoute(self.route.clone()))?;
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

/// The overrides of one configuration: per route (by its index), the tiers its callers meet.
#[derive(Debug, Default)]
pub struct CompiledOverrides {
    /// The [`OverrideList`] version compiled.
    pub version: u64,
    by_route: HashMap<usize, RouteOverrides>,
}

/// One route's overridden tiers, each by [`TierId`]: those every caller meets, and those of
/// consumers with overrides of their own (the route's for everyone applying too).
#[derive(Debug, Default)]
struct RouteOverrides {
    everyone: Option<Box<[Arc<Tier>]>>,
    by_consumer: HashMap<Box<str>, Vec<(TierId, Arc<Tier>)>>,
}

impl CompiledOverrides {
    /// Compiles `list` for `routes` (overrides of routes or limits they do not have are left
    /// out: a reload may have removed them).
    pub fn compile(
        list: &[QuotaOverride],
        routes: &RouteTable,
        instances: u64,
        version: u64,
    ) -> CompiledOverrides {
        let mut by_route = HashMap::new();
        for route in routes.in_file_order() {
            let of_route: Vec<&QuotaOverride> =
                list.iter().filter(|o| *o.route == *route.name).collect();
            if of_route.is_empty() {
                continue;
            }
            let everyone: Vec<&QuotaOverride> = of_route
                .iter()
                .copied()
                .filter(|o| o.consumer.is_none())
                .collect();
            let mut compiled = RouteOverrides {
                everyone: (!everyone.is_empty()).then(|| tiers_with(route, &everyone, instances)),
                by_consumer: HashMap::new(),
            };
            for one in of_route.iter().filter(|o| o.consumer.is_some()) {
                let Some(id) = one.consumer.as_deref() else {
                    continue;
                };
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
            by_route.insert(route.index, compiled);
        }
        CompiledOverrides { version, by_route }
    }

    /// Whether no override is in force.
    pub fn is_empty(&self) -> bool {
        self.by_route.is_empty()
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

/// Every tier of `route` with `overrides` applied, in order.
fn tiers_with(route: &Route, overrides: &[&QuotaOverride], instances: u64) -> Box<[Arc<Tier>]> {
    let apply = |tier: &Tier| with(tier, overrides, instances);
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
