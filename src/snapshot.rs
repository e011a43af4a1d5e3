//! What one configuration puts in force, swapped whole on reload: the compiled configuration,
//! the upstream pools built for it (with their health checks) and its per-route metric handles.
//! A request keeps the snapshot it started with until it ends.
//!
//! A snapshot goes live only once its pools have been probed (`start`), so a server that is
//! down is never chosen, not even by the first requests after a start or a reload; its checks
//! then run in the background until the snapshot is retired by the next one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::access_log::{self, AccessLog};
use crate::config::{Config, ConfigError};
use crate::metrics::{self, Metrics};
use crate::pool::{HealthChecks, Pools};

pub struct Snapshot {
    pub config: Config,
    pub pools: Pools,
    pub metrics: Metrics,
    /// Open while this configuration is in force (and its last request logs).
    pub access_log: Option<AccessLog>,
    /// The rate limit service's counters, by domain.
    pub rls_metrics: HashMap<String, metrics::DomainMetrics>,
    checks: Mutex<Option<HealthChecks>>,
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
        let metrics = Metrics::new(&config.routes);
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
            pools,
            metrics,
            access_log,
            rls_metrics,
            checks: Mutex::new(None),
        })
    }

    /// Starts the access log's writer, probes every health-checked server once, then keeps
    /// checking in the background (in the current runtime) until [`Snapshot::retire`].
    pub async fn start(&self) {
        if let Some(access_log) = &self.access_log {
            if let Err(e) = access_log.start() {
                log::error!("access log: cannot start its writer: {e}");
            }
        }
        self.pools.check_once().await;
        let checks = self.pools.start_checks();
        *self.checks.lock().unwrap_or_else(|p| p.into_inner()) = Some(checks);
    }

    /// Stops the background health checks: a newer snapshot is in force.
    pub fn retire(&self) {
        if let Some(checks) = self.checks.lock().unwrap_or_else(|p| p.into_inner()).take() {
            checks.stop();
        }
    }
}
