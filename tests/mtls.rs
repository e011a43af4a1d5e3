//! mTLS at a TLS listener, driven by curl (`--cert --key --cacert`): `require` refuses a client
//! without a certificate and one from another CA and serves one from the listener's CA; `request`
//! serves a client without one too; the verified certificate reaches the request (the access
//! log's `client_cert`); the CA and mode are swapped by SIGHUP and checked by `sluice -t`. Every
//! certificate is made by the test.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::certs::{Issued, TestCa};
use support::config::{route, Config};
use support::{check_config, free_port, Gateway, Upstream};

/// A TLS listener on `port` serving `server`, with this `client_auth` value (or none).
fn listener(port: u16, server: &Issued, client_auth: Option<String>) -> String {
    let auth = client_auth.map_or(String::new(), |auth| format!(", client_auth: {auth}"));
    format!(
        "{{ addr: 127.0.0.1:{port}, tls: {{ certificates: [{{ cert: {}, key: {} }}]{auth} }} }}",
        server.cert.display(),
        server.key.display()
    )
}

fn client_auth(mode: &str, ca: &Path) -> Option<String> {
    Some(format!("{{ mode: {mode}, ca: {} }}", ca.display()))
}

/// The gateway's configuration: one TLS listener and an access log at `log`.
fn config(listener: &str, log: &Path) -> String {
    Config::new()
        .listen(&["PROXY", listener])
        .set(
            "access_log",
            format!("{{ enabled: true, path: {} }}", log.display()),
        )
        .route(route("all"))
        .yaml()
}

/// curl to `https://site.test:port/who` trusting `ca`, presenting `client` if given, over HTTP/2
/// unless `http1`.
fn get(port: u16, ca: &TestCa, client: Option<&Issued>, http1: bool) -> Output {
    let url = format!("https://site.test:{port}/who");
    let resolve = format!("site.test:{port}:127.0.0.1");
    let mut command = Command::new("curl");
    command
        .args(["--silent", "--show-error", "--max-time", "10"])
        .args(["-w", "\n%{http_version} %{response_code}"])
        .args(["--resolve", &resolve, "--cacert"])
        .arg(&ca.ca);
    if let Some(client) = client {
        command.arg("--cert").arg(&client.cert);
        command.arg("--key").arg(&client.key);
    }
    if http1 {
        command.arg("--http1.1");
    }
    command
        .arg(&url)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run curl ({e}): scripts/test.sh installs it"))
}

/// The `http_version status` curl printed last, and its stderr.
fn outcome(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default().to_string();
    (last, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_served(out: &Output, expected: &str, what: &str) {
    let (status, stderr) = outcome(out);
    assert!(out.status.success(), "{what}: {stderr}");
    assert_eq!(status, expected, "{what}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("GET /who"),
        "{what}: the upstream answered"
    );
}

fn assert_refused(out: &Output, what: &str) {
    let (status, stderr) = outcome(out);
    assert!(!out.status.success(), "{what} was served: {status}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("GET /who"),
        "{what} reached the upstream"
    );
    assert!(!stderr.is_empty(), "{what}: curl says why");
}

/// The SHA-256 fingerprint of a PEM certificate, as openssl computes it, in lowercase hex.
fn fingerprint(cert: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(cert)
        .output()
        .expect("openssl x509");
    let text = String::from_utf8_lossy(&out.stdout);
    let (_, hex) = text.trim().split_once('=').expect("Fingerprint=...");
    hex.replace(':', "").to_ascii_lowercase()
}

/// The access log's lines, waiting (bounded) until there are at least `n`.
fn log_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    support::eventually(Duration::from_secs(10), "access log lines", || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        lines = text
            .lines()
            .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
            .collect();
        lines.len() >= n
    });
    lines
}

struct Pki {
    ca: TestCa,
    other_ca: TestCa,
    server: Issued,
    client: Issued,
    stranger: Issued,
}

fn pki() -> Pki {
    let (ca, other_ca) = (TestCa::new(), TestCa::new());
    let server = ca.issue("site", &["site.test"], &[]);
    let client = ca.issue("client", &["billing.client.test"], &[]);
    let stranger = other_ca.issue("stranger", &["billing.client.test"], &[]);
    Pki {
        ca,
        other_ca,
        server,
        client,
        stranger,
    }
}

