//! The decision lane's own connection to a standalone Redis over plain TCP: the lane sends one
//! call at a time (`coalesce.rs`), so it needs no multiplexing. The request's task writes the
//! command and reads the reply itself, into buffers the connection keeps, and the reply's
//! integers are parsed in place: no driver task, no channel, one wake-up per decision.
//!
//! redis-rs's multiplexed connection (`link.rs`) stays the way for everything else, and for a
//! decision whenever the direct connection is absent (not yet connected, broken, refused) or
//! busy (calls pipelined with `max_batch: 1`). A connection is made in the background, never on
//! a request's time; one whose call did not finish cleanly (deadline passed, I/O error, a reply
//! it could not read) is dropped, since a late reply would answer the next call, and so is one
//! the server closed while it was idle, before a call is written to it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::{ConnectionAddr, ConnectionInfo, ErrorKind, ProtocolVersion, RedisError};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::script::Arguments;

/// How long making a direct connection (and its handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long after a failed attempt the next one starts (meanwhile the shared connection serves).
const RETRY_AFTER: Duration = Duration::from_millis(250);

/// The name the connection gives itself (`CLIENT LIST` shows it to operators).
const CLIENT_NAME: &str = "sluice-decisions";

/// Where direct connections go and how they greet the server; holds the idle one.
pub struct DirectLink {
    host: String,
    port: u16,
    /// `AUTH` (when configured), `SELECT` (a database other than 0) and `CLIENT SETNAME`,
    /// packed once; each is answered `+OK`.
    handshake: Vec<u8>,
    handshake_replies: usize,
    idle: Mutex<Option<DirectConnection>>,
    connecting: AtomicBool,
    /// The server refused the handshake (a password or an ACL): no more attempts.
    refused: AtomicBool,
}

impl DirectLink {
    /// The direct link to the server `info` names, when it is one a plain TCP connection
    /// speaking RESP2 reaches; `None` for TLS, Unix sockets and RESP3.
    pub fn to(info: &ConnectionInfo) -> Option<Arc<DirectLink>> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        if settings.protocol() != ProtocolVersion::RESP2 {
            return None;
        }
        let mut commands = Vec::new();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(username) = settings.username() {
                auth.arg(username);
            }
            commands.push(auth.arg(password).clone());
        }
        if settings.db() != 0 {
            commands.push(redis::cmd("SELECT").arg(settings.db()).clone());
        }
        commands.push(redis::cmd("CLIENT").arg("SETNAME").arg(CLIENT_NAME).clone());
        let mut handshake = Vec::new();
        for command in &commands {
            command.write_packed_command(&mut handshake);
        }
        Some(Arc::new(DirectLink {
            host: host.clone(),
            port: *port,
            handshake,
            handshake_replies: commands.len(),
            idle: Mutex::new(None),
            connecting: AtomicBool::new(false),
            refused: AtomicBool::new(false),
        }))
    }

    /// The idle connection, lent until the lease is dropped; `None` when there is none (one is
    /// then made in the background, unless being made already).
    pub fn lend(self: &Arc<Self>) -> Option<Loan<'_>> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match idle.filter(|connection| !connection.closed_by_server()) {
            Some(connection) => Some(Loan {
                link: self,
                connection: Some(connection),
            }),
            None => {
                self.connect_in_background();
                None
            }
        }
    }

    /// Between calls: drops the idle connection if the server closed it, and makes one in the
    /// background when there is none, so the next decision finds a live one.
    pub fn check_idle(self: &Arc<Self>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle
            .as_ref()
            .is_some_and(DirectConnection::closed_by_server)
        {
            *idle = None;
        }
        let absent = idle.is_none();
        drop(idle);
        if absent {
            self.connect_in_background();
        }
    }

    fn connect_in_background(self: &Arc<Self>) {
        if self.refused.load(Ordering::Relaxed) || self.connecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECT_TIMEOUT, link.connect()).await {
                Ok(Ok(connection)) => link.put_back(connection),
                Ok(Err(error)) if error.code().is_some() => {
                    link.refused.store(true, Ordering::Relaxed);
                    log::warn!(
                        "redis: decisions share the general connection: the server refused the \
                         direct one's handshake: {error}"
                    );
                }
                Ok(Err(error)) => {
                    log::debug!("redis: direct decision connection failed: {error}");
                    tokio::time::sleep(RETRY_AFTER).await;
                }
                Err(_) => log::debug!("redis: direct decision connection timed out"),
            }
            link.connecting.store(false, Ordering::Release);
        });
    }

    async fn connect(&self) -> Result<DirectConnection, RedisError> {
        let stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
        stream.set_nodelay(true)?;
        let mut connection = DirectConnection {
            stream,
            output: Vec::with_capacity(1024),
            input: Vec::with_capacity(1024),
            clean: true,
        };
        connection.stream.write_all(&self.handshake).await?;
        for _ in 0..self.handshake_replies {
            connection.read_status().await?;
        }
        Ok(connection)
    }

    fn put_back(&self, connection: DirectConnection) {
        *self.idle.lock().unwrap_or_else(PoisonError::into_inner) = Some(connection);
    }
}

