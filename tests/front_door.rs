//! The front door, probed as a hostile client would, with raw sockets (a client library would
//! normalise the bytes): slow heads and idle connections, request targets, Host values, bytes
//! that must reach the upstream untouched, forged forwarding headers, costs and query spellings,
//! a shaped request whose client leaves, body and time limits, and upstream failures.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::limits::{fixed_window, gcra};
use support::{free_port, Gateway, RedisServer, Upstream};

/// Sends `bytes` on a fresh connection; returns the status and the raw response (head and
/// body), or status 0 when the connection was closed without an answer.
fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(bytes).expect("send");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let status = std::str::from_utf8(&response)
        .ok()
        .or_else(|| {
            let end = response.iter().position(|&b| b == b'\r')?;
            std::str::from_utf8(&response[..end]).ok()
        })
        .and_then(|text| text.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, response)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn plain_gateway(upstream: &Upstream, config: Config) -> Gateway {
    Gateway::start(&config.yaml(), upstream, None)
}

/// A gateway of one route whose head deadline is `head_ms` and keep-alive deadline
/// `keepalive_ms`.
fn with_deadlines(upstream: &Upstream, head_ms: u64, keepalive_ms: u64) -> Gateway {
    let config = Config::new()
        .server("request_head_timeout_ms", head_ms)
        .server("keepalive_timeout_ms", keepalive_ms)
        .route(route("all"));
    plain_gateway(upstream, config)
}

