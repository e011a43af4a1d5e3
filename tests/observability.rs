//! What an operator sees, from real processes: every metric series with its labels and values
//! after known traffic; the JSON access log for allowed, shadow-limited, limited, failed and
//! failure-mode requests; a logrotate-style reopen that loses no line; the request id at the
//! upstream, at the client and in the problem body.

mod support;

use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::limits::fixed_window;
use support::{free_port, http_get, metric, Gateway, RedisServer, Upstream};

/// The count of a histogram series (`<name>_count`).
fn count(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric(metrics, &format!("{name}_count"), labels)
}

#[test]
fn every_series_appears_with_its_labels_after_known_traffic() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let dead = format!("127.0.0.1:{}", free_port());
    // Another: a server a route checks is avoided by every route that lists it (one state per
    // server), and the "dead" route must dial its own to be refused.
    let checked_dead = format!("127.0.0.1:{}", free_port());
    let body = Config::new()
        .redis(redis.url())
        .route(
            route("api")
                .prefix("/api")
                .limit(fixed_window("per_client", "3/h").key(&["client_ip"]))
                .limit(fixed_window("canary", "1/h").key(&["route"]).shadow()),
        )
        .route(
            route("dead")
                .prefix("/dead")
                .upstream(format!("{{ servers: [{dead}], retries: 0 }}")),
        )
        .route(route("checked").prefix("/checked").upstream(format!(
            "{{ servers: [UPSTREAM, {checked_dead}], health_check_interval_ms: 100 }}"
        )))
        .yaml();
    let gateway = Gateway::start(&body, &upstream, Some(&redis));
    let statuses: Vec<u16> = (0..5).map(|_| gateway.get("/api/x").status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(gateway.get("/dead/x").status, 502);
    let metrics = gateway.metrics();
    let api = |limit: &str, decision: &str| {
        metric(
            &metrics,
            "sluice_limit_decisions_total",
            &[("route", "api"), ("limit", limit), ("decision", decision)],
        )
    };
    assert_eq!(api("per_client", "allowed"), 3.0);
    assert_eq!(api("per_client", "limited"), 2.0);
    assert_eq!(
        api("canary", "allowed"),
        1.0,
        "the shadow limit passed the first"
    );
    // It would have denied the next three it was asked about; the fifth request was refused
    // from the deny cache, which asks no limit but the one that denied (operations.md).
    assert_eq!(
        api("canary", "shadow_limited"),
        3.0,
        "and would have denied the rest it was asked about"
    );
    let duration = "sluice_request_duration_seconds";
    assert_eq!(
        count(
            &metrics,
            duration,
            &[("route", "api"), ("status_class", "2xx")]
        ),
        3.0
    );
    assert_eq!(
        count(
            &metrics,
            duration,
            &[("route", "api"), ("status_class", "4xx")]
        ),
        2.0
    );
    assert_eq!(
        count(
            &metrics,
            duration,
            &[("route", "dead"), ("status_class", "5xx")]
        ),
        1.0
    );
    let upstream_duration = "sluice_upstream_duration_seconds";
    assert_eq!(count(&metrics, upstream_duration, &[("route", "api")]), 3.0);
    assert_eq!(
        count(&metrics, upstream_duration, &[("route", "dead")]),
        0.0
    );
    let errors = |kind: &str| {
        metric(
            &metrics,
            "sluice_upstream_errors_total",
            &[("route", "dead"), ("kind", kind)],
        )
    };
    assert_eq!((errors("refused"), errors("timeout")), (1.0, 0.0));
    assert_eq!(
        metric(
            &metrics,
            "sluice_upstream_server_errors_total",
            &[("server", &dead), ("kind", "refused")]
        ),
        1.0,
        "and counted for the server that refused"
    );
    assert_eq!(
        metric(&metrics, "sluice_requests_in_flight", &[("route", "api")]),
        0.0,
        "every request has ended"
    );
    assert!(
        metrics.contains("sluice_requests_in_flight{route=\"checked\"} 0"),
        "a route's in-flight gauge is exported before its first request"
    );
    let healthy = |server: &str| {
        metric(
            &metrics,
            "sluice_upstream_healthy",
            &[("route", "checked"), ("server", server)],
        )
    };
    assert_eq!(healthy(&upstream.addr.to_string()), 1.0);
    assert_eq!(
        healthy(&checked_dead),
        0.0,
        "the dead server fails its checks"
    );
    assert_eq!(
        metric(&metrics, "sluice_upstream_healthy", &[("route", "api")]),
        1.0,
        "a server without checks counts as healthy"
    );
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !line.contains("127.0.0.1\"") || line.starts_with("sluice_upstream_healthy"),
            "no client address in a label: {line}"
        );
    }
    promtool_check(&metrics);

    // A reload that drops a route and a limit retires their series.
    let smaller = Config::new()
        .redis(redis.url())
        .route(
            route("api")
                .prefix("/api")
                .limit(fixed_window("per_client", "3/h").key(&["client_ip"])),
        )
        .yaml();
    assert!(gateway.reload(&smaller));
    let metrics = gateway.metrics();
    assert!(!metrics.contains("limit=\"canary\""), "{metrics}");
    assert!(!metrics.contains("route=\"dead\""));
    assert!(!metrics.contains("route=\"checked\""));
    assert!(
        !metrics.contains(&format!("server=\"{dead}\"")),
        "a server no route lists any more: its errors' series go too"
    );
    assert_eq!(
        api("per_client", "allowed"),
        3.0,
        "what stays keeps counting"
    );
}

