//! The access log: one JSON object per line and request, sampled, written by a thread of its
//! own so a slow disk never holds a request. Lines go to stdout (the journal, under systemd) or
//! are appended to a file, which SIGUSR1 and every reload open again by name: logrotate moves
//! the file, signals, and the next line starts the new one; the lines buffered before the signal
//! are written to the old one, none is lost.
//!
//! A request appends its line to a shared buffer and wakes nobody; the writer takes the buffer
//! every `FLUSH_EVERY` (as nginx's `access_log ... buffer= flush=`), so logging costs a request
//! no system call and no thread wake-up. The buffer is bounded: when the writer falls that far
//! behind, a line is dropped and counted (`sluice_access_log_dropped_total`) rather than the
//! request kept waiting.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::HeaderName;
use prometheus::IntCounter;
use serde::Serialize;

use crate::caller::client_cert::ClientCertificate;
use crate::config::observe::{AccessLogSettings, LogTarget};

/// Bytes waiting for the writer, at most.
const MAX_PENDING: usize = 8 << 20;
/// How often the writer takes what is buffered.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// The longest host, path or header value a line carries; longer ones are cut (on a character
/// boundary) and end in `...`.
pub const MAX_FIELD_BYTES: usize = 1024;
/// The longest logged header value.
pub const MAX_HEADER_BYTES: usize = 256;

/// One request, as logged. Client-supplied text is bounded before it gets here (`bounded`).
#[derive(Serialize)]
pub struct Line<'a> {
    /// When the request ended, RFC 3339 UTC with milliseconds.
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<&'a str>,
    /// The client the request was keyed on: the peer, or the first untrusted forwarding hop.
    pub client: Option<IpAddr>,
    /// The TCP peer.
    pub peer: Option<SocketAddr>,
    pub method: &'a str,
    pub host: &'a str,
    /// The normalized path (what routing and keys saw), without the query.
    pub path: &'a str,
    pub protocol: &'static str,
    pub route: Option<&'a str>,
    /// The verified caller (routes with `auth:`), and its plan.
    pub consumer: Option<&'a str>,
    pub plan: Option<&'a str>,
    /// Why the caller was refused before any limit (`sluice_auth_failures_total`'s reasons).
    pub auth_failure: Option<&'static str>,
    /// 0 when nothing was answered (the client left first).
    pub status: u16,
    /// Request body bytes received.
    pub bytes_in: u64,
    /// Response body bytes sent.
    pub bytes_out: u64,
    pub duration_ms: f64,
    pub upstream: Option<SocketAddr>,
    /// Connect and time to the upstream's response head.
    pub upstream_ms: Option<f64>,
    /// The limiter's outcome (`sluice_requests_total`'s `decision`).
    pub decision: &'static str,
    /// The limit that decided: the one that denied, or the shadow limit that would have.
    pub limit: Option<&'a str>,
    /// The failure mode that applied when the limiter could not decide.
    pub failure_mode: Option<&'static str>,
    pub limiter_ms: f64,
    /// What went wrong, when the request failed (`sluice_upstream_errors_total`'s kinds).
    pub error: Option<&'static str>,
    /// What the client did wrong, when it failed the request (`sluice_client_errors_total`'s
    /// kinds: `body_timeout`, `closed`).
    pub client_error: Option<&'static str>,
    /// The client certificate the TLS listener verified (mTLS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<LoggedCertificate<'a>>,
    #[serde(skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers<'a>,
}

/// A verified client certificate, as logged: its subject's common name and its fingerprint.
#[derive(Serialize)]
pub struct LoggedCertificate<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject_cn: Option<&'a str>,
    pub sha256: &'a str,
}

impl<'a> From<&'a ClientCertificate> for LoggedCertificate<'a> {
    fn from(certificate: &'a ClientCertificate) -> Self {
        LoggedCertificate {
            subject_cn: certificate.subject_cn.as_deref(),
            sha256: &certificate.sha256,
        }
    }
}

/// The logged request headers, written as a JSON object (name: value).
#[derive(Default)]
pub struct Headers<'a>(pub Vec<(&'a str, Cow<'a, str>)>);

impl Headers<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn bounded(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Milliseconds with microsecond resolution: what the log prints.
pub fn millis(duration: std::time::Duration) -> f64 {
    (duration.as_micros() as f64) / 1000.0
}

/// What requests hand the writer.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    /// Open the file again once `bytes` are written.
    reopen: bool,
    /// The log was dropped: write what is left and stop.
    closed: bool,
}

#[derive(Default)]
struct Shared {
    pending: Mutex<Pending>,
    /// Wakes the writer early: a reopen, or the end.
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

thread_local! {
    /// Each thread's line buffer, reused: serializing a line allocates nothing once warm.
    static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
}

/// An open access log, as one configuration asks for it.
pub struct AccessLog {
    sample: u64,
    sample_errors: u64,
    headers: Vec<HeaderName>,
    seen: AtomicU64,
    seen_errors: AtomicU64,
    shared: Arc<Shared>,
    /// The opened target, until `start` hands it to the writer.
    output: Mutex<Option<Output>>,
    dropped: IntCounter,
}

impl AccessLog {
    /// Opens the target (a file is created, and appended to); `Err` says why it cannot be.
    /// Lines are buffered until [`AccessLog::start`].
    pub fn open(settings: &AccessLogSettings, dropped: IntCounter) -> io::Result<AccessLog> {
        let output = Output::open(&settings.target)?;
        Ok(AccessLog {
            sample: settings.sample,
            sample_errors: settings.sample_errors,
            headers: settings.headers.clone(),
            seen: AtomicU64::new(0),
            seen_errors: AtomicU64::new(0),
            shared: Arc::default(),
            output: Mutex::new(Some(output)),
            dropped,
        })
    }