#[test]
fn only_origin_absolute_and_asterisk_targets_are_accepted() {
    let upstream = Upstream::start();
    let gateway = plain_gateway(
        &upstream,
        Config::new().route(route("all").limit(gcra("per_client", "100/s").burst(99))),
    );
    let proxy = gateway.proxy;
    for target in [
        "foo",
        "foo/bar",
        "../etc/passwd",
        "%2F",
        "ftp://localhost/x",
    ] {
        let (status, response) = raw(
            proxy,
            format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(status, 400, "{target}: {}", text(&response));
        assert!(
            text(&response).contains("request target"),
            "{}",
            text(&response)
        );
    }
    assert_eq!(upstream.served(), 0, "none of them reached the upstream");

    // Absolute form: the authority names the host; the upstream gets the origin form.
    let (status, response) = raw(
        proxy,
        b"GET http://localhost/x/../y?q=1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{}", text(&response));
    assert!(
        text(&response).contains("target: /y?q=1\n"),
        "{}",
        text(&response)
    );
    // OPTIONS * is routed as / and forwarded as it came.
    let (status, response) = raw(
        proxy,
        b"OPTIONS * HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{}", text(&response));
    assert!(
        text(&response).contains("target: *\n"),
        "{}",
        text(&response)
    );
    // * for anything but OPTIONS is not a target.
    let (status, _) = raw(
        proxy,
        b"GET * HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 400);
    assert_eq!(upstream.served(), 2);
}

#[test]
fn host_values_name_one_host_and_at_most_one_numeric_port() {
    let upstream = Upstream::start();
    let gateway = plain_gateway(&upstream, Config::new().route(route("all")));
    for host in [
        "a:b:c",
        "example.com:port",
        "example.com:99999",
        "exa mple.com",
        "[::1",
    ] {
        let (status, response) = raw(
            gateway.proxy,
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        assert_eq!(status, 400, "{host}: {}", text(&response));
    }
    let (status, _) = raw(
        gateway.proxy,
        b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 400, "HTTP/1.1 without Host");
    for host in ["example.com:8080", "[::1]:80", "10.1.2.3"] {
        let (status, _) = raw(
            gateway.proxy,
            format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        );
        assert_eq!(status, 200, "{host}");
    }
    assert_eq!(upstream.served(), 3);
}

#[test]
fn raw_bytes_of_a_path_reach_the_upstream_unaltered() {
    let upstream = Upstream::start();
    let gateway = plain_gateway(&upstream, Config::new().route(route("all")));
    // UTF-8 é (C3 A9) in the path and the query, sent as raw bytes and percent-encoded.
    let (status, response) = raw(
        gateway.proxy,
        b"GET /caf\xc3\xa9/x?name=\xc3\xa9 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{}", text(&response));
    let received = text(&response);
    assert!(
        received.contains("target: /caf\u{e9}/x?name=\u{e9}\n")
            || received.contains("target: /caf%C3%A9/x?name=%C3%A9\n"),
        "{received}"
    );
    assert!(
        !received.contains('\u{c3}'),
        "re-encoded as Latin-1: {received}"
    );
    let (status, response) = raw(
        gateway.proxy,
        b"GET /caf%C3%A9/./x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert!(
        text(&response).contains("target: /caf%C3%A9/x\n"),
        "{}",
        text(&response)
    );
    // A byte that is not UTF-8 is refused before anything else reads it.
    let (status, _) = raw(
        gateway.proxy,
        b"GET /caf\xe9 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 400);
}

/// Forms that servlet containers and Windows servers resolve as traversal, where the gateway
/// sees none, under a prefix route: refused, and never sent upstream.
#[test]
fn traversal_as_backends_read_it_is_refused_before_the_upstream() {
    let upstream = Upstream::start();
    let gateway = plain_gateway(&upstream, Config::new().route(route("api").prefix("/api")));
    for target in [
        "/api/..;/admin",
        "/api/.;/admin",
        "/api/..;jsessionid=1/admin",
        "/api/%2e%2e;/admin",
        "/api/..%3B/admin",
        "/api/%5c..%5cadmin",
        "/api/%5C..%5Cadmin",
        "/api\\..\\admin",
    ] {
        let request =
            format!("GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        let (status, response) = raw(gateway.proxy, request.as_bytes());
        assert_eq!(status, 400, "{target}: {}", text(&response));
    }
    assert_eq!(upstream.served(), 0, "none reached the upstream");
    // A segment's own parameters pass as they are.
    let (status, response) = raw(
        gateway.proxy,
        b"GET /api/users;v=1 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{}", text(&response));
    assert!(
        text(&response).contains("target: /api/users;v=1\n"),
        "{}",
        text(&response)
    );
}

#[test]
fn forged_forwarding_headers_from_an_untrusted_peer_never_reach_the_upstream() {
    let upstream = Upstream::start();
    let gateway = plain_gateway(&upstream, Config::new().route(route("all")));
    let (status, response) = raw(
        gateway.proxy,
        b"GET / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\
          X-Real-IP: 6.6.6.6\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Host: admin.internal\r\n\
          X-Forwarded-Proto: https\r\nX-Forwarded-Port: 443\r\nForwarded: for=6.6.6.6;host=admin.internal\r\n\r\n",
    );
    assert_eq!(status, 200);
    let received = text(&response);
    assert!(
        !received.contains("6.6.6.6") && !received.contains("admin.internal"),
        "{received}"
    );
    for expected in [
        "x-real-ip: 127.0.0.1\n",
        "x-forwarded-for: 127.0.0.1\n",
        "x-forwarded-host: shop.example\n",
        "x-forwarded-proto: http\n",
        &format!("x-forwarded-port: {}\n", gateway.proxy.port()),
    ] {
        assert!(received.contains(expected), "{expected:?} in {received}");
    }
}

#[test]
fn a_repeated_cost_header_is_refused_and_query_spellings_share_a_bucket() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = Config::new()
        .redis("REDIS_URL")
        .route(
            route("units").prefix("/units").limit(
                fixed_window("units", "10/h")
                    .key(&["route"])
                    .set("cost_header", "x-cost")
                    .set("cost_max", 5),
            ),
        )
        .route(
            route("tenants")
                .prefix("/tenants")
                .limit(fixed_window("per_tenant", "1/h").key(&["query:tenant"])),
        );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    for headers in [
        "X-Cost: 5\r\nX-Cost: 1\r\n",
        "X-Cost: 5, 1\r\n",
        "X-Cost: 1,5\r\n",
    ] {
        let (status, response) = raw(
            gateway.proxy,
            format!("GET /units HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(status, 400, "{headers:?}: {}", text(&response));
    }
    let (status, _) = raw(
        gateway.proxy,
        b"GET /units HTTP/1.1\r\nHost: localhost\r\nX-Cost: 5\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "a single cost header is charged");

    let (first, _) = raw(
        gateway.proxy,
        b"GET /tenants?tenant=acme+co HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(first, 200);
    for spelling in [
        "tenant=acme%20co",
        "ten%61nt=acm%65+co",
        "x=1&tenant=acme%20co",
    ] {
        let (status, _) = raw(
            gateway.proxy,
            format!(
                "GET /tenants?{spelling} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        );
        assert_eq!(status, 429, "{spelling} is the same tenant");
    }
}

#[test]
fn a_shaped_request_whose_client_left_is_not_sent_and_gives_its_slot_back() {
    let upstream = Upstream::start();
    // One request per second, held up to 5 s rather than refused.
    let config = Config::new()
        .route(route("shaped").limit(gcra("smooth", "1/s").key(&["route"]).set("max_delay", "5s")));
    let gateway = plain_gateway(&upstream, config);
    assert_eq!(gateway.get("/first").status, 200);
    let in_flight = || {
        support::metric(
            &gateway.metrics(),
            "sluice_requests_in_flight",
            &[("route", "shaped")],
        )
    };
    support::eventually(Duration::from_secs(10), "the first request ended", || {
        in_flight() == 0.0
    });
    // The second is held for about a second; its client leaves while it is held.
    let mut leaving = TcpStream::connect(gateway.proxy).unwrap();
    leaving
        .write_all(b"GET /abandoned HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    support::eventually(
        Duration::from_secs(10),
        "the second request is held",
        || in_flight() == 1.0,
    );
    drop(leaving);
    // Deliberate: past the abandoned request's slot (1 s after the first), so a slot given back
    // means `/next` below need not wait; more time passing only makes that easier.
    std::thread::sleep(Duration::from_millis(1500));
    // Its exchange is over: had it gone upstream, the upstream would have counted it.
    support::eventually(
        Duration::from_secs(10),
        "the abandoned request ended",
        || in_flight() == 0.0,
    );
    assert_eq!(
        upstream.served(),
        1,
        "the abandoned request never went upstream"
    );
    // Its slot went back: `/next` takes the slot after the first request's, one second from
    // now (`t=1`); had the abandoned request kept its slot, `/next` would take the one after
    // that (`t=2`). A slower machine only makes the two alike, never this check fail.
    let next = gateway.get("/next");
    assert_eq!(next.status, 200);
    let ratelimit = next.header("ratelimit").unwrap_or_default();
    assert!(ratelimit.ends_with(";t=1"), "RateLimit: {ratelimit}");
}

#[test]
fn body_and_time_limits_are_answered_413_and_504_in_problem_style() {
    let upstream = Upstream::start();
    let config = Config::new().route(
        route("limited")
            .set("max_body_bytes", 16)
            .set("request_timeout_ms", 500),
    );
    let gateway = plain_gateway(&upstream, config);
    let (status, response) = raw(
        gateway.proxy,
        b"POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 17\r\nConnection: close\r\n\r\n01234567890123456",
    );
    assert_eq!(status, 413, "{}", text(&response));
    assert!(text(&response).contains("application/problem+json"));
    let (status, response) = raw(
        gateway.proxy,
        b"POST /upload HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n10\r\n0123456789abcdef\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n",
    );
    assert!(
        status == 413 || status == 0,
        "{status}: {}",
        text(&response)
    );
    let (status, _) = raw(
        gateway.proxy,
        b"POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 16\r\nConnection: close\r\n\r\n0123456789abcdef",
    );
    assert_eq!(status, 200, "at the limit is accepted");
    let (status, response) = raw(
        gateway.proxy,
        b"GET /slow/3000 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 504, "{}", text(&response));
    assert!(
        text(&response).contains("\"title\":\"Gateway Timeout\""),
        "{}",
        text(&response)
    );
}

#[test]
fn upstream_failures_are_502_and_504_in_problem_style() {
    let upstream = Upstream::start();
    let dead = format!("127.0.0.1:{}", free_port());
    let config = Config::new()
        .route(
            route("dead")
                .prefix("/dead")
                .upstream(format!("{{ servers: [{dead}], retries: 0 }}")),
        )
        .route(
            route("slow")
                .prefix("/slow")
                .upstream("{ servers: [UPSTREAM], read_timeout_ms: 300 }"),
        );
    let gateway = plain_gateway(&upstream, config);
    let refused = gateway.get("/dead/x");
    assert_eq!(refused.status, 502);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        refused.body.contains("\"title\":\"Bad Gateway\""),
        "{}",
        refused.body
    );
    let slow = gateway.get("/slow/2000");
    assert_eq!(slow.status, 504);
    assert!(
        slow.body.contains("\"title\":\"Gateway Timeout\""),
        "{}",
        slow.body
    );
}

/// The keep-alive deadline counts from each response, however long the connection lives: a
/// client that asks 100 ms after each response is served for several deadlines' length (the
/// slow responses alone take 4.5 s), a response slower than the deadline does not count against
/// the next head, and once the client is idle the connection is closed. The pause leaves the
/// client 900 ms of slack on a loaded machine.
#[test]
fn a_busy_kept_alive_connection_gets_a_fresh_deadline_for_each_head() {
    let upstream = Upstream::start();
    let gateway = with_deadlines(&upstream, 60_000, 1000);
    let mut stream = TcpStream::connect(gateway.proxy).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for i in 0..12 {
        let path = if i % 4 == 3 { "/slow/1500" } else { "/fast" };
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        let status = support::read_one(&mut stream).map(|(status, _)| status);
        assert_eq!(status, Some(200), "request {i} ({path})");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The read ends when the gateway closes the connection; the 10 s read timeout is the test's
    // own bound for a connection left open.
    let mut rest = Vec::new();
    let closed = stream.read_to_end(&mut rest);
    assert!(
        closed.is_ok() && rest.is_empty(),
        "the idle connection stayed open or was answered: {closed:?} {}",
        text(&rest)
    );
}

/// Each deadline applies where it should: the head deadline to a new connection's first head
/// (the keep-alive one is a minute there), the keep-alive deadline to a kept-alive connection
/// (the head deadline is a minute there).
#[test]
fn slow_heads_and_idle_connections_are_closed_and_others_still_served() {
    let upstream = Upstream::start();
    let gateway = with_deadlines(&upstream, 1000, 60_000);
    let proxy = gateway.proxy;

    // 200 clients trickle a request head, one byte every 300 ms.
    let trickling: Vec<_> = (0..200)
        .map(|_| {
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(proxy).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                // Whether the gateway closed the connection before the test gives up on it
                // (10 s, far past the 1 s head deadline).
                let started = Instant::now();
                let head = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
                for byte in head.iter().cycle() {
                    if stream.write_all(&[*byte]).is_err() {
                        return true;
                    }
                    if started.elapsed() > Duration::from_secs(10) {
                        return false;
                    }
                    let mut buf = [0u8; 1];
                    match stream.read(&mut buf) {
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Ok(0) | Err(_) => return true,
                        Ok(_) => return false, // answered: a head was taken as complete
                    }
                }
                false
            })
        })
        .collect();
    // Meanwhile, ordinary clients are served. Deliberate: the tricklers get going (a head in
    // progress has no observable); the assertions hold however many have started.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..20 {
        assert_eq!(support::http_get(proxy, "/", None, &[]).status, 200);
    }
    for (i, client) in trickling.into_iter().enumerate() {
        assert!(
            client.join().unwrap(),
            "trickling client {i} was not closed"
        );
    }

    // An idle kept-alive connection is closed after keepalive_timeout.
    let gateway = with_deadlines(&upstream, 60_000, 1000);
    let mut idle = TcpStream::connect(gateway.proxy).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = Vec::new();
    // The read ends when the gateway closes the connection (its keep-alive deadline is 1 s);
    // the 10 s read timeout is the test's own bound for a connection left open.
    let closed = idle.read_to_end(&mut response);
    assert!(
        text(&response).starts_with("HTTP/1.1 200"),
        "{}",
        text(&response)
    );
    assert!(
        closed.is_ok(),
        "the idle connection stayed open: {closed:?}"
    );
}
