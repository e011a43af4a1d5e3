//! The rate-limiting algorithms as pure functions of (state, now, cost).
//!
//! This is the reference the Lua scripts in `lua/` mirror line for line: the in-process backend
//! runs these functions directly, and the property tests check the scripts against them. All
//! times are integer microseconds; replies are rounded up to whole milliseconds exactly as the
//! scripts do.

use super::LimitStatus;

/// How one limit decides. Parameters are precomputed at config load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Generic cell rate algorithm with redis-cell `CL.THROTTLE` semantics: one request every
    /// `emission_us`, and `tolerance_us = emission_us * (burst + 1)` of credit, so `burst + 1`
    /// requests may pass at once.
    Gcra { emission_us: u64, tolerance_us: u64 },
    /// At most `limit` units per window; the window starts at the first hit (INCRBY + PEXPIRE).
    FixedWindow { limit: u64, window_us: u64 },
}

/// What a backend remembers per key. Absent state and expired state mean the same thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Theoretical arrival time of the next request.
    Gcra { tat_us: i64 },
    /// End of the current window and the units counted in it.
    Window { end_us: i64, count: u64 },
}

/// A state to store, and how long until it is equivalent to absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    pub state: State,
    pub ttl_us: i64,
}

/// Microseconds to whole milliseconds, rounded up, as the scripts reply.
pub fn ceil_ms(us: i64) -> u64 {
    if us <= 0 {
        0
    } else {
        (us as u64).div_ceil(1000)
    }
}

impl Algorithm {
    /// The identifier the Lua driver dispatches on.
    pub fn script_name(&self) -> &'static str {
        match self {
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::FixedWindow { .. } => "fixed_window",
        }
    }

    /// The two numeric parameters passed to the script for this algorithm.
    pub fn script_params(&self) -> [u64; 2] {
        match *self {
            Algorithm::Gcra {
                emission_us,
                tolerance_us,
            } => [emission_us, tolerance_us],
            Algorithm::FixedWindow { limit, window_us } => [limit, window_us],
        }
    }

    /// Decides one request of `cost` units at `now_us` against `state`. Returns the status and,
    /// when the request is allowed and costs something, the state to write if every other limit
    /// of the route allows too.
    pub fn decide(
        &self,
        state: Option<State>,
        now_us: i64,
        cost: u64,
    ) -> (LimitStatus, Option<Write>) {
        match *self {
            Algorithm::Gcra {
                emission_us,
                tolerance_us,
            } => {
                let tat = match state {
                    Some(State::Gcra { tat_us }) => Some(tat_us),
                    _ => None,
                };
                gcra(emission_us as i64, tolerance_us as i64, tat, now_us, cost)
            }
            Algorithm::FixedWindow { limit, window_us } => {
                let window = match state {
                    Some(State::Window { end_us, count }) => Some((end_us, count)),
                    _ => None,
                };
                fixed_window(limit, window_us as i64, window, now_us, cost)
            }
        }
    }
}

fn gcra(
    emission: i64,
    tolerance: i64,
    tat: Option<i64>,
    now: i64,
    cost: u64,
) -> (LimitStatus, Option<Write>) {
    let increment = emission * cost as i64;
    let tat = tat.unwrap_or(now);
    let new_tat = tat.max(now) + increment;
    let allow_at = new_tat - tolerance;
    let diff = now - allow_at;
    let remaining_for = |ttl: i64| {
        let next = tolerance - ttl;
        if next >= 0 {
            (next / emission) as u64
        } else {
            0
        }
    };
    if diff < 0 {
        let ttl = (tat - now).max(0);
        let retry = (increment <= tolerance).then(|| ceil_ms(-diff));
        let status = LimitStatus {
            allowed: false,
            remaining: remaining_for(ttl),
            retry_after_ms: retry,
            reset_after_ms: ceil_ms(ttl),
        };
        return (status, None);
    }
    let ttl = new_tat - now;
    let status = LimitStatus {
        allowed: true,
        remaining: remaining_for(ttl),
        retry_after_ms: Some(0),
        reset_after_ms: ceil_ms(ttl),
    };
    let write = (cost > 0).then_some(Write {
        state: State::Gcra { tat_us: new_tat },
        ttl_us: ttl,
    });
    (status, write)
}

