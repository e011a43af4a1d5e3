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
use xxhash_rust::xxh3::xxh3_64;

use super::algorithm::{State, Write};
use super::clock::Clock;
use super::{Decision, Limit, Limiter, LimiterError, Readiness};

const SHARDS: usize = 64;

struct Entry {
    state: State,
    expires_at_us: i64,
}

type Shard = HashMap<Box<[u8]>, Entry>;

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

    /// Decides at an explicit time; `check` uses the injected clock.
    pub fn check_at(
        &self,
        limits: &[Limit],
        keys: &[Vec<u8>],
        now_us: i64,
    ) -> Result<Decision, LimiterError> {
        if limits.len() != keys.len() {
            return Err(LimiterError::Reply(format!(
                "{} limits but {} keys",
                limits.len(),
                keys.len()
            )));
        }
        let shard_ids: Vec<usize> = keys.iter().map(|k| Self::shard_of(k)).collect();
        let mut order = shard_ids.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> = order
            .iter()
            .map(|&id| {
                (
                    id,
                    self.shards[id]
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()),
                )
            })
            .collect();
        let shard = |guards: &[(usize, MutexGuard<'_, Shard>)], id: usize| {
            guards.iter().position(|(g, _)| *g == id).unwrap_or(0)
        };

        let mut statuses = Vec::with_capacity(limits.len());
        let mut writes: Vec<Option<Write>> = Vec::with_capacity(limits.len());
        for ((limit, key), &id) in limits.iter().zip(keys).zip(&shard_ids) {
            let map = &guards[shard(&guards, id)].1;
            let state = map
                .get(key.as_slice())
                .filter(|e| e.expires_at_us > now_us)
                .map(|e| e.state);
            let (status, write) = limit.algorithm.decide(state, now_us, limit.cost);
            statuses.push(status);
            writes.push(write);
        }
        let decision = Decision::from_statuses(statuses);
        if !decision.allowed() {
            // Nothing is consumed: limits that would have allowed report their state as it
            // stands, like lua/check.lua.
            let mut statuses = decision.statuses;
            for (((status, limit), key), &id) in
                statuses.iter_mut().zip(limits).zip(keys).zip(&shard_ids)
            {
                if status.allowed {
                    let state = guards[shard(&guards, id)]
                        .1
                        .get(key.as_slice())
                        .filter(|e| e.expires_at_us > now_us)
                        .map(|e| e.state);
                    *status = limit.algorithm.decide(state, now_us, 0).0;
                }
            }
            return Ok(Decision::from_statuses(statuses));
        }

        // Make room for new keys before writing anything, so a full map fails atomically.
        for (key, &id) in keys.iter().zip(&shard_ids) {
            let slot = shard(&guards, id);
            let map = &mut guards[slot].1;
            if map.len() >= self.shard_capacity && !map.contains_key(key.as_slice()) {
                map.retain(|_, e| e.expires_at_us > now_us);
                if map.len() >= self.shard_capacity {
                    return Err(LimiterError::LocalCapacity(self.max_keys));
                }
            }
        }
        for ((key, &id), write) in keys.iter().zip(&shard_ids).zip(writes) {
            if let Some(Write { state, ttl_us }) = write {
                let slot = shard(&guards, id);
                let map = &mut guards[slot].1;
                let entry = Entry {
                    state,
                    expires_at_us: now_us + ttl_us,
                };
                match map.get_mut(key.as_slice()) {
                    Some(existing) => *existing = entry,
                    None => {
                        map.insert(key.clone().into_boxed_slice(), entry);
                    }
                }
            }
        }
        Ok(decision)
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
    async fn check(&self, limits: &[Limit], keys: &[Vec<u8>]) -> Result<Decision, LimiterError> {
        self.check_at(limits, keys, self.clock.now_us())
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
    use crate::limiter::Algorithm;

    fn limit(name: &str, algorithm: Algorithm) -> Limit {
        Limit {
            name: name.into(),
            algorithm,
            cost: 1,
            rate: parse_rate("1/s").unwrap(),
        }
    }

    fn gcra(count_per_s: u64, burst: u64) -> Algorithm {
        let emission_us = 1_000_000 / count_per_s;
        Algorithm::Gcra {
            emission_us,
            tolerance_us: emission_us * (burst + 1),
        }
    }

    #[test]
    fn a_denying_limit_consumes_nothing_from_the_others() {
        let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 1000);
        let limits = [limit("wide", gcra(10, 9)), limit("narrow", gcra(1, 1))];
        let keys = vec![b"wide".to_vec(), b"narrow".to_vec()];
        let allowed = (0..5)
            .filter(|_| limiter.check_at(&limits, &keys, 0).unwrap().allowed())
            .count();
        assert_eq!(allowed, 2);
        // "wide" saw five requests but only the two admitted ones counted: 10 - 2 = 8 remain,
        // and denied requests report exactly that.
        let denied = limiter.check_at(&limits, &keys, 0).unwrap();
        assert_eq!(
            (denied.denied_by, denied.statuses[0].remaining),
            (Some(1), 8)
        );
        let alone = limiter.check_at(&limits[..1], &keys[..1], 0).unwrap();
        assert_eq!(alone.statuses[0].remaining, 7);
    }

    #[test]
    fn full_map_sweeps_expired_state_then_refuses_rather_than_admitting_untracked() {
        let clock = Arc::new(ManualClock::new(0));
        let limiter = LocalLimiter::new(clock, SHARDS); // one key per shard
        let limits = [limit("l", gcra(1, 0))];
        let mut refused = 0;
        for i in 0..(SHARDS * 4) {
            let key = vec![format!("k{i}").into_bytes()];
            match limiter.check_at(&limits, &key, 0) {
                Ok(d) => assert!(d.allowed()),
                Err(LimiterError::LocalCapacity(_)) => refused += 1,
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert!(refused > 0);
        // Two seconds later every state has expired: new keys fit again.
        let after = (0..SHARDS)
            .filter(|i| {
                limiter
                    .check_at(&limits, &[format!("n{i}").into_bytes()], 2_000_000)
                    .is_ok()
            })
            .count();
        assert!(after > 0);
        assert!(limiter.tracked_keys() <= SHARDS);
    }
}
