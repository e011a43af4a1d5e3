//! What the in-process backend remembers per key, mirroring what the scripts store in Redis.

use std::collections::VecDeque;

use crate::limiter::id::RequestId;

/// What a backend remembers per key. Absent state and expired state mean the same thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Theoretical arrival time of the next unit.
    Gcra { tat_us: i64 },
    /// End of the current window and the units counted in it.
    Window { end_us: i64, count: u64 },
    /// A calendar (or epoch-aligned) period's counter: its bounds as known (0: not known yet)
    /// and the units counted in it.
    Period {
        start_us: i64,
        end_us: i64,
        count: u64,
    },
    /// Start of the current aligned window, and the counts of it and of the one before.
    Sliding {
        start_us: i64,
        previous: u64,
        current: u64,
    },
    /// Timestamps of admitted units, ascending.
    Log { stamps: VecDeque<i64> },
    /// Concurrency slots held: request and expiry.
    Slots { slots: Vec<(RequestId, i64)> },
}

impl State {
    /// Where this state stands, as the scripts reply it: a GCRA's TAT, a fixed window's or a
    /// calendar period's end (0 while the period's end is not known); 0 for the others.
    pub fn mark_us(&self) -> i64 {
        match *self {
            State::Gcra { tat_us } => tat_us,
            State::Window { end_us, .. } | State::Period { end_us, .. } => end_us,
            _ => 0,
        }
    }
}

/// A state to store, and how long until it is equivalent to absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub state: State,
    pub ttl_us: i64,
}

/// What settling (giving back or charging units) does to a key's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Nothing to give back to: no state, or a window already closed.
    Unchanged,
    Store(Write),
    /// The state is back to "full": the same as no key.
    Clear,
}
