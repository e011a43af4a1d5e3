//! The quota admin API on the admin listener, behind `admin.token` (`admin.rs` checks it):
//! `POST /v1/quota/reset` and `POST /v1/quota/credit` change a consumer's (or a client
//! address's, or a route's) usage of its limits; `GET`, `PUT` and `DELETE /v1/quota/overrides`
//! list, set and remove temporary overrides (a limit lifted, or at another quota, until they
//! expire); `PUT` and `DELETE /v1/quota/plans` put a consumer on another plan until a time, and
//! back. Each write changes the state where the limits live (one atomic call of
//! `lua/admin/` in Redis, or the in-process backend), so it holds on every gateway at once;
//! overrides of both kinds reach every gateway within a second (`runtime::overrides`). Each
//! write is audited (a JSON line: who, what, before and after) and counted
//! (`sluice_admin_changes_total`). The query is parsed once (`params.rs`); every refusal is an
//! [`AdminError`] (`edge/admin_error.rs`).

use http::{HeaderMap, Method};
use serde_json::{json, Value};

use crate::caller::consumers::Known;
use crate::caller::consumers::MAX_CONSUMER_ID;
use crate::config::Config;
use crate::edge::admin_error::AdminError;
use crate::edge::usage::UNKNOWN;
use crate::limiter::admin::credit_kind;
use crate::limiter::admin::{QuotaStore, MAX_OVERRIDES};
use crate::limiter::{Credited, Policy, Put};
use crate::observe::audit::AuditLog;
use crate::route::overrides::{Override, PlanOverride, QuotaOverride, Unfit};
use crate::route::table::{RouteTable, COMMON};
use crate::runtime::overrides::{admin_tables, refresh};
use crate::runtime::snapshot::InForce;
use params::{Params, Quota};
use target::{after_write, remaining, target};

mod params;
mod target;

/// The longest `X-Audit-Actor`.
const MAX_ACTOR: usize = 128;

/// Who calls, as the audit names them: the peer, and what it says of itself.
pub struct Caller {
    pub peer: Option<String>,
    pub actor: Option<String>,
}

impl Caller {
    /// The caller of a request from `peer` with `headers`; `Err` when its `X-Audit-Actor` is
    /// not 1 to 128 visible ASCII characters.
    pub fn of(peer: Option<String>, headers: &HeaderMap) -> Result<Caller, AdminError> {
        let Some(value) = headers.get("x-audit-actor") else {
            return Ok(Caller { peer, actor: None });
        };
        let visible = |b: &u8| b.is_ascii_graphic() || *b == b' ';
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > MAX_ACTOR || !bytes.iter().all(visible) {
            return Err(AdminError::Actor);
        }
        let actor = String::from_utf8_lossy(bytes).into_owned();
        Ok(Caller {
            peer,
            actor: Some(actor),
        })
    }
}

/// The calls of the API: what the path and method ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Reset,
    Credit,
    ListOverrides,
    SetOverride,
    DeleteOverride,
    SetPlan,
    DeletePlan,
}

impl Call {
    /// The call at `path` with `method`.
    fn of(path: &str, method: &Method) -> Result<Call, AdminError> {
        Ok(match (path, method) {
            ("/v1/quota/reset", &Method::POST) => Call::Reset,
            ("/v1/quota/credit", &Method::POST) => Call::Credit,
            ("/v1/quota/overrides", &Method::GET) => Call::ListOverrides,
            ("/v1/quota/overrides", &Method::PUT) => Call::SetOverride,
            ("/v1/quota/overrides", &Method::DELETE) => Call::DeleteOverride,
            ("/v1/quota/overrides", _) => return Err(AdminError::Method("GET, PUT or DELETE")),
            ("/v1/quota/plans", &Method::PUT) => Call::SetPlan,
            ("/v1/quota/plans", &Method::DELETE) => Call::DeletePlan,
            ("/v1/quota/plans", _) => return Err(AdminError::Method("PUT or DELETE")),
            ("/v1/quota/reset" | "/v1/quota/credit", _) => return Err(AdminError::Method("POST")),
            _ => return Err(AdminError::NoCall),
        })
    }

