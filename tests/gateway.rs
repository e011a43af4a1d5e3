//! End to end: the real `sluice` binary in front of the real demo upstream, limits in a real
//! redis-server (or in-process), driven over loopback.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use redis::Commands;
use support::config::{route, Config, Route};
use support::limits::{calendar, concurrency, fixed_window, gcra};
use support::{http_get, metric, Gateway, Launch, RedisServer, Upstream};

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Limits in the test Redis (50 ms deadline), with this failure mode.
fn with_redis(failure_mode: &str) -> Config {
    Config::new()
        .redis("REDIS_URL")
        .redis_key("timeout_ms", 50)
        .failure_mode(failure_mode)
}

/// `/api/`: 5 per 10 s per client and path, in a burst of 5.
fn burst_route() -> Route {
    route("api").prefix("/api/").limit(
        gcra("per_client", "5/10s")
            .key(&["client_ip", "path"])
            .burst(4),
    )
}

fn burst(failure_mode: &str) -> String {
    with_redis(failure_mode).route(burst_route()).yaml()
}

#[test]
fn a_burst_admits_exactly_the_limit_then_429s_with_headers_then_passes_again() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("allow"), &upstream, Some(&redis));

    let responses: Vec<_> = (0..10).map(|_| gateway.get("/api/items")).collect();
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429, 429]);
    assert_eq!(upstream.served(), 5);

    let first = &responses[0];
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"per_client\";q=5;w=10")
    );
    let state = first.header("ratelimit").unwrap();
    assert!(state.starts_with("\"per_client\";r=4;t=2;pk=:"), "{state}");
    let denied = &responses[5];
    assert_eq!(denied.header("retry-after"), Some("2"));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"per_client\";q=5;w=10")
    );
    let state = denied.header("ratelimit").unwrap();
    assert!(state.starts_with("\"per_client\";r=0;t=10;pk=:"), "{state}");
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    let id = denied
        .header("x-request-id")
        .map_or(String::new(), |id| format!(",\"request_id\":\"{id}\""));
    assert_eq!(
        denied.body,
        format!(
            "{{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\"title\":\"Request cannot be satisfied as assigned quota has been exceeded\",\"status\":429,\"detail\":\"Rate limit 'per_client' of route 'api' exceeded.\",\"violated-policies\":[\"per_client\"],\"limit\":\"per_client\",\"retry_after_seconds\":2{id}}}\n"
        )
    );

    // One emission interval (2 s) later, exactly one more request passes. Deliberate: the
    // limit refills with time; only a stall of another 1.9 s would let a second one through.
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(gateway.get("/api/items").status, 200);
    assert_eq!(gateway.get("/api/items").status, 429);

    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", "allowed")]
        ),
        6.0
    );
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", "limited")]
        ),
        6.0
    );
    assert_eq!(
        metric(
            &metrics,
            "sluice_upstream_responses_total",
            &[("route", "api"), ("status_class", "2xx")]
        ),
        6.0
    );
    assert_eq!(
        metric(
            &metrics,
            "sluice_limiter_duration_seconds_count",
            &[("backend", "redis")]
        ),
        8.0,
        "7 decisions and the first denial of the burst went to Redis"
    );
    assert_eq!(
        metric(
            &metrics,
            "sluice_limiter_duration_seconds_count",
            &[("backend", "deny_cache")]
        ),
        4.0,
        "the burst's other denials were answered by the deny cache"
    );
}

#[test]
fn clients_and_paths_have_independent_buckets() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = with_redis("allow").route(
        route("api")
            .prefix("/api/")
            .limit(gcra("per_client_path", "1/m").key(&["client_ip", "path"])),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    for source in ["127.0.0.2", "127.0.0.3"] {
        assert_eq!(
            gateway.get_from(source, "/api/a").status,
            200,
            "first request of {source}"
        );
        assert_eq!(
            gateway.get_from(source, "/api/a").status,
            429,
            "second request of {source}"
        );
    }
    assert_eq!(
        gateway.get_from("127.0.0.2", "/api/b").status,
        200,
        "another path, another bucket"
    );
    assert_eq!(gateway.get_from("127.0.0.2", "/api/b").status, 429);
    let keys: Vec<String> = redis.connection().keys("t:*").unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
}

#[test]
fn a_denying_limit_leaves_the_other_limits_unconsumed() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = with_redis("allow").route(
        route("api")
            .limit(gcra("generous", "10/m").key(&["client_ip"]).burst(9))
            .limit(fixed_window("strict", "1/m").key(&["client_ip"])),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    let allowed = gateway.get("/x");
    assert_eq!(allowed.status, 200);
    assert_eq!(
        without_partitions(allowed.header("ratelimit").unwrap()),
        "\"generous\";r=9;t=6, \"strict\";r=0;t=60"
    );
    let generous_key: String = redis
        .connection()
        .keys::<_, Vec<String>>("t:*:generous.*")
        .unwrap()
        .remove(0);
    let tat: String = redis.connection().get(&generous_key).unwrap();
    for _ in 0..3 {
        let denied = gateway.get("/x");
        assert_eq!(denied.status, 429);
        assert!(
            denied
                .header("ratelimit")
                .unwrap()
                .starts_with("\"generous\";r=9;"),
            "{:?}",
            denied.header("ratelimit")
        );
        assert!(denied.body.contains("\"limit\":\"strict\""));
    }
    assert_eq!(
        redis.connection().get::<_, String>(&generous_key).unwrap(),
        tat,
        "generous was not consumed"
    );
    assert_eq!(upstream.served(), 1);
}

