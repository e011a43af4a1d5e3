//! Leased quotas (`mode: auto`, the default where leases apply, and `mode: leased`): a gateway
//! takes up to L units of a hot key from the backend in one call, spends them locally, and gives
//! back what it did not spend once the key is idle; no interval sees more admitted, across all
//! gateways, than the limit's allowance (burst + rate × length), as if every request had been
//! decided in Redis.
//!
//! * A lease is taken by asking for more than the request's cost in the same atomic check as
//!   the route's other limits. Its size ([`Holding::lease_size`]) is this gateway's traffic on
//!   the key over `HORIZON`, within L minus what it holds, what the limit had left at the last
//!   answer (near exhaustion leasing turns exact), and what it can spend before the units lapse.
//!   `mode: auto` takes a lease only when it would hold at least `AUTO_MIN_UNITS`, so a cold key
//!   (a per-client limit) is decided exactly; `mode: leased` takes any.
//! * Units held are spent without calling the backend, each before its deadline ([`Lapse`]):
//!   a GCRA unit before its emission slot begins, a window's or calendar period's before it
//!   closes. Units past their deadline lapse unspent: that is the price of exactness, an
//!   under-admission of at most what the gateways hold (≤ N × L), plus a GCRA lease's gap.
//! * While one request tops a key up, others that find it empty ask for their own cost only,
//!   so a gateway never holds more than L unspent units of a key.
//! * Unspent units are given back (`SettleUnits::settle`, `Change::Return`) once a key has been
//!   idle for `IDLE`, quoting the mark of the top-up that took them: a window or period takes
//!   back all of them while it is still open, a GCRA key those still the last units it took. A
//!   refund never undoes what another gateway consumed or holds. Units a request paid from the
//!   holding go back into it when another limit refuses the request (or its call fails); a
//!   window's that the holding cannot take back go to the backend at once.
//! * The bound, in the words of docs/scaling.md and docs/reliability.md: leases never admit
//!   beyond a limit's allowance. What they charge beyond what was served is what the gateways
//!   hold unspent — at most `lease_units` per gateway and key, plus, for GCRA, a gap of at most a
//!   tenth of the burst — and it goes back: a window's or calendar period's units to their
//!   window, exactly, once the key has been idle for 250 ms (at once for a request another limit
//!   refused); a GCRA's once idle while they are still the key's last units, else they free
//!   themselves as their slots pass (within the burst). Once every key is idle, a window's or
//!   calendar period's count is exactly what admitted requests cost (`tests::props`,
//!   `tests/leases.rs`).
//! * What a gateway holds of each key is its **holding**; all of them, its `Holdings` (not to be
//!   confused with upstream `pool::Pool`). A top-up's answer is credited to the holding
//!   (`credit_top_up`); a settlement is only what goes to the backend.
//! * A denied top-up is asked again once with the exact costs: a request is never denied for
//!   units it did not need.
//!
//! The leases' room: the decorator (this file), the [`simulation`] of gateways leasing from one
//! backend (test support, shared with `tests/leases.rs`), and the property tests in `tests/`
//! (`strategy.rs` draws the cases for both).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use dashmap::mapref::entry::Entry as HoldingEntry;
use prometheus::{IntCounter, IntGauge};
use smallvec::SmallVec;

use super::algorithm::{Algorithm, Change, Period};
use super::backend::{Limiter, SettleUnits, Settlement};
use super::clock::Clock;
use super::decision::{Decision, Source, Statuses};
use super::error::LimiterError;
use super::key::{key_map, KeyMap};
use super::limit::{Leasing, Limit, LIMITS_INLINE};
use super::meters::Counter;
use super::request::{Entries, Entry, LimitRequest};
use super::status::LimitStatus;

/// What leasing counts.
#[derive(Clone)]
pub struct LeaseMeters {
    /// Decisions paid from units held, without a backend call.
    pub held_decisions: Counter,
    /// Calls that took units beyond the request's own cost.
    pub top_ups: IntCounter,
    /// Units given back unspent.
    pub units_returned: IntCounter,
    /// Units that lapsed unspent: their slot began, or their window closed.
    pub units_lapsed: IntCounter,
    /// Units held unspent, over all keys.
    pub units_held: IntGauge,
}

impl LeaseMeters {
    /// Handles registered nowhere (tests and tools).
    pub fn unregistered() -> LeaseMeters {
        let counter = |name| IntCounter::new(name, "unregistered").expect("a valid counter");
        LeaseMeters {
            held_decisions: Counter::default(),
            top_ups: counter("top_ups"),
            units_returned: counter("units_returned"),
            units_lapsed: counter("units_lapsed"),
            units_held: IntGauge::new("units_held", "unregistered").expect("a valid gauge"),
        }
    }
}

/// Shards of the holdings' map.
const SHARDS: usize = 16;
/// Keys a gateway holds leases for at most (give or take one per request seeing a new key at
/// the same time); beyond it, further keys are decided exactly.
pub const HOLDINGS_CAPACITY: usize = 10_000;
/// A lease is sized to last this long at the rate this gateway has seen on the key.
const HORIZON: Duration = Duration::from_millis(100);
/// A GCRA lease leaves at most this share of the limit's tolerance (1 / GAP_SHARE) as a gap
/// before its units (see [`Holding::lease_size`]).
const GAP_SHARE: u64 = 10;
/// Replies round times up to whole milliseconds: a deadline read from one is taken this much
/// earlier, so it is never later than the deciding clock's.
const REPLY_ROUNDING_US: u64 = 999;
/// Unspent units of a key nobody has asked for in this long are given back.
pub const IDLE: Duration = Duration::from_millis(250);
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Longer than a top-up and its exact retry can take (two calls of at most the 10 s deadline):
/// a top-up this old was dropped with its request.
const TOP_UP_STALE: Duration = Duration::from_secs(30);

/// How long each unit held stays spendable.
///
/// Spending a unit later than the deciding clock could have admitted it would let the gateways
/// together exceed the limit's allowance (burst + rate × length) over some interval:
/// * GCRA (and its buckets): a unit taken in a lease occupies one emission slot on the key's
///   timeline (the TAT). Spent no later than its slot begins, every unit admitted anywhere sits
///   in its own slot within the tolerance of its admission, exactly as if Redis had decided it
///   then; spent later, it would add to the requests the slots after it admit. So units lapse
///   one by one as their slots begin: the first held unit at `lapse_at`, the next one emission
///   later, and so on.
/// * Fixed window, calendar: a unit counts in the window (period) it was taken in; all lapse
///   when it closes.
///
/// A calendar's period bounds are the gateway's (Redis has no time zones): a top-up sent by a
/// gateway whose clock is behind Redis's across a boundary counts in a period whose end its
/// reply cannot tell, so its units could be neither spent nor given back. No lease is taken
/// within `guard_us` of the period's end, nor while the last reply did not know it.
#[derive(Debug, Clone, Copy)]
enum Lapse {
    Slots { emission_us: u64, tolerance_us: u64 },
    Close { guard_us: u64 },
}

/// How close to a calendar period's end a gateway stops leasing: a clock behind Redis's by
/// less than this never leases into a period it cannot name (a tenth of shorter periods).
const CALENDAR_GUARD: Duration = Duration::from_secs(2);

impl Lapse {
    fn of(algorithm: &Algorithm) -> Lapse {
        match *algorithm {
            Algorithm::Gcra {
                emission_us,
                tolerance_us,
                ..
            } => Lapse::Slots {
                emission_us: emission_us.max(1),
                tolerance_us,
            },
            Algorithm::Calendar { period, .. } => {
                let guard = as_micros(CALENDAR_GUARD);
                let guard_us = match period {
                    Period::Aligned { length_us } => guard.min(length_us / 10),
                    Period::Calendar(_) => guard,
                };
                Lapse::Close { guard_us }
            }
            _ => Lapse::Close { guard_us: 0 },
        }
    }

