//! What one limiter call decides: each limit of a route with the request's key and cost for it.

use std::time::Duration;

use smallvec::SmallVec;

use super::decision::{Decision, Statuses};
use super::id::RequestId;
use super::key::Key;
use super::limit::{Limit, LIMITS_INLINE};
use super::pairs::paired;

/// What one request asks of one limit: the key it is counted under and the units it costs
/// (0: the limit is only read, e.g. skipped for lack of a key part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub key: Key,
    pub cost: u64,
}

/// One ask per limit of a route, in the route's order.
pub type Asks = SmallVec<[Ask; LIMITS_INLINE]>;

/// One ask per key, at the matching cost (tools and tests; requests get theirs from their
/// route's tier, `Tier::records`). Panics when there are not as many costs as keys.
pub fn asks(keys: &[&[u8]], costs: &[u64]) -> Asks {
    paired("keys and costs", keys, costs)
        .expect("one cost per key")
        .map(|(key, &cost)| Ask {
            key: Key::from_slice(key),
            cost,
        })
        .collect()
}

/// One limit of a call, with the request's key and cost for it.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub limit: &'a Limit,
    pub key: &'a [u8],
    pub cost: u64,
}

/// The entries of one call, inline for routes of ordinary size.
pub type Entries<'a> = SmallVec<[Entry<'a>; LIMITS_INLINE]>;

/// Pairs each limit with an ask for it (tools and tests; requests pair theirs in
/// `Asked::entries`). Panics when there are not as many asks as limits.
pub fn entries<'a>(limits: &'a [Limit], asks: &'a [Ask]) -> Entries<'a> {
    paired("limits and asks", limits, asks)
        .expect("one ask per limit")
        .map(|(limit, ask)| Entry {
            limit,
            key: &ask.key,
            cost: ask.cost,
        })
        .collect()
}

/// Everything one limiter call needs: its entries and a request id unique across gateways
/// (log members and concurrency slots).
#[derive(Debug, Clone, Copy)]
pub struct LimitRequest<'a> {
    pub entries: &'a [Entry<'a>],
    pub id: RequestId,
    /// Overrides the backend's deadline for this call.
    pub deadline: Option<Duration>,
}

impl<'a> LimitRequest<'a> {
    /// A call with no request id and the backend's own deadline (tests and tools).
    pub fn new(entries: &'a [Entry<'a>]) -> LimitRequest<'a> {
        LimitRequest {
            entries,
            id: RequestId::default(),
            deadline: None,
        }
    }

    /// The decision of these entries' statuses: shadow limits report but never deny.
    pub fn decision(&self, statuses: impl Into<Statuses>) -> Decision {
        Decision::judge(statuses, |i| {
            self.entries.get(i).is_some_and(|entry| entry.limit.shadow)
        })
    }
}
