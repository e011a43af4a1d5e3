//! The limiter seam. Deciding is the one trait every backend and decorator implements;
//! giving back concurrency slots and refunding leased units are separate capabilities that
//! only the backends holding state implement, and the policy or the lease keeper calls them
//! on the backend directly (decorators never forward them).

use async_trait::async_trait;

use super::algorithm::Algorithm;
use super::decision::Decision;
use super::error::LimiterError;
use super::request::LimitRequest;

/// Decides every limit of a request in one atomic step: nothing is consumed unless every
/// enforced limit allows.
#[async_trait]
pub trait Limiter: Send + Sync {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError>;
}

/// Gives back the concurrency slots a request took (once its response is finished or its
/// client has gone). Entries of other algorithms are ignored.
#[async_trait]
pub trait ReleaseSlots: Send + Sync {
    async fn release(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError>;
}

/// Gives back `units` of a key that were taken and not spent (leases, shaped requests whose
/// client left), quoting the `mark_us` the taking call replied.
#[async_trait]
pub trait RefundUnits: Send + Sync {
    async fn refund(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        units: u64,
        mark_us: i64,
    ) -> Result<(), LimiterError>;
}

/// Whether a backend can decide right now, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    Unavailable(String),
}

/// What holds the limits' state (Redis, or this process): its name and whether it answers.
#[async_trait]
pub trait Backend: Send + Sync {
    async fn readiness(&self) -> Readiness;

    /// `redis` or `local`, for logs, metrics and `/readyz`.
    fn name(&self) -> &'static str;
}
