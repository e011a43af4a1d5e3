//! In-process backend: the same algorithms as the Lua scripts, for a single gateway.
//!
//! State lives in a sharded map keyed by the same key bytes the Redis backend uses. A request
//! locks the shards of its keys in ascending order (no deadlock), decides every limit, and
//! writes only if all allow, exactly like `lua/check.lua`. Memory is bounded: an entry whose
//! state has expired is equivalent to absent and is swept when a shard fills up; when a shard
//! is full of live state, the request fails with `LocalCapacity` (never "admit untracked").
//! Each shard knows a time before which none of its entries expires, so a full shard is walked
//! only once an entry in it may have expired, not again for every new key it refuses.
//!
//! Why this map is hand-written while the deny cache and the lease holdings use `dashmap`: a
//! decision must hold every key of the request at once, so that deciding and writing them all
//! is one atomic step. A concurrent map's API locks one key (one shard) per call, and holding two
//! of its guards from one thread can deadlock on a shared shard; its raw shard API is unstable
//! and would leave us writing this locking anyway. So the shards are plain `Mutex<HashMap>`s,
//! locked in ascending order, deduplicated: about twenty lines that carry the atomicity.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use smallvec::SmallVec;
use xxhash_rust::xxh3::xxh3_64;

use super::admin::{AdminBook, AdminTables, Credited, Listed, Put, QuotaStore, Restored};
use super::algorithm::{self, Algorithm, Change, Settled, State, Write};
use super::backend::{Backend, Limiter, Readiness, ReleaseSlots, SettleUnits, Settlement};
use super::clock::Clock;
use super::decision::{Decision, Statuses};
use super::error::LimiterError;
use super::limit::LIMITS_INLINE;
use super::pairs::{paired_mut, Mismatch};
use super::request::{Entry, LimitRequest};
use super::status::LimitStatus;

const SHARDS: usize = 64;

/// Keys the in-process backend tracks at most, unless told otherwise.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// One key's state and when it becomes equivalent to absent.
struct Record {
    state: State,
    expires_at_us: i64,
}

/// One shard's keys, and a time before which none of them expires.
struct Shard {
    records: HashMap<Box<[u8]>, Record>,
    /// No record expires before this: a lower bound, lowered by every store and made exact by
    /// each sweep (a removal leaves it a bound). A full shard is not walked while `now` is below
    /// it, since nothing in it could be swept.
    expiry_floor_us: i64,
}

impl Shard {
    fn new() -> Shard {
        Shard {
            records: HashMap::new(),
            expiry_floor_us: i64::MAX,
        }
    }

    /// Drops the records expired at `now_us`, if any may have: the walk is skipped while the
    /// floor says none has.
    fn sweep(&mut self, now_us: i64) {
        if now_us < self.expiry_floor_us {
            return;
        }
        let mut floor = i64::MAX;
        self.records.retain(|_, record| {
            let alive = record.expires_at_us > now_us;
            if alive {
                floor = floor.min(record.expires_at_us);
            }
            alive
        });
        self.expiry_floor_us = floor;
    }

    /// Stores `write` as the state of `key`, allocating the key only on its first sighting;
    /// the floor comes down to its expiry if that is sooner.
    fn store(&mut self, key: &[u8], Write { state, ttl_us }: Write, now_us: i64) {
        let record = Record {
            state,
            expires_at_us: now_us + ttl_us,
        };
        self.expiry_floor_us = self.expiry_floor_us.min(record.expires_at_us);
        match self.records.get_mut(key) {
            Some(existing) => *existing = record,
            None => {
                self.records.insert(Box::from(key), record);
            }
        }
    }
}

/// The locked shards of one request, and per key the index of its shard's guard.
type Guards<'a> = SmallVec<[MutexGuard<'a, Shard>; LIMITS_INLINE]>;
/// Each entry of a call with the guard its key's shard is under, and what it would write.
type Steps<'r, 'e> = SmallVec<[Step<'r, 'e>; LIMITS_INLINE]>;

/// One entry of a call, as the in-process limiter works it.
struct Step<'r, 'e> {
    entry: &'r Entry<'e>,
    /// Which of the call's guards holds the entry's shard.
    slot: usize,
    /// What the entry's limit writes if every limit allows.
    write: Option<Write>,
}

