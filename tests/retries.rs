//! Retries through the real binary against scripted upstreams: what `retry_on` sends to another
//! server (a flapping server's `503`s, a slow server's timeouts, a reset), what it never does
//! (send a POST twice, retry a `503` that carries `Retry-After`, charge the caller's limits
//! twice), and the retry budget holding a storm against a failing upstream (counted at the
//! upstream).

mod support;

use std::io::{Read, Write};
use std::time::Duration;

use support::config::{route, Config};
use support::limits::fixed_window;
use support::scripted::{Reply, Scripted};
use support::{http_call, metric, Gateway, Upstream};

/// A gateway whose route `api` sends to `servers` with these upstream settings (`, name: value`
/// pairs), passive health off unless `more` says otherwise.
fn gateway(servers: &[&Scripted], more: &str, any: &Upstream) -> Gateway {
    gateway_with(route("api"), servers, more, any)
}

/// [`gateway`], for `route` as built.
fn gateway_with(
    route: support::config::Route,
    servers: &[&Scripted],
    more: &str,
    any: &Upstream,
) -> Gateway {
    let servers: Vec<String> = servers.iter().map(|s| s.addr.to_string()).collect();
    let passive = if more.contains("passive_health") {
        ""
    } else {
        ", passive_health: { enabled: false }"
    };
    let upstream = format!("{{ servers: [{}]{passive}{more} }}", servers.join(", "));
    let gateway = Gateway::start(
        &Config::new().route(route.upstream(upstream)).yaml(),
        any,
        None,
    );
    gateway.wait_ready();
    gateway
}

/// `sluice_upstream_retries_total` of route `api`, by outcome.
fn retries(gateway: &Gateway, outcome: &str) -> f64 {
    let labels = [("route", "api"), ("outcome", outcome)];
    metric(&gateway.metrics(), "sluice_upstream_retries_total", &labels)
}

/// `sluice_upstream_ejections_total` of `server`.
fn ejections(gateway: &Gateway, server: &Scripted) -> f64 {
    let server = server.addr.to_string();
    let labels = [("server", server.as_str())];
    metric(
        &gateway.metrics(),
        "sluice_upstream_ejections_total",
        &labels,
    )
}

#[test]
fn a_flapping_servers_503s_are_retried_on_the_other_and_it_stays_in() {
    let any = Upstream::start();
    // Every other answer of the flapping server is a 503.
    let flapping = Scripted::start(|n, _| Reply::status(if n % 2 == 0 { 503 } else { 200 }));
    let healthy = Scripted::start(|_, _| Reply::status(200));
    let gateway = gateway(
        &[&flapping, &healthy],
        ", retries: 1, retry_on: [http_503], passive_health: { consecutive_failures: 2 }",
        &any,
    );
    for i in 0..40 {
        assert_eq!(gateway.get(&format!("/f/{i}")).status, 200, "request {i}");
    }
    let failed = flapping.count().div_ceil(2);
    assert!(
        failed >= 5,
        "the flapping server failed some: {}",
        flapping.count()
    );
    assert_eq!(
        retries(&gateway, "retried"),
        failed as f64,
        "each 503 retried once"
    );
    assert_eq!(flapping.count() + healthy.count(), 40 + failed);
    // Never two failures in a row: passive health keeps it in.
    assert_eq!(ejections(&gateway, &flapping), 0.0);
}

