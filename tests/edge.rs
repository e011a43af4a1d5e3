//! The edge, driven by the clients operators' users run: TLS listeners (`curl --cacert --resolve`,
//! `openssl s_client` for protocol versions, ALPN and which certificate answers which name),
//! certificates swapped by SIGHUP under load, HTTP/2 over ALPN and in the clear (limits per
//! stream), HTTPS upstreams (verification, mTLS), gRPC (tonic), WebSockets (tungstenite) and
//! Redis over TLS. Every certificate is made by the test; no private key is committed.

mod support;

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::certs::{Issued, TestCa};
use support::config::{route, Config};
use support::limits::{concurrency, fixed_window};
use support::{check_config, free_port, metric, spawn_redis, Gateway, RedisServer, Upstream};

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A TLS listener's YAML value on `port` with these certificates, the first the default.
fn tls_listener(port: u16, certificates: &[&Issued], extra: &str) -> String {
    let pairs: Vec<String> = certificates
        .iter()
        .map(|c| format!("{{ cert: {}, key: {} }}", c.cert.display(), c.key.display()))
        .collect();
    format!(
        "{{ addr: 127.0.0.1:{port}, tls: {{ certificates: [{}]{extra} }} }}",
        pairs.join(", ")
    )
}

/// Runs curl (silent but for errors, 10 s at most) with `args`.
fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "10"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run curl ({e}): scripts/test.sh installs it"))
}

/// curl's `-w` lines for these URLs: `%{http_version} %{response_code}` per transfer.
fn curl_statuses(args: &[&str]) -> Vec<String> {
    let mut all = vec!["-w", "%{http_version} %{response_code}\\n"];
    for _ in args.iter().filter(|a| a.starts_with("http")) {
        all.extend(["-o", "/dev/null"]);
    }
    all.extend_from_slice(args);
    let out = curl(&all);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// `openssl s_client` to `port` (stdin closed, so it leaves after the handshake); stdout and
/// stderr together, and whether it succeeded.
fn s_client(port: u16, args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}): scripts/test.sh installs it"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // A failed handshake prints `Cipher is (NONE)`.
    let handshaken = text.contains("Cipher is") && !text.contains("Cipher is (NONE)");
    (handshaken, text)
}

/// The leaf certificate a `s_client` transcript shows, as PEM.
fn served_certificate(transcript: &str) -> String {
    let begin = transcript
        .find("-----BEGIN CERTIFICATE-----")
        .unwrap_or_else(|| panic!("no certificate in:\n{transcript}"));
    let end = transcript[begin..]
        .find("-----END CERTIFICATE-----")
        .expect("end of the certificate")
        + begin
        + "-----END CERTIFICATE-----".len();
    transcript[begin..end].replace("\r\n", "\n")
}

fn pem_of(issued: &Issued) -> String {
    std::fs::read_to_string(&issued.cert)
        .expect("certificate file")
        .trim()
        .replace("\r\n", "\n")
}

fn resolve(name: &str, port: u16) -> String {
    format!("{name}:{port}:127.0.0.1")
}

