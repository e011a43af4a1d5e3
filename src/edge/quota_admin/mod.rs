//! The quota admin API on the admin listener, behind `admin.token` (`admin.rs` checks it):
//! `POST /v1/quota/reset` and `POST /v1/quota/credit` change a consumer's (or a client
//! address's, or a route's) usage of its limits; `GET`, `PUT` and `DELETE /v1/quota/overrides`
//! list, set and remove temporary overrides (a limit lifted, or at another quota, until they
//! expire). Each write changes the state where the limits live (one atomic call of
//! `lua/admin.lua` in Redis, or the in-process backend), so it holds on every gateway at once;
//! overrides reach every gateway within a second (`runtime::overrides`). Each write is
//! audited (a JSON line: who, what, before and after) and counted
//! (`sluice_admin_changes_total`).

use std::borrow::Cow;
use std::fs::OpenOptions;
use std::io::Write;
use std::time::Duration;

use http::{HeaderMap, Method};
use serde_json::{json, Value};

use crate::config::Config;
use crate::edge::usage::UsageError;
use crate::limiter::admin::credit_kind;
use crate::limiter::{Credited, Policy, QuotaStore};
use crate::observe::metrics::ADMIN_CHANGES;
use crate::route::overrides::QuotaOverride;
use crate::runtime::overrides::{admin_tables, refresh};
use crate::runtime::snapshot::Live;
use target::{after_write, remaining, target};

mod target;

/// The longest an override may last: 30 days.
const MAX_OVERRIDE_SECONDS: u64 = 30 * 24 * 3600;
/// The most units one credit gives back.
const MAX_CREDIT_UNITS: u64 = 1_000_000_000;
/// The longest credit id.
const MAX_CREDIT_ID: usize = 128;
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
    pub fn of(peer: Option<String>, headers: &HeaderMap) -> Result<Caller, UsageError> {
        let Some(value) = headers.get("x-audit-actor") else {
            return Ok(Caller { peer, actor: None });
        };
        let visible = |b: &u8| b.is_ascii_graphic() || *b == b' ';
        let bytes = value.as_bytes();
        if bytes.is_empty() || bytes.len() > MAX_ACTOR || !bytes.iter().all(visible) {
            return Err(refused(
                400,
                "X-Audit-Actor: 1 to 128 visible ASCII characters",
            ));
        }
        let actor = String::from_utf8_lossy(bytes).into_owned();
        Ok(Caller {
            peer,
            actor: Some(actor),
        })
    }
}

pub(super) fn refused(status: u16, reason: impl Into<Cow<'static, str>>) -> UsageError {
    UsageError {
        status,
        reason: reason.into(),
    }
}

/// What a call names: the query's parameters.
#[derive(Debug, Default)]
pub(super) struct Params {
    pub(super) route: Option<String>,
    pub(super) limit: Option<String>,
    pub(super) consumer: Option<String>,
    pub(super) plan: Option<String>,
    pub(super) client_ip: Option<String>,
    pub(super) units: Option<String>,
    pub(super) id: Option<String>,
    pub(super) quota: Option<String>,
    pub(super) ttl_seconds: Option<String>,
}

fn parse(query: Option<&str>) -> Result<Params, UsageError> {
    let mut params = Params::default();
    for (name, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let slot = match &*name {
            "route" => &mut params.route,
            "limit" => &mut params.limit,
            "consumer" => &mut params.consumer,
            "plan" => &mut params.plan,
            "client_ip" => &mut params.client_ip,
            "units" => &mut params.units,
            "id" => &mut params.id,
            "quota" => &mut params.quota,
            "ttl_seconds" => &mut params.ttl_seconds,
            _ => return Err(refused(400, format!("unknown parameter {name:?}"))),
        };
        *slot = Some(value.into_owned());
    }
    Ok(params)
}

