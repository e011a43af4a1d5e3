//! Leased quotas (`mode: leased`): a gateway takes up to L units of a hot limit from the backend
//! in one call, spends them locally, and gives back what it did not spend once the key is idle.
//!
//! * A lease is taken by asking for `cost + extra` units in the same atomic check as the route's
//!   other limits. `extra` is sized from this gateway's observed rate on the key (enough for
//!   `HORIZON` of its traffic), never more than L minus what it already holds, and never more than
//!   the limit had left at the last answer, so near exhaustion leasing turns exact.
//! * Units held are spent without calling the backend. While one request tops a key up, others
//!   that find it empty ask for their own cost only, so a gateway never holds more than L unspent
//!   units of a key: N gateways admit at most `limit + N × L` in any window.
//! * Unspent units are given back (`SettleUnits::settle`) once a key has been idle for `IDLE`,
//!   quoting the mark of the oldest top-up whose units are still held: the script then gives
//!   back only what time has not drained of them (GCRA), and nothing once their window has been
//!   replaced (fixed window), so a refund never undoes what another gateway consumed meanwhile.
//!   A fixed window's units are worthless once their window has closed: they are dropped.
//! * What a gateway holds of each key is its **holding**; all of them, its `Holdings` (not to be
//!   confused with upstream `pool::Pool`). A top-up's answer is credited to the holding
//!   (`credit_top_up`); a settlement is only what goes to the backend.
//! * A denied top-up is asked again once with the exact costs: a request is never denied for
//!   units it did not need.

use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use dashmap::mapref::entry::Entry as HoldingEntry;
use prometheus::{IntCounter, IntGauge};
use smallvec::SmallVec;

use super::algorithm::{Algorithm, Change};
use super::backend::{Limiter, SettleUnits, Settlement};
use super::clock::Clock;
use super::decision::{Decision, Source, Statuses};
use super::error::LimiterError;
use super::key::{key_map, KeyMap};
use super::limit::{Leasing, Limit, LIMITS_INLINE};
use super::request::{Entries, Entry, LimitRequest};
use super::status::LimitStatus;

/// What leasing counts.
#[derive(Clone)]
pub struct LeaseMeters {
    /// Decisions paid from units held, without a backend call.
    pub held_decisions: IntCounter,
    /// Calls that took units beyond the request's own cost.
    pub top_ups: IntCounter,
    /// Units given back unspent.
    pub units_returned: IntCounter,
    /// Units held unspent, over all keys.
    pub units_held: IntGauge,
}

impl LeaseMeters {
    /// Handles registered nowhere (tests and tools).
    pub fn unregistered() -> LeaseMeters {
        let counter = |name| IntCounter::new(name, "unregistered").expect("a valid counter");
        LeaseMeters {
            held_decisions: counter("held_decisions"),
            top_ups: counter("top_ups"),
            units_returned: counter("units_returned"),
            units_held: IntGauge::new("units_held", "unregistered").expect("a valid gauge"),
        }
    }
}

/// Shards of the holdings' map: bounds what counting it (`len`, on a key's first sighting) locks.
const SHARDS: usize = 16;
/// Keys a gateway holds leases for at most (give or take one per request seeing a new key at
/// the same time); beyond it, further keys are decided exactly.
pub const HOLDINGS_CAPACITY: usize = 10_000;
/// A lease is sized to last this long at the rate this gateway has seen on the key.
const HORIZON: Duration = Duration::from_millis(100);
/// Unspent units of a key nobody has asked for in this long are given back.
pub const IDLE: Duration = Duration::from_millis(250);
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Longer than a top-up and its exact retry can take (two calls of at most the 10 s deadline):
/// a top-up this old was dropped with its request.
const TOP_UP_STALE: Duration = Duration::from_secs(30);

/// The units a gateway holds of one key.
struct Holding {
    algorithm: Algorithm,
    units: u64,
    /// What the limit had left at the backend's last answer.
    remaining: u64,
    reset_at: Instant,
    /// Fixed window: when the window the units were taken in closes.
    closes_at: Option<Instant>,
    /// The mark (`LimitStatus::mark_us`) of the oldest top-up whose units are still held: what
    /// a refund of them quotes.
    mark_us: i64,
    topped_up_at: Instant,
    spent_since_top_up: u64,
    last_used: Instant,
    /// Since when a request has been asking the backend for more; others ask for their own
    /// cost only meanwhile. A request dropped mid-call never credits its top-up: after `TOP_UP_STALE` the
    /// top-up counts as abandoned.
    topping_up: Option<Instant>,
}

