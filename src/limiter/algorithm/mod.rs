//! The rate-limiting algorithms as pure functions of (state, now, cost).
//!
//! This is the reference the Lua scripts in `lua/` mirror, one file per algorithm on both sides:
//! the in-process backend runs these functions directly, and a property test checks the scripts
//! against them. All times are integer microseconds; replies are rounded up to whole
//! milliseconds exactly as the scripts do. Where a fraction is needed (the sliding window's
//! weight) both sides compute it with the same IEEE-754 double operations in the same order.

mod calendar;
mod concurrency;
mod fixed_window;
mod gcra;
mod sliding_log;
mod sliding_window;
mod state;

pub use calendar::{CalendarPeriods, CalendarUnit, Period};
pub use state::{Settled, State, Write};

/// How settling changes a key after a decision took units from it (`lua/settle.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Units taken and not spent go back, quoting the mark the taking call replied.
    GiveBack { units: u64, mark_us: i64 },
    /// A lease's unspent units go back (`limiter/leased/`), quoting the mark of the top-up
    /// that took them: as [`Change::GiveBack`], except that a GCRA key gives them back only
    /// while they are still the last units it took (its TAT is the mark). Another gateway's
    /// leased units may sit after them on the TAT's timeline, spendable until their own slots
    /// begin; moving the TAT back under them would let new requests take those slots twice.
    Return { units: u64, mark_us: i64 },
    /// Units spent beyond what was taken are charged, past the limit if need be.
    Charge { units: u64 },
}

/// A sliding log stores one entry per admitted unit: its memory grows with the limit.
pub const MAX_SLIDING_LOG_LIMIT: u64 = 10_000;

use crate::limiter::id::RequestId;
use crate::limiter::status::LimitStatus;

/// A count of units held against `limit` in a period that is full again in `reset_us` (fixed
/// windows, calendar periods), asked for `cost` more: denied past the limit (and never retried
/// when the cost alone exceeds it), else allowed, writing `state(count + cost)` to live `ttl_us`.
/// A peek (cost 0) asks for nothing: it never denies and writes nothing. Mirrors `count_against`
/// in `lua/prelude.lua`.
fn count_against(
    limit: u64,
    count: u64,
    cost: u64,
    (reset_us, ttl_us): (i64, i64),
    state: impl FnOnce(u64) -> State,
) -> (LimitStatus, Option<Write>) {
    if cost > 0 && count + cost > limit {
        let retry = (cost <= limit).then_some(reset_us);
        return (
            LimitStatus::denied(limit.saturating_sub(count), retry, reset_us),
            None,
        );
    }
    let write = (cost > 0).then(|| Write {
        state: state(count + cost),
        ttl_us,
    });
    (
        LimitStatus::allowed(limit.saturating_sub(count + cost), reset_us),
        write,
    )
}

/// How one limit decides. Parameters are precomputed at config load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Generic cell rate algorithm with redis-cell `CL.THROTTLE` semantics: one unit every
    /// `emission_us`, and `tolerance_us` of credit (`emission × (burst + 1)`, or
    /// `emission × capacity` for the token and leaky buckets). A request that would pass within
    /// `max_delay_us` more is admitted and delayed instead of denied (shaping).
    Gcra {
        emission_us: u64,
        tolerance_us: u64,
        max_delay_us: u64,
    },
    /// At most `limit` units per window; the window starts at the first hit (INCRBY + PEXPIRE).
    FixedWindow { limit: u64, window_us: u64 },
    /// At most `limit` units per period: calendar periods in a time zone (`algorithm:
    /// calendar`), or windows aligned to the epoch (the Envoy rate limit service).
    Calendar { limit: u64, period: Period },
    /// Two aligned counters; the previous window's count weighted by its overlap.
    SlidingWindow { limit: u64, window_us: u64 },
    /// Exact: a log of admitted units' timestamps over the last window.
    SlidingLog { limit: u64, window_us: u64 },
    /// At most `max` requests in flight per key, each holding a slot that expires `slot_ttl_us` after it
    /// was taken (the YAML's `lease:`) unless released sooner.
    Concurrency { max: u64, slot_ttl_us: u64 },
}

