//! Upstream pools through a real gateway: round robin, consistent hashing, retries on connect
//! failure only, health checks, strip_prefix and host rewrite.

mod support;

use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::{free_port, http_get, Gateway, Upstream};

/// A gateway whose one route sends to this `upstream:` value.
fn gateway(upstream_yaml: &str, any: &Upstream) -> Gateway {
    Gateway::start(&pool(upstream_yaml).yaml(), any, None)
}

fn pool(upstream_yaml: &str) -> Config {
    Config::new().route(route("api").upstream(upstream_yaml))
}

#[test]
fn round_robin_spreads_requests_over_every_server() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let gateway = gateway(&format!("{{ servers: [{}, {}] }}", a.addr, b.addr), &a);
    for _ in 0..10 {
        assert_eq!(gateway.get("/x").status, 200);
    }
    assert_eq!((a.served(), b.served()), (5, 5));
}

#[test]
fn consistent_hashing_keeps_a_key_on_one_server() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let yaml = format!(
        "{{ servers: [{}, {}], balance: consistent, hash_key: [\"header:x-user\"] }}",
        a.addr, b.addr
    );
    let gateway = gateway(&yaml, &a);
    for user in 0..20 {
        let header = [("x-user", format!("user-{user}"))];
        let headers: Vec<(&str, &str)> = header.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let before = (a.served(), b.served());
        for _ in 0..3 {
            assert_eq!(http_get(gateway.proxy, "/x", None, &headers).status, 200);
        }
        let after = (a.served(), b.served());
        assert!(
            after == (before.0 + 3, before.1) || after == (before.0, before.1 + 3),
            "user-{user} moved: {before:?} -> {after:?}"
        );
    }
    assert!(
        a.served() > 0 && b.served() > 0,
        "keys spread over both servers"
    );
}

#[test]
fn a_refused_connection_is_retried_on_another_server() {
    let live = Upstream::start();
    let dead = format!("127.0.0.1:{}", free_port());
    let gateway = gateway(
        &format!("{{ servers: [{dead}, {}], retries: 1 }}", live.addr),
        &live,
    );
    for _ in 0..6 {
        assert_eq!(gateway.get("/x").status, 200);
    }
    assert_eq!(live.served(), 6);
    let no_retry = self::gateway(
        &format!("{{ servers: [{dead}, {}], retries: 0 }}", live.addr),
        &live,
    );
    let statuses: Vec<u16> = (0..6).map(|_| no_retry.get("/x").status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 502).count(),
        3,
        "{statuses:?}"
    );
}

#[test]
fn a_request_that_reached_a_server_is_never_retried() {
    let (a, b) = (Upstream::start(), Upstream::start());
    let yaml = format!(
        "{{ servers: [{}, {}], retries: 3, read_timeout_ms: 300 }}",
        a.addr, b.addr
    );
    let gateway = gateway(&yaml, &a);
    let response = gateway.get("/slow/1500");
    assert!(
        response.status >= 500,
        "the read timed out: {}",
        response.status
    );
    // The upstream counts a request when it answers it, 1.5 s after it came in.
    support::eventually(
        Duration::from_secs(10),
        "the slow request finished upstream",
        || a.served() + b.served() >= 1,
    );
    // Deliberate: a retry would have come in at least one read timeout (300 ms) after the first
    // and would be answered that much later; a slow machine only makes this check weaker.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(a.served() + b.served(), 1, "sent once, not once per retry");
}

#[test]
fn health_checks_take_a_dead_server_out_of_rotation() {
    let live = Upstream::start();
    let dead = format!("127.0.0.1:{}", free_port());
    let yaml = format!(
        "{{ servers: [{dead}, {}], retries: 0, health_check_interval_ms: 100 }}",
        live.addr
    );
    let gateway = gateway(&yaml, &live);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut streak = 0;
    while streak < 10 && Instant::now() < deadline {
        streak = if gateway.get("/x").status == 200 {
            streak + 1
        } else {
            0
        };
    }
    assert_eq!(
        streak, 10,
        "after a few checks every request goes to the live server"
    );
}

#[test]
fn a_dead_server_is_never_chosen_before_or_after_a_reload() {
    let live = Upstream::start();
    let (dead, other_dead) = (free_port(), free_port());
    let checked = |servers: &[String]| {
        pool(&format!(
            "{{ servers: [{}], retries: 0, health_check_interval_ms: 100 }}",
            servers.join(", ")
        ))
        .yaml()
    };
    let first = checked(&[format!("127.0.0.1:{dead}"), "UPSTREAM".into()]);
    let gateway = Gateway::start(&first, &live, None);
    let all_served = |what: &str| {
        let statuses: Vec<u16> = (0..20).map(|_| gateway.get("/x").status).collect();
        assert!(statuses.iter().all(|&s| s == 200), "{what}: {statuses:?}");
    };
    // The pool is probed before the listener opens: not even the first request meets the
    // dead server.
    all_served("from the start");
    assert!(gateway.reload(&first));
    all_served("right after a reload of the same pool");
    // Deliberate: a few 100 ms check rounds pass; the assertion holds however many ran.
    std::thread::sleep(Duration::from_millis(300));
    all_served("while the new pool's checks run");
    let changed = checked(&[
        format!("127.0.0.1:{other_dead}"),
        "UPSTREAM".into(),
        format!("127.0.0.1:{dead}"),
    ]);
    assert!(gateway.reload(&changed));
    all_served("right after a reload that changes the pool");
    // Deliberate, as above: requests while the changed pool's checks run.
    std::thread::sleep(Duration::from_millis(300));
    all_served("while the changed pool's checks run");
    assert_eq!(live.served(), 100);
}

#[test]
fn strip_prefix_and_host_rewrite_shape_the_upstream_request() {
    let upstream = Upstream::start();
    let config = Config::new().route(
        route("api")
            .prefix("/api/")
            .upstream("{ servers: [UPSTREAM], strip_prefix: /api, host: backend.internal }"),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    let response = gateway.get("/api/./users?id=7");
    assert_eq!(response.status, 200);
    assert!(
        response.body.contains("GET /users?id=7 "),
        "{}",
        response.body
    );
    assert!(
        response.body.contains("(host: backend.internal)"),
        "{}",
        response.body
    );
}

#[test]
fn the_demo_upstream_explains_its_usage_instead_of_panicking() {
    let demo = env!("CARGO_BIN_EXE_demo-upstream");
    let run = |args: &[&str]| {
        std::process::Command::new(demo)
            .args(args)
            .output()
            .expect("run demo-upstream")
    };
    let help = run(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("usage: demo-upstream [ADDR]"));
    for bad in [&["not-an-address"][..], &["127.0.0.1:1", "extra"][..]] {
        let output = run(bad);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains("usage: demo-upstream"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