    /// The time between two held units' deadlines.
    fn spacing_us(self) -> u64 {
        match self {
            Lapse::Slots { emission_us, .. } => emission_us,
            Lapse::Close { .. } => 0,
        }
    }
}

/// The units a gateway holds of one key.
struct Holding {
    algorithm: Algorithm,
    lapse: Lapse,
    /// Units held, spent first to last; unit `i` is spendable while `now < lapse_at + i ×
    /// spacing` ([`Lapse`]).
    units: u64,
    lapse_at: Instant,
    /// GCRA: how many of the last units held sit just before the latest top-up's mark, one
    /// after another on the timeline: only they are given back (a return quotes that mark).
    /// A window's or period's units all count in it alike: every one held goes back.
    returnable: u64,
    /// The mark (`LimitStatus::mark_us`) of the latest top-up: a GCRA's TAT, a window's or
    /// period's end (0 while a calendar's reply could not tell it: nothing is leased then).
    mark_us: i64,
    /// What the limit had left at the backend's last answer.
    remaining: u64,
    /// Until when the key stood ahead at the last answer, on this gateway's clock and never later
    /// than the deciding clock's: GCRA, its TAT; fixed window and calendar, their end.
    until: Instant,
    topped_up_at: Instant,
    spent_since_top_up: u64,
    last_used: Instant,
    /// Since when a request has been asking the backend for more; others ask for their own
    /// cost only meanwhile. A request dropped mid-call never credits its top-up: after `TOP_UP_STALE` the
    /// top-up counts as abandoned.
    topping_up: Option<Instant>,
}

/// What a top-up asks for beyond its request's cost: `gap` units it skips (GCRA) and `held`
/// units it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LeaseSize {
    gap: u64,
    held: u64,
}

impl LeaseSize {
    const NONE: LeaseSize = LeaseSize { gap: 0, held: 0 };
}

/// A holding's front before a request took units from it: the first unit's deadline, the
/// top-up it came from, and how many of the units held were returnable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Front {
    lapse_at: Instant,
    mark_us: i64,
    returnable: u64,
}

/// Microseconds as a duration, and back (saturating).
fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

fn as_micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

impl Holding {
    fn new(algorithm: Algorithm, now: Instant) -> Holding {
        Holding {
            algorithm,
            lapse: Lapse::of(&algorithm),
            units: 0,
            lapse_at: now,
            returnable: 0,
            remaining: 0,
            until: now,
            mark_us: 0,
            topped_up_at: now,
            spent_since_top_up: 0,
            last_used: now,
            topping_up: Some(now),
        }
    }

    fn topping_up(&self, now: Instant) -> bool {
        self.topping_up
            .is_some_and(|since| now.duration_since(since) < TOP_UP_STALE)
    }

    /// Takes `count` units off the front (spent, or lapsed).
    fn take_front(&mut self, count: u64) {
        let count = count.min(self.units);
        self.units -= count;
        self.lapse_at += micros(self.lapse.spacing_us().saturating_mul(count));
        self.returnable = self.returnable.min(self.units);
    }

    /// Drops the units whose deadline has passed at `now`; returns how many.
    fn lapse(&mut self, now: Instant) -> u64 {
        if self.units == 0 || now < self.lapse_at {
            return 0;
        }
        let lapsed = match self.lapse.spacing_us() {
            0 => self.units,
            spacing => (as_micros(now - self.lapse_at) / spacing).saturating_add(1),
        };
        let lapsed = lapsed.min(self.units);
        self.take_front(lapsed);
        lapsed
    }

    /// Where the front stands before `cost` units are taken from it: what putting them back
    /// checks.
    fn front(&self) -> Front {
        Front {
            lapse_at: self.lapse_at,
            mark_us: self.mark_us,
            returnable: self.returnable,
        }
    }

    /// Puts back `cost` units taken from the front at `taken` (spent for a request denied after
    /// all, or whose call failed). Returns whether they went back into the holding:
    /// * A window's or period's units count in it alike: they go back while the holding holds
    ///   units of the same window (the same mark). Otherwise their window is no longer this
    ///   holding's: the caller gives them back to the backend, quoting their mark.
    /// * GCRA: every unit ever leased sits in its own emission slot, each at or after the
    ///   deadline it was held under, so the holding's front deadline moved back to the put-back
    ///   unit's keeps every unit's deadline at or before its own slot: they go back always. They
    ///   are returnable again only when nothing else was taken since (the tail is contiguous).
    fn put_back(&mut self, cost: u64, taken: Front) -> bool {
        match self.lapse {
            Lapse::Close { .. } if self.mark_us != taken.mark_us => false,
            Lapse::Close { .. } => {
                self.units += cost;
                true
            }
            Lapse::Slots { .. } => {
                let back = micros(self.lapse.spacing_us().saturating_mul(cost));
                let unmoved = self.mark_us == taken.mark_us
                    && taken.lapse_at.checked_add(back) == Some(self.lapse_at);
                if unmoved {
                    self.returnable = taken.returnable;
                }
                self.lapse_at = self.lapse_at.min(taken.lapse_at);
                self.units += cost;
                true
            }
        }
    }

    /// The units that go back to the backend when the key turns idle: a window's or period's
    /// all; a GCRA's contiguous tail before the mark (the others lapse where they are).
    fn returnable_now(&self) -> u64 {
        match self.lapse {
            Lapse::Close { .. } if self.mark_us > 0 => self.units,
            Lapse::Close { .. } => 0,
            Lapse::Slots { .. } => self.returnable.min(self.units),
        }
    }

    /// Units to take beyond `cost`, or none (the request is asked exactly).
    ///
    /// * As many as this gateway spends in `HORIZON` at the rate it has seen on the key since
    ///   its last top-up, within L minus what it holds, and within what the limit had left.
    /// * No more than it can spend before they lapse. A fixed window's or calendar's units
    ///   lapse when it closes. A GCRA unit lapses when its slot begins, `emission` after the one
    ///   before; a gateway spending slower than the limit's rate falls behind its slots, so the
    ///   units are placed after a `gap` of slots it skips, far enough ahead that the last one is
    ///   spent in time. The gap is at most a tenth of the tolerance (burst): it is capacity no
    ///   request uses until time reaches it, and what bounds a lease's size when the key is not
    ///   already ahead of now.
    /// * None at all below `leasing.min_units`.
    fn lease_size(&self, now: Instant, leasing: Leasing, cost: u64) -> LeaseSize {
        let elapsed = as_micros(now.duration_since(self.topped_up_at)).max(1_000);
        let rate = (self.spent_since_top_up + cost) as f64 / elapsed as f64; // units per us
        let ahead = as_micros(self.until.saturating_duration_since(now));
        let left = self.remaining.saturating_sub(cost);
        let mut held = ((rate * as_micros(HORIZON) as f64) as u64)
            .min(leasing.max_units.saturating_sub(self.units))
            .min(left);
        let mut gap = 0;
        match self.lapse {
            Lapse::Close { guard_us } if self.mark_us == 0 || ahead <= guard_us => {
                return LeaseSize::NONE;
            }
            Lapse::Close { .. } => held = held.min((rate * ahead as f64) as u64),
            Lapse::Slots {
                emission_us,
                tolerance_us,
            } => {
                // The j-th unit held is spent about j / rate from now, and its slot begins
                // about ahead + (cost + gap + j - 1) x emission from now, less the reply's rounding.
                let behind_per_unit = (1.0 / rate - emission_us as f64).max(0.0);
                let head_start =
                    ahead.saturating_add(cost.saturating_sub(1).saturating_mul(emission_us)) as f64;
                let budget = (tolerance_us / GAP_SHARE) as f64;
                if behind_per_unit > 0.0 {
                    held = held.min(((head_start + budget) / behind_per_unit) as u64);
                }
                let needed = held as f64 * behind_per_unit - head_start + REPLY_ROUNDING_US as f64;
                gap = (needed.max(0.0) / emission_us as f64).ceil() as u64;
                gap = gap.min((budget / emission_us as f64) as u64);
                held = held.min(left.saturating_sub(gap));
            }
        }
        if held < leasing.min_units.max(1) {
            return LeaseSize::NONE;
        }
        LeaseSize { gap, held }
    }

