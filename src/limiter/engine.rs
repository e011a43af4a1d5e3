//! The configured limiter, assembled: what decides (the backend behind its decorators), what
//! gives concurrency slots back, and what says whether the backend answers.
//!
//! Redis: `Leased(Guarded(RedisLimiter))` decides, so units a gateway holds are spent even while
//! a denial of their key is cached, and the deny cache and breaker keep floods and outages away
//! from Redis; releases and settlements (a request's end, a lease's unspent units) go to
//! `RedisLimiter` through the same breaker, so during an outage they fail at once instead of each
//! waiting out the deadline. In-process: `LocalLimiter` is all three.
//!
//! The engine is an enum of the two assemblies, each a concrete type, so a decision is one match
//! and no boxed future: the policy calls it through the seam's traits.

use std::sync::Arc;
use std::time::Duration;

use super::admin::{AdminTables, Credited, Listed, Put, QuotaStore, Restored};
use super::algorithm::Algorithm;
use super::backend::{Backend, Limiter, Readiness, ReleaseSlots, SettleUnits, Settlement};
use super::clock::Clock;
use super::decision::Decision;
use super::error::LimiterError;
use super::guard::{BehindBreaker, BreakerState, GuardMeters, Guarded};
use super::leased::{LeaseMeters, Leased};
use super::local::LocalLimiter;
use super::redis::coalesce::Coalescing;
use super::redis::persistence::Persistence;
use super::redis::script::Algorithms;
use super::redis::topology::{RedisAuth, Topology};
use super::redis::RedisLimiter;
use super::request::LimitRequest;

/// What decides in Redis: the backend behind its deny cache and breaker, then its leases (whose
/// unspent units go back through the breaker).
pub type RedisDecider = Leased<Guarded<Arc<RedisLimiter>>, BehindBreaker<RedisLimiter>>;

/// The configured limiter as the policy uses it.
#[derive(Clone)]
pub enum Engine {
    /// Limits in this process only: the in-process backend decides, releases and settles.
    Local(Arc<LocalLimiter>),
    /// Limits in Redis.
    Redis(Arc<RedisEngine>),
}

/// The Redis assembly: `decide` decides; releases and settlements go to the backend through
/// `ends` (the breaker `decide` shares); readiness asks `backend` itself.
pub struct RedisEngine {
    pub decide: RedisDecider,
    pub ends: Arc<BehindBreaker<RedisLimiter>>,
    pub backend: Arc<RedisLimiter>,
}

impl Engine {
    /// Limits in this process only.
    pub fn local(limiter: Arc<LocalLimiter>) -> Engine {
        Engine::Local(limiter)
    }

    /// Limits in Redis: validates the addresses, connects nothing yet.
    pub fn redis(
        topology: &Topology,
        auth: &RedisAuth,
        deadline: Duration,
        clock: Arc<dyn Clock>,
        guard_meters: GuardMeters,
        lease_meters: LeaseMeters,
        coalescing: Coalescing,
    ) -> Result<Engine, redis::RedisError> {
        let backend = Arc::new(RedisLimiter::new(topology, auth, deadline, coalescing)?);
        let guarded = Guarded::new(
            Arc::clone(&backend),
            Some(&topology.describe()),
            Arc::clone(&clock),
            guard_meters,
        );
        let breaker = guarded.breaker().expect("a Redis guard has a breaker");
        let ends = Arc::new(BehindBreaker::new(Arc::clone(&backend), breaker));
        let decide = Leased::new(guarded, Arc::clone(&ends), clock, lease_meters);
        Ok(Engine::Redis(Arc::new(RedisEngine {
            decide,
            ends,
            backend,
        })))
    }

    /// The configuration in force uses `algorithms`: Redis loads their decision scripts
    /// before readiness says ready (`redis/warm.rs`); the in-process backend runs none.
    pub fn want_scripts(&self, algorithms: Algorithms) {
        if let Engine::Redis(redis) = self {
            redis.backend.want_scripts(algorithms);
        }
    }

    /// Waits, at most `bound`, until every decision script wanted is loaded: whether it is.
    pub async fn scripts_loaded_within(&self, bound: Duration) -> bool {
        match self {
            Engine::Local(_) => true,
            Engine::Redis(redis) => redis.backend.scripts_loaded_within(bound).await,
        }
    }

    /// Reads what Redis keeps across a restart (every master), and keeps the reading; `None`
    /// in-process (nothing outlives the process).
    pub async fn check_persistence(&self) -> Option<Result<Arc<Persistence>, LimiterError>> {
        match self {
            Engine::Local(_) => None,
            Engine::Redis(redis) => Some(redis.backend.persistence().await),
        }
    }

    /// What Redis keeps across a restart, as last read.
    pub fn persistence(&self) -> Option<Arc<Persistence>> {
        match self {
            Engine::Local(_) => None,
            Engine::Redis(redis) => redis.backend.last_persistence(),
        }
    }

