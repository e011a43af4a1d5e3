//! The fault suite's instruments: traffic through several gateways while a fault is injected
//! ([`Load`]), the gateways' decisions sampled every 100 ms ([`Monitor`]), and one row per fault
//! ([`Row`]): what was admitted against the bound the design states for that fault, errors, the
//! worst latency, and how long until every gateway decided by Redis again. The model (the
//! bound) is computed before the fault is injected, Jepsen's habit: a test fails on any excess.
//!
//! `SLUICE_FAULTS=long` makes every load three times as long (`scripts/faults.sh`, the documented
//! long form); `SLUICE_FAULT_TABLE=FILE` appends each row to FILE as a Markdown table row.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Gateway;

/// How long a load runs, in this form of the suite: the short form (CI) or the long one.
pub fn scaled(short: Duration) -> Duration {
    match std::env::var("SLUICE_FAULTS").as_deref() {
        Ok("long") => short * 3,
        _ => short,
    }
}

/// The status of a request that could not connect (nobody listens): not an HTTP status.
pub const REFUSED: u16 = 1;

/// One answer of the load.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Which gateway (its index in the load's targets).
    pub gateway: usize,
    /// 0: connected, but no answer came; [`REFUSED`]: no connection.
    pub status: u16,
    pub latency: Duration,
    /// When it was sent, since the load started.
    pub at: Duration,
}

/// Clients sending requests, each over a new connection, to every target until stopped.
pub struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Vec<Sample>>>,
}

impl Load {
    /// `clients` threads per target, each sending `path` again as soon as it is answered.
    pub fn start(targets: &[SocketAddr], clients: usize, path: &str) -> Load {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = targets
            .iter()
            .enumerate()
            .flat_map(|(gateway, &target)| (0..clients).map(move |_| (gateway, target)))
            .map(|(gateway, target)| {
                let (stop, path) = (Arc::clone(&stop), path.to_string());
                std::thread::spawn(move || {
                    let mut samples = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let sent = Instant::now();
                        let status = try_get(target, &path);
                        samples.push(Sample {
                            gateway,
                            status,
                            latency: sent.elapsed(),
                            at: sent - started,
                        });
                    }
                    samples
                })
            })
            .collect();
        Load {
            started,
            stop,
            threads,
        }
    }

    /// Time since the load started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Stops the clients; every answer, in no particular order.
    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .flat_map(|t| t.join().expect("a load thread"))
            .collect()
    }
}

/// One GET on a new connection; its status, 0 when no answer came within 10 s (or the
/// connection broke), [`REFUSED`] when it could not connect.
pub fn try_get(target: SocketAddr, path: &str) -> u16 {
    let Ok(stream) = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
        return REFUSED;
    };
    let attempt = |mut stream: std::net::TcpStream| -> std::io::Result<u16> {
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head)?;
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        Ok(std::str::from_utf8(&head[9..12])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
    };
    attempt(stream).unwrap_or(0)
}

/// Decisions that say the limiter could not decide (the failure mode applied, or the
/// in-process fallback decided).
const FAILURE_DECISIONS: [&str; 4] = [
    "error_allowed",
    "error_denied",
    "local_allowed",
    "local_limited",
];

/// Each gateway's count of failure-mode decisions, read every 100 ms while the load runs.
pub struct Monitor {
    started: Instant,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<(Duration, f64)>>>,
}

