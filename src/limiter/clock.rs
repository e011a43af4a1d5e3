//! Time for the in-process backend, injectable so tests never sleep.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, the same scale as Redis `TIME`.
pub trait Clock: Send + Sync {
    fn now_us(&self) -> i64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    }
}

/// A clock that moves only when told to: for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now_us: i64) -> ManualClock {
        ManualClock(AtomicI64::new(now_us))
    }

    pub fn set(&self, now_us: i64) {
        self.0.store(now_us, Ordering::SeqCst);
    }

    pub fn advance(&self, by_us: i64) {
        self.0.fetch_add(by_us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