/// What a `429` says as JSON.
fn problem(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn a_hidden_limit_enforces_unseen_and_a_429_lists_the_shown_limits_it_violated() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let hidden = |rate: &str| fixed_window("guard", rate).set("headers", "hide");
    let config = with_redis("deny")
        .route(
            route("guarded")
                .prefix("/g/")
                .limit(fixed_window("quota", "5/h"))
                .limit(hidden("2/h")),
        )
        .route(
            route("both")
                .prefix("/b/")
                .limit(fixed_window("quota", "1/h"))
                .limit(hidden("1/m")),
        )
        .route(
            route("longer")
                .prefix("/l/")
                .limit(fixed_window("quota", "1/m"))
                .limit(hidden("1/h")),
        );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));

    // Only the shown quota is advertised; the hidden guard still counts.
    let first = gateway.get("/g/x");
    assert_eq!(first.status, 200);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"quota\";q=5;w=3600")
    );
    assert!(first
        .header("ratelimit")
        .unwrap()
        .starts_with("\"quota\";r=4;"));
    assert_eq!(gateway.get("/g/x").status, 200);
    // The guard denies: a 429 that names no limit and lists no violated policy, with the
    // shown quota's state and a Retry-After.
    let guarded = gateway.get("/g/x");
    assert_eq!(guarded.status, 429);
    assert!(guarded.header("retry-after").is_some());
    assert!(guarded
        .header("ratelimit")
        .unwrap()
        .starts_with("\"quota\";r=3;"));
    let body = problem(&guarded.body);
    assert_eq!(body["type"], QUOTA_EXCEEDED);
    assert_eq!(body["violated-policies"], serde_json::json!([]), "{body}");
    assert_eq!(body["detail"], "Rate limit of route 'guarded' exceeded.");
    assert!(body.get("limit").is_none(), "{body}");
    assert!(!guarded.body.contains("guard\""), "{}", guarded.body);

    // Both deny: only the shown one is named (it waits longest, and decides).
    assert_eq!(gateway.get("/b/x").status, 200);
    let both = gateway.get("/b/x");
    assert_eq!(both.status, 429);
    let body = problem(&both.body);
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["quota"]),
        "{body}"
    );
    assert_eq!(body["limit"], "quota");
    assert_eq!(
        both.header("ratelimit-policy"),
        Some("\"quota\";q=1;w=3600")
    );

    // Both deny and the hidden one waits longest: it decides, unnamed; the shown one is listed.
    assert_eq!(gateway.get("/l/x").status, 200);
    let longer = gateway.get("/l/x");
    let body = problem(&longer.body);
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["quota"]),
        "{body}"
    );
    assert!(body.get("limit").is_none(), "{body}");
    assert_eq!(body["detail"], "Rate limit of route 'longer' exceeded.");
}

/// A `RateLimit` value without its items' partition keys (`;pk=:...:`).
fn without_partitions(value: &str) -> String {
    value
        .split(", ")
        .map(|item| item.split(";pk=").next().unwrap_or(item))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `RateLimit` item of `limit` in `value`.
fn item<'a>(value: &'a str, limit: &str) -> &'a str {
    let name = format!("\"{limit}\";");
    value
        .split(", ")
        .find(|item| item.starts_with(&name))
        .unwrap_or_else(|| panic!("no {limit} in {value}"))
}

#[test]
fn a_per_client_limit_names_its_bucket_and_a_per_route_limit_does_not() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = with_redis("deny").route(
        route("api")
            .limit(fixed_window("per_client", "100/h"))
            .limit(fixed_window("per_route", "1000/h").key(&["route"]))
            .limit(
                fixed_window("per_route_split", "1000/h")
                    .key(&["route"])
                    .set("split", 2),
            ),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    let ratelimit = |source: &str| {
        let response = gateway.get_from(source, "/x");
        assert_eq!(response.status, 200);
        response.header("ratelimit").unwrap().to_string()
    };
    let partition = |value: &str| {
        let item = item(value, "per_client");
        let (_, pk) = item.split_once(";pk=").unwrap_or_else(|| panic!("{item}"));
        pk.to_string()
    };
    let first = ratelimit("127.0.0.1");
    let pk = partition(&first);
    // A structured-field byte sequence of 9 bytes: `:` twelve base64 characters `:`.
    assert_eq!(pk.len(), 14, "{pk}");
    assert!(pk.starts_with(':') && pk.ends_with(':'), "{pk}");
    assert!(pk[1..13]
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/'));
    assert!(!item(&first, "per_route").contains("pk="), "{first}");
    let split = item(&first, "per_route_split");
    assert!(
        !split.contains("pk="),
        "a split limit is one bucket too: {first}"
    );
    assert_eq!(partition(&ratelimit("127.0.0.1")), pk, "the same bucket");
    assert_ne!(partition(&ratelimit("127.0.0.2")), pk, "another client's");
    let keys: Vec<String> = redis.connection().keys("*").unwrap();
    let text = &pk[1..13];
    assert!(
        keys.iter().all(|key| !key.contains(text)),
        "not the stored key: {keys:?}"
    );
}

#[test]
fn unmatched_requests_get_404_and_never_touch_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("allow"), &upstream, Some(&redis));
    let response = gateway.get("/elsewhere");
    assert_eq!(response.status, 404);
    assert!(response.body.contains("No route"));
    assert_eq!(redis.decision_calls(), 0);
    assert_eq!(upstream.served(), 0);
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "_unmatched"), ("decision", "no_route")]
        ),
        1.0
    );
}

