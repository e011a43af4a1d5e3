//! `-d` and `-u`: sluice daemonizes, and a new instance takes the listening sockets over from
//! the old one (Pingora's graceful upgrade) without refusing or failing a single request.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::daemons::{
    alive, assert_process_metrics_of, exits_within, read_pid, steady_load, Daemons,
};
use support::limits::gcra;
use support::{free_port, http_get, Gateway, GatewayConfig, RedisServer, Upstream};

fn sluice(args: &[&str], config: &Path) {
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .arg("-c")
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null()) // a daemon keeps inherited pipes open: never give it ours
        .status()
        .expect("run sluice");
    assert!(status.success(), "sluice {args:?} exited with {status}");
}

#[test]
fn daemon_mode_and_graceful_upgrade_fail_no_request() {
    let upstream = Upstream::start();
    let routes = Config::new().route(route("all"));
    let config = GatewayConfig::write(&routes.yaml(), &upstream, None, 1);
    let pid_file = config.pid_file();
    let _daemons = Daemons(vec![pid_file.clone(), pid_file.with_extension("pid.old")]);

    sluice(&["-d"], &config.path);
    // `-d` returns once serving: no waiting here.
    let old = read_pid(&pid_file);
    assert!(alive(old), "the pid file names the live daemon");
    assert_eq!(http_get(config.proxy, "/before", None, &[]).status, 200);
    assert_eq!(http_get(config.admin, "/healthz", None, &[]).body, "ok\n");
    let old_ids = request_ids(config.proxy);

    let before = upstream.served();
    let load = steady_load(config.proxy, 120);
    support::eventually(Duration::from_secs(10), "the load is under way", || {
        upstream.served() >= before + 5
    });
    sluice(&["-u", "-d"], &config.path);
    Command::new("kill")
        .args(["-QUIT", &old.to_string()])
        .status()
        .expect("kill -QUIT");
    let statuses = load.join().expect("load thread");
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert_eq!(failed, 0, "statuses during the upgrade: {statuses:?}");

    let new = read_pid(&pid_file);
    assert_ne!(new, old, "the pid file names the new instance");
    assert!(
        exits_within(old, Duration::from_secs(15)),
        "the old instance drains and exits"
    );
    assert!(alive(new));
    assert_eq!(http_get(config.proxy, "/after", None, &[]).status, 200);
    // The ids each instance makes are drawn in its threads, after it forked: random, and
    // nothing of one instance's ids in the other's.
    let ids: Vec<String> = old_ids
        .into_iter()
        .chain(request_ids(config.proxy))
        .collect();
    for (i, a) in ids.iter().enumerate() {
        assert_eq!(a.len(), 32, "{a}");
        for b in &ids[i + 1..] {
            assert_ne!(a[..16], b[..16], "{ids:?}");
        }
    }
    assert_eq!(upstream.served(), 132);
}

/// The ids of five requests the gateway at `proxy` made.
fn request_ids(proxy: std::net::SocketAddr) -> Vec<String> {
    (0..5)
        .map(|_| {
            let response = http_get(proxy, "/id", None, &[]);
            response.header("x-request-id").expect("an id").to_string()
        })
        .collect()
}

/// `process_*` describe the process that serves however sluice was started: in the
/// foreground, with `-d` (Pingora forks twice after the metric families are registered) and as
/// the instance `-u -d` started, with limits in Redis and without. (The systemd unit's own
/// sequence is checked in tests/systemd_unit.rs.)
#[test]
fn process_metrics_describe_the_serving_process_however_it_was_started() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let local = Config::new().route(route("all"));
    let in_redis = Config::new()
        .redis("REDIS_URL")
        .route(route("all").limit(gcra("per_client", "100/s").key(&["client_ip"])));
    for (body, redis) in [(local, None), (in_redis, Some(&redis))] {
        let body = body.yaml();
        let foreground = Gateway::start(&body, &upstream, redis);
        assert_process_metrics_of(foreground.admin, foreground.pid());
        drop(foreground);

        let config = GatewayConfig::write(&body, &upstream, redis, 1);
        let pid_file = config.pid_file();
        let _daemons = Daemons(vec![pid_file.clone(), pid_file.with_extension("pid.old")]);
        sluice(&["-d"], &config.path);
        let old = read_pid(&pid_file);
        assert_eq!(http_get(config.proxy, "/", None, &[]).status, 200);
        assert_process_metrics_of(config.admin, old);

        sluice(&["-u", "-d"], &config.path);
        Command::new("kill")
            .args(["-QUIT", &old.to_string()])
            .status()
            .expect("kill -QUIT");
        assert!(
            exits_within(old, Duration::from_secs(15)),
            "the old instance drains and exits"
        );
        let new = read_pid(&pid_file);
        assert_ne!(new, old, "the pid file names the new instance");
        assert_eq!(http_get(config.proxy, "/", None, &[]).status, 200);
        assert_process_metrics_of(config.admin, new);
    }
}

/// Runs sluice with `args` until it exits by itself; its exit status and what it printed. Output
/// goes to a file: a daemon keeps inherited pipes open, and reading them would wait for it to
/// exit. A start that fails "at once" exits long before Pingora's own 30 s of bind retries: a
/// run still going after 20 s is killed and fails the test.
fn run(args: &[&str], config: &Path) -> (i32, String) {
    let log = tempfile::NamedTempFile::new().expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .arg("-c")
        .arg(config)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(log.reopen().expect("log file"))
        .stderr(log.reopen().expect("log file"))
        .spawn()
        .expect("run sluice");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sluice") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("sluice {args:?} was still running after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    (status.code().unwrap_or(-1), text)
}

#[test]
fn a_port_in_use_fails_the_start_at_once_with_the_reason() {
    let upstream = Upstream::start();
    let config = GatewayConfig::write(
        &Config::new().route(route("all")).yaml(),
        &upstream,
        None,
        0,
    );
    let _daemons = Daemons(vec![config.pid_file()]);
    for taken in [config.proxy, config.admin] {
        let holder = std::net::TcpListener::bind(taken).expect("hold the port");
        for args in [&[][..], &["-d"][..]] {
            let (code, text) = run(args, &config.path);
            assert_eq!(code, 1, "sluice {args:?} with {taken} taken: {text}");
            assert!(
                text.contains(&format!("cannot listen on {taken}: Address already in use")),
                "{text}"
            );
        }
        drop(holder);
    }
    // With the ports free, the same file serves.
    let (code, text) = run(&["-d"], &config.path);
    assert_eq!(code, 0, "{text}");
    assert_eq!(http_get(config.proxy, "/", None, &[]).status, 200);
}

#[test]
fn a_daemon_that_cannot_start_is_reported_by_the_command_that_started_it() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let body = Config::new().route(route("all"));
    let config = GatewayConfig::write(&body.yaml(), &upstream, None, 0);
    let _daemons = Daemons(vec![config.pid_file()]);
    // An address nobody can bind on this machine: the daemon reports why and exits.
    let unbindable = format!("192.0.2.1:{}", free_port());
    let text = std::fs::read_to_string(&config.path).unwrap().replacen(
        &format!("listen: [{}]", config.proxy),
        &format!("listen: [{unbindable}]"),
        1,
    );
    let path = dir.path().join("sluice.yaml");
    std::fs::write(&path, text).unwrap();
    let (code, text) = run(&["-d"], &path);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("cannot listen on {unbindable}")),
        "{text}"
    );
}
