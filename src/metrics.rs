//! Metric families, and per-route handles resolved once at startup so the request path only
//! increments counters (no label lookups, no formatting). Labels never carry a client address
//! or a raw path: only route names, decisions, status classes and error kinds.

use std::sync::LazyLock;

use pingora_prometheus::prometheus::{
    register_histogram, register_histogram_vec, register_int_counter, register_int_counter_vec,
    register_int_gauge, register_int_gauge_vec, Histogram, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec,
};

use crate::limiter::guard::GuardMeters;
use crate::limiter::leased::LeaseMeters;
use crate::limiter::{Coalescing, LimiterError, Outcome, PolicyMeters};

pub static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_requests_total",
        "Requests by route and limiter decision (allowed, limited, error_allowed, error_denied, no_route, bad_request, shadow_limited, local_allowed, local_limited).",
        &["route", "decision"]
    )
    .expect("sluice_requests_total registers once")
});

pub static LIMITER_DURATION: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        "sluice_limiter_duration_seconds",
        "Time spent deciding one request's limits, by what answered: the backend (redis: one round trip; local: in-process), the deny cache (deny_cache) or leases held (lease).",
        &["backend"],
        vec![0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25]
    )
    .expect("sluice_limiter_duration_seconds registers once")
});

pub static LIMITER_BATCH_SIZE: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        "sluice_limiter_batch_size",
        "Decisions carried by one Redis script call: requests that arrived while the previous call was in flight go together (1 when nothing waited).",
        vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0, 512.0, 1024.0]
    )
    .expect("sluice_limiter_batch_size registers once")
});

pub static LIMITER_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_limiter_errors_total",
        "Limiter calls that could not decide, by kind (timeout, connection, noscript, readonly, loading, busy, oom, crossslot, reply, ...).",
        &["kind"]
    )
    .expect("sluice_limiter_errors_total registers once")
});

pub static UPSTREAM_RESPONSES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        "sluice_upstream_responses_total",
        "Responses to proxied requests by route and status class (1xx..5xx).",
        &["route", "status_class"]
    )
    .expect("sluice_upstream_responses_total registers once")
});

pub static DENY_CACHE_HITS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "sluice_deny_cache_hits_total",
        "Requests denied by the local deny cache without calling the limiter backend."
    )
    .expect("sluice_deny_cache_hits_total registers once")
});

pub static LEASE_HELD_DECISIONS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "sluice_lease_held_decisions_total",
        "Decisions of mode: leased limits paid from units this gateway holds, without a Redis call."
    )
    .expect("sluice_lease_held_decisions_total registers once")
});

pub static LEASE_TOP_UPS: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "sluice_lease_top_ups_total",
        "Leases taken: calls that took units of a mode: leased limit beyond the request's own cost."
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

/// Label name used for requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "_unmatched";

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Counter handles for one route.
pub struct RouteMetrics {
    decisions: [IntCounter; 9],
    status_classes: [IntCounter; 5],
}

impl RouteMetrics {
    fn new(route: &str) -> RouteMetrics {
        RouteMetrics {
            decisions: Outcome::ALL.map(|o| REQUESTS.with_label_values(&[route, o.label()])),
            status_classes: STATUS_CLASSES
                .map(|c| UPSTREAM_RESPONSES.with_label_values(&[route, c])),
        }
    }

    pub fn count(&self, outcome: Outcome) {
        self.decisions[outcome as usize].inc();
    }

    pub fn count_upstream_status(&self, status: u16) {
        if let Some(counter) = (status / 100)
            .checked_sub(1)
            .and_then(|i| self.status_classes.get(usize::from(i)))
        {
            counter.inc();
        }
    }
}

/// Handles for every route of a configuration, indexed by `Route::index`.
pub struct Metrics {
    names: Vec<String>,
    routes: Vec<RouteMetrics>,
    unmatched: RouteMetrics,
}

impl Metrics {
    /// Handles for routes named `names`, in file order.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Metrics {
        let names: Vec<String> = names.into_iter().map(str::to_string).collect();
        Metrics {
            routes: names.iter().map(|name| RouteMetrics::new(name)).collect(),
            names,
            unmatched: RouteMetrics::new(UNMATCHED_ROUTE),
        }
    }

    /// Stops exporting the series of this configuration's routes that `next` no longer has
    /// (a reload removed them): a dashboard shows what is configured, not every route ever was.
    pub fn retire_routes_missing_from(&self, next: &Metrics) {
        for name in self.names.iter().filter(|name| !next.names.contains(name)) {
            for outcome in Outcome::ALL {
                let _ = REQUESTS.remove_label_values(&[name, outcome.label()]);
            }
            for class in STATUS_CLASSES {
                let _ = UPSTREAM_RESPONSES.remove_label_values(&[name, class]);
            }
        }
    }

    pub fn route(&self, index: usize) -> &RouteMetrics {
        self.routes.get(index).unwrap_or(&self.unmatched)
    }

    pub fn unmatched(&self) -> &RouteMetrics {
        &self.unmatched
    }
}

/// The policy's handles: the limiter duration of `backend`, and an error counter per kind.
pub fn policy_meters(backend: &str) -> PolicyMeters {
    PolicyMeters {
        duration: LIMITER_DURATION.with_label_values(&[backend]),
        deny_cache_duration: LIMITER_DURATION.with_label_values(&["deny_cache"]),
        lease_duration: LIMITER_DURATION.with_label_values(&["lease"]),
        errors: LimiterError::KINDS
            .iter()
            .map(|kind| LIMITER_ERRORS.with_label_values(&[*kind]))
            .collect(),
    }
}

/// The deny cache's and the breaker's handles.
pub fn guard_meters() -> GuardMeters {
    GuardMeters {
        deny_cache_hits: DENY_CACHE_HITS.clone(),
        breaker_state: BREAKER_STATE.clone(),
    }
}

/// How the Redis backend batches decisions: at most `max_batch` per call, sizes counted.
pub fn coalescing(max_batch: usize) -> Coalescing {
    Coalescing {
        max_batch,
        sizes: LIMITER_BATCH_SIZE.clone(),
    }
}

/// Leasing's handles.
pub fn lease_meters() -> LeaseMeters {
    LeaseMeters {
        held_decisions: LEASE_HELD_DECISIONS.clone(),
        top_ups: LEASE_TOP_UPS.clone(),
        units_returned: LEASE_UNITS_RETURNED.clone(),
        units_held: LEASE_UNITS_HELD.clone(),
    }
}

/// Registers every family now, so `/metrics` lists them before the first request.
pub fn init() {
    LazyLock::force(&REQUESTS);
    LazyLock::force(&LIMITER_DURATION);
    LazyLock::force(&LIMITER_BATCH_SIZE);
    for kind in LimiterError::KINDS {
        LIMITER_ERRORS.with_label_values(&[kind]);
    }
    LazyLock::force(&UPSTREAM_RESPONSES);
    LazyLock::force(&DENY_CACHE_HITS);
    LazyLock::force(&LEASE_HELD_DECISIONS);
    LazyLock::force(&LEASE_TOP_UPS);
    LazyLock::force(&LEASE_UNITS_RETURNED);
    LazyLock::force(&LEASE_UNITS_HELD);
    LazyLock::force(&BREAKER_STATE);
    for result in ["success", "error"] {
        CONFIG_RELOADS.with_label_values(&[result]);
    }
    BUILD_INFO
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
    // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
    let process = pingora_prometheus::prometheus::process_collector::ProcessCollector::for_self();
    if let Err(e) = pingora_prometheus::prometheus::register(Box::new(process)) {
        log::debug!("process metrics: {e}");
    }
}
