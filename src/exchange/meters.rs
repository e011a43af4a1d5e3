//! The handles the exchange counts through, resolved once per configuration (`Site::build`) so
//! the request path only increments: per route (decisions, status classes, durations, each
//! limit's outcome, upstream and client errors, callers by plan, response costs), for unrouted
//! requests, and per rate limit service domain. The families are `crate::observe::metrics`'s.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntGauge};
use strum::EnumCount;

use crate::caller::consumers::{AuthFailure, AuthMode, PlanId, PlanSlot, Plans};
use crate::exchange::answer::{ClientError, Decided, UpstreamError};
use crate::limiter::adaptive::AdaptiveMeters;
use crate::limiter::{CostReport, Limit, Outcome};
use crate::observe::live::Counts;
use crate::observe::metrics::{
    ADAPTIVE_BASELINE, ADAPTIVE_LIMIT, ADAPTIVE_SHED, AUTH_FAILURES, CLIENT_ERRORS,
    LIMIT_DECISIONS, PLAN_REQUESTS, REQUEST_FAMILIES, RESPONSE_COST_REPORTS, RESPONSE_COST_UNITS,
    RLS_LIMIT_DECISIONS, RLS_REQUESTS, UPSTREAM_EJECTED, UPSTREAM_EJECTIONS, UPSTREAM_ERRORS,
    UPSTREAM_HEALTHY, UPSTREAM_RETRIES, UPSTREAM_SERVER_ERRORS,
};
use crate::observe::sharded::{RouteRequests, STATUS_CLASSES};
use crate::route::descriptors::Domains;
use crate::route::table::RouteTable;
use crate::route::tiers::Position;
use crate::upstream::outlier::EjectionMeters;

/// Counter handles of one rate limit service domain: one per request decision, and per limit
/// one per [`Outcome`].
pub struct DomainMetrics {
    requests: [IntCounter; Decided::COUNT],
    /// By a limit's series: its place among the domain's limit names.
    limits: Box<[[IntCounter; Outcome::ALL.len()]]>,
}

impl DomainMetrics {
    pub fn count(&self, outcome: Outcome) {
        self.requests[Decided::Limiter(outcome).index()].inc();
    }

    /// What the limit of series `series` (its place among the domain's limit names) said
    /// about one descriptor.
    pub fn count_limit(&self, series: usize, outcome: Outcome) {
        if let Some(counters) = self.limits.get(series) {
            counters[outcome as usize].inc();
        }
    }
}

/// Handles for every domain the rate limit service serves.
pub fn rls_metrics(domains: &Domains) -> HashMap<String, DomainMetrics> {
    domains
        .iter()
        .map(|domain| {
            let name = domain.name.as_str();
            let metrics = DomainMetrics {
                requests: Decided::all()
                    .map(|d| RLS_REQUESTS.with_label_values(&[name, d.label()])),
                limits: domain
                    .limit_names()
                    .map(|limit| {
                        Outcome::ALL.map(|o| {
                            RLS_LIMIT_DECISIONS.with_label_values(&[name, limit, o.label()])
                        })
                    })
                    .collect(),
            };
            (name.to_string(), metrics)
        })
        .collect()
}

/// Label name used for requests that matched no route.
pub const UNMATCHED_ROUTE: &str = "_unmatched";

/// The index of `status`'s class in `STATUS_CLASSES`.
fn status_class(status: u16) -> Option<usize> {
    usize::from(status / 100)
        .checked_sub(1)
        .filter(|i| *i < STATUS_CLASSES.len())
}

/// What became of a failed try the route's `retry_on` names: `sluice_upstream_retries_total`'s
/// `outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOutcome {
    /// Sent to another server.
    Retried = 0,
    /// Held back by the upstream's retry budget: the failure was passed on.
    BudgetExhausted = 1,
}

