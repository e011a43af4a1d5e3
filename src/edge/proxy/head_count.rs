//! The front door's count of HTTP/1 request heads. Pingora parses at most 256 fields in a head,
//! and a target of at most 64 KiB (its URI type's bound), and answers a head beyond either
//! itself — `400`, an empty body, before any hook runs: no access log line, no metric (the admin
//! listener only closes the connection). [`HeadCount`] wraps the accepted stream and reads each
//! request head as it arrives: past [`MAX_URI_LEN`] bytes of the request line's target it drops
//! the rest of the target (up to the space before the version, at most [`MAX_CUT_BYTES`]), and
//! past [`MAX_HEADER_FIELDS`] fields it drops the rest of the head's fields up to its empty line
//! (at most [`MAX_CUT_BYTES`] of them); it notes each cut, so Pingora parses what is left and the
//! gateway answers `414` or `431` itself, through the proxy's usual path (counted, logged), and
//! closes the connection (a dropped field may have declared a body). The admin listener's
//! connections are counted the same way ([`Counted`]). Bodies, upgraded tunnels and HTTP/2
//! frames pass untouched; lines that cannot be cut pass a line at a time.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream, ServerApp};
use pingora::protocols::http::v2::server::H2Options;
use pingora::protocols::http::ServerSession;
use pingora::protocols::{Peek, Stream};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, ReadBuf};

use super::head_clock::HeadClock;
use crate::exchange::head::{Cut, MAX_HEADER_FIELDS, MAX_URI_LEN};

/// Bytes of dropped fields (or of a target) after which the head (or the request line) is ended
/// where it is (Pingora's own bound on a head); the rest is never read: the answer closes the
/// connection.
const MAX_CUT_BYTES: usize = 1 << 20;

/// An accepted stream whose request heads are counted.
#[derive(Debug)]
pub struct HeadCount {
    inner: Stream,
    scan: Scan,
    /// Set by [`HeadCount::arm`]: the next byte read starts a request head.
    rearm: AtomicBool,
    /// What was cut of the current request's head.
    cuts: Cuts,
    /// The connection's clock for its heads (the front door's deadline).
    clock: Arc<HeadClock>,
}

/// What was cut of the current head, set as the scan cuts it.
#[derive(Debug, Default)]
struct Cuts {
    fields: AtomicBool,
    target: AtomicBool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Not in a head (a body, an upgraded or HTTP/2 connection): bytes pass untouched.
    Off,
    /// In a head: `ended` lines ended so far (the request line first; empty lines before it are
    /// skipped, as httparse does); `blank`: the current line holds nothing but `\r` so far.
    /// With `ended` 0 the request line has not begun (`blank` is then always true).
    Head { ended: usize, blank: bool },
    /// In the request line: `spaces` seen so far (the target lies after the first), `target`
    /// bytes of the target so far.
    Line { spaces: u8, target: usize },
    /// Past the [`MAX_URI_LEN`] bytes of the target kept, dropping up to the space after it
    /// (kept) or the line's end.
    Trimming { dropped: usize },
    /// Past the last field kept, dropping up to the empty line (kept, as a bare `\n`).
    Cutting { blank: bool, dropped: usize },
}

impl Scan {
    const START: Scan = Scan::Head {
        ended: 0,
        blank: true,
    };

    /// The byte to keep for `b` (`None`: dropped); `cuts` notes a cut as it begins.
    fn step(&mut self, b: u8, cuts: &Cuts) -> Option<u8> {
        match *self {
            Scan::Off => Some(b),
            // Before the request line: empty lines pass, uncounted.
            Scan::Head { ended: 0, .. } if b == b'\r' || b == b'\n' => Some(b),
            Scan::Head { ended: 0, .. } => {
                *self = Scan::Line {
                    spaces: 0,
                    target: 0,
                };
                self.step_line(b, cuts)
            }
            Scan::Head { .. } => self.step_fields(b, cuts),
            Scan::Line { .. } | Scan::Trimming { .. } => self.step_line(b, cuts),
            Scan::Cutting { .. } => self.step_cut(b),
        }
    }

    /// [`Scan::step`] in the request line: its target's bytes past [`MAX_URI_LEN`] are
    /// dropped up to the space after it or the line's end.
    fn step_line(&mut self, b: u8, cuts: &Cuts) -> Option<u8> {
        match self {
            Scan::Line { spaces, target } => match b {
                b'\n' => *self = Scan::END_OF_LINE,
                b' ' => *spaces = spaces.saturating_add(1),
                _ if *spaces == 1 && *target >= MAX_URI_LEN => {
                    cuts.target.store(true, Relaxed);
                    *self = Scan::Trimming { dropped: 1 };
                    return None;
                }
                _ if *spaces == 1 => *target += 1,
                _ => {}
            },
            Scan::Trimming { dropped } => {
                *dropped += 1;
                match b {
                    b' ' => {
                        *self = Scan::Line {
                            spaces: 2,
                            target: MAX_URI_LEN,
                        }
                    }
                    b'\n' => *self = Scan::END_OF_LINE,
                    _ if *dropped > MAX_CUT_BYTES => {
                        *self = Scan::END_OF_LINE;
                        return Some(b'\n');
                    }
                    _ => return None,
                }
            }
            _ => {}
        }
        Some(b)
    }

