//! Upstream pools through a real gateway: round robin, consistent hashing, retries on connect
//! failure only, health checks, passive health (ejection, the panic threshold), strip_prefix
//! and host rewrite.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::scripted::{Reply, Scripted};
use support::{free_port, http_call, http_get, metric, Gateway, Launch, Upstream};

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

/// A server that answers `503` to every request on keep-alive connections, counting them: a
/// sick upstream (its threads end with the test process).
struct Sick {
    addr: SocketAddr,
    served: Arc<AtomicU64>,
}

impl Sick {
    fn start() -> Sick {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("its address");
        let served = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&served);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let counted = Arc::clone(&counted);
                std::thread::spawn(move || Sick::answer(stream, &counted));
            }
        });
        Sick { addr, served }
    }

    /// Answers each request head on `stream` with an empty `503` until the peer closes.
    fn answer(stream: TcpStream, served: &AtomicU64) {
        let Ok(mut writer) = stream.try_clone() else {
            return;
        };
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => {
                    served.fetch_add(1, Ordering::Relaxed);
                    let answer = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
            }
        }
    }

    fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

const ADMIN_TOKEN: &str = "upstreams-admin-token-0123456789";

/// A gateway, its log captured, whose route `api` sends to `servers` with passive health on
/// by default and no active check; the dashboard opens with [`ADMIN_TOKEN`].
fn passive_gateway(servers: &[String], any: &Upstream) -> Gateway {
    passive_gateway_with(servers, any, "")
}

/// [`passive_gateway`], its upstream settings followed by `more` (`, name: value`).
fn passive_gateway_with(servers: &[String], any: &Upstream, more: &str) -> Gateway {
    let upstream = format!("{{ servers: [{}], retries: 0{more} }}", servers.join(", "));
    let body = pool(&upstream)
        .set("admin", format!("{{ token: {ADMIN_TOKEN} }}"))
        .yaml();
    let launch = Launch {
        capture_log: true,
        ..Launch::default()
    };
    let gateway = Gateway::launch(&body, any, None, &launch);
    gateway.wait_ready();
    gateway
}

/// What `/metrics` says of `server`'s ejections: (ejections so far, ejected now).
fn ejections(gateway: &Gateway, server: SocketAddr) -> (f64, f64) {
    let metrics = gateway.metrics();
    let labels = [("server", server.to_string())];
    let labels: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (*n, v.as_str())).collect();
    (
        metric(&metrics, "sluice_upstream_ejections_total", &labels),
        metric(&metrics, "sluice_upstream_ejected", &labels),
    )
}

/// The health state the dashboard's "Upstream servers" table shows for `server`.
fn dashboard_state(gateway: &Gateway, server: SocketAddr) -> String {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let page = http_call(
        gateway.admin,
        "GET",
        "/ui/routes",
        None,
        &[("authorization", &bearer)],
    );
    assert_eq!(page.status, 200, "{}", page.body);
    let row = format!("<code>{server}</code>");
    let at = page.body.find(&row).expect("the server's row");
    let rest = &page.body[at..];
    let state = rest.split("data-state=\"").nth(1).expect("its state");
    state.split('"').next().unwrap_or_default().to_string()
}

/// The route's servers and their states, as the explain endpoint shows them for `GET /x`.
fn explained_states(gateway: &Gateway) -> Vec<(String, String)> {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let path = "/v1/explain?host=localhost&path=/x";
    let answer = http_call(
        gateway.admin,
        "GET",
        path,
        None,
        &[("authorization", &bearer)],
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    let servers = json["servers"].as_array().expect("the servers").iter();
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_string();
    servers
        .map(|shown| (text(&shown["server"]), text(&shown["state"])))
        .collect()
}

#[test]
fn a_server_answering_503_to_everything_is_ejected_and_the_healthy_one_serves() {
    let healthy = Upstream::start();
    let sick = Sick::start();
    let servers = [healthy.addr.to_string(), sick.addr.to_string()];
    let gateway = passive_gateway(&servers, &healthy);
    assert_eq!(dashboard_state(&gateway, sick.addr), "not-checked");
    // Five 503s in a row eject it: round robin sends it every other request.
    support::eventually(Duration::from_secs(20), "the sick server ejected", || {
        gateway.get("/x");
        ejections(&gateway, sick.addr) == (1.0, 1.0)
    });
    assert_eq!(sick.served(), 5, "ejected on its fifth 503 in a row");
    let statuses: Vec<u16> = (0..100).map(|_| gateway.get("/x").status).collect();
    let served = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        served >= 95,
        "{served} of 100 reached the healthy server: {statuses:?}"
    );
    assert_eq!(dashboard_state(&gateway, sick.addr), "ejected");
    assert_eq!(dashboard_state(&gateway, healthy.addr), "not-checked");
    assert_eq!(
        explained_states(&gateway),
        [
            (healthy.addr.to_string(), "not-checked".to_string()),
            (sick.addr.to_string(), "ejected".to_string())
        ]
    );
    let (_, healthy_ejected) = ejections(&gateway, healthy.addr);
    assert_eq!(healthy_ejected, 0.0);
    let log = gateway.log();
    let logged = format!("upstream server {} ejected for 30000 ms", sick.addr);
    assert_eq!(log.matches(&logged).count(), 1, "logged once: {log}");
}