impl RetryOutcome {
    const LABELS: [&'static str; 2] = ["retried", "budget_exhausted"];
}

/// Handles for one route.
pub struct RouteMetrics {
    /// What every request writes (its decision, status class, durations, the route's requests
    /// in flight): sharded per thread, the same meters across reloads.
    requests: Arc<RouteRequests>,
    upstream_errors: [IntCounter; UpstreamError::COUNT],
    /// By [`RetryOutcome`].
    retries: [IntCounter; RetryOutcome::LABELS.len()],
    client_errors: [IntCounter; ClientError::COUNT],
    /// Per limit of the route, by its [`Position`] in the route's list.
    limits: Box<[LimitMeters]>,
    /// Of a route that verifies callers: per plan slot (0: none, then each plan), a counter
    /// per decision label; and a counter per reason a caller was refused.
    callers: Option<CallerMeters>,
    /// Of a route with adaptive concurrency: requests shed, per plan slot (0: none).
    shed: Box<[IntCounter]>,
    /// Failed attempts per server of the route's upstream, by kind (the series are the
    /// server's, whatever the route).
    servers: Box<[ServerErrors]>,
}

/// The handles of one upstream server's failed attempts, by [`UpstreamError`].
#[derive(Clone)]
pub struct ServerErrors {
    pub server: SocketAddr,
    kinds: [IntCounter; UpstreamError::COUNT],
}

impl ServerErrors {
    fn new(server: SocketAddr) -> ServerErrors {
        let name = server.to_string();
        ServerErrors {
            server,
            kinds: std::array::from_fn(|i| {
                let kind = UpstreamError::ALL[i].label();
                UPSTREAM_SERVER_ERRORS.with_label_values(&[name.as_str(), kind])
            }),
        }
    }

    /// Each kind's label and its count so far.
    pub fn totals(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        let kinds = UpstreamError::ALL.iter();
        kinds.map(|kind| (kind.label(), self.kinds[*kind as usize].get()))
    }
}

struct CallerMeters {
    by_plan: Vec<[IntCounter; Decided::COUNT]>,
    failures: [IntCounter; AuthFailure::COUNT],
}

/// The handles of one `(route, limit)` series: a counter per [`Outcome`] and, for a limit
/// priced by the response, what its responses reported.
pub struct LimitMeters {
    outcomes: [IntCounter; Outcome::ALL.len()],
    costs: Option<ResponseCostMeters>,
}

impl LimitMeters {
    fn new(route: &str, limit: &Limit) -> LimitMeters {
        let name = &*limit.name;
        LimitMeters {
            outcomes: Outcome::ALL
                .map(|o| LIMIT_DECISIONS.with_label_values(&[route, name, o.label()])),
            costs: limit
                .priced_by_response
                .as_ref()
                .map(|_| ResponseCostMeters {
                    reports: CostReport::LABELS.map(|report| {
                        RESPONSE_COST_REPORTS.with_label_values(&[route, name, report])
                    }),
                    units: RESPONSE_COST_UNITS.with_label_values(&[route, name]),
                }),
        }
    }

    /// What the limit said about a request.
    pub fn count(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].inc();
    }

    /// What the limit said so far, as the dashboard groups it: allowed, limited and
    /// shadow-limited when it decided; admitted or refused by the failure mode (nothing could
    /// decide, or the in-process fallback did) when it could not.
    pub fn totals(&self) -> Counts {
        let at = |outcome: Outcome| self.outcomes[outcome as usize].get();
        Counts {
            allowed: at(Outcome::Allowed),
            limited: at(Outcome::Limited),
            shadow: at(Outcome::ShadowLimited),
            failure_admitted: at(Outcome::ErrorAllowed) + at(Outcome::FallbackAllowed),
            failure_refused: at(Outcome::ErrorDenied) + at(Outcome::FallbackLimited),
        }
    }

    /// What an admitted request's response reported it cost (nothing for a limit not priced
    /// by the response).
    pub fn count_report(&self, report: CostReport) {
        let Some(costs) = &self.costs else { return };
        costs.reports[report.index()].inc();
        if let Some(units) = report.units() {
            costs.units.inc_by(units);
        }
    }
}

/// What the responses of one limit priced by the response reported.
struct ResponseCostMeters {
    reports: [IntCounter; CostReport::LABELS.len()],
    units: IntCounter,
}

