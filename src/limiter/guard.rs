//! Guards around a limiter backend: a circuit breaker that stops calling an unavailable Redis,
//! and a local deny cache that answers known offenders without calling it at all.
//!
//! * **Deny cache.** When a key is denied with "retry after r", no request for that key can pass
//!   before then: other gateways only ever consume, and time moves the same for all. So later
//!   requests for it are denied in-process until then, with the same decision aged by the time
//!   passed. Only limits with a fixed cost are cached (a smaller cost could pass sooner), and
//!   never concurrency limits (slots free whenever a request ends). A key outlives a change of
//!   the count it is compared with (a reload, another plan's limits on a shared key: see
//!   `config/limits.rs`'s fingerprint), so a denial answers only a request that asks the same
//!   limit, in the same position, with the same parameters and cost as the denied one.
//!   Bounded; exact expiry: a denial is judged by the injected clock, and expired ones are
//!   swept at most once a second (a full cache remembers no more until then).
//! * **Circuit breaker.** After `FAILURES_TO_OPEN` consecutive errors the backend is not called
//!   for a short interval (doubling from 50 ms up to 200 ms with each failed probe, whatever the
//!   failure — an error or a missed deadline — so recovery is seen within a second of Redis
//!   returning); then one request probes it. Errors while open are `breaker_open`, and the
//!   failure mode applies. A probe whose request is cancelled before Redis answers opens it
//!   again for the same interval, so a later request probes. Its state is
//!   `sluice_redis_breaker_state`; an outage logs two lines: a warning when it opens (naming
//!   the server and the last error) and a line when it closes (how long, how many probes
//!   failed); the transitions between are logged at debug.
//!
//! Releases of concurrency slots and settlements go through the same breaker
//! ([`BehindBreaker`]): while it is open they fail at once (`breaker_open`) instead of each
//! waiting out the Redis deadline, and their failures open it like decisions' do.
//!
//! Both read time from the injected [`Clock`], and count through handles given at construction.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::IntGauge;

use super::algorithm::Algorithm;
use super::backend::{Limiter, ReleaseSlots, SettleUnits, Settlement};
use super::clock::Clock;
use super::decision::{Decision, Source};
use super::error::LimiterError;
use super::key::{key_map, KeyMap};
use super::limit::Cost;
use super::meters::Counter;
use super::request::{Entry, LimitRequest};

/// What the guards count: deny-cache hits and the breaker's state.
#[derive(Clone)]
pub struct GuardMeters {
    pub deny_cache_hits: Counter,
    /// 0 closed, 1 open, 2 half-open.
    pub breaker_state: IntGauge,
}

impl GuardMeters {
    /// Handles registered nowhere (tests and tools).
    pub fn unregistered() -> GuardMeters {
        GuardMeters {
            deny_cache_hits: Counter::default(),
            breaker_state: IntGauge::new("breaker_state", "unregistered").expect("a valid gauge"),
        }
    }
}

/// Shards of the deny cache's map: bounds what counting it (`len`, when it is full) locks.
const SHARDS: usize = 16;
/// Groups of keys, by hash, each with the end of the last denial remembered in it: a lookup
/// of a key whose group holds no live denial does not lock the map. Enough that a few hundred
/// clients denied at once (a month's quota spent) leave most lookups on the fast path; read
/// by every lookup, written only when a denial is remembered or the cache cleared.
const END_GROUPS: usize = 1024;
/// Keys the deny cache holds at most (give or take a denial per caller remembering at the same
/// time); beyond it, new denials are simply not cached.
pub const DENY_CACHE_CAPACITY: usize = 100_000;
/// How often denials past their time are dropped (by the next denial remembered after it):
/// without it, a wave of clients denied once each held their entries until the cache filled.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
const FAILURES_TO_OPEN: u32 = 3;
const FIRST_OPEN_MS: u64 = 50;
const MAX_OPEN_MS: u64 = 200;

struct Denial {
    until: Instant,
    at: Instant,
    decision: Decision,
    /// What was denied: the entry's position among the request's, its limit's parameters and
    /// cost, and how many limits the request had.
    asked: Asked,
}

/// The denied entry of a request, as a later request must ask it for the denial to apply.
#[derive(PartialEq, Eq)]
struct Asked {
    position: usize,
    limits: usize,
    algorithm: Algorithm,
    cost: u64,
}

