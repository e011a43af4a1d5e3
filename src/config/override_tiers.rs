//! How the quota admin API's overrides (`route::overrides`) compile into the tiers callers
//! meet, tested on configurations as written: the route layer cannot load one itself.

use std::path::Path;

use crate::caller::consumers::{test_consumer, Consumer, MAX_CONSUMER_ID};
use crate::config::Config;
use crate::route::overrides::{CompiledOverrides, Override, QuotaOverride, Unfit};
use crate::route::table::COMMON;
use crate::route::tiers::Tier;

/// Two routes verifying callers (plans `free`, `pro`) that share the common limit
/// `whole_api`; `api` has a per-consumer limit tiered by plan and consumer, and a per-address
/// one; `open` does not verify callers.
fn config() -> Config {
    let route = |name: &str, auth: &str, limits: &str| {
        format!(
            "  - name: {name}\n    match: {{ path_prefix: /{name} }}\n    \
             upstream: {{ servers: [127.0.0.1:1] }}\n    auth: {auth}\n    limits: {limits}\n"
        )
    };
    let per_consumer = "{ name: per_consumer, key: [consumer], rate: 10/m, \
         plans: { pro: { rate: 100/m } }, consumers: { acme: { rate: 1000/m } } }";
    let yaml = format!(
        "listen: [127.0.0.1:1]\n\
         identity: {{ plans: [free, pro], jwt: {{ hmac_secret: 0123456789abcdef0123456789abcdef, \
         algorithms: [HS256], plan_claim: plan }} }}\n\
         limits: [{{ name: whole_api, key: [consumer], rate: 1000/d }}]\n\
         routes:\n{}{}{}",
        route(
            "api",
            "required",
            &format!("[{per_consumer}, {{ name: per_ip, key: [consumer, client_ip], rate: 50/s }}, {{ use: whole_api }}]")
        ),
        route("other", "required", "[{ use: whole_api }]"),
        route("open", "off", "[{ name: per_ip, key: [client_ip], rate: 5/s }]"),
    );
    Config::from_yaml(Path::new("overrides.yaml"), &yaml).expect("a valid config")
}

fn limit(route: &str, limit: &str, consumer: Option<&str>, quota: Option<u64>) -> Override {
    Override::Limit(QuotaOverride {
        route: route.into(),
        limit: limit.into(),
        consumer: consumer.map(Into::into),
        quota,
        actor: None,
    })
}

fn compile(config: &Config, list: &[Override]) -> CompiledOverrides {
    let identity = (&config.routes, config.consumers.plans());
    CompiledOverrides::compile(list, identity, config.instances, 1)
}

/// The limits (name, advertised quota) `consumer` meets on `route` with `compiled` in force.
fn met(
    config: &Config,
    compiled: &CompiledOverrides,
    route: &str,
    consumer: &Consumer,
) -> Vec<(String, u64)> {
    let route = config.routes.named(route).expect("the route");
    let tier = route.tiers.choose(Some(consumer));
    let shown = |tier: &Tier| {
        let limits = tier.limits.iter();
        limits
            .map(|l| {
                let quota = l.limit.exact.advertised.map_or(0, |(q, _)| q);
                (l.limit.exact.name.to_string(), quota)
            })
            .collect()
    };
    match compiled.tier(route, tier, Some(consumer)) {
        Some(overridden) => shown(&overridden),
        None => shown(route.tiers.get(tier)),
    }
}

fn of(limits: &[(&str, u64)]) -> Vec<(String, u64)> {
    limits.iter().map(|(n, q)| (n.to_string(), *q)).collect()
}

#[test]
fn without_overrides_a_caller_meets_its_configured_tier() {
    let config = config();
    let compiled = compile(&config, &[]);
    assert!(compiled.is_empty());
    let route = config.routes.named("api").expect("api");
    let carol = test_consumer("carol", Some(0));
    assert!(compiled
        .tier(route, route.tiers.choose(Some(&carol)), Some(&carol))
        .is_none());
    let expected = of(&[("per_consumer", 10), ("per_ip", 50), ("whole_api", 1000)]);
    assert_eq!(met(&config, &compiled, "api", &carol), expected);
}

#[test]
fn a_routes_override_sets_the_quota_for_every_caller_whatever_its_plan_or_own_entry() {
    let config = config();
    let compiled = compile(&config, &[limit("api", "per_consumer", None, Some(5))]);
    assert!(!compiled.is_empty());
    let at_five = of(&[("per_consumer", 5), ("per_ip", 50), ("whole_api", 1000)]);
    for caller in [
        test_consumer("carol", Some(0)),
        test_consumer("dave", Some(1)),
        test_consumer("acme", Some(1)),
    ] {
        assert_eq!(
            met(&config, &compiled, "api", &caller),
            at_five,
            "{}",
            caller.id
        );
    }
    // Another route is untouched.
    let carol = test_consumer("carol", Some(0));
    assert_eq!(
        met(&config, &compiled, "other", &carol),
        of(&[("whole_api", 1000)])
    );
}

