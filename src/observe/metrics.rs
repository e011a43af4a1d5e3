//! Metric families, registered once per process; the handles a request counts through are
//! resolved from them once per configuration (`exchange::meters`), so the request path only
//! increments counters (no label lookups, no formatting). Labels never carry a client address
//! or a raw path: only route names, decisions, status classes and error kinds.

use std::sync::{LazyLock, Mutex, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::MetricFamily;
use prometheus::{
    register_gauge_vec, register_int_counter, register_int_counter_vec, register_int_gauge,
    register_int_gauge_vec, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
};

use super::sharded::RequestFamilies;
use crate::limiter::guard::GuardMeters;
use crate::limiter::leased::LeaseMeters;
use crate::limiter::meters::{Counter, Family, Histogram, Series};
use crate::limiter::{Coalescing, ErrorKind, Mismatch, PolicyMeters};

/// `family`, registered in the default registry.
fn registered<M: Series>(family: Family<M>) -> Family<M> {
    prometheus::register(Box::new(family.clone())).expect("a family registers once");
    family
}

/// Written by every decision: kept per thread (`limiter::meters`).
pub static LIMITER_DURATION: LazyLock<Family<Histogram>> = LazyLock::new(|| {
    let bounds: [f64; 11] = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    ];
    registered(Family::new(
        "sluice_limiter_duration_seconds",
        "Time spent deciding one request's limits, by what answered: the backend (redis: one round trip; local: in-process), the deny cache (deny_cache) or leases held (lease).",
        &["backend"],
        move || Histogram::new(&bounds),
    ))
});

/// Written by every Redis call: kept per thread (`limiter::meters`).
pub static LIMITER_BATCH_SIZE: LazyLock<Family<Histogram>> = LazyLock::new(|| {
    let bounds: [f64; 16] = [
        1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0, 512.0,
        1024.0,
    ];
    registered(Family::new(
        "sluice_limiter_batch_size",
        "Decisions carried by one Redis script call: requests that arrived while the previous call was in flight go together (1 when nothing waited).",
        &[],
        move || Histogram::new(&bounds),
    ))
});

pub static LIMITER_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_limiter_errors_total",
        "Limiter calls that could not decide, by kind (timeout, connection, noscript, readonly, loading, busy, oom, crossslot, reply, ...).",
        &["kind"]
    )
    .expect("sluice_limiter_errors_total registers once")
});

pub static ADMIN_CHANGES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_admin_changes_total",
        "Quota admin API writes, by action (reset, credit, override_set, override_delete, plan_set, plan_delete; restore) and result (applied, repeated, refused, failed; restored).",
        &["action", "result"]
    )
    .expect("sluice_admin_changes_total registers once")
});

/// Written by every denial the deny cache answers: kept per thread (`limiter::meters`).
pub static DENY_CACHE_HITS: LazyLock<Family<Counter>> = LazyLock::new(|| {
    registered(Family::new(
        "sluice_deny_cache_hits_total",
        "Limiter calls answered by the local deny cache without calling the limiter backend \
         (under leases a request may make two; requests: \
         sluice_limiter_duration_seconds_count{backend=\"deny_cache\"}).",
        &[],
        Counter::default,
    ))
});

/// Written by every decision paid from leases: kept per thread (`limiter::meters`).
pub static LEASE_HELD_DECISIONS: LazyLock<Family<Counter>> = LazyLock::new(|| {
    registered(Family::new(
        "sluice_lease_held_decisions_total",
        "Decisions of leased limits (mode: auto or leased) paid from units this gateway holds, without a Redis call.",
        &[],
        Counter::default,
    ))
});

pub static LEASE_TOP_UPS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "sluice_lease_top_ups_total",
        "Leases taken: calls that took units of a leased limit (mode: auto or leased) beyond the request's own cost."
    )
    .expect("sluice_lease_top_ups_total registers once")
});

pub static LEASE_UNITS_RETURNED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "sluice_lease_units_returned_total",
        "Leased units given back to Redis unspent once their key went idle."
    )
    .expect("sluice_lease_units_returned_total registers once")
});

pub static LEASE_UNITS_LAPSED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "sluice_lease_units_lapsed_total",
        "Leased units that lapsed unspent: their GCRA slot began, or their window or calendar period closed, before this gateway spent them."
    )
    .expect("sluice_lease_units_lapsed_total registers once")
});

pub static LEASE_UNITS_HELD: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "sluice_lease_units_held",
        "Leased units this gateway holds unspent, over all keys (at most lease_units per key)."
    )
    .expect("sluice_lease_units_held registers once")
});

