//! Fixed window counter: mirrors `lua/fixed_window.lua`.

use super::count_against;
use super::state::{State, Write};
use crate::limiter::status::LimitStatus;

pub fn decide(
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
    count_against(limit, count, cost, (reset, reset), |count| State::Window {
        end_us: end,
        count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: i64 = 1_000_000;

    #[test]
    fn counts_and_reopens() {
        let mut state = None;
        let mut run = |now: i64| {
            let (status, write) = decide(3, SEC, state, now, 1);
            if let Some(Write {
                state: State::Window { end_us, count },
                ..
            }) = write
            {
                state = Some((end_us, count));
            }
            status
        };
        assert!((0..3).all(|_| run(10 * SEC).allowed));
        let denied = run(10 * SEC + 250_000);
        assert_eq!(
            (denied.allowed, denied.retry_after_ms, denied.remaining),
            (false, Some(750), 0)
        );
        assert!(run(11 * SEC).allowed);
    }

    #[test]
    fn clock_going_backwards_stays_in_the_window() {
        let (status, _) = decide(2, SEC, Some((11 * SEC, 2)), 5 * SEC, 1);
        assert!(!status.allowed);
        assert_eq!(status.reset_after_ms, 1000);
    }
}
