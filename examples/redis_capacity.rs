//! Redis capacity per algorithm: how many limiter decisions one Redis core makes per second.
//!
//! Drives sluice's own Redis backend (the real script, keys built by the real key builder) with
//! many concurrent calls over one multiplexed connection, every call allowed (the full write
//! path), keys spread over 100,000 clients. For each scenario it reads Redis's own accounting:
//! CPU seconds used (`INFO cpu`) and `usec_per_call` of FCALL (`INFO commandstats`), and prints
//! decisions per second achieved and decisions per Redis CPU-second (what one core can make).
//! With MAX_BATCH above 1, decisions that arrive while a call is in flight go together in the
//! next call, as the gateway sends them (`limiter::coalesce`).
//! Run by `scripts/redis-capacity.sh`, which starts a throwaway redis-server on loopback.
//!
//! Usage: redis_capacity REDIS_URL SECONDS_PER_SCENARIO CONCURRENCY [MAX_BATCH (default 1)]

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use sluice::config::Config;
use sluice::limiter::redis::RedisLimiter;
use sluice::limiter::script::{decision_script, Algorithms};
use sluice::limiter::{Coalescing, LimitRequest, Limiter, RequestId, Scale, Topology};
use sluice::route::keys::{RequestFacts, Rotation};

/// One route per scenario; every limit generous enough that all calls are allowed.
const SCENARIOS: &str = r#"
listen: [127.0.0.1:1]
routes:
  - name: gcra
    match: { path_prefix: /gcra }
    upstream: { servers: [127.0.0.1:1] }
    limits: [{ name: l, key: [client_ip], algorithm: gcra, rate: 1000000/s, burst: 1000000 }]
  - name: fixed_window
    match: { path_prefix: /fixed_window }
    upstream: { servers: [127.0.0.1:1] }
    limits: [{ name: l, key: [client_ip], algorithm: fixed_window, rate: 1000000/m }]
  - name: sliding_window
    match: { path_prefix: /sliding_window }
    upstream: { servers: [127.0.0.1:1] }
    limits: [{ name: l, key: [client_ip], algorithm: sliding_window, rate: 1000000/m }]
  - name: sliding_log
    match: { path_prefix: /sliding_log }
    upstream: { servers: [127.0.0.1:1] }
    limits: [{ name: l, key: [client_ip], algorithm: sliding_log, rate: 10000/10s }]
  - name: concurrency
    match: { path_prefix: /concurrency }
    upstream: { servers: [127.0.0.1:1] }
    limits: [{ name: l, key: [client_ip], algorithm: concurrency, max: 10000, lease: 1s }]
  - name: gcra_x3
    match: { path_prefix: /gcra_x3 }
    upstream: { servers: [127.0.0.1:1] }
    limits:
      - { name: per_client, key: [client_ip], algorithm: gcra, rate: 1000000/s, burst: 1000000 }
      - { name: per_path, key: [client_ip, path], algorithm: gcra, rate: 1000000/s, burst: 1000000 }
      - { name: per_route, key: [client_ip, route], algorithm: gcra, rate: 1000000/s, burst: 1000000 }
"#;

const CLIENTS: u32 = 100_000;

fn info_field(info: &str, field: &str) -> f64 {
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn redis_cpu_seconds(con: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).expect("INFO cpu");
    info_field(&info, "used_cpu_user:") + info_field(&info, "used_cpu_sys:")
}

