//! The dashboard's views, each rendered whole on the server (readable without JavaScript):
//! the overview, the routes, the live decisions, the most limited keys and consumers, and the
//! explain form. Never a secret: Redis URLs are redacted, keys shown as stored (digests), no
//! API key hash, JWT secret or admin token.

use std::fmt::Write;
use std::time::SystemTime;

use serde_json::{json, Value};

use super::html::{bars, esc, facts, page, table};
use crate::caller::consumers::{PlanSlot, NO_PLAN};
use crate::edge::explain::Description;
use crate::edge::readiness::ReadyState;
use crate::exchange::explain::Explanation;
use crate::exchange::site::RouteRuntime;
use crate::exchange::Site;
use crate::limiter::guard::BreakerState;
use crate::limiter::redis::topology::redacted_url;
use crate::limiter::FailureMode;
use crate::limiter::Topology;
use crate::observe::live::{Counts, LiveViews, Reload, Series, ServerErrorCount};
use crate::route::describe::{self, LimitShown, Millis, Parameters};
use crate::route::table::Route;
use crate::route::tiers::TierId;
use crate::runtime::durability::Warning;
use crate::upstream::health::{HealthRecord, HealthState};
use crate::upstream::pool::Pool;

/// How many seconds the live view shows as bars, and sums as "the last minute".
const BARS_SECONDS: usize = 120;
const MINUTE: usize = 60;

/// The overview: version, uptime, configuration generation and reloads, Redis (the settings in
/// force) and its breaker, what waits for a graceful upgrade, readiness, quotas at risk.
pub fn overview(
    site: &Site<Pool>,
    readiness: &ReadyState,
    risk: Option<&Warning>,
    breaker: Option<BreakerState>,
) -> String {
    let uptime = SystemTime::now()
        .duration_since(site.views.started)
        .map_or(0, |d| d.as_secs());
    let (generation, reloads) = site.views.reloads.history();
    let last = last_reload(reloads.first());
    let ready = ready(readiness);
    let config = &site.config;
    let body = facts(&[
        ("Version", esc(env!("CARGO_PKG_VERSION"))),
        ("Uptime", duration(uptime)),
        (
            "Configuration",
            format!(
                "{} (generation {generation})",
                esc(&config.source.display().to_string())
            ),
        ),
        ("Last reload", last),
        ("Limiter", limiter(site, breaker)),
        ("Waits for an upgrade", waiting(&config.pending_upgrade)),
        ("Failure mode", failure_modes(site)),
        ("Readiness", ready),
        ("Quota durability", quota_durability(risk)),
        ("Routes", config.routes.in_file_order().len().to_string()),
    ]);
    let errors: Vec<Vec<String>> = reloads
        .iter()
        .filter_map(|r| {
            let error = r.error.as_ref()?;
            Some(vec![
                ago(r.at),
                esc(&r.cause),
                format!("<pre>{}</pre>", esc(error)),
            ])
        })
        .collect();
    let errors = match errors.is_empty() {
        true => "<p class=\"muted\">No reload was rejected.</p>".to_string(),
        false => table(&["When", "Cause", "Problems"], errors),
    };
    page(
        "Overview",
        "/ui/",
        &format!(
            "{body}{}<h2>Recent reload errors</h2>{errors}",
            regions(config)
        ),
    )
}

