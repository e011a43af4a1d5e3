//! What a client does wrong is the client's — not the upstream's, not the gateway's: a body
//! stalled mid-request is answered `408` (not an upstream `504`), a head with too many fields
//! `431` through the usual path (logged, counted; Pingora alone answers an empty `400`), and a
//! client that leaves before its response is counted as `closed`, shown as `499` in the access
//! log, and never logged as an ERROR. Raw sockets against the real binary.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use support::config::{route, Config, Route};
use support::{metric, read_one, Gateway, Launch, Upstream};

/// A gateway with `routes`, its access log in a file, its process log captured at `info`.
fn gateway(upstream: &Upstream, routes: Vec<Route>) -> (Gateway, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let config = routes.into_iter().fold(
        Config::new().set(
            "access_log",
            format!("{{ enabled: true, path: {} }}", log.display()),
        ),
        Config::route,
    );
    let launch = Launch {
        log_level: Some("info"),
        capture_log: true,
        ..Launch::default()
    };
    let gateway = Gateway::launch(&config.yaml(), upstream, None, &launch);
    (gateway, log, dir)
}

/// Sends `bytes` and reads until the server closes: the status (0 for none) and the answer.
fn exchange(addr: SocketAddr, bytes: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(bytes).expect("send");
    read_all(&mut stream)
}

fn read_all(stream: &mut TcpStream) -> (u16, String) {
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    (status_of(&text), text)
}

