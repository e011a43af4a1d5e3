//! The front door's clocks against slow clients. A new connection must deliver its whole request
//! head within `request_head_timeout`; a kept-alive connection must deliver its next one within
//! `keepalive_timeout` of the previous response. Each read of a head is bounded by the same
//! time (HTTP/1). A connection that misses its deadline is closed without an answer (what nginx
//! does), so a client trickling bytes holds a task for the deadline at most, and others are
//! served meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, HttpServerOptions, ReusedHttpStream};
use pingora::protocols::http::v2::server::H2Options;
use pingora::protocols::http::ServerSession;
use pingora::server::ShutdownWatch;

tokio::task_local! {
    /// Set once the request head of the connection's current request has been read.
    static HEAD_SEEN: Arc<AtomicBool>;
}

/// Called when a request head has been read (the proxy's first hook): its deadline no longer
/// applies.
pub fn head_received() {
    let _ = HEAD_SEEN.try_with(|seen| seen.store(true, Ordering::Release));
}

/// Marks a connection that has served a request, so the next one on it gets the keep-alive
/// deadline (`ProxyHttp::persist_connection_context`).
#[derive(Debug)]
pub struct Served;

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

/// Whole seconds, rounded up (Pingora's keep-alive timeout is in seconds), at least one.
fn ceil_seconds(duration: Duration) -> u64 {
    duration.as_millis().div_ceil(1000).max(1) as u64
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> HttpServerApp for FrontDoor<A> {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        let previous = session.take_connection_user_context();
        let reused = previous.as_ref().is_some_and(|p| p.is::<Served>());
        session.set_connection_user_context(previous);
        let deadline = if reused {
            self.keepalive_timeout
        } else {
            self.head_timeout
        };
        if !*shutdown.borrow() {
            session.set_keepalive(Some(ceil_seconds(deadline)));
        }
        let seen = Arc::new(AtomicBool::new(false));
        let request = HEAD_SEEN.scope(
            Arc::clone(&seen),
            self.app.process_new_http(session, shutdown),
        );
        tokio::pin!(request);
        tokio::select! {
            reused = &mut request => return reused,
            () = tokio::time::sleep(deadline) => {}
        }
        if seen.load(Ordering::Acquire) {
            request.await
        } else {
            // Dropping the request closes the connection.
            None
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