#[test]
fn redis_down_with_failure_mode_allow_serves_and_counts_errors() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("allow"), &upstream, Some(&redis));
    assert_eq!(gateway.get("/api/a").status, 200);
    redis.stop();
    for _ in 0..5 {
        assert_eq!(gateway.get("/api/a").status, 200);
    }
    assert_eq!(upstream.served(), 6);
    let metrics = gateway.metrics();
    assert_eq!(metric(&metrics, "sluice_limiter_errors_total", &[]), 5.0);
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", "error_allowed")]
        ),
        5.0
    );
    let ready = support::http_get(gateway.admin, "/readyz", None, &[]);
    assert!(ready.body.starts_with("degraded"), "{}", ready.body);

    // Redis comes back on the same port: limiting engages again without a restart.
    let _redis = RedisServer::start_on(redis.port);
    let mut recovered = false;
    for _ in 0..100 {
        gateway.get("/api/recovery");
        let metrics = gateway.metrics();
        if metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", "allowed")],
        ) > 1.0
        {
            recovered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(recovered, "limiting did not resume after Redis returned");
}

/// `/readyz` follows the failure mode in force: reloaded to `deny` while Redis is down, the
/// gateway is unready (and answers 503); reloaded back to `allow`, it is degraded but ready
/// (and serves). Neither answer is the start-time configuration's.
#[test]
fn readiness_follows_the_failure_mode_of_each_reload_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("allow"), &upstream, Some(&redis));
    gateway.wait_ready();
    redis.stop();
    let readyz = || support::http_get(gateway.admin, "/readyz", None, &[]);
    for (mode, status, said, answered) in [
        ("deny", 503, "not ready", 503),
        ("allow", 200, "degraded", 200),
        ("deny", 503, "not ready", 503),
    ] {
        assert!(
            gateway.reload(&burst(mode)),
            "the reload to {mode} is accepted"
        );
        let ready = readyz();
        assert_eq!(ready.status, status, "failure_mode {mode}: {}", ready.body);
        assert!(
            ready.body.starts_with(said) && ready.body.contains(&format!("failure_mode {mode}")),
            "failure_mode {mode}: {}",
            ready.body
        );
        assert_eq!(
            gateway.get("/api/a").status,
            answered,
            "failure_mode {mode}"
        );
    }
}

#[test]
fn redis_down_with_failure_mode_deny_answers_503_and_the_upstream_sees_nothing() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("deny"), &upstream, Some(&redis));
    let ready = support::http_get(gateway.admin, "/readyz", None, &[]);
    assert_eq!(
        (ready.status, ready.body.as_str()),
        (200, "ready: redis limiter\n")
    );
    redis.stop();
    // The failure mode refuses traffic: a load balancer should send it elsewhere.
    let ready = support::http_get(gateway.admin, "/readyz", None, &[]);
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(
        ready
            .body
            .starts_with("not ready: redis limiter unavailable"),
        "{}",
        ready.body
    );
    for _ in 0..3 {
        let response = gateway.get("/api/a");
        assert_eq!(response.status, 503);
        assert_eq!(response.header("retry-after"), Some("1"));
    }
    assert_eq!(upstream.served(), 0);
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", "error_denied")]
        ),
        3.0
    );
    assert_eq!(
        metric(
            &metrics,
            "sluice_limiter_errors_total",
            &[("kind", "connection")]
        ),
        3.0
    );
}

#[test]
fn a_redis_that_never_answers_trips_the_deadline_not_the_request() {
    // A listener that accepts and never replies: what a paused or blackholed Redis looks like.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/0", silent.local_addr().unwrap());
    let upstream = Upstream::start();
    let config = with_redis("allow")
        .redis_key("url", url)
        .route(burst_route());
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    for _ in 0..3 {
        assert_eq!(gateway.get("/api/a").status, 200);
    }
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_limiter_errors_total",
            &[("kind", "timeout")]
        ),
        3.0
    );
    drop(silent);
}

#[test]
fn without_redis_the_in_process_limiter_enforces_the_same_limits() {
    let upstream = Upstream::start();
    let gateway = Gateway::start(&Config::new().route(burst_route()).yaml(), &upstream, None);
    let statuses: Vec<u16> = (0..7).map(|_| gateway.get("/api/items").status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(gateway.get_from("127.0.0.9", "/api/items").status, 200);
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_limiter_duration_seconds_count",
            &[("backend", "local")]
        ),
        8.0
    );
    let ready = support::http_get(gateway.admin, "/readyz", None, &[]);
    assert_eq!(ready.body, "ready: local limiter\n");
}

#[test]
fn routes_can_turn_rate_limit_headers_off() {
    let upstream = Upstream::start();
    let config = Config::new().route(burst_route().set("rate_limit_headers", false));
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    let ok = gateway.get("/api/x");
    assert_eq!(ok.status, 200);
    assert_eq!(ok.header("ratelimit"), None);
    for _ in 0..5 {
        gateway.get("/api/x");
    }
    let denied = gateway.get("/api/x");
    assert_eq!(denied.status, 429);
    assert_eq!(
        (
            denied.header("ratelimit"),
            denied.header("ratelimit-policy")
        ),
        (None, None)
    );
    assert_eq!(denied.header("retry-after"), Some("2"));
}

