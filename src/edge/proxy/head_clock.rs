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
