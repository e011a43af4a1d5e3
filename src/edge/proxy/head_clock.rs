//! A connection's clock for its HTTP/1 request heads, kept with its stream ([`HeadCount`] holds
//! it): whether a request has begun on the connection (the next gets the keep-alive deadline),
//! whether the current request's head has arrived (the proxy's first hook says so), and the
//! one timer that bounds each wait for a head. Nothing is allocated per request: the clock lives
//! as long as the connection.
//!
//! [`HeadCount`]: super::head_count::HeadCount

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

#[derive(Debug, Default)]
pub struct HeadClock {
    /// A request has begun on this connection.
    used: AtomicBool,
    /// The current request's head has arrived.
    seen: AtomicBool,
    /// The connection's one timer, made the first time a head is waited for; only the front
    /// door's task touches it, so the lock is never contended.
    alarm: Mutex<Option<Pin<Box<Sleep>>>>,
}

impl HeadClock {
    /// A request begins: its head is awaited. `true` when an earlier request began on this
    /// connection (it is kept alive).
    pub fn begin(&self) -> bool {
        self.seen.store(false, Ordering::Relaxed);
        self.used.swap(true, Ordering::Relaxed)
    }

    /// The current request's head has arrived: its deadline no longer applies.
    pub fn head_received(&self) {
        self.seen.store(true, Ordering::Release);
    }

    pub fn head_seen(&self) -> bool {
        self.seen.load(Ordering::Acquire)
    }

    /// Ready once `due` has passed. The timer is moved to `due` when it is set for another
    /// instant: a later one (each new request's) costs one atomic write, not a timer.
    pub fn poll_late(&self, cx: &mut Context<'_>, due: Instant) -> Poll<()> {
        let mut alarm = self.alarm.lock().unwrap_or_else(PoisonError::into_inner);
        let alarm = match &mut *alarm {
            Some(alarm) => {
                if alarm.deadline() != due {
                    alarm.as_mut().reset(due);
                }
                alarm
            }
            None => alarm.insert(Box::pin(tokio::time::sleep_until(due))),
        };
        alarm.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SECOND: Duration = Duration::from_secs(1);

    /// Whether `clock`'s deadline `due` has passed, polled once.
    async fn late(clock: &HeadClock, due: Instant) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(clock.poll_late(cx, due).is_ready())).await
    }

    #[test]
    fn a_connection_begins_with_the_head_deadline_then_keeps_alive() {
        let clock = HeadClock::default();
        assert!(!clock.begin(), "the first request: a new connection");
        clock.head_received();
        assert!(clock.head_seen());
        assert!(clock.begin(), "the next: a kept-alive one");
        assert!(!clock.head_seen(), "its head not seen yet");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_later_passes_at_the_later_instant_only() {
        let clock = HeadClock::default();
        assert!(!late(&clock, Instant::now() + SECOND).await);
        tokio::time::advance(SECOND / 2).await;
        let later = Instant::now() + SECOND;
        assert!(!late(&clock, later).await);
        tokio::time::advance(SECOND * 3 / 4).await;
        assert!(
            !late(&clock, later).await,
            "past the first instant, not the later one"
        );
        tokio::time::advance(SECOND / 2).await;
        assert!(late(&clock, later).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_moved_earlier_or_after_it_passed_holds_its_own_instant() {
        let clock = HeadClock::default();
        assert!(!late(&clock, Instant::now() + SECOND * 60).await);
        let earlier = Instant::now() + SECOND;
        assert!(!late(&clock, earlier).await);
        tokio::time::advance(SECOND * 2).await;
        assert!(
            late(&clock, earlier).await,
            "an earlier deadline passes at its own instant"
        );
        let next = Instant::now() + SECOND;
        assert!(
            !late(&clock, next).await,
            "a passed deadline is not carried to the next"
        );
        tokio::time::advance(SECOND * 2).await;
        assert!(late(&clock, next).await);
    }
}
