//! Daemons started by tests are not their children: they are found by pid file, watched through
//! /proc, and killed by pid when the test ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Kills every pid these pid files name when dropped.
pub struct Daemons(pub Vec<PathBuf>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for file in &self.0 {
            if let Ok(pid) = std::fs::read_to_string(file) {
                let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            }
        }
    }
}

pub fn read_pid(file: &Path) -> u32 {
    std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("pid file {}: {e}", file.display()))
        .trim()
        .parse()
        .expect("numeric pid")
}

/// The process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// Waits up to `timeout` for `pid` to exit; whether it did.
pub fn exits_within(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    !alive(pid)
}

/// `clients` (one at a time) new connections every 20 ms for `requests` requests, from a
/// thread: what a reload or an upgrade must not disturb. Each request's status, 0 for a
/// refused or failed connection.
pub fn steady_load(
    address: std::net::SocketAddr,
    requests: usize,
) -> std::thread::JoinHandle<Vec<u16>> {
    std::thread::spawn(move || {
        (0..requests)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(20));
                std::panic::catch_unwind(|| super::http_get(address, "/during", None, &[]).status)
                    .unwrap_or(0)
            })
            .collect()
    })
}

/// The admin listener at `admin` reports the `process_*` metrics of `pid`, the process that
/// serves: resident memory, more than one thread (Pingora's), and the start time the kernel
/// gives for `pid` — not those of a process that started it and exited.
pub fn assert_process_metrics_of(admin: std::net::SocketAddr, pid: u32) {
    let text = super::http_get(admin, "/metrics", None, &[]).body;
    for family in [
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_threads",
    ] {
        assert!(
            text.contains(&format!("\n{family} ")),
            "{family} missing (serving pid {pid})"
        );
    }
    let value = |name| super::metric(&text, name, &[]);
    assert!(
        value("process_resident_memory_bytes") > 0.0,
        "resident memory of pid {pid}"
    );
    assert!(value("process_threads") > 1.0, "threads of pid {pid}");
    assert_eq!(
        value("process_start_time_seconds"),
        start_time_seconds(pid) as f64,
        "the start time of pid {pid}, the serving process"
    );
}

/// When `pid` started, in whole seconds since the epoch, as Prometheus's process collector
/// counts it: `starttime` of /proc/<pid>/stat (clock ticks since boot) plus `btime` of
/// /proc/stat.
fn start_time_seconds(pid: u32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    // The command (field 2) may hold spaces: fields count from after its closing parenthesis,
    // where field 3 begins; `starttime` is field 22.
    let after = &stat[stat.rfind(')').expect("(comm)") + 1..];
    let ticks: i64 = after
        .split_whitespace()
        .nth(22 - 3)
        .and_then(|field| field.parse().ok())
        .expect("starttime in /proc/<pid>/stat");
    let boot: i64 = std::fs::read_to_string("/proc/stat")
        .expect("/proc/stat")
        .lines()
        .find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())
        .expect("btime in /proc/stat");
    let output = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf CLK_TCK");
    let hz: i64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK is a number");
    ticks / hz + boot
}