impl Holding {
    fn new(algorithm: Algorithm, now: Instant) -> Holding {
        Holding {
            algorithm,
            units: 0,
            remaining: 0,
            reset_at: now,
            closes_at: None,
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

    /// Units to take beyond `cost`: the rate seen since the last top-up over `HORIZON`.
    fn extra(&self, now: Instant, max_units: u64, cost: u64) -> u64 {
        let elapsed = now
            .duration_since(self.topped_up_at)
            .max(Duration::from_millis(1));
        let spent = u128::from(self.spent_since_top_up + cost);
        let wanted = spent * HORIZON.as_micros() / elapsed.as_micros();
        u64::try_from(wanted)
            .unwrap_or(u64::MAX)
            .min(max_units.saturating_sub(self.units))
            .min(self.remaining.saturating_sub(cost))
    }

    fn status(&self, now: Instant) -> LimitStatus {
        LimitStatus {
            allowed: true,
            remaining: self.remaining + self.units,
            retry_after_ms: Some(0),
            reset_after_ms: self.reset_at.saturating_duration_since(now).as_millis() as u64,
            delay_ms: 0,
            mark_us: 0,
        }
    }

    fn closed(&self, now: Instant) -> bool {
        self.closes_at.is_some_and(|at| now >= at)
    }
}

/// What one leased limit of a request does.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Paid from units held: the status to report.
    Held(LimitStatus),
    /// Asked of the backend: `want` units, of which `want - cost` are kept if allowed.
    Ask { want: u64, topping_up: bool },
}

impl Step {
    /// Asked of the backend for its own cost only, no top-up.
    fn exact(cost: u64) -> Step {
        Step::Ask {
            want: cost,
            topping_up: false,
        }
    }
}

/// Units held per key: a concurrent map (`dashmap`), each key's holding changed under its shard's
/// lock; idle holdings are swept by the injected clock.
struct Holdings {
    holdings: KeyMap<Holding>,
    capacity: usize,
    meters: LeaseMeters,
}

impl Holdings {
    fn new(capacity: usize, meters: LeaseMeters) -> Holdings {
        Holdings {
            holdings: key_map(SHARDS),
            capacity: capacity.max(1),
            meters,
        }
    }

    /// Pays `cost` from the units held, or says what to ask the backend for.
    fn take(&self, limit: &Limit, leasing: Leasing, key: &[u8], cost: u64, now: Instant) -> Step {
        if let Some(mut holding) = self.holdings.get_mut(key) {
            return self.take_held(&mut holding, leasing, cost, now);
        }
        if self.holdings.len() >= self.capacity {
            return Step::exact(cost);
        }
        match self.holdings.entry(key.into()) {
            // Another request saw the key first, meanwhile.
            HoldingEntry::Occupied(mut holding) => {
                self.take_held(holding.get_mut(), leasing, cost, now)
            }
            HoldingEntry::Vacant(vacant) => {
                // No rate seen yet: the first request asks for its own cost and starts the clock.
                vacant.insert(Holding::new(limit.algorithm, now));
                Step::Ask {
                    want: cost,
                    topping_up: true,
                }
            }
        }
    }

    /// Pays `cost` from `holding`, or says what to ask the backend for: a top-up, unless another
    /// request is topping the key up already (then its own cost only).
    fn take_held(&self, holding: &mut Holding, leasing: Leasing, cost: u64, now: Instant) -> Step {
        if holding.closed(now) {
            holding.units = 0;
        }
        if holding.units >= cost {
            holding.units -= cost;
            holding.spent_since_top_up += cost;
            holding.last_used = now;
            self.meters.held_decisions.inc();
            return Step::Held(holding.status(now));
        }
        if holding.topping_up(now) {
            return Step::exact(cost);
        }
        holding.topping_up = Some(now);
        Step::Ask {
            want: cost + holding.extra(now, leasing.max_units, cost),
            topping_up: true,
        }
    }