#[test]
fn a_gateway_without_redis_shows_the_limiters_unlabelled_families_at_zero() {
    let upstream = Upstream::start();
    let body = Config::new()
        .route(
            route("api")
                .prefix("/api")
                .limit(fixed_window("per_client", "3/h").key(&["client_ip"])),
        )
        .yaml();
    let gateway = Gateway::start(&body, &upstream, None);
    assert_eq!(gateway.get("/api/x").status, 200);
    let metrics = gateway.metrics();
    // Kept per thread (limiter/meters.rs) yet there from the start, as prometheus's own
    // unlabelled counters and histograms were: a dashboard reads 0, not "no data".
    for line in [
        "sluice_deny_cache_hits_total 0",
        "sluice_lease_held_decisions_total 0",
        "sluice_limiter_batch_size_count 0",
        "sluice_limiter_batch_size_bucket{le=\"+Inf\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} is missing:\n{metrics}"
        );
    }
    assert_eq!(
        metric(
            &metrics,
            "sluice_limiter_duration_seconds_count",
            &[("backend", "local")]
        ),
        1.0,
        "the in-process decision, timed"
    );
    promtool_check(&metrics);
}

/// `promtool check metrics` on the scrape: names, units, help and types as Prometheus wants.
fn promtool_check(metrics: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian: prometheus) is installed by scripts/test.sh");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .expect("write the scrape");
    let output = child.wait_with_output().expect("promtool ran");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.trim().is_empty(),
        "promtool: {said}"
    );
}

