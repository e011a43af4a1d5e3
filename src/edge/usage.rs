//! The usage API: `GET /v1/quota?consumer=ID&route=NAME[&plan=NAME]` on the admin listener —
//! each limit a consumer meets on a route, with its quota, what remains and when it resets,
//! read without consuming anything (a peek at the backend that keeps the counts); without
//! `route`, each common limit the consumer meets, once (one bucket over every route using
//! it). The admin listener checks the admin token first (`admin.rs`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::caller::consumers::{Consumer, PlanId, MAX_CONSUMER_ID};
use crate::edge::admin_error::AdminError;
use crate::exchange::named::{self, Unnamed};
use crate::exchange::Site;
use crate::limiter::fields::whole_seconds;
use crate::limiter::{LimitRecords, LimitStatus, Mismatch, Policy};
use crate::observe::metrics;
use crate::route::describe::{self, GlobalShown};
use crate::route::table::{Route, RouteTable};
use crate::route::tiers::{LimitMet, Tier, TierLimit};
use crate::runtime::snapshot::Snapshot;

/// What a query asks: whose usage, on which route, on which plan.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Query {
    consumer: Option<String>,
    route: Option<String>,
    plan: Option<String>,
}

/// The answer: the consumer's limits on the route (`None`: its common limits).
#[derive(Debug, Serialize)]
struct Usage<'a> {
    consumer: &'a str,
    plan: Option<&'a str>,
    route: Option<&'a str>,
    limits: Vec<LimitUsage>,
}

/// One limit: what its quota is and what remains, or why it cannot be read for a consumer.
#[derive(Debug, Serialize)]
struct LimitUsage {
    name: String,
    /// A common limit: one bucket over every route that uses it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    common: bool,
    /// The quota: units per window (`RateLimit-Policy`'s `q`), for limits that are rates.
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
    /// Seconds until the limit is back to its full quota (rounded up).
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_seconds: Option<u64>,
    /// `scope: global`: how it holds across regions and this region's part (`remaining` is
    /// this region's standing).
    #[serde(skip_serializing_if = "Option::is_none")]
    global: Option<GlobalShown>,
    /// Why there are no counts: the limit is keyed on more than the consumer.
    #[serde(skip_serializing_if = "Option::is_none")]
    unavailable: Option<&'static str>,
}

/// The usage the query asks for, as JSON.
pub async fn quota(
    policy: &Policy,
    snapshot: &Snapshot,
    query: Option<&str>,
) -> Result<String, AdminError> {
    let query: Query = crate::edge::query::read(query.unwrap_or("").as_bytes())?;
    let config = &snapshot.config;
    let id = query
        .consumer
        .filter(|id| !id.is_empty() && id.len() <= MAX_CONSUMER_ID)
        .ok_or(AdminError::NoConsumer)?;
    let routes = asked_routes(&config.routes, query.route.as_deref())?;
    let consumer = named_consumer(&snapshot.site, &id, query.plan.as_deref())?;
    if config.knows_consumer(&id).is_none() {
        return Err(AdminError::UnknownConsumer(id, UNKNOWN));
    }
    let (plans, plan) = (config.consumers.plans(), consumer.plan);
    let mut limits: Vec<LimitUsage> = Vec::new();
    for route in routes {
        // The tier the consumer meets now: a quota override in force changes it.
        let (tier_id, overridden) = snapshot.tier_for(route, Some(&consumer));
        let tier = overridden
            .as_deref()
            .unwrap_or_else(|| route.tiers.get(tier_id));
        let mut read = peek(policy, route, tier, &consumer).await?;
        if query.route.is_none() {
            read.retain(|l| l.common && !limits.iter().any(|known| known.name == l.name));
        }
        limits.extend(read);
    }
    let usage = Usage {
        consumer: &id,
        plan: plan.map(|plan: PlanId| plans.name(plan)),
        route: query.route.as_deref(),
        limits,
    };
    serde_json::to_string(&usage)
        .map_err(|e| AdminError::Internal(format!("cannot write the answer: {e}").into()))
}

