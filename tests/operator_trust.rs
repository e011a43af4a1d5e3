//! What an operator is told is true: a gateway that only serves Envoy's rate limit service
//! needs no proxy route or listener; `sluice -d -c relative.yaml` reloads the files it started
//! with (relative paths are resolved once, at start, not after the daemon moved to `/`).

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use support::daemons::{read_pid, Daemons};
use support::{free_port, http_get, metric};

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// An envoyproxy/ratelimit file: domain `trust`, `user` limited to `per_minute` a minute.
fn domain(per_minute: u32) -> String {
    format!(
        "domain: trust\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, requests_per_unit: {per_minute} }}\n"
    )
}

/// The overall code of one call for `user=<value>` to the rate limit service on `port`.
fn ask(port: u16, value: &str) -> i32 {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .expect("connect to the rate limit service");
        let request = RateLimitRequest {
            domain: "trust".to_string(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".to_string(),
                    value: value.to_string(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        client
            .should_rate_limit(request)
            .await
            .expect("an answer")
            .into_inner()
            .overall_code
    })
}

/// Polls `done` every 20 ms until it holds, at most `limit`; whether it did.
fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ready(admin: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok()
        && http_get(
            format!("127.0.0.1:{admin}").parse().unwrap(),
            "/readyz",
            None,
            &[],
        )
        .status
            == 200
}

/// Runs `command` to its end; it must succeed.
fn succeeded(command: &mut Command) {
    let output = command.output().expect("run sluice");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Kills the foreground gateway when the test ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_gateway_that_only_serves_the_rate_limit_service_starts_reports_ready_and_answers() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rls")).unwrap();
    std::fs::write(dir.path().join("rls/trust.yaml"), domain(1)).unwrap();
    let (admin, rls) = (free_port(), free_port());
    let config = dir.path().join("sluice.yaml");
    std::fs::write(
        &config,
        format!(
            "server: {{ threads: 1, pid_file: {d}/sluice.pid, upgrade_sock: {d}/upgrade.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }}\n\
             admin: {{ listen: 127.0.0.1:{admin} }}\n\
             rls: {{ listen: 127.0.0.1:{rls}, config_dir: rls }}\n",
            d = dir.path().display()
        ),
    )
    .unwrap();
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["-t", "-c"])
            .arg(&config),
    );
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("-c")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut gateway = Reaped(child);
    let started = within(Duration::from_secs(20), || {
        assert!(
            matches!(gateway.0.try_wait(), Ok(None)),
            "sluice exited instead of serving"
        );
        ready(admin)
    });
    assert!(started, "not ready within 20 s");
    assert_eq!(ask(rls, "alice"), OK);
    assert_eq!(ask(rls, "alice"), OVER);
    assert_eq!(ask(rls, "bob"), OK);
}

#[test]
fn a_daemon_started_with_relative_paths_reloads_the_files_it_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    std::fs::create_dir(cwd.join("rls")).unwrap();
    std::fs::write(cwd.join("rls/trust.yaml"), domain(1)).unwrap();
    let (admin, rls, proxy) = (free_port(), free_port(), free_port());
    // Every path relative: the file's own, the rate limit service's directory, the pid file
    // and the error log (where the daemon writes what goes wrong).
    std::fs::write(
        cwd.join("sluice.yaml"),
        format!(
            "server: {{ threads: 1, pid_file: sluice.pid, upgrade_sock: upgrade.sock, error_log: sluice.log, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }}\n\
             listen: [127.0.0.1:{proxy}]\n\
             admin: {{ listen: 127.0.0.1:{admin} }}\n\
             rls: {{ listen: 127.0.0.1:{rls}, config_dir: rls }}\n"
        ),
    )
    .unwrap();
    let _daemons = Daemons(vec![cwd.join("sluice.pid")]);
    succeeded(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .current_dir(cwd)
            .args(["-d", "-c", "sluice.yaml"])
            .env("RUST_LOG", "info"),
    );
    let pid = read_pid(&cwd.join("sluice.pid"));
    assert_eq!(ask(rls, "alice"), OK);
    assert_eq!(ask(rls, "alice"), OVER);

    let admin_addr = format!("127.0.0.1:{admin}").parse().unwrap();
    let reloads = |result: &str| {
        let text = http_get(admin_addr, "/metrics", None, &[]).body;
        metric(&text, "sluice_config_reloads_total", &[("result", result)])
    };
    let before = (reloads("success"), reloads("error"));
    std::fs::write(cwd.join("rls/trust.yaml"), domain(5)).unwrap();
    let hup = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let mut outcome = None;
    let done = within(Duration::from_secs(10), || {
        outcome = match (reloads("success"), reloads("error")) {
            (success, _) if success > before.0 => Some(true),
            (_, error) if error > before.1 => Some(false),
            _ => None,
        };
        outcome.is_some()
    });
    let log = std::fs::read_to_string(cwd.join("sluice.log")).unwrap_or_default();
    assert!(done, "the reload was not done within 10 s; log:\n{log}");
    assert_eq!(outcome, Some(true), "the reload was rejected; log:\n{log}");
    // The new limit holds: five calls a minute for a user not seen before.
    let codes: Vec<i32> = (0..6).map(|_| ask(rls, "carol")).collect();
    assert_eq!(codes, [OK, OK, OK, OK, OK, OVER]);
    assert!(!log.contains("cannot read"), "{log}");
    assert!(Path::new(&cwd.join("sluice.log")).exists());
}
