//! The exchange on the in-process limiter with a manual clock: no socket, no server.

mod adaptive;
mod auth;
mod explain;
mod named;
mod rls;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request};

use super::site::{Handover, Lasting, Site};
use super::{Admission, Exchange, Head, Seam};
use crate::config::Config;
use crate::exchange::answer::{Answer, Decided, Unasked, UpstreamError};
use crate::limiter::clock::{Clock, ManualClock};
use crate::limiter::local::LocalLimiter;
use crate::limiter::per_thread::Handle;
use crate::limiter::testing::Unavailable;
use crate::limiter::LimiterError;
use crate::limiter::{Engine, Outcome, Policy, PolicyMeters};
use crate::route::upstream::RetryCause;
use crate::upstream::servers::InOrder;

/// A gateway's configuration with one route, `/t`, whose limits are `limits` (YAML flow list).
fn config(limits: &str) -> Config {
    route_config("t", "upstream: { servers: [127.0.0.1:1] }", limits)
}

/// One route named `name` on `/t`, with the YAML lines `route` (indented by the route's four
/// spaces after the first) and `limits`.
fn route_config(name: &str, route: &str, limits: &str) -> Config {
    let yaml = format!(
        "listen: [127.0.0.1:1]\n\
         routes:\n  - name: {name}\n    match: {{ path_prefix: /t }}\n    \
         {route}\n    limits: {limits}\n"
    );
    Config::from_yaml(Path::new("test.yaml"), &yaml).expect("a valid config")
}

struct Gateway<E = Engine> {
    snapshot: Arc<Site<InOrder>>,
    policy: Policy<E>,
    clock: Arc<ManualClock>,
}

/// `limits` decided in this process, on a manual clock.
fn gateway(limits: &str) -> Gateway {
    gateway_of(config(limits))
}

/// The site of `config`, on `clock`.
fn site(config: Config, clock: &Arc<ManualClock>) -> Arc<Site<InOrder>> {
    let clock = clock.clone();
    let servers = InOrder::of(&config.routes);
    let site = Site::build(config, &servers, &Lasting::new(clock), Handover::default());
    Arc::new(site.expect("a site"))
}

fn gateway_of(config: Config) -> Gateway {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let local = Arc::new(LocalLimiter::new(clock.clone(), 1000));
    let meters = PolicyMeters::unregistered();
    Gateway {
        snapshot: site(config, &clock),
        policy: Policy::new(Engine::local(local), None, clock.clone(), meters),
        clock,
    }
}