pub static BREAKER_STATE: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "sluice_redis_breaker_state",
        "Redis circuit breaker: 0 closed (calling Redis), 1 open (failing fast), 2 half-open (probing)."
    )
    .expect("sluice_redis_breaker_state registers once")
});

pub static BUILD_INFO: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "sluice_build_info",
        "Always 1: the version of sluice serving.",
        &["version"]
    )
    .expect("sluice_build_info registers once")
});

pub static CONFIG_RELOADS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_config_reloads_total",
        "Configuration reloads (SIGHUP) by result: success, or error (the old configuration stays).",
        &["result"]
    )
    .expect("sluice_config_reloads_total registers once")
});

pub static JWKS_FETCHES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_jwks_fetches_total",
        "Fetches of the JWKS URL (identity.jwt.jwks_url) by outcome: updated, or why the last good key set stayed in force (unreachable, http_status, too_large, invalid).",
        &["outcome"]
    )
    .expect("sluice_jwks_fetches_total registers once")
});

pub static LIMIT_DECISIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_limit_decisions_total",
        "What each limit of a route said, per request: allowed, limited, shadow_limited (a shadow limit that would have denied), local_allowed / local_limited (the in-process fallback decided), error_allowed / error_denied (nothing could decide; the failure mode applied).",
        &["route", "limit", "decision"]
    )
    .expect("sluice_limit_decisions_total registers once")
});

pub static PLAN_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_plan_requests_total",
        "Requests of routes that verify callers, by the caller's plan (none: anonymous or without a plan) and decision (the labels of sluice_requests_total).",
        &["route", "plan", "decision"]
    )
    .expect("sluice_plan_requests_total registers once")
});

pub static AUTH_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_auth_failures_total",
        "Requests refused before any limit because the caller's credential was missing or did not verify (401), or the verified caller may not pass (403), by route and reason.",
        &["route", "reason"]
    )
    .expect("sluice_auth_failures_total registers once")
});

pub static ADAPTIVE_LIMIT: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "sluice_adaptive_concurrency_limit",
        "Requests this gateway lets a route's upstream hold at once (adaptive_concurrency).",
        &["route"]
    )
    .expect("sluice_adaptive_concurrency_limit registers once")
});

pub static ADAPTIVE_BASELINE: LazyLock<GaugeVec> = LazyLock::new(|| {
    register_gauge_vec!(
        "sluice_adaptive_concurrency_baseline_seconds",
        "The route's baseline upstream latency, measured at its minimum concurrency.",
        &["route"]
    )
    .expect("sluice_adaptive_concurrency_baseline_seconds registers once")
});

pub static ADAPTIVE_SHED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_adaptive_concurrency_shed_total",
        "Requests answered 503 because the route's upstream was at its limit for their plan.",
        &["route", "plan"]
    )
    .expect("sluice_adaptive_concurrency_shed_total registers once")
});

pub static UPSTREAM_HEALTHY: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "sluice_upstream_healthy",
        "1 while the route's upstream server may be dialed (it passes its health checks, or no route checks it), 0 while it fails them; one state per server whatever the route.",
        &["route", "server"]
    )
    .expect("sluice_upstream_healthy registers once")
});

pub static UPSTREAM_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_upstream_errors_total",
        "Failed upstream attempts by route and kind: refused, timeout, reset (closed or broken mid-request), tls, unreachable (no healthy server, no route to host, other errors).",
        &["route", "kind"]
    )
    .expect("sluice_upstream_errors_total registers once")
});

pub static UPSTREAM_RETRIES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_upstream_retries_total",
        "Failed tries sent to another server of the route's upstream (outcome retried), and those the upstream's retry budget held back (outcome budget_exhausted): the failure was passed on instead.",
        &["route", "outcome"]
    )
    .expect("sluice_upstream_retries_total registers once")
});

pub static UPSTREAM_SERVER_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_upstream_server_errors_total",
        "Failed upstream attempts by server and kind (refused, timeout, reset, tls, unreachable), whatever the route: what the dashboard shows beside each server's health.",
        &["server", "kind"]
    )
    .expect("sluice_upstream_server_errors_total registers once")
});

pub static UPSTREAM_EJECTIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_upstream_ejections_total",
        "Times passive health ejected the upstream server (failed attempts in a row: 5xx responses, refused, reset or timed-out connections), whatever the route.",
        &["server"]
    )
    .expect("sluice_upstream_ejections_total registers once")
});

pub static UPSTREAM_EJECTED: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "sluice_upstream_ejected",
        "1 while passive health has the upstream server ejected (back to 0 within a second of its ejection time), 0 otherwise.",
        &["server"]
    )
    .expect("sluice_upstream_ejected registers once")
});