/// With `regions:`: this region, whether this gateway runs its region sync, and each peer's
/// staleness and clock skew (region sync's metrics), red past what the bounds assume: a peer
/// heard later than 4 × (T + d), a skew above min(1 s, the shortest global window / 100).
fn regions(config: &crate::config::Config) -> String {
    use crate::observe::metrics::{
        REGION_CLOCK_SKEW, REGION_PEER_MISMATCH, REGION_PEER_STALENESS, REGION_SYNC_HOLDER,
    };
    let Some(settings) = &config.regions else {
        return String::new();
    };
    let regions = &settings.regions;
    let late = regions.shortest_window().as_secs_f64();
    let rows: Vec<Vec<String>> = regions
        .peers()
        .map(|(_, peer)| {
            let name: &str = &peer.name;
            let stale = REGION_PEER_STALENESS.with_label_values(&[name]).get();
            let skew = REGION_CLOCK_SKEW.with_label_values(&[name]).get();
            let differs = REGION_PEER_MISMATCH.with_label_values(&[name]).get() == 1;
            let flag = |bad: bool, text: String| match bad {
                true => format!("<span class=\"bad\">{text}</span>"),
                false => text,
            };
            vec![
                esc(name),
                flag(stale > late, format!("{stale:.1} s")),
                flag(skew.abs() > 1.0, format!("{:+.0} ms", skew * 1e3)),
                flag(
                    differs,
                    if differs { "differs" } else { "same" }.to_string(),
                ),
            ]
        })
        .collect();
    let holder = match REGION_SYNC_HOLDER.get() {
        1 => "this gateway holds the region's sync lease",
        _ => "another gateway of the region runs region sync (or none yet)",
    };
    format!(
        "<h2>Regions</h2><p>This is <code>{}</code> of {}; region sync every {} ms, delays up to {} ms assumed; {holder}. Limits with <code>scope: global</code> are one limit across them (<code>sluice_region_*</code> metrics).</p>{}",
        esc(regions.this_name()),
        regions.list.len(),
        regions.every.as_millis(),
        regions.max_delay.as_millis(),
        table(&["Peer region", "Heard from", "Clock skew", "Configuration"], rows)
    )
}

/// The last reload, `None` since the start: in force, or rejected.
fn last_reload(last: Option<&Reload>) -> String {
    match last {
        None => "none since the start".to_string(),
        Some(r) if r.error.is_none() => format!(
            "<span class=\"ok\">in force</span> ({}, {})",
            esc(&r.cause),
            ago(r.at)
        ),
        Some(r) => format!(
            "<span class=\"bad\">rejected</span> ({}, {}): the previous configuration stays",
            esc(&r.cause),
            ago(r.at)
        ),
    }
}

/// The gateway's readiness in its own colour and words (what waits for an upgrade has a row
/// of its own).
fn ready(state: &ReadyState) -> String {
    let name = state.name();
    format!(
        "<span id=\"readiness\" class=\"state state-{name}\" data-state=\"{name}\">{}</span> <span class=\"muted\">(<code>/readyz</code>: {})</span>",
        esc(&state.words()),
        state.status()
    )
}

/// The failure mode of the configuration, and the routes that set another: what an outage of
/// the limiter does to each.
fn failure_modes(site: &Site<Pool>) -> String {
    let default = site.config.failure_mode;
    let mut others: Vec<(FailureMode, Vec<String>)> = Vec::new();
    for route in site.config.routes.in_file_order() {
        let mode = route.tiers.default().rules.failure_mode();
        if mode == default {
            continue;
        }
        match others.iter_mut().find(|(m, _)| *m == mode) {
            Some((_, names)) => names.push(esc(&route.name)),
            None => others.push((mode, vec![esc(&route.name)])),
        }
    }
    if others.is_empty() {
        return format!("{} on every route", esc(default.label()));
    }
    let mut said = format!("{} by default", esc(default.label()));
    for (mode, names) in &others {
        let _ = write!(said, "; {} on {}", esc(mode.label()), names.join(", "));
    }
    said
}

/// Whether the quotas survive Redis restarting: the warning, or that none is known at risk.
fn quota_durability(risk: Option<&Warning>) -> String {
    match risk {
        Some(warning) => format!("<span class=\"bad\">{}</span>", esc(&warning.to_string())),
        None => "no quota known at risk".to_string(),
    }
}

/// Where the limits live: Redis (redacted, with the state of its `breaker` as the policy
/// reads it) or in-process.
fn limiter(site: &Site<Pool>, breaker: Option<BreakerState>) -> String {
    let Some(redis) = &site.config.redis else {
        return "in-process (no Redis configured)".to_string();
    };
    let topology = topology(&redis.topology);
    let breaker = breaker_words(breaker);
    format!(
        "{}, timeout {} ms, key prefix <code>{}</code>; breaker {breaker}",
        esc(&topology),
        redis.timeout.as_millis(),
        esc(&redis.key_prefix)
    )
}