impl Algorithm {
    /// One of `k` equal shares: rates and counts divided by `k` (at least one unit remains), the
    /// burst window kept, so `k` shares together never admit more than the whole.
    pub fn share(&self, k: u64) -> Algorithm {
        self.scaled(1, k.max(1))
    }

    /// Rates and counts multiplied by `times / per` (rounded down, at least one unit; `per` at
    /// least 1), the windows, periods, delays and slot lifetimes kept; a GCRA's burst window
    /// keeps at least one emission. What a gateway's share ([`Algorithm::share`]) and a
    /// quota override (`Limit::with_quota`) both are.
    pub fn scaled(&self, times: u64, per: u64) -> Algorithm {
        let (times, per) = (u128::from(times.max(1)), u128::from(per.max(1)));
        let count = |count: u64| {
            let scaled = u128::from(count) * times / per;
            u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
        };
        match *self {
            Algorithm::Gcra {
                emission_us,
                tolerance_us,
                max_delay_us,
            } => {
                let scaled = u128::from(emission_us) * per / times;
                let emission_us = u64::try_from(scaled).unwrap_or(u64::MAX).max(1);
                Algorithm::Gcra {
                    emission_us,
                    tolerance_us: tolerance_us.max(emission_us),
                    max_delay_us,
                }
            }
            Algorithm::FixedWindow { limit, window_us } => Algorithm::FixedWindow {
                limit: count(limit),
                window_us,
            },
            Algorithm::SlidingWindow { limit, window_us } => Algorithm::SlidingWindow {
                limit: count(limit),
                window_us,
            },
            Algorithm::Calendar { limit, period } => Algorithm::Calendar {
                limit: count(limit),
                period,
            },
            Algorithm::SlidingLog { limit, window_us } => Algorithm::SlidingLog {
                limit: count(limit),
                window_us,
            },
            Algorithm::Concurrency { max, slot_ttl_us } => Algorithm::Concurrency {
                max: count(max),
                slot_ttl_us,
            },
        }
    }

    /// The most units one key can ever grant at once.
    pub fn capacity(&self) -> u64 {
        match *self {
            Algorithm::Gcra {
                emission_us,
                tolerance_us,
                max_delay_us,
            } => (tolerance_us + max_delay_us) / emission_us,
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::Calendar { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. } => limit,
            Algorithm::Concurrency { .. } => 1,
        }
    }
}