#[test]
fn a_consumers_own_override_wins_over_the_routes_whichever_is_listed_first() {
    let config = config();
    let everyone = limit("api", "per_consumer", None, Some(5));
    let acmes = limit("api", "per_consumer", Some("acme"), Some(7));
    let expected = |quota| of(&[("per_consumer", quota), ("per_ip", 50), ("whole_api", 1000)]);
    for list in [[everyone.clone(), acmes.clone()], [acmes, everyone]] {
        let compiled = compile(&config, &list);
        let acme = test_consumer("acme", Some(0));
        assert_eq!(met(&config, &compiled, "api", &acme), expected(7));
        let carol = test_consumer("carol", Some(1));
        assert_eq!(met(&config, &compiled, "api", &carol), expected(5));
    }
}

#[test]
fn a_consumers_override_leaves_the_other_consumers_at_their_tiers() {
    let config = config();
    let compiled = compile(&config, &[limit("api", "per_ip", Some("acme"), Some(2))]);
    let acme = test_consumer("acme", Some(0));
    let expected = of(&[("per_consumer", 1000), ("per_ip", 2), ("whole_api", 1000)]);
    assert_eq!(met(&config, &compiled, "api", &acme), expected);
    let pro = test_consumer("dave", Some(1));
    let expected = of(&[("per_consumer", 100), ("per_ip", 50), ("whole_api", 1000)]);
    assert_eq!(met(&config, &compiled, "api", &pro), expected);
}

#[test]
fn an_override_off_lifts_the_limit_and_only_that_one() {
    let config = config();
    let compiled = compile(&config, &[limit("api", "per_ip", None, None)]);
    let carol = test_consumer("carol", Some(0));
    let expected = of(&[("per_consumer", 10), ("whole_api", 1000)]);
    assert_eq!(met(&config, &compiled, "api", &carol), expected);
}

#[test]
fn a_common_limits_override_applies_on_every_route_using_it() {
    let config = config();
    let compiled = compile(&config, &[limit(COMMON, "whole_api", None, Some(3))]);
    let carol = test_consumer("carol", Some(0));
    let api = met(&config, &compiled, "api", &carol);
    assert_eq!(
        api,
        of(&[("per_consumer", 10), ("per_ip", 50), ("whole_api", 3)])
    );
    assert_eq!(
        met(&config, &compiled, "other", &carol),
        of(&[("whole_api", 3)])
    );
    let open = config.routes.named("open").expect("open");
    let tier = open.tiers.choose(None);
    assert!(
        compiled.tier(open, tier, None).is_none(),
        "a route not using it"
    );
}

#[test]
fn overrides_of_routes_or_limits_the_configuration_lacks_change_nothing() {
    let config = config();
    let list = [
        limit("gone", "per_ip", None, Some(1)),
        limit("api", "gone", None, Some(1)),
    ];
    let compiled = compile(&config, &list);
    let carol = test_consumer("carol", Some(0));
    let expected = of(&[("per_consumer", 10), ("per_ip", 50), ("whole_api", 1000)]);
    assert_eq!(met(&config, &compiled, "api", &carol), expected);
}

#[test]
fn an_override_is_checked_against_the_routes_it_names() {
    let config = config();
    let check = |one: Override| match one {
        Override::Limit(one) => one.check(&config.routes).map(|l| l.name.to_string()),
        Override::Plan(_) => unreachable!("a limit override"),
    };
    let fits = check(limit("api", "per_consumer", Some("acme"), Some(5)));
    assert_eq!(fits, Ok("per_consumer".to_string()));
    let common = check(limit(COMMON, "whole_api", Some("acme"), None));
    assert_eq!(common, Ok("whole_api".to_string()));
    assert_eq!(
        check(limit("gone", "per_ip", None, None)),
        Err(Unfit::NoRoute("gone".into()))
    );
    assert_eq!(
        check(limit("api", "gone", None, None)),
        Err(Unfit::NoLimit {
            route: "api".into(),
            limit: "gone".into()
        })
    );
    let long = "c".repeat(MAX_CONSUMER_ID + 1);
    for id in ["", long.as_str()] {
        let one = limit("api", "per_ip", Some(id), None);
        assert_eq!(check(one), Err(Unfit::ConsumerBounds));
    }
    assert_eq!(
        check(limit("open", "per_ip", Some("acme"), None)),
        Err(Unfit::NoConsumers("open".into()))
    );
    assert_eq!(
        check(limit("open", "per_ip", None, Some(1))),
        Ok("per_ip".into())
    );
    assert!(matches!(
        check(limit("api", "per_ip", None, Some(0))),
        Err(Unfit::Quota(_))
    ));
}