impl Asked {
    fn of(entries: &[Entry<'_>], position: usize, entry: &Entry<'_>) -> Asked {
        Asked {
            position,
            limits: entries.len(),
            algorithm: entry.limit.algorithm,
            cost: entry.cost,
        }
    }
}

impl Denial {
    /// The decision as it stands at `now`: its waits shortened by the time passed.
    fn aged(&self, now: Instant) -> Decision {
        let elapsed = now.duration_since(self.at).as_millis() as u64;
        let mut decision = self.decision.clone();
        for status in &mut decision.statuses {
            status.retry_after_ms = status.retry_after_ms.map(|ms| ms.saturating_sub(elapsed));
            status.reset_after_ms = status.reset_after_ms.saturating_sub(elapsed);
        }
        decision
    }
}

/// Keys known to be denied, until when: a concurrent map (`dashmap`); expiry is judged by the
/// injected clock, so tests move time by hand.
pub struct DenyCache {
    denials: KeyMap<Denial>,
    capacity: usize,
    /// When expired denials were last dropped; whoever holds the lock sweeps, others go on.
    swept: Mutex<Option<Instant>>,
    /// Counts [`DenyCache::clear`]s: a denial decided before one is not remembered after it.
    generation: AtomicU64,
    /// Per group of keys ([`END_GROUPS`], by the key's hash): the latest end of the denials
    /// remembered in it since the last clear, in nanoseconds from `epoch` (`i64::MIN`: none).
    /// A key looked up at or past its group's end reads this instead of locking a shard of
    /// the map, a write on a line that every core's lookups of that shard write: the usual
    /// case, its client not denied now.
    ends: Box<[AtomicI64]>,
    /// What `ends` count from: made with the cache (an injected clock's instants may precede
    /// it, hence signed).
    epoch: Instant,
}

impl DenyCache {
    pub fn new(capacity: usize) -> DenyCache {
        DenyCache {
            denials: key_map(SHARDS),
            capacity: capacity.max(1),
            swept: Mutex::new(None),
            generation: AtomicU64::new(0),
            ends: (0..END_GROUPS).map(|_| AtomicI64::new(i64::MIN)).collect(),
            epoch: Instant::now(),
        }
    }

    /// The cached decision for the key of any of `entries`, aged to `now`.
    pub fn lookup(&self, entries: &[Entry<'_>], now: Instant) -> Option<Decision> {
        let at = self.since_epoch(now);
        entries.iter().enumerate().find_map(|(position, entry)| {
            if at >= self.end_of(entry.key).load(Ordering::Acquire) {
                return None;
            }
            let denial = self.denials.get(entry.key)?;
            (denial.until > now && denial.asked == Asked::of(entries, position, entry))
                .then(|| denial.aged(now))
        })
    }

    /// Remembers a denial of the request's denying limit, when it is safe to.
    pub fn remember(&self, request: &LimitRequest<'_>, decision: &Decision, now: Instant) {
        let Some(index) = decision.denied_by else {
            return;
        };
        let Some(entry) = request.entries.get(index) else {
            return;
        };
        // Only a denial of the limit's own fixed cost says when *any* request can pass: a
        // leased top-up asks for more than that (and is asked again exactly when denied).
        let fixed_cost = matches!(entry.limit.cost, Cost::Fixed(cost) if entry.cost == cost);
        let concurrency = matches!(entry.limit.algorithm, Algorithm::Concurrency { .. });
        let Some(retry_ms) = decision.retry().after_ms() else {
            return;
        };
        if !fixed_cost || concurrency || retry_ms == 0 {
            return;
        }
        let key = entry.key;
        self.sweep_now_and_then(now);
        // Full of denials the last sweep kept: this one is not remembered (its client's next
        // request asks the backend). Sweeping again here would walk the whole cache for every
        // new key of a flood of distinct clients; the sweep runs at most once a second.
        if self.denials.len() >= self.capacity && !self.denials.contains_key(key) {
            return;
        }
        let denial = Denial {
            until: now + Duration::from_millis(retry_ms),
            at: now,
            decision: decision.clone(),
            asked: Asked::of(request.entries, index, entry),
        };
        let until = self.since_epoch(denial.until);
        self.denials.insert(Box::from(key), denial);
        // After the insert, so a lookup that sees the new end finds the denial.
        let end = self.end_of(key);
        if end.load(Ordering::Relaxed) < until {
            end.fetch_max(until, Ordering::Release);
        }
    }

    /// The end of the denials of `key`'s group.
    fn end_of(&self, key: &[u8]) -> &AtomicI64 {
        &self.ends[self.denials.hash_usize(&key) % self.ends.len()]
    }

    /// `at` in signed nanoseconds from the cache's epoch (an injected clock's instants may
    /// precede it).
    fn since_epoch(&self, at: Instant) -> i64 {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match at.checked_duration_since(self.epoch) {
            Some(after) => nanos(after),
            None => -nanos(self.epoch.duration_since(at)),
        }
    }

    /// Drops the denials past their time, at most once per [`SWEEP_EVERY`], and gives their
    /// room back once most of it is empty: what the cache holds follows what is denied now.
    fn sweep_now_and_then(&self, now: Instant) {
        let Ok(mut swept) = self.swept.try_lock() else {
            return;
        };
        if swept.is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY) {
            return;
        }
        *swept = Some(now);
        let before = self.denials.len();
        self.denials.retain(|_, d| d.until > now);
        let after = self.denials.len();
        if after < before && after < self.denials.capacity() / 4 {
            self.denials.shrink_to_fit();
        }
    }