pub static REGION_SYNC_HOLDER: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "sluice_region_sync_holder",
        "1 while this gateway holds its region's sync lease (one gateway per region runs region sync), 0 otherwise."
    )
    .expect("sluice_region_sync_holder registers once")
});

pub static REGION_SYNC_TICKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_region_sync_ticks_total",
        "Ticks of region sync on this gateway: synced (it holds the lease and published), standby (another gateway of the region holds it) or failed (this region's Redis did not answer).",
        &["result"]
    )
    .expect("sluice_region_sync_ticks_total registers once")
});

pub static REGION_PEER_STALENESS: LazyLock<GaugeVec> = LazyLock::new(|| {
    register_gauge_vec!(
        "sluice_region_peer_staleness_seconds",
        "How old the latest entry read from the peer region is: its publication time, on the publishing gateway's clock, against this gateway's clock; grows while the peer is cut off.",
        &["peer"]
    )
    .expect("sluice_region_peer_staleness_seconds registers once")
});

pub static REGION_CLOCK_SKEW: LazyLock<GaugeVec> = LazyLock::new(|| {
    register_gauge_vec!(
        "sluice_region_clock_skew_seconds",
        "The peer region's Redis clock less this gateway's, estimated from a TIME round trip (Cristian's way) about every ten exchange periods.",
        &["peer"]
    )
    .expect("sluice_region_clock_skew_seconds registers once")
});

pub static REGION_PEER_MISMATCH: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "sluice_region_peer_mismatch",
        "1 while the peer region publishes a different digest of the regions and global limits (configured differently): nothing it publishes is applied.",
        &["peer"]
    )
    .expect("sluice_region_peer_mismatch registers once")
});

pub static REGION_TRANSFERRED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_region_transferred_units_total",
        "Units of strict global limits moved between this region and the peer: out (given by this region, in its Redis) or in (given by the peer and read from its stream).",
        &["peer", "direction"]
    )
    .expect("sluice_region_transferred_units_total registers once")
});

pub static REGION_LIMIT_UNITS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        "sluice_region_limit_units",
        "Per global limit, summed over its keys in their current periods, as the sync holder last read them: room (what this region may count to), used, imported (given by other regions) and exported (given to them).",
        &["limit", "standing"]
    )
    .expect("sluice_region_limit_units registers once")
});

pub static CLIENT_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_client_errors_total",
        "Requests their client failed, by route and kind: body_timeout (it stopped sending its request body for longer than the read timeout: 408), closed (it closed its connection or reset its stream before the response was complete: 499 in the access log when nothing had been sent).",
        &["route", "kind"]
    )
    .expect("sluice_client_errors_total registers once")
});

pub static ACCESS_LOG_DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "sluice_access_log_dropped_total",
        "Access log lines dropped because the writer was too far behind (8 MiB of lines waiting)."
    )
    .expect("sluice_access_log_dropped_total registers once")
});

pub static INTERNAL_MISMATCHES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_internal_mismatches_total",
        "Per-limit sequences that should have been one for one and were not (a bug, logged where met), by what was paired.",
        &["at"]
    )
    .expect("sluice_internal_mismatches_total registers once")
});

/// Counts `found`, two per-limit sequences that were not one for one, and logs it with what
/// was paired and their lengths: a bug, never hidden by pairing the shorter sequence.
pub fn mismatch(found: &Mismatch) {
    INTERNAL_MISMATCHES.with_label_values(&[found.at]).inc();
    log::error!("internal mismatch (a bug, please report it): {found}");
}

pub static RESPONSE_COST_REPORTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_response_cost_reports_total",
        "What the responses of admitted requests said they cost, per limit priced by the response (cost_from_response): reported, capped (above max: charged max), missing or invalid (the estimate stands).",
        &["route", "limit", "report"]
    )
    .expect("sluice_response_cost_reports_total registers once")
});

pub static RESPONSE_COST_UNITS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_response_cost_units_total",
        "Units the responses of admitted requests reported (capped at max), per limit priced by the response.",
        &["route", "limit"]
    )
    .expect("sluice_response_cost_units_total registers once")
});

pub static RLS_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_rls_requests_total",
        "Envoy rate limit service requests by domain and decision (allowed, limited, error_allowed, error_denied, shadow_limited, local_allowed, local_limited), as sluice_requests_total for routes.",
        &["domain", "decision"]
    )
    .expect("sluice_rls_requests_total registers once")
});