    /// Records the backend's answer to a top-up: `kept` units more are held.
    fn credit_top_up(&self, key: &[u8], kept: u64, cost: u64, status: &LimitStatus, now: Instant) {
        let Some(mut holding) = self.holdings.get_mut(key) else {
            return;
        };
        holding.topping_up = None;
        holding.remaining = status.remaining;
        if !status.allowed {
            return;
        }
        let reset = Duration::from_millis(status.reset_after_ms);
        if kept > 0 {
            self.meters.top_ups.inc();
            if holding.units == 0 {
                holding.mark_us = status.mark_us;
            }
        }
        holding.units += kept;
        holding.reset_at = now + reset;
        holding.closes_at =
            matches!(holding.algorithm, Algorithm::FixedWindow { .. }).then(|| now + reset);
        holding.topped_up_at = now;
        holding.spent_since_top_up = cost;
        holding.last_used = now;
    }

    /// Puts back units paid from the holding for a request that was denied after all.
    fn put_back(&self, key: &[u8], cost: u64) {
        if let Some(mut holding) = self.holdings.get_mut(key) {
            holding.units += cost;
            holding.spent_since_top_up = holding.spent_since_top_up.saturating_sub(cost);
        }
    }

    /// Ends a top-up that got no answer.
    fn abandon(&self, key: &[u8]) {
        if let Some(mut holding) = self.holdings.get_mut(key) {
            holding.topping_up = None;
        }
    }

