//! The front door's clock for HTTP/2 connections: a client that negotiated HTTP/2 (ALPN `h2`
//! over TLS, or any connection to an `h2c` listener) must send its connection preface within
//! `request_head_timeout`. Pingora waits for the preface without a deadline, so a client that
//! completes its TLS handshake and then sends nothing would hold its connection (and a file
//! descriptor) until it leaves. The accepted stream is wrapped in [`PrefaceDeadline`], whose
//! reads fail once the deadline passes before the preface has arrived; after it, the wrapper only
//! bounds an idle `h2c` listener's wait for a kept-alive HTTP/1 request (`keepalive_timeout`).
//! HTTP/1 heads are bounded by `front.rs`; HTTP/2 streams by `h2_idle_timeout` once connected.
//! It also counts the connections it serves, for a graceful shutdown to wait for (`drain.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::{Peek, Stream, ALPN};
use pingora::server::ShutdownWatch;

use super::head_count::HeadCount;
use crate::edge::drain::Drain;
use crate::observe::logging::PREFACE_TIMEOUT;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The HTTP/2 connection preface a client sends first (RFC 9113 §3.4): 24 bytes.
const PREFACE_LEN: usize = 24;

/// A listening application whose HTTP/2 connections must greet in time.
pub struct Greeting<A> {
    app: Arc<A>,
    head_timeout: Duration,
    keepalive_timeout: Duration,
    /// The listener speaks HTTP/2 in the clear (`h2c`): every connection may be one.
    h2c: bool,
    /// Counts the connections being served, which a graceful shutdown waits for.
    drain: Arc<Drain>,
}

impl<A> Greeting<A> {
    pub fn new(
        app: A,
        head_timeout: Duration,
        keepalive_timeout: Duration,
        h2c: bool,
        drain: Arc<Drain>,
    ) -> Self {
        Greeting {
            app: Arc::new(app),
            head_timeout,
            keepalive_timeout,
            h2c,
            drain,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Greeting<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let tls = stream.get_ssl_digest().is_some();
        let alpn_h2 = matches!(stream.selected_alpn_proto(), Some(ALPN::H2));
        let h2 = alpn_h2 || (self.h2c && !tls);
        // A kept-alive connection comes back already wrapped.
        let wrapped = stream.as_any().is::<PrefaceDeadline>() || stream.as_any().is::<HeadCount>();
        let stream: Stream = if h2 && !wrapped {
            Box::new(PrefaceDeadline::new(
                stream,
                self.head_timeout,
                self.keepalive_timeout,
            ))
        } else {
            stream
        };
        // Every stream that may carry HTTP/1 heads has them counted (an `h2c` listener's may
        // be either: an HTTP/2 preface reads as a request line and its empty line).
        let stream: Stream = if !alpn_h2 && !wrapped {
            Box::new(HeadCount::new(stream))
        } else {
            stream
        };
        let _serving = self.drain.in_flight();
        self.app.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.app.cleanup().await
    }
}

/// An accepted connection whose reads fail (`TimedOut`) once its deadline passes before the
/// HTTP/2 preface has been read; a transparent stream after it.
#[derive(Debug)]
pub struct PrefaceDeadline {
    inner: Stream,
    /// Runs out at the preface deadline.
    deadline: Pin<Box<Sleep>>,
    /// Bytes read so far, up to [`PREFACE_LEN`].
    read: usize,
    /// How long a later wait for the first bytes of a request may last (`h2c` listeners peek
    /// before each HTTP/1 request).
    keepalive_timeout: Duration,
}

impl PrefaceDeadline {
    pub fn new(inner: Stream, head_timeout: Duration, keepalive_timeout: Duration) -> Self {
        PrefaceDeadline {
            inner,
            deadline: Box::pin(tokio::time::sleep(head_timeout)),
            read: 0,
            keepalive_timeout,
        }
    }

    fn greeted(&self) -> bool {
        self.read >= PREFACE_LEN
    }

    fn timed_out() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, PREFACE_TIMEOUT)
    }
}

impl AsyncRead for PrefaceDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.greeted() && self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(PrefaceDeadline::timed_out()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let received = buf.filled().len() - before;
        self.read = self.read.saturating_add(received).min(PREFACE_LEN);
        polled
    }
}

super::stream::forward_to_inner!(PrefaceDeadline);

#[async_trait]
impl Peek for PrefaceDeadline {
    /// Waits for the first bytes until the preface deadline (or, once greeted, for the
    /// keep-alive timeout): an `h2c` listener peeks before it knows the protocol.
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        let until = match self.greeted() {
            false => self.deadline.deadline(),
            true => Instant::now() + self.keepalive_timeout,
        };
        tokio::time::timeout_at(until, self.inner.try_peek(buf))
            .await
            .unwrap_or_else(|_| Err(PrefaceDeadline::timed_out()))
    }
}