#[test]
fn metrics_endpoint_is_prometheus_text_with_every_family() {
    let upstream = Upstream::start();
    let gateway = Gateway::start(&Config::new().route(burst_route()).yaml(), &upstream, None);
    gateway.get("/api/x");
    let text = gateway.metrics();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("valid Prometheus text");
    for family in [
        "sluice_requests_total",
        "sluice_limiter_duration_seconds_count",
        "sluice_upstream_responses_total",
    ] {
        assert!(
            scrape.samples.iter().any(|s| s.metric == family),
            "{family} missing"
        );
    }
    assert!(text.contains("# TYPE sluice_limiter_errors_total counter"));
    assert_eq!(
        metric(
            &text,
            "sluice_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    for family in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(text.contains(&format!("\n{family} ")), "{family} missing");
    }
    assert!(metric(&text, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(
        !text.contains("127.0.0.1\"") && !text.contains("/api/x"),
        "no client address or raw path in labels"
    );
    assert_eq!(
        support::http_get(gateway.admin, "/healthz", None, &[]).body,
        "ok\n"
    );
}

#[test]
fn a_flood_from_a_denied_client_is_answered_by_the_deny_cache() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("allow"), &upstream, Some(&redis));
    let statuses: Vec<u16> = (0..200).map(|_| gateway.get("/api/flood").status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5);
    let calls = redis.decision_calls();
    assert!(
        (1..=7).contains(&calls),
        "200 requests, 5 admitted: {calls} decision calls (the rest from the deny cache)"
    );
    let metrics = gateway.metrics();
    assert!(metric(&metrics, "sluice_deny_cache_hits_total", &[]) >= 190.0);
    // Answers from the deny cache are timed apart from Redis calls: Redis's latency reads true.
    let timed = |backend| {
        metric(
            &metrics,
            "sluice_limiter_duration_seconds_count",
            &[("backend", backend)],
        )
    };
    assert!(timed("deny_cache") >= 190.0, "{}", timed("deny_cache"));
    assert!(timed("redis") <= 7.0, "{}", timed("redis"));
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", "limited")]
        ),
        195.0
    );
}

#[test]
fn a_deny_cache_answer_counts_only_the_denying_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    // Exact: a leased global would be paid from units held, not judged by Redis on each call.
    let global = fixed_window("global", "1000/60s")
        .key(&["route"])
        .set("mode", "exact");
    let body = with_redis("allow")
        .route(burst_route().limit(global))
        .yaml();
    let gateway = Gateway::start(&body, &upstream, Some(&redis));
    let statuses: Vec<u16> = (0..20).map(|_| gateway.get("/api/x").status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5);
    let metrics = gateway.metrics();
    let hits = metric(&metrics, "sluice_deny_cache_hits_total", &[]);
    assert!(hits >= 1.0, "the deny cache answered");
    let count = |limit, decision| {
        metric(
            &metrics,
            "sluice_limit_decisions_total",
            &[("route", "api"), ("limit", limit), ("decision", decision)],
        )
    };
    assert_eq!(
        (
            count("per_client", "allowed"),
            count("per_client", "limited")
        ),
        (5.0, 15.0)
    );
    // Redis judged `global` on every call (it allowed each); the deny cache never asked it.
    assert_eq!(
        (count("global", "allowed"), count("global", "limited")),
        (20.0 - hits, 0.0)
    );
}

#[test]
fn the_breaker_opens_while_redis_is_down_and_closes_when_it_returns() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("allow"), &upstream, Some(&redis));
    assert_eq!(gateway.get("/api/a").status, 200);
    redis.stop();
    for _ in 0..10 {
        assert_eq!(gateway.get("/api/a").status, 200);
    }
    let metrics = gateway.metrics();
    assert_eq!(
        metric(&metrics, "sluice_redis_breaker_state", &[]),
        1.0,
        "open"
    );
    assert!(
        metric(
            &metrics,
            "sluice_limiter_errors_total",
            &[("kind", "breaker_open")]
        ) > 0.0
    );
    let _redis = RedisServer::start_on(redis.port);
    let mut closed = false;
    for _ in 0..50 {
        gateway.get("/api/b");
        if metric(&gateway.metrics(), "sluice_redis_breaker_state", &[]) == 0.0 {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed, "the breaker closed once Redis answered again");
}

#[test]
fn releases_during_an_outage_are_refused_by_the_open_breaker_not_timed_out() {
    const HELD: usize = 8;
    let redis = RedisServer::start();
    let (gate, open_gate) = gated_upstream(HELD);
    let upstream = Upstream::start();
    let body = with_redis("allow")
        .route(
            route("api")
                .prefix("/api/")
                .servers(&[gate])
                .limit(concurrency("inflight", 100).key(&["route"])),
        )
        .yaml();
    let gateway = Gateway::start(&body, &upstream, Some(&redis));
    let proxy = gateway.proxy;
    // Admitted by Redis, each holding a slot until the gate opens and its response ends: the
    // releases come after Redis stops and the breaker opens, however slow the machine.
    let held: Vec<_> = (0..HELD)
        .map(|_| std::thread::spawn(move || http_get(proxy, "/api/held", None, &[]).status))
        .collect();
    poll("every held request at the upstream", || {
        open_gate.waiting() == HELD
    });
    redis.signal("STOP");
    poll("the breaker open", || {
        gateway.get("/api/open");
        metric(&gateway.metrics(), "sluice_redis_breaker_state", &[]) == 1.0
    });
    let before = gateway.metrics();
    open_gate.open();
    for request in held {
        assert_eq!(request.join().unwrap(), 200);
    }
    // Each release is counted as an error of some kind; wait until all of them are.
    let since = |metrics: &str, kind: &[(&str, &str)]| {
        metric(metrics, "sluice_limiter_errors_total", kind)
            - metric(&before, "sluice_limiter_errors_total", kind)
    };
    poll("every release counted", || {
        since(&gateway.metrics(), &[]) >= HELD as f64
    });
    let now = gateway.metrics();
    let refused = since(&now, &[("kind", "breaker_open")]);
    let timed_out = since(&now, &[("kind", "timeout")]);
    redis.signal("CONT");
    // At most a probe or two (one per breaker interval) reaches the stopped Redis and fails.
    assert!(
        refused >= (HELD - 2) as f64,
        "{refused} releases refused by the open breaker, {timed_out} timed out, {} failed",
        since(&now, &[])
    );
}