    /// Its `action` in the audit and in `sluice_admin_changes_total`.
    fn action(self) -> &'static str {
        match self {
            Call::Reset => "reset",
            Call::Credit => "credit",
            Call::ListOverrides => "list",
            Call::SetOverride => "override_set",
            Call::DeleteOverride => "override_delete",
            Call::SetPlan => "plan_set",
            Call::DeletePlan => "plan_delete",
        }
    }
}

/// Serves one call of the quota admin API at `path`: the JSON answer, or why not.
pub async fn serve(
    policy: &Policy,
    live: &InForce,
    (path, method): (&str, &Method),
    query: Option<&str>,
    caller: &Caller,
) -> Result<String, AdminError> {
    let call = Call::of(path, method)?;
    let params = Params::parse(query)?;
    let asked = (call, &params, caller);
    if call != Call::ListOverrides {
        // A write moves the admin epoch on: read it first, so a Redis that lost the admin
        // tables since the last read is found (and the overrides restored) before the write
        // could hide it. No write while it cannot be read.
        refresh(policy, live).await.map_err(AdminError::unread)?;
    }
    let answer = match call {
        Call::Reset => reset(policy, live, asked).await?,
        Call::Credit => credit(policy, live, asked).await?,
        Call::ListOverrides => list(policy, live).await?,
        Call::SetOverride => set(policy, live, asked).await?,
        Call::DeleteOverride => remove(policy, live, asked).await?,
        Call::SetPlan => set_plan(policy, live, asked).await?,
        Call::DeletePlan => remove_plan(policy, live, asked).await?,
    };
    Ok(answer.to_string())
}

/// A write as asked: the call, its parameters and who calls.
type Asked<'a> = (Call, &'a Params, &'a Caller);

/// The common part of an audit line and of the answer: who changed what.
fn subject(params: &Params, caller: &Caller) -> serde_json::Map<String, Value> {
    let mut what = serde_json::Map::new();
    what.insert("actor".into(), json!(caller.actor));
    what.insert("peer".into(), json!(caller.peer));
    for (name, value) in [
        ("route", params.route.as_deref()),
        ("limit", params.limit.as_deref()),
        ("consumer", params.consumer.as_deref()),
        ("plan", params.plan.as_deref()),
        ("client_ip", params.client_ip_text()),
    ] {
        if let Some(value) = value {
            what.insert(name.into(), json!(value));
        }
    }
    what
}