pub struct LocalLimiter {
    shards: Box<[Mutex<Shard>]>,
    clock: Arc<dyn Clock>,
    shard_capacity: usize,
    max_keys: usize,
    /// The admin API's credit ids and overrides (`admin/`).
    book: Mutex<AdminBook>,
}

impl LocalLimiter {
    /// A limiter that tracks at most about `max_keys` live keys.
    pub fn new(clock: Arc<dyn Clock>, max_keys: usize) -> LocalLimiter {
        LocalLimiter {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            clock,
            shard_capacity: max_keys.div_ceil(SHARDS).max(1),
            max_keys,
            book: Mutex::new(AdminBook::default()),
        }
    }

    fn shard_of(key: &[u8]) -> usize {
        (xxh3_64(key) % SHARDS as u64) as usize
    }

    /// Locks the shards of the entries' keys in ascending order; returns the guards and, per
    /// entry, the index of its guard.
    fn lock<'a, 'r, 'e>(&'a self, entries: &'r [Entry<'e>]) -> (Guards<'a>, Steps<'r, 'e>) {
        // Each step's slot is first its shard, then the index of that shard's guard.
        let mut steps: Steps<'r, 'e> = entries
            .iter()
            .map(|entry| Step {
                entry,
                slot: Self::shard_of(entry.key),
                write: None,
            })
            .collect();
        let mut order: SmallVec<[usize; LIMITS_INLINE]> = steps.iter().map(|s| s.slot).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order
            .iter()
            .map(|&id| {
                self.shards[id]
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
            })
            .collect();
        for step in &mut steps {
            step.slot = order.binary_search(&step.slot).unwrap_or(0);
        }
        (guards, steps)
    }

    /// Decides at an explicit time; `check` uses the injected clock.
    pub fn check_at(
        &self,
        request: &LimitRequest<'_>,
        now_us: i64,
    ) -> Result<Decision, LimiterError> {
        let (mut guards, mut steps) = self.lock(request.entries);
        let statuses = decide_each(request, &guards, &mut steps, now_us);
        let decision = request.decision(statuses);
        if !decision.allowed() {
            let statuses = peeked(request, &guards, &steps, decision, now_us)?;
            return Ok(request.decision(statuses));
        }
        // Make room for new keys before writing anything, so a full map fails atomically.
        self.make_room(&mut guards, &steps, now_us)?;
        write_each(&mut guards, steps, decision, now_us)
    }

    /// Sweeps the expired state of each full shard a new key goes to; fails if one stays full.
    fn make_room(
        &self,
        guards: &mut Guards<'_>,
        steps: &Steps<'_, '_>,
        now_us: i64,
    ) -> Result<(), LimiterError> {
        for step in steps {
            let shard = &mut guards[step.slot];
            let full = |shard: &Shard| shard.records.len() >= self.shard_capacity;
            if full(shard) && !shard.records.contains_key(step.entry.key) {
                shard.sweep(now_us);
                if full(shard) {
                    return Err(LimiterError::LocalCapacity(self.max_keys));
                }
            }
        }
        Ok(())
    }

    /// Frees the slots `request.id` holds in the concurrency limits of `request`.
    pub fn release_now(&self, request: &LimitRequest<'_>) {
        let (mut guards, steps) = self.lock(request.entries);
        for Step { entry, slot, .. } in steps {
            if let Algorithm::Concurrency { .. } = entry.limit.algorithm {
                if let Some(record) = guards[slot].records.get_mut(entry.key) {
                    algorithm::release(&mut record.state, request.id);
                }
            }
        }
    }

    /// Settles `change` on `key` at an explicit time (see [`Algorithm::settle`]); whether the
    /// key changed. A charge lands on a key without state too (a response dearer than its
    /// estimate).
    pub fn settle_at(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        change: Change,
        now_us: i64,
    ) -> bool {
        let mut shard = self.shards[Self::shard_of(key)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match algorithm.settle(live(&shard, key, now_us), now_us, change) {
            Settled::Unchanged => false,
            Settled::Clear => {
                shard.records.remove(key);
                true
            }
            Settled::Store(write) => {
                shard.store(key, write, now_us);
                true
            }
        }
    }

    /// The state of `key` at `now_us`, if it has one: what a backend stores, for tests.
    pub fn state_at(&self, key: &[u8], now_us: i64) -> Option<State> {
        live(&self.shard(key), key, now_us).cloned()
    }

    fn shard(&self, key: &[u8]) -> MutexGuard<'_, Shard> {
        self.shards[Self::shard_of(key)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn book(&self) -> MutexGuard<'_, AdminBook> {
        self.book
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Gives `units` back to `key` as far as it used them (`lua/admin/credit.lua`): the
    /// refund of units taken at the key's own mark.
    fn credit_now(&self, algorithm: &Algorithm, key: &[u8], units: u64, now_us: i64) -> Credited {
        let mut shard = self.shard(key);
        let state = live(&shard, key, now_us);
        // A count already at 0 has nothing used to credit (as `lua/admin/credit.lua` says).
        if let Some(State::Window { count: 0, .. } | State::Period { count: 0, .. }) = state {
            return Credited::NothingUsed;
        }
        let mark_us = state.map_or(0, State::mark_us);
        match algorithm.refund(state, now_us, units, mark_us) {
            Settled::Unchanged => Credited::NothingUsed,
            Settled::Clear => {
                shard.records.remove(key);
                Credited::Changed
            }
            Settled::Store(write) => {
                shard.store(key, write, now_us);
                Credited::Changed
            }
        }
    }

    /// Live and expired-but-unswept entries, for tests and metrics.
    pub fn tracked_keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .records
                    .len()
            })
            .sum()
    }
}