    /// Starts the writer thread (once; later calls do nothing). Not at `open`: a thread made
    /// before `sluice -d` forks would not exist in the daemon.
    pub fn start(&self) -> io::Result<()> {
        let output = self
            .output
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(output) = output {
            let writer = Arc::clone(&self.shared);
            std::thread::Builder::new()
                .name("sluice-access-log".to_string())
                .spawn(move || write_lines(&writer, output))?;
        }
        Ok(())
    }

    /// Whether this request is one of the sampled: 1 in `sample` of those answered below 400,
    /// 1 in `sample_errors` of the rest.
    pub fn sampled(&self, status: u16) -> bool {
        let (seen, every) = if status >= 400 || status == 0 {
            (&self.seen_errors, self.sample_errors)
        } else {
            (&self.seen, self.sample)
        };
        every == 1 || seen.fetch_add(1, Ordering::Relaxed) % every == 0
    }

    /// The request headers each line copies.
    pub fn headers(&self) -> &[HeaderName] {
        &self.headers
    }

    /// Buffers `line` for the writer; drops it (counted) when `MAX_PENDING` bytes wait.
    pub fn write(&self, line: &Line<'_>) {
        LINE.with_borrow_mut(|bytes| {
            bytes.clear();
            if serde_json::to_writer(&mut *bytes, line).is_err() {
                return;
            }
            bytes.push(b'\n');
            let mut pending = self.shared.lock();
            if pending.bytes.len() + bytes.len() > MAX_PENDING {
                drop(pending);
                self.dropped.inc();
            } else {
                pending.bytes.extend_from_slice(bytes);
            }
        });
    }

    /// Opens the file again by name, after the lines already buffered.
    pub fn reopen(&self) {
        self.shared.lock().reopen = true;
        self.shared.wake.notify_one();
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

/// Checks that `target` can be opened for appending (`sluice -t`).
pub fn check(target: &LogTarget) -> io::Result<()> {
    Output::open(target).map(drop)
}

/// The problem to report when the log cannot be opened.
pub fn cannot_open(error: io::Error) -> String {
    format!("cannot open the access log for appending: {error}")
}

/// Where the writer writes: whole buffers at once, so no buffering of its own.
enum Output {
    Stdout(io::Stdout),
    File(PathBuf, File),
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Output {
    fn open(target: &LogTarget) -> io::Result<Output> {
        Ok(match target {
            LogTarget::Stdout => Output::Stdout(io::stdout()),
            LogTarget::File(path) => Output::File(path.clone(), append(path)?),
        })
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Output::Stdout(out) => out,
            Output::File(_, out) => out,
        }
    }

    fn reopen(&mut self) {
        if let Output::File(path, out) = self {
            match append(path) {
                Ok(file) => *out = file,
                Err(e) => log::error!(
                    "access log: cannot open {} again, still writing the old file: {e}",
                    path.display()
                ),
            }
        }
    }
}

/// The writer: every `FLUSH_EVERY` (or when woken for a reopen or the end) takes what requests
/// buffered and writes it; ends once the log is dropped (its configuration retired) and
/// everything is written.
fn write_lines(shared: &Shared, mut output: Output) {
    let mut taken = Vec::new();
    let mut failing = false;
    loop {
        let (reopen, closed) = {
            let mut pending = shared.lock();
            if !pending.reopen && !pending.closed {
                pending = shared
                    .wake
                    .wait_timeout(pending, FLUSH_EVERY)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            std::mem::swap(&mut pending.bytes, &mut taken);
            (std::mem::take(&mut pending.reopen), pending.closed)
        };
        if !taken.is_empty() {
            let written = output
                .writer()
                .write_all(&taken)
                .and_then(|()| output.writer().flush());
            match written {
                Ok(()) => failing = false,
                Err(e) if !std::mem::replace(&mut failing, true) => {
                    log::error!("access log: write failed: {e}");
                }
                Err(_) => {}
            }
            taken.clear();
        }
        if reopen {
            output.reopen();
        }
        if closed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_text_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("abc", 5), "abc");
        assert_eq!(bounded("abcdef", 3), "abc");
        assert_eq!(bounded("aé", 2), "a");
    }

    fn settings(sample: u64, sample_errors: u64) -> AccessLogSettings {
        AccessLogSettings {
            target: LogTarget::Stdout,
            sample,
            sample_errors,
            headers: Vec::new(),
        }
    }

    #[test]
    fn errors_and_successes_are_sampled_apart() {
        let log = AccessLog::open(
            &settings(10, 1),
            IntCounter::new("d", "test").expect("counter"),
        )
        .expect("stdout");
        let successes = (0..100).filter(|_| log.sampled(200)).count();
        let errors = (0..100).filter(|_| log.sampled(429)).count();
        assert_eq!((successes, errors), (10, 100));
    }
}