/// `config` with a backend that always times out, and the in-process fallback (for
/// `failure_mode: local`) on a manual clock.
fn gateway_down(config: Config) -> Gateway<Unavailable> {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let fallback = Arc::new(LocalLimiter::new(clock.clone(), 1000));
    let meters = PolicyMeters::unregistered();
    let down = Unavailable(|| LimiterError::Timeout(25));
    Gateway {
        snapshot: site(config, &clock),
        policy: Policy::new(down, Some(fallback), clock.clone(), meters),
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

impl<E: Seam> Gateway<E> {
    async fn admit_parts(&self, parts: &Parts) -> (Exchange<InOrder>, Admission) {
        self.admit_from(parts, [192, 0, 2, 1].into()).await
    }

    async fn admit_from(
        &self,
        parts: &Parts,
        peer: std::net::IpAddr,
    ) -> (Exchange<InOrder>, Admission) {
        let mut exchange =
            Exchange::new(Handle::of(Arc::clone(&self.snapshot)), self.clock.instant());
        let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let head = Head {
            parts,
            raw_target: target.as_bytes(),
            peer: Some(peer),
            client_certificate: None,
            cut: Default::default(),
        };
        let admission = exchange.admit(&self.policy, &head).await;
        (exchange, admission)
    }

    async fn admit(&self, path: &str) -> (Exchange<InOrder>, Admission) {
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
        Admission::Answered(Answer::Limited { by_fallback: false })
    );
    assert_eq!(exchange.decided(), Decided::Limiter(Outcome::Limited));
    let said = exchange.limits_said().expect("a decision");
    let denied = said.denied().map(|l| &*l.limit.exact.name);
    assert_eq!((&*said.route.name, denied), ("t", Some("w")));
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
async fn the_host_a_request_names_picks_its_route_case_port_and_trailing_dot_aside() {
    let yaml = "listen: [127.0.0.1:1]\n\
                routes:\n\
                \x20 - { name: api, match: { host: api.example.com, path_prefix: /t }, upstream: { servers: [127.0.0.1:1] } }\n\
                \x20 - { name: rest, match: { path_prefix: /t }, upstream: { servers: [127.0.0.1:1] } }\n";
    let g = gateway_of(Config::from_yaml(Path::new("test.yaml"), yaml).expect("a valid config"));
    let route_of = |target: &str, host: &'static str| {
        let mut parts = head(target);
        parts.headers.insert("host", HeaderValue::from_static(host));
        parts
    };
    for (target, host, route) in [
        ("/t", "API.example.COM.:8080", "api"),
        ("/t", "api.example.com", "api"),
        ("/t", "www.example.com", "rest"),
        // A URI's authority (HTTP/2's `:authority`) names the host, whatever a `Host` says (an
        // HTTP/1.1 absolute target whose `Host` differs, Pingora refuses before sluice).
        ("http://api.example.com/t", "www.example.com", "api"),
        ("http://www.example.com/t", "api.example.com", "rest"),
    ] {
        let (exchange, admission) = g.admit_parts(&route_of(target, host)).await;
        assert_eq!(admission, ADMITTED, "{target} with Host {host}");
        let name = exchange.route().map(|r| r.name.to_string());
        assert_eq!(name.as_deref(), Some(route), "{target} with Host {host}");
    }
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
        Admission::Answered(Answer::Limited { by_fallback: false })
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
    exchange.response_head(200, &response);
    exchange.end(&g.policy, Some(200)).await;
    // 9 of 10 spent: one more request fits, the next does not.
    assert_eq!(g.admit("/t").await.1, ADMITTED);
    let (_, refused) = g.admit("/t").await;
    assert_eq!(
        refused,
        Admission::Answered(Answer::Limited { by_fallback: false })
    );
}

#[tokio::test]
async fn a_body_over_the_routes_maximum_is_answered_413_and_kept_as_the_answer() {
    let route = "upstream: { servers: [127.0.0.1:1] }\n    max_body_bytes: 10";
    let g = gateway_of(route_config("body", route, "[]"));
    let (mut exchange, admission) = g.admit("/t").await;
    assert_eq!(admission, ADMITTED);
    assert_eq!(exchange.body_received(10), Ok(()));
    assert_eq!(exchange.body_received(1), Err(Answer::BodyTooLarge));
    // Whatever Pingora then reports, the client is answered what the exchange decided.
    assert_eq!(
        exchange.fail_upstream(None, Answer::Internal),
        Answer::BodyTooLarge
    );
}

/// The upstream errors counted for the route named `route`, of `kind`.
fn upstream_errors(route: &str, kind: &str) -> u64 {
    crate::observe::metrics::UPSTREAM_ERRORS
        .with_label_values(&[route, kind])
        .get()
}

#[tokio::test]
async fn each_failed_attempt_is_counted_once_and_the_last_one_answers() {
    let route = "upstream: { servers: [127.0.0.1:1, 127.0.0.1:2], retries: 1 }";
    let g = gateway_of(route_config("retried", route, "[]"));
    let (mut exchange, _) = g.admit("/t").await;
    let first = exchange.dial().expect("a server").server;
    let refused = Some(UpstreamError::Refused);
    let connect_failure = Some(RetryCause::ConnectFailure);
    assert!(
        exchange.try_failed(Some(first), refused, connect_failure, true, false),
        "another server is tried"
    );
    assert_eq!(upstream_errors("retried", "refused"), 1);
    let second = exchange.dial().expect("the other server").server;
    assert_ne!(first, second, "a server that refused is not tried again");
    assert!(
        !exchange.try_failed(Some(second), refused, connect_failure, true, false),
        "no retry left"
    );
    assert_eq!(
        upstream_errors("retried", "refused"),
        1,
        "the last failure is counted once, where the request fails"
    );
    let answer = exchange.fail_upstream(refused, Answer::UpstreamUnreachable);
    assert_eq!(answer, Answer::UpstreamUnreachable);
    assert_eq!(upstream_errors("retried", "refused"), 2);
    assert_eq!(exchange.upstream_summary().2, refused);
}

#[tokio::test]
async fn an_answer_is_retried_only_when_named_replayable_and_not_told_to_wait() {
    let route = "upstream: { servers: [127.0.0.1:1, 127.0.0.1:2, 127.0.0.1:3], retries: 2, \
                 retry_on: [http_503, reset] }";
    let g = gateway_of(route_config("answers", route, "[]"));
    let (mut exchange, _) = g.admit("/t").await;
    let first = exchange.dial().expect("a server").server;
    assert!(!exchange.try_answered(502, false, true), "502 is not named");
    assert!(!exchange.try_answered(503, false, false), "not replayable");
    assert!(
        !exchange.try_answered(503, true, true),
        "Retry-After: passed on"
    );
    assert!(exchange.try_answered(503, false, true));
    let second = exchange.dial().expect("another server").server;
    assert_ne!(first, second);
    let reset = Some(UpstreamError::Reset);
    let timeout = Some(RetryCause::Timeout);
    assert!(
        !exchange.try_failed(Some(second), reset, timeout, true, false),
        "a timeout is not named"
    );
    let cause = Some(RetryCause::Reset);
    assert!(!exchange.try_failed(Some(second), reset, cause, false, false));
    assert!(exchange.try_failed(Some(second), reset, cause, true, false));
    let third = exchange.dial().expect("the last server").server;
    assert!(third != first && third != second);
    assert!(!exchange.try_answered(503, false, true), "no try left");
    let retried =
        crate::observe::metrics::UPSTREAM_RETRIES.with_label_values(&["answers", "retried"]);
    assert_eq!(retried.get(), 2);
}

#[tokio::test]
async fn every_upstream_wait_ends_by_the_routes_deadline() {
    let route = "upstream: { servers: [127.0.0.1:1], connect_timeout_ms: 5000 }\n    request_timeout_ms: 1000";
    let g = gateway_of(route_config("deadline", route, "[]"));
    let (mut exchange, _) = g.admit("/t").await;
    let dial = exchange.dial().expect("a server");
    assert!(
        dial.connect_timeout <= Duration::from_secs(1),
        "{:?}",
        dial.connect_timeout
    );
    assert!(dial
        .write_timeout
        .is_some_and(|t| t <= Duration::from_secs(1)));

    let route = "upstream: { servers: [127.0.0.1:1] }\n    request_timeout_ms: 1";
    let g = gateway_of(route_config("late", route, "[]"));
    let (mut exchange, _) = g.admit("/t").await;
    g.clock.advance_by(Duration::from_millis(5));
    assert_eq!(exchange.dial().err(), Some(Answer::UpstreamTimedOut));
    assert_eq!(exchange.answered(), Some(Answer::UpstreamTimedOut));
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

#[tokio::test]
async fn when_the_limiter_cannot_decide_the_routes_failure_mode_does() {
    let limits = "[{ name: w, key: [route], algorithm: fixed_window, rate: 2/h }]";
    let upstream = "upstream: { servers: [127.0.0.1:1] }";
    for (mode, first, outcome) in [
        ("allow", ADMITTED, Outcome::ErrorAllowed),
        (
            "deny",
            Admission::Answered(Answer::LimiterUnavailable),
            Outcome::ErrorDenied,
        ),
        ("local", ADMITTED, Outcome::FallbackAllowed),
    ] {
        let route = format!("{upstream}\n    failure_mode: {mode}");
        let g = gateway_down(route_config(&format!("down_{mode}"), &route, limits));
        let (exchange, admission) = g.admit("/t").await;
        assert_eq!(admission, first, "failure_mode {mode}");
        assert_eq!(exchange.decided(), Decided::Limiter(outcome), "{mode}");
        assert_eq!(exchange.failure_mode(), Some(mode), "{mode}");
    }
    // `local`: this gateway's share (the whole limit, one instance) is enforced in-process.
    let route = format!("{upstream}\n    failure_mode: local");
    let g = gateway_down(route_config("down_local_share", &route, limits));
    assert_eq!(g.admit("/t").await.1, ADMITTED);
    assert_eq!(g.admit("/t").await.1, ADMITTED);
    let (refused, admission) = g.admit("/t").await;
    assert_eq!(
        admission,
        Admission::Answered(Answer::Limited { by_fallback: true })
    );
    assert_eq!(
        refused.decided(),
        Decided::Limiter(Outcome::FallbackLimited)
    );
    g.clock.advance_by(Duration::from_secs(3600));
    assert_eq!(
        g.admit("/t").await.1,
        ADMITTED,
        "the local window turns too"
    );
}
