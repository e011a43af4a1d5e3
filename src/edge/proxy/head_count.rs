//! The front door's count of HTTP/1 header fields. Pingora parses at most 256 fields in a head
//! and answers a head with more itself — `400`, an empty body, before any hook runs: no access
//! log line, no metric. [`HeadCount`] wraps the accepted stream and counts the lines of each
//! request head as it is read; past [`MAX_HEADER_FIELDS`] it drops the rest of the head's
//! fields up to its empty line (at most [`MAX_CUT_BYTES`] of them) and notes the cut, so Pingora
//! parses 256 fields and the exchange answers `431` through the proxy's usual path (counted,
//! logged), closing the connection (a dropped field may have declared a body). Bodies,
//! upgraded tunnels and HTTP/2 frames pass untouched.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::task::{Context, Poll};

use async_trait::async_trait;
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Peek, Stream};
use tokio::io::{AsyncRead, ReadBuf};

use crate::exchange::head::MAX_HEADER_FIELDS;

/// Bytes of dropped fields after which the head is ended where it is (Pingora's own bound on a
/// head); the rest is never read: the `431` closes the connection.
const MAX_CUT_BYTES: usize = 1 << 20;

/// An accepted stream whose request heads are counted.
#[derive(Debug)]
pub struct HeadCount {
    inner: Stream,
    scan: Scan,
    /// Set by [`HeadCount::arm`]: the next byte read starts a request head.
    rearm: AtomicBool,
    /// The current request's head was cut.
    cut: AtomicBool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Not in a head (a body, an upgraded or HTTP/2 connection): bytes pass untouched.
    Off,
    /// In a head: `ended` lines ended so far (the request line first; empty lines before it are
    /// skipped, as httparse does); `blank`: the current line holds nothing but `\r` so far.
    Head { ended: usize, blank: bool },
    /// Past the last field kept, dropping up to the empty line (kept, as a bare `\n`).
    Cutting { blank: bool, dropped: usize },
}

impl Scan {
    const START: Scan = Scan::Head {
        ended: 0,
        blank: true,
    };

    /// The byte to keep for `b` (`None`: dropped); `cut` is set when the cut begins.
    fn step(&mut self, b: u8, cut: &AtomicBool) -> Option<u8> {
        match self {
            Scan::Off => Some(b),
            Scan::Head { ended, blank } => {
                match b {
                    b'\n' if *blank && *ended > 0 => *self = Scan::Off,
                    b'\n' if *blank => {}
                    b'\n' => (*ended, *blank) = (*ended + 1, true),
                    b'\r' => {}
                    // The request line and MAX_HEADER_FIELDS fields have ended: one too many.
                    _ if *blank && *ended > MAX_HEADER_FIELDS => {
                        cut.store(true, Relaxed);
                        *self = Scan::Cutting {
                            blank: false,
                            dropped: 1,
                        };
                        return None;
                    }
                    _ => *blank = false,
                }
                Some(b)
            }
            Scan::Cutting { blank, dropped } => {
                *dropped += 1;
                match b {
                    b'\n' if *blank => {
                        *self = Scan::Off;
                        Some(b'\n')
                    }
                    b'\n' => {
                        *blank = true;
                        None
                    }
                    b'\r' => None,
                    _ if *dropped > MAX_CUT_BYTES => {
                        *self = Scan::Off;
                        Some(b'\n')
                    }
                    _ => {
                        *blank = false;
                        None
                    }
                }
            }
        }
    }

    /// Keeps the bytes of `bytes` to keep, in place, and says how many.
    fn keep(&mut self, bytes: &mut [u8], cut: &AtomicBool) -> usize {
        let passed = self.pass_whole_lines(bytes);
        let mut kept = passed;
        for i in passed..bytes.len() {
            if *self == Scan::Off {
                // What follows the head passes as it is.
                bytes.copy_within(i.., kept);
                return kept + (bytes.len() - i);
            }
            if let Some(b) = self.step(bytes[i], cut) {
                bytes[kept] = b;
                kept += 1;
            }
        }
        kept
    }

