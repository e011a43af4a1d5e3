//! Secrets stay secret: the Redis password (and the key secret) can come from a file, the
//! environment or a systemd credential, and no password is ever printed — not by `sluice -t`
//! (valid or not), not in the logs of a gateway that cannot reach Redis, not in its metrics —
//! whatever form of Redis URL carries it.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use support::config::{route, Config};
use support::limits::gcra;
use support::{Gateway, Launch, RedisServer, Upstream};

const PASSWORD: &str = "Sup3r-S3cret-Passw0rd";

/// `sluice -t` on a file with this body; its exit code and everything it printed.
fn check(body: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.yaml");
    std::fs::write(&path, format!("listen: [127.0.0.1:1]\n{body}")).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["-t", "-c"])
        .arg(&path)
        .env("SLUICE_TEST_REDIS_PASSWORD", PASSWORD)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

fn limited_route() -> support::config::Route {
    route("api").limit(gcra("per_client", "10/s").burst(9))
}

/// Every URL form that can carry a password, valid and broken.
fn url_forms() -> Vec<(String, &'static str)> {
    vec![
        (
            format!("redis://:{PASSWORD}@127.0.0.1:6379/0"),
            "standalone",
        ),
        (
            format!("redis://sluice:{PASSWORD}@127.0.0.1:6379/0"),
            "standalone",
        ),
        (
            format!("rediss://sluice:{PASSWORD}@127.0.0.1:6380/0"),
            "standalone",
        ),
        (
            format!("redis+unix:///run/redis.sock?db=0&pass={PASSWORD}"),
            "standalone",
        ),
        (
            format!("unix:///run/redis.sock?pass={PASSWORD}&user=u"),
            "standalone",
        ),
        (
            format!("redis://:{PASSWORD}@127.0.0.1:notaport/0"),
            "standalone",
        ),
        (format!("redis://:{PASSWORD}@127.0.0.1:7000/"), "cluster"),
        (format!("redis://:{PASSWORD}@127.0.0.1:26379/"), "sentinel"),
    ]
}

fn redis_section(url: &str, mode: &str) -> Config {
    let quoted = format!("{url:?}");
    match mode {
        "cluster" => Config::new().redis_section(&["mode: cluster", &format!("nodes: [{quoted}]")]),
        "sentinel" => Config::new().redis_section(&[
            "mode: sentinel",
            &format!("sentinels: [{quoted}]"),
            "master_name: m",
            &format!("master_password: {PASSWORD}"),
        ]),
        _ => Config::new().redis_section(&[&format!("url: {quoted}")]),
    }
}

#[test]
fn sluice_t_never_prints_a_password_valid_or_not() {
    for (url, mode) in url_forms() {
        let config = redis_section(&url, mode).route(limited_route());
        let (code, text) = check(&config.yaml());
        assert!(!text.contains(PASSWORD), "{url}: {text}");
        assert!(
            text.contains(if code == 0 { ": ok:" } else { "problem" }),
            "{text}"
        );
        // The same with another mistake in the file: every problem listed, still no password.
        let broken = config.set("failure_mode", "sometimes");
        let (code, text) = check(&broken.yaml());
        assert_eq!(code, 1, "{text}");
        assert!(!text.contains(PASSWORD), "{url}: {text}");
    }
    let inline_secret = Config::new()
        .set("key_secret", PASSWORD)
        .set("failure_mode", "sometimes")
        .route(limited_route());
    let (_, text) = check(&inline_secret.yaml());
    assert!(!text.contains(PASSWORD), "{text}");
}

#[test]
fn a_gateway_that_cannot_reach_redis_never_logs_or_exports_the_password() {
    let upstream = Upstream::start();
    // Nobody listens there: every call fails, and is logged and counted.
    let port = support::free_port();
    for url in [
        format!("redis://:{PASSWORD}@127.0.0.1:{port}/0"),
        format!("redis://sluice:{PASSWORD}@127.0.0.1:{port}/0"),
    ] {
        let config = Config::new()
            .redis_section(&[&format!("url: {url:?}"), "timeout_ms: 50"])
            .failure_mode("allow")
            .route(limited_route());
        let gateway = Gateway::launch(
            &config.yaml(),
            &upstream,
            None,
            &Launch {
                log_level: Some("debug"),
                capture_log: true,
                ..Launch::default()
            },
        );
        for _ in 0..5 {
            assert_eq!(gateway.get("/x").status, 200);
        }
        let ready = support::http_get(gateway.admin, "/readyz", None, &[]).body;
        let metrics = gateway.metrics();
        let log = gateway.log();
        assert!(
            log.contains("rate limiter unavailable"),
            "the failures were logged: {log}"
        );
        for (what, text) in [("log", &log), ("metrics", &metrics), ("/readyz", &ready)] {
            assert!(
                !text.contains(PASSWORD),
                "the password is in the {what}: {text}"
            );
        }
    }
}