fn status_of(text: &str) -> u16 {
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn counter(gateway: &Gateway, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric(&gateway.metrics(), name, labels)
}

#[test]
fn a_stalled_request_body_is_the_clients_408_not_the_upstreams_504() {
    let upstream = Upstream::start();
    let upload = route("upload")
        .prefix("/upload")
        .upstream("{ servers: [UPSTREAM], read_timeout_ms: 300 }");
    let (gateway, log, _dir) = gateway(&upstream, vec![upload]);
    for stalled in [
        "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000000\r\n\r\n",
        "POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nhello",
    ] {
        let (status, answer) = exchange(gateway.proxy, stalled.as_bytes());
        assert_eq!(status, 408, "{answer}");
        assert!(answer.contains("\"title\":\"Request Timeout\""), "{answer}");
        assert!(answer.contains("application/problem+json"), "{answer}");
    }
    // A client that keeps sending, slowly (gaps under the read timeout), is served.
    let mut stream = TcpStream::connect(gateway.proxy).unwrap();
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 6\r\nConnection: close\r\n\r\n")
        .unwrap();
    for byte in b"steady" {
        std::thread::sleep(Duration::from_millis(100));
        stream.write_all(&[*byte]).unwrap();
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(
        read_all(&mut stream).0,
        200,
        "a steady trickle is not a stall"
    );
    // An upstream that is slow is still the upstream's 504.
    let (status, answer) = exchange(
        gateway.proxy,
        b"GET /upload/slow/2000 HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 504, "{answer}");
    let kind = |family: &str, kind: &str| {
        counter(&gateway, family, &[("route", "upload"), ("kind", kind)])
    };
    assert_eq!(kind("sluice_client_errors_total", "body_timeout"), 2.0);
    assert_eq!(
        kind("sluice_upstream_errors_total", "timeout"),
        1.0,
        "only the slow upstream"
    );
    let lines = support::json_lines(&log, 4);
    let timeouts: Vec<_> = lines.iter().filter(|l| l["status"] == 408).collect();
    assert_eq!(timeouts.len(), 2, "{lines:?}");
    for line in timeouts {
        assert_eq!(line["client_error"], "body_timeout", "{line}");
        assert!(line["error"].is_null(), "not the upstream's: {line}");
    }
    let process_log = gateway.log();
    assert!(
        process_log.contains("client stalled its request body"),
        "{process_log}"
    );
    // The slow upstream's timeout is an error of the upstream's (as nginx logs it); the stalled
    // bodies (POSTs) are not.
    let errors: Vec<&str> = process_log
        .lines()
        .filter(|line| line.contains(" ERROR "))
        .collect();
    assert!(
        errors.iter().all(|line| !line.contains("POST /upload")),
        "{errors:?}"
    );
}

/// A GET with `fields` header fields in all (`Host` among them), then `tail`.
fn request_with_fields(fields: usize, tail: &str) -> String {
    let mut request = String::from("GET /fields HTTP/1.1\r\nHost: localhost\r\n");
    for i in 1..fields {
        request.push_str(&format!("x-h{i}: v\r\n"));
    }
    request.push_str(tail);
    request
}

#[test]
fn too_many_header_fields_are_431_logged_and_counted() {
    let upstream = Upstream::start();
    let (gateway, log, _dir) = gateway(&upstream, vec![route("all").prefix("/")]);
    let close = "Connection: close\r\n\r\n";
    let (status, answer) = exchange(gateway.proxy, request_with_fields(10_000, close).as_bytes());
    assert_eq!(status, 431, "{answer}");
    assert!(
        answer.contains("\"title\":\"Request Header Fields Too Large\""),
        "{answer}"
    );
    // The bound: 257 fields are too many; fewer pass (the demo upstream, Pingora too, takes
    // 256 with the forwarding headers sluice adds: 240 here).
    let (status, _) = exchange(gateway.proxy, request_with_fields(239, close).as_bytes());
    assert_eq!(status, 200, "240 fields (Connection included)");
    let (status, _) = exchange(gateway.proxy, request_with_fields(256, close).as_bytes());
    assert_eq!(status, 431, "257 fields");
    // A body declared past the cut is never read as a request of its own.
    let smuggled = "GET /smuggled HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let tail = format!("Content-Length: {}\r\n\r\n{smuggled}", smuggled.len());
    let (status, answer) = exchange(gateway.proxy, request_with_fields(300, &tail).as_bytes());
    assert_eq!(status, 431, "{answer}");
    assert_eq!(
        answer.matches("HTTP/1.1 ").count(),
        1,
        "one answer: {answer}"
    );
    // On a kept-alive connection, the next head is counted afresh.
    let mut stream = TcpStream::connect(gateway.proxy).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /first HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 12];
    stream.read_exact(&mut first).unwrap();
    assert_eq!(&first[9..12], b"200");
    std::thread::sleep(Duration::from_millis(200));
    let mut rest = [0u8; 4096];
    let _ = stream.read(&mut rest);
    stream
        .write_all(request_with_fields(5_000, close).as_bytes())
        .unwrap();
    let (_, answer) = read_all(&mut stream);
    assert!(answer.contains(" 431 "), "{answer}");
    assert_eq!(
        upstream.served(),
        2,
        "only the 240-field request and the first one"
    );
    let bad = counter(
        &gateway,
        "sluice_requests_total",
        &[("route", "_unmatched"), ("decision", "bad_request")],
    );
    assert_eq!(bad, 4.0, "every 431 counted");
    let logged = support::json_lines(&log, 6);
    assert_eq!(
        logged.iter().filter(|l| l["status"] == 431).count(),
        4,
        "{logged:?}"
    );
}

#[test]
fn a_client_that_leaves_before_its_response_is_counted_499_and_not_an_error() {
    const CLIENTS: usize = 10;
    let upstream = Upstream::start();
    let (gateway, log, _dir) = gateway(&upstream, vec![route("slow").prefix("/slow")]);
    let leaving: Vec<TcpStream> = (0..CLIENTS)
        .map(|_| {
            let mut stream = TcpStream::connect(gateway.proxy).unwrap();
            stream
                .write_all(b"GET /slow/3000 HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .unwrap();
            stream
        })
        .collect();
    support::eventually(Duration::from_secs(10), "every request in flight", || {
        counter(&gateway, "sluice_requests_in_flight", &[("route", "slow")]) == CLIENTS as f64
    });
    drop(leaving);
    support::eventually(Duration::from_secs(10), "every departure counted", || {
        counter(
            &gateway,
            "sluice_client_errors_total",
            &[("route", "slow"), ("kind", "closed")],
        ) == CLIENTS as f64
    });
    assert_eq!(
        counter(
            &gateway,
            "sluice_upstream_errors_total",
            &[("route", "slow")]
        ),
        0.0,
        "not the upstream's"
    );
    let logged = support::json_lines(&log, CLIENTS);
    assert_eq!(logged.len(), CLIENTS, "{logged:?}");
    for line in &logged {
        assert_eq!(line["status"], 499, "{line}");
        assert_eq!(line["client_error"], "closed", "{line}");
        assert!(line["error"].is_null(), "{line}");
    }
    // One that leaves in the middle of its head is no error either.
    let mut half = TcpStream::connect(gateway.proxy).unwrap();
    half.write_all(b"GET /slow/1 HTTP/1.1\r\nHost: loc")
        .unwrap();
    drop(half);
    std::thread::sleep(Duration::from_millis(300));
    let process_log = gateway.log();
    assert!(!process_log.contains(" ERROR "), "{process_log}");
}

/// A 504 storm at a client that reuses its connection unless an answer says
/// `Connection: close`: every `504` says it (Pingora closes the connection after any failure),
/// and each request after one succeeds on a new connection; none fails.
#[test]
fn an_answer_after_which_the_connection_closes_says_so() {
    let upstream = Upstream::start();
    let slow = route("slow")
        .prefix("/slow")
        .upstream("{ servers: [UPSTREAM], read_timeout_ms: 200 }");
    let (gateway, _log, _dir) = gateway(&upstream, vec![slow, route("fast").prefix("/")]);
    let connect = || {
        let stream = TcpStream::connect(gateway.proxy).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    };
    let mut stream = connect();
    let mut answers = Vec::new();
    for i in 0..20 {
        let path = if i % 2 == 0 { "/slow/1000" } else { "/fast" };
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let answer = stream
            .write_all(request.as_bytes())
            .ok()
            .and_then(|()| read_one(&mut stream));
        let Some((status, head)) = answer else {
            panic!("request {i} ({path}) failed on a connection kept alive: {answers:?}");
        };
        let closes = head.contains("\r\nconnection: close\r\n");
        assert!(
            closes || head.contains("\r\nconnection: keep-alive\r\n"),
            "{head}"
        );
        if closes {
            // It says close, and closes.
            let mut rest = [0u8; 1];
            assert_eq!(stream.read(&mut rest).ok(), Some(0), "closed after {path}");
            stream = connect();
        }
        answers.push((status, closes));
    }
    let expected: Vec<(u16, bool)> = (0..20)
        .map(|i| {
            if i % 2 == 0 {
                (504, true)
            } else {
                (200, false)
            }
        })
        .collect();
    assert_eq!(answers, expected);
}

/// A target over the gateway's 8 KiB — 70,000 bytes, more than Pingora's URI type holds (it
/// answered an empty `400` of its own) — is the gateway's `414`: a problem body,
/// `Connection: close`, counted and logged as a bad request, and the connection closed. So is
/// one that Pingora could have read (9,000 bytes), on a kept-alive connection.
#[test]
fn a_target_too_long_is_the_gateways_414_and_closes_the_connection() {
    let upstream = Upstream::start();
    let (gateway, log, _dir) = gateway(&upstream, vec![route("all").prefix("/")]);
    for length in [70_000, 9_000] {
        let target = format!("/{}", "a".repeat(length - 1));
        let (status, answer) = exchange(
            gateway.proxy,
            format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
        );
        assert_eq!(status, 414, "{length}: {answer}");
        let head = answer.to_ascii_lowercase();
        assert!(
            head.contains("\r\ncontent-type: application/problem+json\r\n")
                && head.contains("\r\nconnection: close\r\n"),
            "{answer}"
        );
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let problem: serde_json::Value = serde_json::from_str(body).expect("a JSON problem");
        assert_eq!(
            (&problem["status"], &problem["title"]),
            (&414.into(), &"URI Too Long".into())
        );
    }
    // Past 1 MiB of target beyond the 8 KiB kept, the head is ended where that bound is reached:
    // Pingora's own `400` (as for any head over 1 MiB); the admin listener closes the connection.
    // (The request ends at the bound, so nothing sent is left unread to reset the connection.)
    let endless = format!("GET /{}", "a".repeat(8 * 1024 - 1 + (1 << 20) + 1));
    assert_eq!(sent_anyway(gateway.proxy, endless.as_bytes()), 400);
    assert_eq!(sent_anyway(gateway.admin, endless.as_bytes()), 0);
    assert_eq!(upstream.served(), 0);
    let bad = counter(
        &gateway,
        "sluice_requests_total",
        &[("route", "_unmatched"), ("decision", "bad_request")],
    );
    assert_eq!(bad, 2.0, "the two 414s counted");
    let logged = support::json_lines(&log, 2);
    assert!(logged.iter().all(|l| l["status"] == 414), "{logged:?}");
}

/// The admin listener reads heads as the proxy does: a 70,000-byte target gets `414` and 300
/// header fields `431`, each a problem, with `Connection: close`, the connection then closed;
/// it still serves a request within the bounds.
#[test]
fn the_admin_listener_answers_414_and_431_before_closing() {
    let upstream = Upstream::start();
    let (gateway, _log, _dir) = gateway(&upstream, vec![route("all").prefix("/")]);
    let target = format!("/metrics?{}", "a".repeat(70_000));
    let too_long = format!("GET {target} HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let mut too_many = String::from("GET /metrics HTTP/1.1\r\nHost: localhost\r\n");
    for i in 0..300 {
        too_many.push_str(&format!("x-h{i}: v\r\n"));
    }
    too_many.push_str("\r\n");
    for (request, expected, title) in [
        (too_long, 414, "URI Too Long"),
        (too_many, 431, "Request Header Fields Too Large"),
    ] {
        let (status, answer) = exchange(gateway.admin, request.as_bytes());
        assert_eq!(status, expected, "{answer}");
        let head = answer.to_ascii_lowercase();
        assert!(
            head.contains("\r\ncontent-type: application/problem+json\r\n")
                && head.contains("\r\nconnection: close\r\n"),
            "{answer}"
        );
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let problem: serde_json::Value = serde_json::from_str(body).expect("a JSON problem");
        assert_eq!(
            (&problem["status"], &problem["title"]),
            (&expected.into(), &title.into())
        );
    }
    let (status, _) = exchange(
        gateway.admin,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
}

/// Sends `bytes` (the server may stop reading and close before all are sent) and reads until it
/// closes: the status it answered, 0 for none.
fn sent_anyway(addr: SocketAddr, bytes: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    status_of(&String::from_utf8_lossy(&answer))
}