/// The state of `key` in `shard`, unless it has expired (then it is as good as absent).
fn live<'m>(shard: &'m Shard, key: &[u8], now_us: i64) -> Option<&'m State> {
    shard
        .records
        .get(key)
        .filter(|e| e.expires_at_us > now_us)
        .map(|e| &e.state)
}

/// What each limit says of the request; what it would write if all allow goes into its step.
fn decide_each(
    request: &LimitRequest<'_>,
    guards: &Guards<'_>,
    steps: &mut Steps<'_, '_>,
    now_us: i64,
) -> Statuses {
    let mut statuses = Statuses::new();
    for step in steps.iter_mut() {
        let (entry, state) = (step.entry, live(&guards[step.slot], step.entry.key, now_us));
        let (status, write) = entry
            .limit
            .algorithm
            .decide(state, now_us, entry.cost, request.id);
        statuses.push(status);
        step.write = write;
    }
    statuses
}

/// A denied request consumes nothing: limits that would have allowed report their state as it
/// stands (a cost-0 peek), like lua/check.lua.
fn peeked(
    request: &LimitRequest<'_>,
    guards: &Guards<'_>,
    steps: &Steps<'_, '_>,
    decision: Decision,
    now_us: i64,
) -> Result<Statuses, Mismatch> {
    let mut statuses = decision.statuses;
    // One status per step: `decide_each` made them so.
    for (step, status) in paired_mut("local steps and statuses", steps, &mut statuses)? {
        if status.allowed {
            let state = live(&guards[step.slot], step.entry.key, now_us);
            let peek = step
                .entry
                .limit
                .algorithm
                .decide(state, now_us, 0, request.id)
                .0;
            *status = LimitStatus {
                delay_ms: 0,
                mark_us: 0,
                ..peek
            };
        }
    }
    Ok(statuses)
}

/// Stores what every limit of an allowed request writes; each status gets its key's mark.
fn write_each(
    guards: &mut Guards<'_>,
    steps: Steps<'_, '_>,
    mut decision: Decision,
    now_us: i64,
) -> Result<Decision, LimiterError> {
    // One status per step: `decide_each` made them so.
    let at = "local steps and statuses";
    for (step, status) in paired_mut(at, &steps, &mut decision.statuses)? {
        if let Some(write) = &step.write {
            status.mark_us = write.state.mark_us();
        }
    }
    for step in steps {
        if let Some(write) = step.write {
            guards[step.slot].store(step.entry.key, write, now_us);
        }
    }
    Ok(decision)
}

impl Limiter for LocalLimiter {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        self.check_at(request, self.clock.now_us())
    }
}