#[test]
fn the_access_log_is_one_json_object_per_request_with_every_field() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let dead = format!("127.0.0.1:{}", free_port());
    let body = Config::new()
        .redis(redis.url())
        .set(
            "access_log",
            format!(
                "{{ enabled: true, path: {}, headers: [user-agent] }}",
                log.display()
            ),
        )
        .route(
            route("api")
                .prefix("/api")
                .limit(fixed_window("per_client", "2/h").key(&["client_ip"]))
                .limit(fixed_window("canary", "1/h").key(&["route"]).shadow()),
        )
        .route(
            route("dead")
                .prefix("/dead")
                .upstream(format!("{{ servers: [{dead}], retries: 0 }}")),
        )
        .yaml();
    let gateway = Gateway::start(&body, &upstream, Some(&redis));
    let agent = [("User-Agent", "probe/1.0")];
    let started = Instant::now();
    let allowed = http_get(gateway.proxy, "/api/one/../a", None, &agent);
    let shadow = http_get(gateway.proxy, "/api/b", None, &agent);
    let limited = http_get(gateway.proxy, "/api/c", None, &agent);
    let failed = http_get(gateway.proxy, "/dead/d", None, &agent);
    redis.stop();
    // Another client: the deny cache holds the first one's denial.
    let other = Some("127.0.0.2".parse().unwrap());
    let failure_mode = http_get(gateway.proxy, "/api/e", other, &agent);
    // Each request took some of the wall time measured around them all.
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let statuses = [
        allowed.status,
        shadow.status,
        limited.status,
        failed.status,
        failure_mode.status,
    ];
    assert_eq!(statuses, [200, 200, 429, 502, 200]);
    let lines = support::json_lines(&log, 5);
    assert_eq!(lines.len(), 5, "{lines:?}");
    let expected = [
        (&allowed, "/api/a", "api", 200, "allowed", None, None),
        (
            &shadow,
            "/api/b",
            "api",
            200,
            "shadow_limited",
            Some("canary"),
            None,
        ),
        (
            &limited,
            "/api/c",
            "api",
            429,
            "limited",
            Some("per_client"),
            None,
        ),
        (&failed, "/dead/d", "dead", 502, "allowed", None, None),
        (
            &failure_mode,
            "/api/e",
            "api",
            200,
            "error_allowed",
            None,
            Some("allow"),
        ),
    ];
    for (line, (response, path, route, status, decision, limit, mode)) in lines.iter().zip(expected)
    {
        let id = response
            .header("x-request-id")
            .expect("the client gets the id");
        assert_eq!(line["request_id"], id, "{line}");
        let client = if path == "/api/e" {
            "127.0.0.2"
        } else {
            "127.0.0.1"
        };
        assert_eq!(line["client"], client);
        assert!(line["peer"].as_str().unwrap().starts_with(client));
        assert_eq!(line["method"], "GET");
        assert_eq!(line["host"], "localhost");
        assert_eq!(line["path"], path, "the normalized path");
        assert_eq!(line["protocol"], "HTTP/1.1");
        assert_eq!(line["route"], route);
        assert_eq!(line["status"], status);
        assert_eq!(line["decision"], decision, "{line}");
        assert_eq!(line["limit"].as_str(), limit, "{line}");
        assert_eq!(line["failure_mode"].as_str(), mode, "{line}");
        assert_eq!(line["headers"]["user-agent"], "probe/1.0");
        assert_eq!(line["bytes_in"], 0);
        assert!(line["bytes_out"].as_u64().unwrap() > 0, "{line}");
        let duration_ms = line["duration_ms"].as_f64().unwrap();
        assert!(
            duration_ms > 0.0 && duration_ms < wall_ms,
            "{line} ({wall_ms} ms in all)"
        );
        let limiter_ms = line["limiter_ms"].as_f64().unwrap();
        assert!((0.0..=duration_ms).contains(&limiter_ms), "{line}");
        assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");
        let proxied = status == 200;
        assert_eq!(
            line["upstream"].is_string(),
            proxied || route == "dead",
            "{line}"
        );
        assert_eq!(line["upstream_ms"].is_number(), proxied, "{line}");
    }
    assert_eq!(lines[3]["upstream"], dead.as_str());
    assert_eq!(lines[3]["error"], "refused");
    assert!(lines[0]["error"].is_null());
}

