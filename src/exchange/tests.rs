//! The exchange on the in-process limiter with a manual clock: no socket, no server.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request};

use super::{Admission, Exchange, Head};
use crate::answer::{Answer, Decided, Unasked};
use crate::config::Config;
use crate::limiter::clock::ManualClock;
use crate::limiter::local::LocalLimiter;
use crate::limiter::{Engine, Outcome, Policy, PolicyMeters};
use crate::snapshot::Snapshot;

/// A gateway's configuration with one route, `/t`, whose limits are `limits` (YAML flow list).
fn config(limits: &str) -> Config {
    let yaml = format!(
        "listen: [127.0.0.1:1]\n\
         routes:\n  - name: t\n    match: {{ path_prefix: /t }}\n    \
         upstream: {{ servers: [127.0.0.1:1] }}\n    limits: {limits}\n"
    );
    Config::from_yaml(Path::new("test.yaml"), &yaml).expect("a valid config")
}

fn snapshot(limits: &str) -> Arc<Snapshot> {
    Arc::new(Snapshot::build(config(limits)).expect("a snapshot"))
}

struct Gateway {
    snapshot: Arc<Snapshot>,
    policy: Policy,
    clock: Arc<ManualClock>,
}

/// `limits` decided in this process, on a manual clock.
fn gateway(limits: &str) -> Gateway {
    gateway_of(config(limits))
}

fn gateway_of(config: Config) -> Gateway {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let local = Arc::new(LocalLimiter::new(clock.clone(), 1000));
    let meters = PolicyMeters::unregistered();
    Gateway {
        snapshot: Arc::new(Snapshot::build(config).expect("a snapshot")),
        policy: Policy::new(Engine::local(local), None, clock.clone(), meters),
        clock,
    }
}

fn head(path: &str) -> Parts {
    let (parts, ()) = Request::get(path)
        .header("host", "example.com")
        .body(())
        .expect("a request")
        .into_parts();
    parts
}

impl Gateway {
    async fn admit_parts(&self, parts: &Parts) -> (Exchange, Admission) {
        self.admit_from(parts, [192, 0, 2, 1].into()).await
    }

    async fn admit_from(&self, parts: &Parts, peer: std::net::IpAddr) -> (Exchange, Admission) {
        let mut exchange = Exchange::new(Arc::clone(&self.snapshot), Instant::now());
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let head = Head {
            parts,
            raw_target: target.as_bytes(),
            peer: Some(peer),
        };
        let admission = exchange.admit(&self.policy, &head).await;
        (exchange, admission)
    }

    async fn admit(&self, path: &str) -> (Exchange, Admission) {
        self.admit_parts(&head(path)).await
    }
}

const ADMITTED: Admission = Admission::Admitted {
    delay: Duration::ZERO,
};

#[tokio::test]
async fn a_limit_admits_then_answers_429_with_what_it_said() {
    let g = gateway("[{ name: w, key: [route], algorithm: fixed_window, rate: 2/h }]");
    for _ in 0..2 {
        let (mut exchange, admission) = g.admit("/t/a").await;
        assert_eq!(admission, ADMITTED);
        assert_eq!(exchange.decided(), Decided::Limiter(Outcome::Allowed));
        exchange.end(&g.policy, Some(200)).await;
    }
    let (exchange, admission) = g.admit("/t/a").await;
    assert_eq!(
        admission,
        Admission::Answered(Answer::Limited { locally: false })
    );
    assert_eq!(exchange.decided(), Decided::Limiter(Outcome::Limited));
    let (route, decision) = exchange.limits_said().expect("a decision");
    assert_eq!((&*route.name, decision.denied_by), ("t", Some(0)));
    assert_eq!(exchange.deciding_limit(), Some("w"));
    // The window turns: the limit admits again.
    g.clock.advance_by(Duration::from_secs(3600));
    assert_eq!(g.admit("/t/a").await.1, ADMITTED);
}

#[tokio::test]
async fn requests_without_a_route_or_readable_head_are_answered_before_any_limit() {
    let g = gateway("[{ name: w, key: [route], algorithm: fixed_window, rate: 1/h }]");
    let (exchange, admission) = g.admit("/elsewhere").await;
    assert_eq!(admission, Admission::Answered(Answer::NoRoute));
    assert_eq!(exchange.decided(), Decided::Unasked(Unasked::NoRoute));
    assert!(exchange.verdict().is_none());

    let mut bad_host = head("/t");
    bad_host
        .headers
        .insert("host", HeaderValue::from_static("a b"));
    let (exchange, admission) = g.admit_parts(&bad_host).await;
    assert!(matches!(
        admission,
        Admission::Answered(Answer::BadRequest(_))
    ));
    assert_eq!(exchange.decided(), Decided::Unasked(Unasked::BadRequest));
    // Neither consumed the one unit of the limit.
    assert_eq!(g.admit("/t").await.1, ADMITTED);
}