/// A whole number from `min` to `max` named `name`.
fn number(text: Option<&str>, name: &str, (min, max): (u64, u64)) -> Result<u64, UsageError> {
    let text = text.ok_or_else(|| refused(400, format!("{name} is required")))?;
    text.parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| refused(400, format!("{name}: a whole number from {min} to {max}")))
}

/// Serves one call of the quota admin API at `path`: the JSON answer, or why not.
pub async fn serve(
    policy: &Policy,
    live: &Live,
    (path, method): (&str, &Method),
    query: Option<&str>,
    caller: &Caller,
) -> Result<String, UsageError> {
    let params = parse(query)?;
    let answer = match (path, method) {
        ("/v1/quota/reset", &Method::POST) => reset(policy, live, &params, caller).await?,
        ("/v1/quota/credit", &Method::POST) => credit(policy, live, &params, caller).await?,
        ("/v1/quota/overrides", &Method::GET) => list(policy, live).await?,
        ("/v1/quota/overrides", &Method::PUT) => set(policy, live, &params, caller).await?,
        ("/v1/quota/overrides", &Method::DELETE) => remove(policy, live, &params, caller).await?,
        ("/v1/quota/overrides", _) => return Err(refused(405, "use GET, PUT or DELETE")),
        ("/v1/quota/reset" | "/v1/quota/credit", _) => return Err(refused(405, "use POST")),
        _ => return Err(refused(404, "not found")),
    };
    Ok(answer.to_string())
}

/// The common part of an audit line and of the answer: who changed what.
fn subject(params: &Params, caller: &Caller) -> serde_json::Map<String, Value> {
    let mut what = serde_json::Map::new();
    what.insert("actor".into(), json!(caller.actor));
    what.insert("peer".into(), json!(caller.peer));
    for (name, value) in [
        ("route", &params.route),
        ("limit", &params.limit),
        ("consumer", &params.consumer),
        ("client_ip", &params.client_ip),
    ] {
        if let Some(value) = value {
            what.insert(name.into(), json!(value));
        }
    }
    what
}

/// Counts a write and writes its audit line (`action`, `result` and the rest of `line`).
fn audit(config: &Config, action: &str, result: &str, mut line: serde_json::Map<String, Value>) {
    ADMIN_CHANGES.with_label_values(&[action, result]).inc();
    line.insert(
        "time".into(),
        json!(format!("{:.3}", jiff::Timestamp::now())),
    );
    line.insert("audit".into(), json!("quota"));
    line.insert("action".into(), json!(action));
    line.insert("result".into(), json!(result));
    let mut text = Value::Object(line).to_string();
    text.push('\n');
    let written = match &config.admin_audit_log {
        Some(path) => OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(text.as_bytes())),
        None => std::io::stdout().lock().write_all(text.as_bytes()),
    };
    if let Err(e) = written {
        log::error!(
            "quota admin: cannot write the audit line ({e}): {}",
            text.trim_end()
        );
    }
}

