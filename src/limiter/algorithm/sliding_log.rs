//! Sliding log, exact: mirrors `lua/sliding_log.lua`. A unit admitted at `t` counts until
//! `t + W`; a request passes iff the units of the last window plus its cost fit the limit.

use std::collections::VecDeque;

use super::state::{State, Write};
use crate::limiter::status::LimitStatus;

pub fn decide(
    limit: u64,
    window: i64,
    stamps: Option<&VecDeque<i64>>,
    now: i64,
    cost: u64,
) -> (LimitStatus, Option<Write>) {
    let empty = VecDeque::new();
    let stamps = stamps.unwrap_or(&empty);
    // The clock never runs backwards inside a key.
    let now = stamps.back().map_or(now, |&newest| now.max(newest));
    let live: VecDeque<i64> = stamps
        .iter()
        .copied()
        .filter(|&t| t > now - window)
        .collect();
    let count = live.len() as u64;
    // A peek (cost 0) asks for nothing: it never denies.
    if cost > 0 && count + cost > limit {
        let retry = (cost <= limit).then(|| {
            let must_expire = (count + cost - limit) as usize;
            live[must_expire - 1] + window - now
        });
        let reset = live.back().map_or(0, |&newest| newest + window - now);
        return (
            LimitStatus::denied(limit.saturating_sub(count), retry, reset),
            None,
        );
    }
    if cost == 0 {
        let reset = live.back().map_or(0, |&newest| newest + window - now);
        return (
            LimitStatus::allowed(limit.saturating_sub(count), reset),
            None,
        );
    }
    let mut stamps = live;
    stamps.extend(std::iter::repeat_n(now, cost as usize));
    (
        LimitStatus::allowed(limit - count - cost, window),
        Some(Write {
            state: State::Log { stamps },
            ttl_us: window,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000;

    #[test]
    fn exact_over_any_window() {
        let stamps: VecDeque<i64> = [0, SEC / 2, SEC / 2].into();
        let (status, _) = decide(3, SEC, Some(&stamps), SEC - 1, 1);
        assert_eq!((status.allowed, status.retry_after_ms), (false, Some(1)));
        let (status, write) = decide(3, SEC, Some(&stamps), SEC, 1);
        assert!(status.allowed);
        assert_eq!(
            write.unwrap().state,
            State::Log {
                stamps: [SEC / 2, SEC / 2, SEC].into()
            }
        );
    }
}
