//! GCRA (also the token and leaky buckets): mirrors `lua/gcra.lua`.

use super::state::{State, Write};
use crate::limiter::status::{ceil_ms, LimitStatus};

#[derive(Debug, Clone, Copy)]
pub struct Params {
    emission: i64,
    tolerance: i64,
    max_delay: i64,
}

impl Params {
    pub fn new(emission_us: u64, tolerance_us: u64, max_delay_us: u64) -> Params {
        Params {
            emission: emission_us as i64,
            tolerance: tolerance_us as i64,
            max_delay: max_delay_us as i64,
        }
    }

    /// Units that fit in the credit left when the state is `ttl` ahead of now.
    fn remaining(&self, ttl: i64) -> u64 {
        let next = self.tolerance - ttl;
        if next < 0 {
            0
        } else {
            (next / self.emission) as u64
        }
    }
}

pub fn decide(p: Params, tat: Option<i64>, now: i64, cost: u64) -> (LimitStatus, Option<Write>) {
    let increment = p.emission * cost as i64;
    let tat = tat.unwrap_or(now);
    let new_tat = tat.max(now) + increment;
    // How far beyond the tolerance this request would reach: > 0 means past the burst.
    let over = new_tat - now - p.tolerance;
    // A peek (cost 0) asks for nothing: it never denies.
    if cost > 0 && over > p.max_delay {
        let ttl = (tat - now).max(0);
        let possible = increment <= p.tolerance + p.max_delay;
        return (
            LimitStatus::denied(
                p.remaining(ttl),
                possible.then_some(over - p.max_delay),
                ttl,
            ),
            None,
        );
    }
    let ttl = new_tat - now;
    let mut status = LimitStatus::allowed(p.remaining(ttl), ttl);
    if cost > 0 {
        status.delay_ms = ceil_ms(over);
    }
    let write = (cost > 0).then_some(Write {
        state: State::Gcra { tat_us: new_tat },
        ttl_us: ttl,
    });
    (status, write)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000;

    fn per_second(count: u64, burst: u64) -> Params {
        let emission = 1_000_000 / count;
        Params::new(emission, emission * (burst + 1), 0)
    }

    fn burst(p: Params, tat: &mut Option<i64>, now: i64, n: usize) -> usize {
        (0..n)
            .filter(|_| {
                let (status, write) = decide(p, *tat, now, 1);
                if let Some(Write {
                    state: State::Gcra { tat_us },
                    ..
                }) = write
                {
                    *tat = Some(tat_us);
                }
                status.allowed
            })
            .count()
    }

    #[test]
    fn admits_burst_plus_one_then_refills_at_the_rate() {
        let p = per_second(10, 4);
        let mut tat = None;
        assert_eq!(burst(p, &mut tat, 100 * SEC, 20), 5);
        let (status, _) = decide(p, tat, 100 * SEC, 1);
        assert_eq!(
            (status.retry_after_ms, status.reset_after_ms),
            (Some(100), 500)
        );
        assert_eq!(burst(p, &mut tat, 100 * SEC + 100_000, 5), 1);
    }

    #[test]
    fn reports_remaining_like_redis_cell_and_peeks_with_cost_zero() {
        let p = per_second(10, 4);
        let (status, write) = decide(p, None, SEC, 1);
        assert_eq!((status.remaining, status.reset_after_ms), (4, 100));
        assert_eq!(write.unwrap().ttl_us, 100_000);
        let (peek, write) = decide(p, None, SEC, 0);
        assert!(peek.allowed && write.is_none());
        assert_eq!(peek.remaining, 5);
    }

    #[test]
    fn cost_above_capacity_never_succeeds() {
        let (status, write) = decide(per_second(10, 1), None, SEC, 3);
        assert!(!status.allowed && write.is_none());
        assert_eq!(status.retry_after_ms, None);
    }

    #[test]
    fn max_delay_holds_requests_until_their_slot_instead_of_denying() {
        // 10/s, no burst, up to 250 ms of delay: 1 immediate, then 100, 200 ms delays, then denied.
        let p = Params::new(100_000, 100_000, 250_000);
        let mut tat = None;
        let delays: Vec<Option<u64>> = (0..4)
            .map(|_| {
                let (status, write) = decide(p, tat, SEC, 1);
                if let Some(Write {
                    state: State::Gcra { tat_us },
                    ..
                }) = write
                {
                    tat = Some(tat_us);
                }
                status.allowed.then_some(status.delay_ms)
            })
            .collect();
        assert_eq!(delays, vec![Some(0), Some(100), Some(200), None]);
        let (status, _) = decide(p, tat, SEC, 1);
        assert_eq!(status.retry_after_ms, Some(50));
    }
}
