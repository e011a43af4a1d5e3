//! What one configuration puts in force for requests: the compiled configuration, one runtime
//! per route (the route, its upstream pool, its metric handles), the handles of unrouted
//! requests, the access log and the rate limit service's counters. A request holds the site it
//! started with until it ends; `runtime::snapshot` starts, swaps and retires it.

use std::collections::HashMap;
use std::sync::Arc;

use http::Method;

use super::meters::{self, Metrics, RouteMetrics};
use crate::caller::consumers::AuthMode;
use crate::config::{Config, ConfigError};
use crate::limiter::clock::Clock;
use crate::observe::access_log::{self, AccessLog};
use crate::observe::metrics::ACCESS_LOG_DROPPED;
use crate::route::keys::Rotation;
use crate::route::table::Route;
use crate::route::tiers::TierId;
use crate::upstream::pool::{Pool, Pools};

/// One route as a request needs it, in one reference: the compiled route, the pool of its
/// upstream servers and its metric handles.
pub struct RouteRuntime {
    pub route: Arc<Route>,
    pub pool: Pool,
    pub metrics: RouteMetrics,
    /// Each tier's turn among the shards of its split limits (by tier id).
    rotations: Box<[Rotation]>,
}

impl RouteRuntime {
    /// The round robin of the route's tier `tier`.
    pub fn rotation(&self, tier: TierId) -> &Rotation {
        // An id the route does not have meets its default tier, as `Tiers::get` says.
        let rotations = &self.rotations;
        rotations.get(usize::from(tier.0)).unwrap_or(&rotations[0])
    }
}

/// What one configuration puts in force for requests: a request reads its routes, pools and
/// handles from the site it started with.
pub struct Site {
    pub config: Config,
    /// Every route's runtime, by `Route::index`.
    pub(crate) routes: Box<[Arc<RouteRuntime>]>,
    /// The pools' health checks run from here.
    pub(crate) pools: Pools,
    /// The handles of unrouted requests, and the series a reload may retire.
    pub metrics: Metrics,
    /// Open while this configuration is in force (and its last request logs).
    pub access_log: Option<AccessLog>,
    /// The rate limit service's counters, by domain.
    pub rls_metrics: HashMap<String, meters::DomainMetrics>,
    /// The process's clock, the only time a request reads (a manual one in tests).
    pub(crate) clock: Arc<dyn Clock>,
}

impl Site {
    /// Builds the pools and metric handles of `config` and opens its access log; no check
    /// runs yet.
    pub fn build(config: Config, clock: Arc<dyn Clock>) -> Result<Site, ConfigError> {
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
                    rotations: (0..route.tiers.count())
                        .map(|_| Rotation::default())
                        .collect(),
                })
            })
            .collect();
        let mut metrics = Metrics::new(&config.routes, config.consumers.plans());
        if let Some(rls) = &config.rls {
            metrics = metrics.with_rls(&rls.domains);
        }
        let access_log = match &config.access_log {
            Some(settings) => Some(
                AccessLog::open(settings, ACCESS_LOG_DROPPED.clone()).map_err(|e| {
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
            .map(|rls| meters::rls_metrics(&rls.domains))
            .unwrap_or_default();
        Ok(Site {
            config,
            routes,
            pools,
            metrics,
            access_log,
            rls_metrics,
            clock,
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
}
