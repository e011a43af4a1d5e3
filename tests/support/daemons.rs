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