    /// What a request paid from the holding is told. A window's or period's unit carries the
    /// window's mark: an admitted request that does not go on gives it back there exactly
    /// (`Policy::give_back_abandoned`); a GCRA unit none (its slot is not the key's last).
    fn status(&self, now: Instant) -> LimitStatus {
        let mark_us = match self.lapse {
            Lapse::Close { .. } => self.mark_us,
            Lapse::Slots { .. } => 0,
        };
        LimitStatus {
            allowed: true,
            remaining: self.remaining + self.units,
            retry_after_ms: Some(0),
            reset_after_ms: self.until.saturating_duration_since(now).as_millis() as u64,
            delay_ms: 0,
            mark_us,
        }
    }

    /// Of `kept` units a top-up asked at `now` took, with the key `ahead_us` ahead and `mark_us`
    /// its mark: how many can still be spent, and the first one's deadline.
    fn usable(&self, kept: u64, ahead_us: u64, mark_us: i64, now: Instant) -> (u64, Instant) {
        match self.lapse {
            // A period whose end the reply does not know (a calendar on a gateway behind
            // Redis's clock) gives no deadline: nothing is kept.
            Lapse::Close { .. } if mark_us == 0 => (0, self.until),
            Lapse::Close { .. } => (kept, self.until),
            Lapse::Slots { emission_us, .. } => {
                // The kept units are the last `kept` the call took, just before the TAT: the
                // first one's slot begins kept x emission before it. Units whose slot had begun
                // by `now` are worth nothing.
                let span = kept.saturating_mul(emission_us);
                let late = span.saturating_sub(ahead_us).div_ceil(emission_us);
                let first = (ahead_us + late * emission_us).saturating_sub(span);
                (kept.saturating_sub(late), now + micros(first))
            }
        }
    }

    /// Records the backend's answer to a top-up asked at `now`: `kept` units more are held, the
    /// last ones it took. Returns how many units it could not keep (they lapse).
    fn credit(&mut self, kept: u64, cost: u64, status: &LimitStatus, now: Instant) -> u64 {
        self.topping_up = None;
        self.remaining = status.remaining;
        if !status.allowed {
            return 0;
        }
        let mut lapsed = 0;
        if matches!(self.lapse, Lapse::Close { .. }) && self.mark_us != status.mark_us {
            // Units still held from another window (period) are worth nothing in this one, which
            // the next units count in (a calendar period whose end the reply cannot tell: 0,
            // and nothing is leased until one does).
            lapsed += std::mem::take(&mut self.units);
            self.mark_us = status.mark_us;
        }
        // The deciding clock answered after `now`: a time ahead of it, read on this gateway's
        // clock from `now`, is never later than it really is.
        let ahead_us = status
            .reset_after_ms
            .saturating_mul(1000)
            .saturating_sub(REPLY_ROUNDING_US);
        self.until = now + micros(ahead_us);
        if matches!(self.lapse, Lapse::Close { .. }) && self.units == 0 {
            // A window's units are spendable until it closes: so are any put back into it.
            self.lapse_at = self.until;
        }
        self.topped_up_at = now;
        self.spent_since_top_up = cost;
        self.last_used = now;
        let (usable, first_deadline) = self.usable(kept, ahead_us, status.mark_us, now);
        lapsed += kept - usable;
        if usable == 0 {
            return lapsed;
        }
        self.lapse_at = match self.units {
            0 => first_deadline,
            // Units still held from before sit earlier on the timeline (or in the same
            // window): the deadlines of all, read from the front, never pass any unit's own.
            held => {
                let before = micros(self.lapse.spacing_us().saturating_mul(held));
                match first_deadline.checked_sub(before) {
                    Some(at) => self.lapse_at.min(at),
                    None => {
                        lapsed += held;
                        self.units = 0;
                        first_deadline
                    }
                }
            }
        };
        self.units += usable;
        self.returnable = usable;
        self.mark_us = status.mark_us;
        lapsed
    }
}

/// What one leased limit of a request does.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Paid from units held: the status to report, and where they were taken from.
    Held { status: LimitStatus, taken: Front },
    /// Asked of the backend: `cost + size.gap + size.held` units, of which `size.held` are kept
    /// if allowed.
    Ask { size: LeaseSize, topping_up: bool },
}

impl Step {
    /// Asked of the backend for its own cost only, no top-up.
    fn exact() -> Step {
        Step::Ask {
            size: LeaseSize::NONE,
            topping_up: false,
        }
    }
}

/// Units held per key: a concurrent map (`dashmap`), each key's holding changed under its shard's
/// lock; idle holdings are swept by the injected clock.
struct Holdings {
    holdings: KeyMap<Holding>,
    /// How many keys `holdings` has, kept beside it: counting the map would lock every shard
    /// on each new key (under `mode: auto`, every cold key is one).
    count: AtomicUsize,
    capacity: usize,
    meters: LeaseMeters,
}

impl Holdings {
    fn new(capacity: usize, meters: LeaseMeters) -> Holdings {
        Holdings {
            holdings: key_map(SHARDS),
            count: AtomicUsize::new(0),
            capacity: capacity.max(1),
            meters,
        }
    }

    /// Pays `cost` from the units held, or says what to ask the backend for.
    fn take(&self, limit: &Limit, leasing: Leasing, key: &[u8], cost: u64, now: Instant) -> Step {
        if let Some(mut holding) = self.holdings.get_mut(key) {
            return self.take_held(&mut holding, leasing, cost, now);
        }
        if self.count.load(Ordering::Relaxed) >= self.capacity {
            return Step::exact();
        }
        match self.holdings.entry(key.into()) {
            // Another request saw the key first, meanwhile.
            HoldingEntry::Occupied(mut holding) => {
                self.take_held(holding.get_mut(), leasing, cost, now)
            }
            HoldingEntry::Vacant(vacant) => {
                // No rate seen yet: the first request asks for its own cost and starts the clock.
                vacant.insert(Holding::new(limit.algorithm, now));
                self.count.fetch_add(1, Ordering::Relaxed);
                Step::Ask {
                    size: LeaseSize::NONE,
                    topping_up: true,
                }
            }
        }
    }

    /// Pays `cost` from `holding`, or says what to ask the backend for: a top-up, unless another
    /// request is topping the key up already (then its own cost only).
    fn take_held(&self, holding: &mut Holding, leasing: Leasing, cost: u64, now: Instant) -> Step {
        let lapsed = holding.lapse(now);
        if lapsed > 0 {
            self.meters.units_lapsed.inc_by(lapsed);
        }
        if holding.units >= cost {
            let taken = holding.front();
            holding.take_front(cost);
            holding.spent_since_top_up += cost;
            holding.last_used = now;
            self.meters.held_decisions.inc();
            return Step::Held {
                status: holding.status(now),
                taken,
            };
        }
        if holding.topping_up(now) {
            return Step::exact();
        }
        holding.topping_up = Some(now);
        Step::Ask {
            size: holding.lease_size(now, leasing, cost),
            topping_up: true,
        }
    }

    /// Records the backend's answer to a top-up asked at `now`: `kept` units more are held.
    fn credit_top_up(&self, key: &[u8], kept: u64, cost: u64, status: &LimitStatus, now: Instant) {
        if let Some(mut holding) = self.holdings.get_mut(key) {
            if kept > 0 && status.allowed {
                self.meters.top_ups.inc();
            }
            let lapsed = holding.credit(kept, cost, status, now);
            self.meters.units_lapsed.inc_by(lapsed);
        }
    }