/// Redis requires a password; the file names only where it is.
fn gateway_with_password_from(
    password: &str,
    env: Vec<(String, String)>,
    redis: &RedisServer,
    upstream: &Upstream,
) -> Gateway {
    let config = Config::new()
        .redis_section(&[
            &format!("url: {}", redis.plain_url()),
            &format!("password: {password}"),
            "timeout_ms: 200",
        ])
        .failure_mode("deny")
        .route(limited_route());
    Gateway::launch(
        &config.yaml(),
        upstream,
        Some(redis),
        &Launch {
            env,
            ..Launch::default()
        },
    )
}

#[test]
fn the_password_comes_from_a_file_the_environment_or_a_systemd_credential() {
    let redis = RedisServer::start_with_password(PASSWORD);
    let upstream = Upstream::start();
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(
        secrets.path().join("redis.password"),
        format!("{PASSWORD}\n"),
    )
    .unwrap();
    let file = secrets.path().join("redis.password").display().to_string();
    let directory = secrets.path().display().to_string();
    let sources = [
        (format!("{{ file: {file} }}"), vec![]),
        (
            "{ env: SLUICE_REDIS_PASSWORD }".to_string(),
            vec![("SLUICE_REDIS_PASSWORD".to_string(), PASSWORD.to_string())],
        ),
        (
            "{ credential: redis.password }".to_string(),
            vec![("CREDENTIALS_DIRECTORY".to_string(), directory)],
        ),
    ];
    for (source, env) in sources {
        let gateway = gateway_with_password_from(&source, env, &redis, &upstream);
        let response = gateway.get("/x");
        assert_eq!(response.status, 200, "{source}");
        assert!(
            response.header("ratelimit").is_some(),
            "{source}: decided by Redis, which accepted the password"
        );
    }
    // A wrong password: Redis refuses, the failure mode applies, the error is counted as auth.
    let wrong = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(wrong.path(), "not-the-password").unwrap();
    let config = Config::new()
        .redis_section(&[
            &format!("url: {}", redis.plain_url()),
            &format!("password: {{ file: {} }}", wrong.path().display()),
            "timeout_ms: 200",
        ])
        .failure_mode("deny")
        .route(limited_route());
    let gateway = Gateway::launch(
        &config.yaml(),
        &upstream,
        Some(&redis),
        &Launch {
            capture_log: true,
            ..Launch::default()
        },
    );
    assert_eq!(gateway.get("/x").status, 503);
    assert!(Path::new(wrong.path()).exists());
    let metrics = gateway.metrics();
    let errors =
        |kind: &str| support::metric(&metrics, "sluice_limiter_errors_total", &[("kind", kind)]);
    assert!(errors("auth") >= 1.0, "counted as auth: {metrics}");
    assert_eq!(errors("reply"), 0.0, "not as a reply it did not understand");
    // The operator reads which server refused, and why, in words (not redis-rs's Rust names).
    let server = format!("redis at redis://127.0.0.1:{}/0", redis.port);
    let ready = support::http_get(gateway.admin, "/readyz", None, &[]);
    assert!(ready.body.contains(&server), "{}", ready.body);
    let log = gateway.log();
    let line = log
        .lines()
        .find(|l| l.contains("rate limiter unavailable (auth)"))
        .unwrap_or_else(|| panic!("an auth warning: {log}"));
    assert!(line.contains(&server), "{line}");
    assert!(
        line.contains("refused the configured credentials"),
        "{line}"
    );
    assert!(!log.contains("AuthenticationFailed"), "{log}");
    assert!(!log.contains("not-the-password"), "{log}");
}
