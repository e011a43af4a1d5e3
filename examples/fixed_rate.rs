//! Open-loop load at a fixed rate, for latency at a given throughput (`scripts/bench.sh`).
//!
//! `CONNECTIONS` keep-alive HTTP/1.1 connections each send `GET PATH` on a fixed schedule, so
//! together they offer `RATE` requests per second. Latency is measured from when a request was
//! *scheduled*, not when it was sent: a slow answer delays the ones queued behind it and that delay
//! is counted (no coordinated omission, the flaw `wrk2` and `oha -q` were made to avoid). Prints
//! one line: `sent`, `non2xx`, achieved rate and p50 / p99 / p99.9 / max in microseconds.
//!
//! Usage: fixed_rate HOST:PORT PATH RATE SECONDS CONNECTIONS

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

type Outcome = (Vec<u64>, u64);

/// Sends `count` requests, one every `interval` from `start`; returns latencies (us) and non-2xx.
async fn connection(
    address: SocketAddr,
    request: Vec<u8>,
    start: Instant,
    interval: Duration,
    count: u64,
) -> std::io::Result<Outcome> {
    let stream = TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    let mut stream = BufReader::new(stream);
    let mut latencies = Vec::with_capacity(count as usize);
    let mut non2xx = 0;
    let mut line = String::new();
    for i in 0..count {
        let scheduled = start + interval * i as u32;
        tokio::time::sleep_until(scheduled.into()).await;
        stream.get_mut().write_all(&request).await?;
        // Status line, headers up to the blank line, then Content-Length bytes of body.
        line.clear();
        stream.read_line(&mut line).await?;
        if !line.starts_with("HTTP/1.1 2") {
            non2xx += 1;
        }
        let mut length = 0usize;
        loop {
            line.clear();
            if stream.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await?;
        latencies.push(scheduled.elapsed().as_micros() as u64);
    }
    Ok((latencies, non2xx))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [address, path, rate, seconds, connections] = args.as_slice() else {
        return Err("usage: fixed_rate HOST:PORT PATH RATE SECONDS CONNECTIONS".into());
    };
    let address: SocketAddr = address.parse().map_err(|e| format!("{address}: {e}"))?;
    let number = |text: &str| text.parse::<u64>().map_err(|e| format!("{text}: {e}"));
    let (rate, seconds, connections) = (number(rate)?, number(seconds)?, number(connections)?);
    if rate == 0 || connections == 0 {
        return Err("RATE and CONNECTIONS must be at least 1".into());
    }
    let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n").into_bytes();
    let interval = Duration::from_secs_f64(connections as f64 / rate as f64);
    let per_connection = rate * seconds / connections;
    let start = Instant::now() + Duration::from_millis(100);
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            // Connections start evenly spread over one interval.
            let offset = interval * c as u32 / connections as u32;
            let request = request.clone();
            tokio::spawn(connection(
                address,
                request,
                start + offset,
                interval,
                per_connection,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    let mut non2xx = 0;
    for task in tasks {
        let (mut l, n) = task
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("connection: {e}"))?;
        latencies.append(&mut l);
        non2xx += n;
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    println!(
        "sent {} non2xx {non2xx} rate {:.0} p50_us {} p99_us {} p999_us {} max_us {}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        percentile(&latencies, 99.9),
        latencies.last().copied().unwrap_or(0),
    );
    Ok(())
}