#[test]
fn require_serves_only_clients_with_a_certificate_from_its_ca() {
    let pki = pki();
    let upstream = Upstream::start();
    let port = free_port();
    let log = pki.ca.dir.path().join("access.log");
    let listener = listener(port, &pki.server, client_auth("require", &pki.ca.ca));
    let _gateway = Gateway::start(&config(&listener, &log), &upstream, None);

    assert_refused(&get(port, &pki.ca, None, false), "no certificate");
    assert_refused(&get(port, &pki.ca, None, true), "no certificate (HTTP/1.1)");
    assert_refused(
        &get(port, &pki.ca, Some(&pki.stranger), false),
        "a certificate from another CA",
    );
    assert_served(
        &get(port, &pki.ca, Some(&pki.client), false),
        "2 200",
        "a certificate from the CA",
    );
    assert_served(
        &get(port, &pki.ca, Some(&pki.client), true),
        "1.1 200",
        "a certificate from the CA (HTTP/1.1)",
    );

    // The verified certificate reached both requests: its subject and fingerprint are logged.
    let lines = log_lines(&log, 2);
    assert_eq!(
        lines.len(),
        2,
        "only the served requests are logged: {lines:?}"
    );
    let expected = serde_json::json!({
        "subject_cn": "billing.client.test",
        "sha256": fingerprint(&pki.client.cert),
    });
    for line in &lines {
        assert_eq!(line["client_cert"], expected, "{line}");
    }
    assert_ne!(
        fingerprint(&pki.client.cert),
        fingerprint(&pki.stranger.cert)
    );
}

#[test]
fn a_client_certificate_must_chain_to_the_ca_be_valid_now_and_usable_for_client_auth() {
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let pki = pki();
    let upstream = Upstream::start();
    let port = free_port();
    let log = pki.ca.dir.path().join("access.log");
    let listener = listener(port, &pki.server, client_auth("require", &pki.ca.ca));
    let _gateway = Gateway::start(&config(&listener, &log), &upstream, None);

    let expired = pki.ca.issue_for("expired", &["old.client.test"], &[], -1);
    assert_refused(
        &get(port, &pki.ca, Some(&expired), false),
        "an expired certificate",
    );
    let server_only = pki
        .ca
        .issue_with("server-only", &["srv.client.test"], |params| {
            params.extended_key_usages = vec![ServerAuth];
        });
    assert_refused(
        &get(port, &pki.ca, Some(&server_only), false),
        "a certificate for serverAuth only",
    );
    // Issued by an intermediate: verified when the client sends the intermediate along.
    let intermediate = pki.ca.intermediate("partners");
    let leaf = intermediate.issue("partner", &["partner.client.test"], &[]);
    assert_refused(
        &get(port, &pki.ca, Some(&leaf), false),
        "a leaf from an intermediate, sent alone",
    );
    let chain = intermediate.dir.path().join("partner-chain.pem");
    let pem = |path: &Path| std::fs::read_to_string(path).unwrap();
    std::fs::write(&chain, pem(&leaf.cert) + &pem(&intermediate.ca)).unwrap();
    let with_chain = Issued {
        cert: chain,
        key: leaf.key.clone(),
    };
    assert_served(
        &get(port, &pki.ca, Some(&with_chain), false),
        "2 200",
        "a leaf from an intermediate, sent with it",
    );
    let client_usage = pki
        .ca
        .issue_with("client-usage", &["eku.client.test"], |params| {
            params.extended_key_usages = vec![ClientAuth];
        });
    assert_served(
        &get(port, &pki.ca, Some(&client_usage), false),
        "2 200",
        "a certificate for clientAuth",
    );
}

#[test]
fn request_serves_clients_without_a_certificate_and_verifies_one_presented() {
    let pki = pki();
    let upstream = Upstream::start();
    let port = free_port();
    let log = pki.ca.dir.path().join("access.log");
    let listener = listener(port, &pki.server, client_auth("request", &pki.ca.ca));
    let _gateway = Gateway::start(&config(&listener, &log), &upstream, None);

    assert_served(&get(port, &pki.ca, None, false), "2 200", "no certificate");
    assert_served(
        &get(port, &pki.ca, Some(&pki.client), false),
        "2 200",
        "a certificate from the CA",
    );
    assert_refused(
        &get(port, &pki.ca, Some(&pki.stranger), false),
        "a presented certificate from another CA",
    );

    let lines = log_lines(&log, 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].get("client_cert").is_none(),
        "an anonymous client has no certificate: {}",
        lines[0]
    );
    assert_eq!(
        lines[1]["client_cert"]["sha256"],
        fingerprint(&pki.client.cert)
    );
}

