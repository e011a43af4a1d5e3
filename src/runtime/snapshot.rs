//! What one configuration puts in force, swapped whole on reload: the compiled configuration,
//! one runtime per route (the route, its upstream pool, its metric handles), the health checks
//! of the pools and the refresh of the JWKS URL. A request keeps the snapshot it started with
//! until it ends.
//!
//! A snapshot goes live only once its pools have been probed and, when it verifies JWTs with
//! keys from a URL and has none yet, the URL fetched once (`start`): a server that is down is
//! never chosen, and tokens are verifiable, from the first request after a start or a reload.
//! Its checks and its JWKS refresh then run in the background until the snapshot is retired by
//! the next one. A reload that keeps the JWKS URL keeps the keys fetched for it: the site in
//! force hands them over (`exchange::site::Handover`).

use std::ops::Deref;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::caller::consumers::AuthMode;
use crate::caller::jwt::{refresh_once, start_refresh, FetchOutcome, JwksRefresh};
use crate::config::{Config, ConfigError, Sources};
use crate::exchange::meters::Metrics;
use crate::exchange::site::{Handover, Lasting, Site, SiteLease};
use crate::limiter::per_thread::ThreadHandles;
use crate::observe::metrics;
use crate::upstream::health::{HealthChecks, HealthRecord, RecordSetup};
use crate::upstream::pool::{Pool, Pools};

/// A site and what keeps it current while it is in force: its routes' pools (Pingora's load
/// balancers) with their health checks, and its JWKS refresh.
pub struct Snapshot {
    pub site: Arc<Site<Pool>>,
    /// The site's handles that requests take, one per thread.
    handles: ThreadHandles<Site<Pool>>,
    /// The pools the site's routes dial, whose health checks run from here.
    pools: Pools,
    checks: Mutex<Option<HealthChecks>>,
    /// The JWKS URL's background refresh, stopped when the snapshot is retired.
    jwks: Mutex<Option<JwksRefresh>>,
}

impl Deref for Snapshot {
    type Target = Site<Pool>;

    fn deref(&self) -> &Site<Pool> {
        &self.site
    }
}

/// The snapshot in force; `store` a new one to reload. Not the live views (`observe::live`).
pub type InForce = Arc<ArcSwap<Snapshot>>;

impl Snapshot {
    /// Builds the pools of `config` (reading their TLS files through `read`) and its site
    /// (handles, access log), whose requests read `lasting`'s clock and count into its live
    /// views; no check runs yet.
    pub fn build(
        config: Config,
        lasting: &Lasting,
        handover: Handover<'_>,
        read: &mut Sources,
    ) -> Result<Snapshot, ConfigError> {
        let setup = RecordSetup {
            clock: Arc::clone(&lasting.clock),
            gauge: Metrics::upstream_health,
            ejection: Metrics::upstream_ejection,
            previous: handover.health(),
        };
        let pools = Pools::build(&config.routes, read, &setup).map_err(|problems| ConfigError {
            file: config.source.clone(),
            problems,
        })?;
        let servers: Vec<Pool> = pools.iter().cloned().collect();
        let site = Arc::new(Site::build(config, &servers, lasting, handover)?);
        Ok(Snapshot {
            handles: ThreadHandles::new(Arc::clone(&site)),
            site,
            pools,
            checks: Mutex::new(None),
            jwks: Mutex::new(None),
        })
    }

    /// The site, for a request to hold to its end: its thread's handle (no count every core
    /// writes).
    pub fn site_for_request(&self) -> SiteLease<Pool> {
        self.handles.handle()
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
        let refresh = self.jwt.as_ref().map(|jwt| start_refresh(jwt, count_fetch));
        *self.jwks.lock().unwrap_or_else(|p| p.into_inner()) = refresh;
    }

    /// Fetches the JWKS URL once when no key from it is in force (the first start, a new URL).
    /// Keys kept across a reload are refreshed on the usual schedule instead.
    async fn fetch_missing_keys(&self) {
        let Some(jwt) = &self.jwt else {
            return;
        };
        if jwt.keys().is_empty() {
            if let Some(outcome) = refresh_once(jwt).await {
                count_fetch(&outcome);
            }
        }
    }

    /// Each upstream server's health, once whatever the routes that list it.
    pub fn health(&self) -> &HealthRecord {
        self.pools.health()
    }

    /// Whether routes verify callers while the JWT verifier has no key from its JWKS URL (it has
    /// not answered yet): tokens would be refused, so the gateway is not ready.
    pub fn awaits_jwt_keys(&self) -> bool {
        let Some(jwt) = &self.jwt else {
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

/// A snapshot and a policy for unit tests: no socket, no server.
#[cfg(test)]
pub mod testing {
    use std::path::Path;
    use std::sync::Arc;

    use super::Snapshot;
    use crate::config::{Config, Sources};
    use crate::exchange::site::{Handover, Lasting};
    use crate::limiter::clock::ManualClock;
    use crate::limiter::local::LocalLimiter;
    use crate::limiter::{Engine, Policy, PolicyMeters};

    /// The snapshot of the configuration `yaml`, and a policy deciding its limits (and keeping
    /// the admin tables) in this process, both on one manual clock at 1,000 s.
    pub fn in_process(yaml: &str) -> (Policy, Snapshot) {
        let config = Config::from_yaml(Path::new("test.yaml"), yaml).expect("a valid config");
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let local = Arc::new(LocalLimiter::new(clock.clone(), 1000));
        let meters = PolicyMeters::unregistered();
        let policy = Policy::new(Engine::local(local), None, clock.clone(), meters);
        let lasting = Lasting::new(clock);
        let mut read = Sources::default();
        let snapshot = Snapshot::build(config, &lasting, Handover::default(), &mut read);
        (policy, snapshot.expect("a snapshot"))
    }

    /// A process's lasting parts (its clock and live views), on a manual clock at 1,000 s.
    pub fn lasting() -> Lasting {
        Lasting::new(Arc::new(ManualClock::new(1_000_000_000)))
    }
}
