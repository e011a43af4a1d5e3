//! A rate as the operator wrote it: a count of units per period.

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

/// A count of requests per period, as the operator wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: NonZeroU64,
    pub period: Duration,
}

impl Rate {
    /// `count` per `period`; `None` when `count` is zero.
    pub fn new(count: u64, period: Duration) -> Option<Rate> {
        Some(Rate {
            count: NonZeroU64::new(count)?,
            period,
        })
    }

    /// The period in microseconds, the unit every limiter computes in.
    pub fn period_us(&self) -> u64 {
        self.period.as_micros() as u64
    }

    /// `(q, w)` of the IETF `RateLimit-Policy` field: the count per the period in whole seconds
    /// (rounded up, at least 1).
    pub fn advertised(&self) -> (u64, u64) {
        (
            self.count.get(),
            (self.period.as_millis() as u64).div_ceil(1000).max(1),
        )
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}ms", self.count, self.period.as_millis())
    }
}