impl Monitor {
    /// Watches the gateways at these admin addresses; times are since `started` (the load's).
    pub fn start(admins: &[SocketAddr], load: &Load) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let (admins, stopping, started) = (admins.to_vec(), Arc::clone(&stop), load.started);
        let thread = std::thread::spawn(move || {
            let mut readings = Vec::new();
            while !stopping.load(Ordering::Relaxed) {
                // Timed when the reading starts: a count that grew did so before it.
                let at = started.elapsed();
                let failures: f64 = admins.iter().map(|&admin| failure_decisions(admin)).sum();
                readings.push((at, failures));
                std::thread::sleep(Duration::from_millis(100));
            }
            readings
        });
        Monitor {
            started,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops watching; the last time the failure-mode count grew (since the load started),
    /// `None` when it never did.
    pub fn stop(mut self) -> Option<Duration> {
        self.stop.store(true, Ordering::Relaxed);
        let readings = self.thread.take()?.join().expect("the monitor");
        let _ = self.started;
        readings
            .windows(2)
            .rev()
            .find(|pair| pair[1].1 > pair[0].1)
            .map(|pair| pair[1].0)
    }
}

/// The failure-mode decisions a gateway has counted so far (0 when it cannot be asked).
fn failure_decisions(admin: SocketAddr) -> f64 {
    let Ok(text) = std::panic::catch_unwind(|| super::http_get(admin, "/metrics", None, &[]).body)
    else {
        return 0.0;
    };
    FAILURE_DECISIONS
        .iter()
        .map(|decision| super::metric(&text, "sluice_requests_total", &[("decision", decision)]))
        .sum()
}

/// Requests a set of gateways admitted by decision, from their own counters.
pub fn decided(gateways: &[&Gateway], decision: &str) -> u64 {
    gateways
        .iter()
        .map(|g| {
            super::metric(
                &g.metrics(),
                "sluice_requests_total",
                &[("decision", decision)],
            ) as u64
        })
        .sum()
}

/// One fault's line in the table of docs/reliability.md.
#[derive(Debug, Clone)]
pub struct Row {
    pub fault: String,
    pub failure_mode: &'static str,
    /// The bound the design states, in words (`limit + lost writes`).
    pub bound_text: String,
    /// The bound in requests, computed before the fault.
    pub bound: u64,
    /// What an exact limiter without the fault would have admitted.
    pub exact: u64,
    pub admitted: u64,
    /// 503 answers (the failure mode refusing, or a gateway that cannot decide).
    pub refused: u64,
    /// Other 5xx answers and failed connections.
    pub errors: u64,
    pub worst_latency: Duration,
    /// From the end of the fault (or its start, when it has no end) until the last answer that
    /// the limiter could not decide.
    pub heal: Option<Duration>,
}

impl Row {
    /// A row for these samples: admitted = 200s, refused = 503s, errors = the rest but 429.
    pub fn of(fault: &str, failure_mode: &'static str, samples: &[Sample]) -> Row {
        let count = |f: &dyn Fn(u16) -> bool| samples.iter().filter(|s| f(s.status)).count() as u64;
        Row {
            fault: fault.to_string(),
            failure_mode,
            bound_text: String::new(),
            bound: 0,
            exact: 0,
            admitted: count(&|s| s == 200),
            refused: count(&|s| s == 503),
            errors: count(&|s| s != 200 && s != 429 && s != 503),
            worst_latency: samples.iter().map(|s| s.latency).max().unwrap_or_default(),
            heal: None,
        }
    }

    pub fn over(&self) -> u64 {
        self.admitted.saturating_sub(self.exact)
    }

    pub fn under(&self) -> u64 {
        self.exact.saturating_sub(self.admitted)
    }

    /// The Markdown line.
    pub fn markdown(&self) -> String {
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} ms | {} |",
            self.fault,
            self.failure_mode,
            self.bound_text,
            self.bound,
            self.exact,
            self.admitted,
            self.over(),
            self.under(),
            if self.errors == 0 {
                self.refused.to_string()
            } else {
                format!("{} + {} other", self.refused, self.errors)
            },
            self.worst_latency.as_secs_f64() * 1e3,
            self.heal
                .map_or("—".to_string(), |d| format!("{:.1} s", d.as_secs_f64())),
        )
    }

    /// Prints the row (and appends it to `SLUICE_FAULT_TABLE`), then fails the test if more
    /// was admitted than the bound.
    pub fn report(&self) {
        let line = self.markdown();
        println!("FAULT-ROW {line}");
        if let Ok(path) = std::env::var("SLUICE_FAULT_TABLE") {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .expect("open the fault table");
            writeln!(file, "{line}").expect("append to the fault table");
        }
        assert!(
            self.admitted <= self.bound,
            "{}: admitted {} beyond the bound {} ({})",
            self.fault,
            self.admitted,
            self.bound,
            self.bound_text
        );
    }
}