/// What holds a [`gated_upstream`]'s requests: counts them, and lets them all answer at once.
struct Gate {
    arrived: Arc<AtomicUsize>,
    barrier: Arc<Barrier>,
}

impl Gate {
    /// Requests held at the gate so far.
    fn waiting(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Answers every held request (blocks until `held` of them have arrived).
    fn open(self) {
        self.barrier.wait();
    }
}

/// An upstream on a free loopback port that answers `200` at once, except requests for a path
/// holding `/held`, which wait at the [`Gate`] until the test opens it (at most `held` of them).
fn gated_upstream(held: usize) -> (std::net::SocketAddr, Gate) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the gated upstream");
    let addr = listener.local_addr().expect("the gated upstream's address");
    let gate = Gate {
        arrived: Arc::new(AtomicUsize::new(0)),
        barrier: Arc::new(Barrier::new(held + 1)),
    };
    let (arrived, barrier) = (Arc::clone(&gate.arrived), Arc::clone(&gate.barrier));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (arrived, barrier) = (Arc::clone(&arrived), Arc::clone(&barrier));
            std::thread::spawn(move || answer_at_the_gate(stream, &arrived, &barrier));
        }
    });
    (addr, gate)
}

/// Reads one request head from `stream`, waits at `barrier` if its path holds `/held`, answers
/// `200` and closes.
fn answer_at_the_gate(stream: std::net::TcpStream, arrived: &AtomicUsize, barrier: &Barrier) {
    let mut reader = BufReader::new(&stream);
    let mut request_line = String::new();
    let _ = reader.read_line(&mut request_line);
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        line.clear();
    }
    if request_line.contains("/held") {
        arrived.fetch_add(1, Ordering::SeqCst);
        barrier.wait();
    }
    let _ =
        (&stream).write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
}

/// Polls `done` every 20 ms for up to 10 s.
fn poll(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_reloads_a_valid_config_and_keeps_the_old_one_on_errors() {
    let upstream = Upstream::start();
    let api = |rate: &str, burst: u64| {
        route("api")
            .prefix("/api/")
            .limit(gcra("tight", rate).key(&["route"]).burst(burst))
    };
    let strict = Config::new().route(api("1/h", 0));
    let gateway = Gateway::start(&strict.yaml(), &upstream, None);
    assert_eq!(gateway.get("/api/x").status, 200);
    assert_eq!(gateway.get("/api/x").status, 429);

    // An invalid file: every problem logged, the old routes keep serving.
    assert!(!gateway.reload(&Config::new().route(api("1/fortnight", 0)).yaml()));
    assert_eq!(gateway.get("/api/x").status, 429, "still the old limit");
    assert_eq!(gateway.get("/other").status, 404);
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_config_reloads_total",
            &[("result", "error")]
        ),
        1.0
    );

    // A valid one takes effect: a new route, and the limit lifted.
    let relaxed = Config::new()
        .route(route("other").prefix("/other"))
        .route(api("100/s", 99));
    assert!(gateway.reload(&relaxed.yaml()));
    assert_eq!(gateway.get("/api/x").status, 200, "the new limit");
    assert_eq!(gateway.get("/other").status, 200, "the new route");
    // A reload that removes a route stops exporting its series.
    assert!(gateway.metrics().contains("route=\"other\""));
    assert!(gateway.reload(&Config::new().route(api("100/s", 99)).yaml()));
    assert!(
        !gateway.metrics().contains("route=\"other\""),
        "the removed route's series are gone"
    );
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_config_reloads_total",
            &[("result", "success")]
        ),
        2.0
    );
}

const ADMIN_TOKEN: &str = "gateway-admin-token-0123456789";

/// A monthly quota (10 a month, exact) in Redis under `key_prefix`, with the admin token set.
fn monthly_under(key_prefix: &str) -> Config {
    Config::new()
        .redis("REDIS_URL")
        .redis_key("key_prefix", key_prefix)
        .set("admin", format!("{{ token: {ADMIN_TOKEN} }}"))
        .route(
            route("api").prefix("/api/").limit(
                calendar("monthly", "10/month", "UTC")
                    .key(&["route"])
                    .set("mode", "exact"),
            ),
        )
}

/// What the monthly quota has left after one more request (its `RateLimit` header's `r`).
fn left_after_one(gateway: &Gateway) -> u64 {
    let response = gateway.get("/api/x");
    assert_eq!(response.status, 200);
    let ratelimit = response.header("ratelimit").expect("a RateLimit header");
    let left = ratelimit
        .strip_prefix("\"monthly\";r=")
        .and_then(|rest| rest.split(';').next()?.parse().ok());
    left.unwrap_or_else(|| panic!("RateLimit: {ratelimit}"))
}