impl ReleaseSlots for LocalLimiter {
    async fn release(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError> {
        self.release_now(request);
        Ok(())
    }
}

impl SettleUnits for LocalLimiter {
    async fn settle(&self, settlements: &[Settlement<'_>]) -> Result<u64, LimiterError> {
        let now_us = self.clock.now_us();
        let changed = settlements
            .iter()
            .filter(|settlement| {
                self.settle_at(
                    settlement.algorithm,
                    settlement.key,
                    settlement.change,
                    now_us,
                )
            })
            .count();
        Ok(changed as u64)
    }
}

impl QuotaStore for LocalLimiter {
    async fn reset(&self, keys: &[&[u8]]) -> Result<u64, LimiterError> {
        let now_us = self.clock.now_us();
        let mut existed = 0;
        for key in keys {
            let removed = self.shard(key).records.remove(*key);
            existed += u64::from(removed.is_some_and(|r| r.expires_at_us > now_us));
        }
        Ok(existed)
    }

    async fn credit(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        units: u64,
        id: &[u8],
    ) -> Result<Credited, LimiterError> {
        let now_us = self.clock.now_us();
        if !self.book().remember_credit(key, id, now_us)? {
            return Ok(Credited::Repeated);
        }
        Ok(self.credit_now(algorithm, key, units, now_us))
    }

    async fn announce(&self, _tables: &AdminTables) -> Result<(), LimiterError> {
        self.book().epoch += 1;
        Ok(())
    }

    async fn epoch(&self, _tables: &AdminTables) -> Result<u64, LimiterError> {
        Ok(self.book().epoch)
    }

    async fn put_override(
        &self,
        _tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: std::time::Duration,
    ) -> Result<Put, LimiterError> {
        let now_us = self.clock.now_us();
        Ok(self.book().put_override(field, value, lifetime, now_us))
    }

    async fn restore_override(
        &self,
        _tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: std::time::Duration,
    ) -> Result<Restored, LimiterError> {
        let now_us = self.clock.now_us();
        Ok(self.book().restore_override(field, value, lifetime, now_us))
    }

    async fn delete_override(
        &self,
        _tables: &AdminTables,
        field: &str,
    ) -> Result<Option<String>, LimiterError> {
        Ok(self.book().delete_override(field, self.clock.now_us()))
    }

    async fn overrides(&self, _tables: &AdminTables) -> Result<Listed, LimiterError> {
        let mut book = self.book();
        let overrides = book.overrides(self.clock.now_us());
        Ok(Listed {
            epoch: book.epoch,
            overrides,
        })
    }
}

impl Backend for LocalLimiter {
    async fn readiness(&self) -> Readiness {
        Readiness::Ready
    }

    fn name(&self) -> &'static str {
        "local"
    }

    fn target(&self) -> &str {
        "this process"
    }

    async fn keep(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::clock::ManualClock;
    use crate::limiter::id::RequestId;
    use crate::limiter::limit::Limit;
    use crate::limiter::request::entries;
    use crate::limiter::testing::{asks, concurrency, gcra, limit, window};

    /// Checks `limits` at `now_us` with these keys and costs, as request `id`.
    fn check(
        limiter: &LocalLimiter,
        limits: &[Limit],
        keys: &[&[u8]],
        costs: &[u64],
        id: u128,
        now_us: i64,
    ) -> Result<Decision, LimiterError> {
        let asks = asks(keys, costs);
        let entries = entries(limits, &asks);
        let request = LimitRequest {
            id: RequestId(id),
            ..LimitRequest::new(&entries)
        };
        limiter.check_at(&request, now_us)
    }

    fn release(limiter: &LocalLimiter, limits: &[Limit], key: &[u8], id: u128) {
        let asks = asks(&[key], &[1]);
        let entries = entries(limits, &asks);
        limiter.release_now(&LimitRequest {
            id: RequestId(id),
            ..LimitRequest::new(&entries)
        });
    }

    #[test]
    fn a_denying_limit_consumes_nothing_from_the_others() {
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 1000);
        let limits = [limit("wide", gcra(10, 9)), limit("narrow", gcra(1, 1))];
        let keys: [&[u8]; 2] = [b"wide", b"narrow"];
        let allowed = (0..5)
            .filter(|_| {
                check(&limiter, &limits, &keys, &[1, 1], 0, 0)
                    .unwrap()
                    .allowed()
            })
            .count();
        assert_eq!(allowed, 2);
        // "wide" saw five requests but only the two admitted ones counted: 10 - 2 = 8 remain,
        // and denied requests report exactly that.
        let denied = check(&limiter, &limits, &keys, &[1, 1], 0, 0).unwrap();
        assert_eq!(
            (denied.denied_by, denied.statuses[0].remaining),
            (Some(1), 8)
        );
        let alone = check(&limiter, &limits[..1], &keys[..1], &[1], 0, 0).unwrap();
        assert_eq!(alone.statuses[0].remaining, 7);
    }