/// The routes a query reads: the one it names, or (none named) one route using each common
/// limit, which reaches its one bucket.
fn asked_routes<'r>(
    routes: &'r RouteTable,
    named: Option<&str>,
) -> Result<Vec<&'r Arc<Route>>, AdminError> {
    if let Some(name) = named {
        let route = routes.named(name);
        return route
            .map(|route| vec![route])
            .ok_or_else(|| AdminError::NoRoute(name.to_string()));
    }
    let mut using: Vec<&Arc<Route>> = Vec::new();
    for route in routes.in_file_order() {
        let common = route
            .tiers
            .default()
            .limits
            .iter()
            .filter(|l| l.key.common());
        let new = common
            .map(|l| &l.limit.exact.name)
            .any(|name| !using.iter().any(|r| r.tiers.uses_common(name)));
        if new {
            using.push(route);
        }
    }
    match using.is_empty() {
        true => Err(AdminError::Missing {
            name: "route",
            also: " (no route uses a common limit)",
        }),
        false => Ok(using),
    }
}

/// Why a consumer is unknown, in words.
pub(crate) const UNKNOWN: &str =
    "no API key, identity.mtls.plans entry or limit's consumers: entry names it, and no verifier (JWT, client certificates) could";

/// The consumer named `id` on the plan named `plan` or its own (`exchange::named`), or why it
/// is not one, as the admin APIs refuse it.
pub(crate) fn named_consumer<S>(
    site: &Site<S>,
    id: &str,
    plan: Option<&str>,
) -> Result<Consumer, AdminError> {
    named::consumer(site, id, plan).map_err(|unnamed| match unnamed {
        Unnamed::Length => AdminError::Malformed {
            name: "consumer",
            why: format!("1 to {MAX_CONSUMER_ID} bytes").into(),
        },
        Unnamed::NoPlan(plan) => AdminError::NoPlan(plan),
    })
}

/// Reads what each limit of `records` (`tier`'s) has left, consuming nothing.
pub(crate) async fn peek_records(
    policy: &Policy,
    tier: &Tier,
    records: &mut LimitRecords,
) -> Result<(), AdminError> {
    let mut asked = tier.asked(records).map_err(unfit)?;
    policy.peek(&mut asked).await.map_err(AdminError::unread)
}

/// Reads what each limit of `met` (`tier`'s, as `exchange::named::met` made them) has left,
/// consuming nothing.
pub(crate) async fn peek_met(
    policy: &Policy,
    tier: &Tier,
    met: &mut [LimitMet],
) -> Result<(), AdminError> {
    policy
        .peek(&mut tier.asking(met))
        .await
        .map_err(AdminError::unread)
}

/// The `500` of records that are not one per limit of their tier (a bug): counted and logged.
fn unfit(mismatch: Mismatch) -> AdminError {
    metrics::mismatch(&mismatch);
    AdminError::Internal("the limits changed while read".into())
}

/// Reads the limits of `tier`, which `consumer` meets on `route`, from the backend.
async fn peek(
    policy: &Policy,
    route: &Route,
    tier: &Tier,
    consumer: &Consumer,
) -> Result<Vec<LimitUsage>, AdminError> {
    let readable = |limit: &TierLimit| tier.keys.follows_from_caller(&limit.key);
    let mut records = LimitRecords::new();
    if tier.limits.iter().any(|limit| readable(limit)) {
        records = named::records(tier, &route.name, Some(consumer), None)
            .map_err(|undecidable| AdminError::Unkeyed(undecidable.0))?;
        peek_records(policy, tier, &mut records).await?;
    }
    let statuses: Vec<(&TierLimit, Option<&LimitStatus>)> = match tier.said(&records) {
        Ok(said) => said
            .map(|(limit, record)| (limit, record.status.as_ref().filter(|_| readable(limit))))
            .collect(),
        // Nothing read: no record, and no status for any limit.
        Err(_) if records.is_empty() => tier.limits.iter().map(|limit| (&**limit, None)).collect(),
        Err(mismatch) => return Err(unfit(mismatch)),
    };
    let shown = statuses
        .into_iter()
        .filter(|(limit, _)| !limit.limit.exact.hidden);
    let usage = shown.map(|(limit, status)| {
        let (readable, common) = (readable(limit), limit.key.common());
        let limit = &limit.limit.exact;
        LimitUsage {
            name: limit.name.to_string(),
            common,
            limit: limit.advertised.map(|(quota, _)| quota),
            window_seconds: limit.advertised.map(|(_, window)| window),
            remaining: status.map(|s| s.remaining),
            reset_seconds: status.map(|s| whole_seconds(s.reset_after_ms)),
            global: describe::global(limit),
            unavailable: (!readable)
                .then_some("keyed on more than the consumer (client_ip, a header, the path...): no count belongs to the consumer alone"),
        }
    });
    Ok(usage.collect())
}