/// Every key in `redis` that starts with `prefix:` or `{prefix:` (a count, a credit id, the
/// admin tables).
fn keys_under(redis: &RedisServer, prefix: &str) -> usize {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.connection())
        .expect("KEYS");
    let (plain, tagged) = (format!("{prefix}:"), format!("{{{prefix}:"));
    keys.iter()
        .filter(|key| key.starts_with(plain.as_bytes()) || key.starts_with(tagged.as_bytes()))
        .count()
}

/// Issue 50: a reload that changes `redis.key_prefix` keeps the prefix in force until a
/// graceful upgrade, as the log says: the monthly count goes on where it was, nothing is
/// written under the new prefix, the log says what the new prefix will do when it takes
/// effect, `/readyz` lists it as pending (with a changed `server:`), and the dashboard shows the
/// prefix in force and what waits. A reload back to the running prefix clears them; one that
/// sets `key_secret` applies it, and the log says that every count starts anew.
#[test]
fn a_reload_that_changes_the_key_prefix_keeps_the_one_in_force_and_every_count() {
    // Run as docs/deploy.md says for quotas: /readyz then says nothing of their durability.
    let redis = RedisServer::start_with_args(&["--appendonly", "yes"]);
    let upstream = Upstream::start();
    let launch = Launch {
        capture_log: true,
        log_level: Some("info"),
        ..Launch::default()
    };
    let gateway = Gateway::launch(&monthly_under("t").yaml(), &upstream, Some(&redis), &launch);
    gateway.wait_ready();
    assert!(
        gateway.log().contains(
            "redis: key prefix t: every counter, credit id and quota override is kept under it"
        ),
        "the start says the prefix in force: {}",
        gateway.log()
    );
    let spent: Vec<u64> = (0..3).map(|_| left_after_one(&gateway)).collect();
    assert_eq!(spent, [9, 8, 7]);

    let moved = monthly_under("t2").server("work_stealing", false);
    assert!(gateway.reload(&moved.yaml()), "the reload is taken");
    assert_eq!(left_after_one(&gateway), 6, "the count goes on under t");
    assert_eq!(
        keys_under(&redis, "t2"),
        0,
        "nothing under the file's new prefix"
    );
    assert!(keys_under(&redis, "t") > 0, "the count is under t");
    let said = "reload: `redis.key_prefix` changed in the file (t → t2); the running value stays until a graceful upgrade (sluice -u); when it takes effect every counter (monthly quotas included), credit id and override starts anew under t2";
    support::eventually(Duration::from_secs(10), "the reload's warning", || {
        gateway.log().contains(said)
    });
    let ready = http_get(gateway.admin, "/readyz", None, &[]);
    assert_eq!(
        (ready.status, ready.body.as_str()),
        (
            200,
            "ready: redis limiter\npending upgrade (sluice -u): redis.key_prefix, server\n"
        )
    );
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let overview = http_get(gateway.admin, "/ui/", None, &[("authorization", &bearer)]);
    assert_eq!(overview.status, 200);
    assert!(
        overview.body.contains("key prefix <code>t</code>"),
        "the prefix in force: {}",
        overview.body
    );
    assert!(
        overview.body.contains("Waits for an upgrade")
            && overview
                .body
                .contains("<code>redis.key_prefix</code> (t in force, t2 in the file)"),
        "what waits: {}",
        overview.body
    );

    assert!(
        gateway.reload(&monthly_under("t").yaml()),
        "back to the values in force"
    );
    let ready = http_get(gateway.admin, "/readyz", None, &[]);
    assert_eq!(ready.body, "ready: redis limiter\n", "nothing waits");
    assert_eq!(left_after_one(&gateway), 5);

    let secret = monthly_under("t").set("key_secret", "a-new-secret-of-this-gateway");
    assert!(gateway.reload(&secret.yaml()), "a new key_secret is taken");
    assert_eq!(
        left_after_one(&gateway),
        9,
        "every count starts anew with it"
    );
    support::eventually(Duration::from_secs(10), "the key_secret warning", || {
        gateway.log().contains("reload: `key_secret` changed and applies now: it keys every key's hash, so every counter (monthly quotas included) and credit id starts anew")
    });
}

#[test]
fn shadow_limits_count_but_let_requests_through() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = with_redis("allow")
        .route(
            route("trial")
                .prefix("/trial/")
                .set("shadow", true)
                .limit(gcra("strict", "1/h").key(&["client_ip"])),
        )
        .route(
            route("mixed")
                .prefix("/mixed/")
                .limit(gcra("enforced", "3/h").key(&["client_ip"]).burst(2))
                .limit(gcra("candidate", "1/h").key(&["client_ip"]).shadow()),
        );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    for _ in 0..3 {
        let response = gateway.get("/trial/x");
        assert_eq!(response.status, 200);
        assert_eq!(
            response.header("ratelimit"),
            None,
            "shadow limits are not advertised"
        );
    }
    let statuses: Vec<u16> = (0..4).map(|_| gateway.get("/mixed/x").status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 429],
        "the enforced limit still counts every admitted request"
    );
    let metrics = gateway.metrics();
    let count = |route, decision| {
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", route), ("decision", decision)],
        )
    };
    assert_eq!(
        (count("trial", "allowed"), count("trial", "shadow_limited")),
        (1.0, 2.0)
    );
    assert_eq!(
        (
            count("mixed", "allowed"),
            count("mixed", "shadow_limited"),
            count("mixed", "limited")
        ),
        (1.0, 2.0, 1.0)
    );
}