    /// Puts back the units `entry` paid from the holding at `taken` for a request denied after
    /// all ([`Holding::put_back`]). A window's or period's units the holding cannot take back
    /// (it was swept meanwhile, or holds another window's) are returned to the backend
    /// instead, quoting their window: what the caller must settle. A GCRA's units with no
    /// holding left lapse in their slots.
    fn put_back(&self, entry: &Entry<'_>, taken: Front) -> Option<Unspent> {
        let cost = entry.cost;
        let back = self.holdings.get_mut(entry.key).is_some_and(|mut holding| {
            holding.spent_since_top_up = holding.spent_since_top_up.saturating_sub(cost);
            holding.put_back(cost, taken)
        });
        let countable = matches!(Lapse::of(&entry.limit.algorithm), Lapse::Close { .. });
        match (back, countable && taken.mark_us > 0) {
            (true, _) => None,
            (false, true) => Some(Unspent {
                algorithm: entry.limit.algorithm,
                key: entry.key.into(),
                units: cost,
                mark_us: taken.mark_us,
            }),
            (false, false) => {
                self.meters.units_lapsed.inc_by(cost);
                None
            }
        }
    }

    /// Ends a top-up that got no answer.
    fn abandon(&self, key: &[u8]) {
        if let Some(mut holding) = self.holdings.get_mut(key) {
            holding.topping_up = None;
        }
    }

    /// Drops lapsed units, and the holdings of idle keys; returns what to give back.
    fn sweep(&self, now: Instant) -> Vec<Unspent> {
        let mut refunds = Vec::new();
        let (mut lapsed, mut removed) = (0, 0);
        self.holdings.retain(|key, holding| {
            lapsed += holding.lapse(now);
            let idle = now.duration_since(holding.last_used) >= IDLE;
            if holding.topping_up(now) || !idle {
                return true;
            }
            // A GCRA's units held from before its latest top-up's tail lapse where they are.
            let returned = holding.returnable_now();
            if returned > 0 {
                refunds.push(Unspent {
                    algorithm: holding.algorithm,
                    key: key.clone(),
                    units: returned,
                    mark_us: holding.mark_us,
                });
            }
            lapsed += holding.units - returned;
            removed += 1;
            false
        });
        self.count.fetch_sub(removed, Ordering::Relaxed);
        self.meters.units_lapsed.inc_by(lapsed);
        refunds
    }

    fn held(&self) -> u64 {
        self.holdings.iter().map(|holding| holding.units).sum()
    }
}

/// A limiter that serves `mode: leased` limits from leases taken of `inner`; routes without
/// leased limits go straight to `inner`. Unspent units go back through `refunds`, the backend
/// itself.
pub struct Leased<L, S> {
    inner: L,
    refunds: Arc<S>,
    clock: Arc<dyn Clock>,
    holdings: Arc<Holdings>,
    sweeper: Once,
}

impl<L: Limiter, S: SettleUnits + 'static> Leased<L, S> {
    pub fn new(
        inner: L,
        refunds: Arc<S>,
        clock: Arc<dyn Clock>,
        meters: LeaseMeters,
    ) -> Leased<L, S> {
        Leased {
            inner,
            refunds,
            clock,
            holdings: Arc::new(Holdings::new(HOLDINGS_CAPACITY, meters)),
            sweeper: Once::new(),
        }
    }

    /// What decides beneath the leases.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// Units held unspent across all keys (tests and tools).
    pub fn held(&self) -> u64 {
        self.holdings.held()
    }

    /// Gives back the units of keys idle (or windows closed) at `now`.
    pub async fn return_idle_units(&self, now: Instant) {
        return_unspent(&self.holdings, self.refunds.as_ref(), now).await;
    }

    /// Never starts the sweeping task: idle units go back only when [`Leased::return_idle_units`]
    /// is called (tests drive the clock and the sweep by hand).
    pub fn swept_by_hand(self) -> Leased<L, S> {
        self.sweeper.call_once(|| {});
        self
    }

    /// Starts the task that gives back idle keys' units, inside the runtime serving requests.
    fn start_sweeper(&self) {
        self.sweeper.call_once(|| {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return;
            };
            let holdings = Arc::downgrade(&self.holdings);
            let refunds = Arc::downgrade(&self.refunds);
            let clock = Arc::clone(&self.clock);
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_EVERY);
                loop {
                    tick.tick().await;
                    let (Some(holdings), Some(refunds)) = (holdings.upgrade(), refunds.upgrade())
                    else {
                        break;
                    };
                    return_unspent(&holdings, refunds.as_ref(), clock.instant()).await;
                }
            });
        });
    }

    /// One backend call for the limits `plans` ask about: at what each wants (a top-up
    /// included), or `exactly` at its own cost.
    async fn ask(
        &self,
        request: &LimitRequest<'_>,
        plans: &Plans<'_, '_>,
        exactly: bool,
    ) -> Result<Decision, LimiterError> {
        let entries: Entries = plans
            .iter()
            .filter_map(|plan| {
                let Step::Ask { size, .. } = plan.step else {
                    return None;
                };
                let cost = if exactly {
                    plan.entry.cost
                } else {
                    plan.entry.cost + size.gap + size.held
                };
                Some(Entry {
                    cost,
                    ..*plan.entry
                })
            })
            .collect();
        self.inner
            .check(&LimitRequest {
                entries: &entries,
                ..*request
            })
            .await
    }

    /// Undoes what `plans` did to the holdings when the request got no answer; what goes back
    /// to the backend instead goes into `unspent`.
    fn unwind(&self, plans: &Plans<'_, '_>, unspent: &mut Vec<Unspent>) {
        for &Plan { entry, step } in plans {
            match step {
                Step::Held { taken, .. } => unspent.extend(self.holdings.put_back(entry, taken)),
                Step::Ask {
                    topping_up: true, ..
                } => self.holdings.abandon(entry.key),
                Step::Ask { .. } => {}
            }
        }
    }

    /// Gives `unspent` back to the backend now (units a denied request paid from a holding
    /// that could not take them back).
    async fn give_back(&self, unspent: Vec<Unspent>) {
        for units in unspent {
            settle_unspent(&self.holdings, self.refunds.as_ref(), units).await;
        }
    }
}

/// The places, among the asked plans (in order), of the leases `answer` denied.
fn denied_leases(plans: &Plans<'_, '_>, answer: &Decision) -> SmallVec<[usize; LIMITS_INLINE]> {
    let asked = plans.iter().filter_map(|plan| match plan.step {
        Step::Ask { size, .. } => Some(size != LeaseSize::NONE),
        Step::Held { .. } => None,
    });
    let denied = |place: usize| answer.statuses.get(place).is_some_and(|s| !s.allowed);
    asked
        .enumerate()
        .filter(|&(place, leasing)| leasing && denied(place))
        .map(|(place, _)| place)
        .collect()
}

/// Which of a call's asked limits keep the units their lease took, by their place among the
/// asked ones: none when the call was asked again exactly; all but those asked again when only
/// shadow limits denied their leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LeasesKept(u64);

impl LeasesKept {
    const ALL: LeasesKept = LeasesKept(u64::MAX);
    const NONE: LeasesKept = LeasesKept(0);

    fn stands(self, place: usize) -> bool {
        place < 64 && self.0 & (1 << place) != 0
    }

    fn without(self, place: usize) -> LeasesKept {
        match place < 64 {
            true => LeasesKept(self.0 & !(1 << place)),
            false => self,
        }
    }
}

/// A status for a step the code above never produces (the answer's length is checked first):
/// a denial that never retries, rather than a panic on the request path.
fn unreachable_status() -> LimitStatus {
    LimitStatus {
        allowed: false,
        remaining: 0,
        retry_after_ms: None,
        reset_after_ms: 0,
        delay_ms: 0,
        mark_us: 0,
    }
}

