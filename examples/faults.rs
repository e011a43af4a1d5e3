//! Redis faults under steady load, measured: two sluice gateways share one Redis; a load of
//! keep-alive clients runs while Redis is killed (and restarted) and then paused with
//! `CLIENT PAUSE`. Prints, per phase and failure mode, the requests, their statuses and the
//! slowest one. Run by `scripts/faults.sh` (release build, loopback only, bounded in time).
//!
//! Usage: faults TARGET_DIR   (where the release `sluice` and `demo-upstream` binaries are)

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn wait_for(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{addr} did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis(port: u16) -> Reaped {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    wait_for(SocketAddr::from(([127, 0, 0, 1], port)));
    Reaped(child)
}

fn gateway(
    bin: &Path,
    dir: &Path,
    name: &str,
    upstream: SocketAddr,
    redis_port: u16,
    mode: &str,
) -> (Reaped, SocketAddr) {
    let proxy = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "server: {{ threads: 2, pid_file: {d}/{name}.pid, upgrade_sock: {d}/{name}.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }}\n\
             listen: [{proxy}]\nredis: {{ url: \"redis://127.0.0.1:{redis_port}/0\", timeout_ms: 25 }}\nfailure_mode: {mode}\ninstances: 2\n\
             routes:\n  - name: api\n    match: {{ path_prefix: / }}\n    upstream: {{ servers: [{upstream}] }}\n    limits:\n      - {{ name: per_client, key: [client_ip, path], rate: 1000/s, burst: 1000 }}\n",
            d = dir.display()
        ),
    )
    .expect("config");
    let child = Command::new(bin.join("sluice"))
        .arg("-c")
        .arg(&config)
        .env("RUST_LOG", "error")
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice");
    wait_for(proxy);
    (Reaped(child), proxy)
}

/// Keep-alive GETs until `stop`; records (status, latency) of each.
fn load(
    proxy: SocketAddr,
    path: String,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<(u16, Duration)>>>,
) {
    let mut results = Vec::new();
    'connect: while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(proxy) else {
            results.push((0, Duration::ZERO));
            continue;
        };
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut writer = stream.try_clone().expect("clone");
        let mut reader = BufReader::new(stream);
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            if writer
                .write_all(format!("GET {path} HTTP/1.1\r\nHost: faults\r\n\r\n").as_bytes())
                .is_err()
            {
                results.push((0, started.elapsed()));
                continue 'connect;
            }
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                results.push((0, started.elapsed()));
                continue 'connect;
            }
            let status = line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let mut length = 0;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
                if let Some((n, v)) = header.split_once(':') {
                    if n.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            results.push((status, started.elapsed()));
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    out.lock().expect("results").extend(results);
}

fn report(phase: &str, mode: &str, results: &[(u16, Duration)]) {
    let count = |f: &dyn Fn(u16) -> bool| results.iter().filter(|(s, _)| f(*s)).count();
    let mut latencies: Vec<Duration> = results.iter().map(|(_, l)| *l).collect();
    latencies.sort();
    let p99 = latencies
        .get(latencies.len() * 99 / 100)
        .copied()
        .unwrap_or_default();
    let max = latencies.last().copied().unwrap_or_default();
    println!(
        "| {phase} | {mode} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
        results.len(),
        count(&|s| s == 200),
        count(&|s| s == 429),
        count(&|s| (500..600).contains(&s)),
        count(&|s| s == 0),
        p99.as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    );
}

fn main() {
    let bin = PathBuf::from(std::env::args().nth(1).expect("usage: faults TARGET_DIR"));
    let dir = std::env::temp_dir().join(format!("sluice-faults-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let upstream_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _upstream = Reaped(
        Command::new(bin.join("demo-upstream"))
            .arg(upstream_addr.to_string())
            .stderr(Stdio::null())
            .spawn()
            .expect("upstream"),
    );
    wait_for(upstream_addr);
    println!("| fault | failure_mode | requests | 200 | 429 | 5xx | failed | p99 ms | max ms |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for mode in ["allow", "deny", "local"] {
        for phase in ["redis killed 3 s", "CLIENT PAUSE 2 s"] {
            let redis_port = free_port();
            let mut server = Some(redis(redis_port));
            let (_a, proxy_a) = gateway(
                &bin,
                &dir,
                &format!("{mode}-a"),
                upstream_addr,
                redis_port,
                mode,
            );
            let (_b, proxy_b) = gateway(
                &bin,
                &dir,
                &format!("{mode}-b"),
                upstream_addr,
                redis_port,
                mode,
            );
            // Warm both gateways' Redis connections.
            let stop = Arc::new(AtomicBool::new(false));
            let results = Arc::new(Mutex::new(Vec::new()));
            let clients: Vec<_> = (0..8)
                .map(|i| {
                    let proxy = if i % 2 == 0 { proxy_a } else { proxy_b };
                    let (stop, results) = (Arc::clone(&stop), Arc::clone(&results));
                    std::thread::spawn(move || load(proxy, format!("/c{i}"), stop, results))
                })
                .collect();
            std::thread::sleep(Duration::from_secs(1));
            if phase.starts_with("redis killed") {
                drop(server.take());
                std::thread::sleep(Duration::from_secs(3));
                server = Some(redis(redis_port));
            } else {
                let mut con = TcpStream::connect(("127.0.0.1", redis_port)).expect("redis");
                con.write_all(b"CLIENT PAUSE 2000 ALL\r\n").expect("pause");
                std::thread::sleep(Duration::from_millis(2500));
            }
            std::thread::sleep(Duration::from_secs(1));
            stop.store(true, Ordering::Relaxed);
            for client in clients {
                client.join().expect("client");
            }
            report(phase, mode, &results.lock().expect("results"));
            drop(server);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