/// The breaker's state in words, coloured: closed is the only good one.
fn breaker_words(breaker: Option<BreakerState>) -> &'static str {
    match breaker {
        Some(BreakerState::Closed) => "<span class=\"ok\">closed</span> (calling Redis)",
        Some(BreakerState::Open) => "<span class=\"bad\">open</span> (failing fast)",
        Some(BreakerState::HalfOpen) => "<span class=\"bad\">half-open</span> (probing)",
        None => "none (the limits are decided in-process until a graceful upgrade)",
    }
}

/// What the file changes that the running process keeps until a graceful upgrade, with the
/// values in force and the file's where they may be shown.
fn waiting(pending: &[crate::config::PendingChange]) -> String {
    if pending.is_empty() {
        return "nothing: the file is in force".to_string();
    }
    let changes: Vec<String> = pending
        .iter()
        .map(|change| match &change.values {
            Some((running, file)) => format!(
                "<code>{}</code> ({} in force, {} in the file)",
                esc(change.path),
                esc(running),
                esc(file)
            ),
            None => format!("<code>{}</code>", esc(change.path)),
        })
        .collect();
    format!(
        "{}: the running values stay until a graceful upgrade (<code>sluice -u</code>)",
        changes.join(", ")
    )
}

/// Where Redis is, its URLs without their passwords.
fn topology(topology: &Topology) -> String {
    let redacted = |urls: &[String]| {
        let urls: Vec<String> = urls.iter().map(|url| redacted_url(url)).collect();
        urls.join(", ")
    };
    match topology {
        Topology::Standalone { url } => format!("Redis {}", redacted_url(url)),
        Topology::Cluster { nodes } => format!("Redis Cluster ({})", redacted(nodes)),
        Topology::Sentinel {
            sentinels,
            master_name,
        } => format!(
            "Redis Sentinel master {master_name} ({})",
            redacted(sentinels)
        ),
    }
}

/// `seconds` as days, hours, minutes and seconds.
fn duration(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    match d {
        0 => format!("{h}h {m}m {s}s"),
        _ => format!("{d}d {h}h {m}m"),
    }
}

/// How long ago the Unix time `at` was.
fn ago(at: u64) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("{} ago", duration(now.saturating_sub(at)))
}

/// Every upstream server once (its health, the routes that list it, its recent errors), then
/// every route: what it matches, its tiers and limits, its adaptive concurrency, its upstream.
pub fn routes(site: &Site<Pool>, health: &HealthRecord) -> String {
    let mut body = upstream_servers(health, &site.views);
    for route in site.config.routes.in_file_order() {
        body.push_str(&route_section(site, route));
    }
    page("Routes", "/ui/routes", &body)
}

/// The "Upstream servers" table: each server once, whatever the routes that list it.
fn upstream_servers(health: &HealthRecord, views: &LiveViews) -> String {
    let rows = health.servers().iter().map(|server| {
        let routes: Vec<String> = server.routes().iter().map(|r| esc(r)).collect();
        let (recent, total) = errors(views, server.server);
        vec![
            format!("<code>{}</code>", server.server),
            health_state(server.state()),
            routes.join(", "),
            recent,
            total,
        ]
    });
    let head = [
        "Server",
        "Health",
        "Routes",
        "Errors (60 s)",
        "Errors (since start)",
    ];
    format!(
        "<h2>Upstream servers</h2><p class=\"muted\">Each server once: its state is the same on every route that lists it (checked when one of them has <code>health_check_interval_ms</code>; a server no route checks is <em>not checked</em>, and every request may still meet it: its errors tell). A server whose answers failed too often in a row is <em>ejected</em> for a while (passive health, <code>sluice_upstream_ejections_total</code>). Errors are failed attempts (<code>sluice_upstream_server_errors_total</code>), sampled each second.</p><div id=\"upstream-servers\">{}</div>",
        table(&head, rows)
    )
}