#[test]
fn a_logrotate_reopen_loses_no_line() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let body = Config::new()
        .set(
            "access_log",
            format!("{{ enabled: true, path: {} }}", log.display()),
        )
        .route(route("api"))
        .yaml();
    let gateway = Gateway::start(&body, &upstream, None);
    let proxy = gateway.proxy;
    let (during, after) = (400, 50);
    let clients = std::thread::spawn(move || {
        for i in 0..during {
            assert_eq!(
                http_get(proxy, &format!("/during/{i}"), None, &[]).status,
                200
            );
        }
    });
    // Rotate while requests flow, as logrotate does: move the file, then signal.
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read(&log).lines().count() < 100 {
        assert!(Instant::now() < deadline, "the log never reached 100 lines");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::rename(&log, &rotated).unwrap();
    let signal = std::process::Command::new("kill")
        .args(["-USR1", &gateway.pid().to_string()])
        .status()
        .unwrap();
    assert!(signal.success());
    while !log.exists() {
        assert!(
            Instant::now() < deadline,
            "SIGUSR1 did not open the log again"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..after {
        assert_eq!(gateway.get(&format!("/after/{i}")).status, 200);
    }
    clients.join().unwrap();
    let total = during + after;
    let (old, new) = loop {
        let (old, new) = (read(&rotated), read(&log));
        if old.lines().count() + new.lines().count() >= total || Instant::now() > deadline {
            break (old, new);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let path = |line: &str| {
        let value: serde_json::Value = serde_json::from_str(line).expect("whole JSON lines");
        value["path"].as_str().unwrap().to_string()
    };
    assert!(
        old.lines().count() >= 100,
        "lines before the signal stay in the old file"
    );
    assert!(
        new.lines().map(path).any(|p| p == "/after/49"),
        "lines after the reopen go to the new file"
    );
    let mut paths: Vec<String> = old.lines().chain(new.lines()).map(path).collect();
    assert_eq!(paths.len(), total, "as many lines as requests");
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), total, "every request logged once");
}

#[test]
fn the_request_id_reaches_the_upstream_and_comes_back() {
    let upstream = Upstream::start();
    let body = |trusted: &str| {
        Config::new()
            .set("trusted_proxies", trusted)
            .route(
                route("api")
                    .prefix("/api")
                    .limit(fixed_window("per_client", "1/h").key(&["client_ip"])),
            )
            .route(route("other"))
            .yaml()
    };
    let gateway = Gateway::start(&body("[10.9.9.9/32]"), &upstream, None);
    let made = gateway.get("/x");
    let id = made
        .header("x-request-id")
        .expect("an id is made")
        .to_string();
    assert_eq!(id.len(), 32, "{id}");
    assert!(
        made.body.contains(&format!("x-request-id: {id}")),
        "the upstream got the same id: {}",
        made.body
    );
    // From a peer that is not a trusted proxy, an incoming id is replaced...
    let incoming = [("X-Request-Id", "from-client-1")];
    let replaced = http_get(gateway.proxy, "/x", None, &incoming);
    assert_ne!(replaced.header("x-request-id"), Some("from-client-1"));
    // Ids are random, not a process's prefix and a counter: consecutive ones share no prefix.
    let next = replaced.header("x-request-id").expect("an id is made");
    assert_ne!(id[..16], next[..16], "{id} then {next}");
    // ... and the gateway's own answers carry the id too, in the header and the problem body.
    assert_eq!(gateway.get("/api/a").status, 200);
    let limited = gateway.get("/api/a");
    assert_eq!(limited.status, 429);
    let id = limited.header("x-request-id").expect("a 429 has the id");
    assert!(
        limited.body.contains(&format!("\"request_id\":\"{id}\"")),
        "{}",
        limited.body
    );
    assert!(gateway
        .get("/nowhere/..%2F")
        .header("x-request-id")
        .is_some());

    // A trusted proxy's id is kept, end to end.
    assert!(gateway.reload(&body("[127.0.0.1/32]")));
    let kept = http_get(gateway.proxy, "/x", None, &incoming);
    assert_eq!(kept.header("x-request-id"), Some("from-client-1"));
    assert!(
        kept.body.contains("x-request-id: from-client-1"),
        "{}",
        kept.body
    );
    let bad = [("X-Request-Id", "has\"quote")];
    let refused = http_get(gateway.proxy, "/x", None, &bad);
    assert_eq!(refused.header("x-request-id").map(str::len), Some(32));
}