impl RouteMetrics {
    /// The handles of the route named `route`, with `limits` (as written, in order).
    pub fn new<'a>(route: &str, limits: impl IntoIterator<Item = &'a Limit>) -> RouteMetrics {
        RouteMetrics {
            requests: REQUEST_FAMILIES.route(route, &Decided::all().map(Decided::label)),
            upstream_errors: std::array::from_fn(|i| {
                let kind = UpstreamError::ALL[i].label();
                UPSTREAM_ERRORS.with_label_values(&[route, kind])
            }),
            retries: RetryOutcome::LABELS.map(|o| UPSTREAM_RETRIES.with_label_values(&[route, o])),
            client_errors: std::array::from_fn(|i| {
                let kind = ClientError::ALL[i].label();
                CLIENT_ERRORS.with_label_values(&[route, kind])
            }),
            limits: limits
                .into_iter()
                .map(|limit| LimitMeters::new(route, limit))
                .collect(),
            callers: None,
            shed: Box::new([]),
            servers: Box::new([]),
        }
    }

    /// Adds the handles of the route's upstream `servers`: their failed attempts.
    pub fn with_servers(mut self, servers: &[SocketAddr]) -> RouteMetrics {
        self.servers = servers.iter().map(|s| ServerErrors::new(*s)).collect();
        self
    }

    /// Adds the handles of a route with adaptive concurrency: requests shed per plan.
    pub fn with_shedding(mut self, route: &str, plans: &Plans) -> RouteMetrics {
        let slots = plans.slot_labels();
        self.shed = slots
            .map(|plan| ADAPTIVE_SHED.with_label_values(&[route, plan]))
            .collect();
        self
    }

    /// A request of a caller on `plan` was shed.
    pub fn count_shed(&self, plan: Option<PlanId>) {
        if let Some(counter) = self.shed.get(PlanSlot::of(plan).index()) {
            counter.inc();
        }
    }

    /// The requests shed so far, per [`PlanSlot`], in order; empty
    /// for a route without adaptive concurrency.
    pub fn shed_by_plan(&self) -> Vec<u64> {
        self.shed.iter().map(IntCounter::get).collect()
    }

    /// Adds the per-plan and auth-failure handles of a route that verifies callers.
    pub fn with_callers(mut self, route: &str, plans: &Plans) -> RouteMetrics {
        let slots = plans.slot_labels();
        self.callers = Some(CallerMeters {
            by_plan: slots
                .map(|plan| {
                    Decided::all()
                        .map(|d| PLAN_REQUESTS.with_label_values(&[route, plan, d.label()]))
                })
                .collect(),
            failures: std::array::from_fn(|i| {
                AUTH_FAILURES.with_label_values(&[route, AuthFailure::ALL[i].label()])
            }),
        });
        self
    }

    /// A request of a caller on `plan` (`None`: anonymous or without a plan) was `decided`;
    /// `failure`: why it was refused before any limit.
    pub fn count_caller(
        &self,
        plan: Option<PlanId>,
        decided: Decided,
        failure: Option<AuthFailure>,
    ) {
        let Some(callers) = &self.callers else { return };
        if let Some(counters) = callers.by_plan.get(PlanSlot::of(plan).index()) {
            counters[decided.index()].inc();
        }
        if let Some(failure) = failure {
            callers.failures[failure as usize].inc();
        }
    }

    /// The handles of the limit at `index` in the route's list as written.
    pub fn limit_at(&self, index: usize) -> Option<&LimitMeters> {
        self.limits.get(index)
    }

    /// The handles of the limit at `position` in the route's list.
    pub fn limit(&self, position: Position) -> Option<&LimitMeters> {
        self.limits.get(usize::from(position.0))
    }

    pub fn count(&self, decided: Decided) {
        self.requests.count(decided.index());
    }

    pub fn count_upstream_status(&self, status: u16) {
        if let Some(class) = status_class(status) {
            self.requests.count_class(class);
        }
    }

    /// A request answered with `status` after `duration`.
    pub fn observe_duration(&self, status: u16, duration: Duration) {
        if let Some(class) = status_class(status) {
            self.requests.observe_duration(class, duration);
        }
    }

    pub fn observe_upstream(&self, duration: Duration) {
        self.requests.observe_upstream(duration);
    }

    /// The requests decided as `decided` so far.
    pub fn decided(&self, decided: Decided) -> u64 {
        self.requests.decided(decided.index())
    }

    /// A failed upstream attempt of kind `kind`, at `server` when one was dialed.
    pub fn count_upstream_error(&self, kind: UpstreamError, server: Option<SocketAddr>) {
        self.upstream_errors[kind as usize].inc();
        let Some(server) = server else { return };
        if let Some(errors) = self.servers.iter().find(|errors| errors.server == server) {
            errors.kinds[kind as usize].inc();
        }
    }

    pub fn count_retry(&self, outcome: RetryOutcome) {
        self.retries[outcome as usize].inc();
    }

    pub fn count_client_error(&self, kind: ClientError) {
        self.client_errors[kind as usize].inc();
    }

    /// Counts a request in flight, until [`RouteMetrics::leave`]: the exchange holds the
    /// route, so no handle is cloned for it.
    pub fn enter(&self) {
        self.requests.enter();
    }

    /// A request counted by [`RouteMetrics::enter`] is no longer in flight.
    pub fn leave(&self) {
        self.requests.leave();
    }
}

