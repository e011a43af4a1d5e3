//! Graceful shutdown on SIGTERM, in the order a load balancer needs: for
//! `grace_period_seconds` the gateway keeps accepting and serving while `/readyz` answers 503
//! (and HTTP/1 responses say `Connection: close`), so the balancer takes it out of rotation;
//! then it stops accepting and lets requests in flight finish, for at most
//! `graceful_shutdown_timeout_seconds`, and exits as soon as none is left. SIGINT stops at once,
//! at any point; SIGQUIT is Pingora's graceful upgrade, unchanged.
//!
//! Pingora 0.9 does the reverse by itself (it stops accepting at once, then sleeps the grace
//! period, then cancels what is left): sluice answers Pingora's shutdown-signal hook itself
//! ([`Signals`]) and gives its services its own stop signals instead of Pingora's — `closing`
//! (the proxy listeners and the rate limit service stop accepting) and `finishing` (the admin
//! listener, the configuration service, tracing's last flush) — then tells Pingora to shut down
//! at once, with nothing left to wait for. Pingora's own stop (the end of an upgrade) is relayed
//! to both ([`Relay`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{watch, Notify};

/// How long the services stopped last (tracing's flush) get before the process exits.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// What is still running, and a wake-up when nothing is.
#[derive(Default)]
struct Count {
    running: AtomicUsize,
    none: Notify,
}

impl Count {
    fn enter(&self) {
        self.running.fetch_add(1, Ordering::AcqRel);
    }

    fn leave(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.none.notify_waiters();
        }
    }

    /// Returns once nothing runs.
    async fn none_left(&self) {
        loop {
            let notified = self.none.notified();
            tokio::pin!(notified);
            // Registered before the count is read, so a leave in between still wakes it.
            notified.as_mut().enable();
            if self.running.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// The shutdown's state, shared by the signal handler, the services and the admin listener.
pub struct Drain {
    grace: Duration,
    timeout: Duration,
    draining: AtomicBool,
    /// Sent at the end of the grace period: stop accepting.
    closing: watch::Sender<bool>,
    /// Sent once nothing is in flight (or the timeout passed): everything else stops.
    finishing: watch::Sender<bool>,
    /// Proxy connections and the rate limit service, while they serve.
    in_flight: Count,
    /// Services that finish last (tracing's flush).
    last: Count,
}

impl Drain {
    /// A drain that keeps accepting for `grace` after SIGTERM, then waits up to `timeout` for
    /// what is in flight.
    pub fn new(grace: Duration, timeout: Duration) -> Arc<Drain> {
        Arc::new(Drain {
            grace,
            timeout,
            draining: AtomicBool::new(false),
            closing: watch::Sender::new(false),
            finishing: watch::Sender::new(false),
            in_flight: Count::default(),
            last: Count::default(),
        })
    }

    /// SIGTERM was received: `/readyz` says so and connections are not kept alive.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The signal that stops the proxy listeners and the rate limit service from accepting.
    /// Subscribed when the services are wired, so a stop sent before one starts is still seen.
    pub fn closing(&self) -> ShutdownWatch {
        self.closing.subscribe()
    }

    /// The signal that stops everything else.
    pub fn finishing(&self) -> ShutdownWatch {
        self.finishing.subscribe()
    }

    /// Counts a connection (or a service call) in flight until the guard is dropped.
    pub fn in_flight(self: &Arc<Self>) -> InFlight {
        self.in_flight.enter();
        InFlight {
            drain: Arc::clone(self),
            last: false,
        }
    }

    /// Counts a service that must end before the process does (tracing's flush).
    pub fn finishing_last(self: &Arc<Self>) -> InFlight {
        self.last.enter();
        InFlight {
            drain: Arc::clone(self),
            last: true,
        }
    }

    fn close(&self) {
        self.closing.send_replace(true);
    }

    fn finish(&self) {
        self.close();
        self.finishing.send_replace(true);
    }
}

/// Something the drain waits for, until dropped.
pub struct InFlight {
    drain: Arc<Drain>,
    last: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.last {
            self.drain.last.leave();
        } else {
            self.drain.in_flight.leave();
        }
    }
}

/// Pingora's shutdown-signal hook, answered by sluice: SIGQUIT is Pingora's upgrade, SIGINT a
/// fast shutdown, SIGTERM the drain.
pub struct Signals(pub Arc<Drain>);

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        // Installed here, in Pingora's runtime, as its own watcher does.
        let mut term = handler(SignalKind::terminate());
        let mut quit = handler(SignalKind::quit());
        let mut interrupt = handler(SignalKind::interrupt());
        tokio::select! {
            _ = quit.recv() => return ShutdownSignal::GracefulUpgrade,
            _ = interrupt.recv() => return ShutdownSignal::FastShutdown,
            _ = term.recv() => {}
        }
        match until_interrupted(&mut interrupt, self.0.drain()).await {
            Some(()) => log::info!("SIGTERM: drained; exiting"),
            None => log::info!("SIGINT: exiting at once"),
        }
        // Everything has stopped (or SIGINT says not to wait): Pingora need not wait either.
        ShutdownSignal::FastShutdown
    }
}

