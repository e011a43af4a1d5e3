//! Sliding window, two-counter approximation: mirrors `lua/sliding_window.lua`.
//!
//! Windows are aligned to multiples of the window length on the shared clock. The estimate of
//! units in the last window is `current + ceil(previous × (W − elapsed) / W)`: the previous
//! window's count weighted by the part of it still inside the sliding window, rounded *up* so the
//! estimate never undercounts. A request passes iff `estimate + cost ≤ limit`.

use super::state::{State, Write};
use crate::limiter::status::LimitStatus;

/// `ceil(previous × (W − elapsed) / W)`, in doubles, in this order (as the Lua does).
fn weighted(previous: u64, window: i64, elapsed: i64) -> u64 {
    if previous == 0 {
        return 0;
    }
    (previous as f64 * (window - elapsed) as f64 / window as f64).ceil() as u64
}

/// The elapsed time in a window at which `ceil(count × (W − e) / W) ≤ room`.
fn elapsed_when_fits(room: u64, window: i64, count: u64) -> i64 {
    if count == 0 {
        return 0;
    }
    window - (room as f64 * window as f64 / count as f64).floor() as i64
}

/// The aligned window `now` falls in, and the counts of it and of the one before.
#[derive(Clone, Copy)]
struct Windows {
    /// `now`, never before the stored window's start (the clock never runs backwards inside a
    /// key).
    now: i64,
    start: i64,
    previous: u64,
    current: u64,
}

impl Windows {
    /// The windows at `now`, rolled forward from what is stored.
    fn at(window: i64, stored: Option<(i64, u64, u64)>, now: i64) -> Windows {
        let Some((stored_start, stored_previous, stored_current)) = stored else {
            let start = now - now.rem_euclid(window);
            return Windows {
                now,
                start,
                previous: 0,
                current: 0,
            };
        };
        let now = now.max(stored_start);
        let start = now - now.rem_euclid(window);
        let (previous, current) = if start == stored_start {
            (stored_previous, stored_current)
        } else if start == stored_start + window {
            (stored_current, 0)
        } else {
            (0, 0)
        };
        Windows {
            now,
            start,
            previous,
            current,
        }
    }

    /// Until the last unit counted in either window leaves the sliding window, with `current`
    /// units in the current one.
    fn reset(&self, window: i64, current: u64) -> i64 {
        if current > 0 {
            self.start + 2 * window - self.now
        } else if self.previous > 0 {
            self.start + window - self.now
        } else {
            0
        }
    }

    /// How long until `cost` fits under `limit` (at least 1 µs).
    fn retry(&self, limit: u64, window: i64, cost: u64) -> i64 {
        let elapsed = self.now - self.start;
        let wait = if self.current + cost <= limit {
            elapsed_when_fits(limit - self.current - cost, window, self.previous) - elapsed
        } else {
            // Only in the next window, where this window's count becomes the previous one.
            (self.start + window - self.now) + elapsed_when_fits(limit - cost, window, self.current)
        };
        wait.max(1)
    }
}

pub fn decide(
    limit: u64,
    window: i64,
    stored: Option<(i64, u64, u64)>,
    now: i64,
    cost: u64,
) -> (LimitStatus, Option<Write>) {
    let at = Windows::at(window, stored, now);
    let Windows {
        now,
        start,
        previous,
        current,
    } = at;
    let estimate = weighted(previous, window, now - start) + current;
    // A peek (cost 0) asks for nothing: it never denies.
    if cost > 0 && estimate + cost > limit {
        let retry = (cost <= limit).then(|| at.retry(limit, window, cost));
        return (
            LimitStatus::denied(
                limit.saturating_sub(estimate),
                retry,
                at.reset(window, current),
            ),
            None,
        );
    }
    let write = (cost > 0).then(|| Write {
        state: State::Sliding {
            start_us: start,
            previous,
            current: current + cost,
        },
        ttl_us: start + 2 * window - now,
    });
    (
        LimitStatus::allowed(
            limit.saturating_sub(estimate + cost),
            at.reset(window, current + cost),
        ),
        write,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000;

    #[test]
    fn the_previous_window_counts_by_its_overlap() {
        // 10 counted in [0 s, 1 s); at 1.25 s, 75% of it overlaps: estimate ceil(7.5) = 8.
        let (status, _) = decide(10, SEC, Some((0, 0, 10)), SEC + SEC / 4, 1);
        assert_eq!((status.allowed, status.remaining), (true, 1));
        let (status, _) = decide(10, SEC, Some((0, 0, 10)), SEC + SEC / 4, 3);
        assert!(!status.allowed);
        // The estimate drops to 7 once the overlap is at most 70%: at 1.3 s, 50 ms from now.
        assert_eq!(status.retry_after_ms, Some(50));
    }

    #[test]
    fn no_burst_of_twice_the_limit_at_a_boundary() {
        let (mut state, mut admitted) = (None, 0);
        for now in [SEC - 1, SEC] {
            for _ in 0..10 {
                let (status, write) = decide(5, SEC, state, now, 1);
                if let Some(Write {
                    state:
                        State::Sliding {
                            start_us,
                            previous,
                            current,
                        },
                    ..
                }) = write
                {
                    state = Some((start_us, previous, current));
                }
                admitted += usize::from(status.allowed);
            }
        }
        assert_eq!(admitted, 5);
    }

    #[test]
    fn a_full_current_window_waits_for_the_next() {
        let (status, _) = decide(4, SEC, Some((0, 0, 4)), SEC / 2, 1);
        // Next window at 1 s: previous = 4 weighs ceil(4 × (1 − e)) ≤ 3 once e ≥ 0.25 s.
        assert_eq!(status.retry_after_ms, Some(750));
    }
}