#[test]
fn routes_naming_one_upstream_share_its_one_pool() {
    let any = Upstream::start();
    let ok = || Scripted::start(|_, _| Reply::status(200));
    let (a, b) = (ok(), ok());
    let body = Config::new()
        .set(
            "upstreams",
            format!("{{ shared: {{ servers: [{}, {}] }} }}", a.addr, b.addr),
        )
        .route(route("one").prefix("/one").upstream("shared"))
        .route(
            route("two")
                .prefix("/two")
                .upstream("{ use: shared, strip_prefix: /two }"),
        )
        .yaml();
    let gateway = Gateway::start(&body, &any, None);
    // One rotation for both routes: alternating routes alternate servers too, so each route
    // meets one server (two pools would each spread its route over both).
    for _ in 0..5 {
        assert_eq!(gateway.get("/one/x").status, 200);
        assert_eq!(gateway.get("/two/x").status, 200);
    }
    let paths = |server: &Scripted| -> Vec<String> {
        server.seen().into_iter().map(|seen| seen.path).collect()
    };
    let (paths_a, paths_b) = (paths(&a), paths(&b));
    let one_on = |paths: &[String]| paths.iter().filter(|p| p.starts_with("/one")).count();
    assert!(
        (one_on(&paths_a), one_on(&paths_b)) == (5, 0)
            || (one_on(&paths_a), one_on(&paths_b)) == (0, 5),
        "{paths_a:?} / {paths_b:?}"
    );
    assert!(
        paths_a
            .iter()
            .chain(&paths_b)
            .all(|p| !p.starts_with("/two")),
        "the route's own strip_prefix applies"
    );
}

#[test]
fn with_every_server_ejected_requests_are_balanced_over_all_of_them() {
    let any = Upstream::start();
    let (a, b) = (Sick::start(), Sick::start());
    let gateway = passive_gateway(&[a.addr.to_string(), b.addr.to_string()], &any);
    support::eventually(Duration::from_secs(20), "both servers ejected", || {
        gateway.get("/x");
        ejections(&gateway, a.addr).1 == 1.0 && ejections(&gateway, b.addr).1 == 1.0
    });
    let before = (a.served(), b.served());
    let statuses: Vec<u16> = (0..20).map(|_| gateway.get("/x").status).collect();
    assert!(
        statuses.iter().all(|&s| s == 503),
        "the servers' own answers, none refused by the gateway: {statuses:?}"
    );
    assert_eq!(
        (a.served() - before.0, b.served() - before.1),
        (10, 10),
        "balanced over both (the panic threshold)"
    );
    assert_eq!(
        ejections(&gateway, a.addr).0,
        1.0,
        "each ejection counted once"
    );
    assert_eq!(ejections(&gateway, b.addr).0, 1.0);
}

#[test]
fn an_ejection_ends_on_its_time_though_no_request_comes() {
    let healthy = Upstream::start();
    let sick = Sick::start();
    let servers = [healthy.addr.to_string(), sick.addr.to_string()];
    let short = ", passive_health: { base_ejection_ms: 1000 }";
    let gateway = passive_gateway_with(&servers, &healthy, short);
    support::eventually(Duration::from_secs(20), "the sick server ejected", || {
        gateway.get("/x");
        ejections(&gateway, sick.addr) == (1.0, 1.0)
    });
    // No request from here on: only the gateway's own once-a-second reading ends it.
    support::eventually(Duration::from_secs(10), "back without traffic", || {
        ejections(&gateway, sick.addr) == (1.0, 0.0)
    });
    assert_eq!(
        dashboard_state(&gateway, sick.addr),
        "not-checked",
        "back in the views"
    );
}