#[test]
fn sighup_adds_swaps_and_removes_client_auth_and_a_bad_ca_file_keeps_it() {
    let pki = pki();
    let upstream = Upstream::start();
    let port = free_port();
    let log = pki.ca.dir.path().join("access.log");
    let plain = listener(port, &pki.server, None);
    let gateway = Gateway::start(&config(&plain, &log), &upstream, None);
    assert_served(
        &get(port, &pki.ca, None, false),
        "2 200",
        "before client_auth",
    );

    // client_auth added by a reload: a client without a certificate is now refused.
    let required = listener(port, &pki.server, client_auth("require", &pki.ca.ca));
    assert!(
        gateway.reload(&config(&required, &log)),
        "client_auth added"
    );
    assert_refused(
        &get(port, &pki.ca, None, false),
        "no certificate after the reload",
    );
    assert_served(
        &get(port, &pki.ca, Some(&pki.client), false),
        "2 200",
        "a certificate from the CA after the reload",
    );

    // The other CA instead: its client is served, ours no longer.
    let swapped = listener(port, &pki.server, client_auth("require", &pki.other_ca.ca));
    assert!(gateway.reload(&config(&swapped, &log)), "the CA swapped");
    assert_served(
        &get(port, &pki.ca, Some(&pki.stranger), false),
        "2 200",
        "the new CA's client",
    );
    assert_refused(
        &get(port, &pki.ca, Some(&pki.client), false),
        "the old CA's client",
    );

    // A CA file that is not PEM fails the reload; the running CA stays.
    let broken = pki.ca.dir.path().join("broken-ca.pem");
    std::fs::write(&broken, "not a certificate\n").unwrap();
    let bad = listener(port, &pki.server, client_auth("require", &broken));
    assert!(
        !gateway.reload(&config(&bad, &log)),
        "a bad CA file is refused"
    );
    assert_served(
        &get(port, &pki.ca, Some(&pki.stranger), false),
        "2 200",
        "the running CA after the refused reload",
    );
    assert_refused(&get(port, &pki.ca, None, false), "still required");

    // client_auth removed by a reload: no certificate is asked for again.
    assert!(gateway.reload(&config(&plain, &log)), "client_auth removed");
    assert_served(
        &get(port, &pki.ca, None, false),
        "2 200",
        "after client_auth is removed",
    );
}

#[test]
fn sluice_t_names_an_unreadable_or_invalid_client_ca_with_its_path() {
    let pki = pki();
    let dir = pki.ca.dir.path();
    let yaml = |ca: &Path| {
        format!(
            "listen:\n  - {}\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: {{ servers: [127.0.0.1:1] }}\n",
            listener(1, &pki.server, client_auth("require", ca))
        )
    };
    let (ok, stderr) = check_config(dir, &yaml(&pki.ca.ca));
    assert!(ok, "{stderr}");

    let absent = dir.join("absent-ca.pem");
    let (ok, stderr) = check_config(dir, &yaml(&absent));
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("listen[0].tls.client_auth.ca") && stderr.contains("absent-ca.pem"),
        "{stderr}"
    );

    // A private key is no CA certificate.
    let (ok, stderr) = check_config(dir, &yaml(&pki.client.key));
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("listen[0].tls.client_auth.ca")
            && stderr.contains("client.key")
            && stderr.contains("no certificate"),
        "{stderr}"
    );
}

#[test]
fn a_client_certificate_names_the_consumer_and_its_plan() {
    let pki = pki();
    let upstream = Upstream::start();
    let port = free_port();
    let listener = listener(port, &pki.server, client_auth("request", &pki.ca.ca));
    let other = pki.ca.issue("other", &["other.client.test"], &[]);
    let config = Config::new()
        .listen(&["PROXY", &listener])
        .set(
            "identity",
            "{ plans: [free, pro], mtls: { consumer: subject_cn, plans: { billing.client.test: pro } } }",
        )
        .route(
            route("all").set("auth", "required").limit(
                support::limits::fixed_window("per_consumer", "1/h")
                    .key(&["consumer"])
                    .set("plans", "{ pro: { rate: 2/h } }"),
            ),
        )
        .yaml();
    let _gateway = Gateway::start(&config, &upstream, None);
    let status = |client: Option<&Issued>| outcome(&get(port, &pki.ca, client, true)).0;
    let billing: Vec<String> = (0..3).map(|_| status(Some(&pki.client))).collect();
    assert_eq!(billing, ["1.1 200", "1.1 200", "1.1 429"], "pro: 2/h");
    let others: Vec<String> = (0..2).map(|_| status(Some(&other))).collect();
    assert_eq!(
        others,
        ["1.1 200", "1.1 429"],
        "no plan named: the limit as written"
    );
    assert_eq!(status(None), "1.1 401", "no certificate, no consumer");
    let seen = get(port, &pki.ca, Some(&other), true);
    let seen = String::from_utf8_lossy(&seen.stdout).into_owned();
    assert!(seen.contains("\"status\":429"), "{seen}");
    let upstream_saw = get(
        port,
        &pki.ca,
        Some(&pki.ca.issue("third", &["third.client.test"], &[])),
        true,
    );
    let upstream_saw = String::from_utf8_lossy(&upstream_saw.stdout).into_owned();
    assert!(
        upstream_saw.contains("x-consumer-id: third.client.test"),
        "{upstream_saw}"
    );
}
