//! The limiter seam. Deciding is the one trait every backend and decorator implements;
//! giving back concurrency slots and settling units (refunds, response-priced charges) are
//! separate capabilities that only the backends holding state implement, and the policy or the lease keeper calls them
//! on the backend directly (decorators never forward them).
//!
//! The traits are native `async fn`s (their futures declared `Send`), dispatched statically:
//! decorators are generic over what they wrap and the engine is an enum of the two assemblies
//! (`engine.rs`), so deciding boxes no future. An `Arc` of a limiter is a limiter too, for a
//! backend shared between an engine's layers.

use std::future::Future;
use std::sync::Arc;

use super::algorithm::{Algorithm, Change};
use super::decision::Decision;
use super::error::LimiterError;
use super::request::LimitRequest;

/// Decides every limit of a request in one atomic step: nothing is consumed unless every
/// enforced limit allows.
pub trait Limiter: Send + Sync {
    fn check(
        &self,
        request: &LimitRequest<'_>,
    ) -> impl Future<Output = Result<Decision, LimiterError>> + Send;

    /// Units of `key` this gateway holds unspent (leases, `leased/`): counted as used where
    /// the limit is counted, still this gateway's to admit. None for a limiter that holds none.
    fn held_units(&self, _key: &[u8]) -> u64 {
        0
    }
}

/// Gives back the concurrency slots a request took (once its response is finished or its
/// client has gone). Entries of other algorithms are ignored.
pub trait ReleaseSlots: Send + Sync {
    fn release(
        &self,
        request: &LimitRequest<'_>,
    ) -> impl Future<Output = Result<(), LimiterError>> + Send;
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
/// (responses dearer than their estimate). GCRA, fixed-window and (giving back) calendar keys
/// only. Answers how many keys it changed: a give-back whose mark no longer holds changes none.
pub trait SettleUnits: Send + Sync {
    fn settle(
        &self,
        settlements: &[Settlement<'_>],
    ) -> impl Future<Output = Result<u64, LimiterError>> + Send;
}

/// Whether a backend can decide right now, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    Unavailable(String),
}

/// What holds the limits' state (Redis, or this process): its name and whether it answers.
pub trait Backend: Send + Sync {
    fn readiness(&self) -> impl Future<Output = Readiness> + Send;

    /// `redis` or `local`, for logs, metrics and `/readyz`.
    fn name(&self) -> &'static str;

    /// Where the state is, for an operator reading a log line or `/readyz`: `redis at
    /// 127.0.0.1:6379`, `redis cluster seeded by ...`, `this process`. No password.
    fn target(&self) -> &str;

    /// Keeps its connections usable while nothing uses them, for as long as the runtime it is
    /// called on runs (a backend without connections returns at once).
    fn keep(&self) -> impl Future<Output = ()> + Send;
}

impl<L: Limiter> Limiter for Arc<L> {
    fn check(
        &self,
        request: &LimitRequest<'_>,
    ) -> impl Future<Output = Result<Decision, LimiterError>> + Send {
        L::check(self, request)
    }

    fn held_units(&self, key: &[u8]) -> u64 {
        L::held_units(self, key)
    }
}