    /// Forgets every denial held, and any decided before now and not yet remembered.
    pub fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        // The ends first: a denial remembered while the map is cleared raises its group's end
        // after these stores (its insert waits for its shard's clear), so none is hidden.
        for end in self.ends.iter() {
            end.store(i64::MIN, Ordering::Release);
        }
        self.denials.clear();
    }

    /// The number of clears so far: read before a decision, passed to
    /// [`DenyCache::remember_unless_cleared`].
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// [`DenyCache::remember`], unless the cache was cleared since `generation` was read (the
    /// denial may predate what cleared it: a reset, a credit, an override).
    pub fn remember_unless_cleared(
        &self,
        request: &LimitRequest<'_>,
        decision: &Decision,
        now: Instant,
        generation: u64,
    ) {
        if self.generation() != generation {
            return;
        }
        self.remember(request, decision, now);
        // A clear between the check above and the insert: take the denial out again.
        if self.generation() != generation {
            if let Some(index) = decision.denied_by {
                if let Some(entry) = request.entries.get(index) {
                    self.denials.remove(entry.key);
                }
            }
        }
    }

    /// Denials held, live or expired but not yet swept.
    pub fn len(&self) -> usize {
        self.denials.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Breaker states, as the `sluice_redis_breaker_state` gauge shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

impl BreakerState {
    fn from_u8(value: u8) -> BreakerState {
        match value {
            1 => BreakerState::Open,
            2 => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }
}

/// Stops calling a failing backend for a short, growing interval; one request probes it.
pub struct Breaker {
    clock: Arc<dyn Clock>,
    epoch: Instant,
    state: AtomicU8,
    failures: AtomicU32,
    open_until_ms: AtomicU64,
    interval_ms: AtomicU64,
    gauge: IntGauge,
    /// What it guards (`redis at 127.0.0.1:6379`), for its log lines.
    target: Arc<str>,
    /// When it last opened from closed (ms since `epoch`), and the probes failed since.
    opened_at_ms: AtomicU64,
    failed_probes: AtomicU32,
}

impl Breaker {
    /// A closed breaker guarding `target`; `gauge` shows its state.
    pub fn new(clock: Arc<dyn Clock>, gauge: IntGauge, target: &str) -> Breaker {
        gauge.set(BreakerState::Closed as i64);
        Breaker {
            epoch: clock.instant(),
            clock,
            state: AtomicU8::new(BreakerState::Closed as u8),
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            interval_ms: AtomicU64::new(FIRST_OPEN_MS),
            gauge,
            target: Arc::from(target),
            opened_at_ms: AtomicU64::new(0),
            failed_probes: AtomicU32::new(0),
        }
    }

    pub fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn now_ms(&self) -> u64 {
        self.clock.instant().duration_since(self.epoch).as_millis() as u64
    }

    fn transition(&self, from: BreakerState, to: BreakerState) -> bool {
        let moved = self
            .state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            self.gauge.set(to as i64);
        }
        moved
    }

    /// Whether a call may go through now (`false`: fail fast).
    pub fn admit(&self) -> bool {
        match self.state() {
            BreakerState::Closed => true,
            BreakerState::HalfOpen => false, // one probe is in flight
            BreakerState::Open => {
                let probe = self.now_ms() >= self.open_until_ms.load(Ordering::Acquire)
                    && self.transition(BreakerState::Open, BreakerState::HalfOpen);
                if probe {
                    log::debug!("redis circuit breaker half-open: probing {}", self.target);
                }
                probe
            }
        }
    }

    /// A call that succeeded. While the breaker is closed and nothing failed, it writes nothing
    /// (every decision passes here: a shared cache line written by each would bounce between
    /// cores).
    pub fn on_success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.state() == BreakerState::HalfOpen
            && self.transition(BreakerState::HalfOpen, BreakerState::Closed)
        {
            self.interval_ms.store(FIRST_OPEN_MS, Ordering::Relaxed);
            let open_ms = self
                .now_ms()
                .saturating_sub(self.opened_at_ms.load(Ordering::Relaxed));
            log::info!(
                "redis circuit breaker closed: {} answers again after {:.1} s ({} probes failed)",
                self.target,
                open_ms as f64 / 1000.0,
                self.failed_probes.swap(0, Ordering::Relaxed)
            );
        }
    }

    /// A call that failed with `error`: a failed probe doubles the pause (a missed deadline as
    /// much as an error), and the third failure in a row of a closed breaker opens it.
    pub fn on_failure(&self, error: &LimiterError) {
        if self.state() == BreakerState::HalfOpen {
            let interval = (self.interval_ms.load(Ordering::Relaxed) * 2).min(MAX_OPEN_MS);
            self.interval_ms.store(interval, Ordering::Relaxed);
            if self.open(BreakerState::HalfOpen, interval) {
                self.failed_probes.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "redis circuit breaker: the probe failed ({error}); next in {interval} ms"
                );
            }
            return;
        }
        if self.failures.fetch_add(1, Ordering::Relaxed) + 1 >= FAILURES_TO_OPEN {
            let interval = self.interval_ms.load(Ordering::Relaxed);
            if self.open(BreakerState::Closed, interval) {
                self.opened_at_ms.store(self.now_ms(), Ordering::Relaxed);
                self.failed_probes.store(0, Ordering::Relaxed);
                log::warn!(
                    "redis circuit breaker open: {} failed {FAILURES_TO_OPEN} calls in a row, the last: {error}; \
                     calls fail fast and the failure mode applies, one probe every {interval} to {MAX_OPEN_MS} ms",
                    self.target
                );
            }
        }
    }