/// `(calls, usec_per_call)` of FCALL (the decision calls) since the last CONFIG RESETSTAT.
fn fcall_stats(con: &mut redis::Connection) -> (u64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO commandstats");
    let line = info
        .lines()
        .find(|l| l.starts_with("cmdstat_fcall:"))
        .unwrap_or("");
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("calls=") as u64, field("usec_per_call="))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, seconds, concurrency, max_batch) = match &args[..] {
        [_, url, seconds, concurrency] => (url, seconds, concurrency, "1"),
        [_, url, seconds, concurrency, max_batch] => {
            (url, seconds, concurrency, max_batch.as_str())
        }
        _ => {
            eprintln!(
                "usage: redis_capacity REDIS_URL SECONDS_PER_SCENARIO CONCURRENCY [MAX_BATCH]"
            );
            std::process::exit(2);
        }
    };
    let seconds: f64 = seconds.parse().expect("seconds");
    let concurrency: usize = concurrency.parse().expect("concurrency");
    let max_batch: usize = max_batch.parse().expect("max batch");
    let sizes = sluice::limiter::meters::Histogram::new(prometheus::DEFAULT_BUCKETS);
    let config = Config::from_yaml(Path::new("scenarios.yaml"), SCENARIOS).expect("scenarios");
    let limiter = Arc::new(
        RedisLimiter::new(
            &Topology::Standalone { url: url.clone() },
            &Default::default(),
            Duration::from_secs(2),
            Coalescing {
                max_batch,
                sizes: sizes.clone(),
            },
        )
        .expect("redis url"),
    );
    let mut admin = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connect to redis");

    println!(
        "| scenario | limits | max batch | decisions per call | decisions/s (this client) | FCALL usec_per_call | Redis CPU µs/decision | decisions per Redis core-second |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for route in config.routes.in_file_order() {
        let _: () = redis::cmd("FLUSHALL").query(&mut admin).expect("FLUSHALL");
        // The route's library (of exactly its algorithms) is loaded up front, so the first
        // call's refusal does not count as an extra FCALL.
        let algorithms = Algorithms::of_limits(route.tiers.written());
        let _: () = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&decision_script(algorithms).library)
            .query(&mut admin)
            .expect("FUNCTION LOAD");
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut admin)
            .expect("CONFIG RESETSTAT");
        let cpu_before = redis_cpu_seconds(&mut admin);
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + Duration::from_secs_f64(seconds);
        let tasks: Vec<_> = (0..concurrency)
            .map(|task| {
                let (limiter, route, done) =
                    (Arc::clone(&limiter), Arc::clone(route), Arc::clone(&done));
                tokio::spawn(async move {
                    let headers = HeaderMap::new();
                    let mut state = (task as u64 + 1) * 0x9E37_79B9_7F4A_7C15;
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        let client = (state % u64::from(CLIENTS)) as u32;
                        let facts = RequestFacts {
                            client_ip: IpAddr::V4(Ipv4Addr::from(0x0A00_0000 | client)),
                            method: "GET",
                            host: "bench",
                            path: "/bench",
                            query: None,
                            headers: &headers,
                            route: &route.name,
                            consumer: None,
                            claim_names: &[],
                        };
                        let tier = route.tiers.default();
                        let mut records = tier.records(&facts, &Rotation::default()).expect("keys");
                        let asked = tier.asked(&mut records).expect("the tier's records");
                        let entries = asked.entries(Scale::Exact);
                        n += 1;
                        let request = LimitRequest {
                            id: RequestId(u128::from(state) << 32 | u128::from(n)),
                            ..LimitRequest::new(&entries)
                        };
                        let decision = limiter.check(&request).await.expect("decision");
                        assert!(decision.denied_by.is_none(), "every call is allowed");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = redis_cpu_seconds(&mut admin) - cpu_before;
        let (calls, usec_per_call) = fcall_stats(&mut admin);
        let decisions = done.load(Ordering::Relaxed);
        if max_batch == 1 {
            assert_eq!(calls, decisions, "exactly one FCALL per decision");
        }
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} |",
            route.name,
            route.tiers.default().limits.len(),
            max_batch,
            decisions as f64 / calls.max(1) as f64,
            decisions as f64 / elapsed,
            usec_per_call,
            cpu * 1e6 / decisions as f64,
            decisions as f64 / cpu,
        );
    }
}
