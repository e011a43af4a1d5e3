//! Concurrency: at most `max` requests in flight per key: mirrors `lua/concurrency.lua`.
//!
//! Each admitted request holds a slot until it is released (response finished or client gone)
//! or until the slot's time to live (`lease:` in the YAML) runs out, so a gateway that dies cannot
//! leak slots. A denied request is told to retry after the earliest slot expiry, at most one
//! second (slots usually free sooner).

use super::state::{State, Write};
use crate::limiter::id::RequestId;
use crate::limiter::status::LimitStatus;

/// The longest `Retry-After` a full concurrency limit advertises.
pub const MAX_RETRY_US: i64 = 1_000_000;

pub fn decide(
    max: u64,
    slot_ttl: i64,
    slots: &[(RequestId, i64)],
    now: i64,
    cost: u64,
    id: RequestId,
) -> (LimitStatus, Option<Write>) {
    let live: Vec<(RequestId, i64)> = slots
        .iter()
        .copied()
        .filter(|&(_, expiry)| expiry > now)
        .collect();
    let count = live.len() as u64;
    let latest = live
        .iter()
        .map(|&(_, expiry)| expiry - now)
        .max()
        .unwrap_or(0);
    if cost == 0 {
        return (
            LimitStatus::allowed(max.saturating_sub(count), latest),
            None,
        );
    }
    if count + 1 > max {
        let earliest = live
            .iter()
            .map(|&(_, expiry)| expiry - now)
            .min()
            .unwrap_or(0);
        return (
            LimitStatus::denied(0, Some(earliest.clamp(1, MAX_RETRY_US)), latest),
            None,
        );
    }
    let mut slots = live;
    slots.push((id, now + slot_ttl));
    let ttl = latest.max(slot_ttl);
    (
        LimitStatus::allowed(max - count - 1, ttl),
        Some(Write {
            state: State::Slots { slots },
            ttl_us: ttl,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_at_most_max_slots_and_expired_ones_free_theirs() {
        let slots = [(RequestId(1), 2_000_000), (RequestId(2), 3_000_000)];
        let (status, _) = decide(2, 1_000_000, &slots, 1_500_000, 1, RequestId(3));
        assert_eq!((status.allowed, status.retry_after_ms), (false, Some(500)));
        let (status, write) = decide(2, 1_000_000, &slots, 2_000_000, 1, RequestId(3));
        assert!(status.allowed);
        let state = write.unwrap().state;
        assert_eq!(
            state,
            State::Slots {
                slots: vec![(RequestId(2), 3_000_000), (RequestId(3), 3_000_000)]
            }
        );
    }
}
