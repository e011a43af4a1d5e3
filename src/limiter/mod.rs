//! The limiter layer. [`policy`] owns the verdict on a request: it asks the configured
//! [`engine`] (Redis behind its deny cache, breaker and leases, or in-process) to decide every
//! limit of a route at once, consuming only if all allow, and applies the route's failure mode
//! when it cannot. Below it: the seam ([`backend`]), the backends ([`redis`], whose decisions
//! queue into batches in [`coalesce`], and [`local`]) and their decorators ([`guard`], [`leased`]), and the vocabulary they share (limits, asks,
//! statuses, decisions, errors, the algorithms).
//!
//! This file only names the modules and re-exports their main types; the modules reach each
//! other directly, never through here.

pub mod adaptive;
pub mod admin;
pub mod algorithm;
pub(crate) mod backend;
pub mod clock;
pub(crate) mod coalesce;
pub(crate) mod decision;
pub(crate) mod direct;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod fields;
pub mod guard;
pub(crate) mod id;
pub(crate) mod key;
pub mod leased;
pub(crate) mod limit;
pub(crate) mod link;
pub mod local;
pub(crate) mod pairs;
pub mod persistence;
pub(crate) mod policy;
pub(crate) mod rate;
pub(crate) mod record;
pub mod redis;
pub(crate) mod request;
pub(crate) mod rules;
pub mod script;
pub(crate) mod secret;
pub(crate) mod status;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod topology;
pub(crate) mod verdict;
pub(crate) mod warm;

pub use admin::{AdminTables, Credited, Listed, Put, QuotaStore, Restored, StoredOverride};
pub use algorithm::{Algorithm, Change};
pub use backend::{Backend, Limiter, Readiness, ReleaseSlots, SettleUnits, Settlement};
pub use coalesce::Coalescing;
pub use decision::{Decision, Retry, Source, Statuses};
pub use engine::Engine;
pub use error::{ErrorKind, LimiterError};
pub use id::RequestId;
pub use key::{push_hex, Key, KEY_INLINE};
pub use limit::{
    BadCost, Cost, CostReport, Leasing, Limit, ResponsePrice, Scope, Sent, AUTO_MIN_UNITS,
    LIMITS_INLINE, QUOTA_MEMORY_US,
};
pub use pairs::{paired, paired_mut};
pub use persistence::{Kept, Persistence};
pub use policy::{Policy, PolicyMeters};
pub use rate::Rate;
pub use record::{
    deciding, Asked, AskedLimit, Deciding, LimitRecord, LimitRecords, PolicyLimit, Scale,
};
pub use request::{asks, entries, Ask, Asks, Entry, LimitRequest};
pub use rules::{FailureMode, LimitRules};
pub use secret::Secret;
pub use status::LimitStatus;
pub use topology::{RedisAuth, RedisTls, Topology};
pub use verdict::{Answered, Decider, Outcome, Verdict};