/// A server's health state, in its colour and words.
fn health_state(state: HealthState) -> String {
    let name = state.name();
    format!(
        "<span class=\"health health-{name}\" data-field=\"health\" data-state=\"{name}\">{}</span>",
        state.words()
    )
}

/// A server's failed attempts by kind, in the last minute and since the start, as cells.
fn errors(views: &LiveViews, server: std::net::SocketAddr) -> (String, String) {
    let counts = views.server_errors.of(&server.to_string());
    let said = |n: fn(&ServerErrorCount) -> u64| {
        let said: Vec<String> = counts
            .iter()
            .filter(|c| n(c) > 0)
            .map(|c| format!("{} {}", n(c), c.kind))
            .collect();
        match said.is_empty() {
            true => "none".to_string(),
            false => said.join(", "),
        }
    };
    (
        format!(
            "<span data-field=\"recent_errors\">{}</span>",
            said(|c| c.recent)
        ),
        format!(
            "<span data-field=\"total_errors\">{}</span>",
            said(|c| c.total)
        ),
    )
}

fn route_section(site: &Site<Pool>, route: &Route) -> String {
    let health = site
        .route(route.index)
        .map(|runtime| runtime.servers.health());
    let servers: Vec<Vec<String>> = health
        .unwrap_or_default()
        .into_iter()
        .map(|(server, state)| {
            let (recent, _) = errors(&site.views, server);
            vec![
                format!("<code>{server}</code>"),
                health_state(state),
                recent,
            ]
        })
        .collect();
    let mut out = format!(
        "<h2>{}</h2><p><code>{}</code> · auth {}</p>",
        esc(&route.name),
        esc(&describe::route_match(&route.matcher)),
        esc(auth(route))
    );
    for (index, tier) in route.tiers.all().iter().enumerate() {
        let id = TierId(index as u16);
        let _ = write!(out, "<p>{}</p>", esc(&tier_callers(site, route, id)));
        let rows = tier
            .limits
            .iter()
            .map(|limit| limit_row(&describe::limit(&limit.limit.exact, &limit.key)));
        out.push_str(&table(
            &["Limit", "Algorithm", "Quota", "Key", "Mode", "Flags"],
            rows,
        ));
    }
    if let Some(runtime) = site.route(route.index) {
        out.push_str(&adaptive(site, runtime));
    }
    let head = ["Upstream server", "Health", "Errors (60 s)"];
    let _ = write!(
        out,
        "<div class=\"route-upstream\" data-route=\"{}\">{}</div>",
        esc(&route.name),
        table(&head, servers)
    );
    out
}

/// A route's adaptive concurrency on this gateway: the limit admissions meet now (pinned to
/// the minimum while a baseline is measured), the baseline, the requests in flight, the bounds,
/// and the requests shed per plan. Nothing for a route without it.
fn adaptive(site: &Site<Pool>, runtime: &RouteRuntime<Pool>) -> String {
    let Some(limiter) = &runtime.adaptive else {
        return String::new();
    };
    let stats = limiter.stats();
    let limit = match stats.probing {
        true => format!(
            "{} (probing the baseline: pinned to the minimum)",
            stats.limit
        ),
        false => stats.limit.to_string(),
    };
    let baseline = stats.baseline.map_or("not measured yet".to_string(), |b| {
        format!("{:.1} ms", b.as_secs_f64() * 1000.0)
    });
    let plans = site.config.consumers.plans().names();
    let plan = |slot: PlanSlot| match slot.plan() {
        None => NO_PLAN,
        Some(plan) => plans.get(usize::from(plan.0)).map_or("?", |name| &**name),
    };
    let shed_by_plan = runtime.metrics.shed_by_plan();
    let shed: Vec<String> = PlanSlot::all(plans.len())
        .filter_map(|slot| {
            Some(format!(
                "{} {}",
                esc(plan(slot)),
                shed_by_plan.get(slot.index())?
            ))
        })
        .collect();
    let cells = [
        ("limit", limit),
        ("baseline", baseline),
        ("in_flight", stats.in_flight.to_string()),
        (
            "bounds",
            format!("{} to {}", stats.min_limit, stats.max_limit),
        ),
        ("shed", shed.join(", ")),
    ];
    let row = cells
        .into_iter()
        .map(|(field, text)| format!("<span data-field=\"{field}\">{text}</span>"))
        .collect();
    let head = [
        "Adaptive concurrency limit",
        "Baseline latency",
        "In flight",
        "Limit between",
        "Shed by plan",
    ];
    format!(
        "<div class=\"adaptive\" data-route=\"{}\">{}</div>",
        esc(&runtime.route.name),
        table(&head, [row])
    )
}