#[tokio::test]
async fn a_shaped_request_whose_client_left_gives_its_units_back() {
    // 10/s, no burst, held up to 500 ms: the second request at once waits 100 ms.
    let g = gateway("[{ name: s, key: [route], algorithm: gcra, rate: 10/s, max_delay: 500ms }]");
    assert_eq!(g.admit("/t").await.1, ADMITTED);
    let (mut held, admission) = g.admit("/t").await;
    let Admission::Admitted { delay } = admission else {
        panic!("shaped, not refused: {admission:?}");
    };
    assert_eq!(delay, Duration::from_millis(100));
    held.abandon(&g.policy).await;
    held.end(&g.policy, None).await;
    // Its slot went back: the next request waits as long as it would have, not longer.
    assert_eq!(
        g.admit("/t").await.1,
        Admission::Admitted {
            delay: Duration::from_millis(100)
        }
    );
}

#[tokio::test]
async fn a_concurrency_slot_goes_back_when_the_request_ends() {
    let g = gateway("[{ name: c, key: [route], algorithm: concurrency, max: 1, lease: 60s }]");
    let (mut first, admission) = g.admit("/t").await;
    assert_eq!(admission, ADMITTED);
    let (_, second) = g.admit("/t").await;
    assert_eq!(
        second,
        Admission::Answered(Answer::Limited { locally: false })
    );
    first.end(&g.policy, Some(200)).await;
    assert_eq!(g.admit("/t").await.1, ADMITTED);
}

#[tokio::test]
async fn a_response_reporting_its_cost_settles_the_estimate() {
    let g = gateway(
        "[{ name: tokens, key: [route], algorithm: fixed_window, rate: 10/h, \
         cost_from_response: { header: x-usage-tokens, estimate: 1 } }]",
    );
    let (mut exchange, admission) = g.admit("/t").await;
    assert_eq!(admission, ADMITTED);
    let mut response = HeaderMap::new();
    response.insert("x-usage-tokens", HeaderValue::from_static("9"));
    exchange.response_head(&response);
    exchange.end(&g.policy, Some(200)).await;
    // 9 of 10 spent: one more request fits, the next does not.
    assert_eq!(g.admit("/t").await.1, ADMITTED);
    let (_, refused) = g.admit("/t").await;
    assert_eq!(
        refused,
        Admission::Answered(Answer::Limited { locally: false })
    );
}

#[tokio::test]
async fn a_body_over_the_routes_maximum_is_answered_413_and_kept_as_the_answer() {
    let g = gateway("[]");
    let limited = snapshot("[]");
    assert!(limited.route(0).is_some());
    let (mut exchange, admission) = g.admit("/t").await;
    assert_eq!(admission, ADMITTED);
    assert_eq!(exchange.body_received(1 << 20), Ok(()), "no max_body_bytes");
    assert_eq!(
        exchange.fail_upstream(None, Answer::UpstreamUnreachable),
        Answer::UpstreamUnreachable
    );
}

#[tokio::test]
async fn a_denied_address_is_refused_and_an_allowed_one_passes_an_exhausted_limit() {
    let mut config = config("[{ name: w, key: [route], algorithm: fixed_window, rate: 1/h }]");
    config.addresses.deny = ["198.51.100.0/24".parse().unwrap()].into_iter().collect();
    config.addresses.allow = ["2001:db8::/32".parse().unwrap()].into_iter().collect();
    let g = gateway_of(config);
    let (denied, admission) = g.admit_from(&head("/t"), [198, 51, 100, 7].into()).await;
    assert_eq!(admission, Admission::Answered(Answer::Forbidden));
    assert_eq!(denied.decided(), Decided::Unasked(Unasked::Forbidden));
    // The one unit goes to an ordinary client; the limit then refuses everyone but the range.
    assert_eq!(g.admit("/t").await.1, ADMITTED);
    assert!(matches!(
        g.admit("/t").await.1,
        Admission::Answered(Answer::Limited { .. })
    ));
    let allowed: std::net::IpAddr = "2001:db8::9".parse().unwrap();
    for _ in 0..3 {
        let (exempt, admission) = g.admit_from(&head("/t"), allowed).await;
        assert_eq!(admission, ADMITTED);
        assert_eq!(exempt.decided(), Decided::Unasked(Unasked::Exempt));
        assert!(
            exempt.limits_said().is_none(),
            "no RateLimit headers: no limit was asked"
        );
    }
}