#[test]
fn a_slow_server_past_the_read_timeout_is_retried_for_a_get_and_never_for_a_post() {
    let any = Upstream::start();
    let slow = Scripted::start(|_, _| Reply::After(Duration::from_secs(2), 200, ""));
    let fast = Scripted::start(|_, _| Reply::status(200));
    let gateway = gateway(
        &[&slow, &fast],
        ", retries: 1, retry_on: [timeout], read_timeout_ms: 300",
        &any,
    );
    for i in 0..4 {
        assert_eq!(gateway.get(&format!("/get/{i}")).status, 200, "GET {i}");
    }
    assert!(slow.count() >= 1, "round robin sent it some");
    assert_eq!(fast.count(), 4, "every GET ended on the fast server");
    let statuses: Vec<u16> = (0..4)
        .map(|i| http_call(gateway.proxy, "POST", &format!("/post/{i}"), None, &[]).status)
        .collect();
    let posts = |server: &Scripted| {
        let seen = server.seen();
        seen.into_iter().filter(|s| s.method == "POST").count()
    };
    assert_eq!(
        posts(&slow) + posts(&fast),
        4,
        "each POST sent once: {statuses:?}"
    );
    assert!(posts(&slow) >= 1, "round robin sent it some POSTs");
    let timed_out = statuses.iter().filter(|s| **s == 504).count();
    assert_eq!(
        timed_out,
        posts(&slow),
        "a POST that timed out is answered 504: {statuses:?}"
    );
}

#[test]
fn a_post_is_never_sent_twice_whatever_the_failure() {
    let any = Upstream::start();
    let sick = Scripted::start(|_, _| Reply::status(503));
    let resetting = Scripted::start(|_, _| Reply::Close);
    let healthy = Scripted::start(|_, _| Reply::status(200));
    let on = ", retries: 2, retry_on: [reset, http_503]";
    let gateway = gateway(&[&sick, &resetting, &healthy], on, &any);
    for i in 0..6 {
        assert_eq!(gateway.get(&format!("/get/{i}")).status, 200, "GET {i}");
    }
    let statuses: Vec<u16> = (0..6)
        .map(|i| http_call(gateway.proxy, "POST", &format!("/post/{i}"), None, &[]).status)
        .collect();
    let mut received = Vec::new();
    for server in [&sick, &resetting, &healthy] {
        let seen = server.seen().into_iter().filter(|s| s.method == "POST");
        received.extend(seen.map(|s| s.path));
    }
    received.sort();
    let expected: Vec<String> = (0..6).map(|i| format!("/post/{i}")).collect();
    assert_eq!(
        received, expected,
        "each POST reached one server once: {statuses:?}"
    );
    assert!(
        statuses.contains(&503) && statuses.contains(&502),
        "{statuses:?}"
    );
}

#[test]
fn a_response_cut_off_after_its_head_reached_the_client_is_never_retried() {
    let any = Upstream::start();
    let cut = Scripted::start(|_, _| Reply::CutOff);
    let healthy = Scripted::start(|_, _| Reply::status(200));
    let on = ", retries: 1, retry_on: [reset, timeout]";
    let gateway = gateway(&[&cut, &healthy], on, &any);
    for i in 0..4 {
        // The client reads what comes until the gateway closes: a head, 10 bytes, the end.
        let mut stream = support::connect(gateway.proxy, None);
        let request =
            format!("GET /cut/{i} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).expect("send");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        let mut received = Vec::new();
        let _ = stream.read_to_end(&mut received);
        let text = String::from_utf8_lossy(&received);
        assert_eq!(
            text.matches("HTTP/1.1 ").count(),
            1,
            "one response head: {text}"
        );
    }
    assert!(cut.count() >= 1, "round robin sent it some");
    assert_eq!(cut.count() + healthy.count(), 4, "none sent twice");
    assert_eq!(retries(&gateway, "retried"), 0.0);
}

#[test]
fn a_503_that_says_retry_after_is_passed_on_and_not_retried() {
    let any = Upstream::start();
    let busy = Scripted::start(|_, _| Reply::After(Duration::ZERO, 503, "retry-after: 7\r\n"));
    let healthy = Scripted::start(|_, _| Reply::status(200));
    let gateway = gateway(
        &[&busy, &healthy],
        ", retries: 1, retry_on: [http_503]",
        &any,
    );
    let responses: Vec<_> = (0..6).map(|i| gateway.get(&format!("/r/{i}"))).collect();
    let passed_on: Vec<_> = responses.iter().filter(|r| r.status == 503).collect();
    assert_eq!(
        passed_on.len(),
        busy.count(),
        "each of its 503s reached the client"
    );
    assert!(!passed_on.is_empty());
    assert!(passed_on
        .iter()
        .all(|r| r.header("retry-after") == Some("7")));
    assert_eq!(healthy.count() + busy.count(), 6, "none sent twice");
    assert_eq!(retries(&gateway, "retried"), 0.0);
}

#[test]
fn a_retried_request_is_charged_to_the_callers_limits_once() {
    let any = Upstream::start();
    let sick = Scripted::start(|_, _| Reply::status(503));
    let healthy = Scripted::start(|_, _| Reply::status(200));
    let limited = route("api").limit(fixed_window("per-client", "4/m").key(&["client_ip"]));
    let on = ", retries: 1, retry_on: [http_503]";
    let gateway = gateway_with(limited, &[&sick, &healthy], on, &any);
    let responses: Vec<_> = (0..6).map(|i| gateway.get(&format!("/l/{i}"))).collect();
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 429, 429]);
    let remaining: Vec<_> = responses[..4]
        .iter()
        .map(|r| r.header("ratelimit").map(str::to_string))
        .collect();
    assert!(
        retries(&gateway, "retried") >= 1.0,
        "some were retried: {remaining:?}"
    );
    for (i, left) in remaining.iter().enumerate() {
        let left = left.as_deref().unwrap_or_default();
        assert!(
            left.contains(&format!("r={}", 3 - i)),
            "request {i}: {left}"
        );
    }
}