/// A direct connection lent to one call; back to its link when dropped, if the call finished
/// cleanly. It borrows the link, which the call's dispatcher holds: no count of the link is
/// written per call.
pub struct Loan<'a> {
    link: &'a DirectLink,
    connection: Option<DirectConnection>,
}

impl Loan<'_> {
    /// The reply of the command `write` puts in the (cleared) output buffer, as RESP: a flat
    /// array of integers (a decision script's), or the error the server answered. Any other
    /// reply breaks the connection and is an error.
    pub async fn integers(
        &mut self,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Vec<i64>, RedisError> {
        match self.connection.as_mut() {
            Some(connection) => connection.integers(write).await,
            None => Err(RedisError::from((
                ErrorKind::Io,
                "direct connection already broken",
            ))),
        }
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take().filter(|c| c.clean) {
            self.link.put_back(connection);
        }
    }
}

/// One TCP connection and its buffers, reused call after call.
struct DirectConnection {
    stream: TcpStream,
    output: Vec<u8>,
    /// Bytes read and not yet parsed (a reply arrives whole, in one read, but need not).
    input: Vec<u8>,
    /// No call is half done: everything written was answered and read.
    clean: bool,
}

impl DirectConnection {
    async fn integers(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> Result<Vec<i64>, RedisError> {
        self.clean = false;
        self.output.clear();
        write(&mut self.output);
        self.stream.write_all(&self.output).await?;
        loop {
            match parse_integers(&self.input) {
                Parsed::Incomplete => self.fill().await?,
                Parsed::Integers(integers, used) => {
                    self.consume(used);
                    return Ok(integers);
                }
                Parsed::Error(used) => {
                    let error = server_error(&self.input[..used]);
                    self.consume(used);
                    return Err(error);
                }
                Parsed::Unexpected => {
                    return Err(RedisError::from((
                        ErrorKind::UnexpectedReturnType,
                        "a decision call's reply is not an array of integers",
                    )))
                }
            }
        }
    }

    /// Whether the server closed the connection while it was idle (Redis's `timeout`, a
    /// restart, `CLIENT KILL`): the reactor has already seen its end, so asking costs no system
    /// call, and the decision goes over the shared connection instead of failing.
    fn closed_by_server(&self) -> bool {
        let ready = std::pin::pin!(self.stream.ready(Interest::READABLE));
        let mut context = Context::from_waker(Waker::noop());
        match ready.poll(&mut context) {
            Poll::Ready(Ok(ready)) => ready.is_read_closed() || ready.is_error(),
            Poll::Ready(Err(_)) => true,
            Poll::Pending => false,
        }
    }

    /// Reads a simple-string reply (`+OK`), or the server's error.
    async fn read_status(&mut self) -> Result<(), RedisError> {
        loop {
            match line(&self.input, 0) {
                None => self.fill().await?,
                Some((text, used)) => {
                    let status = match self.input[0] {
                        b'+' => Ok(()),
                        b'-' => Err(server_error(&self.input[..used])),
                        _ => Err(RedisError::from((
                            ErrorKind::UnexpectedReturnType,
                            "unexpected reply to the handshake",
                            String::from_utf8_lossy(text).into_owned(),
                        ))),
                    };
                    self.consume(used);
                    return status;
                }
            }
        }
    }

    /// Reads what the server sent so far.
    async fn fill(&mut self) -> Result<(), RedisError> {
        if self.input.capacity() - self.input.len() < 512 {
            self.input.reserve(4096);
        }
        if self.stream.read_buf(&mut self.input).await? == 0 {
            return Err(RedisError::from((
                ErrorKind::Io,
                "the server closed the direct connection",
            )));
        }
        Ok(())
    }

    /// Drops the `used` bytes of a whole reply: the connection is clean again.
    fn consume(&mut self, used: usize) {
        self.input.drain(..used);
        self.clean = true;
    }
}

/// A command written as RESP straight into a buffer: `*<count>`, then each argument as a bulk
/// string.
pub struct Resp<'a>(&'a mut Vec<u8>);