    /// Opens the breaker from the state `from` for `interval` ms; whether it moved.
    fn open(&self, from: BreakerState, interval: u64) -> bool {
        self.open_until_ms
            .store(self.now_ms() + interval, Ordering::Release);
        self.transition(from, BreakerState::Open)
    }
}

/// A backend behind the deny cache and, for Redis, the breaker.
pub struct Guarded<L> {
    inner: L,
    clock: Arc<dyn Clock>,
    deny_cache: DenyCache,
    breaker: Option<Arc<Breaker>>,
    deny_cache_hits: Counter,
}

impl<L> Guarded<L> {
    /// Forgets the denials cached: a change made elsewhere (the quota admin API) may have
    /// made them wrong.
    pub fn forget_denials(&self) {
        self.deny_cache.clear();
    }
}

impl<L: Limiter> Guarded<L> {
    /// `inner` behind a deny cache, and behind a breaker when it reaches a server
    /// (`breaker_for` names the server, for the breaker's log lines).
    pub fn new(
        inner: L,
        breaker_for: Option<&str>,
        clock: Arc<dyn Clock>,
        meters: GuardMeters,
    ) -> Guarded<L> {
        Guarded {
            inner,
            deny_cache: DenyCache::new(DENY_CACHE_CAPACITY),
            breaker: breaker_for.map(|target| {
                Arc::new(Breaker::new(
                    Arc::clone(&clock),
                    meters.breaker_state,
                    target,
                ))
            }),
            clock,
            deny_cache_hits: meters.deny_cache_hits,
        }
    }

    /// The breaker, for releases and settlements to share ([`BehindBreaker`]).
    pub fn breaker(&self) -> Option<Arc<Breaker>> {
        self.breaker.clone()
    }
}

impl Breaker {
    /// Lets a call through (`None`: open, or a probe is in flight: fail fast); its outcome is
    /// recorded through what this returns.
    ///
    /// Callers await the backend's future themselves, between `enter` and `record`. A helper
    /// taking the future by value would hold it twice in its own state (the argument and the
    /// value awaited: rustc does not overlap them), doubling the size of every future above it,
    /// each moved whole when it is made.
    fn enter(&self) -> Option<Admitted<'_>> {
        // `then`, not `then_some`: a call refused must not make (and drop) an `Admitted`, whose
        // drop says a probe was abandoned and reopens the breaker with the same interval — every
        // request refused while a probe was in flight did so, and the pause never grew.
        self.admit().then(|| Admitted {
            breaker: self,
            recorded: false,
        })
    }

    /// A call it let through was dropped before its outcome was known (its request was
    /// cancelled). If that call was the half-open breaker's probe, the breaker opens again for
    /// the same interval, so a later request probes: otherwise it would stay half-open, failing
    /// every call fast, waiting for an answer that never comes.
    fn abandoned(&self) {
        if self.state() == BreakerState::HalfOpen {
            self.open(
                BreakerState::HalfOpen,
                self.interval_ms.load(Ordering::Relaxed),
            );
        }
    }
}

/// A call the breaker let through, until its outcome is recorded.
#[must_use = "a call let through is recorded, or it counts as abandoned"]
struct Admitted<'a> {
    breaker: &'a Breaker,
    recorded: bool,
}

