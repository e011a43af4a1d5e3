//! What a reset or credit names: the route, the caller (a consumer, a client address, or
//! neither), the limits of the caller's tier it changes, and the keys they are counted under —
//! the same keys its requests meet — with what each has left, read without consuming.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{json, Value};

use super::params::Params;
use crate::caller::consumers::{AuthMode, Consumer};
use crate::config::Config;
use crate::edge::admin_error::AdminError;
use crate::edge::usage::{named_consumer, peek_met};
use crate::exchange::named;
use crate::limiter::Policy;
use crate::route::table::Route;
use crate::route::tiers::{LimitMet, LimitsMet, Position, Tier, TierLimit};
use crate::runtime::snapshot::Snapshot;

/// The limits of one route a reset or credit changes, with the keys they are counted under.
pub(super) struct Target<'a> {
    route: &'a Route,
    /// The caller's tier with only the limits changed (at the quota in force), and the one
    /// whose digest is the route's hash tag: what their keys and a peek need, and no more (a
    /// limit keyed on a header the call cannot name does not stand in the way).
    pub(super) tier: Tier,
    /// The limits changed, as `tier` holds them (the same `Arc`s), in the route's order.
    pub(super) chosen: Vec<Arc<TierLimit>>,
    pub(super) facts: Facts,
}

impl Target<'_> {
    /// Whether `limit` (one of `tier`'s) is one the call changes.
    fn changes(&self, limit: &Arc<TierLimit>) -> bool {
        self.chosen.iter().any(|chosen| Arc::ptr_eq(chosen, limit))
    }

    /// The limits of `tier` beside their records for these facts: each limit's key.
    pub(super) fn met(&self) -> Result<LimitsMet, AdminError> {
        let facts = &self.facts;
        named::met(
            &self.tier,
            &self.route.name,
            facts.consumer.as_ref(),
            facts.client_ip,
        )
        .map_err(|undecidable| AdminError::Undecidable(undecidable.0))
    }

    /// The changed limits among `met` (this target's [`Target::met`]), each beside its record.
    pub(super) fn changed<'m>(
        &'m self,
        met: &'m [LimitMet],
    ) -> impl Iterator<Item = &'m LimitMet> + 'm {
        met.iter().filter(|m| self.changes(&m.limit))
    }
}

/// Who the keys are of: the consumer and the client address named.
pub(super) struct Facts {
    consumer: Option<Consumer>,
    client_ip: Option<IpAddr>,
}

/// The route, the caller and the limits a reset or credit names. Limits the policy says no
/// write reaches on every gateway (`scope: local` beside Redis), and limits across regions
/// (`scope: global`), are not the admin API's.
/// Routes with split limits are refused: a split limit's shard is not the caller's alone.
pub(super) fn target<'a>(
    snapshot: &'a Snapshot,
    params: &Params,
    policy: &Policy,
) -> Result<Target<'a>, AdminError> {
    let config = &snapshot.config;
    let name = params.route_in(&config.routes)?;
    let route = config
        .routes
        .named(name)
        .ok_or_else(|| AdminError::NoRoute(name.to_string()))?;
    let facts = Facts {
        consumer: consumer_of(snapshot, params)?,
        client_ip: client_ip_of(config, params)?,
    };
    if facts.consumer.is_some() && route.auth.mode == AuthMode::Off {
        // Its requests have no consumer: a `consumer` key part is their address.
        return Err(AdminError::NoConsumers(name.to_string()));
    }
    let (id, overridden) = snapshot.tier_for(route, facts.consumer.as_ref());
    let configured = route.tiers.get(id);
    if configured.keys.has_split_limits() {
        return Err(AdminError::SplitLimits);
    }
    let named = (facts.consumer.is_some(), facts.client_ip.is_some());
    let keyed = |limit: &TierLimit| configured.keys.follows_from(&limit.key, named.0, named.1);
    // A limit across regions is no region's alone to reset or credit.
    let reached = |limit: &TierLimit| {
        policy.admin_reaches(&limit.limit.exact) && limit.limit.exact.global.is_none()
    };
    let chosen = chosen_limits(configured, params, (keyed, reached))?;
    let tier = only(configured, overridden.as_deref(), &chosen, config.instances);
    let chosen = tier
        .limits
        .iter()
        .filter(|limit| chosen.contains(&limit.position))
        .cloned()
        .collect();
    Ok(Target {
        route,
        tier,
        chosen,
        facts,
    })
}

