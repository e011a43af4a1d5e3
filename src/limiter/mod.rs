//! The limiter seam: what a limit is, what a decision says, and the `Limiter` trait that
//! decides *all* limits of a route at once, consuming only if every one of them allows.

pub mod algorithm;
pub mod clock;
pub mod local;
pub mod redis;
pub mod script;

use std::sync::Arc;

use async_trait::async_trait;

pub use algorithm::Algorithm;

use crate::config::rate::Rate;

/// One compiled limit of a route: algorithm and parameters, fixed at config load.
#[derive(Debug, Clone)]
pub struct Limit {
    pub name: Arc<str>,
    pub algorithm: Algorithm,
    /// Units one request consumes.
    pub cost: u64,
    /// The rate as configured, for the `RateLimit-Policy` header.
    pub rate: Rate,
}

impl Limit {
    /// The most units this limit admits at once (the `q` of `RateLimit-Policy`).
    pub fn quota(&self) -> u64 {
        self.rate.count.get()
    }
}

/// How one limit judged one request. Times are whole milliseconds, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitStatus {
    pub allowed: bool,
    /// Units still available after this request (if it was allowed) or now (if denied).
    pub remaining: u64,
    /// When a denied request could succeed; `None` means never (cost exceeds capacity).
    pub retry_after_ms: Option<u64>,
    /// When the limit is back to its full quota.
    pub reset_after_ms: u64,
}

/// The verdict on one request across all limits of its route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// One status per limit, in the route's order.
    pub statuses: Vec<LimitStatus>,
    /// The denying limit with the longest wait, if any limit denied.
    pub denied_by: Option<usize>,
}

impl Decision {
    pub fn from_statuses(statuses: Vec<LimitStatus>) -> Decision {
        let denied_by = statuses
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.allowed)
            .max_by_key(|(_, s)| s.retry_after_ms.unwrap_or(u64::MAX))
            .map(|(index, _)| index);
        Decision {
            statuses,
            denied_by,
        }
    }

    pub fn allowed(&self) -> bool {
        self.denied_by.is_none()
    }

    /// The longest wait among the denying limits: `Some(None)` when one of them can never pass.
    pub fn retry_after_ms(&self) -> Option<Option<u64>> {
        self.denied_by.map(|i| self.statuses[i].retry_after_ms)
    }
}

/// Why a limiter could not decide. `kind()` is the metric label.
#[derive(Debug, thiserror::Error)]
pub enum LimiterError {
    #[error("limiter call exceeded its {0} ms deadline")]
    Timeout(u64),
    #[error("redis connection failed: {0}")]
    Connection(String),
    #[error("redis replied with an error ({code}): {message}")]
    Server { code: &'static str, message: String },
    #[error("unexpected limiter reply: {0}")]
    Reply(String),
    #[error("in-process limiter is full ({0} keys tracked)")]
    LocalCapacity(usize),
}

impl LimiterError {
    /// Every value `kind()` can take, so metrics can show them at zero from the start.
    pub const KINDS: [&'static str; 13] = [
        "timeout",
        "connection",
        "noscript",
        "readonly",
        "loading",
        "busy",
        "oom",
        "crossslot",
        "cluster",
        "auth",
        "server",
        "reply",
        "local_capacity",
    ];

    pub fn kind(&self) -> &'static str {
        match self {
            LimiterError::Timeout(_) => "timeout",
            LimiterError::Connection(_) => "connection",
            LimiterError::Server { code, .. } => code,
            LimiterError::Reply(_) => "reply",
            LimiterError::LocalCapacity(_) => "local_capacity",
        }
    }
}

/// Whether the limiter's backend can decide right now, for `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    Unavailable(String),
}

/// Decides every limit of a route in one atomic step.
///
/// `keys[i]` is the state key of `limits[i]`. Nothing is consumed unless every limit allows.
#[async_trait]
pub trait Limiter: Send + Sync {
    async fn check(&self, limits: &[Limit], keys: &[Vec<u8>]) -> Result<Decision, LimiterError>;

    async fn readiness(&self) -> Readiness;

    /// `redis` or `local`, for logs and the `-t` summary.
    fn backend(&self) -> &'static str;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(allowed: bool, retry: Option<u64>) -> LimitStatus {
        LimitStatus {
            allowed,
            remaining: 0,
            retry_after_ms: retry,
            reset_after_ms: 0,
        }
    }

    #[test]
    fn the_longest_denial_names_the_decision() {
        let d = Decision::from_statuses(vec![
            status(true, Some(0)),
            status(false, Some(20)),
            status(false, Some(90)),
        ]);
        assert_eq!((d.denied_by, d.retry_after_ms()), (Some(2), Some(Some(90))));
        let never = Decision::from_statuses(vec![status(false, Some(5)), status(false, None)]);
        assert_eq!(never.retry_after_ms(), Some(None));
        assert!(Decision::from_statuses(vec![status(true, Some(0))]).allowed());
    }
}