impl<'a> Resp<'a> {
    /// Starts a command of `count` arguments (its name included) in `out`.
    pub fn command(out: &'a mut Vec<u8>, count: usize) -> Resp<'a> {
        out.push(b'*');
        push_length(out, count);
        out.extend_from_slice(b"\r\n");
        Resp(out)
    }
}

impl Arguments for Resp<'_> {
    fn bytes(&mut self, argument: &[u8]) {
        self.0.push(b'$');
        push_length(self.0, argument.len());
        self.0.extend_from_slice(b"\r\n");
        self.0.extend_from_slice(argument);
        self.0.extend_from_slice(b"\r\n");
    }

    fn integer(&mut self, argument: u64) {
        match u8::try_from(argument) {
            // A count, a flag or a cost of one: most of a call's integers.
            Ok(digit @ 0..=9) => {
                self.0
                    .extend_from_slice(&[b'$', b'1', b'\r', b'\n', b'0' + digit, b'\r', b'\n'])
            }
            _ => self.bytes(itoa::Buffer::new().format(argument).as_bytes()),
        }
    }
}

/// Appends a length in decimal; most are under 100 (a key, a number's digits).
fn push_length(out: &mut Vec<u8>, length: usize) {
    match u8::try_from(length) {
        Ok(digit @ 0..=9) => out.push(b'0' + digit),
        Ok(tens @ 10..=99) => out.extend_from_slice(&[b'0' + tens / 10, b'0' + tens % 10]),
        _ => out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes()),
    }
}

/// What the start of the input holds.
#[derive(Debug, PartialEq)]
enum Parsed {
    /// Not a whole reply yet.
    Incomplete,
    /// An array of integers, and the bytes it took.
    Integers(Vec<i64>, usize),
    /// An error reply, and the bytes it took.
    Error(usize),
    /// Anything else.
    Unexpected,
}

/// Parses a RESP2 array of integers (`*2\r\n:1\r\n:-3\r\n`) or an error (`-ERR ...\r\n`),
/// each byte read once.
fn parse_integers(input: &[u8]) -> Parsed {
    match input.first() {
        None => return Parsed::Incomplete,
        Some(b'*') => {}
        Some(b'-') => {
            return match line(input, 0) {
                Some((_, used)) => Parsed::Error(used),
                None => Parsed::Incomplete,
            }
        }
        Some(_) => return Parsed::Unexpected,
    }
    let (count, mut at) = match integer_line(input, 1) {
        Ok(read) => read,
        Err(parsed) => return parsed,
    };
    let Ok(count) = usize::try_from(count) else {
        return Parsed::Unexpected;
    };
    let mut integers = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        match input.get(at) {
            None => return Parsed::Incomplete,
            Some(b':') => {}
            Some(_) => return Parsed::Unexpected,
        }
        match integer_line(input, at + 1) {
            Ok((value, next)) => {
                integers.push(value);
                at = next;
            }
            Err(parsed) => return parsed,
        }
    }
    Parsed::Integers(integers, at)
}