#[test]
fn script_flush_mid_traffic_is_invisible_to_clients_and_counts_stay_exact() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config =
        with_redis("deny").route(route("api").limit(fixed_window("exact", "10/h").key(&["route"])));
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    let mut statuses: Vec<u16> = (0..4).map(|_| gateway.get("/x").status).collect();
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(&mut redis.connection())
        .unwrap();
    statuses.extend((0..8).map(|_| gateway.get("/x").status));
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429],
        "NOSCRIPT reloaded, nothing double counted"
    );
    let metrics = gateway.metrics();
    assert_eq!(metric(&metrics, "sluice_limiter_errors_total", &[]), 0.0);
}

#[test]
fn a_route_can_override_the_failure_mode() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = with_redis("allow")
        .route(
            route("login")
                .prefix("/login")
                .set("failure_mode", "deny")
                .set("limiter_timeout_ms", 40)
                .limit(gcra("per_client", "5/m").burst(4)),
        )
        .route(burst_route());
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    redis.stop();
    assert_eq!(gateway.get("/login").status, 503, "login fails closed");
    assert_eq!(gateway.get("/api/x").status, 200, "the rest fails open");
}

#[test]
fn the_grafana_dashboard_only_uses_exported_metrics() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("allow"), &upstream, Some(&redis));
    gateway.get("/api/x");
    let exported = gateway.metrics();
    let dashboard =
        std::fs::read_to_string(support::repo_path("docs/grafana-dashboard.json")).unwrap();
    // JSON is YAML: no JSON parser needed.
    let parsed: serde_yaml::Value =
        serde_yaml::from_str(&dashboard).expect("the dashboard is valid JSON");
    let panels = parsed["panels"].as_sequence().expect("panels");
    let mut checked = 0;
    for panel in panels {
        for target in panel["targets"].as_sequence().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("sluice_"))
            {
                assert!(
                    exported.contains(&format!("\n{name}")),
                    "{name} in {expr:?} is not exported"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 9);
}

#[test]
fn failure_mode_local_enforces_this_gateways_share_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = with_redis("local")
        .set("instances", 2)
        .route(route("api").limit(gcra("per_client", "10/h").burst(9)));
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    redis.stop();
    let statuses: Vec<u16> = (0..8).map(|_| gateway.get("/x").status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429, 429, 429],
        "10 per hour over 2 gateways: 5 here"
    );
    let metrics = gateway.metrics();
    let count = |decision| {
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", decision)],
        )
    };
    assert_eq!((count("local_allowed"), count("local_limited")), (5.0, 3.0));
}

#[test]
fn redis_errors_are_counted_by_kind_and_the_failure_mode_applies() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&burst("deny"), &upstream, Some(&redis));
    assert_eq!(gateway.get("/api/warm").status, 200);
    let mut con = redis.connection();
    // Out of memory: every write is refused.
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query::<()>(&mut con)
        .unwrap();
    assert_eq!(gateway.get("/api/oom").status, 503);
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query::<()>(&mut con)
        .unwrap();
    // A replica (after a failover gone wrong): writes are refused with READONLY.
    // One error does not open the breaker: the next call reaches Redis.
    support::eventually(Duration::from_secs(10), "the breaker is closed", || {
        metric(&gateway.metrics(), "sluice_redis_breaker_state", &[]) == 0.0
    });
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(support::free_port())
        .query::<()>(&mut con)
        .unwrap();
    assert_eq!(gateway.get("/api/readonly").status, 503);
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query::<()>(&mut con)
        .unwrap();
    let metrics = gateway.metrics();
    assert_eq!(
        metric(&metrics, "sluice_limiter_errors_total", &[("kind", "oom")]),
        1.0
    );
    assert_eq!(
        metric(
            &metrics,
            "sluice_limiter_errors_total",
            &[("kind", "readonly")]
        ),
        1.0
    );
}