    #[test]
    fn concurrency_slots_are_released_by_id() {
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 1000);
        let limits = [limit("c", concurrency(1))];
        let admitted = |id| {
            check(&limiter, &limits, &[b"c"], &[1], id, 0)
                .unwrap()
                .allowed()
        };
        assert!(admitted(1));
        assert!(!admitted(2));
        release(&limiter, &limits, b"c", 2); // not a holder: no effect
        assert!(!admitted(3));
        release(&limiter, &limits, b"c", 1);
        assert!(admitted(4));
    }

    /// `count` keys that fall in one shard.
    fn same_shard_keys(count: usize) -> Vec<String> {
        let shard = LocalLimiter::shard_of(b"s0");
        (0..)
            .map(|i| format!("s{i}"))
            .filter(|key| LocalLimiter::shard_of(key.as_bytes()) == shard)
            .take(count)
            .collect()
    }

    #[test]
    fn a_full_shard_takes_a_new_key_as_soon_as_its_earliest_entry_expires() {
        // Two keys per shard: one that lives an hour, one that lives about a second.
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 2 * SHARDS);
        let (hour, second) = ([limit("h", window(10))], [limit("s", gcra(1, 0))]);
        let keys = same_shard_keys(4);
        let key = |i: usize| [keys[i].as_bytes()];
        let admitted = |limits: &[Limit], i: usize, now_us: i64| {
            let checked = check(&limiter, limits, &key(i), &[1], 0, now_us);
            match checked {
                Ok(decision) => decision.allowed(),
                Err(LimiterError::LocalCapacity(_)) => false,
                Err(other) => panic!("unexpected {other}"),
            }
        };
        assert!(admitted(&hour, 0, 0) && admitted(&second, 1, 0));
        let expiry = |i: usize| {
            let shard = limiter.shard(keys[i].as_bytes());
            shard.records[keys[i].as_bytes()].expires_at_us
        };
        // Full, and nothing in it has expired until the second's key does.
        let expires = expiry(1);
        assert!(!admitted(&second, 2, expires - 1));
        // Its room goes to the new key at once (the sweep leaves the hour's key, and the new
        // key, stored after it, brings the shard's floor down again).
        assert!(admitted(&second, 2, expires));
        let expires = expiry(2);
        assert!(!admitted(&second, 3, expires - 1));
        assert!(admitted(&second, 3, expires));
        assert_eq!(limiter.tracked_keys(), 2);
    }

    #[test]
    fn full_map_sweeps_expired_state_then_refuses_rather_than_admitting_untracked() {
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), SHARDS); // one key per shard
        let limits = [limit("l", gcra(1, 0))];
        let mut refused = 0;
        for i in 0..(SHARDS * 4) {
            let key = format!("k{i}");
            match check(&limiter, &limits, &[key.as_bytes()], &[1], 0, 0) {
                Ok(d) => assert!(d.allowed()),
                Err(LimiterError::LocalCapacity(_)) => refused += 1,
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert!(refused > 0);
        // Two seconds later every state has expired: new keys fit again.
        let after = (0..SHARDS)
            .filter(|i| {
                let key = format!("n{i}");
                check(&limiter, &limits, &[key.as_bytes()], &[1], 0, 2_000_000).is_ok()
            })
            .count();
        assert!(after > 0);
        assert!(limiter.tracked_keys() <= SHARDS);
    }
}