/// Units of one key to give back.
#[derive(Debug)]
struct Unspent {
    algorithm: Algorithm,
    key: Box<[u8]>,
    units: u64,
    mark_us: i64,
}

async fn return_unspent(holdings: &Holdings, refunds: &impl SettleUnits, now: Instant) {
    for unspent in holdings.sweep(now) {
        settle_unspent(holdings, refunds, unspent).await;
    }
    holdings
        .meters
        .units_held
        .set(i64::try_from(holdings.held()).unwrap_or(i64::MAX));
}

/// Returns `unspent` to the backend (`Change::Return`): counted returned where the key took
/// them back, lapsed where their mark no longer held or the backend could not be reached.
async fn settle_unspent(holdings: &Holdings, refunds: &impl SettleUnits, unspent: Unspent) {
    let Unspent {
        algorithm,
        key,
        units,
        mark_us,
    } = unspent;
    let settlement = Settlement {
        algorithm: &algorithm,
        key: &key,
        change: Change::Return { units, mark_us },
    };
    match refunds.settle(&[settlement]).await {
        Ok(0) => holdings.meters.units_lapsed.inc_by(units),
        Ok(_) => holdings.meters.units_returned.inc_by(units),
        Err(error) => {
            holdings.meters.units_lapsed.inc_by(units);
            log::debug!("could not give back {units} leased units: {error}");
        }
    }
}

impl<L: Limiter, S: SettleUnits + 'static> Limiter for Leased<L, S> {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        if request.entries.iter().all(|e| e.limit.leased.is_none()) {
            return self.inner.check(request).await;
        }
        self.start_sweeper();
        let now = self.clock.instant();
        let plans = self.plans(request, now);
        if plans
            .iter()
            .all(|plan| matches!(plan.step, Step::Held { .. }))
        {
            return Ok(held_decision(request, &plans));
        }
        let mut unspent = Vec::new();
        let answered = self.ask_backend(request, &plans, &mut unspent).await;
        // What answered the call (the backend, or the deny cache in front of it) and the batch
        // it rode answered the request: the merged decision says so, as the metrics and the
        // traces read it.
        let decided = answered.map(|(answer, kept)| {
            let statuses = self.merge(&plans, &answer, kept, now, &mut unspent);
            Decision {
                source: answer.source,
                batch: answer.batch,
                ..request.decision(statuses)
            }
        });
        if !unspent.is_empty() {
            self.give_back(unspent).await;
        }
        decided
    }

    fn held_units(&self, key: &[u8]) -> u64 {
        let now = self.clock.instant();
        self.holdings
            .holdings
            .get_mut(key)
            .map_or(0, |mut holding| {
                holding.lapse(now);
                holding.units
            })
    }
}

/// One limit of a request and what the leases do for it.
#[derive(Clone, Copy)]
struct Plan<'r, 'e> {
    entry: &'r Entry<'e>,
    step: Step,
}

/// What each limit of a request does, in the request's order.
type Plans<'r, 'e> = SmallVec<[Plan<'r, 'e>; LIMITS_INLINE]>;

/// The decision of a request paid entirely from units held.
fn held_decision(request: &LimitRequest<'_>, plans: &Plans<'_, '_>) -> Decision {
    let statuses = plans.iter().map(|plan| match plan.step {
        Step::Held { status, .. } => status,
        Step::Ask { .. } => unreachable_status(),
    });
    Decision {
        source: Source::Leases,
        batch: 0,
        ..request.decision(statuses.collect::<Statuses>())
    }
}

impl<L: Limiter, S: SettleUnits + 'static> Leased<L, S> {
    /// Pays each leased limit from the units held, or says what to ask for it.
    fn plans<'r, 'e>(&self, request: &LimitRequest<'e>, now: Instant) -> Plans<'r, 'e>
    where
        'e: 'r,
    {
        request
            .entries
            .iter()
            .map(|entry| Plan {
                entry,
                step: match entry.limit.leased {
                    Some(leasing) => {
                        self.holdings
                            .take(entry.limit, leasing, entry.key, entry.cost, now)
                    }
                    None => Step::exact(),
                },
            })
            .collect()
    }

    /// Asks the backend for what `asked` wants; a denied top-up is asked again, exactly. The
    /// answer, and whether it took more than the costs (units to keep). Unwinds the holdings when
    /// there is no usable answer.
    async fn ask_backend(
        &self,
        request: &LimitRequest<'_>,
        plans: &Plans<'_, '_>,
        unspent: &mut Vec<Unspent>,
    ) -> Result<(Decision, LeasesKept), LimiterError> {
        let mut answer = self.ask(request, plans, false).await;
        let leasing = plans
            .iter()
            .any(|plan| matches!(plan.step, Step::Ask { size, .. } if size != LeaseSize::NONE));
        let mut kept = match leasing {
            true => LeasesKept::ALL,
            false => LeasesKept::NONE,
        };
        match &mut answer {
            // A denied call wrote nothing: ask once more, exactly, so a request is never denied
            // for units it did not need.
            Ok(d) if leasing && !d.allowed() => {
                answer = self.ask(request, plans, true).await;
                kept = LeasesKept::NONE;
            }
            // Allowed, but a shadow limit denied its lease: the call wrote every other limit
            // (asking all again would charge them twice) and nothing of that one, which is asked
            // again alone, at its own cost.
            Ok(d) if leasing => {
                for place in denied_leases(plans, d) {
                    self.ask_alone(request, plans, place, d).await;
                    kept = kept.without(place);
                }
            }
            _ => {}
        }
        let asked = plans
            .iter()
            .filter(|plan| matches!(plan.step, Step::Ask { .. }))
            .count();
        let answer = answer.and_then(|answer| {
            if answer.statuses.len() == asked {
                return Ok(answer);
            }
            Err(LimiterError::Reply(format!(
                "{} statuses for {asked} limits",
                answer.statuses.len(),
            )))
        });
        if answer.is_err() {
            self.unwind(plans, unspent);
        }
        answer.map(|answer| (answer, kept))
    }

    /// Asks the limit at `place` among the asked plans again, alone and at its own cost, and
    /// writes its answer into `answer` (unless the backend could not decide: then it stands
    /// denied, having consumed nothing).
    async fn ask_alone(
        &self,
        request: &LimitRequest<'_>,
        plans: &Plans<'_, '_>,
        place: usize,
        answer: &mut Decision,
    ) {
        let asked = plans
            .iter()
            .filter(|plan| matches!(plan.step, Step::Ask { .. }));
        let Some(plan) = asked.clone().nth(place) else {
            return;
        };
        let alone = [*plan.entry];
        let decided = self
            .inner
            .check(&LimitRequest {
                entries: &alone,
                ..*request
            })
            .await;
        if let (Ok(decided), Some(status)) = (decided, answer.statuses.get_mut(place)) {
            if let Some(&fresh) = decided.statuses.first() {
                *status = fresh;
            }
        }
    }

    /// Every limit's status: held ones as paid (their units put back if the request is denied
    /// after all; those the holding cannot take back go into `unspent`), asked ones as the
    /// backend answered, with the units a top-up kept.
    fn merge(
        &self,
        plans: &Plans<'_, '_>,
        answer: &Decision,
        leases: LeasesKept,
        now: Instant,
        unspent: &mut Vec<Unspent>,
    ) -> Statuses {
        let allowed = answer.allowed();
        // The asked limits' statuses, in order (one per asked limit: checked by ask_backend),
        // each with its place among them.
        let mut answered = answer.statuses.iter().enumerate();
        let mut statuses = Statuses::new();
        for &Plan { entry, step } in plans {
            let status = match step {
                Step::Held { status, taken } => {
                    if !allowed {
                        unspent.extend(self.holdings.put_back(entry, taken));
                    }
                    status
                }
                Step::Ask { size, topping_up } => match answered.next() {
                    Some((place, status)) => {
                        // A shadow limit that denied consumed nothing, even in an allowed request.
                        let kept = if allowed && leases.stands(place) && status.allowed {
                            size.held
                        } else {
                            0
                        };
                        if topping_up {
                            // A denied request wrote nothing: no limit's status tells a mark.
                            let credited = LimitStatus {
                                allowed: allowed && status.allowed,
                                ..*status
                            };
                            self.holdings
                                .credit_top_up(entry.key, kept, entry.cost, &credited, now);
                        }
                        LimitStatus {
                            remaining: status.remaining + kept,
                            ..*status
                        }
                    }
                    None => unreachable_status(),
                },
            };
            statuses.push(status);
        }
        statuses
    }
}