#[test]
fn sluice_starts_without_redis_and_engages_when_redis_appears() {
    let upstream = Upstream::start();
    let port = support::free_port();
    let config = with_redis("allow")
        .redis_key("url", format!("redis://127.0.0.1:{port}/0"))
        .route(burst_route());
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    assert_eq!(gateway.get("/api/a").status, 200);
    let ready = support::http_get(gateway.admin, "/readyz", None, &[]);
    assert!(ready.body.starts_with("degraded"), "{}", ready.body);
    let _redis = RedisServer::start_on(port);
    let mut engaged = false;
    for _ in 0..50 {
        if gateway.get("/api/b").header("ratelimit").is_some() {
            engaged = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(engaged, "limiting engaged without a restart");
    assert!(support::http_get(gateway.admin, "/readyz", None, &[])
        .body
        .starts_with("ready"));
}

/// A client in a `deny` range gets 403 before any limit: nothing reaches the upstream or Redis.
/// A client in the route's `allow` range passes a limit exhausted for everyone else, counted as
/// `exempt`, with no RateLimit headers (no limit was asked).
#[test]
fn denied_ranges_get_403_and_allowed_ranges_pass_an_exhausted_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = with_redis("allow")
        .set(
            "addresses",
            "{ deny: [127.0.0.66, \"::ffff:127.0.0.67/128\"] }",
        )
        .route(
            route("api")
                .prefix("/api/")
                .set("addresses", "{ allow: [127.0.0.76/31] }")
                .limit(fixed_window("everyone", "2/h").key(&["route"])),
        );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    for source in ["127.0.0.66", "127.0.0.67"] {
        let refused = gateway.get_from(source, "/api/a");
        assert_eq!(refused.status, 403, "{source}: {}", refused.body);
        assert!(
            refused.body.contains("\"title\":\"Forbidden\""),
            "{}",
            refused.body
        );
    }
    assert_eq!(
        upstream.served(),
        0,
        "a denied client never reaches the upstream"
    );
    let keys: Vec<String> = redis.connection().keys("*").unwrap();
    assert!(keys.is_empty(), "nor Redis: {keys:?}");

    let statuses: Vec<u16> = (0..3)
        .map(|_| gateway.get_from("127.0.0.1", "/api/a").status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
    for source in ["127.0.0.76", "127.0.0.77", "127.0.0.76"] {
        let exempt = gateway.get_from(source, "/api/a");
        assert_eq!(exempt.status, 200, "{source} is in the allow range");
        assert_eq!(exempt.header("ratelimit"), None);
    }
    assert_eq!(upstream.served(), 5);
    let metrics = gateway.metrics();
    let count = |decision| {
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", decision)],
        )
    };
    assert_eq!(
        (
            count("forbidden"),
            count("exempt"),
            count("allowed"),
            count("limited")
        ),
        (2.0, 3.0, 2.0, 1.0)
    );
}

/// The calls of `command` that failed, in an `INFO commandstats` reply.
fn failed_calls(info: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .flat_map(|stats| stats.split(','))
        .filter_map(|field| field.strip_prefix("failed_calls="))
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

/// The decision libraries Redis holds (`FUNCTION LIST`), by name.
fn libraries(redis: &RedisServer) -> Vec<String> {
    let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut redis.connection())
        .expect("FUNCTION LIST");
    let mut names: Vec<String> = listed
        .iter()
        .filter_map(|library| match library {
            redis::Value::Array(fields) => fields.chunks(2).find_map(|pair| match pair {
                [redis::Value::BulkString(k), redis::Value::BulkString(v)]
                    if k == b"library_name" =>
                {
                    Some(String::from_utf8_lossy(v).into_owned())
                }
                _ => None,
            }),
            redis::Value::Map(fields) => fields.iter().find_map(|pair| match pair {
                (redis::Value::BulkString(k), redis::Value::BulkString(v))
                    if k == b"library_name" =>
                {
                    Some(String::from_utf8_lossy(v).into_owned())
                }
                _ => None,
            }),
            _ => None,
        })
        .collect();
    names.sort();
    names
}

/// Warm decisions: the decision scripts a configuration may call are in Redis before `/readyz`
/// says ready and before a reload takes effect. So the first decision after either loads
/// nothing and makes a 2 ms deadline (`failure_mode: deny`: a missed one would answer 503).
#[test]
fn the_first_decision_after_start_and_after_a_reload_is_warm() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let warm = |routes: &[Route]| {
        let mut config = Config::new()
            .redis("REDIS_URL")
            .redis_key("timeout_ms", 2)
            .failure_mode("deny");
        for route in routes {
            config = config.route(route.clone());
        }
        config.yaml()
    };
    let api = route("api")
        .prefix("/api/")
        .limit(gcra("per_client", "100/s").key(&["client_ip"]));
    let gateway = Gateway::start(&warm(std::slice::from_ref(&api)), &upstream, Some(&redis));
    gateway.wait_ready();
    // One algorithm: one library, loaded before the gateway said it was ready.
    assert_eq!(libraries(&redis).len(), 1, "{:?}", libraries(&redis));
    let decided_warm = |path: &str, what: &str| {
        let before = redis.commandstats();
        let answer = gateway.get(path);
        let after = redis.commandstats();
        assert_eq!(
            answer.status, 200,
            "{what}: the first decision made its 2 ms deadline"
        );
        assert_eq!(
            support::command_calls(&after, &["function|load"]),
            support::command_calls(&before, &["function|load"]),
            "{what}: the first decision loaded a library"
        );
        assert_eq!(failed_calls(&after, "fcall"), 0, "{what}: {after}");
        assert!(
            support::command_calls(&after, &["fcall"])
                > support::command_calls(&before, &["fcall"]),
            "{what}: the decision was made in Redis"
        );
    };
    decided_warm("/api/a", "after start");

    // A reload adds a route with a second algorithm: the libraries of {gcra}, {fixed_window}
    // and of both (a batch may hold requests of both routes) are there before it takes effect.
    let orders = route("orders")
        .prefix("/orders/")
        .limit(fixed_window("per_route", "100/s").key(&["route"]));
    assert!(gateway.reload(&warm(&[api, orders])));
    assert_eq!(libraries(&redis).len(), 3, "{:?}", libraries(&redis));
    decided_warm("/orders/a", "after a reload");
    let metrics = gateway.metrics();
    assert_eq!(metric(&metrics, "sluice_limiter_errors_total", &[]), 0.0);

    // A server that lost its libraries (flushed; restarted without persistence): the decision
    // that meets the loss loads its own, and the keeper loads the others again.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut redis.connection())
        .expect("FUNCTION FLUSH");
    // (Its load may take longer than the 2 ms deadline: its answer is not the point here. A
    // decision that misses its deadline never sees the loss, as on a loaded machine: traffic
    // goes on until one does.)
    support::eventually(
        Duration::from_secs(10),
        "the libraries loaded again",
        || {
            gateway.get("/api/b");
            libraries(&redis).len() == 3
        },
    );
}