    /// Passes the lines of a head that cannot reach the cut a line at a time (`memchr` finds
    /// each end), as [`Scan::step`] would byte by byte; says where it stopped: at the end of
    /// `bytes`, at the head's end (then it is `Off`), or where the count nears the cut (the
    /// bytes from there are stepped one by one). Nothing it passes is dropped.
    fn pass_whole_lines(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        while let Scan::Head { ended, blank } = self {
            // A line starting with `ended` below the count cannot be cut (step cuts a line's
            // first byte only when `ended` is over it).
            if *ended >= MAX_HEADER_FIELDS {
                break;
            }
            let rest = &bytes[at..];
            let Some(end) = memchr::memchr(b'\n', rest) else {
                *blank = *blank && rest.iter().all(|&b| b == b'\r');
                return bytes.len();
            };
            let line_is_blank = *blank && rest[..end].iter().all(|&b| b == b'\r');
            match (line_is_blank, *ended) {
                // An empty line before the request line: skipped, as httparse does.
                (true, 0) => {}
                // The empty line ending the head.
                (true, _) => *self = Scan::Off,
                (false, _) => (*ended, *blank) = (*ended + 1, true),
            }
            at += end + 1;
        }
        at
    }
}

impl HeadCount {
    pub fn new(inner: Stream) -> HeadCount {
        HeadCount {
            inner,
            scan: Scan::START,
            rearm: AtomicBool::new(false),
            cut: AtomicBool::new(false),
        }
    }

    /// The next request's head starts with the next byte read (the front door, before each
    /// HTTP/1 request: without pipelining Pingora carries no byte over between requests).
    pub fn arm(&self) {
        self.cut.store(false, Relaxed);
        self.rearm.store(true, Relaxed);
    }

    /// The current request's head had more than [`MAX_HEADER_FIELDS`] fields.
    pub fn cut(&self) -> bool {
        self.cut.load(Relaxed)
    }

    /// The counter of an HTTP/1 session's connection, if it is counted.
    pub fn of(session: &ServerSession) -> Option<&HeadCount> {
        session.stream()?.as_any().downcast_ref::<HeadCount>()
    }
}

impl AsyncRead for HeadCount {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.rearm.swap(false, Relaxed) {
            this.scan = Scan::START;
        }
        loop {
            let before = buf.filled().len();
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            if this.scan == Scan::Off || buf.filled().len() == before {
                return Poll::Ready(Ok(()));
            }
            let kept = this.scan.keep(&mut buf.filled_mut()[before..], &this.cut);
            buf.set_filled(before + kept);
            if kept > 0 {
                return Poll::Ready(Ok(()));
            }
            // All of it was dropped: read on (a read of nothing would look like the end).
        }
    }
}

super::stream::forward_to_inner!(HeadCount);

#[async_trait]
impl Peek for HeadCount {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head of `fields` fields (besides the request line), then `body`.
    fn head(fields: usize, body: &str) -> Vec<u8> {
        let mut text = String::from("GET / HTTP/1.1\r\n");
        for i in 0..fields {
            text.push_str(&format!("x-h{i}: v\r\n"));
        }
        text.push_str("\r\n");
        text.push_str(body);
        text.into_bytes()
    }

    /// What the scan keeps of `bytes` read in two parts, split at `at`; whether it cut.
    fn scanned(bytes: &[u8], at: usize) -> (Vec<u8>, bool) {
        let (cut, mut scan, mut out) = (AtomicBool::new(false), Scan::START, Vec::new());
        for part in [&bytes[..at], &bytes[at..]] {
            let mut part = part.to_vec();
            let kept = scan.keep(&mut part, &cut);
            out.extend_from_slice(&part[..kept]);
        }
        (out, cut.load(Relaxed))
    }