    /// Drops the holdings of idle keys and closed windows; returns what to give back.
    fn sweep(&self, now: Instant) -> Vec<Unspent> {
        let mut refunds = Vec::new();
        self.holdings.retain(|key, holding| {
            let closed = holding.closed(now);
            let idle = now.duration_since(holding.last_used) >= IDLE;
            if holding.topping_up(now) || !(closed || idle) {
                return true;
            }
            // A closed window's units are worth nothing (the script would refuse them too).
            if holding.units > 0 && !closed {
                refunds.push(Unspent {
                    algorithm: holding.algorithm,
                    key: key.clone(),
                    units: holding.units,
                    mark_us: holding.mark_us,
                });
            }
            false
        });
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

    /// Units held unspent across all keys (tests and tools).
    pub fn held(&self) -> u64 {
        self.holdings.held()
    }

    /// Gives back the units of keys idle (or windows closed) at `now`.
    pub async fn return_idle_units(&self, now: Instant) {
        return_unspent(&self.holdings, self.refunds.as_ref(), now).await;
    }

    /// Never starts the sweeping task: idle units go back only when [`Leased::return_idle_units`]
    /// is called (unit tests drive the clock and the sweep by hand).
    #[cfg(test)]
    fn swept_by_hand(self) -> Leased<L, S> {
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
                let Step::Ask { want, .. } = plan.step else {
                    return None;
                };
                let cost = if exactly { plan.entry.cost } else { want };
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

    /// Undoes what `plans` did to the holdings when the request is not admitted.
    fn unwind(&self, plans: &Plans<'_, '_>) {
        for &Plan { entry, step } in plans {
            match step {
                Step::Held(_) => self.holdings.put_back(entry.key, entry.cost),
                Step::Ask {
                    topping_up: true, ..
                } => self.holdings.abandon(entry.key),
                Step::Ask { .. } => {}
            }
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
struct Unspent {
    algorithm: Algorithm,
    key: Box<[u8]>,
    units: u64,
    mark_us: i64,
}

async fn return_unspent(holdings: &Holdings, refunds: &impl SettleUnits, now: Instant) {
    for unspent in holdings.sweep(now) {
        let Unspent {
            algorithm,
            key,
            units,
            mark_us,
        } = unspent;
        let settlement = Settlement {
            algorithm: &algorithm,
            key: &key,
            change: Change::GiveBack { units, mark_us },
        };
        match refunds.settle(&[settlement]).await {
            Ok(()) => holdings.meters.units_returned.inc_by(units),
            Err(error) => log::debug!("could not give back {units} leased units: {error}"),
        }
    }
    holdings
        .meters
        .units_held
        .set(i64::try_from(holdings.held()).unwrap_or(i64::MAX));
}

impl<L: Limiter, S: SettleUnits + 'static> Limiter for Leased<L, S> {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        if request.entries.iter().all(|e| e.limit.leased.is_none()) {
            return self.inner.check(request).await;
        }
        self.start_sweeper();
        let now = self.clock.instant();
        let plans = self.plans(request, now);
        if plans.iter().all(|plan| matches!(plan.step, Step::Held(_))) {
            return Ok(held_decision(request, &plans));
        }
        let (answer, leasing) = self.ask_backend(request, &plans).await?;
        let statuses = self.merge(&plans, &answer, leasing, now);
        Ok(request.decision(statuses))
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
        Step::Held(status) => status,
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
                    None => Step::exact(entry.cost),
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
    ) -> Result<(Decision, bool), LimiterError> {
        let mut answer = self.ask(request, plans, false).await;
        // The larger ask stands only if it was allowed; otherwise ask once more, exactly.
        let mut leasing = plans
            .iter()
            .any(|plan| matches!(plan.step, Step::Ask { want, .. } if want != plan.entry.cost));
        if leasing && matches!(&answer, Ok(d) if !d.allowed()) {
            answer = self.ask(request, plans, true).await;
            leasing = false;
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
            self.unwind(plans);
        }
        answer.map(|answer| (answer, leasing))
    }

    /// Every limit's status: held ones as paid (their units put back if the request is denied
    /// after all), asked ones as the backend answered, with the units a top-up kept.
    fn merge(
        &self,
        plans: &Plans<'_, '_>,
        answer: &Decision,
        leasing: bool,
        now: Instant,
    ) -> Statuses {
        let allowed = answer.allowed();
        // The asked limits' statuses, in order (one per asked limit: checked by ask_backend).
        let mut answered = answer.statuses.iter();
        let mut statuses = Statuses::new();
        for &Plan { entry, step } in plans {
            let status = match step {
                Step::Held(status) => {
                    if !allowed {
                        self.holdings.put_back(entry.key, entry.cost);
                    }
                    status
                }
                Step::Ask { want, topping_up } => match answered.next() {
                    Some(status) => {
                        // A shadow limit that denied consumed nothing, even in an allowed request.
                        let kept = if allowed && leasing && status.allowed {
                            want - entry.cost
                        } else {
                            0
                        };
                        if topping_up {
                            self.holdings
                                .credit_top_up(entry.key, kept, entry.cost, status, now);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::limiter::clock::ManualClock;
    use crate::limiter::local::LocalLimiter;
    use crate::limiter::request::entries;
    use crate::limiter::testing::{asks, limit, window};

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
        let mut limit = limit("hot", algorithm);
        limit.leased = Some(Leasing { max_units });
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

    #[test]
    fn a_top_up_dropped_with_its_request_is_abandoned_after_a_while() {
        let holdings = Holdings::new(10, LeaseMeters::unregistered());
        let [limit] = leased(window(100), 10);
        let leasing = Leasing { max_units: 10 };
        let t0 = ManualClock::new(0).instant();
        let asks = |at: Instant| match holdings.take(&limit, leasing, KEY, 1, at) {
            Step::Ask { topping_up, .. } => topping_up,
            Step::Held(_) => panic!("nothing is held"),
        };
        assert!(asks(t0), "the first request starts a top-up");
        // Its request is dropped before the answer: nobody credits it.
        assert!(
            !asks(t0 + Duration::from_secs(1)),
            "meanwhile others ask exactly"
        );
        assert!(asks(t0 + TOP_UP_STALE), "then the key tops up again");
    }

    #[test]
    fn refunds_move_a_gcra_back_and_a_window_count_down_while_it_is_open() {
        use crate::limiter::algorithm::{Settled, State, Write};
        let gcra = Algorithm::Gcra {
            emission_us: 100,
            tolerance_us: 1000,
            max_delay_us: 0,
        };
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
        let gcra = Algorithm::Gcra {
            emission_us: 100,
            tolerance_us: 1000,
            max_delay_us: 0,
        };
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