/// The limits of `tier` a call names (`limit=`, or every one keyed on what is named and
/// reached by a write): their places in the route. A limit no write reaches is refused by
/// name, in the same words whatever the call.
fn chosen_limits(
    tier: &Tier,
    params: &Params,
    (keyed, reached): (impl Fn(&TierLimit) -> bool, impl Fn(&TierLimit) -> bool),
) -> Result<Vec<Position>, AdminError> {
    let local = |limit: &TierLimit| {
        let name = limit.limit.exact.name.to_string();
        match limit.limit.exact.global {
            Some(_) => AdminError::GlobalLimit(name),
            None => AdminError::LocalLimit(name),
        }
    };
    let Some(name) = params.limit.as_deref() else {
        let all = tier.limits.iter().map(|l| &**l).filter(|&l| keyed(l));
        let (all, unreached): (Vec<&TierLimit>, Vec<&TierLimit>) = all.partition(|&l| reached(l));
        return match (all.is_empty(), unreached.first()) {
            (false, _) => Ok(all.iter().map(|l| l.position).collect()),
            (true, Some(limit)) => Err(local(limit)),
            (true, None) => Err(AdminError::NoneKeyed),
        };
    };
    let limit = tier
        .limits
        .iter()
        .find(|l| *l.limit.exact.name == *name)
        .ok_or_else(|| AdminError::NoLimit(name.to_string()))?;
    if !reached(limit) {
        return Err(local(limit));
    }
    if !keyed(limit) {
        return Err(AdminError::NotKeyed(name.to_string()));
    }
    Ok(vec![limit.position])
}

/// `configured` with only the limits at `chosen` (each at the quota an override in force
/// gives it, in `overridden`) and the one whose digest is the route's hash tag.
fn only(configured: &Tier, overridden: Option<&Tier>, chosen: &[Position], instances: u64) -> Tier {
    let in_force = |at| {
        let limits = overridden
            .map(|tier| tier.limits.iter())
            .into_iter()
            .flatten();
        limits
            .into_iter()
            .find(|l| l.position == at)
            .map(|l| l.limit.exact.clone())
    };
    let changes: Vec<_> = configured
        .limits
        .iter()
        .filter_map(|limit| match chosen.contains(&limit.position) {
            true => in_force(limit.position).map(|changed| (limit.position, Some(changed))),
            false if limit.key.gives_tag() => None,
            false => Some((limit.position, None)),
        })
        .collect();
    configured.changed(&changes, instances)
}

/// The consumer a call names, on the plan it names or its own.
fn consumer_of(snapshot: &Snapshot, params: &Params) -> Result<Option<Consumer>, AdminError> {
    let Some(id) = params.consumer.as_deref() else {
        return Ok(None);
    };
    let consumer = named_consumer(&snapshot.site, id, params.plan.as_deref())?;
    Ok(Some(consumer))
}

/// The client address a call names, as requests from it are keyed (canonical, an IPv6
/// address grouped to `ipv6_prefix`).
fn client_ip_of(config: &Config, params: &Params) -> Result<Option<IpAddr>, AdminError> {
    let ip = params.client_ip()?;
    Ok(ip.map(|ip| config.trusted_proxies.key_address(ip)))
}

/// What each chosen limit has left, read without consuming (`null`: not read).
pub(super) async fn remaining(
    policy: &Policy,
    target: &Target<'_>,
) -> Result<Vec<Value>, AdminError> {
    let mut met = target.met()?;
    peek_met(policy, &target.tier, &mut met).await?;
    let left = |met: &LimitMet| {
        let status = met.record.status.as_ref();
        let name = &*met.limit.limit.exact.name;
        json!({ "limit": name, "remaining": status.map(|s| s.remaining) })
    };
    Ok(target.changed(&met).map(left).collect())
}

