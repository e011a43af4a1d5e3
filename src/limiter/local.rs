//! In-process backend: the same algorithms as the Lua scripts, for a single gateway.
//!
//! State lives in a sharded map keyed by the same key bytes the Redis backend uses. A request
//! locks the shards of its keys in ascending order (no deadlock), decides every limit, and
//! writes only if all allow, exactly like `lua/check.lua`. Memory is bounded: an entry whose
//! state has expired is equivalent to absent and is swept when a shard fills up; when a shard
//! is full of live state, the request fails with `LocalCapacity` (never "admit untracked").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use smallvec::SmallVec;
use xxhash_rust::xxh3::xxh3_64;

use super::algorithm::{self, Refund, State, Write};
use super::clock::Clock;
use super::{
    Algorithm, Decision, Key, LimitRequest, LimitStatus, Limiter, LimiterError, Readiness,
    Statuses, LIMITS_INLINE,
};

const SHARDS: usize = 64;

struct Entry {
    state: State,
    expires_at_us: i64,
}

type Shard = HashMap<Box<[u8]>, Entry>;
/// The locked shards of one request, and per key the index of its shard's guard.
type Guards<'a> = SmallVec<[MutexGuard<'a, Shard>; LIMITS_INLINE]>;
type Slots = SmallVec<[usize; LIMITS_INLINE]>;

pub struct LocalLimiter {
    shards: Box<[Mutex<Shard>]>,
    clock: Arc<dyn Clock>,
    shard_capacity: usize,
    max_keys: usize,
}

impl LocalLimiter {
    /// A limiter that tracks at most about `max_keys` live keys.
    pub fn new(clock: Arc<dyn Clock>, max_keys: usize) -> LocalLimiter {
        LocalLimiter {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            clock,
            shard_capacity: max_keys.div_ceil(SHARDS).max(1),
            max_keys,
        }
    }

    fn shard_of(key: &[u8]) -> usize {
        (xxh3_64(key) % SHARDS as u64) as usize
    }

    /// Locks the shards of `keys` in ascending order; returns the guards and, per key, the
    /// index of its guard.
    fn lock<'a>(&'a self, keys: &[Key]) -> (Guards<'a>, Slots) {
        let shard_ids: Slots = keys.iter().map(|k| Self::shard_of(k)).collect();
        let mut order = shard_ids.clone();
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
        let slots = shard_ids
            .iter()
            .map(|id| order.binary_search(id).unwrap_or(0))
            .collect();
        (guards, slots)
    }

    /// Decides at an explicit time; `check` uses the injected clock.
    pub fn check_at(
        &self,
        request: &LimitRequest<'_>,
        now_us: i64,
    ) -> Result<Decision, LimiterError> {
        let LimitRequest {
            limits,
            keys,
            costs,
            id,
            ..
        } = *request;
        if limits.len() != keys.len() || limits.len() != costs.len() {
            return Err(LimiterError::Reply(format!(
                "{} limits, {} keys, {} costs",
                limits.len(),
                keys.len(),
                costs.len()
            )));
        }
        let (mut guards, slots) = self.lock(keys);
        let live = |map: &Shard, key: &[u8]| {
            map.get(key)
                .filter(|e| e.expires_at_us > now_us)
                .map(|e| e.state.clone())
        };

        let mut statuses = Statuses::new();
        let mut writes: SmallVec<[Option<Write>; LIMITS_INLINE]> = SmallVec::new();
        for ((limit, key), (&slot, &cost)) in limits.iter().zip(keys).zip(slots.iter().zip(costs)) {
            let state = live(&guards[slot], key);
            let (status, write) = limit.algorithm.decide(state.as_ref(), now_us, cost, id);
            statuses.push(status);
            writes.push(write);
        }
        let decision = Decision::of(statuses, limits);
        if !decision.allowed() {
            // Nothing is consumed: limits that would have allowed report their state as it
            // stands (a cost-0 peek), like lua/check.lua.
            let mut statuses = decision.statuses;
            for ((status, limit), (key, &slot)) in
                statuses.iter_mut().zip(limits).zip(keys.iter().zip(&slots))
            {
                if status.allowed {
                    let state = live(&guards[slot], key);
                    let peek = limit.algorithm.decide(state.as_ref(), now_us, 0, id).0;
                    *status = LimitStatus {
                        delay_ms: 0,
                        ..peek
                    };
                }
            }
            return Ok(Decision::of(statuses, limits));
        }

        // Make room for new keys before writing anything, so a full map fails atomically.
        for (key, &slot) in keys.iter().zip(&slots) {
            let map = &mut guards[slot];
            if map.len() >= self.shard_capacity && !map.contains_key(key.as_slice()) {
                map.retain(|_, e| e.expires_at_us > now_us);
                if map.len() >= self.shard_capacity {
                    return Err(LimiterError::LocalCapacity(self.max_keys));
                }
            }
        }
        for ((key, &slot), write) in keys.iter().zip(&slots).zip(writes) {
            if let Some(Write { state, ttl_us }) = write {
                let entry = Entry {
                    state,
                    expires_at_us: now_us + ttl_us,
                };
                let map = &mut guards[slot];
                match map.get_mut(key.as_slice()) {
                    Some(existing) => *existing = entry,
                    None => {
                        map.insert(Box::from(key.as_slice()), entry);
                    }
                }
            }
        }
        Ok(decision)
    }

    /// Drops the leases `request.id` holds in the concurrency limits of `request`.
    pub fn release_now(&self, request: &LimitRequest<'_>) {
        let (mut guards, slots) = self.lock(request.keys);
        for ((limit, key), &slot) in request.limits.iter().zip(request.keys).zip(&slots) {
            if let Algorithm::Concurrency { .. } = limit.algorithm {
                if let Some(entry) = guards[slot].get_mut(key.as_slice()) {
                    algorithm::release(&mut entry.state, request.id);
                }
            }
        }
    }

    /// Gives back `units` of `key` at an explicit time (see [`Algorithm::refund`]).
    pub fn refund_at(&self, algorithm: &Algorithm, key: &[u8], units: u64, now_us: i64) {
        let mut shard = self.shards[Self::shard_of(key)]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let state = shard
            .get(key)
            .filter(|e| e.expires_at_us > now_us)
            .map(|e| &e.state);
        match algorithm.refund(state, now_us, units) {
            Refund::Unchanged => {}
            Refund::Clear => {
                shard.remove(key);
            }
            Refund::Store(Write { state, ttl_us }) => {
                if let Some(entry) = shard.get_mut(key) {
                    *entry = Entry {
                        state,
                        expires_at_us: now_us + ttl_us,
                    };
                }
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
                    .len()
            })
            .sum()
    }
}

