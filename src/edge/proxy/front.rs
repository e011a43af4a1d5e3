//! The front door's clocks against slow clients. A new connection must deliver its whole request
//! head within `request_head_timeout`; a kept-alive connection must deliver its next one within
//! `keepalive_timeout` of the previous response. A connection that misses its deadline is closed
//! without an answer (what nginx does), so a client trickling bytes holds a task for the deadline
//! at most, and others are served meanwhile. One timer per connection (its [`HeadClock`], kept
//! with its stream) bounds each whole head: it is armed the first time a head is not read at
//! the first try, and each later request that waits for its head moves it later, usually with
//! one atomic write (the runtime files it again, under its lock, when its old instant comes, or
//! at once when the new one is earlier or the timer has already fired), so a busy keep-alive
//! connection costs one timer per deadline's length, not one per request. Pingora's own
//! per-read keep-alive timer is turned off, since the deadline here is the stricter bound.

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream};
use pingora::protocols::http::v2::server::H2Options;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;
use tokio::time::Instant;

#[cfg(doc)]
use super::head_clock::HeadClock;
use super::head_count::HeadCount;

/// Where a request stands when the front door stops watching its head.
enum Head {
    /// The request was served (or failed) while its head was watched.
    Served(Option<ReusedHttpStream>),
    /// Its head has arrived; the request goes on without a deadline.
    Arrived,
    /// The deadline passed first.
    Late,
}

/// An HTTP application behind the front door's deadlines.
pub struct FrontDoor<A> {
    app: Arc<A>,
    head_timeout: Duration,
    keepalive_timeout: Duration,
}

impl<A> FrontDoor<A> {
    pub fn new(app: A, head_timeout: Duration, keepalive_timeout: Duration) -> FrontDoor<A> {
        FrontDoor {
            app: Arc::new(app),
            head_timeout,
            keepalive_timeout,
        }
    }
}

/// Pingora's keep-alive setting that keeps a connection open between requests and bounds no
/// read (`KeepaliveStatus::Infinite`): the front door's deadline bounds the head instead.
const KEEPALIVE_WITHOUT_READ_TIMER: u64 = 0;

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> HttpServerApp for FrontDoor<A> {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if session.is_http2() {
            // An HTTP/2 stream starts with its head complete; the connection's idle time is
            // bounded by `h2_idle_timeout`.
            return self.app.process_new_http(session, shutdown).await;
        }
        // The connection's clock lives with its stream; a stream not counted (none the proxy's
        // listeners accept) gets one for this request alone.
        let clock = match HeadCount::of(&session) {
            Some(count) => {
                count.arm();
                Arc::clone(count.clock())
            }
            None => Arc::default(),
        };
        let deadline = if clock.begin() {
            self.keepalive_timeout
        } else {
            self.head_timeout
        };
        if !*shutdown.borrow() {
            // Keep-alive on, without Pingora's timer on each read: the deadline below bounds the
            // whole head.
            session.set_keepalive(Some(KEEPALIVE_WITHOUT_READ_TIMER));
        }
        let mut request = self.app.process_new_http(session, shutdown);
        // The deadline counts from the first time the head is not in the socket: a head read at
        // the first try reads no clock and touches no timer.
        let mut due = None;
        let head = std::future::poll_fn(|cx| {
            if let Poll::Ready(reused) = request.as_mut().poll(cx) {
                return Poll::Ready(Head::Served(reused));
            }
            if clock.head_seen() {
                return Poll::Ready(Head::Arrived);
            }
            let due = *due.get_or_insert_with(|| Instant::now() + deadline);
            clock.poll_late(cx, due).map(|()| Head::Late)
        })
        .await;
        match head {
            Head::Served(reused) => reused,
            Head::Arrived => request.await,
            // Dropping the request closes the connection.
            Head::Late => None,
        }
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