impl Algorithm {
    /// The identifier the Lua driver dispatches on.
    pub fn script_name(&self) -> &'static str {
        match self {
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::Calendar { .. } => "calendar",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::SlidingLog { .. } => "sliding_log",
            Algorithm::Concurrency { .. } => "concurrency",
        }
    }

    /// The three numeric parameters passed to the script for this algorithm; a calendar's are
    /// the bounds of the period holding `now_us` (the gateway's clock).
    pub fn script_params(&self, now_us: i64) -> [u64; 3] {
        match *self {
            Algorithm::Calendar { limit, period } => {
                let (start, end) = period.bounds(now_us);
                [limit, start.max(0) as u64, end.max(0) as u64]
            }
            Algorithm::Gcra {
                emission_us,
                tolerance_us,
                max_delay_us,
            } => [emission_us, tolerance_us, max_delay_us],
            Algorithm::FixedWindow { limit, window_us }
            | Algorithm::SlidingWindow { limit, window_us }
            | Algorithm::SlidingLog { limit, window_us } => [limit, window_us, 0],
            Algorithm::Concurrency { max, slot_ttl_us } => [max, slot_ttl_us, 0],
        }
    }

    /// What the state this algorithm stores means, as text: two limits whose meanings are equal
    /// can read each other's state (a reload that changes only a count, a burst or a capacity;
    /// the same limit under two plans). It names the script and the parameters that give the
    /// stored numbers their meaning, never the count a decision compares them with:
    /// * GCRA: the emission interval (its TAT is time owed, in units of it), not the tolerance
    ///   or the max delay (a TAT beyond a lowered tolerance denies until it drains);
    /// * fixed, sliding windows and logs: the window length (a count per window), not the limit;
    /// * calendar: the unit and zone (or the aligned length), not the limit;
    /// * concurrency: nothing (slots in flight, whatever the max and the lease).
    pub fn state_meaning(&self) -> String {
        let name = self.script_name();
        match *self {
            Algorithm::Gcra { emission_us, .. } => format!("{name}:{emission_us}"),
            Algorithm::FixedWindow { window_us, .. }
            | Algorithm::SlidingWindow { window_us, .. }
            | Algorithm::SlidingLog { window_us, .. } => format!("{name}:{window_us}"),
            Algorithm::Calendar {
                period: Period::Aligned { length_us },
                ..
            } => format!("{name}:{length_us}"),
            Algorithm::Calendar {
                period: Period::Calendar(periods),
                ..
            } => format!("{name}:{}@{}", periods.unit().name(), periods.zone_name()),
            Algorithm::Concurrency { .. } => name.to_string(),
        }
    }

    /// Whether requests through this limit need a unique id (log members, concurrency slots).
    pub fn needs_request_id(&self) -> bool {
        matches!(
            self,
            Algorithm::SlidingLog { .. } | Algorithm::Concurrency { .. }
        )
    }

    /// Decides one request of `cost` units (0: peek) at `now_us` against `state`. Returns the
    /// status and, when the request is allowed and costs something, the state to write if every
    /// other limit of the route allows too.
    pub fn decide(
        &self,
        state: Option<&State>,
        now_us: i64,
        cost: u64,
        id: RequestId,
    ) -> (LimitStatus, Option<Write>) {
        match *self {
            Algorithm::Gcra {
                emission_us,
                tolerance_us,
                max_delay_us,
            } => {
                let tat = match state {
                    Some(State::Gcra { tat_us }) => Some(*tat_us),
                    _ => None,
                };
                gcra::decide(
                    gcra::Params::new(emission_us, tolerance_us, max_delay_us),
                    tat,
                    now_us,
                    cost,
                )
            }
            Algorithm::FixedWindow { limit, window_us } => {
                let window = match state {
                    Some(State::Window { end_us, count }) => Some((*end_us, *count)),
                    _ => None,
                };
                fixed_window::decide(limit, window_us as i64, window, now_us, cost)
            }
            Algorithm::Calendar { limit, period } => {
                decide_calendar(limit, period, state, now_us, cost)
            }
            Algorithm::SlidingWindow { limit, window_us } => {
                decide_sliding_window(limit, window_us, state, now_us, cost)
            }
            Algorithm::SlidingLog { limit, window_us } => {
                let stamps = match state {
                    Some(State::Log { stamps }) => Some(stamps),
                    _ => None,
                };
                sliding_log::decide(limit, window_us as i64, stamps, now_us, cost)
            }
            Algorithm::Concurrency { max, slot_ttl_us } => {
                let slots = match state {
                    Some(State::Slots { slots }) => slots.as_slice(),
                    _ => &[],
                };
                concurrency::decide(max, slot_ttl_us as i64, slots, now_us, cost, id)
            }
        }
    }
}

/// [`calendar::decide`] on a key's state, read as a calendar period's counter.
fn decide_calendar(
    limit: u64,
    period: Period,
    state: Option<&State>,
    now_us: i64,
    cost: u64,
) -> (LimitStatus, Option<Write>) {
    let counter = match state {
        Some(&State::Period {
            start_us,
            end_us,
            count,
        }) => Some((start_us, end_us, count)),
        _ => None,
    };
    calendar::decide(limit, period.bounds(now_us), counter, now_us, cost)
}

/// [`sliding_window::decide`] on a key's state, read as the two windows' counters.
fn decide_sliding_window(
    limit: u64,
    window_us: u64,
    state: Option<&State>,
    now_us: i64,
    cost: u64,
) -> (LimitStatus, Option<Write>) {
    let counters = match state {
        Some(State::Sliding {
            start_us,
            previous,
            current,
        }) => Some((*start_us, *previous, *current)),
        _ => None,
    };
    sliding_window::decide(limit, window_us as i64, counters, now_us, cost)
}

