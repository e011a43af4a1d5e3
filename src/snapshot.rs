//! What one configuration puts in force, swapped whole on reload: the compiled configuration,
//! one runtime per route (the route, its upstream pool, its metric handles), the health checks
//! of the pools and the refresh of the JWKS URL. A request keeps the snapshot it started with
//! until it ends.
//!
//! A snapshot goes live only once its pools have been probed and, when it verifies JWTs with
//! keys from a URL and has none yet, the URL fetched once (`start`): a server that is down is
//! never chosen, and tokens are verifiable, from the first request after a start or a reload.
//! Its checks and its JWKS refresh then run in the background until the snapshot is retired by
//! the next one. A reload that keeps the JWKS URL keeps the keys fetched for it
//! ([`Snapshot::keep_keys_of`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use http::Method;

use crate::access_log::{self, AccessLog};
use crate::config::{Config, ConfigError};
use crate::consumers::AuthMode;
use crate::jwt::{refresh_once, start_refresh, FetchOutcome, JwksRefresh};
use crate::metrics::{self, Metrics, RouteMetrics};
use crate::pool::{HealthChecks, Pool, Pools};
use crate::router::Route;

/// One route as a request needs it, in one reference: the compiled route, the pool of its
/// upstream servers and its metric handles.
pub struct RouteRuntime {
    pub route: Arc<Route>,
    pub pool: Pool,
    pub metrics: RouteMetrics,
}

pub struct Snapshot {
    pub config: Config,
    /// Every route's runtime, by `Route::index`.
    routes: Box<[Arc<RouteRuntime>]>,
    /// The pools' health checks run from here.
    pools: Pools,
    /// The handles of unrouted requests, and the series a reload may retire.
    pub metrics: Metrics,
    /// Open while this configuration is in force (and its last request logs).
    pub access_log: Option<AccessLog>,
    /// The rate limit service's counters, by domain.
    pub rls_metrics: HashMap<String, metrics::DomainMetrics>,
    checks: Mutex<Option<HealthChecks>>,
    /// The JWKS URL's background refresh, stopped when the snapshot is retired.
    jwks: Mutex<Option<JwksRefresh>>,
}

/// The snapshot in force; `store` a new one to reload.
pub type Live = Arc<ArcSwap<Snapshot>>;

impl Snapshot {
    /// Builds the pools and metric handles of `config` and opens its access log; no check
    /// runs yet.
    pub fn build(config: Config) -> Result<Snapshot, ConfigError> {
        let mut pools = Pools::build(&config.routes).map_err(|problems| ConfigError {
            file: config.source.clone(),
            problems,
        })?;
        pools.report_health(&config.routes, Metrics::upstream_health);
        let routes = config
            .routes
            .in_file_order()
            .into_iter()
            .zip(pools.iter())
            .map(|(route, pool)| {
                let mut metrics =
                    RouteMetrics::new(&route.name, route.tiers.default().limits.limits());
                if route.auth.mode != AuthMode::Off {
                    metrics = metrics.with_callers(&route.name, config.consumers.plans());
                }
                Arc::new(RouteRuntime {
                    route: Arc::clone(route),
                    pool: pool.clone(),
                    metrics,
                })
            })
            .collect();
        let metrics = Metrics::new(&config.routes, config.consumers.plans());
        let access_log = match &config.access_log {
            Some(settings) => Some(
                AccessLog::open(settings, metrics::ACCESS_LOG_DROPPED.clone()).map_err(|e| {
                    ConfigError::single(
                        &config.source,
                        "access_log.path",
                        access_log::cannot_open(e),
                    )
                })?,
            ),
            None => None,
        };
        let rls_metrics = config
            .rls
            .as_ref()
            .map(|rls| metrics::rls_metrics(&rls.domains))
            .unwrap_or_default();
        Ok(Snapshot {
            config,
            routes,
            pools,
            metrics,
            access_log,
            rls_metrics,
            checks: Mutex::new(None),
            jwks: Mutex::new(None),
        })
    }

    /// The route that serves a request for `host`, `path` and `method`, if one does.
    pub fn find(&self, host: &str, path: &str, method: &Method) -> Option<&Arc<RouteRuntime>> {
        let route = self.config.routes.find(host, path, method)?;
        self.routes.get(route.index)
    }

    /// The runtime of the route at `index` (file order).
    pub fn route(&self, index: usize) -> Option<&Arc<RouteRuntime>> {
        self.routes.get(index)
    }

    /// Starts the access log's writer, probes every health-checked server once and fetches a
    /// JWKS URL that has no keys yet, then keeps checking and refreshing in the background (in
    /// the current runtime) until [`Snapshot::retire`].
    pub async fn start(&self) {
        if let Some(access_log) = &self.access_log {
            if let Err(e) = access_log.start() {
                log::error!("access log: cannot start its writer: {e}");
            }
        }
        tokio::join!(self.pools.check_once(), self.fetch_missing_keys());
        let checks = self.pools.start_checks();
        *self.checks.lock().unwrap_or_else(|p| p.into_inner()) = Some(checks);
        let refresh = self
            .config
            .consumers
            .jwt()
            .map(|jwt| start_refresh(jwt, count_fetch));
        *self.jwks.lock().unwrap_or_else(|p| p.into_inner()) = refresh;
    }

    /// Fetches the JWKS URL once when no key from it is in force (the first start, a new URL).
    /// Keys kept across a reload are refreshed on the usual schedule instead.
    async fn fetch_missing_keys(&self) {
        let Some(jwt) = self.config.consumers.jwt() else {
            return;
        };
        if jwt.keys().is_empty() {
            if let Some(outcome) = refresh_once(jwt).await {
                count_fetch(&outcome);
            }
        }
    }

    /// Takes over the keys `previous` fetched from the same JWKS URL (before [`Snapshot::start`]).
    pub fn keep_keys_of(&self, previous: &Snapshot) {
        let (Some(now), Some(before)) =
            (self.config.consumers.jwt(), previous.config.consumers.jwt())
        else {
            return;
        };
        if now.keep_keys_of(before) {
            log::info!(
                "reload: the same JWKS URL: its {} keys stay in force until its next fetch",
                now.keys().keys.len()
            );
        }
    }

    /// Whether routes verify callers while the JWT verifier has no key from its JWKS URL (it has
    /// not answered yet): tokens would be refused, so the gateway is not ready.
    pub fn awaits_jwt_keys(&self) -> bool {
        let Some(jwt) = self.config.consumers.jwt() else {
            return false;
        };
        jwt.awaits_keys()
            && self
                .routes
                .iter()
                .any(|runtime| runtime.route.auth.mode != AuthMode::Off)
    }

    /// Stops the background health checks and the JWKS refresh: a newer snapshot is in force.
    pub fn retire(&self) {
        if let Some(checks) = self.checks.lock().unwrap_or_else(|p| p.into_inner()).take() {
            checks.stop();
        }
        if let Some(refresh) = self.jwks.lock().unwrap_or_else(|p| p.into_inner()).take() {
            refresh.stop();
        }
    }
}

/// Counts one JWKS fetch by its outcome.
fn count_fetch(outcome: &FetchOutcome) {
    metrics::JWKS_FETCHES
        .with_label_values(&[outcome.label()])
        .inc();
}