fn auth(route: &Route) -> &'static str {
    route.auth.mode.label()
}

/// Who meets tier `id` of `route`.
fn tier_callers(site: &Site<Pool>, route: &Route, id: TierId) -> String {
    if route.tiers.count() == 1 {
        return "Every caller meets:".to_string();
    }
    let plans = site.config.consumers.plans();
    let names: Vec<String> = route
        .tiers
        .plan_slots_of(id)
        .into_iter()
        .map(|slot| match slot.plan() {
            None => "callers without a plan".to_string(),
            Some(plan) => format!("plan {}", plans.name(plan)),
        })
        .collect();
    match names.is_empty() {
        true => format!("Tier {}: consumers with limits of their own", id.0),
        false => format!("Tier {}: {}", id.0, names.join(", ")),
    }
}

/// One limit (as `describe::limit` tells it) as a table row.
fn limit_row(shown: &LimitShown) -> Vec<String> {
    let quota = match (shown.quota, &shown.per) {
        (Some(quota), Some(per)) => format!("{quota} per {per}"),
        _ => serde_json::to_string(&shown.parameters).unwrap_or_default(),
    };
    let flags = [
        ("common", shown.common),
        ("shadow", shown.shadow),
        ("hidden", shown.hidden),
        ("priced_by_response", shown.priced_by_response),
    ];
    let flags: Vec<&str> = flags
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
    vec![
        esc(&shown.name),
        format!(
            "{} <span class=\"muted\">{}</span>",
            esc(shown.algorithm),
            esc(&parameters(&shown.parameters))
        ),
        esc(&quota),
        format!("<code>{}</code>", esc(&shown.key.join(", "))),
        esc(&format!("{}, {}", shown.mode.label(), shown.scope.label())),
        esc(&flags.join(", ")),
    ]
}

/// An algorithm's parameters in words: `limit 3, window 3600 s`.
fn parameters(parameters: &Parameters) -> String {
    let said = match parameters {
        Parameters::Gcra {
            burst_window_ms,
            capacity,
            emission_ms,
            max_delay_ms,
        } => vec![
            ms("burst window", *burst_window_ms),
            format!("capacity {capacity}"),
            ms("emission", *emission_ms),
            ms("max delay", *max_delay_ms),
        ],
        Parameters::Window { limit, window_ms } => {
            vec![format!("limit {limit}"), ms("window", *window_ms)]
        }
        Parameters::Calendar { limit, period } => {
            vec![format!("limit {limit}"), format!("period {period}")]
        }
        Parameters::Concurrency { max, slot_ttl_ms } => {
            vec![format!("max {max}"), ms("slot ttl", *slot_ttl_ms)]
        }
    };
    said.join(", ")
}

/// A duration named `name`: in seconds from one second up, in milliseconds below.
fn ms(name: &str, millis: Millis) -> String {
    match millis.ms() {
        ms if ms >= 1000.0 => format!("{name} {} s", ms / 1000.0),
        _ => format!("{name} {millis} ms"),
    }
}

/// The live view's numbers of a series, in its columns' order: each count of the last
/// minute, then since the start (`data-field` names, as `/ui/live.json` has them).
const LIVE_FIELDS: [(&str, &str); 5] = [
    ("allowed", "Allowed"),
    ("limited", "Limited"),
    ("failure_admitted", "Failure mode admitted"),
    ("failure_refused", "Failure mode refused"),
    ("shadow", "Shadow"),
];