/// What a write did, or why it did not: its change and result.
type Written = Result<(Value, &'static str), UsageError>;

/// The end of every write: its audit line and count, and the answer (the line itself), or the
/// refusal, audited too.
fn concluded(
    config: &Config,
    (action, params, caller): (&str, &Params, &Caller),
    written: Written,
) -> Result<Value, UsageError> {
    match written {
        Ok((change, result)) => {
            let mut line = subject(params, caller);
            extend(&mut line, &change);
            audit(config, action, result, line.clone());
            Ok(Value::Object(line))
        }
        Err(refusal) => Err(audit_refusal(config, action, params, caller, refusal)),
    }
}

/// Audits a write that did not happen, and passes its refusal on.
fn audit_refusal(
    config: &Config,
    action: &str,
    params: &Params,
    caller: &Caller,
    refusal: UsageError,
) -> UsageError {
    let result = if refusal.status >= 500 {
        "failed"
    } else {
        "refused"
    };
    let mut line = subject(params, caller);
    line.insert("reason".into(), json!(&*refusal.reason));
    audit(config, action, result, line);
    refusal
}

fn unwritten(e: crate::limiter::LimiterError) -> UsageError {
    // The store's own refusal (the most overrides in force) is the caller's to mend.
    if e.to_string().contains("overrides full") {
        return refused(409, e.to_string());
    }
    refused(503, format!("the limiter cannot be written: {e}"))
}

/// `POST /v1/quota/reset`: every named limit back to its full quota.
async fn reset(
    policy: &Policy,
    live: &Live,
    params: &Params,
    caller: &Caller,
) -> Result<Value, UsageError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let written = async {
        let target = target(&snapshot, params, policy.backend() == "redis")?;
        let before = remaining(policy, &target).await?;
        let records = target.facts.records(&target)?;
        let keys: Vec<&[u8]> = target
            .chosen
            .iter()
            .map(|&i| &records[i].ask.key[..])
            .collect();
        let existed = policy.engine().reset(&keys).await.map_err(unwritten)?;
        announce(policy, config).await;
        let after = after_write(policy, &target).await;
        let change = json!({ "before": before, "after": after, "keys_reset": existed });
        Ok((change, "applied"))
    };
    concluded(config, ("reset", params, caller), written.await)
}

/// `POST /v1/quota/credit`: units given back to one limit, once per id.
async fn credit(
    policy: &Policy,
    live: &Live,
    params: &Params,
    caller: &Caller,
) -> Result<Value, UsageError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let written = async {
        if params.limit.is_none() {
            return Err(refused(400, "limit is required"));
        }
        let units = number(params.units.as_deref(), "units", (1, MAX_CREDIT_UNITS))?;
        let id = params
            .id
            .as_deref()
            .filter(|id| !id.is_empty() && id.len() <= MAX_CREDIT_ID)
            .ok_or_else(|| refused(400, format!("id is required: 1 to {MAX_CREDIT_ID} bytes, the same for a credit sent again")))?;
        let target = target(&snapshot, params, policy.backend() == "redis")?;
        let index = target.chosen[0];
        let algorithm = &target.tier.limits[index].limit.exact.algorithm;
        if credit_kind(algorithm).is_none() {
            return Err(refused(409, "credit applies to gcra, token_bucket, leaky_bucket, fixed_window and calendar limits; reset the others"));
        }
        let before = remaining(policy, &target).await?;
        let records = target.facts.records(&target)?;
        let key = &records[index].ask.key[..];
        let credited = policy
            .engine()
            .credit(algorithm, key, units, id)
            .await
            .map_err(unwritten)?;
        if credited == Credited::Changed {
            announce(policy, config).await;
        }
        let after = after_write(policy, &target).await;
        let mut change = json!({ "units": units, "id": id, "before": before, "after": after });
        let (result, said) = match credited {
            Credited::Changed => ("applied", "credited"),
            Credited::NothingUsed => ("applied", "nothing_used"),
            Credited::Repeated => ("repeated", "repeated"),
        };
        change["credit"] = json!(said);
        Ok((change, result))
    };
    concluded(config, ("credit", params, caller), written.await)
}

/// Tells every gateway a reset or credit happened (they forget the denials they cached), and
/// this one at once.
async fn announce(policy: &Policy, config: &Config) {
    if let Err(e) = policy.engine().announce(&admin_tables(config)).await {
        log::warn!("quota admin: the change is made, but other gateways may keep cached denials until they expire ({e})");
    }
    policy.engine().forget_denials();
}

fn extend(line: &mut serde_json::Map<String, Value>, change: &Value) {
    if let Value::Object(fields) = change {
        line.extend(fields.clone());
    }
}

/// `GET /v1/quota/overrides`: the overrides in force.
async fn list(policy: &Policy, live: &Live) -> Result<Value, UsageError> {
    let snapshot = live.load_full();
    let listed = policy
        .engine()
        .overrides(&admin_tables(&snapshot.config))
        .await
        .map_err(|e| refused(503, format!("the limiter cannot be read: {e}")))?;
    let overrides = listed.overrides.iter().filter_map(|stored| {
        let one: QuotaOverride = serde_json::from_str(&stored.value).ok()?;
        Some(shown(&one, stored.left_ms.div_ceil(1000)))
    });
    Ok(json!({ "overrides": overrides.collect::<Vec<_>>() }))
}