/// The line starting at `start` without its type byte and CRLF, and where the next one starts.
/// A line ending in a bare LF reads as `\n`, which no reply parsed here accepts.
fn line(input: &[u8], start: usize) -> Option<(&[u8], usize)> {
    let rest = input.get(start..)?;
    let end = rest.iter().position(|&byte| byte == b'\n')?;
    let body = match rest[..end].strip_suffix(b"\r") {
        Some(line) => line.get(1..).unwrap_or_default(),
        None => b"\n",
    };
    Some((body, start + end + 1))
}

/// The integer whose decimal digits (an optional minus sign first) start at `at` and end at a
/// CRLF, and where the next line starts; `Err` says why there is none: not all there yet, or
/// not an integer that fits an `i64`.
fn integer_line(input: &[u8], at: usize) -> Result<(i64, usize), Parsed> {
    let negative = input.get(at) == Some(&b'-');
    let first = at + usize::from(negative);
    let mut end = first;
    // Accumulated negatively, so that i64::MIN fits.
    let mut value: i64 = 0;
    loop {
        match input.get(end) {
            None => return Err(Parsed::Incomplete),
            Some(&digit @ b'0'..=b'9') => {
                value = value
                    .checked_mul(10)
                    .and_then(|value| value.checked_sub(i64::from(digit - b'0')))
                    .ok_or(Parsed::Unexpected)?;
                end += 1;
            }
            Some(b'\r') if end > first => break,
            Some(_) => return Err(Parsed::Unexpected),
        }
    }
    match input.get(end + 1) {
        None => Err(Parsed::Incomplete),
        Some(b'\n') if negative => Ok((value, end + 2)),
        Some(b'\n') => Ok((value.checked_neg().ok_or(Parsed::Unexpected)?, end + 2)),
        Some(_) => Err(Parsed::Unexpected),
    }
}