#[test]
fn a_tls_listener_answers_each_name_with_its_certificate_over_tls_1_2_and_1_3_only() {
    let ca = TestCa::new();
    let site = ca.issue("site", &["site.test"], &[]);
    let api = ca.issue("api", &["api.test"], &[]);
    let wild = ca.issue("wild", &["*.wild.test"], &[]);
    let upstream = Upstream::start();
    let (tls_port, h1_only) = (free_port(), free_port());
    let config = Config::new()
        .listen(&[
            "PROXY",
            &tls_listener(tls_port, &[&site, &api, &wild], ""),
            &tls_listener(h1_only, &[&site], ", http2: false"),
        ])
        .route(route("all"));
    let _gateway = Gateway::start(&config.yaml(), &upstream, None);

    // curl checks the chain against the test CA and the name against the certificate.
    let ca_file = ca.ca.to_str().unwrap();
    for name in ["site.test", "api.test", "a.wild.test"] {
        let url = format!("https://{name}:{tls_port}/hello");
        let out = curl(&[
            "--cacert",
            ca_file,
            "--resolve",
            &resolve(name, tls_port),
            &url,
        ]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let echoed = String::from_utf8_lossy(&out.stdout);
        assert!(echoed.contains("GET /hello"), "{echoed}");
        assert!(echoed.contains("x-forwarded-proto: https"), "{echoed}");
        assert!(echoed.contains("proto=https"), "{echoed}");
    }

    // Which certificate answers which name: exact, wildcard, unknown and no SNI (the first).
    for (sni, expected) in [
        (Some("api.test"), &api),
        (Some("b.wild.test"), &wild),
        (Some("API.TEST"), &api),
        (Some("unknown.test"), &site),
        (None, &site),
    ] {
        let sni_args = match sni {
            Some(name) => vec!["-servername", name],
            None => vec!["-noservername"],
        };
        let (ok, transcript) = s_client(tls_port, &sni_args);
        assert!(ok, "{sni:?}: {transcript}");
        assert_eq!(
            served_certificate(&transcript),
            pem_of(expected),
            "for {sni:?}"
        );
    }

    // TLS 1.2 and 1.3 are spoken; 1.1 and 1.0 are refused by the server (the client is told
    // to allow them: OpenSSL 3 refuses them by itself at its default security level).
    for version in ["-tls1_2", "-tls1_3"] {
        let (ok, transcript) = s_client(tls_port, &[version, "-servername", "site.test"]);
        assert!(ok, "{version}: {transcript}");
    }
    for version in ["-tls1_1", "-tls1"] {
        let (ok, transcript) = s_client(
            tls_port,
            &[
                version,
                "-cipher",
                "DEFAULT@SECLEVEL=0",
                "-servername",
                "site.test",
            ],
        );
        assert!(!ok, "{version} was accepted: {transcript}");
        // rustls answers a pre-1.2 ClientHello with an alert (handshake failure).
        assert!(
            transcript.contains("alert handshake failure")
                || transcript.contains("alert protocol version"),
            "{version}: not refused by the server: {transcript}"
        );
    }

    // ALPN: h2 (or http/1.1) unless the listener says `http2: false`: then nothing is
    // negotiated, which every client takes as HTTP/1.1.
    let (_, transcript) = s_client(
        tls_port,
        &["-alpn", "h2,http/1.1", "-servername", "site.test"],
    );
    assert!(transcript.contains("ALPN protocol: h2"), "{transcript}");
    let (_, transcript) = s_client(
        h1_only,
        &["-alpn", "h2,http/1.1", "-servername", "site.test"],
    );
    assert!(transcript.contains("No ALPN negotiated"), "{transcript}");
    let (_, transcript) = s_client(tls_port, &["-alpn", "http/1.1", "-servername", "site.test"]);
    assert!(
        transcript.contains("ALPN protocol: http/1.1"),
        "{transcript}"
    );
    let url = format!("https://site.test:{h1_only}/");
    let versions = curl_statuses(&[
        "--http2",
        "--cacert",
        ca_file,
        "--resolve",
        &resolve("site.test", h1_only),
        &url,
    ]);
    assert_eq!(versions, ["1.1 200"]);
}

#[test]
fn http2_limits_count_each_stream_over_tls_and_in_the_clear() {
    let ca = TestCa::new();
    let site = ca.issue("site", &["site.test"], &[]);
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let (tls_port, h2c_port) = (free_port(), free_port());
    let config = Config::new()
        .listen(&[
            "PROXY",
            &tls_listener(tls_port, &[&site], ""),
            &format!("{{ addr: 127.0.0.1:{h2c_port}, h2c: true }}"),
        ])
        .redis(redis.url())
        .route(
            route("slow")
                .prefix("/slow")
                .limit(concurrency("in-flight", 1).key(&["route"])),
        )
        .route(
            route("tls")
                .prefix("/tls")
                .limit(fixed_window("tls", "3/h").key(&["route"])),
        )
        .route(
            route("h2c")
                .prefix("/h2c")
                .limit(fixed_window("h2c", "3/h").key(&["route"])),
        )
        .route(route("rest").limit(fixed_window("rest", "1000/h").key(&["route"])));
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    let ca_file = ca.ca.to_str().unwrap();
    let resolved = resolve("site.test", tls_port);

    // Five requests on one HTTP/2 connection: five streams, five decisions.
    let url = format!("https://site.test:{tls_port}/tls");
    let mut args = vec!["--http2", "--cacert", ca_file, "--resolve", &resolved];
    args.extend([url.as_str(); 5]);
    assert_eq!(
        curl_statuses(&args),
        ["2 200", "2 200", "2 200", "2 429", "2 429"]
    );
    // In the clear, one connection per request: curl 7.88 cannot reuse a prior-knowledge
    // connection (its second request fails on any server); the gRPC test sends several calls
    // over one cleartext connection.
    let url = format!("http://127.0.0.1:{h2c_port}/h2c");
    let statuses: Vec<String> = (0..5)
        .flat_map(|_| curl_statuses(&["--http2-prior-knowledge", &url]))
        .collect();
    assert_eq!(statuses, ["2 200", "2 200", "2 200", "2 429", "2 429"]);
    // A plain HTTP/1.1 client on the h2c listener is still served.
    assert_eq!(
        curl_statuses(&[&format!("http://127.0.0.1:{h2c_port}/other")]),
        ["1.1 200"]
    );

    // The 429 and its headers over HTTP/2.
    let out = curl(&[
        "--http2",
        "-i",
        "--cacert",
        ca_file,
        "--resolve",
        &resolved,
        &format!("https://site.test:{tls_port}/tls"),
    ]);
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.starts_with("http/2 429"), "{head}");
    for header in [
        "retry-after:",
        "ratelimit:",
        "ratelimit-policy:",
        "content-type: application/problem+json",
    ] {
        assert!(head.contains(header), "no {header} in {head}");
    }
    // ... and RateLimit headers on allowed HTTP/2 answers too.
    let out = curl(&[
        "--http2-prior-knowledge",
        "-i",
        &format!("http://127.0.0.1:{h2c_port}/free"),
    ]);
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(head.contains("ratelimit: "), "{head}");

    // Concurrency counts streams: three multiplexed on one connection, one slot.
    let url = format!("https://site.test:{tls_port}/slow/1500");
    let out = curl(&[
        "--http2",
        "--parallel",
        "--parallel-max",
        "3",
        "--cacert",
        ca_file,
        "--resolve",
        &resolved,
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version} %{response_code} %{num_connects}\\n",
        &url,
        &url,
        &url,
    ]);
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let mut statuses: Vec<&str> = lines.iter().map(|l| &l[..5]).collect();
    statuses.sort();
    assert_eq!(statuses, ["2 200", "2 429", "2 429"], "{lines:?}");
    let connects: u32 = lines
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u32>().ok())
        .sum();
    assert_eq!(connects, 1, "the streams shared one connection: {lines:?}");
}

