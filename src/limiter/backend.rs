//! The limiter seam. Deciding is the one trait every backend and decorator implements;
//! giving back concurrency slots and settling units (refunds, response-priced charges) are
//! separate capabilities that only the backends holding state implement, and the policy or the lease keeper calls them
//! on the backend directly (decorators never forward them).

use async_trait::async_trait;

use super::algorithm::{Algorithm, Change};
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

/// One key's settlement: units a decision took that go back, or units spent beyond them.
#[derive(Debug, Clone, Copy)]
pub struct Settlement<'a> {
    pub algorithm: &'a Algorithm,
    pub key: &'a [u8],
    pub change: Change,
}

/// Settles units earlier decisions took, on the keys of one request, in one step: gives back
/// what was not spent (leases, shaped requests whose client left, responses cheaper than their
/// estimate), quoting the mark the taking call replied, or charges what was spent beyond
/// (responses dearer than their estimate). GCRA and fixed-window keys only.
#[async_trait]
pub trait SettleUnits: Send + Sync {
    async fn settle(&self, settlements: &[Settlement<'_>]) -> Result<(), LimiterError>;
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