/// The count `field` (of [`LIVE_FIELDS`]) of `counts`.
fn count(counts: &Counts, field: &str) -> u64 {
    match field {
        "allowed" => counts.allowed,
        "limited" => counts.limited,
        "failure_admitted" => counts.failure_admitted,
        "failure_refused" => counts.failure_refused,
        _ => counts.shadow,
    }
}

/// The live view: each limit's decisions over the last minutes, redrawn by `app.js`.
pub fn live(views: &LiveViews) -> String {
    let mut header = String::from("<th>Route</th><th>Limit</th>");
    for (span, title) in [("60 s", "minute"), ("total", "total")] {
        for (field, name) in LIVE_FIELDS {
            let _ = write!(
                header,
                "<th class=\"num {field}\" title=\"{title}\">{name} ({span})</th>"
            );
        }
    }
    header.push_str("<th>Last 2 minutes</th>");
    let rows: String = views
        .decisions
        .recent(MINUTE.max(BARS_SECONDS))
        .iter()
        .map(live_row)
        .collect();
    let body = format!(
        "<p class=\"muted\">Per limit, sampled each second from the counters <code>/metrics</code> exports (<code>sluice_limit_decisions_total</code>): allowed counts <code>allowed</code>, limited <code>limited</code>, shadow <code>shadow_limited</code> (admitted: what a shadow limit would have refused). While the limiter cannot decide, the failure mode answers, and those answers have columns of their own: admitted counts <code>error_allowed</code> and <code>local_allowed</code>, refused <code>error_denied</code> and <code>local_limited</code> (the in-process fallback at this gateway's share). Bars: <span class=\"allowed\">allowed</span>, <span class=\"limited\">limited</span>, <span class=\"failure\">failure mode</span>. <span id=\"updated\"></span></p>\
         <table id=\"live\"><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>"
    );
    page("Live decisions", "/ui/live", &body)
}

/// One series of the live view as a table row.
fn live_row(series: &Series) -> String {
    let minute = last(series, MINUTE);
    let id = esc(&format!("{}/{}", series.route, series.limit));
    let mut row = format!(
        "<tr data-series=\"{id}\"><td>{}</td><td>{}</td>",
        esc(&series.route),
        esc(&series.limit)
    );
    for (span, counts) in [("minute", &minute), ("total", &series.totals)] {
        for (field, _) in LIVE_FIELDS {
            let n = count(counts, field);
            let _ = write!(
                row,
                "<td class=\"num {field}\" data-field=\"{span}_{field}\">{n}</td>"
            );
        }
    }
    let shown = seconds(series, BARS_SECONDS);
    let _ = write!(
        row,
        "<td data-field=\"bars\">{}</td></tr>",
        bars(&shown, "")
    );
    row
}

/// The sum of the last `n` seconds of `series`.
fn last(series: &Series, n: usize) -> Counts {
    let skip = series.seconds.len().saturating_sub(n);
    let seconds = series.seconds.iter().skip(skip);
    seconds.fold(Counts::default(), |sum, second| sum.plus(*second))
}

/// The last `n` seconds of `series`, as (allowed, limited, answered by the failure mode).
fn seconds(series: &Series, n: usize) -> Vec<[u64; 3]> {
    let skip = series.seconds.len().saturating_sub(n);
    series
        .seconds
        .iter()
        .skip(skip)
        .map(|s| [s.allowed, s.limited, s.by_failure_mode()])
        .collect()
}

/// `/ui/live.json`: what the live view shows, for `app.js`.
pub fn live_json(views: &LiveViews) -> Value {
    let counts = |c: Counts| {
        let fields = LIVE_FIELDS
            .iter()
            .map(|(field, _)| (*field, count(&c, field)));
        Value::Object(fields.map(|(f, n)| (f.to_string(), json!(n))).collect())
    };
    let series: Vec<Value> = views
        .decisions
        .recent(MINUTE.max(BARS_SECONDS))
        .iter()
        .map(|series| {
            json!({
                "route": &*series.route,
                "limit": &*series.limit,
                "totals": counts(series.totals),
                "last_minute": counts(last(series, MINUTE)),
                "seconds": seconds(series, BARS_SECONDS),
            })
        })
        .collect();
    json!({ "samples": views.decisions.samples(), "series": series })
}