/// What each chosen limit has left after a write that happened: `null` when it cannot be
/// read (the write stands; the answer and the audit say it was applied).
pub(super) async fn after_write(policy: &Policy, target: &Target<'_>) -> Value {
    match remaining(policy, target).await {
        Ok(left) => Value::Array(left),
        Err(_) => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use http::HeaderMap;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::exchange::overrides::Read;
    use crate::route::keys::{RequestFacts, Rotation};
    use crate::route::overrides::{Override, PlanOverride, QuotaOverride};

    /// `api` verifies callers (plans `free`, `pro`) and has a limit per consumer (10 a minute,
    /// 100 on `pro`), one per address and one per path; `open` does not verify callers.
    fn gateway() -> (Policy, Snapshot) {
        let yaml = "listen: [127.0.0.1:1]\n\
             identity: { plans: [free, pro], jwt: { hmac_secret: 0123456789abcdef0123456789abcdef, algorithms: [HS256], plan_claim: plan } }\n\
             routes:\n\
             \x20 - { name: api, match: { path_prefix: /api }, upstream: { servers: [127.0.0.1:1] }, auth: required, limits: [\
             { name: per_consumer, key: [consumer], rate: 10/m, plans: { pro: { rate: 100/m } } }, \
             { name: per_ip, key: [client_ip], rate: 50/s }, \
             { name: per_path, key: [path], rate: 20/s }] }\n\
             \x20 - { name: open, match: { path_prefix: /open }, upstream: { servers: [127.0.0.1:1] }, \
             limits: [{ name: per_ip, key: [client_ip], rate: 5/s }] }\n";
        crate::runtime::snapshot::testing::in_process(yaml)
    }

    /// The limits (name, quota) a call with `query` changes, or why it names none.
    fn named(query: &str) -> Result<Vec<(String, u64)>, AdminError> {
        let (policy, snapshot) = gateway();
        chosen_of(&snapshot, &policy, query)
    }

    fn chosen_of(
        snapshot: &Snapshot,
        policy: &Policy,
        query: &str,
    ) -> Result<Vec<(String, u64)>, AdminError> {
        let params = Params::parse(Some(query))?;
        let target = target(snapshot, &params, policy)?;
        let limit = |chosen: &Arc<TierLimit>| {
            let limit = &chosen.limit.exact;
            let quota = limit.advertised.map_or(0, |(q, _)| q);
            (limit.name.to_string(), quota)
        };
        Ok(target.chosen.iter().map(limit).collect())
    }

    fn of(limits: &[(&str, u64)]) -> Vec<(String, u64)> {
        limits.iter().map(|(n, q)| (n.to_string(), *q)).collect()
    }

    #[test]
    fn a_call_changes_every_limit_keyed_on_what_it_names_and_no_other() {
        let consumer = named("route=api&consumer=acme").expect("a target");
        assert_eq!(consumer, of(&[("per_consumer", 10)]));
        let address = named("route=api&client_ip=192.0.2.7").expect("a target");
        assert_eq!(address, of(&[("per_ip", 50)]));
        let both = named("route=api&consumer=acme&client_ip=192.0.2.7").expect("a target");
        assert_eq!(both, of(&[("per_consumer", 10), ("per_ip", 50)]));
        let one = named("route=api&consumer=acme&client_ip=192.0.2.7&limit=per_ip");
        assert_eq!(one.expect("a target"), of(&[("per_ip", 50)]));
    }

    #[test]
    fn the_limits_are_those_of_the_plan_named_or_the_consumers_own() {
        let own = named("route=api&consumer=acme").expect("a target");
        assert_eq!(own, of(&[("per_consumer", 10)]));
        let pro = named("route=api&consumer=acme&plan=pro").expect("a target");
        assert_eq!(pro, of(&[("per_consumer", 100)]));
        let gold = named("route=api&consumer=acme&plan=gold");
        assert!(matches!(gold, Err(AdminError::NoPlan(p)) if p == "gold"));
    }

    #[test]
    fn a_limit_the_call_cannot_key_or_the_route_lacks_is_refused() {
        let path = named("route=api&consumer=acme&limit=per_path");
        assert!(matches!(path, Err(AdminError::NotKeyed(l)) if l == "per_path"));
        let ip = named("route=api&consumer=acme&limit=per_ip");
        assert!(matches!(ip, Err(AdminError::NotKeyed(l)) if l == "per_ip"));
        let gone = named("route=api&consumer=acme&limit=gone");
        assert!(matches!(gone, Err(AdminError::NoLimit(l)) if l == "gone"));
        assert!(matches!(named("route=api"), Err(AdminError::NoneKeyed)));
        let open = named("route=open&consumer=acme");
        assert!(matches!(open, Err(AdminError::NoConsumers(r)) if r == "open"));
        assert!(matches!(
            named("route=gone&consumer=acme"),
            Err(AdminError::NoRoute(_))
        ));
    }

    #[test]
    fn a_limit_is_changed_at_the_quota_an_override_in_force_gives_it() {
        let (policy, snapshot) = gateway();
        let one = Override::Limit(QuotaOverride {
            route: "api".into(),
            limit: "per_consumer".into(),
            consumer: Some("acme".into()),
            quota: Some(3),
            actor: None,
        });
        let until = Instant::now() + Duration::from_secs(600);
        snapshot.overrides.list().replace(vec![Read { one, until }]);
        snapshot.overrides.refresh(&snapshot.config);
        let acme = chosen_of(&snapshot, &policy, "route=api&consumer=acme");
        assert_eq!(acme.expect("a target"), of(&[("per_consumer", 3)]));
        let bob = chosen_of(&snapshot, &policy, "route=api&consumer=bob");
        assert_eq!(bob.expect("a target"), of(&[("per_consumer", 10)]));
    }

    #[test]
    fn without_plan_a_call_reads_the_plan_a_plan_override_puts_the_consumer_on() {
        let (policy, snapshot) = gateway();
        let one = Override::Plan(PlanOverride {
            consumer: "acme".into(),
            plan: "pro".into(),
            actor: None,
        });
        let until = Instant::now() + Duration::from_secs(600);
        snapshot.overrides.list().replace(vec![Read { one, until }]);
        snapshot.overrides.refresh(&snapshot.config);
        let acme = chosen_of(&snapshot, &policy, "route=api&consumer=acme");
        assert_eq!(acme.expect("a target"), of(&[("per_consumer", 100)]));
        let named = chosen_of(&snapshot, &policy, "route=api&consumer=acme&plan=free");
        assert_eq!(named.expect("a target"), of(&[("per_consumer", 10)]));
        let bob = chosen_of(&snapshot, &policy, "route=api&consumer=bob");
        assert_eq!(bob.expect("a target"), of(&[("per_consumer", 10)]));
    }

    #[test]
    fn the_keys_are_those_the_consumers_requests_meet() {
        let (policy, snapshot) = gateway();
        let params = Params::parse(Some("route=api&consumer=acme")).expect("params");
        let target = target(&snapshot, &params, &policy).expect("a target");
        let met = target.met().expect("records");
        let changed = target.changed(&met).next().expect("one limit changed");
        let key = &changed.record.ask.key;

        // A request of acme's, from any address and for any path.
        let route = snapshot.config.routes.named("api").expect("api");
        let request = |id: &str| {
            let consumer = crate::caller::consumers::test_consumer(id, None);
            let headers = HeaderMap::new();
            let facts = RequestFacts {
                client_ip: IpAddr::V4(Ipv4Addr::new(198, 51, 100, 9)),
                method: "GET",
                host: "example.com",
                path: "/api/x",
                query: None,
                headers: &headers,
                route: "api",
                consumer: Some(&consumer),
                claim_names: &[],
            };
            let tier = route.tiers.get(route.tiers.choose(Some(&consumer)));
            let records = tier.records(&facts, &Rotation::default()).expect("records");
            records[0].ask.key.clone()
        };
        assert_eq!(
            *key,
            request("acme"),
            "per_consumer is the route's first limit"
        );
        assert_ne!(*key, request("bob"));
    }
}