fn fixed_window(
    limit: u64,
    window: i64,
    current: Option<(i64, u64)>,
    now: i64,
    cost: u64,
) -> (LimitStatus, Option<Write>) {
    let (mut end, mut count, mut now) = (0, 0, now);
    let mut fresh = true;
    if let Some((stored_end, stored_count)) = current {
        // The clock never runs backwards inside a key: nothing is earlier than the window start.
        now = now.max(stored_end - window);
        if now < stored_end {
            (end, count, fresh) = (stored_end, stored_count, false);
        }
    }
    if fresh {
        end = now + window;
        count = 0;
    }
    let reset = end - now;
    if count + cost > limit {
        let status = LimitStatus {
            allowed: false,
            remaining: limit.saturating_sub(count),
            retry_after_ms: (cost <= limit).then(|| ceil_ms(reset)),
            reset_after_ms: ceil_ms(reset),
        };
        return (status, None);
    }
    let status = LimitStatus {
        allowed: true,
        remaining: limit - count - cost,
        retry_after_ms: Some(0),
        reset_after_ms: ceil_ms(reset),
    };
    let write = (cost > 0).then_some(Write {
        state: State::Window {
            end_us: end,
            count: count + cost,
        },
        ttl_us: reset,
    });
    (status, write)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000;

    fn gcra_per_second(count: u64, burst: u64) -> Algorithm {
        let emission_us = 1_000_000 / count;
        Algorithm::Gcra {
            emission_us,
            tolerance_us: emission_us * (burst + 1),
        }
    }

    /// Runs `n` requests at one instant, applying writes, and returns how many passed.
    fn burst(alg: &Algorithm, state: &mut Option<State>, now: i64, n: usize) -> usize {
        (0..n)
            .filter(|_| {
                let (status, write) = alg.decide(*state, now, 1);
                if let Some(w) = write {
                    *state = Some(w.state);
                }
                status.allowed
            })
            .count()
    }

    #[test]
    fn gcra_admits_burst_plus_one_then_refills_at_the_rate() {
        let alg = gcra_per_second(10, 4);
        let mut state = None;
        assert_eq!(burst(&alg, &mut state, 100 * SEC, 20), 5);
        let (status, _) = alg.decide(state, 100 * SEC, 1);
        assert_eq!(status.retry_after_ms, Some(100));
        assert_eq!(status.reset_after_ms, 500);
        // One emission interval later exactly one more passes.
        assert_eq!(burst(&alg, &mut state, 100 * SEC + 100_000, 5), 1);
    }

    #[test]
    fn gcra_reports_remaining_like_redis_cell() {
        let alg = gcra_per_second(10, 4);
        let (status, write) = alg.decide(None, SEC, 1);
        assert_eq!((status.remaining, status.reset_after_ms), (4, 100));
        assert_eq!(write.unwrap().ttl_us, 100_000);
        let (peek, write) = alg.decide(None, SEC, 0);
        assert!(peek.allowed && write.is_none());
        assert_eq!(peek.remaining, 5);
    }

    #[test]
    fn gcra_cost_above_capacity_never_succeeds() {
        let alg = gcra_per_second(10, 1);
        let (status, write) = alg.decide(None, SEC, 3);
        assert!(!status.allowed && write.is_none());
        assert_eq!(status.retry_after_ms, None);
    }

    #[test]
    fn fixed_window_counts_and_reopens() {
        let alg = Algorithm::FixedWindow {
            limit: 3,
            window_us: SEC as u64,
        };
        let mut state = None;
        assert_eq!(burst(&alg, &mut state, 10 * SEC, 5), 3);
        let (status, _) = alg.decide(state, 10 * SEC + 250_000, 1);
        assert_eq!(
            (status.allowed, status.retry_after_ms, status.remaining),
            (false, Some(750), 0)
        );
        assert_eq!(burst(&alg, &mut state, 11 * SEC, 5), 3);
    }

    #[test]
    fn fixed_window_clock_going_backwards_stays_in_the_window() {
        let alg = Algorithm::FixedWindow {
            limit: 2,
            window_us: SEC as u64,
        };
        let mut state = None;
        assert_eq!(burst(&alg, &mut state, 10 * SEC, 2), 2);
        // An earlier clock does not open an earlier window, nor extend this one.
        let (status, _) = alg.decide(state, 5 * SEC, 1);
        assert!(!status.allowed);
        assert_eq!(status.reset_after_ms, 1000);
    }

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