#[test]
fn a_certificate_swapped_by_sighup_under_load_fails_no_request_and_a_bad_pair_is_refused() {
    let ca = TestCa::new();
    let first = ca.issue("site", &["site.test"], &[]);
    let upstream = Upstream::start();
    let tls_port = free_port();
    let config = Config::new()
        .listen(&["PROXY", &tls_listener(tls_port, &[&first], "")])
        .route(route("all"));
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    let ca_file = ca.ca.to_str().unwrap().to_string();
    let url = format!("https://site.test:{tls_port}/");
    let resolved = resolve("site.test", tls_port);

    // Clients making a new TLS connection for every request, and one keeping its connection.
    let stop = Arc::new(AtomicBool::new(false));
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handshakers: Vec<_> = (0..3)
        .map(|_| {
            let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
            let (ca_file, url, resolved) = (ca_file.clone(), url.clone(), resolved.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let out = curl_statuses(&["--cacert", &ca_file, "--resolve", &resolved, &url]);
                    // curl asks for HTTP/2 over TLS by default.
                    if out == ["2 200"] {
                        served.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                        eprintln!("a new-connection request failed: {out:?}");
                    }
                }
            })
        })
        .collect();
    let kept = {
        let (ca_file, url, resolved) = (ca_file.clone(), url.clone(), resolved.clone());
        std::thread::spawn(move || {
            let mut args = vec![
                "--http2",
                "--rate",
                "20/s",
                "--cacert",
                &ca_file,
                "--resolve",
                &resolved,
            ];
            args.extend([url.as_str(); 60]);
            curl_statuses(&args)
        })
    };

    let served_at_least = |n: usize, what: &str| {
        support::eventually(Duration::from_secs(20), what, || {
            served.load(Ordering::Relaxed) >= n
        })
    };
    served_at_least(8, "new-connection requests on the first certificate");
    // Rotation: new files in place, then SIGHUP.
    let second = ca.issue("site", &["site.test"], &[]);
    assert!(
        gateway.reload(&config.yaml()),
        "the reload with a new certificate"
    );
    served_at_least(
        served.load(Ordering::Relaxed) + 8,
        "new-connection requests after the swap",
    );
    let (_, transcript) = s_client(tls_port, &["-servername", "site.test"]);
    assert_eq!(
        served_certificate(&transcript),
        pem_of(&second),
        "the new certificate is served"
    );

    // A key that does not match its certificate: the reload fails, the running pair stays.
    let other = ca.issue("other", &["site.test"], &[]);
    std::fs::copy(&other.key, &second.key).unwrap();
    assert!(
        !gateway.reload(&config.yaml()),
        "a mismatched pair is refused"
    );
    served_at_least(
        served.load(Ordering::Relaxed) + 8,
        "new-connection requests after the refused reload",
    );
    stop.store(true, Ordering::Relaxed);
    for thread in handshakers {
        thread.join().unwrap();
    }
    let kept = kept.join().unwrap();
    let (_, transcript) = s_client(tls_port, &["-servername", "site.test"]);
    assert_eq!(
        served_certificate(&transcript),
        pem_of(&second),
        "still the good pair"
    );

    let (served, failed) = (
        served.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    assert_eq!(
        failed,
        0,
        "{failed} of {} new-connection requests failed",
        served + failed
    );
    assert!(served > 20, "only {served} requests were made");
    assert_eq!(kept.len(), 60);
    assert!(
        kept.iter().all(|line| line == "2 200"),
        "keep-alive client: {kept:?}"
    );
    assert_eq!(
        metric(
            &gateway.metrics(),
            "sluice_config_reloads_total",
            &[("result", "error")]
        ),
        1.0
    );
}

