//! `systemd/sluice.service` passes `systemd-analyze verify` without a single warning, and agrees
//! with where sluice puts its pid file under systemd.

mod support;

use std::process::Command;

#[test]
fn the_unit_verifies_cleanly() {
    let unit = std::fs::read_to_string(support::repo_path("systemd/sluice.service"))
        .expect("read the unit");
    // verify insists that ExecStart binaries exist: point them at the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/sluice", env!("CARGO_BIN_EXE_sluice")),
    )
    .unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("systemd-analyze is required ({e}): scripts/test.sh installs it (apt-get install systemd)"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "systemd-analyze verify failed: {stderr}"
    );
    assert_eq!(stderr.trim(), "", "systemd-analyze verify warned");
}

#[test]
fn the_unit_matches_the_runtime_directory_convention() {
    let unit = std::fs::read_to_string(support::repo_path("systemd/sluice.service")).unwrap();
    let position = |line: &str| unit.lines().position(|l| l == line);
    assert!(
        position("ExecReload=/usr/bin/sluice -u -d -c /etc/sluice/sluice.yaml")
            < position("ExecReload=/bin/kill -QUIT $MAINPID"),
        "the new instance must be started before the old one is told to hand over"
    );
    for line in [
        "Type=forking",
        "RuntimeDirectory=sluice",
        "PIDFile=/run/sluice/sluice.pid",
        "ExecStartPre=/usr/bin/sluice -t -c /etc/sluice/sluice.yaml",
        "ExecReload=/usr/bin/sluice -u -d -c /etc/sluice/sluice.yaml",
        "ExecReload=/bin/kill -QUIT $MAINPID",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "DynamicUser=yes",
        "LogsDirectory=sluice",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing {line:?}");
    }
}

/// Under `ProtectSystem=strict` only the unit's own directories are writable: the access log
/// path the docs suggest lies in the unit's `LogsDirectory=`.
#[test]
fn the_documented_access_log_path_is_writable_under_the_unit() {
    let unit = std::fs::read_to_string(support::repo_path("systemd/sluice.service")).unwrap();
    let operations = std::fs::read_to_string(support::repo_path("docs/operations.md")).unwrap();
    let logs: Vec<String> = unit_values(&unit, "LogsDirectory")
        .iter()
        .map(|dir| format!("/var/log/{dir}/"))
        .collect();
    let documented: Vec<&str> = operations
        .split_whitespace()
        .filter(|word| word.starts_with("/var/log/") && word.ends_with(".log"))
        .collect();
    assert!(
        !documented.is_empty(),
        "docs/operations.md suggests a log file"
    );
    for path in documented {
        assert!(
            logs.iter().any(|dir| path.starts_with(dir.as_str())),
            "{path} is not under the unit's LogsDirectory= ({logs:?})"
        );
    }
}

/// The values of `key=` in the unit, in order.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}=");
    unit.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(str::to_string)
        .collect()
}