/// What a write did, or why it did not: its change and result.
type Written = Result<(Value, &'static str), AdminError>;

/// The end of every write: its audit line (written before the answer is) and count, and the
/// answer (the line itself), or the refusal, audited too.
async fn concluded(
    audit_log: &AuditLog,
    (call, params, caller): Asked<'_>,
    written: Written,
) -> Result<Value, AdminError> {
    let action = call.action();
    match written {
        Ok((change, result)) => {
            let mut line = subject(params, caller);
            extend(&mut line, &change);
            audit_log.write(action, result, line.clone()).await;
            Ok(Value::Object(line))
        }
        Err(refusal) => {
            let mut line = subject(params, caller);
            line.insert("reason".into(), json!(refusal.to_string()));
            audit_log.write(action, refusal.result(), line).await;
            Err(refusal)
        }
    }
}

/// The consumer a write names, when it names one: `Err` when no request can be its. A
/// consumer no list holds but a verifier may name (JWT, client certificates) is taken.
fn known(config: &Config, params: &Params) -> Result<Option<Known>, AdminError> {
    let Some(id) = params.consumer.as_deref() else {
        return Ok(None);
    };
    match config.knows_consumer(id) {
        Some(known) => Ok(Some(known)),
        None => Err(AdminError::UnknownConsumer(id.to_string(), UNKNOWN)),
    }
}

/// `POST /v1/quota/reset`: every named limit back to its full quota.
async fn reset(policy: &Policy, live: &InForce, asked: Asked<'_>) -> Result<Value, AdminError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let params = asked.1;
    let written = async {
        let known = known(config, params)?;
        let target = target(&snapshot, params, policy)?;
        let before = remaining(policy, &target).await?;
        let met = target.met()?;
        let keys: Vec<&[u8]> = target
            .changed(&met)
            .map(|m| &m.record.ask.key[..])
            .collect();
        let existed = policy
            .quota_store()
            .reset(&keys)
            .await
            .map_err(AdminError::unwritten)?;
        if existed == 0 && known == Some(Known::Possible) {
            // Nothing of its was counted: no request may have been its at all.
            let id = params.consumer.clone().unwrap_or_default();
            return Err(AdminError::UnknownConsumer(id, UNLISTED_WITHOUT_USAGE));
        }
        announce(policy, config).await;
        let after = after_write(policy, &target).await;
        let change = json!({ "before": before, "after": after, "keys_reset": existed });
        Ok((change, "applied"))
    };
    concluded(&snapshot.audit_log, asked, written.await).await
}

/// Why a reset of a consumer no list holds, which found nothing counted, is a `404`.
const UNLISTED_WITHOUT_USAGE: &str = "no API key, identity.mtls.plans entry or limit's consumers: entry names it, and nothing is counted for it on this route";

/// `POST /v1/quota/credit`: units given back to one limit, once per id.
async fn credit(policy: &Policy, live: &InForce, asked: Asked<'_>) -> Result<Value, AdminError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let params = asked.1;
    let written = async {
        params.limit()?;
        let units = params.units()?;
        let id = params.id()?;
        known(config, params)?;
        let target = target(&snapshot, params, policy)?;
        // `limit=` names one limit: the one changed.
        let Some(limit) = target.chosen.first() else {
            return Err(AdminError::NoneKeyed);
        };
        let algorithm = &limit.limit.exact.algorithm;
        if credit_kind(algorithm).is_none() {
            return Err(AdminError::NotCreditable);
        }
        let before = remaining(policy, &target).await?;
        let met = target.met()?;
        let Some(changed) = target.changed(&met).next() else {
            return Err(AdminError::Internal("the limits changed while read".into()));
        };
        let key = &changed.record.ask.key[..];
        let credited = policy
            .quota_store()
            .credit(algorithm, key, units, id.bytes())
            .await
            .map_err(AdminError::unwritten)?;
        if credited == Credited::Changed {
            announce(policy, config).await;
        }
        let after = after_write(policy, &target).await;
        let (shown, encoded) = id.shown();
        let mut change = json!({ "units": units, "id": shown, "before": before, "after": after });
        if encoded {
            // Not UTF-8: its bytes, percent-encoded.
            change["id_encoding"] = json!("percent");
        }
        let (result, said) = match credited {
            Credited::Changed => ("applied", "credited"),
            Credited::NothingUsed => ("applied", "nothing_used"),
            Credited::Repeated => ("repeated", "repeated"),
        };
        change["credit"] = json!(said);
        Ok((change, result))
    };
    concluded(&snapshot.audit_log, asked, written.await).await
}

/// Tells every gateway a reset or credit happened (they forget the denials they cached), and
/// this one at once.
async fn announce(policy: &Policy, config: &Config) {
    if let Err(e) = policy.quota_store().announce(&admin_tables(config)).await {
        log::warn!("quota admin: the change is made, but other gateways may keep cached denials until they expire ({e})");
    }
    policy.forget_denials();
}

fn extend(line: &mut serde_json::Map<String, Value>, change: &Value) {
    if let Value::Object(fields) = change {
        line.extend(fields.clone());
    }
}

/// `GET /v1/quota/overrides`: the overrides in force, of limits and of plans (`kind`).
async fn list(policy: &Policy, live: &InForce) -> Result<Value, AdminError> {
    let snapshot = live.load_full();
    let listed = policy
        .quota_store()
        .overrides(&admin_tables(&snapshot.config))
        .await
        .map_err(AdminError::unread)?;
    let overrides = listed.overrides.iter().filter_map(|stored| {
        let one: Override = serde_json::from_str(&stored.value).ok()?;
        Some(shown(&one, stored.left_ms.div_ceil(1000)))
    });
    Ok(json!({ "overrides": overrides.collect::<Vec<_>>() }))
}

/// An override as the API shows it: its kind; a limit's `quota` a number or `"off"`.
fn shown(one: &Override, expires_in_seconds: u64) -> Value {
    match one {
        Override::Limit(one) => json!({
            "kind": "limit",
            "route": one.route,
            "limit": one.limit,
            "consumer": one.consumer,
            "quota": one.quota.map_or(json!("off"), |q| json!(q)),
            "expires_in_seconds": expires_in_seconds,
            "actor": one.actor,
        }),
        Override::Plan(one) => json!({
            "kind": "plan",
            "consumer": one.consumer,
            "plan": one.plan,
            "expires_in_seconds": expires_in_seconds,
            "actor": one.actor,
        }),
    }
}

/// Stores `one` for `lifetime`: the override it replaced, if one was in force.
async fn put(
    policy: &Policy,
    config: &Config,
    one: &Override,
    lifetime: std::time::Duration,
) -> Result<Option<Override>, AdminError> {
    let value =
        serde_json::to_string(one).map_err(|e| AdminError::Internal(e.to_string().into()))?;
    let tables = admin_tables(config);
    let put = policy
        .quota_store()
        .put_override(&tables, &one.field(), &value, lifetime)
        .await
        .map_err(AdminError::unwritten)?;
    let Put::Stored { previous } = put else {
        return Err(AdminError::OverridesFull(MAX_OVERRIDES));
    };
    Ok(previous.and_then(|p| serde_json::from_str::<Override>(&p).ok()))
}

/// Removes the override stored under `field`: the one removed (`Err` when none was in force).
async fn delete(
    policy: &Policy,
    config: &Config,
    field: &str,
) -> Result<Option<Override>, AdminError> {
    let removed = policy
        .quota_store()
        .delete_override(&admin_tables(config), field)
        .await
        .map_err(AdminError::unwritten)?;
    let removed = removed.ok_or(AdminError::NoOverride)?;
    Ok(serde_json::from_str::<Override>(&removed).ok())
}

/// The override a `PUT` or `DELETE` names (through `routes`): a common limit's, named through
/// any route that uses it or none, is one override for every route using it (named
/// [`COMMON`]).
fn named_override(
    params: &Params,
    caller: &Caller,
    routes: &RouteTable,
) -> Result<QuotaOverride, AdminError> {
    let through = params.route_in(routes)?;
    let limit = params.limit()?;
    let common = routes
        .named(through)
        .is_some_and(|route| route.tiers.uses_common(limit));
    Ok(QuotaOverride {
        route: match common {
            true => COMMON.to_string(),
            false => through.to_string(),
        },
        limit: params.limit()?.to_string(),
        consumer: params.consumer.clone(),
        quota: None,
        actor: caller.actor.clone(),
    })
}

/// Why an override of `limit` cannot apply, as the API refuses it.
fn unfit(why: Unfit, limit: &str) -> AdminError {
    match why {
        Unfit::NoRoute(route) => AdminError::NoRoute(route),
        Unfit::NoLimit { limit, .. } => AdminError::NoLimit(limit),
        Unfit::ConsumerBounds => AdminError::Malformed {
            name: "consumer",
            why: why.to_string().into(),
        },
        Unfit::NoConsumers(route) => AdminError::NoConsumers(route),
        Unfit::Quota(reason) => AdminError::Quota {
            limit: limit.to_string(),
            why: reason,
        },
    }
}

/// `PUT /v1/quota/overrides`: a limit lifted (`quota=off`) or at another quota, for
/// `ttl_seconds` or until `until`.
async fn set(policy: &Policy, live: &InForce, asked: Asked<'_>) -> Result<Value, AdminError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let (params, caller) = (asked.1, asked.2);
    let written = async {
        let mut one = named_override(params, caller, &config.routes)?;
        one.quota = match params.quota()? {
            Quota::Off => None,
            Quota::Units(units) => Some(units),
        };
        let lifetime = params.lifetime(jiff::Timestamp::now())?;
        let limit = one
            .check(&config.routes)
            .map_err(|why| unfit(why, &one.limit))?;
        if !policy.admin_reaches(limit) {
            return Err(AdminError::LocalLimit(one.limit.clone()));
        }
        if limit.global.is_some() {
            return Err(AdminError::GlobalLimit(one.limit.clone()));
        }
        known(config, params)?;
        let previous = put(policy, config, &Override::Limit(one.clone()), lifetime).await?;
        apply_now(policy, live).await;
        let before = previous.map(|p| shown(&p, 0));
        let after = shown(&Override::Limit(one), lifetime.as_secs());
        Ok((json!({ "before": before, "after": after }), "applied"))
    };
    concluded(&snapshot.audit_log, asked, written.await).await
}

/// `DELETE /v1/quota/overrides`: the limit back to its configured quota (an override of a
/// limit local to each gateway, set before it was one, can be removed too).
async fn remove(policy: &Policy, live: &InForce, asked: Asked<'_>) -> Result<Value, AdminError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let (params, caller) = (asked.1, asked.2);
    let written = async {
        let one = named_override(params, caller, &config.routes)?;
        let previous = delete(policy, config, &one.field()).await?;
        apply_now(policy, live).await;
        let before = previous.map(|p| shown(&p, 0));
        Ok((json!({ "before": before, "after": null }), "applied"))
    };
    concluded(&snapshot.audit_log, asked, written.await).await
}

/// The plan override a `PUT` names: a known consumer (1 to 256 bytes) and a plan of the
/// configuration.
fn named_plan(
    config: &Config,
    params: &Params,
    caller: &Caller,
) -> Result<PlanOverride, AdminError> {
    let consumer = params.consumer()?;
    if consumer.is_empty() || consumer.len() > MAX_CONSUMER_ID {
        return Err(AdminError::Malformed {
            name: "consumer",
            why: format!("1 to {MAX_CONSUMER_ID} bytes").into(),
        });
    }
    let plan = params.plan()?;
    if config.consumers.plans().find(plan).is_none() {
        return Err(AdminError::NoPlan(plan.to_string()));
    }
    known(config, params)?;
    Ok(PlanOverride {
        consumer: consumer.to_string(),
        plan: plan.to_string(),
        actor: caller.actor.clone(),
    })
}

/// `PUT /v1/quota/plans`: a consumer on another plan, on every route, until `until` (or for
/// `ttl_seconds`): its requests meet that plan's limits exactly, as that plan's consumers do.
async fn set_plan(policy: &Policy, live: &InForce, asked: Asked<'_>) -> Result<Value, AdminError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let (params, caller) = (asked.1, asked.2);
    let written = async {
        let one = Override::Plan(named_plan(config, params, caller)?);
        let lifetime = params.lifetime(jiff::Timestamp::now())?;
        let previous = put(policy, config, &one, lifetime).await?;
        apply_now(policy, live).await;
        let before = previous.map(|p| shown(&p, 0));
        let after = shown(&one, lifetime.as_secs());
        Ok((json!({ "before": before, "after": after }), "applied"))
    };
    concluded(&snapshot.audit_log, asked, written.await).await
}

/// `DELETE /v1/quota/plans`: the consumer back on its own plan.
async fn remove_plan(
    policy: &Policy,
    live: &InForce,
    asked: Asked<'_>,
) -> Result<Value, AdminError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let params = asked.1;
    let written = async {
        let one = PlanOverride {
            consumer: params.consumer()?.to_string(),
            plan: String::new(),
            actor: None,
        };
        let previous = delete(policy, config, &one.field()).await?;
        apply_now(policy, live).await;
        let before = previous.map(|p| shown(&p, 0));
        Ok((json!({ "before": before, "after": null }), "applied"))
    };
    concluded(&snapshot.audit_log, asked, written.await).await
}

/// Applies the overrides in force on this gateway now (the others read them within a second).
async fn apply_now(policy: &Policy, live: &InForce) {
    if let Err(e) = refresh(policy, live).await {
        log::warn!(
            "quota admin: the override is stored; this gateway applies it at its next read ({e})"
        );
    }
}