/// `sluice -t` on a config whose only listener serves `issued`.
fn check_listener(dir: &Path, issued: &Issued) -> (bool, String) {
    check_config(
        dir,
        &format!(
            "listen:\n  - {}\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: {{ servers: [127.0.0.1:1] }}\n",
            tls_listener(1, &[issued], "")
        ),
    )
}

/// `sluice -t` on a config whose only route's upstream has this `tls:` value.
fn check_upstream_tls(dir: &Path, tls: &str) -> (bool, String) {
    check_config(
        dir,
        &format!(
            "listen: [127.0.0.1:1]\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: {{ servers: [127.0.0.1:1], tls: {tls} }}\n"
        ),
    )
}

#[test]
fn sluice_t_refuses_a_key_that_does_not_match_and_warns_of_expiry_within_14_days() {
    let ca = TestCa::new();
    let good = ca.issue("good", &["site.test"], &[]);
    let (ok, stderr) = check_listener(ca.dir.path(), &good);
    assert!(ok && !stderr.contains("warning"), "{stderr}");

    let soon = ca.issue_for("soon", &["site.test"], &[], 3);
    let (ok, stderr) = check_listener(ca.dir.path(), &soon);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("soon.pem expires in"), "{stderr}");

    let other = ca.issue("other", &["site.test"], &[]);
    let mismatched = Issued {
        cert: good.cert.clone(),
        key: other.key.clone(),
    };
    let (ok, stderr) = check_listener(ca.dir.path(), &mismatched);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("listen[0].tls.certificates[0]") && stderr.contains("does not match"),
        "{stderr}"
    );

    let missing = Issued {
        cert: ca.dir.path().join("absent.pem"),
        key: good.key.clone(),
    };
    let (ok, stderr) = check_listener(ca.dir.path(), &missing);
    assert!(!ok && stderr.contains("absent.pem"), "{stderr}");

    // The files of an HTTPS upstream are read by -t too.
    let dir = ca.dir.path();
    let (ok, stderr) =
        check_upstream_tls(dir, &format!("{{ sni: a.test, ca: {} }}", ca.ca.display()));
    assert!(ok, "{stderr}");
    let (ok, stderr) = check_upstream_tls(
        dir,
        &format!("{{ sni: a.test, ca: {} }}", good.key.display()),
    );
    assert!(
        !ok && stderr.contains("routes[0].upstream") && stderr.contains("no certificate"),
        "{stderr}"
    );
    let (ok, stderr) = check_upstream_tls(
        dir,
        &format!(
            "{{ sni: a.test, cert: {}, key: {} }}",
            good.cert.display(),
            dir.join("absent.key").display()
        ),
    );
    assert!(!ok && stderr.contains("absent.key"), "{stderr}");
}

