//! Cardinality flood: many distinct random paths from many source addresses through sluice,
//! then watch the number of Redis keys and `used_memory` drain back to the baseline.
//! Run by `scripts/cardinality.sh`, which starts Redis, an upstream and sluice on loopback.
//!
//! Usage: cardinality PROXY_ADDR REDIS_URL ADDRESSES REQUESTS_PER_ADDRESS

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn redis_stats(con: &mut redis::Connection) -> (u64, u64) {
    let keys: u64 = redis::cmd("DBSIZE").query(con).expect("DBSIZE");
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(con)
        .expect("INFO memory");
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (keys, used)
}

/// One keep-alive connection from `source`, sending `count` GETs of random paths.
fn client(proxy: SocketAddr, source: [u8; 4], count: u64, seed: u64, statuses: &[AtomicU64; 6]) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket
        .bind(&SocketAddr::from((source, 0)).into())
        .expect("bind source");
    socket.connect(&proxy.into()).expect("connect");
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let mut state = seed | 1;
    for _ in 0..count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let request = format!("GET /flood/{state:016x} HTTP/1.1\r\nHost: flood\r\n\r\n");
        writer.write_all(request.as_bytes()).expect("write");
        let mut line = String::new();
        reader.read_line(&mut line).expect("status line");
        let status: usize = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("header");
            if header == "\r\n" || header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        statuses[(status / 100).min(5)].fetch_add(1, Ordering::Relaxed);
    }
}

/// Resident set size of a process, from /proc.
fn rss_kib(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (proxy, redis_url, addresses, per_address, gateway_pid) = match args.as_slice() {
        [_, proxy, redis_url, addresses, per_address] => {
            (proxy, redis_url, addresses, per_address, None)
        }
        [_, proxy, redis_url, addresses, per_address, pid] => {
            (proxy, redis_url, addresses, per_address, Some(pid.clone()))
        }
        _ => {
            eprintln!(
                "usage: cardinality PROXY_ADDR REDIS_URL ADDRESSES REQUESTS_PER_ADDRESS [GATEWAY_PID]"
            );
            std::process::exit(2);
        }
    };
    let proxy: SocketAddr = proxy.parse().expect("proxy address");
    let addresses: u64 = addresses.parse().expect("addresses");
    let per_address: u64 = per_address.parse().expect("requests per address");
    let mut con = redis::Client::open(redis_url.as_str())
        .and_then(|c| c.get_connection())
        .expect("redis");

    let (base_keys, base_memory) = redis_stats(&mut con);
    println!("baseline: {base_keys} keys, used_memory {base_memory} bytes");
    let statuses: Arc<[AtomicU64; 6]> = Arc::new(Default::default());
    let started = Instant::now();
    let workers = 32;
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let statuses = Arc::clone(&statuses);
            std::thread::spawn(move || {
                for a in (w..addresses).step_by(workers as usize) {
                    let source = [127, 1, (a / 256) as u8, (a % 256) as u8];
                    client(
                        proxy,
                        source,
                        per_address,
                        a.wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        &statuses,
                    );
                }
            })
        })
        .collect();
    // The gateway's resident memory while the distinct keys pour in: it should stay flat.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = gateway_pid.map(|pid| {
        let (statuses, done) = (Arc::clone(&statuses), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut rss = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let sent: u64 = statuses.iter().map(|c| c.load(Ordering::Relaxed)).sum();
                if let Some(kib) = rss_kib(&pid) {
                    println!(
                        "+{:.0} s: {sent} requests answered, gateway RSS {:.1} MiB",
                        started.elapsed().as_secs_f64(),
                        kib as f64 / 1024.0
                    );
                    rss.push(kib);
                }
                std::thread::sleep(Duration::from_secs(5));
            }
            rss
        })
    });
    for thread in threads {
        thread.join().expect("worker");
    }
    done.store(true, Ordering::Relaxed);
    if let Some(rss) = sampler.map(|s| s.join().expect("sampler")) {
        let mib = |kib: u64| kib as f64 / 1024.0;
        let (first, max) = (
            rss.first().copied().unwrap_or(0),
            rss.iter().copied().max().unwrap_or(0),
        );
        let last = rss.last().copied().unwrap_or(0);
        println!(
            "gateway RSS: first sample {:.1} MiB, max {:.1} MiB, last {:.1} MiB",
            mib(first),
            mib(max),
            mib(last)
        );
    }
    let elapsed = started.elapsed();
    let total = addresses * per_address;
    let counts: Vec<u64> = statuses.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    println!(
        "sent {total} requests ({addresses} addresses x {per_address} random paths) in {:.1} s: 2xx {}, 4xx {}, 5xx {}",
        elapsed.as_secs_f64(),
        counts[2],
        counts[4],
        counts[5]
    );
    let (peak_keys, peak_memory) = redis_stats(&mut con);
    println!("right after: {peak_keys} keys, used_memory {peak_memory} bytes");
    let drain_started = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let (keys, memory) = redis_stats(&mut con);
        let at = drain_started.elapsed().as_secs_f64();
        println!("+{at:.1} s: {keys} keys, used_memory {memory} bytes");
        if keys <= base_keys || drain_started.elapsed() > Duration::from_secs(60) {
            println!(
                "drained to {keys} keys in {at:.1} s; used_memory {memory} bytes (baseline {base_memory}, peak {peak_memory})"
            );
            break;
        }
    }
}