impl Admitted<'_> {
    /// Feeds the call's outcome back: errors that say nothing about the backend's health
    /// (`always_denies`) do not count.
    fn record<T>(mut self, result: &Result<T, LimiterError>) {
        self.recorded = true;
        match result {
            Ok(_) => self.breaker.on_success(),
            Err(e) if !e.always_denies() => self.breaker.on_failure(e),
            Err(_) => {}
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            self.breaker.abandoned();
        }
    }
}

/// Releases and settlements sent to a backend through the breaker its decisions go through.
pub struct BehindBreaker<B> {
    inner: Arc<B>,
    breaker: Arc<Breaker>,
}

impl<B> BehindBreaker<B> {
    pub fn new(inner: Arc<B>, breaker: Arc<Breaker>) -> BehindBreaker<B> {
        BehindBreaker { inner, breaker }
    }
}

impl<B: ReleaseSlots> ReleaseSlots for BehindBreaker<B> {
    async fn release(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError> {
        let admitted = self.breaker.enter().ok_or(LimiterError::BreakerOpen)?;
        let result = self.inner.release(request).await;
        admitted.record(&result);
        result
    }
}

impl<B: SettleUnits> SettleUnits for BehindBreaker<B> {
    async fn settle(&self, settlements: &[Settlement<'_>]) -> Result<u64, LimiterError> {
        let admitted = self.breaker.enter().ok_or(LimiterError::BreakerOpen)?;
        let result = self.inner.settle(settlements).await;
        admitted.record(&result);
        result
    }
}

impl<L: Limiter> Limiter for Guarded<L> {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        let now = self.clock.instant();
        if let Some(decision) = self.deny_cache.lookup(request.entries, now) {
            self.deny_cache_hits.inc();
            // Only the cached limit answers: no shadow limit was asked either.
            return Ok(Decision {
                source: Source::DenyCache,
                batch: 0,
                shadow_denied_by: None,
                ..decision
            });
        }
        let admitted = match &self.breaker {
            Some(breaker) => Some(breaker.enter().ok_or(LimiterError::BreakerOpen)?),
            None => None,
        };
        let generation = self.deny_cache.generation();
        let result = self.inner.check(request).await;
        if let Some(admitted) = admitted {
            admitted.record(&result);
        }
        if let Ok(decision) = &result {
            if !decision.allowed() {
                let cache = &self.deny_cache;
                cache.remember_unless_cleared(request, decision, now, generation);
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::clock::ManualClock;
    use crate::limiter::limit::Limit;
    use crate::limiter::request::entries;
    use crate::limiter::status::LimitStatus;
    use crate::limiter::testing::{asks, concurrency, gcra, limit, window};

    fn denied(retry: u64) -> Decision {
        Decision::from_statuses(vec![LimitStatus {
            allowed: false,
            remaining: 0,
            retry_after_ms: Some(retry),
            reset_after_ms: retry,
            delay_ms: 0,
            mark_us: 0,
        }])
    }

    /// Remembers a denial of `limits[0]` asked at `cost`.
    fn remember(cache: &DenyCache, limits: &[Limit], cost: u64, retry: u64, now: Instant) {
        remember_key(cache, b"k", limits, cost, retry, now);
    }

    fn remember_key(
        cache: &DenyCache,
        key: &[u8],
        limits: &[Limit],
        cost: u64,
        retry: u64,
        now: Instant,
    ) {
        let asks = asks(&[key], &[cost]);
        let entries = entries(limits, &asks);
        cache.remember(&LimitRequest::new(&entries), &denied(retry), now);
    }

    /// The cached answer for `key` asked of `gcra(1000, 0)` at cost 1.
    fn lookup(cache: &DenyCache, key: &[u8], now: Instant) -> Option<Decision> {
        lookup_of(cache, key, &[limit("l", gcra(1000, 0))], now)
    }

    fn lookup_of(
        cache: &DenyCache,
        key: &[u8],
        limits: &[Limit],
        now: Instant,
    ) -> Option<Decision> {
        let asks = asks(&[key], &[1]);
        let entries = entries(limits, &asks);
        cache.lookup(&entries, now)
    }

    #[test]
    fn a_clear_forgets_denials_held_and_those_decided_before_it() {
        let cache = DenyCache::new(10);
        let t0 = Instant::now();
        let limits = [limit("l", gcra(1000, 0))];
        remember(&cache, &limits, 1, 1000, t0);
        let asks = asks(&[b"late"], &[1]);
        let entries = entries(&limits, &asks);
        let request = LimitRequest::new(&entries);
        let before = cache.generation();
        cache.clear();
        assert!(lookup(&cache, b"k", t0).is_none(), "held: forgotten");
        cache.remember_unless_cleared(&request, &denied(1000), t0, before);
        assert!(
            lookup(&cache, b"late", t0).is_none(),
            "decided before the clear"
        );
        cache.remember_unless_cleared(&request, &denied(1000), t0, cache.generation());
        assert!(lookup(&cache, b"late", t0).is_some(), "decided after it");
    }

    #[test]
    fn denials_are_served_locally_until_they_expire() {
        let cache = DenyCache::new(10);
        let t0 = Instant::now();
        remember(&cache, &[limit("l", gcra(1000, 0))], 1, 1000, t0);
        let aged = lookup(&cache, b"k", t0 + Duration::from_millis(400)).unwrap();
        assert_eq!(aged.statuses[0].retry_after_ms, Some(600));
        assert!(lookup(&cache, b"k", t0 + Duration::from_millis(1000)).is_none());
        assert!(lookup(&cache, b"other", t0).is_none());
    }

    #[test]
    fn past_the_end_of_every_denial_a_lookup_finds_none_and_earlier_instants_still_count() {
        let t0 = Instant::now();
        // The cache's epoch is after t0 (an injected clock's instants may precede it).
        let cache = DenyCache::new(10);
        let limits = [limit("l", gcra(1000, 0))];
        assert!(lookup(&cache, b"a", t0).is_none(), "nothing remembered");
        remember_key(&cache, b"a", &limits, 1, 100, t0);
        remember_key(&cache, b"b", &limits, 1, 300, t0);
        let at = |ms| t0 + Duration::from_millis(ms);
        let group = |key: &[u8]| cache.end_of(key) as *const AtomicI64;
        let other = (0u32..)
            .map(|i| i.to_string())
            .find(|k| ![group(b"a"), group(b"b")].contains(&group(k.as_bytes())))
            .expect("a key of another group");
        assert_eq!(
            cache.end_of(other.as_bytes()).load(Ordering::Relaxed),
            i64::MIN,
            "a group without denials: its keys' lookups skip the map"
        );
        assert!(
            lookup(&cache, b"a", t0).is_some(),
            "asked before the epoch, live"
        );
        assert!(lookup(&cache, b"a", at(50)).is_some());
        assert!(lookup(&cache, b"a", at(150)).is_none(), "a ended");
        assert!(lookup(&cache, b"b", at(150)).is_some(), "b still live");
        let late = cache.since_epoch(at(300));
        assert!(
            late >= cache.end_of(b"b").load(Ordering::Relaxed),
            "past every end"
        );
        assert!(lookup(&cache, b"b", at(300)).is_none());
        cache.clear();
        let ends = cache.ends.iter().map(|end| end.load(Ordering::Relaxed));
        assert!(
            ends.into_iter().all(|end| end == i64::MIN),
            "a clear ends all"
        );
        remember_key(&cache, b"c", &limits, 1, 100, at(400));
        assert!(
            lookup(&cache, b"c", at(450)).is_some(),
            "a new end after a clear"
        );
    }

    #[test]
    fn a_denial_answers_only_the_same_limit_asked_the_same_way() {
        let cache = DenyCache::new(10);
        let t0 = Instant::now();
        let denied_under = [limit("l", window(5))];
        remember(&cache, &denied_under, 1, 1000, t0);
        assert!(lookup_of(&cache, b"k", &denied_under, t0).is_some());
        // The same key with a higher count (a reload, another plan's limit on a shared key)
        // may pass: only the backend can say.
        assert!(lookup_of(&cache, b"k", &[limit("l", window(50))], t0).is_none());
        // The same limit beside another one: the denial's other statuses do not fit.
        let beside = [limit("l", window(5)), limit("m", window(5))];
        let asks = asks(&[b"k", b"m"], &[1, 1]);
        assert!(cache.lookup(&entries(&beside, &asks), t0).is_none());
    }

    #[test]
    fn a_full_cache_sweeps_expired_denials_and_otherwise_caches_no_more() {
        let cache = DenyCache::new(2);
        let limits = [limit("l", gcra(1000, 0))];
        let t0 = Instant::now();
        for key in [b"a", b"b", b"c"] {
            remember_key(&cache, key, &limits, 1, 1000, t0);
        }
        assert_eq!(cache.len(), 2);
        assert!(lookup(&cache, b"a", t0).is_some());
        assert!(lookup(&cache, b"c", t0).is_none(), "no room for a third");
        let later = t0 + Duration::from_millis(1000);
        remember_key(&cache, b"c", &limits, 1, 1000, later);
        assert_eq!(cache.len(), 1, "the expired denials were swept");
        assert!(lookup(&cache, b"c", later).is_some());
    }

    #[test]
    fn a_full_cache_is_swept_at_most_once_a_second_whatever_the_denials() {
        let cache = DenyCache::new(2);
        let limits = [limit("l", gcra(1000, 0))];
        let t0 = Instant::now();
        for key in [b"a", b"b"] {
            remember_key(&cache, key, &limits, 1, 100, t0);
        }
        // Both are past their time, but the sweep of t0 was the last second's.
        let t1 = t0 + Duration::from_millis(500);
        remember_key(&cache, b"c", &limits, 1, 1000, t1);
        assert_eq!(cache.len(), 2, "no walk of the cache for a new key");
        assert!(lookup(&cache, b"c", t1).is_none());
        let t2 = t0 + SWEEP_EVERY;
        remember_key(&cache, b"c", &limits, 1, 1000, t2);
        assert_eq!(cache.len(), 1, "the next second's sweep made room");
        assert!(lookup(&cache, b"c", t2).is_some());
    }

    #[test]
    fn denials_past_their_time_go_within_a_sweep_though_the_cache_never_fills() {
        let cache = DenyCache::new(100_000);
        let limits = [limit("l", gcra(1000, 0))];
        let t0 = Instant::now();
        for i in 0..1000u32 {
            remember_key(&cache, &i.to_be_bytes(), &limits, 1, 500, t0);
        }
        assert_eq!(cache.len(), 1000);
        let room = cache.denials.capacity();
        // Half a second on: the denials of t0 are due, but the sweep waits its second.
        let t1 = t0 + Duration::from_millis(500);
        remember_key(&cache, b"late", &limits, 1, 5000, t1);
        assert_eq!(cache.len(), 1001, "no sweep before SWEEP_EVERY");
        let t2 = t0 + SWEEP_EVERY;
        remember_key(&cache, b"later", &limits, 1, 5000, t2);
        assert_eq!(cache.len(), 2, "only the denials still in force are held");
        assert!(lookup(&cache, b"late", t2).is_some());
        assert!(
            cache.denials.capacity() < room / 4,
            "the room is given back: {} of {room}",
            cache.denials.capacity()
        );
    }

    #[test]
    fn concurrency_header_costs_and_lease_asks_are_never_cached() {
        let cache = DenyCache::new(10);
        let now = Instant::now();
        remember(&cache, &[limit("c", concurrency(1))], 1, 500, now);
        let mut header = limit("h", window(5));
        header.cost = Cost::Requested { max: 5, default: 1 };
        remember(&cache, &[header], 1, 500, now);
        // A lease asks for more than the limit's cost: its denial says nothing about cost 1.
        remember(&cache, &[limit("w", window(5))], 4, 500, now);
        assert!(cache.is_empty());
    }

    #[test]
    fn the_breaker_opens_after_repeated_failures_and_a_probe_closes_it() {
        let clock = Arc::new(ManualClock::new(0));
        let gauge = GuardMeters::unregistered().breaker_state;
        let breaker = Breaker::new(clock.clone(), gauge.clone(), "redis at test");
        for _ in 0..FAILURES_TO_OPEN {
            assert!(breaker.admit());
            breaker.on_failure(&LimiterError::Timeout(50));
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        assert_eq!(gauge.get(), 1);
        assert!(!breaker.admit());
        clock.advance_by(Duration::from_millis(FIRST_OPEN_MS - 1));
        assert!(!breaker.admit(), "still open just before the interval ends");
        clock.advance_by(Duration::from_millis(1));
        assert!(breaker.admit(), "one probe");
        assert_eq!((breaker.state(), gauge.get()), (BreakerState::HalfOpen, 2));
        assert!(!breaker.admit(), "only one probe at a time");
        breaker.on_failure(&LimiterError::Timeout(50));
        assert_eq!(
            (breaker.state(), breaker.interval_ms.load(Ordering::Relaxed)),
            (BreakerState::Open, 2 * FIRST_OPEN_MS)
        );
        clock.advance_by(Duration::from_millis(2 * FIRST_OPEN_MS));
        assert!(breaker.admit());
        breaker.on_success();
        assert_eq!((breaker.state(), gauge.get()), (BreakerState::Closed, 0));
        assert!(breaker.admit());
    }

    #[test]
    fn calls_refused_while_a_probe_is_in_flight_leave_it_alone_and_its_failure_doubles_the_pause() {
        let clock = Arc::new(ManualClock::new(0));
        let breaker = Breaker::new(
            clock.clone(),
            GuardMeters::unregistered().breaker_state,
            "redis at test",
        );
        let timeout = LimiterError::Timeout(50);
        for _ in 0..FAILURES_TO_OPEN {
            breaker.on_failure(&timeout);
        }
        let mut interval = FIRST_OPEN_MS;
        for _ in 0..3 {
            clock.advance_by(Duration::from_millis(interval));
            let probe = breaker.enter().expect("the pause is over: one probe");
            // Requests keep coming while the probe waits for its deadline: each is refused.
            for _ in 0..10 {
                assert!(breaker.enter().is_none());
            }
            assert_eq!(breaker.state(), BreakerState::HalfOpen, "still probing");
            probe.record::<()>(&Err(timeout.clone()));
            interval = (interval * 2).min(MAX_OPEN_MS);
            assert_eq!(breaker.interval_ms.load(Ordering::Relaxed), interval);
            assert_eq!(breaker.state(), BreakerState::Open);
        }
        assert_eq!(interval, MAX_OPEN_MS);
    }

    /// A backend whose releases never answer.
    struct Hangs;

    impl ReleaseSlots for Hangs {
        async fn release(&self, _: &LimitRequest<'_>) -> Result<(), LimiterError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_probe_cancelled_before_its_answer_lets_a_later_request_probe() {
        let clock = Arc::new(ManualClock::new(0));
        let breaker = Arc::new(Breaker::new(
            clock.clone(),
            GuardMeters::unregistered().breaker_state,
            "redis at test",
        ));
        for _ in 0..FAILURES_TO_OPEN {
            breaker.on_failure(&LimiterError::Timeout(50));
        }
        let ends = BehindBreaker::new(Arc::new(Hangs), Arc::clone(&breaker));
        let limits = [limit("c", concurrency(1))];
        let asks = asks(&[b"k"], &[1]);
        let entries = entries(&limits, &asks);
        clock.advance_by(Duration::from_millis(FIRST_OPEN_MS));
        // The probe's request is cancelled (dropped) while the backend has not answered.
        let request = LimitRequest::new(&entries);
        let cancelled =
            tokio::time::timeout(Duration::from_millis(5), ends.release(&request)).await;
        assert!(cancelled.is_err(), "the probe never answered");
        assert_eq!(breaker.state(), BreakerState::Open, "not stuck half-open");
        assert!(!breaker.admit(), "open for the same interval again");
        clock.advance_by(Duration::from_millis(FIRST_OPEN_MS));
        assert!(breaker.admit(), "a later request probes");
        assert_eq!(
            breaker.interval_ms.load(Ordering::Relaxed),
            FIRST_OPEN_MS,
            "a cancellation says nothing of the backend: the interval does not grow"
        );
    }

    /// A backend whose releases and settlements all time out, counting the calls that reach it.
    #[derive(Default)]
    struct TimesOut {
        calls: AtomicU32,
    }

    impl ReleaseSlots for TimesOut {
        async fn release(&self, _: &LimitRequest<'_>) -> Result<(), LimiterError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Err(LimiterError::Timeout(50))
        }
    }

    impl SettleUnits for TimesOut {
        async fn settle(&self, _: &[Settlement<'_>]) -> Result<u64, LimiterError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Err(LimiterError::Timeout(50))
        }
    }

    #[tokio::test]
    async fn failing_releases_open_the_breaker_and_then_settlements_fail_at_once() {
        let clock = Arc::new(ManualClock::new(0));
        let breaker = Arc::new(Breaker::new(
            clock,
            GuardMeters::unregistered().breaker_state,
            "redis at test",
        ));
        let backend = Arc::new(TimesOut::default());
        let ends = BehindBreaker::new(Arc::clone(&backend), Arc::clone(&breaker));
        let limits = [limit("c", concurrency(1))];
        let asks = asks(&[b"k"], &[1]);
        let entries = entries(&limits, &asks);
        for _ in 0..FAILURES_TO_OPEN {
            let released = ends.release(&LimitRequest::new(&entries)).await;
            assert!(matches!(released, Err(LimiterError::Timeout(_))));
        }
        assert_eq!(breaker.state(), BreakerState::Open);
        let settled = ends.settle(&[]).await;
        assert!(
            matches!(settled, Err(LimiterError::BreakerOpen)),
            "{settled:?}"
        );
        assert_eq!(
            backend.calls.load(Ordering::Relaxed),
            FAILURES_TO_OPEN,
            "the open breaker kept the settlement from the backend"
        );
    }

    #[test]
    fn the_interval_doubles_up_to_its_cap() {
        let clock = Arc::new(ManualClock::new(0));
        let breaker = Breaker::new(
            clock.clone(),
            GuardMeters::unregistered().breaker_state,
            "redis at test",
        );
        for _ in 0..FAILURES_TO_OPEN {
            breaker.on_failure(&LimiterError::Timeout(50));
        }
        for _ in 0..5 {
            clock.advance_by(Duration::from_millis(MAX_OPEN_MS));
            assert!(breaker.admit());
            breaker.on_failure(&LimiterError::Timeout(50));
        }
        assert_eq!(breaker.interval_ms.load(Ordering::Relaxed), MAX_OPEN_MS);
    }
}
