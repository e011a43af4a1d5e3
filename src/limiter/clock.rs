//! Time, injectable so tests never sleep: the wall clock the algorithms compute in (the scale of
//! Redis `TIME`), and a monotonic clock for intervals (breaker, deny cache, leases).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    /// Microseconds since the Unix epoch, the same scale as Redis `TIME`.
    fn now_us(&self) -> i64;

    /// A monotonic instant, for intervals.
    fn instant(&self) -> Instant;
}

/// The system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to: for tests. Both readings move together.
#[derive(Debug)]
pub struct ManualClock {
    now_us: AtomicI64,
    start_us: i64,
    epoch: Instant,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new(0)
    }
}

impl ManualClock {
    pub fn new(now_us: i64) -> ManualClock {
        ManualClock {
            now_us: AtomicI64::new(now_us),
            start_us: now_us,
            epoch: Instant::now(),
        }
    }

    pub fn set(&self, now_us: i64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }

    pub fn advance(&self, by_us: i64) {
        self.now_us.fetch_add(by_us, Ordering::SeqCst);
    }

    pub fn advance_by(&self, by: Duration) {
        self.advance(by.as_micros() as i64);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        self.now_us.load(Ordering::SeqCst)
    }

    /// The instant at creation plus the time advanced since (never before creation).
    fn instant(&self) -> Instant {
        let moved = (self.now_us() - self.start_us).max(0) as u64;
        self.epoch + Duration::from_micros(moved)
    }
}
