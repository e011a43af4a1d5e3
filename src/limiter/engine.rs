//! The configured limiter, assembled: what decides (the backend behind its decorators), what
//! gives concurrency slots back, and what says whether the backend answers.
//!
//! Redis: `Leased(Guarded(RedisLimiter))` decides, so units a gateway holds are spent even while
//! a denial of their key is cached, and the deny cache and breaker keep floods and outages away
//! from Redis; releases and settlements go to `RedisLimiter` itself. In-process: `LocalLimiter` is
//! all three.

use std::sync::Arc;
use std::time::Duration;

use super::backend::{Backend, Limiter, ReleaseSlots, SettleUnits};
use super::clock::Clock;
use super::coalesce::Coalescing;
use super::guard::{GuardMeters, Guarded};
use super::leased::{LeaseMeters, Leased};
use super::local::LocalLimiter;
use super::redis::RedisLimiter;
use super::topology::{RedisAuth, Topology};

/// The configured limiter as the policy uses it.
#[derive(Clone)]
pub struct Engine {
    /// Decides: the backend, behind its decorators.
    pub decide: Arc<dyn Limiter>,
    /// Gives concurrency slots back, straight to the backend.
    pub release: Arc<dyn ReleaseSlots>,
    /// Gives units back and charges overspent ones, straight to the backend.
    pub settle: Arc<dyn SettleUnits>,
    /// Names the backend and says whether it can decide now.
    pub backend: Arc<dyn Backend>,
}

impl Engine {
    /// Limits in this process only.
    pub fn local(limiter: Arc<LocalLimiter>) -> Engine {
        Engine {
            decide: limiter.clone(),
            release: limiter.clone(),
            settle: limiter.clone(),
            backend: limiter,
        }
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
        let redis = Arc::new(RedisLimiter::new(topology, auth, deadline, coalescing)?);
        let guarded = Arc::new(Guarded::new(
            redis.clone(),
            true,
            Arc::clone(&clock),
            guard_meters,
        ));
        let leased = Arc::new(Leased::new(guarded, redis.clone(), clock, lease_meters));
        Ok(Engine {
            decide: leased,
            release: redis.clone(),
            settle: redis.clone(),
            backend: redis,
        })
    }
}