/// A configuration's series: the handles of requests no route matched, and the label values of
/// every per-route series, to retire on reload. Each route's own handles live in its runtime
/// (`snapshot::RouteRuntime`).
pub struct Metrics {
    unmatched: RouteMetrics,
    /// Every upstream server's failed attempts, each server once: what the dashboard samples.
    servers: Box<[ServerErrors]>,
    /// Every labelled series this configuration exports, to retire those the next one drops.
    series: Series,
}

/// The label values of a configuration's per-route series.
#[derive(Default)]
struct Series {
    routes: Vec<String>,
    /// (route, plan) of routes that verify callers, plan `none` included.
    plans: Vec<(String, String)>,
    limits: Vec<(String, String)>,
    servers: Vec<(String, String)>,
    /// Every upstream server, once.
    upstream_servers: Vec<String>,
    /// Routes with adaptive concurrency, and (route, plan) of their shed counters.
    adaptive: Vec<String>,
    shed: Vec<(String, String)>,
    /// The rate limit service's domains, and (domain, limit) of their limits.
    domains: Vec<String>,
    domain_limits: Vec<(String, String)>,
}

impl Metrics {
    /// The series of `routes`, whose callers may be on `plans`.
    pub fn new(routes: &RouteTable, plans: &Plans) -> Metrics {
        let mut series = Series::default();
        let mut servers = Vec::new();
        for route in routes.in_file_order() {
            let limits = route.tiers.written();
            series.routes.push(route.name.to_string());
            if route.auth.mode != AuthMode::Off {
                for plan in plans.slot_labels() {
                    series
                        .plans
                        .push((route.name.to_string(), plan.to_string()));
                }
            }
            for limit in limits {
                series
                    .limits
                    .push((route.name.to_string(), limit.name.to_string()));
            }
            for server in &route.upstream.servers {
                series
                    .servers
                    .push((route.name.to_string(), server.to_string()));
                if !servers.iter().any(|s: &ServerErrors| s.server == *server) {
                    servers.push(ServerErrors::new(*server));
                    series.upstream_servers.push(server.to_string());
                }
            }
            if route.adaptive.is_some() {
                series.adaptive.push(route.name.to_string());
                for plan in plans.slot_labels() {
                    series.shed.push((route.name.to_string(), plan.to_string()));
                }
            }
        }
        Metrics {
            unmatched: RouteMetrics::new(UNMATCHED_ROUTE, []),
            servers: servers.into(),
            series,
        }
    }

    /// With the series of the rate limit service's `domains`.
    pub fn with_rls(mut self, domains: &Domains) -> Metrics {
        for domain in domains.iter() {
            self.series.domains.push(domain.name.clone());
            for limit in domain.limit_names() {
                let pair = (domain.name.clone(), limit.to_string());
                self.series.domain_limits.push(pair);
            }
        }
        self
    }