impl Algorithm {
    /// Applies `change` to a key's `state` at `now_us`; mirrors `lua/settle.lua`. Only GCRA,
    /// the fixed window and (giving back) the calendar are settled (checked at config load).
    pub fn settle(&self, state: Option<&State>, now_us: i64, change: Change) -> Settled {
        match change {
            Change::GiveBack { units, mark_us } => self.refund(state, now_us, units, mark_us),
            Change::Return { units, mark_us } => match (self, state) {
                (Algorithm::Gcra { .. }, Some(State::Gcra { tat_us })) if *tat_us != mark_us => {
                    Settled::Unchanged
                }
                _ => self.refund(state, now_us, units, mark_us),
            },
            Change::Charge { units } => self.charge(state, now_us, units),
        }
    }

    /// Charges `units` spent beyond what a decision took (a response that cost more than its
    /// estimate). It always lands, past the limit if need be: GCRA moves the TAT on by their
    /// emission time; the fixed window counts them in the window open now (or a new one).
    pub fn charge(&self, state: Option<&State>, now_us: i64, units: u64) -> Settled {
        match *self {
            Algorithm::Gcra { emission_us, .. } => {
                let tat_us = match state {
                    Some(&State::Gcra { tat_us }) => tat_us.max(now_us),
                    _ => now_us,
                };
                let debt = i64::try_from(emission_us.saturating_mul(units)).unwrap_or(i64::MAX);
                let tat_us = tat_us.saturating_add(debt);
                Settled::Store(Write {
                    state: State::Gcra { tat_us },
                    ttl_us: tat_us - now_us,
                })
            }
            Algorithm::FixedWindow { window_us, .. } => {
                let (end_us, count) = match state {
                    Some(&State::Window { end_us, count }) if now_us < end_us => {
                        (end_us, count.saturating_add(units))
                    }
                    _ => (now_us + window_us as i64, units),
                };
                Settled::Store(Write {
                    state: State::Window { end_us, count },
                    ttl_us: end_us - now_us,
                })
            }
            _ => Settled::Unchanged,
        }
    }

    /// Gives back `units` that were taken earlier and not spent (leased quotas); mirrors
    /// `lua/settle.lua`. Only GCRA, the fixed window and the calendar take refunds (checked at
    /// config load).
    ///
    /// `mark_us` is what the call that took the units replied (`LimitStatus::mark_us`): a refund
    /// never gives back more than the part of those units time has not drained (GCRA), nor
    /// anything once their window or period has been replaced (fixed window, calendar), so it
    /// cannot undo what other gateways consumed since.
    pub fn refund(&self, state: Option<&State>, now_us: i64, units: u64, mark_us: i64) -> Settled {
        // A counter's units go back only to the window (period) they were counted in, open.
        let open = |end_us: i64| now_us < end_us && end_us == mark_us;
        let until = |state: State, end_us: i64| {
            Settled::Store(Write {
                state,
                ttl_us: end_us - now_us,
            })
        };
        match (*self, state) {
            (Algorithm::Gcra { emission_us, .. }, Some(State::Gcra { tat_us })) => {
                let credit = i64::try_from(emission_us.saturating_mul(units))
                    .unwrap_or(i64::MAX)
                    .min(mark_us.saturating_sub(now_us));
                if credit <= 0 {
                    return Settled::Unchanged;
                }
                let tat_us = tat_us.saturating_sub(credit);
                if tat_us <= now_us {
                    return Settled::Clear;
                }
                until(State::Gcra { tat_us }, tat_us)
            }
            (Algorithm::FixedWindow { .. }, Some(&State::Window { end_us, count }))
                if open(end_us) =>
            {
                let count = count.saturating_sub(units);
                until(State::Window { end_us, count }, end_us)
            }
            (
                Algorithm::Calendar { .. },
                Some(&State::Period {
                    start_us,
                    end_us,
                    count,
                }),
            ) if open(end_us) => {
                let count = count.saturating_sub(units);
                let period = State::Period {
                    start_us,
                    end_us,
                    count,
                };
                until(period, end_us)
            }
            _ => Settled::Unchanged,
        }
    }
}

/// Frees the concurrency slot of `id` (in-process backend; the Redis side is `lua/release.lua`).
pub fn release(state: &mut State, id: RequestId) {
    if let State::Slots { slots } = state {
        slots.retain(|(holder, _)| *holder != id);
    }
}