    /// [`Scan::step`] in the fields: past [`MAX_HEADER_FIELDS`] of them the cut begins.
    fn step_fields(&mut self, b: u8, cuts: &Cuts) -> Option<u8> {
        let Scan::Head { ended, blank } = self else {
            return Some(b);
        };
        match b {
            b'\n' if *blank => *self = Scan::Off,
            b'\n' => (*ended, *blank) = (*ended + 1, true),
            b'\r' => {}
            // The request line and MAX_HEADER_FIELDS fields have ended: one too many.
            _ if *blank && *ended > MAX_HEADER_FIELDS => {
                cuts.fields.store(true, Relaxed);
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

    /// [`Scan::step`] past the last field kept: dropped up to the empty line.
    fn step_cut(&mut self, b: u8) -> Option<u8> {
        let Scan::Cutting { blank, dropped } = self else {
            return Some(b);
        };
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

    /// The request line has ended: the fields follow.
    const END_OF_LINE: Scan = Scan::Head {
        ended: 1,
        blank: true,
    };

    /// Keeps the bytes of `bytes` to keep, in place, and says how many: whole lines that
    /// cannot be cut pass at once ([`Scan::pass_whole_lines`]), the rest is stepped a byte at a
    /// time, and what follows the head passes as it is.
    fn keep(&mut self, bytes: &mut [u8], cuts: &Cuts) -> usize {
        let (mut read, mut kept) = (0, 0);
        while read < bytes.len() {
            let passed = match self {
                Scan::Off => bytes.len() - read,
                Scan::Head { .. } => self.pass_whole_lines(&bytes[read..]),
                _ => 0,
            };
            if passed > 0 {
                if kept != read {
                    bytes.copy_within(read..read + passed, kept);
                }
                (read, kept) = (read + passed, kept + passed);
                continue;
            }
            if let Some(b) = self.step(bytes[read], cuts) {
                bytes[kept] = b;
                kept += 1;
            }
            read += 1;
        }
        kept
    }

    /// Passes the lines of a head that cannot be cut a line at a time (`memchr` finds each
    /// end), as [`Scan::step`] would byte by byte; says where it stopped: at the end of
    /// `bytes`, at the head's end (then it is `Off`), at a request line that may hold a target
    /// too long (it is stepped: a line no longer than [`MAX_URI_LEN`] cannot) or where the
    /// count nears the cut (the bytes from there are stepped one by one). Nothing it passes is
    /// dropped.
    fn pass_whole_lines(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        while let Scan::Head { ended, blank } = self {
            // A line starting with `ended` below the count cannot be cut (step cuts a line's
            // first byte only when `ended` is over it).
            if *ended >= MAX_HEADER_FIELDS {
                break;
            }
            if *ended == 0 {
                // Empty lines before the request line pass, uncounted, as httparse skips them.
                let Some(start) = bytes[at..].iter().position(|&b| b != b'\r' && b != b'\n') else {
                    return bytes.len();
                };
                at += start;
                match memchr::memchr(b'\n', &bytes[at..]) {
                    Some(end) if end <= MAX_URI_LEN => {
                        *self = Scan::END_OF_LINE;
                        at += end + 1;
                        continue;
                    }
                    _ => return at,
                }
            }
            let rest = &bytes[at..];
            let Some(end) = memchr::memchr(b'\n', rest) else {
                *blank = *blank && rest.iter().all(|&b| b == b'\r');
                return bytes.len();
            };
            if *blank && rest[..end].iter().all(|&b| b == b'\r') {
                // The empty line ending the head.
                *self = Scan::Off;
            } else {
                (*ended, *blank) = (*ended + 1, true);
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
            cuts: Cuts::default(),
            clock: Arc::default(),
        }
    }

    /// The connection's clock for its request heads.
    pub fn clock(&self) -> &Arc<HeadClock> {
        &self.clock
    }

    /// The next request's head starts with the next byte read (the front door, before each
    /// HTTP/1 request: without pipelining Pingora carries no byte over between requests).
    pub fn arm(&self) {
        self.cuts.fields.store(false, Relaxed);
        self.cuts.target.store(false, Relaxed);
        self.rearm.store(true, Relaxed);
    }

    /// What was cut of the current request's head: fields past [`MAX_HEADER_FIELDS`], target
    /// bytes past [`MAX_URI_LEN`].
    pub fn cut(&self) -> Cut {
        Cut {
            fields: self.cuts.fields.load(Relaxed),
            target: self.cuts.target.load(Relaxed),
        }
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
            let kept = this.scan.keep(&mut buf.filled_mut()[before..], &this.cuts);
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

/// An HTTP/1 application whose request heads are counted as the proxy's are (there
/// `preface.rs` wraps the stream and `front.rs` arms it): each accepted stream is wrapped in a
/// [`HeadCount`], armed before each request, and the application reads [`HeadCount::cut`] to
/// answer what was cut. The admin listener is served so (`edge/admin.rs`).
pub struct Counted<A> {
    app: Arc<Armed<A>>,
}

impl<A> Counted<A> {
    pub fn new(app: A) -> Counted<A> {
        Counted {
            app: Arc::new(Armed { app: Arc::new(app) }),
        }
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for Counted<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // A kept-alive connection comes back already wrapped.
        let stream: Stream = if stream.as_any().is::<HeadCount>() {
            stream
        } else {
            Box::new(HeadCount::new(stream))
        };
        self.app.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.app.http_cleanup().await
    }
}

/// Arms the count before each request of the application it serves.
struct Armed<A> {
    app: Arc<A>,
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> HttpServerApp for Armed<A> {
    async fn process_new_http(
        self: &Arc<Self>,
        session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if let Some(count) = HeadCount::of(&session) {
            count.arm();
        }
        self.app.process_new_http(session, shutdown).await
    }

    fn h2_options(&self) -> Option<H2Options> {
        self.app.h2_options()
    }

    fn server_options(&self) -> Option<&HttpServerOptions> {
        self.app.server_options()
    }

    async fn http_cleanup(&self) {
        self.app.http_cleanup().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head whose request line asks for `target`, with `fields` fields, then `body`.
    fn head_for(target: &str, fields: usize, body: &str) -> Vec<u8> {
        let mut text = format!("GET {target} HTTP/1.1\r\n");
        for i in 0..fields {
            text.push_str(&format!("x-h{i}: v\r\n"));
        }
        text.push_str("\r\n");
        text.push_str(body);
        text.into_bytes()
    }

    /// A head of `fields` fields (besides the request line), then `body`.
    fn head(fields: usize, body: &str) -> Vec<u8> {
        head_for("/", fields, body)
    }

    fn cut_of(cuts: &Cuts) -> Cut {
        Cut {
            fields: cuts.fields.load(Relaxed),
            target: cuts.target.load(Relaxed),
        }
    }

    /// What the scan keeps of `parts` read one after another, and what it cut.
    fn kept(parts: &[&[u8]]) -> (Vec<u8>, Cut) {
        let (cuts, mut scan, mut out) = (Cuts::default(), Scan::START, Vec::new());
        for part in parts {
            let mut part = part.to_vec();
            let kept = scan.keep(&mut part, &cuts);
            out.extend_from_slice(&part[..kept]);
        }
        (out, cut_of(&cuts))
    }

    /// What the scan keeps of `bytes` read in two parts, split at `at`; what it cut.
    fn scanned(bytes: &[u8], at: usize) -> (Vec<u8>, Cut) {
        kept(&[&bytes[..at], &bytes[at..]])
    }

    const NONE: Cut = Cut {
        fields: false,
        target: false,
    };
    const FIELDS: Cut = Cut {
        fields: true,
        target: false,
    };
    const TARGET: Cut = Cut {
        fields: false,
        target: true,
    };

    #[test]
    fn a_head_within_the_count_passes_as_it_is_however_it_is_read() {
        let bytes = head(MAX_HEADER_FIELDS, "body bytes\r\n\r\nx-h: 1\r\n");
        for at in 0..=bytes.len() {
            assert_eq!(scanned(&bytes, at), (bytes.clone(), NONE), "split at {at}");
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
                (expected.clone(), FIELDS),
                "split at {at}"
            );
        }
    }

    /// A target of `MAX_URI_LEN` bytes passes; past it the target keeps its first `MAX_URI_LEN`
    /// bytes and the rest of the head passes, however it is read (70,000 bytes: more than
    /// Pingora's URI type can hold).
    #[test]
    fn a_target_past_the_limit_is_trimmed_to_it_and_the_rest_of_the_head_kept() {
        let at_limit = format!("/{}", "a".repeat(MAX_URI_LEN - 1));
        let bytes = head_for(&at_limit, 3, "body");
        assert_eq!(scanned(&bytes, 7), (bytes.clone(), NONE));
        for length in [MAX_URI_LEN + 1, 70_000] {
            let target = format!("/{}", "a".repeat(length - 1));
            let bytes = head_for(&target, 300, "body");
            let expected = kept(&[&head_for(&at_limit, 300, "body")]);
            assert_eq!(expected.1, FIELDS);
            for at in [
                0,
                4,
                5,
                MAX_URI_LEN,
                MAX_URI_LEN + 5,
                length + 3,
                bytes.len(),
            ] {
                let (out, cut) = scanned(&bytes, at);
                assert_eq!(out, expected.0, "{length}, split at {at}");
                assert_eq!(
                    cut,
                    Cut {
                        fields: true,
                        target: true
                    }
                );
            }
        }
        // A request line without a version ends where its target ends.
        let mut line = b"GET /".to_vec();
        line.extend(std::iter::repeat_n(b'b', MAX_URI_LEN + 10));
        line.extend_from_slice(b"\r\nhost: a\r\n\r\n");
        let mut expected = b"GET /".to_vec();
        expected.extend(std::iter::repeat_n(b'b', MAX_URI_LEN - 1));
        expected.extend_from_slice(b"\nhost: a\r\n\r\n");
        assert_eq!(scanned(&line, 100), (expected, TARGET));
    }

    #[test]
    fn an_endless_target_is_ended_after_the_cut_bound() {
        let mut bytes = b"GET /".to_vec();
        bytes.extend(std::iter::repeat_n(b'a', MAX_URI_LEN + MAX_CUT_BYTES + 10));
        let (kept, cut) = scanned(&bytes, 0);
        assert_eq!(cut, TARGET);
        assert_eq!(kept.len(), "GET ".len() + MAX_URI_LEN + 1 + 10);
        assert_eq!(
            kept["GET ".len() + MAX_URI_LEN],
            b'\n',
            "the line ended there"
        );
    }

    /// What stepping every byte keeps of `parts` read one after another, and what it cut: the
    /// definition the line-at-a-time pass must agree with.
    fn stepped(parts: &[&[u8]]) -> (Vec<u8>, Cut) {
        let (cuts, mut scan, mut out) = (Cuts::default(), Scan::START, Vec::new());
        for part in parts {
            out.extend(part.iter().filter_map(|&b| scan.step(b, &cuts)));
        }
        (out, cut_of(&cuts))
    }

    proptest::proptest! {
        /// Heads of line feeds, carriage returns and text, after empty lines or not, read in
        /// three parts, with targets short, near the limit and past it, and fields near the
        /// count and past it: the line-at-a-time pass keeps what stepping each byte keeps.
        #[test]
        fn passing_whole_lines_keeps_what_stepping_each_byte_keeps(
            before in "(\r|\n){0,4}",
            target in proptest::prop_oneof![
                0..16usize,
                MAX_URI_LEN - 16..MAX_URI_LEN + 16,
                3 * MAX_URI_LEN..3 * MAX_URI_LEN + 2,
            ],
            version in "( HTTP/1.1| x y|)(\r\n|\n)",
            lines in proptest::collection::vec("(\r?\n|\r|a\r?\n|ab: c\r\n|\r\n\r\n)", 0..300),
            extra in 0..=MAX_HEADER_FIELDS + 8,
            splits in (0usize..100_000, 0usize..100_000),
        ) {
            let mut bytes = before.into_bytes();
            bytes.extend_from_slice(b"GET /");
            bytes.extend(std::iter::repeat_n(b'p', target));
            bytes.extend(version.into_bytes());
            for i in 0..extra {
                bytes.extend(format!("x-h{i}: v\r\n").into_bytes());
            }
            bytes.extend(lines.concat().into_bytes());
            let (a, b) = (splits.0 % (bytes.len() + 1), splits.1 % (bytes.len() + 1));
            let (a, b) = (a.min(b), a.max(b));
            let parts = [&bytes[..a], &bytes[a..b], &bytes[b..]];
            proptest::prop_assert_eq!(kept(&parts), stepped(&parts));
        }
    }

    #[test]
    fn empty_lines_before_the_request_line_and_bare_line_feeds_are_heads_too() {
        let bytes = b"\r\n\nGET / HTTP/1.1\nhost: a\n\nbody".to_vec();
        assert_eq!(scanned(&bytes, 5), (bytes.clone(), NONE));
    }

    #[test]
    fn an_endless_head_is_ended_after_the_cut_bound() {
        let mut bytes = head(MAX_HEADER_FIELDS + 1, "");
        bytes.truncate(bytes.len() - 2);
        bytes.extend(std::iter::repeat_n(b'a', MAX_CUT_BYTES + 10));
        let (kept, cut) = scanned(&bytes, 0);
        assert_eq!(cut, FIELDS);
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