#[async_trait]
impl Limiter for LocalLimiter {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        self.check_at(request, self.clock.now_us())
    }

    async fn release(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError> {
        self.release_now(request);
        Ok(())
    }

    async fn refund(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        units: u64,
    ) -> Result<(), LimiterError> {
        self.refund_at(algorithm, key, units, self.clock.now_us());
        Ok(())
    }

    async fn readiness(&self) -> Readiness {
        Readiness::Ready
    }

    fn backend(&self) -> &'static str {
        "local"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rate::parse_rate;
    use crate::limiter::clock::ManualClock;
    use crate::limiter::{Limit, RequestId};

    fn limit(name: &str, algorithm: Algorithm) -> Limit {
        Limit::new(name, algorithm, 1, parse_rate("1/s").unwrap())
    }

    fn gcra(count_per_s: u64, burst: u64) -> Algorithm {
        let emission_us = 1_000_000 / count_per_s;
        Algorithm::Gcra {
            emission_us,
            tolerance_us: emission_us * (burst + 1),
            max_delay_us: 0,
        }
    }

    fn request<'a>(
        limits: &'a [Limit],
        keys: &'a [Key],
        costs: &'a [u64],
        id: u128,
    ) -> LimitRequest<'a> {
        LimitRequest {
            limits,
            keys,
            costs,
            id: RequestId(id),
            deadline: None,
        }
    }

    #[test]
    fn a_denying_limit_consumes_nothing_from_the_others() {
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 1000);
        let limits = [limit("wide", gcra(10, 9)), limit("narrow", gcra(1, 1))];
        let keys = vec![Key::from_slice(b"wide"), Key::from_slice(b"narrow")];
        let both = request(&limits, &keys, &[1, 1], 0);
        let allowed = (0..5)
            .filter(|_| limiter.check_at(&both, 0).unwrap().allowed())
            .count();
        assert_eq!(allowed, 2);
        // "wide" saw five requests but only the two admitted ones counted: 10 - 2 = 8 remain,
        // and denied requests report exactly that.
        let denied = limiter.check_at(&both, 0).unwrap();
        assert_eq!(
            (denied.denied_by, denied.statuses[0].remaining),
            (Some(1), 8)
        );
        let alone = limiter
            .check_at(&request(&limits[..1], &keys[..1], &[1], 0), 0)
            .unwrap();
        assert_eq!(alone.statuses[0].remaining, 7);
    }

    #[test]
    fn concurrency_leases_are_released_by_id() {
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 1000);
        let limits = [limit(
            "c",
            Algorithm::Concurrency {
                max: 1,
                lease_us: 60_000_000,
            },
        )];
        let keys = vec![Key::from_slice(b"c")];
        assert!(limiter
            .check_at(&request(&limits, &keys, &[1], 1), 0)
            .unwrap()
            .allowed());
        assert!(!limiter
            .check_at(&request(&limits, &keys, &[1], 2), 0)
            .unwrap()
            .allowed());
        limiter.release_now(&request(&limits, &keys, &[1], 2)); // not a holder: no effect
        assert!(!limiter
            .check_at(&request(&limits, &keys, &[1], 3), 0)
            .unwrap()
            .allowed());
        limiter.release_now(&request(&limits, &keys, &[1], 1));
        assert!(limiter
            .check_at(&request(&limits, &keys, &[1], 4), 0)
            .unwrap()
            .allowed());
    }

    #[test]
    fn full_map_sweeps_expired_state_then_refuses_rather_than_admitting_untracked() {
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), SHARDS); // one key per shard
        let limits = [limit("l", gcra(1, 0))];
        let mut refused = 0;
        for i in 0..(SHARDS * 4) {
            let key = [Key::from_slice(format!("k{i}").as_bytes())];
            match limiter.check_at(&request(&limits, &key, &[1], 0), 0) {
                Ok(d) => assert!(d.allowed()),
                Err(LimiterError::LocalCapacity(_)) => refused += 1,
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert!(refused > 0);
        // Two seconds later every state has expired: new keys fit again.
        let after = (0..SHARDS)
            .filter(|i| {
                let key = [Key::from_slice(format!("n{i}").as_bytes())];
                limiter
                    .check_at(&request(&limits, &key, &[1], 0), 2_000_000)
                    .is_ok()
            })
            .count();
        assert!(after > 0);
        assert!(limiter.tracked_keys() <= SHARDS);
    }
}