    /// Forgets every denial the deny cache holds: a reset, credit or override elsewhere may
    /// have made them wrong (`admin/`).
    pub fn forget_denials(&self) {
        if let Engine::Redis(redis) = self {
            redis.decide.inner().forget_denials();
        }
    }

    /// The state of the circuit breaker in front of Redis; `None` in-process (no breaker).
    pub fn breaker_state(&self) -> Option<BreakerState> {
        match self {
            Engine::Redis(redis) => redis.decide.inner().breaker().map(|b| b.state()),
            Engine::Local(_) => None,
        }
    }

    /// The backend's name (`redis`, `local`), for logs, metrics and `/readyz`.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Local(local) => local.name(),
            Engine::Redis(redis) => redis.backend.name(),
        }
    }
}

impl Limiter for Engine {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        match self {
            Engine::Local(local) => local.check(request).await,
            Engine::Redis(redis) => redis.decide.check(request).await,
        }
    }

    fn held_units(&self, key: &[u8]) -> u64 {
        match self {
            Engine::Local(_) => 0,
            Engine::Redis(redis) => redis.decide.held_units(key),
        }
    }
}

impl ReleaseSlots for Engine {
    async fn release(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError> {
        match self {
            Engine::Local(local) => local.release(request).await,
            Engine::Redis(redis) => redis.ends.release(request).await,
        }
    }
}

impl SettleUnits for Engine {
    async fn settle(&self, settlements: &[Settlement<'_>]) -> Result<u64, LimiterError> {
        match self {
            Engine::Local(local) => local.settle(settlements).await,
            Engine::Redis(redis) => redis.ends.settle(settlements).await,
        }
    }
}

/// Admin writes go to the backend itself, past the deny cache and the breaker: an operator's
/// write is tried, and its error said, even while decisions are kept away from Redis.
impl QuotaStore for Engine {
    async fn reset(&self, keys: &[&[u8]]) -> Result<u64, LimiterError> {
        match self {
            Engine::Local(local) => local.reset(keys).await,
            Engine::Redis(redis) => redis.backend.reset(keys).await,
        }
    }

    async fn credit(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        units: u64,
        id: &[u8],
    ) -> Result<Credited, LimiterError> {
        match self {
            Engine::Local(local) => local.credit(algorithm, key, units, id).await,
            Engine::Redis(redis) => redis.backend.credit(algorithm, key, units, id).await,
        }
    }

    async fn announce(&self, tables: &AdminTables) -> Result<(), LimiterError> {
        match self {
            Engine::Local(local) => local.announce(tables).await,
            Engine::Redis(redis) => redis.backend.announce(tables).await,
        }
    }

    async fn epoch(&self, tables: &AdminTables) -> Result<u64, LimiterError> {
        match self {
            Engine::Local(local) => local.epoch(tables).await,
            Engine::Redis(redis) => redis.backend.epoch(tables).await,
        }
    }

    async fn put_override(
        &self,
        tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: Duration,
    ) -> Result<Put, LimiterError> {
        match self {
            Engine::Local(local) => local.put_override(tables, field, value, lifetime).await,
            Engine::Redis(redis) => {
                let backend = &redis.backend;
                backend.put_override(tables, field, value, lifetime).await
            }
        }
    }

    async fn restore_override(
        &self,
        tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: Duration,
    ) -> Result<Restored, LimiterError> {
        match self {
            Engine::Local(local) => local.restore_override(tables, field, value, lifetime).await,
            Engine::Redis(redis) => {
                let backend = &redis.backend;
                backend
                    .restore_override(tables, field, value, lifetime)
                    .await
            }
        }
    }

    async fn delete_override(
        &self,
        tables: &AdminTables,
        field: &str,
    ) -> Result<Option<String>, LimiterError> {
        match self {
            Engine::Local(local) => local.delete_override(tables, field).await,
            Engine::Redis(redis) => redis.backend.delete_override(tables, field).await,
        }
    }

    async fn overrides(&self, tables: &AdminTables) -> Result<Listed, LimiterError> {
        match self {
            Engine::Local(local) => local.overrides(tables).await,
            Engine::Redis(redis) => redis.backend.overrides(tables).await,
        }
    }
}

impl Backend for Engine {
    async fn readiness(&self) -> Readiness {
        match self {
            Engine::Local(local) => local.readiness().await,
            Engine::Redis(redis) => redis.backend.readiness().await,
        }
    }

    fn name(&self) -> &'static str {
        Engine::name(self)
    }

    fn target(&self) -> &str {
        match self {
            Engine::Local(local) => local.target(),
            Engine::Redis(redis) => redis.backend.target(),
        }
    }

    async fn keep(&self) {
        match self {
            Engine::Local(local) => local.keep().await,
            Engine::Redis(redis) => redis.backend.keep().await,
        }
    }
}