/// The unit's own start, reload and stop sequence, run as systemd would run it but without
/// systemd: `ExecStartPre`, `ExecStart` with `RUNTIME_DIRECTORY` set (it returns once serving;
/// the pid file appears in the runtime directory and names the live daemon), every
/// `ExecReload` step in order while clients keep connecting (none refused; the new pid replaces
/// the old, which drains and exits), then `KillSignal` to the main pid (it exits within
/// `TimeoutStopSec`). Limits are in Redis; the `process_*` metrics are the daemon's own after
/// the start and after the reload.
#[test]
fn the_units_start_reload_and_stop_sequence_serves_throughout() {
    use std::time::Duration;
    use support::config::{route, Config};
    use support::daemons::{
        alive, assert_process_metrics_of, exits_within, read_pid, steady_load, Daemons,
    };
    use support::limits::gcra;

    let unit = std::fs::read_to_string(support::repo_path("systemd/sluice.service")).unwrap();
    let upstream = support::Upstream::start();
    let redis = support::RedisServer::start();
    let runtime = tempfile::tempdir().unwrap();
    let etc = tempfile::tempdir().unwrap();
    let proxy: std::net::SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    // As an operator writes it: no pid_file or upgrade_sock (the runtime directory holds them).
    let access_log = etc.path().join("access.log");
    let body = Config::new()
        .set(
            "access_log",
            format!("{{ enabled: true, path: {} }}", access_log.display()),
        )
        .redis(redis.url())
        .route(
            route("all")
                .servers(&[upstream.addr])
                .limit(gcra("per_client", "1000/s").key(&["client_ip"])),
        )
        .yaml();
    // The daemon (it forked after reading the config) writes its access log.
    let logged = |path: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let text = std::fs::read_to_string(&access_log).unwrap_or_default();
            if text.contains(&format!("\"path\":\"{path}\"")) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    };
    let config = etc.path().join("sluice.yaml");
    std::fs::write(
        &config,
        format!(
            "server:\n  grace_period_seconds: 1\n  graceful_shutdown_timeout_seconds: 1\nlisten: [{proxy}]\nadmin: {{ listen: {admin} }}\n{body}"
        ),
    )
    .unwrap();
    let pid_file = runtime.path().join("sluice.pid");
    let _daemons = Daemons(vec![pid_file.clone(), pid_file.with_extension("pid.old")]);
    let log = runtime.path().join("sluice.log");
    // `$MAINPID` is the pid systemd read from the pid file when the start (or the last reload)
    // completed, not the file's content while a reload is under way.
    let run = |command: &str, main_pid: Option<u32>| {
        let command = command
            .replace("/usr/bin/sluice", env!("CARGO_BIN_EXE_sluice"))
            .replace("/etc/sluice/sluice.yaml", &config.display().to_string())
            .replace(
                "$MAINPID",
                &main_pid.map_or(String::new(), |p| p.to_string()),
            );
        let argv: Vec<&str> = command.split_whitespace().collect();
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let status = Command::new(argv[0])
            .args(&argv[1..])
            .env("RUNTIME_DIRECTORY", runtime.path())
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .status()
            .unwrap_or_else(|e| panic!("{command}: {e}"));
        assert!(
            status.success(),
            "{command} exited with {status}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    };

    for command in unit_values(&unit, "ExecStartPre") {
        run(&command, None);
    }
    for command in unit_values(&unit, "ExecStart") {
        run(&command, None);
    }
    let old = read_pid(&pid_file);
    assert!(
        alive(old),
        "the pid file in the runtime directory names the daemon"
    );
    assert_eq!(support::http_get(proxy, "/started", None, &[]).status, 200);
    assert!(logged("/started"), "the daemon writes its access log");
    assert_process_metrics_of(admin, old);

    let before = upstream.served();
    let load = steady_load(proxy, 100);
    support::eventually(Duration::from_secs(10), "the load is under way", || {
        upstream.served() >= before + 5
    });
    for command in unit_values(&unit, "ExecReload") {
        run(&command, Some(old));
    }
    let statuses = load.join().unwrap();
    assert!(
        statuses.iter().all(|&s| s == 200),
        "a request failed or was refused during the reload: {statuses:?}"
    );
    let new = read_pid(&pid_file);
    assert_ne!(new, old, "the new pid replaced the old");
    assert!(
        exits_within(old, Duration::from_secs(10)),
        "the old one drained and exited: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(support::http_get(proxy, "/reloaded", None, &[]).status, 200);
    assert!(logged("/reloaded"), "so does the one that took over");
    assert_process_metrics_of(admin, new);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("No incoming socket transfer"),
        "waiting for the old instance's sockets is routine, not an ERROR: {text}"
    );

    let signal = unit_values(&unit, "KillSignal").pop().expect("KillSignal");
    let stop_timeout: u64 = unit_values(&unit, "TimeoutStopSec")
        .pop()
        .expect("TimeoutStopSec")
        .parse()
        .unwrap();
    let status = Command::new("kill")
        .args([
            &format!("-{}", signal.trim_start_matches("SIG")),
            &new.to_string(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        exits_within(new, Duration::from_secs(stop_timeout)),
        "stopped within TimeoutStopSec"
    );
}
