//! The limiter seam: what a limit is, what a decision says, and the `Limiter` trait that
//! decides *all* limits of a route at once, consuming only if every one of them allows.

pub mod algorithm;
pub mod clock;
pub mod guard;
pub mod leased;
pub mod link;
pub mod local;
pub mod redis;
pub mod script;

use std::sync::Arc;

use async_trait::async_trait;
use smallvec::SmallVec;

pub use algorithm::{Algorithm, RequestId};

use crate::config::rate::Rate;

/// Units one request consumes from a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    /// Read from a request header: a whole number from 1 to `max`; `default` when absent.
    Header {
        name: http::header::HeaderName,
        max: u64,
        default: u64,
    },
}

/// One compiled limit of a route: algorithm and parameters, fixed at config load.
#[derive(Debug, Clone)]
pub struct Limit {
    pub name: Arc<str>,
    pub algorithm: Algorithm,
    pub cost: Cost,
    /// What the `RateLimit-Policy` header advertises: quota `q` per `w` seconds; `None` for
    /// limits that are not rates (concurrency).
    pub policy: Option<(u64, u64)>,
    /// Decided and counted, never enforced: a denial lets the request through (and consumes
    /// nothing from this limit), for rolling out new limits safely.
    pub shadow: bool,
    /// `mode: leased`: taken from Redis in leases and spent locally (`leased.rs`); `None`:
    /// exact, one decision in Redis per request.
    pub leased: Option<Leasing>,
}

/// How a leased limit is leased: at most `max_units` (L) held unspent per gateway and key, so
/// `instances × L` bounds what leasing can admit beyond the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leasing {
    pub max_units: u64,
}

impl Limit {
    /// A limit with a fixed cost and the policy implied by `rate` (tests and tools).
    pub fn new(name: &str, algorithm: Algorithm, cost: u64, rate: Rate) -> Limit {
        Limit {
            name: name.into(),
            algorithm,
            cost: Cost::Fixed(cost),
            policy: Some(policy_of(rate)),
            shadow: false,
            leased: None,
        }
    }
}

impl Limit {
    /// This limit as one of `instances` gateways' equal share, for enforcing in-process while
    /// Redis is away (see [`Algorithm::share`]).
    pub fn share(&self, instances: u64) -> Limit {
        Limit {
            algorithm: self.algorithm.share(instances),
            ..self.clone()
        }
    }
}

/// `(q, w)`: the rate's count per its period in whole seconds (rounded up, at least 1).
pub fn policy_of(rate: Rate) -> (u64, u64) {
    (
        rate.count.get(),
        (rate.period.as_millis() as u64).div_ceil(1000).max(1),
    )
}

/// Hands out request ids unique across gateways: a random 64-bit prefix per process and a
/// counter.
#[derive(Debug)]
pub struct RequestIds {
    prefix: u64,
    counter: std::sync::atomic::AtomicU64,
}

impl RequestIds {
    pub fn new() -> RequestIds {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seed = format!(
            "{nanos}:{}:{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        RequestIds {
            prefix: xxhash_rust::xxh3::xxh3_64(seed.as_bytes()),
            counter: Default::default(),
        }
    }

    pub fn next(&self) -> RequestId {
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RequestId((u128::from(self.prefix) << 64) | u128::from(n))
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds::new()
    }
}

/// Bytes a limiter key holds without a heap allocation: more than any key sluice builds from
/// names of ordinary length (`keys.rs`); longer ones spill to the heap and still work.
pub const KEY_INLINE: usize = 128;

/// One limiter key.
pub type Key = SmallVec<[u8; KEY_INLINE]>;

/// Appends `bytes` as lowercase hex: the digests in keys, the request id in script arguments.
pub fn push_hex(out: &mut impl Extend<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend(
        bytes
            .iter()
            .flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]),
    );
}

/// Limits a route can have without its per-request vectors touching the heap.
pub const LIMITS_INLINE: usize = 4;

/// The keys of one request, one per limit.
pub type Keys = SmallVec<[Key; LIMITS_INLINE]>;

/// One cost per limit.
pub type Costs = SmallVec<[u64; LIMITS_INLINE]>;

/// One status per limit.
pub type Statuses = SmallVec<[LimitStatus; LIMITS_INLINE]>;

/// Everything one limiter call needs: the route's limits, one key and one cost per limit, and
/// a request id unique across gateways (log members and leases).
#[derive(Debug, Clone, Copy)]
pub struct LimitRequest<'a> {
    pub limits: &'a [Limit],
    pub keys: &'a [Key],
    pub costs: &'a [u64],
    pub id: RequestId,
    /// Overrides the backend's deadline for this call.
    pub deadline: Option<std::time::Duration>,
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
    /// How long an allowed request is held before it proceeds (shaping with `max_delay`).
    pub delay_ms: u64,
}