/// The error of a whole `-...\r\n` reply, as redis-rs reads it (its code: `NOSCRIPT`, `ERR`...).
fn server_error(reply: &[u8]) -> RedisError {
    match redis::parse_redis_value(reply).map(redis::Value::extract_error) {
        Ok(Err(error)) | Err(error) => error,
        Ok(Ok(_)) => RedisError::from((ErrorKind::Parse, "an error reply without an error")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_integer_arrays_whole_or_not_yet() {
        let reply = b"*3\r\n:1\r\n:-1\r\n:1763500000123456\r\n";
        assert_eq!(
            parse_integers(reply),
            Parsed::Integers(vec![1, -1, 1_763_500_000_123_456], reply.len())
        );
        for cut in 0..reply.len() {
            assert_eq!(parse_integers(&reply[..cut]), Parsed::Incomplete, "{cut}");
        }
        let mut two = reply.to_vec();
        two.extend_from_slice(b"*0\r\n");
        assert_eq!(
            parse_integers(&two),
            Parsed::Integers(vec![1, -1, 1_763_500_000_123_456], reply.len())
        );
        assert_eq!(parse_integers(b"*0\r\n"), Parsed::Integers(vec![], 4));
    }

    #[test]
    fn reads_errors_and_refuses_anything_else() {
        let noscript = b"-NOSCRIPT No matching script.\r\n";
        assert_eq!(parse_integers(noscript), Parsed::Error(noscript.len()));
        let error = server_error(noscript);
        assert_eq!(error.code(), Some("NOSCRIPT"));
        let missing = server_error(b"-ERR Function not found\r\n");
        assert_eq!(missing.code(), Some("ERR"));
        assert_eq!(missing.detail(), Some("Function not found"));
        for unexpected in [
            &b"+OK\r\n"[..],
            b"$3\r\nabc\r\n",
            b"*-1\r\n",
            b"*1\r\n$1\r\n1\r\n",
            b"*1\r\n:12a\r\n",
            b"*1\r\n:\r\n",
            b"*1\r\n:99999999999999999999\r\n",
            b"\r\n",
            b"*1\r\n:5\n",
        ] {
            assert_eq!(
                parse_integers(unexpected),
                Parsed::Unexpected,
                "{}",
                String::from_utf8_lossy(unexpected)
            );
        }
        let integer = |line: &[u8]| integer_line(line, 0).map(|(value, _)| value);
        assert_eq!(integer(b"-9223372036854775808\r\n"), Ok(i64::MIN));
        assert_eq!(integer(b"9223372036854775807\r\n"), Ok(i64::MAX));
        assert_eq!(integer(b"9223372036854775808\r\n"), Err(Parsed::Unexpected));
        assert_eq!(integer(b"-\r\n"), Err(Parsed::Unexpected));
        assert_eq!(integer(b"-12"), Err(Parsed::Incomplete));
        assert_eq!(integer(b"-12\r"), Err(Parsed::Incomplete));
    }

    #[test]
    fn a_batch_in_resp_is_byte_for_byte_the_redis_rs_command() {
        use crate::limiter::redis::script::{self, Algorithms, Call, Invoke};
        use crate::limiter::request::{entries, LimitRequest};
        use crate::limiter::testing::{asks, concurrency, gcra, limit, window};
        let limits = [
            limit("a", gcra(10, 3)),
            limit("b", window(5)),
            limit("c", concurrency(2)),
        ];
        let keys: [&[u8]; 3] = [b"{t}a", b"{t}b", b"{t}c"];
        let asks = asks(&keys, &[1, 0, 2]);
        let entries = entries(&limits, &asks);
        let request = LimitRequest {
            id: crate::limiter::RequestId(0xfeed),
            ..LimitRequest::new(&entries)
        };
        let (first, second) = (
            Call::at(&request, 1),
            Call::at(&LimitRequest::new(&entries[..1]), 2),
        );
        let calls = [&first, &second];
        let decision = script::decision_script(Algorithms::ALL);
        for (invoke, now) in [
            (Invoke::Function, None),
            (Invoke::Script, Some(1_763_500_000)),
        ] {
            let mut resp = Vec::new();
            let mut command = Resp::command(&mut resp, script::batch_arguments(&calls));
            script::write_batch(&mut command, decision, invoke, &calls, now);
            let packed = script::batch_command(decision, invoke, &calls, now).get_packed_command();
            assert_eq!(
                String::from_utf8_lossy(&resp),
                String::from_utf8_lossy(&packed)
            );
        }
    }

    #[test]
    fn every_length_and_integer_is_written_as_redis_rs_writes_it() {
        let long = vec![b'k'; 1000];
        let mut expected = redis::cmd("X");
        let mut resp = Vec::new();
        let mut written = Resp::command(&mut resp, 1 + 4 + 9);
        written.bytes(b"X");
        for argument in [&b""[..], b"k", &long[..10], &long[..]] {
            expected.arg(argument);
            written.bytes(argument);
        }
        for argument in [0, 1, 9, 10, 99, 100, 255, 256, u64::MAX] {
            expected.arg(argument);
            written.integer(argument);
        }
        assert_eq!(
            String::from_utf8_lossy(&resp),
            String::from_utf8_lossy(&expected.get_packed_command())
        );
    }

    #[test]
    fn only_plain_tcp_resp2_servers_get_a_direct_link() {
        use redis::IntoConnectionInfo;
        let info = |url: &str| url.into_connection_info().unwrap();
        let plain = DirectLink::to(&info("redis://:secret@127.0.0.1:6390/2")).unwrap();
        assert_eq!((plain.host.as_str(), plain.port), ("127.0.0.1", 6390));
        assert_eq!(plain.handshake_replies, 3);
        let handshake = String::from_utf8_lossy(&plain.handshake);
        assert!(handshake.starts_with("*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n*2\r\n$6\r\nSELECT"));
        let bare = DirectLink::to(&info("redis://localhost:6379")).unwrap();
        assert_eq!(bare.handshake_replies, 1);
        assert!(DirectLink::to(&info("redis+unix:///tmp/redis.sock")).is_none());
        assert!(DirectLink::to(&info("redis://127.0.0.1:6379?protocol=resp3")).is_none());
    }
}