    /// The gauges of `route`'s adaptive concurrency limiter.
    pub fn adaptive(route: &str) -> AdaptiveMeters {
        AdaptiveMeters {
            limit: ADAPTIVE_LIMIT.with_label_values(&[route]),
            baseline_seconds: ADAPTIVE_BASELINE.with_label_values(&[route]),
        }
    }

    /// Every upstream server's failed attempts, each server once.
    pub fn server_errors(&self) -> &[ServerErrors] {
        &self.servers
    }

    /// The health gauge of `server` in `route`'s pool.
    pub fn upstream_health(route: &str, server: SocketAddr) -> IntGauge {
        UPSTREAM_HEALTHY.with_label_values(&[route, &server.to_string()])
    }

    /// The ejection counter and gauge of `server` (passive health), whatever the route.
    pub fn upstream_ejection(server: SocketAddr) -> EjectionMeters {
        let server = server.to_string();
        EjectionMeters {
            ejections: UPSTREAM_EJECTIONS.with_label_values(&[&server]),
            ejected: UPSTREAM_EJECTED.with_label_values(&[&server]),
        }
    }

    /// Stops exporting the series this configuration has and `next` has not (a reload removed
    /// a route, a limit or a server): a dashboard shows what is configured, not everything that
    /// ever was.
    pub fn retire_series_missing_from(&self, next: &Metrics) {
        let next = &next.series;
        for name in self
            .series
            .routes
            .iter()
            .filter(|n| !next.routes.contains(n))
        {
            REQUEST_FAMILIES.retire(name);
            for kind in UpstreamError::ALL {
                let _ = UPSTREAM_ERRORS.remove_label_values(&[name, kind.label()]);
            }
            for outcome in RetryOutcome::LABELS {
                let _ = UPSTREAM_RETRIES.remove_label_values(&[name, outcome]);
            }
            for kind in ClientError::ALL {
                let _ = CLIENT_ERRORS.remove_label_values(&[name, kind.label()]);
            }
            for failure in AuthFailure::ALL {
                let _ = AUTH_FAILURES.remove_label_values(&[name, failure.label()]);
            }
        }
        for (route, plan) in self.series.plans.iter().filter(|p| !next.plans.contains(p)) {
            for decided in Decided::all() {
                let _ = PLAN_REQUESTS.remove_label_values(&[route, plan, decided.label()]);
            }
        }
        for (route, limit) in self
            .series
            .limits
            .iter()
            .filter(|l| !next.limits.contains(l))
        {
            for outcome in Outcome::ALL {
                let _ = LIMIT_DECISIONS.remove_label_values(&[route, limit, outcome.label()]);
            }
            for report in CostReport::LABELS {
                let _ = RESPONSE_COST_REPORTS.remove_label_values(&[route, limit, report]);
            }
            let _ = RESPONSE_COST_UNITS.remove_label_values(&[route, limit]);
        }
        self.retire_server_series_missing_from(next);
        self.retire_adaptive_series_missing_from(next);
        self.retire_rls_series_missing_from(next);
    }

    /// The upstream servers' part of [`Metrics::retire_series_missing_from`]: each route's
    /// health gauge of a server, and the errors of a server no route lists any more.
    fn retire_server_series_missing_from(&self, next: &Series) {
        let gone = |pair: &&(String, String)| !next.servers.contains(pair);
        for (route, server) in self.series.servers.iter().filter(gone) {
            let _ = UPSTREAM_HEALTHY.remove_label_values(&[route, server]);
        }
        let gone = |server: &&String| !next.upstream_servers.contains(server);
        for server in self.series.upstream_servers.iter().filter(gone) {
            for kind in UpstreamError::ALL {
                let _ = UPSTREAM_SERVER_ERRORS.remove_label_values(&[server, kind.label()]);
            }
            let _ = UPSTREAM_EJECTIONS.remove_label_values(&[server]);
            let _ = UPSTREAM_EJECTED.remove_label_values(&[server]);
        }
    }