#[test]
fn an_idle_http2_connection_is_closed_after_the_keepalive_timeout() {
    use std::io::{Read, Write};
    let upstream = Upstream::start();
    let h2c_port = free_port();
    let config = Config::new()
        .server("keepalive_timeout_ms", 1000)
        .listen(&[
            "PROXY",
            &format!("{{ addr: 127.0.0.1:{h2c_port}, h2c: true }}"),
        ])
        .route(route("all"));
    let _gateway = Gateway::start(&config.yaml(), &upstream, None);
    let mut stream = TcpStream::connect((LOOPBACK, h2c_port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    // The client preface and an empty SETTINGS frame, then nothing.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .unwrap();
    let mut received = Vec::new();
    let closed = stream.read_to_end(&mut received);
    assert!(
        closed.is_ok(),
        "the idle connection was not closed: {closed:?}"
    );
    assert!(!received.is_empty(), "the server's SETTINGS came first");
}

/// `openssl s_server -www` on a free port: an HTTPS server with `issued`, asking for a client
/// certificate signed by `client_ca` when given. Reaped on drop.
struct HttpsServer {
    child: Child,
    port: u16,
}

impl HttpsServer {
    fn start(issued: &Issued, client_ca: Option<&Path>) -> HttpsServer {
        let port = free_port();
        let mut command = Command::new("openssl");
        command
            .args(["s_server", "-www", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&issued.cert)
            .arg("-key")
            .arg(&issued.key);
        if let Some(ca) = client_ca {
            command
                .args(["-Verify", "1", "-verify_return_error", "-CAfile"])
                .arg(ca);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start openssl s_server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((LOOPBACK, port)).is_err() {
            assert!(Instant::now() < deadline, "openssl s_server did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        HttpsServer { child, port }
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn https_upstreams_are_verified_by_ca_and_name_and_can_present_a_client_certificate() {
    let ca = TestCa::new();
    let stranger = TestCa::new();
    let backend = ca.issue("backend", &["backend.test"], &[LOOPBACK]);
    let client = ca.issue("client", &["gateway.test"], &[]);
    let plain = HttpsServer::start(&backend, None);
    let mutual = HttpsServer::start(&backend, Some(&ca.ca));
    let upstream = Upstream::start();
    let tls_route = |name: &str, port: u16, tls: String| {
        route(name).prefix(&format!("/{name}")).upstream(format!(
            "{{ servers: [127.0.0.1:{port}], retries: 0, tls: {tls} }}"
        ))
    };
    let ca_file = ca.ca.display().to_string();
    let config = Config::new()
        .route(tls_route(
            "verified",
            plain.port,
            format!("{{ sni: backend.test, ca: {ca_file} }}"),
        ))
        .route(tls_route(
            "by-address",
            plain.port,
            format!("{{ ca: {ca_file} }}"),
        ))
        .route(tls_route(
            "unverified",
            plain.port,
            "{ sni: backend.test, verify: false }".into(),
        ))
        .route(tls_route(
            "other-ca",
            plain.port,
            format!("{{ sni: backend.test, ca: {} }}", stranger.ca.display()),
        ))
        .route(tls_route(
            "other-name",
            plain.port,
            format!("{{ sni: other.test, ca: {ca_file} }}"),
        ))
        .route(tls_route(
            "mtls",
            mutual.port,
            format!(
                "{{ sni: backend.test, ca: {ca_file}, cert: {}, key: {} }}",
                client.cert.display(),
                client.key.display()
            ),
        ))
        .route(tls_route(
            "anonymous",
            mutual.port,
            format!("{{ sni: backend.test, ca: {ca_file} }}"),
        ));
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    for (path, status) in [
        ("/verified", 200),
        ("/by-address", 200),
        ("/unverified", 200),
        ("/other-ca", 502),
        ("/other-name", 502),
        ("/mtls", 200),
        ("/anonymous", 502),
    ] {
        let response = gateway.get(path);
        assert_eq!(response.status, status, "{path}: {}", response.body);
        if status == 200 {
            // `openssl s_server -www` answers with a page about the TLS session.
            assert!(
                response.body.contains("s_server"),
                "{path}: {}",
                response.body
            );
        }
    }
}

/// A gRPC health service (tonic) on a free port, served until the runtime drops.
fn grpc_health_server(runtime: &tokio::runtime::Runtime) -> SocketAddr {
    // The server takes the socket bound here: none is released and bound again.
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((LOOPBACK, 0)))
        .expect("bind the gRPC server");
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move {
        let (_reporter, service) = tonic_health::server::health_reporter();
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .expect("gRPC server");
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "the gRPC server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    addr
}

#[test]
fn a_limited_grpc_call_gets_resource_exhausted_and_a_dead_upstream_unavailable() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = grpc_health_server(&runtime);
    let upstream = Upstream::start();
    let h2c_port = free_port();
    let config = Config::new()
        .listen(&[
            "PROXY",
            &format!("{{ addr: 127.0.0.1:{h2c_port}, h2c: true }}"),
        ])
        .route(
            route("check")
                .prefix("/grpc.health.v1.Health/Check")
                .upstream(format!("{{ servers: [{server}], http2: true }}"))
                .limit(fixed_window("calls", "2/h").key(&["route"])),
        )
        .route(
            route("watch")
                .prefix("/grpc.health.v1.Health/Watch")
                .upstream(format!(
                    "{{ servers: [127.0.0.1:{}], http2: true, retries: 0 }}",
                    free_port()
                )),
        );
    let _gateway = Gateway::start(&config.yaml(), &upstream, None);

    runtime.block_on(async {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{h2c_port}"))
                .expect("a channel URI")
                .connect()
                .await
                .expect("connect through the gateway");
        let mut client = HealthClient::new(channel);
        for _ in 0..2 {
            let answer = client
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .expect("an allowed call reaches the server");
            assert_eq!(answer.into_inner().status, ServingStatus::Serving as i32);
        }
        let limited = client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect_err("the third call is limited");
        assert_eq!(
            limited.code(),
            tonic::Code::ResourceExhausted,
            "{limited:?}"
        );
        assert!(
            limited.message().contains("rate limit 'calls'"),
            "{limited:?}"
        );
        let pushback: u64 = limited
            .metadata()
            .get("grpc-retry-pushback-ms")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .expect("grpc-retry-pushback-ms");
        assert!(pushback > 0 && pushback <= 3_600_000, "{pushback}");
        assert!(limited.metadata().get("ratelimit").is_some(), "{limited:?}");

        let unavailable = client
            .watch(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect_err("the watch route's server is down");
        assert_eq!(
            unavailable.code(),
            tonic::Code::Unavailable,
            "{unavailable:?}"
        );
    });
}

/// A WebSocket echo server: echoes messages, closes the socket when told `bye`.
fn websocket_echo_server() -> SocketAddr {
    let listener = TcpListener::bind((LOOPBACK, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(mut socket) = tungstenite::accept(stream) else {
                    return;
                };
                while let Ok(message) = socket.read() {
                    if message.to_text().is_ok_and(|t| t == "bye") {
                        let _ = socket.close(None);
                    } else if message.is_text() && socket.send(message).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

type Socket = tungstenite::WebSocket<TcpStream>;

/// Opens a WebSocket through the gateway: the socket, or the HTTP status it was refused with.
fn open_socket(gateway: &Gateway) -> Result<Socket, u16> {
    let stream = TcpStream::connect(gateway.proxy).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match tungstenite::client(format!("ws://{}/ws/echo", gateway.proxy), stream) {
        Ok((socket, response)) => {
            assert_eq!(response.status(), 101);
            Ok(socket)
        }
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("WebSocket handshake: {e}"),
    }
}

/// Waits (5 s at most) until a socket can be opened again: the slot was given back.
fn reopen_within(gateway: &Gateway, what: &str) -> Socket {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match open_socket(gateway) {
            Ok(socket) => return socket,
            Err(429) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(status) => panic!("{what}: still refused ({status})"),
        }
    }
}

fn echo(socket: &mut Socket, text: &str) {
    socket.send(tungstenite::Message::text(text)).unwrap();
    let answer = socket.read().unwrap();
    assert_eq!(answer.to_text().unwrap(), text);
}

/// Reads until the socket is closed (the closing handshake done).
fn drain(socket: &mut Socket) {
    while socket.read().is_ok() {}
}

#[test]
fn a_websocket_holds_its_concurrency_slot_until_either_side_closes() {
    let echo_server = websocket_echo_server();
    let upstream = Upstream::start();
    let redis = RedisServer::start();
    let config = Config::new().redis(redis.url()).route(
        route("sockets")
            .prefix("/ws")
            .servers(&[echo_server])
            .limit(concurrency("sockets", 1).key(&["route"])),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();

    let mut first = open_socket(&gateway).expect("the first socket");
    echo(&mut first, "hello");
    // Deliberate: a socket open a while still holds its slot; any length of pause will do.
    std::thread::sleep(Duration::from_millis(300));
    echo(&mut first, "still here");
    assert_eq!(open_socket(&gateway).err(), Some(429), "the slot is held");

    // The client closes: the slot comes back.
    first.close(None).unwrap();
    drain(&mut first);
    let mut second = reopen_within(&gateway, "after the client closed");
    echo(&mut second, "again");
    assert_eq!(open_socket(&gateway).err(), Some(429));

    // The server closes: the slot comes back too.
    second.send(tungstenite::Message::text("bye")).unwrap();
    drain(&mut second);
    let mut third = reopen_within(&gateway, "after the server closed");
    echo(&mut third, "once more");
}

/// A redis-server that speaks only TLS and asks for a client certificate signed by `ca`.
fn redis_over_tls(ca: &TestCa, server: &Issued) -> (Child, u16) {
    let port = free_port();
    let mut args = support::redis_args(0);
    let (port_text, cert, key, ca_file) = (
        port.to_string(),
        server.cert.display().to_string(),
        server.key.display().to_string(),
        ca.ca.display().to_string(),
    );
    args.extend(
        [
            "--tls-port",
            &port_text,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            "yes",
        ]
        .map(String::from),
    );
    let child = spawn_redis(&args);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect((LOOPBACK, port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server did not listen on its TLS port"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, port)
}

#[test]
fn limits_are_kept_in_a_redis_reached_over_tls_with_a_client_certificate() {
    let ca = TestCa::new();
    let server = ca.issue("redis", &["redis.test"], &[LOOPBACK]);
    let client = ca.issue("client", &["gateway.test"], &[]);
    let (mut redis, port) = redis_over_tls(&ca, &server);
    let upstream = Upstream::start();
    let config = Config::new()
        .redis_section(&[
            &format!("url: rediss://127.0.0.1:{port}/0"),
            "timeout_ms: 500",
            "key_prefix: t",
            &format!(
                "tls: {{ ca: {}, cert: {}, key: {} }}",
                ca.ca.display(),
                client.cert.display(),
                client.key.display()
            ),
        ])
        .failure_mode("deny")
        .route(route("api").limit(fixed_window("api", "3/h").key(&["route"])));
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    gateway.wait_ready();
    let statuses: Vec<u16> = (0..5).map(|_| gateway.get("/x").status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("decision", "limited")]
        ),
        2.0,
        "{metrics}"
    );
    let _ = redis.kill();
    let _ = redis.wait();
}

/// Completes a TLS handshake with `port` offering only ALPN `h2` (trusting `ca`), then sends
/// nothing; returns the connection.
fn silent_h2_client(
    port: u16,
    config: &Arc<rustls::ClientConfig>,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let name = rustls::pki_types::ServerName::try_from("site.test").unwrap();
    let connection = rustls::ClientConnection::new(Arc::clone(config), name).unwrap();
    let socket = TcpStream::connect((LOOPBACK, port)).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, socket);
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .expect("the TLS handshake completes");
    }
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"h2"[..]));
    tls.sock.set_read_timeout(Some(STUCK)).unwrap();
    tls
}

/// How long a test waits for what should happen within about a second before it calls the
/// test stuck.
const STUCK: Duration = Duration::from_secs(20);

#[test]
fn http2_clients_that_never_send_their_preface_are_closed_while_others_are_served() {
    use std::io::Read;
    let ca = TestCa::new();
    let site = ca.issue("site", &["site.test"], &[]);
    let upstream = Upstream::start();
    let (tls_port, h2c_port) = (free_port(), free_port());
    let config = Config::new()
        .server("request_head_timeout_ms", 1000)
        .listen(&[
            "PROXY",
            &tls_listener(tls_port, &[&site], ""),
            &format!("{{ addr: 127.0.0.1:{h2c_port}, h2c: true }}"),
        ])
        .route(route("all"));
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(&ca.ca).unwrap();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let client = Arc::new(client);

    // 200 clients finish their TLS handshake with ALPN h2, and 20 connect in the clear to the
    // h2c listener; none sends a byte more.
    let mut silent: Vec<Box<dyn Read + Send>> = (0..200)
        .map(|_| Box::new(silent_h2_client(tls_port, &client)) as Box<dyn Read + Send>)
        .collect();
    silent.extend((0..20).map(|_| {
        let stream = TcpStream::connect((LOOPBACK, h2c_port)).unwrap();
        stream.set_read_timeout(Some(STUCK)).unwrap();
        Box::new(stream) as Box<dyn Read + Send>
    }));
    // Meanwhile, ordinary clients are served, over TLS with HTTP/2 too.
    let ca_file = ca.ca.to_str().unwrap();
    let resolved = resolve("site.test", tls_port);
    let url = format!("https://site.test:{tls_port}/");
    for _ in 0..5 {
        assert_eq!(support::http_get(gateway.proxy, "/", None, &[]).status, 200);
        let statuses =
            curl_statuses(&["--http2", "--cacert", ca_file, "--resolve", &resolved, &url]);
        assert_eq!(statuses, ["2 200"]);
    }
    // Every silent connection is closed by the gateway: its read ends (EOF, or the TLS layer's
    // close) instead of waiting until the test calls itself stuck.
    let closed: Vec<_> = silent
        .into_iter()
        .map(|mut stream| {
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) => return true,
                        Ok(_) => continue,
                        Err(e) => {
                            return !matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            )
                        }
                    }
                }
            })
        })
        .collect();
    for (i, waiter) in closed.into_iter().enumerate() {
        assert!(
            waiter.join().unwrap(),
            "silent connection {i} was not closed"
        );
    }
}

/// HTTP/2 heads are counted too: a real HTTP/2 client (curl, prior knowledge on an `h2c`
/// listener) with more header fields than the gateway accepts gets `431`; with fewer, `200`.
/// An HTTP/1 request with too many on the same listener gets `431` as well.
#[test]
fn too_many_header_fields_are_431_over_http2_and_on_an_h2c_listener() {
    use std::io::{Read, Write};
    let upstream = Upstream::start();
    let h2c_port = free_port();
    let config = Config::new()
        .listen(&[
            "PROXY",
            &format!("{{ addr: 127.0.0.1:{h2c_port}, h2c: true }}"),
        ])
        .route(route("all"));
    let _gateway = Gateway::start(&config.yaml(), &upstream, None);
    let url = format!("http://127.0.0.1:{h2c_port}/fields");
    let headers = |n: usize| -> Vec<String> {
        (0..n)
            .flat_map(|i| ["-H".to_string(), format!("x-h{i}: v")])
            .collect()
    };
    for (fields, expected) in [(300, "2 431"), (100, "2 200")] {
        let mut args: Vec<String> = vec!["--http2-prior-knowledge".into(), url.clone()];
        args.extend(headers(fields));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(curl_statuses(&args), [expected], "{fields} fields");
    }
    let mut request =
        String::from("GET /fields HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for i in 0..1000 {
        request.push_str(&format!("x-h{i}: v\r\n"));
    }
    request.push_str("\r\n");
    let mut stream = TcpStream::connect((LOOPBACK, h2c_port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
}

/// A gRPC call shed by adaptive concurrency gets UNAVAILABLE with a pushback: a slow request
/// holds the route's one place (a limit of 1 while its first probe runs) until its response
/// head, and a gRPC call meanwhile is shed before it reaches any upstream.
#[test]
fn a_grpc_call_shed_by_adaptive_concurrency_gets_unavailable_with_a_pushback() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = Upstream::start();
    let h2c_port = free_port();
    let config = Config::new()
        .listen(&[
            "PROXY",
            &format!("{{ addr: 127.0.0.1:{h2c_port}, h2c: true }}"),
        ])
        .route(route("all").set(
            "adaptive_concurrency",
            "{ min_limit: 1, max_limit: 10, probe_requests: 1000 }",
        ));
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    let proxy = gateway.proxy;
    let slow = support::hold_a_place(proxy, "/slow/20000", None);
    // Held once a plain request is shed.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let quick = gateway.get("/quick");
        if quick.status == 503 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow request never held the place: {} {}",
            quick.status,
            quick.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    runtime.block_on(async {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{h2c_port}"))
                .expect("a channel URI")
                .connect()
                .await
                .expect("connect through the gateway");
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let shed = client.check(request).await.expect_err("the call is shed");
        assert_eq!(shed.code(), tonic::Code::Unavailable, "{shed:?}");
        assert!(shed.message().contains("concurrency limit"), "{shed:?}");
        let pushback = shed.metadata().get("grpc-retry-pushback-ms");
        assert_eq!(pushback.and_then(|v| v.to_str().ok()), Some("1000"));
    });
    let labels = [("route", "all"), ("plan", "none")];
    let shed = metric(
        &gateway.metrics(),
        "sluice_adaptive_concurrency_shed_total",
        &labels,
    );
    assert!(shed >= 2.0, "the plain request and the call: {shed}");
    drop(gateway);
    let _ = slow.join();
}