pub static RLS_LIMIT_DECISIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_rls_limit_decisions_total",
        "What each limit of a rate limit service domain said, per descriptor that matched it: the decisions of sluice_limit_decisions_total. `limit` is the rate limit's name, or its descriptor path.",
        &["domain", "limit", "decision"]
    )
    .expect("sluice_rls_limit_decisions_total registers once")
});

/// The policy's handles: the limiter duration of `backend`, and an error counter per kind.
pub fn policy_meters(backend: &str) -> PolicyMeters {
    PolicyMeters {
        duration: LIMITER_DURATION.with_label_values(&[backend]),
        deny_cache_duration: LIMITER_DURATION.with_label_values(&["deny_cache"]),
        lease_duration: LIMITER_DURATION.with_label_values(&["lease"]),
        errors: ErrorKind::ALL
            .iter()
            .map(|kind| LIMITER_ERRORS.with_label_values(&[kind.label()]))
            .collect(),
    }
}

/// The deny cache's and the breaker's handles.
pub fn guard_meters() -> GuardMeters {
    GuardMeters {
        deny_cache_hits: DENY_CACHE_HITS.with_label_values(&[]),
        breaker_state: BREAKER_STATE.clone(),
    }
}

/// How the Redis backend batches decisions: at most `max_batch` per call, sizes counted.
pub fn coalescing(max_batch: usize) -> Coalescing {
    Coalescing {
        max_batch,
        sizes: LIMITER_BATCH_SIZE.with_label_values(&[]),
    }
}

/// Leasing's handles.
pub fn lease_meters() -> LeaseMeters {
    LeaseMeters {
        held_decisions: LEASE_HELD_DECISIONS.with_label_values(&[]),
        top_ups: LEASE_TOP_UPS.clone(),
        units_returned: LEASE_UNITS_RETURNED.clone(),
        units_lapsed: LEASE_UNITS_LAPSED.clone(),
        units_held: LEASE_UNITS_HELD.clone(),
    }
}

/// The families every proxied request writes (`sluice_requests_total`,
/// `sluice_upstream_responses_total`, `sluice_request_duration_seconds`,
/// `sluice_upstream_duration_seconds`, `sluice_requests_in_flight`), sharded per thread.
pub static REQUEST_FAMILIES: LazyLock<&'static RequestFamilies> = LazyLock::new(|| {
    let families: &'static RequestFamilies = Box::leak(Box::default());
    prometheus::register(Box::new(families)).expect("the request families register once");
    families
});

/// Every family sluice exports (the process collector's besides).
fn families() -> [&'static dyn Collector; 41] {
    [
        &*REQUEST_FAMILIES,
        &*ADMIN_CHANGES,
        &*LIMITER_DURATION,
        &*LIMITER_BATCH_SIZE,
        &*LIMITER_ERRORS,
        &*DENY_CACHE_HITS,
        &*LEASE_HELD_DECISIONS,
        &*LEASE_TOP_UPS,
        &*LEASE_UNITS_RETURNED,
        &*LEASE_UNITS_LAPSED,
        &*LEASE_UNITS_HELD,
        &*BREAKER_STATE,
        &*BUILD_INFO,
        &*CONFIG_RELOADS,
        &*JWKS_FETCHES,
        &*LIMIT_DECISIONS,
        &*PLAN_REQUESTS,
        &*AUTH_FAILURES,
        &*ADAPTIVE_LIMIT,
        &*ADAPTIVE_BASELINE,
        &*ADAPTIVE_SHED,
        &*UPSTREAM_HEALTHY,
        &*UPSTREAM_ERRORS,
        &*UPSTREAM_RETRIES,
        &*UPSTREAM_SERVER_ERRORS,
        &*UPSTREAM_EJECTIONS,
        &*UPSTREAM_EJECTED,
        &*REGION_SYNC_HOLDER,
        &*REGION_SYNC_TICKS,
        &*REGION_PEER_STALENESS,
        &*REGION_CLOCK_SKEW,
        &*REGION_PEER_MISMATCH,
        &*REGION_TRANSFERRED,
        &*REGION_LIMIT_UNITS,
        &*CLIENT_ERRORS,
        &*ACCESS_LOG_DROPPED,
        &*INTERNAL_MISMATCHES,
        &*RESPONSE_COST_REPORTS,
        &*RESPONSE_COST_UNITS,
        &*RLS_REQUESTS,
        &*RLS_LIMIT_DECISIONS,
    ]
}