/// Sends `clients × each` GETs from `clients` threads at once; every status.
fn storm(gateway: &Gateway, clients: usize, each: usize) -> Vec<u16> {
    let proxy = gateway.proxy;
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            std::thread::spawn(move || {
                let path = |i| format!("/storm/{c}/{i}");
                (0..each)
                    .map(|i| support::http_get(proxy, &path(i), None, &[]).status)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("a client"))
        .collect()
}

#[test]
fn a_retry_storm_against_a_failing_upstream_is_held_by_the_budget() {
    let any = Upstream::start();
    let failing = || Scripted::start(|_, _| Reply::After(Duration::from_millis(40), 503, ""));
    let (clients, each) = (20, 10);
    let requests = (clients * each) as f64;
    // Without a budget worth the name (100 %): every request is tried twice.
    let (a, b) = (failing(), failing());
    let on =
        ", retries: 1, retry_on: [http_503], retry_budget: { percent: 100, min_concurrency: 1 }";
    let unbounded = gateway(&[&a, &b], on, &any);
    let statuses = storm(&unbounded, clients, each);
    assert!(
        statuses.iter().all(|s| *s == 503),
        "the upstream's own answer passed on"
    );
    assert_eq!((a.count() + b.count()) as f64, 2.0 * requests);
    // With the default share (20 % of the requests in flight), a storm adds at most about a
    // quarter of the requests (retries ≤ 20 % of the tries in flight): the bound is the
    // steady state's, given room for the storm's start and end.
    let (a, b) = (failing(), failing());
    let on =
        ", retries: 1, retry_on: [http_503], retry_budget: { percent: 20, min_concurrency: 1 }";
    let budgeted = gateway(&[&a, &b], on, &any);
    let statuses = storm(&budgeted, clients, each);
    assert!(statuses.iter().all(|s| *s == 503));
    let received = (a.count() + b.count()) as f64;
    let (retried, held) = (
        retries(&budgeted, "retried"),
        retries(&budgeted, "budget_exhausted"),
    );
    println!(
        "retry storm: {requests} requests from {clients} clients; the upstream received \
         {received} ({retried} retries, {held} held back by the budget)"
    );
    assert_eq!(
        received,
        requests + retried,
        "every retry counted reached the upstream"
    );
    assert_eq!(
        retried + held,
        requests,
        "every failed first try retried or held"
    );
    assert!(
        retried <= 0.3 * requests,
        "{retried} retries for {requests} requests"
    );
    assert!(held > 0.0);
}