/// The keys and consumers limited most since the start (space-saving top-k: a count may
/// exceed the true one by at most its error).
pub fn top(views: &LiveViews) -> String {
    let rows = |entries: Vec<crate::observe::live::Heavy>| {
        entries
            .into_iter()
            .map(|e| {
                vec![
                    format!("<code>{}</code>", esc(&e.name)),
                    e.count.to_string(),
                    e.error.to_string(),
                ]
            })
            .collect::<Vec<_>>()
    };
    let (limited_keys, limited_consumers) = (&views.limited_keys, &views.limited_consumers);
    let keys = rows(limited_keys.top());
    let consumers = rows(limited_consumers.top());
    let none = "<p class=\"muted\">Nothing limited yet.</p>";
    let section = |rows: Vec<Vec<String>>, what: &str| match rows.is_empty() {
        true => none.to_string(),
        false => table(&[what, "Times limited", "At most over by"], rows),
    };
    let skipped = limited_keys.skipped() + limited_consumers.skipped();
    let body = format!(
        "<p class=\"muted\">The {k} most limited since the start, counted in bounded space (space-saving): a name new to the list takes the place of the least counted and inherits its count as its possible error. Keys are shown as stored in the limiter (digests). Denials counted while the list was busy are skipped, not waited for: {skipped} so far.</p>\
         <h2>Keys</h2>{}<h2>Consumers</h2>{}",
        section(keys, "Route/limit and key"),
        section(consumers, "Consumer"),
        k = crate::observe::live::TOP_K,
    );
    page("Most limited", "/ui/top", &body)
}

/// The explain form, filled with `query`'s values, and `answer` (the explanation, or why
/// there is none) when the form was sent.
pub fn explain(sent: &Description, answer: Option<Result<Explanation, String>>) -> String {
    let value = |value: &Option<String>| esc(value.as_deref().unwrap_or(""));
    let method = match value(&sent.method) {
        m if m.is_empty() => "GET".to_string(),
        m => m,
    };
    let field = |label: &str, name: &str, current: String| {
        format!("<label for=\"{name}\">{label}</label><input id=\"{name}\" name=\"{name}\" value=\"{current}\">")
    };
    let form = format!(
        "<form class=\"explain\" method=\"post\" action=\"/ui/explain\">{}{}{}\
         <label for=\"headers\">Headers</label><textarea id=\"headers\" name=\"headers\" placeholder=\"X-API-Key: ... (not shown back)\"></textarea>\
         {}{}{}<button type=\"submit\">Explain</button></form>",
        field("Method", "method", method),
        field("Host", "host", value(&sent.host)),
        field("Path", "path", value(&sent.path)),
        field("Client address (peer)", "peer", value(&sent.peer)),
        field("Consumer (instead of credentials)", "consumer", value(&sent.consumer)),
        field("Plan", "plan", value(&sent.plan)),
    );
    let result = match answer {
        None => String::new(),
        Some(Err(why)) => format!("<p class=\"bad\" id=\"explained\">{}</p>", esc(&why)),
        Some(Ok(answer)) => explained(&answer),
    };
    let intro = "<p class=\"muted\">What the gateway would do with a request, without sending it: its route, the client's standing, the caller, the tier, every limit with the key it is counted under and what it has left (read without consuming anything).</p>";
    page("Explain", "/ui/explain", &format!("{intro}{form}{result}"))
}

/// A value as the page shows it: nothing as a dash.
fn or_dash(value: Option<impl ToString>) -> String {
    value.map_or("—".to_string(), |value| value.to_string())
}