    #[test]
    fn a_head_within_the_count_passes_as_it_is_however_it_is_read() {
        let bytes = head(MAX_HEADER_FIELDS, "body bytes\r\n\r\nx-h: 1\r\n");
        for at in 0..=bytes.len() {
            assert_eq!(scanned(&bytes, at), (bytes.clone(), false), "split at {at}");
        }
    }

    #[test]
    fn fields_past_the_count_are_dropped_up_to_the_empty_line() {
        let bytes = head(MAX_HEADER_FIELDS + 50, "rest");
        let mut expected = head(MAX_HEADER_FIELDS, "");
        expected.truncate(expected.len() - 2);
        expected.extend_from_slice(b"\nrest");
        for at in [0, 1, 100, bytes.len() / 2, bytes.len() - 3, bytes.len()] {
            assert_eq!(
                scanned(&bytes, at),
                (expected.clone(), true),
                "split at {at}"
            );
        }
    }

    /// What stepping every byte keeps of `parts` read one after another, and whether it cut:
    /// the definition the line-at-a-time pass must agree with.
    fn stepped(parts: &[&[u8]]) -> (Vec<u8>, bool) {
        let (cut, mut scan, mut out) = (AtomicBool::new(false), Scan::START, Vec::new());
        for part in parts {
            out.extend(part.iter().filter_map(|&b| scan.step(b, &cut)));
        }
        (out, cut.load(Relaxed))
    }

    proptest::proptest! {
        /// Heads of line feeds, carriage returns and text, after empty lines or not, read in
        /// three parts, near the count and past it: the line-at-a-time pass keeps what stepping each byte keeps.
        #[test]
        fn passing_whole_lines_keeps_what_stepping_each_byte_keeps(
            before in "(\r|\n){0,4}",
            lines in proptest::collection::vec("(\r?\n|\r|a\r?\n|ab: c\r\n|\r\n\r\n)", 0..300),
            extra in 0..=MAX_HEADER_FIELDS + 8,
            splits in (0usize..100_000, 0usize..100_000),
        ) {
            let mut bytes = before.into_bytes();
            bytes.extend(head(extra, ""));
            bytes.truncate(bytes.len() - 2);
            bytes.extend(lines.concat().into_bytes());
            let (a, b) = (splits.0 % (bytes.len() + 1), splits.1 % (bytes.len() + 1));
            let (a, b) = (a.min(b), a.max(b));
            let parts = [&bytes[..a], &bytes[a..b], &bytes[b..]];
            let (cut, mut scan, mut out) = (AtomicBool::new(false), Scan::START, Vec::new());
            for part in parts {
                let mut part = part.to_vec();
                let kept = scan.keep(&mut part, &cut);
                out.extend_from_slice(&part[..kept]);
            }
            proptest::prop_assert_eq!((out, cut.load(Relaxed)), stepped(&parts));
        }
    }

    #[test]
    fn empty_lines_before_the_request_line_and_bare_line_feeds_are_heads_too() {
        let bytes = b"\r\n\nGET / HTTP/1.1\nhost: a\n\nbody".to_vec();
        assert_eq!(scanned(&bytes, 5), (bytes.clone(), false));
    }

    #[test]
    fn an_endless_head_is_ended_after_the_cut_bound() {
        let mut bytes = head(MAX_HEADER_FIELDS + 1, "");
        bytes.truncate(bytes.len() - 2);
        bytes.extend(std::iter::repeat_n(b'a', MAX_CUT_BYTES + 10));
        let (kept, cut) = scanned(&bytes, 0);
        assert!(cut);
        // The kept fields, then the head ended where the bound was reached.
        let mut ended = head(MAX_HEADER_FIELDS, "");
        ended.truncate(ended.len() - 2);
        ended.push(b'\n');
        assert_eq!(&kept[..ended.len()], &ended[..]);
        assert!(
            kept.len() - ended.len() < 64,
            "what followed the bound is not the head's"
        );
    }
}
