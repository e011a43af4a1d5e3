//! The limiter layer. [`policy`] owns the verdict on a request: it asks the configured
//! [`engine`] (Redis behind its deny cache, breaker and leases, or in-process) to decide every
//! limit of a route at once, consuming only if all allow, and applies the route's failure mode
//! when it cannot.
//!
//! The files directly in this folder are the decision core: the policy and the engine it
//! calls, the seam ([`backend`]), the in-process backend ([`local`]) and the deny cache and
//! breaker ([`guard`]), and the vocabulary they share (limits, rates, keys, asks, records,
//! statuses, decisions, verdicts, errors, secrets, the clock, the [`algorithm`]s), and
//! [`per_thread`], the slots per thread that the meters and the retry budget count in (here,
//! in the bottom layer, so that both can), and [`meters`], the counter and histogram kept so
//! that the limiter's decorators write per decision. The rest lives in rooms, each a folder
//! with its own `//!`:
//!
//! * [`redis`]: the Redis backend and its plumbing: the links to one server, a Cluster or
//!   Sentinels, the decision lane's direct connection, the topology, the Lua scripts, the
//!   coalescer that sends queued decisions as one call, the script warmer, and what the
//!   masters persist.
//! * [`leased`]: leased quotas, a decorator that spends units a gateway holds, and its
//!   simulation.
//! * [`adaptive`]: adaptive concurrency, a route's in-flight limit that follows its upstream.
//! * [`admin`]: the quota admin API's store (resets, credits, overrides) in either backend.
//! * [`regions`]: one limit across regions (`scope: global`): how it splits, region sync's
//!   tick, and its simulation.
//!
//! This file only names the modules and re-exports their main types; the modules reach each
//! other directly, never through here.

pub mod adaptive;
pub mod admin;
pub mod algorithm;
pub(crate) mod backend;
pub mod clock;
pub(crate) mod decision;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod fields;
pub mod guard;
pub(crate) mod id;
pub(crate) mod key;
pub mod leased;
pub(crate) mod limit;
pub mod local;
pub mod meters;
pub(crate) mod pairs;
pub mod per_thread;
pub(crate) mod policy;
pub(crate) mod rate;
pub(crate) mod record;
pub mod redis;
pub mod regions;
pub(crate) mod request;
pub(crate) mod rules;
pub(crate) mod secret;
pub(crate) mod status;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod verdict;

/// The decision scripts, also at their path from before the Redis room (tests and benches).
pub use self::redis::script;

pub use self::redis::coalesce::Coalescing;
pub use self::redis::persistence::{Kept, Persistence};
pub use self::redis::topology::{RedisAuth, RedisTls, Topology};
pub use admin::{AdminTables, Credited, Listed, Put, QuotaStore, Restored, StoredOverride};
pub use algorithm::{Algorithm, Change};
pub use backend::{Backend, Limiter, Readiness, ReleaseSlots, SettleUnits, Settlement};
pub use decision::{Decision, Retry, Source, Statuses};
pub use engine::Engine;
pub use error::{ErrorKind, LimiterError};
pub use id::RequestId;
pub use key::{push_hex, Key, KEY_INLINE};
pub use limit::{
    BadCost, Cost, CostReport, Leasing, Limit, ResponsePrice, Scope, Sent, AUTO_MIN_UNITS,
    LIMITS_INLINE, QUOTA_MEMORY_US,
};
pub use pairs::{paired, paired_mut, Mismatch};
pub use policy::{Policy, PolicyMeters, Sharing};
pub use rate::Rate;
pub use record::{
    deciding, Asked, AskedLimit, Deciding, LimitRecord, LimitRecords, PolicyLimit, Scale,
};
pub use request::{asks, entries, Ask, Asks, Entry, LimitRequest};
pub use rules::{FailureMode, LimitRules};
pub use secret::Secret;
pub use status::LimitStatus;
pub use verdict::{Answered, Decider, Outcome, Verdict};
