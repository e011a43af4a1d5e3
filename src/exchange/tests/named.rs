//! The callers an admin call names: a consumer on a plan, and its limits keyed as its
//! requests would have them.

use std::path::Path;

use super::*;
use crate::caller::consumers::Consumer;
use crate::exchange::named::{self, Unnamed};

/// Plans `free` and `pro`; route `t`'s limits are `limits` (a YAML flow list).
fn site_with_plans(limits: &str) -> Arc<Site<InOrder>> {
    let yaml = format!(
        "listen: [127.0.0.1:1]\n\
         identity: {{ plans: [free, pro], jwt: {{ hmac_secret: 0123456789abcdef0123456789abcdef, algorithms: [HS256], plan_claim: plan }} }}\n\
         routes:\n  - name: t\n    match: {{ path_prefix: /t }}\n    \
         upstream: {{ servers: [127.0.0.1:1] }}\n    auth: required\n    limits: {limits}\n"
    );
    let config = Config::from_yaml(Path::new("named.yaml"), &yaml).expect("a valid config");
    site(config, &Arc::new(ManualClock::default()))
}

const EACH: &str = "[{ name: each, key: [consumer], algorithm: fixed_window, rate: 5/h }]";

#[test]
fn a_named_consumer_is_on_the_plan_named_or_refused_why() {
    let site = site_with_plans(EACH);
    let pro = named::consumer(&site, "acme", Some("pro")).expect("a consumer");
    let plans = site.config.consumers.plans();
    assert_eq!((&*pro.id, pro.plan), ("acme", plans.find("pro")));
    assert_eq!(
        named::consumer(&site, "acme", Some("gold")).err(),
        Some(Unnamed::NoPlan("gold".into()))
    );
    assert_eq!(
        named::consumer(&site, "", None).err(),
        Some(Unnamed::Length)
    );
    let long = "x".repeat(crate::caller::consumers::MAX_CONSUMER_ID + 1);
    assert_eq!(
        named::consumer(&site, &long, None).err(),
        Some(Unnamed::Length)
    );
}

#[test]
fn a_named_consumers_limits_are_keyed_as_its_requests_and_a_header_it_needs_is_not_named() {
    let by_header = site_with_plans(
        "[{ name: tenants, key: [\"header:x-tenant\"], on_missing: deny, algorithm: fixed_window, rate: 5/h }]",
    );
    let route = &by_header.route(0).expect("route t").route;
    let acme = named::consumer(&by_header, "acme", None).expect("a consumer");
    let unnamed = named::met(route.tiers.default(), "t", Some(&acme), None);
    assert!(
        unnamed.is_err(),
        "no header is named: a request without it is refused"
    );

    let site = site_with_plans(EACH);
    let tier = site.route(0).expect("route t").route.tiers.default();
    let other = named::consumer(&site, "other", None).expect("a consumer");
    let key = |consumer: &Consumer| {
        let met = named::met(tier, "t", Some(consumer), None).expect("keyed on the consumer");
        assert_eq!(met.len(), 1, "one record beside its limit");
        assert_eq!(&*met[0].limit.limit.exact.name, "each");
        met[0].record.ask.key.clone()
    };
    assert_eq!(key(&acme), key(&acme), "the same caller, the same key");
    assert_ne!(key(&acme), key(&other), "each consumer its own");
    let records = named::records(tier, "t", Some(&acme), None).expect("records");
    assert_eq!(records[0].ask.key, key(&acme), "records and met agree");
}
