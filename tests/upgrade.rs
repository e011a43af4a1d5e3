//! `-d` and `-u`: sluice daemonizes, and a new instance takes the listening sockets over from
//! the old one (Pingora's graceful upgrade) without refusing or failing a single request.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::{http_get, GatewayConfig, Upstream};

/// Daemons are not our children: reap every pid their pid files name when the test ends.
struct Daemons(Vec<PathBuf>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for file in &self.0 {
            if let Ok(pid) = std::fs::read_to_string(file) {
                let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            }
        }
    }
}

fn read_pid(file: &Path) -> u32 {
    std::fs::read_to_string(file)
        .expect("pid file")
        .trim()
        .parse()
        .expect("numeric pid")
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

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
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(config.proxy).is_err() || !pid_file.exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not start serving"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let old = read_pid(&pid_file);
    assert_eq!(http_get(config.proxy, "/before", None, &[]).status, 200);

    let proxy = config.proxy;
    let load = std::thread::spawn(move || {
        (0..120)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(20));
                std::panic::catch_unwind(|| http_get(proxy, "/during", None, &[]).status)
                    .unwrap_or(0)
            })
            .collect::<Vec<u16>>()
    });
    std::thread::sleep(Duration::from_millis(300));
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
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(old) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(old), "the old instance drains and exits");
    assert!(alive(new));
    assert_eq!(http_get(config.proxy, "/after", None, &[]).status, 200);
    assert_eq!(upstream.served(), 122);
}
