//! What the admin APIs name instead of sending a request: a consumer (by id, on a plan named or
//! its own), and the records of the limits a tier holds for it, keyed as a request of that
//! caller would have them. The request has no method, host, path or header: a limit keyed on
//! one of those counts no one caller (the admin APIs ask `RouteKeys::follows_from_caller`
//! first), and one that refuses a request without it (`on_missing: deny`) is `Undecidable`.
//! The usage API, the quota admin API and explain ask here rather than building a request's
//! facts themselves.

use std::net::{IpAddr, Ipv4Addr};

use http::HeaderMap;
use smallvec::SmallVec;

use super::Site;
use crate::caller::consumers::{Consumer, Via, MAX_CONSUMER_ID};
use crate::limiter::LimitRecords;
use crate::route::keys::{RequestFacts, Rotation};
use crate::route::tiers::{LimitsMet, Tier, Undecidable};

/// Why a named consumer is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unnamed {
    #[error("consumer: 1 to {MAX_CONSUMER_ID} bytes")]
    Length,
    #[error("no plan named {0:?}")]
    NoPlan(String),
}

/// The consumer named `id` (1 to [`MAX_CONSUMER_ID`] bytes), on the plan named `plan` or its
/// own (the one a plan override puts it on, while one applies): who the admin APIs speak of
/// (known or not: see `Config::knows_consumer`).
pub fn consumer<S>(site: &Site<S>, id: &str, plan: Option<&str>) -> Result<Consumer, Unnamed> {
    let config = &site.config;
    if id.is_empty() || id.len() > MAX_CONSUMER_ID {
        return Err(Unnamed::Length);
    }
    let plan_named = plan.is_some();
    let plan = match plan {
        Some(name) => Some(
            config
                .consumers
                .plans()
                .find(name)
                .ok_or_else(|| Unnamed::NoPlan(name.to_string()))?,
        ),
        None => config.consumers.plan_of(id),
    };
    let consumer = Consumer {
        id: id.into(),
        plan,
        claims: SmallVec::new(),
        via: Via::ApiKey,
    };
    Ok(match plan_named {
        true => consumer,
        false => site.on_plan_in_force(consumer),
    })
}

/// The records of `tier`'s limits on route `route` for what an admin call names (a consumer,
/// a client address): each limit's key, as a request of that caller would have it.
pub fn records(
    tier: &Tier,
    route: &str,
    consumer: Option<&Consumer>,
    client_ip: Option<IpAddr>,
) -> Result<LimitRecords, Undecidable> {
    with_facts(route, consumer, client_ip, |facts| {
        tier.records(facts, &Rotation::default())
    })
}

/// [`records`], each beside its limit (as [`Tier::met`] pairs a request's): what the quota
/// admin API reads and writes, never joined by position.
pub fn met(
    tier: &Tier,
    route: &str,
    consumer: Option<&Consumer>,
    client_ip: Option<IpAddr>,
) -> Result<LimitsMet, Undecidable> {
    with_facts(route, consumer, client_ip, |facts| {
        tier.met(facts, &Rotation::default())
    })
}

/// `make` given the facts of a request of `consumer` from `client_ip` on `route`: no method,
/// host, path or header.
fn with_facts<T>(
    route: &str,
    consumer: Option<&Consumer>,
    client_ip: Option<IpAddr>,
    make: impl FnOnce(&RequestFacts<'_>) -> T,
) -> T {
    let headers = HeaderMap::new();
    let facts = RequestFacts {
        client_ip: client_ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        method: "",
        host: "",
        path: "",
        query: None,
        headers: &headers,
        route,
        consumer,
        claim_names: &[],
    };
    make(&facts)
}
