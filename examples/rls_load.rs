//! Closed-loop load on Envoy's rate limit service (`scripts/rls-bench.sh`): `CONCURRENCY` calls
//! in flight over `CHANNELS` HTTP/2 connections for `SECONDS`, each `ShouldRateLimit` carrying
//! `DESCRIPTORS` descriptors (`client`, then `path` and `route` when 3) of a client drawn from
//! 100,000. Prints one line: calls, calls/s, OK and OVER_LIMIT answers, errors, p50 / p99 in µs.
//!
//! Usage: rls_load HOST:PORT DOMAIN SECONDS CONCURRENCY DESCRIPTORS [CHANNELS (default 4)]

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

fn descriptor(key: &str, value: String) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_string(),
            value,
        }],
        ..RateLimitDescriptor::default()
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: rls_load HOST:PORT DOMAIN SECONDS CONCURRENCY DESCRIPTORS [CHANNELS]";
    let [_, address, domain, seconds, concurrency, descriptors, rest @ ..] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let seconds: u64 = seconds.parse().expect("SECONDS");
    let concurrency: usize = concurrency.parse().expect("CONCURRENCY");
    let descriptors: usize = descriptors.parse().expect("DESCRIPTORS");
    let channels: usize = rest.first().map_or(4, |c| c.parse().expect("CHANNELS"));
    let mut clients = Vec::new();
    for _ in 0..channels {
        let client = RateLimitServiceClient::connect(format!("http://{address}"))
            .await
            .expect("connect");
        clients.push(client);
    }
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let mut client = clients[task % channels].clone();
        let domain = domain.clone();
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut ok, mut over, mut errors) = (Vec::new(), 0u64, 0u64, 0u64);
            let mut n = task as u64;
            while Instant::now() < until {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let who = format!("c{}", (n >> 33) % 100_000);
                let mut list = vec![descriptor("client", who.clone())];
                if descriptors >= 3 {
                    list.push(descriptor("path", format!("{who}/p{}", (n >> 20) % 8)));
                    list.push(descriptor("route", "api".to_string()));
                }
                let request = RateLimitRequest {
                    domain: domain.clone(),
                    descriptors: list,
                    hits_addend: 0,
                };
                let sent = Instant::now();
                match client.should_rate_limit(request).await {
                    Ok(answer) if answer.get_ref().overall_code == 1 => ok += 1,
                    Ok(_) => over += 1,
                    Err(_) => errors += 1,
                }
                latencies.push(sent.elapsed().as_micros() as u64);
            }
            (latencies, ok, over, errors)
        }));
    }
    let (mut latencies, mut ok, mut over, mut errors) = (Vec::new(), 0, 0, 0);
    for task in tasks {
        let (l, o, v, e) = task.await.expect("task");
        latencies.extend(l);
        ok += o;
        over += v;
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "calls {} rate {:.0} ok {ok} over_limit {over} errors {errors} p50_us {} p99_us {}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        at(0.5),
        at(0.99)
    );
}