/// An override as the API shows it: `quota` a number or `"off"`.
fn shown(one: &QuotaOverride, expires_in_seconds: u64) -> Value {
    let quota = one.quota.map_or(json!("off"), |q| json!(q));
    json!({
        "route": one.route,
        "limit": one.limit,
        "consumer": one.consumer,
        "quota": quota,
        "expires_in_seconds": expires_in_seconds,
        "actor": one.actor,
    })
}

/// The override a `PUT` or `DELETE` names.
fn named_override(params: &Params, caller: &Caller) -> Result<QuotaOverride, UsageError> {
    let route = params
        .route
        .clone()
        .ok_or_else(|| refused(400, "route is required"))?;
    let limit = params
        .limit
        .clone()
        .ok_or_else(|| refused(400, "limit is required"))?;
    Ok(QuotaOverride {
        route,
        limit,
        consumer: params.consumer.clone(),
        quota: None,
        actor: caller.actor.clone(),
    })
}

/// `PUT /v1/quota/overrides`: a limit lifted (`quota=off`) or at another quota, for
/// `ttl_seconds`.
async fn set(
    policy: &Policy,
    live: &Live,
    params: &Params,
    caller: &Caller,
) -> Result<Value, UsageError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let written = async {
        let mut one = named_override(params, caller)?;
        one.quota = match params.quota.as_deref() {
            Some("off") => None,
            quota => Some(number(quota, "quota (or off)", (1, u64::MAX))?),
        };
        let ttl = number(
            params.ttl_seconds.as_deref(),
            "ttl_seconds",
            (1, MAX_OVERRIDE_SECONDS),
        )?;
        one.check(&config.routes).map_err(|why| refused(409, why))?;
        let value = serde_json::to_string(&one).map_err(|e| refused(500, e.to_string()))?;
        let tables = admin_tables(config);
        let lifetime = Duration::from_secs(ttl);
        let engine = policy.engine();
        let previous = engine
            .put_override(&tables, &one.field(), &value, lifetime)
            .await
            .map_err(unwritten)?;
        apply_now(policy, live).await;
        let previous = previous.and_then(|p| serde_json::from_str::<QuotaOverride>(&p).ok());
        let before = previous.map(|p| shown(&p, 0));
        let change = json!({ "before": before, "after": shown(&one, ttl) });
        Ok((change, "applied"))
    };
    concluded(config, ("override_set", params, caller), written.await)
}

/// `DELETE /v1/quota/overrides`: the limit back to its configured quota.
async fn remove(
    policy: &Policy,
    live: &Live,
    params: &Params,
    caller: &Caller,
) -> Result<Value, UsageError> {
    let snapshot = live.load_full();
    let config = &snapshot.config;
    let written = async {
        let one = named_override(params, caller)?;
        let tables = admin_tables(config);
        let previous = policy
            .engine()
            .delete_override(&tables, &one.field())
            .await
            .map_err(unwritten)?;
        let Some(previous) = previous else {
            return Err(refused(404, "no such override in force"));
        };
        apply_now(policy, live).await;
        let before = serde_json::from_str::<QuotaOverride>(&previous)
            .ok()
            .map(|p| shown(&p, 0));
        Ok((json!({ "before": before, "after": null }), "applied"))
    };
    concluded(config, ("override_delete", params, caller), written.await)
}

/// Applies the overrides in force on this gateway now (the others read them within a second).
async fn apply_now(policy: &Policy, live: &Live) {
    if let Err(e) = refresh(policy, live).await {
        log::warn!(
            "quota admin: the override is stored; this gateway applies it at its next read ({e})"
        );
    }
}