/// Registers every family now, so `/metrics` lists them before the first request.
pub fn init() {
    // Dereferencing a family registers it.
    let _ = families();
    for kind in ErrorKind::ALL {
        LIMITER_ERRORS.with_label_values(&[kind.label()]);
    }
    for result in ["success", "error"] {
        CONFIG_RELOADS.with_label_values(&[result]);
    }
    for outcome in crate::caller::jwt::FetchOutcome::LABELS {
        JWKS_FETCHES.with_label_values(&[outcome]);
    }
    BUILD_INFO
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
    // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...: the
    // default registry comes with Prometheus's own collector, for the pid that first used it;
    // it makes way (a collector of the same names unregisters it) for one that follows the
    // process.
    // (Nothing to unregister would only mean a registry built without it.)
    let _ = prometheus::unregister(Box::new(ProcessCollector::for_self()));
    if let Err(e) = prometheus::register(Box::new(SelfProcess::new())) {
        log::warn!("process metrics: {e}");
    }
}

/// The `process_*` families of the process that serves. Prometheus's own collector (the one
/// the default registry comes with) reads the pid it was built with; built before `sluice -d`
/// daemonizes (Pingora forks twice inside `Server::run`), it reads a process that has exited
/// (nothing, or a zombie's zeros: one thread, no memory) or another that took its pid. This one asks for the pid at each scrape and builds the
/// collector again, start time included, when the process is not the one it was built in.
struct SelfProcess {
    /// The same for every collector built (names and help do not depend on the pid).
    descs: Vec<Desc>,
    current: Mutex<(u32, ProcessCollector)>,
}

impl SelfProcess {
    fn new() -> SelfProcess {
        SelfProcess::built_in(std::process::id(), ProcessCollector::for_self())
    }

    /// A collector believed to be of process `pid`.
    fn built_in(pid: u32, collector: ProcessCollector) -> SelfProcess {
        SelfProcess {
            descs: collector.desc().into_iter().cloned().collect(),
            current: Mutex::new((pid, collector)),
        }
    }
}

impl Collector for SelfProcess {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let pid = std::process::id();
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.0 != pid {
            *current = (pid, ProcessCollector::for_self());
        }
        current.1.collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn a_mismatch_is_counted_by_what_was_paired() {
        let at = "test: limits and records";
        let counted = || INTERNAL_MISMATCHES.with_label_values(&[at]).get();
        let before = counted();
        mismatch(&Mismatch {
            at,
            left: 2,
            right: 1,
        });
        assert_eq!(counted(), before + 1);
    }

    /// A collector built in another process (as one built before `sluice -d` forks) reports
    /// the process that scrapes, not the one it was built for.
    #[test]
    fn process_metrics_follow_the_process_that_collects() {
        // No pid is this high (pid_max is at most 2^22): the process it names is gone.
        let gone = 2_000_000_000;
        let stale = ProcessCollector::new(gone, "");
        assert!(
            stale.collect().is_empty(),
            "a gone process reads as nothing"
        );
        let families = SelfProcess::built_in(gone as u32, stale).collect();
        let value = |name: &str| {
            families
                .iter()
                .find(|family| family.name() == name)
                .map(|family| family.get_metric()[0].get_gauge().value())
                .unwrap_or_else(|| panic!("{name} missing"))
        };
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_threads") >= 1.0);
        let own = ProcessCollector::for_self().collect();
        let start = own
            .iter()
            .find(|family| family.name() == "process_start_time_seconds")
            .map(|family| family.get_metric()[0].get_gauge().value());
        assert_eq!(Some(value("process_start_time_seconds")), start);
    }

    /// The `sluice_*` names `text` mentions (a prefix such as `sluice_limiter_` included).
    fn mentioned(text: &str) -> BTreeSet<&str> {
        text.match_indices("sluice_")
            .map(|(at, _)| {
                let rest = &text[at..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect()
    }

    #[test]
    fn every_family_is_documented_and_every_documented_family_exists() {
        let names: BTreeSet<String> = families()
            .iter()
            .flat_map(|family| family.desc())
            .map(|desc| desc.fq_name.clone())
            .collect();
        let descs: usize = families().iter().map(|family| family.desc().len()).sum();
        assert_eq!(names.len(), descs, "one name per family");
        let docs = ["docs/operations.md", "docs/envoy-rls.md"].map(|doc| {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
            std::fs::read_to_string(path).expect("read the docs")
        });
        let documented: BTreeSet<&str> = docs.iter().flat_map(|doc| mentioned(doc)).collect();
        for name in &names {
            assert!(
                documented.contains(name.as_str()),
                "{name} is not documented"
            );
        }
        for name in documented.iter().filter(|n| !n.ends_with('_')) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| names.contains(*base))
                .unwrap_or(name);
            assert!(names.contains(family), "the docs name {name}, no family");
        }
    }
}