    /// Adaptive concurrency's part of [`Metrics::retire_series_missing_from`].
    fn retire_adaptive_series_missing_from(&self, next: &Series) {
        for route in self
            .series
            .adaptive
            .iter()
            .filter(|r| !next.adaptive.contains(r))
        {
            let _ = ADAPTIVE_LIMIT.remove_label_values(&[route]);
            let _ = ADAPTIVE_BASELINE.remove_label_values(&[route]);
        }
        for (route, plan) in self.series.shed.iter().filter(|p| !next.shed.contains(p)) {
            let _ = ADAPTIVE_SHED.remove_label_values(&[route, plan]);
        }
    }

    fn retire_rls_series_missing_from(&self, next: &Series) {
        let gone = |name: &&String| !next.domains.contains(name);
        for domain in self.series.domains.iter().filter(gone) {
            for decided in Decided::all() {
                let _ = RLS_REQUESTS.remove_label_values(&[domain, decided.label()]);
            }
        }
        let gone = |pair: &&(String, String)| !next.domain_limits.contains(pair);
        for (domain, limit) in self.series.domain_limits.iter().filter(gone) {
            for outcome in Outcome::ALL {
                let _ = RLS_LIMIT_DECISIONS.remove_label_values(&[domain, limit, outcome.label()]);
            }
        }
    }