#[doc(hidden)]
pub mod simulation;

#[cfg(test)]
mod tests {
    mod allowance;
    mod props;

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::limiter::clock::ManualClock;
    use crate::limiter::limit::AUTO_MIN_UNITS;
    use crate::limiter::local::LocalLimiter;
    use crate::limiter::request::entries;
    use crate::limiter::testing::{asks, gcra, limit, window};

    /// The in-process backend, counting the checks that reach it.
    struct Counting {
        backend: Arc<LocalLimiter>,
        checks: AtomicUsize,
    }

    impl Limiter for Counting {
        async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
            self.checks.fetch_add(1, Ordering::Relaxed);
            self.backend.check(request).await
        }
    }

    /// The backend's answers, marked as a shortcut in front of it marks its own (`Guarded`'s
    /// deny cache), each as having ridden a batch of three.
    struct Marked(Arc<Counting>, Source);

    impl Limiter for Marked {
        async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
            let decision = self.0.check(request).await?;
            Ok(Decision {
                source: self.1,
                batch: 3,
                ..decision
            })
        }
    }

    #[tokio::test]
    async fn a_merged_decision_says_what_answered_the_call_and_the_batch_it_rode() {
        let backend = backend();
        let clock = Arc::new(ManualClock::new(0));
        let marked = Marked(backend.clone(), Source::DenyCache);
        let meters = LeaseMeters::unregistered();
        let gateway = Leased::new(marked, backend.backend.clone(), clock, meters).swept_by_hand();
        let limits = leased(window(1000), 100);
        let mut said = Vec::new();
        for _ in 0..20 {
            let decision = call(&gateway, &limits, 1).await;
            assert!(decision.allowed());
            said.push((decision.source, decision.batch));
        }
        let asked = (Source::DenyCache, 3);
        let held = (Source::Leases, 0);
        assert_eq!(said[0], asked, "the first asks the backend");
        assert!(said.contains(&held), "later ones are paid from units held");
        assert!(said.iter().all(|s| *s == asked || *s == held), "{said:?}");
    }

    /// A backend whose clock stands still (no refill), and its checks counted.
    fn backend() -> Arc<Counting> {
        Arc::new(Counting {
            backend: Arc::new(LocalLimiter::new(Arc::new(ManualClock::new(0)), 1000)),
            checks: AtomicUsize::new(0),
        })
    }

    /// A gateway leasing from `backend`, giving units back to it, on its own clock; idle units
    /// go back only when the test sweeps.
    fn gateway(
        backend: &Arc<Counting>,
        clock: &Arc<ManualClock>,
    ) -> Leased<Arc<Counting>, LocalLimiter> {
        Leased::new(
            backend.clone(),
            backend.backend.clone(),
            clock.clone(),
            LeaseMeters::unregistered(),
        )
        .swept_by_hand()
    }

    fn leased(algorithm: Algorithm, max_units: u64) -> [Limit; 1] {
        leased_at_least(algorithm, max_units, 1)
    }

    /// A limit leased in leases of at most `max_units` and at least `min_units`.
    fn leased_at_least(algorithm: Algorithm, max_units: u64, min_units: u64) -> [Limit; 1] {
        let mut limit = limit("hot", algorithm);
        limit.leased = Some(Leasing {
            max_units,
            min_units,
        });
        [limit]
    }

    const KEY: &[u8] = b"hot";

    async fn call_keys(
        limiter: &impl Limiter,
        limits: &[Limit],
        keys: &[&[u8]],
        costs: &[u64],
    ) -> Decision {
        let asks = asks(keys, costs);
        let entries = entries(limits, &asks);
        limiter
            .check(&LimitRequest::new(&entries))
            .await
            .expect("decided")
    }

    async fn call(limiter: &impl Limiter, limits: &[Limit], cost: u64) -> Decision {
        call_keys(limiter, limits, &[KEY], &[cost]).await
    }

    /// What the backend has left of the key (a cost-0 peek, not counted as a gateway check).
    async fn left(backend: &Counting, limits: &[Limit]) -> u64 {
        call(backend.backend.as_ref(), limits, 0).await.statuses[0].remaining
    }

    #[tokio::test]
    async fn a_hot_key_is_served_from_leases_with_few_backend_calls() {
        let backend = backend();
        let clock = Arc::new(ManualClock::new(0));
        let gateway = gateway(&backend, &clock);
        let limits = leased(window(1000), 100);
        for _ in 0..200 {
            assert!(call(&gateway, &limits, 1).await.allowed());
        }
        let checks = backend.checks.load(Ordering::Relaxed);
        assert!(checks <= 6, "{checks} backend checks for 200 requests");
        // Everything admitted or held was counted by the backend, nothing more.
        assert_eq!(1000 - left(&backend, &limits).await, 200 + gateway.held());
        assert!(gateway.held() <= 100);
    }

    #[tokio::test]
    async fn two_gateways_never_admit_more_than_the_limit_and_idle_units_go_back() {
        let backend = backend();
        let clock = Arc::new(ManualClock::new(0));
        let (a, b) = (gateway(&backend, &clock), gateway(&backend, &clock));
        let limits = leased(window(100), 10);
        let mut admitted = 0;
        for i in 0..300 {
            let gateway = if i % 2 == 0 { &a } else { &b };
            admitted += usize::from(call(gateway, &limits, 1).await.allowed());
        }
        let held = a.held() + b.held();
        assert!(held <= 20, "each gateway holds at most L = 10, held {held}");
        assert_eq!(
            admitted as u64 + held,
            100,
            "admitted {admitted}, held {held}"
        );
        clock.advance_by(Duration::from_secs(1));
        a.return_idle_units(clock.instant()).await;
        b.return_idle_units(clock.instant()).await;
        assert_eq!((a.held(), b.held()), (0, 0));
        assert_eq!(left(&backend, &limits).await, held);
        for _ in 0..held + 5 {
            admitted += usize::from(call(&a, &limits, 1).await.allowed());
        }
        assert_eq!(admitted, 100, "the units given back are admitted, no more");
    }

    #[tokio::test]
    async fn a_denied_top_up_is_asked_again_for_the_exact_cost() {
        let backend = backend();
        let clock = Arc::new(ManualClock::new(0));
        let gateway = gateway(&backend, &clock);
        let limits = leased(window(100), 50);
        // The first request starts the clock; the second leases 50 more.
        for _ in 0..2 {
            assert!(call(&gateway, &limits, 1).await.allowed());
        }
        assert_eq!(gateway.held(), 50);
        for _ in 0..50 {
            assert!(call(&gateway, &limits, 1).await.allowed());
        }
        // Another gateway takes all but one unit; this one still believes 48 are left.
        assert!(call(backend.as_ref(), &limits[..], 47).await.allowed());
        let checks = backend.checks.load(Ordering::Relaxed);
        assert!(
            call(&gateway, &limits, 1).await.allowed(),
            "1 unit was left"
        );
        assert_eq!(backend.checks.load(Ordering::Relaxed), checks + 2);
        let denied = call(&gateway, &limits, 1).await;
        assert!(!denied.allowed());
        assert!(denied.retry().after_ms().is_some());
    }

    #[tokio::test]
    async fn units_paid_from_a_lease_are_put_back_when_another_limit_denies() {
        let backend = backend();
        let clock = Arc::new(ManualClock::new(0));
        let gateway = gateway(&backend, &clock);
        let [hot] = leased(window(100), 10);
        let strict = limit("strict", window(3));
        let limits = [hot, strict];
        let mut admitted = 0;
        for _ in 0..10 {
            let decision = call_keys(&gateway, &limits, &[KEY, b"strict"], &[1, 1]).await;
            admitted += usize::from(decision.allowed());
        }
        assert_eq!(admitted, 3);
        let held = gateway.held();
        assert_eq!(100 - left(&backend, &limits[..1]).await, 3 + held);
    }

    /// Issue 50: a monthly quota (leased under `mode: auto`) beside a per-second burst limit
    /// (decided exactly) that refuses the rest of each burst. Five bursts of 12, 1.5 s apart:
    /// 30 served, and the quota charged exactly 30 once idle units are back: no unit a refused
    /// request paid from the lease is lost.
    #[tokio::test]
    async fn a_quota_beside_a_burst_limit_is_charged_exactly_what_was_served() {
        let month = Period::Aligned {
            length_us: 30 * 86_400_000_000,
        };
        let quotas = [
            window(1000),
            Algorithm::Calendar {
                limit: 1000,
                period: month,
            },
        ];
        for quota in quotas {
            let clock = Arc::new(ManualClock::new(1_000_000_000_000));
            let backend = Arc::new(LocalLimiter::new(clock.clone(), 1000));
            let meters = LeaseMeters::unregistered();
            let gateway = Leased::new(backend.clone(), backend.clone(), clock.clone(), meters)
                .swept_by_hand();
            let [monthly] = leased_at_least(quota, 100, AUTO_MIN_UNITS);
            let limits = [monthly, limit("per_second", gcra(5, 5))];
            let mut served = 0;
            for _ in 0..5 {
                for _ in 0..12 {
                    clock.advance(1_000);
                    let decision = call_keys(&gateway, &limits, &[KEY, b"burst"], &[1, 1]).await;
                    served += u64::from(decision.allowed());
                }
                clock.advance(1_500_000);
                gateway.return_idle_units(clock.instant()).await;
            }
            let meters = &gateway.holdings.meters;
            assert!(meters.top_ups.get() > 0, "{quota:?}: the quota was leased");
            assert_eq!(served, 30, "{quota:?}");
            assert_eq!(gateway.held(), 0);
            let left = call(backend.as_ref(), &limits[..1], 0).await.statuses[0].remaining;
            assert_eq!(1000 - left, served, "{quota:?}: charged what was served");
            assert_eq!(meters.units_lapsed.get(), 0, "{quota:?}");
        }
    }

    #[tokio::test]
    async fn a_shadow_limit_that_denies_a_top_up_keeps_nothing() {
        let backend = backend();
        let clock = Arc::new(ManualClock::new(0));
        let gateway = gateway(&backend, &clock);
        let mut limits = leased(window(10), 5);
        limits[0].shadow = true;
        for _ in 0..2 {
            assert!(call(&gateway, &limits, 1).await.allowed());
        }
        assert_eq!(gateway.held(), 5);
        // Another gateway takes what is left; this one spends what it holds, then asks again.
        assert!(call(backend.as_ref(), &limits[..], 3).await.allowed());
        for _ in 0..5 {
            assert!(call(&gateway, &limits, 1).await.allowed());
        }
        let shadowed = call(&gateway, &limits, 1).await;
        assert!(shadowed.allowed(), "a shadow limit never denies");
        assert_eq!(shadowed.shadow_denied_by, Some(0));
        assert_eq!(
            shadowed.statuses[0].remaining, 0,
            "and reports nothing left"
        );
        assert_eq!(gateway.held(), 0, "the denied lease left nothing in hand");
        assert_eq!(left(&backend, &limits).await, 0);
    }

    #[tokio::test]
    async fn a_shadow_limit_that_denies_a_top_up_decides_the_request_exactly() {
        let backend = backend();
        let clock = Arc::new(ManualClock::new(0));
        let gateway = gateway(&backend, &clock);
        let mut limits = leased(window(20), 5);
        limits[0].shadow = true;
        for _ in 0..7 {
            assert!(call(&gateway, &limits, 1).await.allowed());
        }
        // Another gateway takes all but one unit; this one's next top-up asks for more than
        // that, is denied, and its request is asked again at its own cost: allowed.
        let left_now = left(&backend, &limits).await;
        assert!(call(backend.as_ref(), &limits[..], left_now - 1)
            .await
            .allowed());
        let checks = backend.checks.load(Ordering::Relaxed);
        let decided = call(&gateway, &limits, 1).await;
        assert_eq!(backend.checks.load(Ordering::Relaxed), checks + 2);
        assert_eq!(decided.shadow_denied_by, None, "the exact cost fitted");
        assert_eq!(left(&backend, &limits).await, 0);
    }

    #[test]
    fn a_top_up_dropped_with_its_request_is_abandoned_after_a_while() {
        let holdings = Holdings::new(10, LeaseMeters::unregistered());
        let [limit] = leased(window(100), 10);
        let leasing = limit.leased.expect("leased");
        let t0 = ManualClock::new(0).instant();
        let asks = |at: Instant| match holdings.take(&limit, leasing, KEY, 1, at) {
            Step::Ask { topping_up, .. } => topping_up,
            Step::Held { .. } => panic!("nothing is held"),
        };
        assert!(asks(t0), "the first request starts a top-up");
        // Its request is dropped before the answer: nobody credits it.
        assert!(
            !asks(t0 + Duration::from_secs(1)),
            "meanwhile others ask exactly"
        );
        assert!(asks(t0 + TOP_UP_STALE), "then the key tops up again");
    }

    /// A top-up's answer, allowed: `left` remaining, the key ahead for `ahead_ms`, `mark`.
    fn answer(left: u64, ahead_ms: u64, mark_us: i64) -> LimitStatus {
        LimitStatus {
            allowed: true,
            remaining: left,
            retry_after_ms: Some(0),
            reset_after_ms: ahead_ms,
            delay_ms: 0,
            mark_us,
        }
    }

    fn taken(step: Step) -> Front {
        match step {
            Step::Held { taken, .. } => taken,
            Step::Ask { .. } => panic!("paid from the holding"),
        }
    }

    /// The entry of one unit of `limit` on `KEY`.
    fn one<'a>(limit: &'a Limit) -> Entry<'a> {
        Entry {
            limit,
            key: KEY,
            cost: 1,
        }
    }

    #[test]
    fn a_windows_unit_put_back_goes_back_to_its_window_wherever_that_is() {
        let t0 = ManualClock::new(0).instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let holdings = Holdings::new(10, LeaseMeters::unregistered());
        let [limit] = leased(window(100), 10);
        let leasing = limit.leased.expect("leased");
        holdings.take(&limit, leasing, KEY, 1, t0);
        holdings.credit_top_up(KEY, 3, 1, &answer(90, 1000, 1_000_000), t0);
        // A takes a unit, B another; A's goes back all the same: a window's units are alike.
        let a = taken(holdings.take(&limit, leasing, KEY, 1, ms(1)));
        taken(holdings.take(&limit, leasing, KEY, 1, ms(1)));
        assert!(holdings.put_back(&one(&limit), a).is_none());
        assert_eq!(holdings.held(), 2);
        // C takes a unit; the window closes and D tops up in the next before C's request is
        // denied: C's unit counted in the old window, where it is given back (if still open).
        let c = taken(holdings.take(&limit, leasing, KEY, 1, ms(2)));
        assert!(matches!(
            holdings.take(&limit, leasing, KEY, 1, ms(1500)),
            Step::Ask { .. }
        ));
        holdings.credit_top_up(KEY, 3, 1, &answer(90, 1000, 2_500_000), ms(1500));
        let unspent = holdings
            .put_back(&one(&limit), c)
            .expect("given back to the backend");
        assert_eq!((unspent.units, unspent.mark_us), (1, 1_000_000));
        assert_eq!(holdings.held(), 3, "the next window's 3, not C's");
        assert_eq!(
            holdings.meters.units_lapsed.get(),
            1,
            "the old window's one"
        );
        // Swept while a request holds a unit: the unit goes back to the backend.
        let e = taken(holdings.take(&limit, leasing, KEY, 1, ms(1600)));
        let returned = holdings.sweep(ms(2000));
        assert_eq!(
            returned.iter().map(|u| u.units).sum::<u64>(),
            2,
            "every unit held"
        );
        let unspent = holdings.put_back(&one(&limit), e).expect("no holding left");
        assert_eq!((unspent.units, unspent.mark_us), (1, 2_500_000));
    }

    #[test]
    fn a_windows_unit_put_back_into_a_holding_made_meanwhile_is_spendable_until_it_closes() {
        let t0 = ManualClock::new(0).instant();
        let ms = |n| t0 + Duration::from_millis(n);
        let holdings = Holdings::new(10, LeaseMeters::unregistered());
        let [limit] = leased(window(100), 10);
        let leasing = limit.leased.expect("leased");
        holdings.take(&limit, leasing, KEY, 1, t0);
        holdings.credit_top_up(KEY, 3, 1, &answer(90, 60_000, 60_000_000), t0);
        // A takes a unit and waits on its other limits; the idle holding is swept meanwhile.
        let a = taken(holdings.take(&limit, leasing, KEY, 1, ms(1)));
        holdings.sweep(ms(300));
        // B finds no holding: a new one, asked exactly, nothing kept, in the same window.
        holdings.take(&limit, leasing, KEY, 1, ms(400));
        holdings.credit_top_up(KEY, 0, 1, &answer(80, 59_000, 60_000_000), ms(400));
        // A is denied: its unit goes into B's holding, spendable until the window closes.
        assert!(holdings.put_back(&one(&limit), a).is_none());
        let mut holding = holdings.holdings.get_mut(KEY).expect("held");
        assert_eq!(holding.lapse(ms(500)), 0, "not lapsed at once");
        assert_eq!(holding.units, 1);
    }

    #[test]
    fn a_gcra_unit_put_back_keeps_every_deadline_at_or_before_its_slot() {
        let t0 = ManualClock::new(0).instant();
        let holdings = Holdings::new(10, LeaseMeters::unregistered());
        let [limit] = leased(gcra(10, 99), 10);
        let leasing = limit.leased.expect("leased");
        holdings.take(&limit, leasing, KEY, 1, t0);
        holdings.credit_top_up(KEY, 5, 1, &answer(90, 5_000, 6_000_000), t0);
        // A takes the first unit and is denied at once: back as it was, returnable again.
        let a = taken(holdings.take(&limit, leasing, KEY, 1, t0));
        assert!(holdings.put_back(&one(&limit), a).is_none());
        let holding = holdings.holdings.get(KEY).expect("held");
        assert_eq!((holding.units, holding.returnable), (5, 5));
        assert_eq!(holding.lapse_at, a.lapse_at);
        drop(holding);
        // A takes the first unit, B the second; A's goes back, its deadline first, but B's slot
        // now sits between it and the tail: only the tail goes back when idle.
        let a = taken(holdings.take(&limit, leasing, KEY, 1, t0));
        let b = taken(holdings.take(&limit, leasing, KEY, 1, t0));
        assert!(holdings.put_back(&one(&limit), a).is_none());
        let holding = holdings.holdings.get(KEY).expect("held");
        assert_eq!((holding.units, holding.returnable), (4, 3));
        assert_eq!(holding.lapse_at, a.lapse_at);
        assert!(holding.lapse_at < b.lapse_at);
        drop(holding);
        let returned = holdings.sweep(t0 + IDLE);
        assert_eq!(returned.iter().map(|u| u.units).sum::<u64>(), 3);
        assert_eq!(
            holdings.meters.units_lapsed.get(),
            1,
            "A's, behind B's slot"
        );
    }

    #[test]
    fn a_calendar_leases_nothing_near_its_periods_end_nor_when_a_reply_cannot_tell_it() {
        let t0 = ManualClock::new(0).instant();
        let period = Period::Aligned {
            length_us: 60_000_000,
        };
        let [limit] = leased(
            Algorithm::Calendar {
                limit: 1000,
                period,
            },
            100,
        );
        let leasing = limit.leased.expect("leased");
        let holdings = Holdings::new(10, LeaseMeters::unregistered());
        let size = |ahead_ms: u64, mark_us: i64| {
            let holding = Holdings::new(10, LeaseMeters::unregistered());
            holding.take(&limit, leasing, KEY, 1, t0);
            holding.credit_top_up(KEY, 0, 1, &answer(900, ahead_ms, mark_us), t0);
            let mut held = holding.holdings.get_mut(KEY).expect("held");
            held.spent_since_top_up = 500;
            held.lease_size(t0 + Duration::from_millis(100), leasing, 1)
        };
        assert_ne!(size(30_000, 60_000_000), LeaseSize::NONE, "mid-period");
        assert_eq!(size(1_500, 60_000_000), LeaseSize::NONE, "within the guard");
        assert_eq!(
            size(30_000, 0),
            LeaseSize::NONE,
            "an end the reply did not know"
        );
        drop(holdings);
    }

    /// A GCRA emitting a unit every 100 us, with a burst of 10.
    const GCRA_100US: Algorithm = Algorithm::Gcra {
        emission_us: 100,
        tolerance_us: 1000,
        max_delay_us: 0,
    };

    #[test]
    fn refunds_move_a_gcra_back_and_a_window_count_down_while_it_is_open() {
        use crate::limiter::algorithm::{Settled, State, Write};
        let gcra = GCRA_100US;
        let tat = State::Gcra { tat_us: 1500 };
        assert_eq!(
            gcra.refund(Some(&tat), 1000, 2, 1500),
            Settled::Store(Write {
                state: State::Gcra { tat_us: 1300 },
                ttl_us: 300
            })
        );
        assert_eq!(gcra.refund(Some(&tat), 1000, 5, 1500), Settled::Clear);
        assert_eq!(gcra.refund(None, 1000, 5, 1500), Settled::Unchanged);
        let open = State::Window {
            end_us: 2000,
            count: 3,
        };
        let w = window(10);
        assert_eq!(
            w.refund(Some(&open), 1000, 5, 2000),
            Settled::Store(Write {
                state: State::Window {
                    end_us: 2000,
                    count: 0
                },
                ttl_us: 1000
            })
        );
        assert_eq!(w.refund(Some(&open), 2000, 1, 2000), Settled::Unchanged);
    }

    #[test]
    fn a_refund_never_gives_back_what_another_gateway_consumed_since() {
        use crate::limiter::algorithm::{Settled, State, Write};
        let gcra = GCRA_100US;
        // A took 5 units up to TAT 1500 (its mark); the bucket drained to 1400 by now, and B
        // consumed 3 units since: TAT 1700. A gives its 5 back: only the 100 us of them time
        // has not drained go back, B's 300 us stay.
        let tat = State::Gcra { tat_us: 1700 };
        assert_eq!(
            gcra.refund(Some(&tat), 1400, 5, 1500),
            Settled::Store(Write {
                state: State::Gcra { tat_us: 1600 },
                ttl_us: 200
            })
        );
        // Past A's mark, nothing of A's units is left to give back.
        assert_eq!(gcra.refund(Some(&tat), 1500, 5, 1500), Settled::Unchanged);
        // A window counted in another window than A's units: nothing to give back.
        let later = State::Window {
            end_us: 4000,
            count: 2,
        };
        assert_eq!(
            window(10).refund(Some(&later), 2500, 5, 2000),
            Settled::Unchanged
        );
    }
}
