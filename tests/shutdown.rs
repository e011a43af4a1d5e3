//! SIGTERM as the systemd unit, the container image and the Helm chart assume it: for
//! `grace_period_seconds` the gateway keeps accepting and serving while `/readyz` answers 503
//! and HTTP/1 responses say `Connection: close`; then it stops accepting and lets requests in
//! flight finish, for up to `graceful_shutdown_timeout_seconds`, and exits (status 0) as soon as
//! none is left. SIGINT stops at once.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::{http_get, Gateway, Launch, Upstream};

/// A gateway whose SIGTERM serves `grace` seconds, then waits `timeout` seconds at most.
fn gateway(upstream: &Upstream, grace: u64, timeout: u64) -> Gateway {
    let body = format!(
        "server:\n  grace_period_seconds: {grace}\n  graceful_shutdown_timeout_seconds: {timeout}\n{}",
        Config::new().route(route("all").prefix("/")).yaml()
    );
    let launch = Launch {
        log_level: Some("info"),
        capture_log: true,
        ..Launch::default()
    };
    Gateway::launch(&body, upstream, None, &launch)
}

/// A GET of `path` sent at once, answered later: the status, or 0 when the connection closed
/// without an answer.
fn in_flight(proxy: SocketAddr, path: &str) -> std::thread::JoinHandle<u16> {
    let mut stream = TcpStream::connect(proxy).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    std::thread::spawn(move || {
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer)
            .split_whitespace()
            .nth(1)
            .and_then(|status| status.parse().ok())
            .unwrap_or(0)
    })
}

fn refuses_connections(proxy: SocketAddr) -> bool {
    TcpStream::connect_timeout(&proxy, Duration::from_millis(500)).is_err()
}

#[test]
fn sigterm_serves_through_the_grace_period_then_lets_requests_in_flight_finish() {
    let upstream = Upstream::start();
    let mut gateway = gateway(&upstream, 2, 8);
    // A request longer than the grace period is in flight when SIGTERM comes.
    let slow = in_flight(gateway.proxy, "/slow/4000");
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    gateway.signal("TERM");
    support::eventually(Duration::from_secs(2), "/readyz says it is going", || {
        let ready = http_get(gateway.admin, "/readyz", None, &[]);
        ready.status == 503 && ready.body.contains("shutting down")
    });
    // Still accepting and serving: a new connection is answered, and told not to come back.
    let during = gateway.get("/during");
    assert_eq!(during.status, 200, "served during the grace period");
    assert_eq!(
        during.header("connection"),
        Some("close"),
        "{:?}",
        during.headers
    );
    support::eventually(Duration::from_secs(10), "it stops accepting", || {
        refuses_connections(gateway.proxy)
    });
    let closed = sent.elapsed();
    assert_eq!(slow.join().unwrap(), 200, "the request in flight finished");
    let status = gateway
        .exit_within(Duration::from_secs(20))
        .expect("it exits by itself");
    let exited = sent.elapsed();
    println!("SIGTERM: stopped accepting after {closed:?}, exited after {exited:?} (grace 2 s, timeout 8 s, request 4 s)");
    assert!(status.success(), "exit status {status}");
    assert!(
        closed >= Duration::from_secs(2),
        "accepting through the grace period: closed after {closed:?}"
    );
    // It left once the last request ended, not at the end of the timeout.
    assert!(exited < Duration::from_secs(2 + 8), "{exited:?}");
    let log = gateway.log();
    assert!(log.contains("SIGTERM: stopped accepting"), "{log}");
    assert!(log.contains("SIGTERM: drained; exiting"), "{log}");
    assert!(!log.contains(" ERROR "), "{log}");
}

#[test]
fn an_idle_gateway_exits_when_its_grace_period_ends() {
    let upstream = Upstream::start();
    let mut gateway = gateway(&upstream, 1, 60);
    assert_eq!(gateway.get("/warm").status, 200);
    let sent = Instant::now();
    gateway.signal("TERM");
    let status = gateway
        .exit_within(Duration::from_secs(30))
        .expect("it exits without waiting out its 60 s timeout");
    println!("idle: exited {:?} after SIGTERM", sent.elapsed());
    assert!(status.success(), "exit status {status}");
}

#[test]
fn requests_past_the_shutdown_timeout_are_cut_and_the_process_exits() {
    let upstream = Upstream::start();
    let mut gateway = gateway(&upstream, 1, 2);
    let stuck = in_flight(gateway.proxy, "/slow/30000");
    std::thread::sleep(Duration::from_millis(300));
    gateway.signal("TERM");
    let status = gateway
        .exit_within(Duration::from_secs(20))
        .expect("it does not wait for the 30 s request");
    assert!(status.success(), "exit status {status}");
    assert_eq!(
        stuck.join().unwrap(),
        0,
        "the request outlasted the timeout: cut"
    );
    assert!(
        gateway.log().contains("still open after 2 s"),
        "{}",
        gateway.log()
    );
}

#[test]
fn sigint_stops_at_once_even_while_draining() {
    let upstream = Upstream::start();
    let mut gateway = gateway(&upstream, 60, 60);
    gateway.signal("TERM");
    support::eventually(Duration::from_secs(2), "draining", || {
        http_get(gateway.admin, "/readyz", None, &[]).status == 503
    });
    gateway.signal("INT");
    let status = gateway
        .exit_within(Duration::from_secs(10))
        .expect("SIGINT does not wait for the 60 s grace period");
    assert!(status.success(), "exit status {status}");
}