fn handler(kind: SignalKind) -> Signal {
    signal(kind)
        .unwrap_or_else(|e| crate::runtime::daemon::fatal(&format!("cannot handle signals: {e}")))
}

/// `work`'s output, or `None` if SIGINT comes first.
async fn until_interrupted<T>(
    interrupt: &mut Signal,
    work: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        done = work => Some(done),
        _ = interrupt.recv() => None,
    }
}

impl Drain {
    /// The drain itself: not ready, still serving; then no longer accepting, finishing what is
    /// in flight; then the rest.
    async fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
        log::info!(
            "SIGTERM: /readyz answers 503; serving and accepting for {} s more \
             (grace_period_seconds)",
            self.grace.as_secs()
        );
        tokio::time::sleep(self.grace).await;
        self.close();
        log::info!(
            "SIGTERM: stopped accepting; requests in flight have up to {} s \
             (graceful_shutdown_timeout_seconds)",
            self.timeout.as_secs()
        );
        if tokio::time::timeout(self.timeout, self.in_flight.none_left())
            .await
            .is_err()
        {
            log::warn!(
                "SIGTERM: {} connections still open after {} s; closing them",
                self.in_flight.running.load(Ordering::Relaxed),
                self.timeout.as_secs()
            );
        }
        self.finish();
        let _ = tokio::time::timeout(FINISH_WAIT, self.last.none_left()).await;
    }
}

/// Relays Pingora's own stop (the old instance's, at the end of a graceful upgrade) to the
/// services, which listen to the drain's signals instead of Pingora's.
pub struct Relay(pub Arc<Drain>);

#[async_trait]
impl BackgroundService for Relay {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        if shutdown.wait_for(|stop| *stop).await.is_ok() {
            self.0.finish();
        }
    }
}

/// A background service that stops on one of the drain's signals instead of Pingora's; while
/// it runs, it holds what the drain waits for (a service serving calls, or one that flushes).
pub struct StoppedBy<S> {
    service: S,
    stop: ShutdownWatch,
    hold: Box<dyn Fn() -> Option<InFlight> + Send + Sync>,
}

impl<S> StoppedBy<S> {
    /// `service`, stopped by `stop`; `hold` makes the guard it keeps while running (if any).
    pub fn new(
        service: S,
        stop: ShutdownWatch,
        hold: impl Fn() -> Option<InFlight> + Send + Sync + 'static,
    ) -> StoppedBy<S> {
        StoppedBy {
            service,
            stop,
            hold: Box::new(hold),
        }
    }
}

#[async_trait]
impl<S: BackgroundService + Send + Sync> BackgroundService for StoppedBy<S> {
    async fn start_with_ready_notifier(
        &self,
        _pingora: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let _running = (self.hold)();
        self.service
            .start_with_ready_notifier(self.stop.clone(), ready)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_drain_serves_through_the_grace_then_waits_for_what_is_in_flight() {
        let drain = Drain::new(Duration::from_secs(5), Duration::from_secs(10));
        let (mut closing, mut finishing) = (drain.closing(), drain.finishing());
        let connection = drain.in_flight();
        let started = tokio::time::Instant::now();
        let draining = tokio::spawn({
            let drain = Arc::clone(&drain);
            async move { drain.drain().await }
        });
        tokio::task::yield_now().await;
        assert!(drain.is_draining(), "not ready at once");
        assert!(!*closing.borrow(), "still accepting");
        closing.changed().await.unwrap();
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(5),
            "accepting for the grace"
        );
        // The connection in flight ends 3 s later: nothing waits for the timeout.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!*finishing.borrow(), "waiting for the connection");
        drop(connection);
        finishing.changed().await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(8));
        draining.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn what_outlasts_the_timeout_is_not_waited_for() {
        let drain = Drain::new(Duration::from_secs(1), Duration::from_secs(2));
        let _forever = drain.in_flight();
        let started = tokio::time::Instant::now();
        drain.drain().await;
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert!(*drain.finishing().borrow());
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_services_get_a_moment_to_flush() {
        let drain = Drain::new(Duration::ZERO, Duration::ZERO);
        let flushing = drain.finishing_last();
        let ends = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(flushing);
        });
        let started = tokio::time::Instant::now();
        drain.drain().await;
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        ends.await.unwrap();
    }
}
