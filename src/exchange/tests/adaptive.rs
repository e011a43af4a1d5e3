//! Adaptive concurrency at the exchange (`hold_place`): a request takes its place among those
//! the upstream holds before any rate limit is asked, at its caller's plan's priority, holds it
//! while its exchange lives, and gives it back at once when the limits refuse it.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::auth::{request, token, SECRET};
use super::{gateway_of, Gateway, ADMITTED};
use crate::config::Config;
use crate::exchange::answer::{Answer, Decided, Unasked};
use crate::exchange::overrides::Read;
use crate::exchange::Admission;
use crate::limiter::clock::Clock;
use crate::route::overrides::{Override, PlanOverride};

/// One route, `/t`, verifying tokens (plans `free`, `pro`), whose upstream holds at most 2
/// requests while the limiter probes (`min_limit: 2`): `free` may use half of them (`reserve:
/// 0.5`), `pro` both; each consumer may make `per_hour` requests an hour.
fn gateway(per_hour: u32) -> Gateway {
    let yaml = format!(
        "listen: [127.0.0.1:1]\n\
         identity: {{ plans: [free, pro], jwt: {{ hmac_secret: {SECRET}, algorithms: [HS256], plan_claim: plan }} }}\n\
         routes:\n  - name: t\n    match: {{ path_prefix: /t }}\n    \
         upstream: {{ servers: [127.0.0.1:1] }}\n    auth: required\n    \
         adaptive_concurrency: {{ min_limit: 2, max_limit: 10, priorities: [free, pro], reserve: 0.5 }}\n    \
         limits: [{{ name: w, key: [consumer], algorithm: fixed_window, rate: {per_hour}/h }}]\n"
    );
    let config = Config::from_yaml(Path::new("adaptive.yaml"), &yaml).expect("a valid config");
    gateway_of(config)
}

/// A request of consumer `sub` on `plan`.
fn of(sub: &str, plan: &str) -> http::request::Parts {
    let signed = token(&json!({ "sub": sub, "plan": plan, "exp": 1_000_000 }));
    request(Some(&signed))
}

const SHED: Admission = Admission::Answered(Answer::Shed);

#[tokio::test]
async fn lower_plans_are_shed_first_before_any_limit_is_asked_and_pro_keeps_the_reserve() {
    let g = gateway(1);
    let (carol, admission) = g.admit_parts(&of("carol", "free")).await;
    assert_eq!(admission, ADMITTED, "free: its share of the probe's 2 is 1");
    let (shed, admission) = g.admit_parts(&of("dan", "free")).await;
    assert_eq!(admission, SHED, "free's share is in flight");
    assert_eq!(shed.decided(), Decided::Unasked(Unasked::Shed));
    let (erin, admission) = g.admit_parts(&of("erin", "pro")).await;
    assert_eq!(admission, ADMITTED, "pro may use the reserve");
    assert_eq!(
        g.admit_parts(&of("frank", "pro")).await.1,
        SHED,
        "the whole limit in flight"
    );
    assert_eq!(g.admit_parts(&of("dan", "free")).await.1, SHED);

    // Carol's request is answered: its place goes back, but erin's alone fills free's share.
    drop(carol);
    assert_eq!(g.admit_parts(&of("dan", "free")).await.1, SHED);
    // Erin's is answered too: dan gets a place, and his sheds cost his quota (1 an hour)
    // nothing.
    drop(erin);
    let (dan, admission) = g.admit_parts(&of("dan", "free")).await;
    assert_eq!(admission, ADMITTED);
    drop(dan);
}

#[tokio::test]
async fn a_request_the_limits_refuse_gives_its_place_back_at_once() {
    let g = gateway(1);
    let (erin, admission) = g.admit_parts(&of("erin", "pro")).await;
    assert_eq!(admission, ADMITTED);
    let (refused, admission) = g.admit_parts(&of("erin", "pro")).await;
    assert_eq!(
        admission,
        Admission::Answered(Answer::Limited { by_fallback: false }),
        "a place was free; her quota was not"
    );
    // Refused but still alive: its place is back, so a second pro request fits beside erin's.
    let (frank, admission) = g.admit_parts(&of("frank", "pro")).await;
    assert_eq!(admission, ADMITTED);
    assert_eq!(g.admit_parts(&of("gina", "pro")).await.1, SHED);
    drop((erin, refused, frank));
}

#[tokio::test]
async fn an_answered_exchange_gives_its_place_back() {
    let g = gateway(100);
    for _ in 0..5 {
        let (exchange, admission) = g.admit_parts(&of("carol", "free")).await;
        assert_eq!(admission, ADMITTED, "each one after the last is answered");
        drop(exchange);
    }
    let (held, _) = g.admit_parts(&of("carol", "free")).await;
    assert_eq!(g.admit_parts(&of("carol", "free")).await.1, SHED);
    drop(held);
}

#[tokio::test]
async fn a_plan_override_decides_the_callers_priority_until_it_expires() {
    let g = gateway(100);
    let one = Override::Plan(PlanOverride {
        consumer: "carol".into(),
        plan: "pro".into(),
        actor: None,
    });
    let until = g.clock.instant() + Duration::from_secs(600);
    g.snapshot
        .overrides
        .list()
        .replace(vec![Read { one, until }]);
    g.snapshot.overrides.refresh(&g.snapshot.config);

    let (dan, admission) = g.admit_parts(&of("dan", "free")).await;
    assert_eq!(admission, ADMITTED, "free's share");
    let (carol, admission) = g.admit_parts(&of("carol", "free")).await;
    assert_eq!(admission, ADMITTED, "her token says free; she is on pro");
    assert_eq!(carol.plan(), Some("pro"));
    drop(carol);

    // Expired: her token's plan again, shed beside dan's request.
    g.snapshot
        .overrides
        .list()
        .expire(until + Duration::from_secs(1));
    g.snapshot.overrides.refresh(&g.snapshot.config);
    let (carol, admission) = g.admit_parts(&of("carol", "free")).await;
    assert_eq!(admission, SHED);
    assert_eq!(carol.plan(), Some("free"));
    drop(dan);
}