    pub fn unmatched(&self) -> &RouteMetrics {
        &self.unmatched
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    /// A configuration of `routes`, each with one limit and one server; names are unique to
    /// each test, as the registry is the process's.
    fn config(routes: &[&str]) -> Config {
        let mut yaml = String::from("listen: [127.0.0.1:1]\nroutes:\n");
        for name in routes {
            yaml += &format!(
                "  - name: {name}\n    match: {{ path_prefix: /{name} }}\n    \
                 upstream: {{ servers: [127.0.0.1:1] }}\n    \
                 limits: [{{ name: per_client, algorithm: gcra, rate: 10/s }}]\n"
            );
        }
        Config::from_yaml(Path::new("meters.yaml"), &yaml).expect("the fixture compiles")
    }

    /// The handles of every route of `config`, as a site resolves them.
    fn handles(config: &Config) -> Vec<RouteMetrics> {
        config
            .routes
            .in_file_order()
            .into_iter()
            .map(|route| RouteMetrics::new(&route.name, route.tiers.written()))
            .collect()
    }

    /// The value of `family`'s counter for `route` whose other label is `value`.
    fn exported(family: &str, route: &str, value: &str) -> Option<f64> {
        let families = prometheus::gather();
        let family = families.iter().find(|f| f.name() == family)?;
        let labels = |m: &prometheus::proto::Metric| {
            let values: Vec<&str> = m.get_label().iter().map(|l| l.value()).collect();
            values == [route, value]
        };
        let metric = family.get_metric().iter().find(|m| labels(m))?;
        Some(metric.get_counter().value())
    }

    /// How many series of `family` the registry exports for `route`.
    fn series(family: &str, route: &str) -> usize {
        labelled(family, "route", route)
    }

    /// How many series of `family` the registry exports whose label `label` is `value`.
    fn labelled(family: &str, label: &str, value: &str) -> usize {
        prometheus::gather()
            .iter()
            .filter(|f| f.name() == family)
            .flat_map(|f| f.get_metric())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == label && l.value() == value)
            })
            .count()
    }

    #[test]
    fn a_route_exports_every_series_at_zero_before_its_first_request() {
        let config = config(&["meters_fresh"]);
        let handles = handles(&config);
        let _ = Metrics::new(&config.routes, config.consumers.plans());
        assert_eq!(
            series("sluice_requests_total", "meters_fresh"),
            Decided::COUNT
        );
        assert_eq!(
            series("sluice_limit_decisions_total", "meters_fresh"),
            Outcome::ALL.len()
        );
        assert_eq!(
            series("sluice_upstream_errors_total", "meters_fresh"),
            UpstreamError::ALL.len()
        );
        handles[0].count(Decided::Limiter(Outcome::Allowed));
        handles[0].count(Decided::Limiter(Outcome::Allowed));
        let allowed = handles[0].decided(Decided::Limiter(Outcome::Allowed));
        assert_eq!(allowed, 2, "the handle counts into the labelled series");
        assert_eq!(
            exported("sluice_requests_total", "meters_fresh", "allowed"),
            Some(2.0),
            "a scrape sums the threads' counts"
        );
    }

    #[test]
    fn the_failure_modes_answers_are_counted_apart_from_the_limits_decisions() {
        let config = config(&["meters_outage"]);
        let handles = handles(&config);
        let meters = handles[0].limit_at(0).expect("one limit");
        for outcome in Outcome::ALL {
            meters.count(outcome);
        }
        meters.count(Outcome::ErrorAllowed);
        let totals = meters.totals();
        assert_eq!(
            (totals.allowed, totals.limited, totals.shadow),
            (1, 1, 1),
            "only what the limit decided"
        );
        assert_eq!(
            (totals.failure_admitted, totals.failure_refused),
            (3, 2),
            "error_allowed twice and local_allowed; error_denied and local_limited"
        );
    }

    #[test]
    fn a_reload_retires_the_series_of_what_it_removed_and_keeps_the_rest() {
        let before = config(&["meters_kept", "meters_removed"]);
        let _handles = handles(&before);
        let old = Metrics::new(&before.routes, before.consumers.plans());
        let after = config(&["meters_kept"]);
        let _next_handles = handles(&after);
        let next = Metrics::new(&after.routes, after.consumers.plans());
        let families = [
            "sluice_requests_total",
            "sluice_limit_decisions_total",
            "sluice_upstream_errors_total",
            "sluice_client_errors_total",
            "sluice_requests_in_flight",
        ];
        for family in families {
            assert!(series(family, "meters_removed") > 0, "{family} before");
        }
        old.retire_series_missing_from(&next);
        for family in families {
            assert_eq!(series(family, "meters_removed"), 0, "{family} retired");
            assert!(series(family, "meters_kept") > 0, "{family} kept");
        }
    }

    /// A configuration serving the rate limit service's `domains`, each with one limit.
    fn rls_config(dir: &Path, domains: &[&str]) -> Config {
        let files = dir.join("rls");
        std::fs::create_dir_all(&files).unwrap();
        for domain in domains {
            let text = format!(
                "domain: {domain}\ndescriptors:\n  - key: k\n    \
                 rate_limit: {{ unit: second, requests_per_unit: 1 }}\n"
            );
            std::fs::write(files.join(format!("{domain}.yaml")), text).unwrap();
        }
        let yaml = format!(
            "rls: {{ listen: 127.0.0.1:1, config_dir: {} }}\n",
            files.display()
        );
        Config::from_yaml(&dir.join("sluice.yaml"), &yaml).expect("the fixture compiles")
    }

    fn domains(config: &Config) -> &Domains {
        &config.rls.as_ref().expect("rls").domains
    }

    #[test]
    fn a_reload_retires_the_rate_limit_services_domains_it_removed() {
        let (old_dir, new_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let before = rls_config(old_dir.path(), &["meters_rls_kept", "meters_rls_removed"]);
        let after = rls_config(new_dir.path(), &["meters_rls_kept"]);
        let _handles = (rls_metrics(domains(&before)), rls_metrics(domains(&after)));
        let old = Metrics::new(&before.routes, before.consumers.plans()).with_rls(domains(&before));
        let next = Metrics::new(&after.routes, after.consumers.plans()).with_rls(domains(&after));
        let families = [
            "sluice_rls_requests_total",
            "sluice_rls_limit_decisions_total",
        ];
        for family in families {
            assert!(
                labelled(family, "domain", "meters_rls_removed") > 0,
                "{family} before"
            );
        }
        old.retire_series_missing_from(&next);
        for family in families {
            assert_eq!(
                labelled(family, "domain", "meters_rls_removed"),
                0,
                "{family} retired"
            );
            assert!(
                labelled(family, "domain", "meters_rls_kept") > 0,
                "{family} kept"
            );
        }
    }
}