/// The verdict on one request across all limits of its route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// One status per limit, in the route's order.
    pub statuses: Statuses,
    /// The denying limit with the longest wait, if any enforced limit denied.
    pub denied_by: Option<usize>,
    /// The same among shadow limits: the request would have been denied by this one.
    pub shadow_denied_by: Option<usize>,
}

impl Decision {
    /// A decision where every limit is enforced.
    pub fn from_statuses(statuses: impl Into<Statuses>) -> Decision {
        Decision::judge(statuses, |_| false)
    }

    /// A decision over `limits`: shadow limits never deny (and never delay); their denials are
    /// reported in `shadow_denied_by`.
    pub fn of(statuses: impl Into<Statuses>, limits: &[Limit]) -> Decision {
        Decision::judge(statuses, |i| limits.get(i).is_some_and(|l| l.shadow))
    }

    fn judge(statuses: impl Into<Statuses>, shadow: impl Fn(usize) -> bool) -> Decision {
        let mut statuses = statuses.into();
        let longest = |statuses: &[LimitStatus], in_shadow: bool| {
            statuses
                .iter()
                .enumerate()
                .filter(|(i, s)| !s.allowed && shadow(*i) == in_shadow)
                .max_by_key(|(_, s)| s.retry_after_ms.unwrap_or(u64::MAX))
                .map(|(index, _)| index)
        };
        for (i, status) in statuses.iter_mut().enumerate() {
            if shadow(i) {
                status.delay_ms = 0;
            }
        }
        let denied_by = longest(&statuses, false);
        let shadow_denied_by = longest(&statuses, true);
        Decision {
            statuses,
            denied_by,
            shadow_denied_by,
        }
    }

    pub fn allowed(&self) -> bool {
        self.denied_by.is_none()
    }

    /// The longest wait among the denying limits: `Some(None)` when one of them can never pass.
    pub fn retry_after_ms(&self) -> Option<Option<u64>> {
        self.denied_by.map(|i| self.statuses[i].retry_after_ms)
    }

    /// How long an allowed request must be held (the longest shaping delay of its limits).
    pub fn delay_ms(&self) -> u64 {
        if !self.allowed() {
            return 0;
        }
        self.statuses.iter().map(|s| s.delay_ms).max().unwrap_or(0)
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
    #[error("the Redis circuit breaker is open")]
    BreakerOpen,
}

impl LimiterError {
    /// Errors that deny the request whatever the failure mode: admitting would mean admitting a
    /// request the limiter cannot track.
    pub fn always_denies(&self) -> bool {
        matches!(self, LimiterError::LocalCapacity(_))
    }

    /// Every value `kind()` can take, so metrics can show them at zero from the start.
    pub const KINDS: [&'static str; 14] = [
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
        "breaker_open",
    ];

    pub fn kind(&self) -> &'static str {
        match self {
            LimiterError::Timeout(_) => "timeout",
            LimiterError::Connection(_) => "connection",
            LimiterError::Server { code, .. } => code,
            LimiterError::Reply(_) => "reply",
            LimiterError::LocalCapacity(_) => "local_capacity",
            LimiterError::BreakerOpen => "breaker_open",
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
/// `keys[i]` and `costs[i]` belong to `limits[i]`. Nothing is consumed unless every limit allows.
#[async_trait]
pub trait Limiter: Send + Sync {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError>;

    /// Returns the concurrency leases `request` took (call once the response is finished or the
    /// client has gone). Limits of other algorithms are ignored.
    async fn release(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError>;

    /// Gives back `units` of a leased limit's key that were taken and not spent.
    async fn refund(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        units: u64,
    ) -> Result<(), LimiterError>;

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
            delay_ms: 0,
        }
    }

    #[test]
    fn a_share_divides_rates_and_counts_but_keeps_at_least_one_unit() {
        let rate = crate::config::rate::parse_rate("10/s").unwrap();
        let gcra = Limit::new(
            "g",
            Algorithm::Gcra {
                emission_us: 100_000,
                tolerance_us: 1_000_000,
                max_delay_us: 0,
            },
            1,
            rate,
        );
        assert_eq!(
            gcra.share(2).algorithm,
            Algorithm::Gcra {
                emission_us: 200_000,
                tolerance_us: 1_000_000,
                max_delay_us: 0
            },
            "half the rate, half the burst (the tolerance in time stays)"
        );
        let window = Limit::new(
            "w",
            Algorithm::FixedWindow {
                limit: 3,
                window_us: 1,
            },
            1,
            rate,
        );
        assert_eq!(
            window.share(2).algorithm,
            Algorithm::FixedWindow {
                limit: 1,
                window_us: 1
            }
        );
        assert_eq!(
            window.share(10).algorithm,
            Algorithm::FixedWindow {
                limit: 1,
                window_us: 1
            }
        );
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
