//! Builders for the limiter's unit tests: limits, algorithms and asks in one line each.

use std::time::Duration;

use super::algorithm::Algorithm;
use super::limit::Limit;
use super::rate::Rate;

pub use super::request::asks;

/// `count` per `seconds`.
pub fn rate(count: u64, seconds: u64) -> Rate {
    Rate::new(count, Duration::from_secs(seconds)).expect("a positive count")
}

/// A limit of cost 1 named `name`.
pub fn limit(name: &str, algorithm: Algorithm) -> Limit {
    Limit::new(name, algorithm, 1, rate(1, 1))
}

/// GCRA at `per_second` with `burst` extra units.
pub fn gcra(per_second: u64, burst: u64) -> Algorithm {
    let emission_us = 1_000_000 / per_second;
    Algorithm::Gcra {
        emission_us,
        tolerance_us: emission_us * (burst + 1),
        max_delay_us: 0,
    }
}

/// A fixed window of `limit` units per hour.
pub fn window(limit: u64) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window_us: 3_600_000_000,
    }
}

/// At most `max` in flight, each slot held for a minute at most.
pub fn concurrency(max: u64) -> Algorithm {
    Algorithm::Concurrency {
        max,
        slot_ttl_us: 60_000_000,
    }
}

/// A backend that cannot decide: every call fails with `error()` (failure modes, without a
/// server).
pub struct Unavailable(pub fn() -> super::error::LimiterError);

impl super::backend::Limiter for Unavailable {
    async fn check(
        &self,
        _: &super::request::LimitRequest<'_>,
    ) -> Result<super::decision::Decision, super::error::LimiterError> {
        Err((self.0)())
    }
}

impl super::backend::ReleaseSlots for Unavailable {
    async fn release(
        &self,
        _: &super::request::LimitRequest<'_>,
    ) -> Result<(), super::error::LimiterError> {
        Err((self.0)())
    }
}

impl super::backend::SettleUnits for Unavailable {
    async fn settle(
        &self,
        _: &[super::backend::Settlement<'_>],
    ) -> Result<u64, super::error::LimiterError> {
        Err((self.0)())
    }
}

impl super::backend::Backend for Unavailable {
    async fn readiness(&self) -> super::backend::Readiness {
        super::backend::Readiness::Unavailable("down".into())
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn target(&self) -> &str {
        "redis at test"
    }

    async fn keep(&self) {}
}
