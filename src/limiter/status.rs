//! How one limit judged one request: the status every algorithm returns, in whole milliseconds
//! rounded up, exactly as the Lua scripts reply.

/// How one limit judged one request. Times are whole milliseconds, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitStatus {
    pub allowed: bool,
    /// Units still available after this request (if it was allowed) or now (if denied).
    pub remaining: u64,
    /// When a denied request could succeed; `None` means never (cost exceeds capacity).
    pub retry_after_ms: Option<u64>,
    /// When the limit is back to its full quota.
    pub reset_after_ms: u64,
    /// How long an allowed request is held before it proceeds (shaping with `max_delay`).
    pub delay_ms: u64,
    /// Where the call left the limit's state, in microseconds: the TAT a GCRA wrote, the end of
    /// the window a fixed window counted in; 0 when the call wrote nothing or the algorithm has
    /// no mark. A refund of the units this call took quotes it, so it never gives back what
    /// others consumed since.
    pub mark_us: i64,
}

impl LimitStatus {
    /// An allowed request: `remaining` units left, full again in `reset_us`.
    pub fn allowed(remaining: u64, reset_us: i64) -> LimitStatus {
        LimitStatus {
            allowed: true,
            remaining,
            retry_after_ms: Some(0),
            reset_after_ms: ceil_ms(reset_us),
            delay_ms: 0,
            mark_us: 0,
        }
    }

    /// A denied request: it could pass in `retry_us` (`None`: never).
    pub fn denied(remaining: u64, retry_us: Option<i64>, reset_us: i64) -> LimitStatus {
        LimitStatus {
            allowed: false,
            remaining,
            retry_after_ms: retry_us.map(ceil_ms),
            reset_after_ms: ceil_ms(reset_us),
            delay_ms: 0,
            mark_us: 0,
        }
    }
}

/// Microseconds to whole milliseconds, rounded up, as the scripts reply.
pub fn ceil_ms(us: i64) -> u64 {
    if us <= 0 {
        0
    } else {
        (us as u64).div_ceil(1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_ms_rounds_up() {
        assert_eq!(
            (
                ceil_ms(0),
                ceil_ms(1),
                ceil_ms(1000),
                ceil_ms(1001),
                ceil_ms(-5)
            ),
            (0, 1, 1, 2, 0)
        );
    }
}
