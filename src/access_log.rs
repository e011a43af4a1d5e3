//! The access log: one JSON object per line and request, sampled, written by a thread of its
//! own so a slow disk never holds a request. Lines go to stdout (the journal, under systemd) or
//! are appended to a file, which SIGUSR1 and every reload open again by name: logrotate moves
//! the file, signals, and the next line starts the new one; the lines queued before the signal
//! are written to the old one, none is lost.
//!
//! The queue is bounded: when the writer falls that far behind, a line is dropped and counted
//! (`sluice_access_log_dropped_total`) rather than the request kept waiting.

use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};

use http::HeaderName;
use prometheus::IntCounter;
use serde::Serialize;

use crate::config::observe::{AccessLogSettings, LogTarget};

/// Lines waiting for the writer, at most.
const QUEUE: usize = 16_384;
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
    #[serde(skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers<'a>,
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

enum Message {
    Line(Vec<u8>),
    Reopen,
}

/// An open access log, as one configuration asks for it.
pub struct AccessLog {
    sample: u64,
    sample_errors: u64,
    headers: Vec<HeaderName>,
    seen: AtomicU64,
    seen_errors: AtomicU64,
    queue: SyncSender<Message>,
    dropped: IntCounter,
}

impl AccessLog {
    /// Opens the target (a file is created, and appended to) and starts its writer; `Err` says
    /// why the file cannot be opened.
    pub fn open(settings: &AccessLogSettings, dropped: IntCounter) -> io::Result<AccessLog> {
        let output = Output::open(&settings.target)?;
        let (queue, lines) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("sluice-access-log".to_string())
            .spawn(move || write_lines(lines, output))?;
        Ok(AccessLog {
            sample: settings.sample,
            sample_errors: settings.sample_errors,
            headers: settings.headers.clone(),
            seen: AtomicU64::new(0),
            seen_errors: AtomicU64::new(0),
            queue,
            dropped,
        })
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

    /// Queues `line`; drops it (counted) when the writer is `QUEUE` lines behind.
    pub fn write(&self, line: &Line<'_>) {
        let mut bytes = Vec::with_capacity(384);
        if serde_json::to_writer(&mut bytes, line).is_err() {
            return;
        }
        bytes.push(b'\n');
        if let Err(TrySendError::Full(_)) = self.queue.try_send(Message::Line(bytes)) {
            self.dropped.inc();
        }
    }

    /// Opens the file again by name, after the lines already queued.
    pub fn reopen(&self) {
        let _ = self.queue.send(Message::Reopen);
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

enum Output {
    Stdout(BufWriter<io::Stdout>),
    File(PathBuf, BufWriter<File>),
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Output {
    fn open(target: &LogTarget) -> io::Result<Output> {
        Ok(match target {
            LogTarget::Stdout => Output::Stdout(BufWriter::new(io::stdout())),
            LogTarget::File(path) => Output::File(path.clone(), BufWriter::new(append(path)?)),
        })
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Output::Stdout(out) => out,
            Output::File(_, out) => out,
        }
    }

    fn reopen(&mut self) {
        let _ = self.writer().flush();
        if let Output::File(path, out) = self {
            match append(path) {
                Ok(file) => *out = BufWriter::new(file),
                Err(e) => log::error!(
                    "access log: cannot open {} again, still writing the old file: {e}",
                    path.display()
                ),
            }
        }
    }
}

/// The writer: takes whatever is queued, writes it, flushes when the queue is empty; ends
/// when the log is dropped (its configuration retired) and the queue is drained.
fn write_lines(lines: Receiver<Message>, mut output: Output) {
    let mut failing = false;
    while let Ok(first) = lines.recv() {
        let mut next = Some(first);
        while let Some(message) = next {
            match message {
                Message::Line(line) => {
                    if let Err(e) = output.writer().write_all(&line) {
                        if !std::mem::replace(&mut failing, true) {
                            log::error!("access log: write failed: {e}");
                        }
                    }
                }
                Message::Reopen => output.reopen(),
            }
            next = lines.try_recv().ok();
        }
        if output.writer().flush().is_ok() {
            failing = false;
        }
    }
    let _ = output.writer().flush();
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