/// An explanation as facts, a table of limits and the JSON itself.
fn explained(answer: &Explanation) -> String {
    let rows = answer.limits.iter().map(|limit| {
        let mut row = limit_row(limit);
        row.truncate(3);
        let stored_key = or_dash(limit.stored_key.as_deref());
        row.push(format!("<code>{}</code>", esc(&stored_key)));
        let remaining = esc(&or_dash(limit.remaining));
        row.push(format!("<span data-field=\"remaining\">{remaining}</span>"));
        row.push(esc(&or_dash(limit.reset_seconds)));
        row
    });
    let head = [
        "Limit",
        "Algorithm",
        "Quota",
        "Stored key",
        "Remaining",
        "Full again in (s)",
    ];
    let table = table(&head, rows);
    let json = serde_json::to_string_pretty(answer).unwrap_or_default();
    format!(
        "<section id=\"explained\"><h2>Explanation</h2>{}{table}<h2>As JSON (GET /v1/explain)</h2><pre>{}</pre></section>",
        summary(answer),
        esc(&json)
    )
}

/// What an explanation says before its limits: route, verdict, client, caller, tier.
fn summary(answer: &Explanation) -> String {
    let said = |value: Option<&str>| esc(&or_dash(value));
    let verdict = match &answer.answer {
        None => "<span class=\"ok\">its limits decide</span>".to_string(),
        Some(before) => format!(
            "<span class=\"bad\">{} {}</span>",
            before.status,
            esc(before.detail)
        ),
    };
    let route = answer.route.as_ref();
    let consumer = answer.consumer.as_ref();
    facts(&[
        ("Route", said(route.map(|route| &*route.name))),
        ("Matches", said(route.map(|route| &*route.matches))),
        ("Before the limits", verdict),
        ("Client", esc(&or_dash(answer.request.client_ip))),
        (
            "Standing",
            said(answer.standing.map(|standing| standing.label())),
        ),
        ("Consumer", said(consumer.map(|consumer| &*consumer.id))),
        (
            "Plan",
            said(consumer.and_then(|consumer| consumer.plan.as_deref())),
        ),
        ("Tier", said(answer.tier.as_ref().map(|tier| &*tier.name))),
        ("Upstream servers", servers_said(answer)),
    ])
}

/// The route's upstream servers, each with its health now: `10.0.0.5:8080 (ejected)`.
fn servers_said(answer: &Explanation) -> String {
    let servers = answer.servers.iter().map(|shown| match shown.state {
        Some(state) => format!("{} ({state})", shown.server),
        None => shown.server.clone(),
    });
    esc(&or_dash(
        Some(servers.collect::<Vec<_>>().join(", ")).filter(|s| !s.is_empty()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_passwords_are_never_shown() {
        let standalone = Topology::Standalone {
            url: "redis://user:s3cret@10.0.0.1:6379/0".into(),
        };
        let sentinel = Topology::Sentinel {
            sentinels: vec!["redis://:s3cret@10.0.0.2:26379".into()],
            master_name: "main".into(),
        };
        for shown in [topology(&standalone), topology(&sentinel)] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("10.0.0."), "{shown}");
        }
    }

    #[test]
    fn the_breaker_is_drawn_green_only_when_closed() {
        assert!(breaker_words(Some(BreakerState::Closed)).contains("class=\"ok\">closed"));
        assert!(breaker_words(Some(BreakerState::Open)).contains("class=\"bad\">open"));
        assert!(breaker_words(Some(BreakerState::HalfOpen)).contains("class=\"bad\">half-open"));
        assert!(!breaker_words(None).contains("class=\"ok\""));
    }

    #[test]
    fn parameters_read_as_words() {
        let window = Parameters::Window {
            limit: 3,
            window_ms: Millis { us: 3_600_000_000 },
        };
        assert_eq!(parameters(&window), "limit 3, window 3600 s");
        let concurrency = Parameters::Concurrency {
            max: 5,
            slot_ttl_ms: Millis { us: 100_000 },
        };
        assert_eq!(parameters(&concurrency), "max 5, slot ttl 100 ms");
        let gcra = Parameters::Gcra {
            burst_window_ms: Millis { us: 1_500_000 },
            capacity: 15,
            emission_ms: Millis { us: 100_500 },
            max_delay_ms: Millis { us: 0 },
        };
        assert_eq!(
            parameters(&gcra),
            "burst window 1.5 s, capacity 15, emission 100.5 ms, max delay 0 ms"
        );
    }
}
