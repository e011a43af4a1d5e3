//! The configuration service: puts the first snapshot live (its upstreams probed) before the
//! proxy starts serving, then on every SIGHUP reads and compiles the file again. On success the
//! new snapshot — routes, limits, identity and path settings, pools and their health checks,
//! the JWT verifier (keeping the keys of an unchanged JWKS URL) and its refresh — is started and
//! swapped in atomically (requests in flight finish on the one they started with) and the old
//! one's checks and refresh stop; on any error the running configuration stays and every
//! problem is logged.
//!
//! What a running process cannot change in place — listeners (their addresses and protocols;
//! their certificates do reload), the admin listener, the `server:`, `redis:` and `tracing:`
//! sections — keeps its old value until a graceful upgrade (`sluice -u`, `systemctl reload`):
//! the reloaded file is compiled with the `redis:` settings in force (its keys, their prefix,
//! what the dashboard shows), its own are checked, and each setting it changes is logged with
//! what it will do when it takes effect (a new key prefix: every counter starts anew) and
//! listed as pending (`Config.pending_upgrade`: `/readyz`, the dashboard). A changed
//! `key_secret` applies at once, and the log says that every counter starts anew with it.
//!
//! SIGUSR1 opens the access log and the quota admin audit log files again by name (logrotate);
//! a reload does too, since the new configuration opens its own (at its paths).
//!
//! `watch: true` reloads without a signal: every [`WATCH_INTERVAL`] the files the configuration
//! was built from (`sources.rs`: the file, the certificates, keys, CA and secret files it names,
//! the RLS directory and its files) are read again; a difference that is still the same one
//! interval later (debounced: an editor's several writes, a kubelet's symlink swap) reloads, with
//! the same all-or-nothing checks as SIGHUP. After a rejected reload the broken contents are what
//! is compared against: the next change (the fix) reloads again, the broken file does not retry.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;
use tokio::signal::unix::{signal, SignalKind};

use crate::config::sources::Sources;
use crate::config::{Config, ConfigError, PendingChange, RedisSettings, ServerSettings};
use crate::exchange::site::{Handover, Lasting};
use crate::limiter::Policy;
use crate::observe::metrics;
use crate::runtime::durability;
use crate::runtime::snapshot::{InForce, Snapshot};

/// How often `watch: true` reads the configuration's files again; a change reloads once it has
/// held for one more interval, so within about two.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// How long a reload waits for its decision scripts to be loaded into Redis.
pub const WARM_BOUND: Duration = Duration::from_secs(2);

/// The settings a reload cannot change, as the process started with them.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartOnly {
    listen: Vec<(std::net::SocketAddr, bool, bool, bool)>,
    admin_listen: Option<std::net::SocketAddr>,
    redis: Option<RedisSettings>,
    regions: Option<crate::config::RegionsSettings>,
    server: ServerSettings,
    tracing: Option<crate::config::observe::TracingSettings>,
    rls_listen: Option<std::net::SocketAddr>,
}

impl RestartOnly {
    pub fn of(config: &Config) -> RestartOnly {
        RestartOnly {
            listen: config.listen.iter().map(|l| l.shape()).collect(),
            admin_listen: config.admin_listen,
            redis: config.redis.clone(),
            regions: config.regions.clone(),
            server: config.server.clone(),
            tracing: config.tracing.clone(),
            rls_listen: config.rls.as_ref().map(|rls| rls.listen),
        }
    }

    /// The sections `now` (a reloaded file's) changes against these, each waiting for a
    /// graceful upgrade. Not `redis:` nor `regions:`: a reload compiles the file with the
    /// settings in force and names what waits.
    fn changed_in(&self, now: &RestartOnly) -> Vec<PendingChange> {
        let sections = [
            ("listen", now.listen != self.listen),
            ("admin.listen", now.admin_listen != self.admin_listen),
            ("server", now.server != self.server),
            ("tracing", now.tracing != self.tracing),
            ("rls.listen", now.rls_listen != self.rls_listen),
        ];
        let changed = sections.into_iter().filter(|(_, changed)| *changed);
        changed
            .map(|(path, _)| PendingChange { path, values: None })
            .collect()
    }
}

/// What the log says of a setting the file changes that waits for a graceful upgrade, and of
/// what it does when it takes effect.
fn waiting(change: &PendingChange) -> String {
    let mut line = format!(
        "`{}` changed in the file{}; the running value stays until a graceful upgrade (sluice -u)",
        change.path,
        match &change.values {
            Some((running, file)) => format!(" ({running} → {file})"),
            None => String::new(),
        }
    );
    match (change.path, &change.values) {
        ("redis.key_prefix", Some((_, file))) => line.push_str(&format!(
            "; when it takes effect every counter (monthly quotas included), credit id and override starts anew under {file}"
        )),
        ("redis", _) => {
            line.push_str("; when it takes effect every counter (monthly quotas included) starts anew")
        }
        _ => {}
    }
    line
}

/// The listeners' certificates as a reload sees them (`edge::tls::TlsListeners` implements
/// it): every certificate `config` names read (noted in `read`) and checked before anything
/// changes; what `prepare` returns swaps them in.
pub trait ListenerCertificates: Send + Sync {
    fn prepare(
        &self,
        config: &Config,
        read: &mut Sources,
    ) -> Result<Box<dyn FnOnce() + Send + '_>, ConfigError>;
}

/// Starts the first snapshot, then reloads `path` into `live` (and the certificates into the
/// TLS listeners) on every SIGHUP.
pub struct ConfigService {
    path: PathBuf,
    started_with: RestartOnly,
    live: InForce,
    /// The limiter: a new configuration's decision scripts are loaded before it takes effect.
    policy: Arc<Policy>,
    tls: Arc<dyn ListenerCertificates>,
    /// The clock every snapshot's requests read and the live views they count into (a reload
    /// is noted there too).
    lasting: Lasting,
    /// The files the last reload (or start) read, with what it saw in them.
    sources: Mutex<Sources>,
}

impl ConfigService {
    /// The service reloading `path` into `live`, whose configuration is the first; it asks
    /// `policy` to load that configuration's decision scripts.
    pub fn new(
        path: PathBuf,
        started_with: RestartOnly,
        live: InForce,
        policy: Arc<Policy>,
        tls: Arc<dyn ListenerCertificates>,
        lasting: Lasting,
        read_at_start: Sources,
    ) -> ConfigService {
        // The first configuration's decision scripts are loaded before readiness says ready.
        policy.want_scripts(live.load().config.algorithms());
        ConfigService {
            path,
            started_with,
            live,
            policy,
            tls,
            lasting,
            sources: Mutex::new(read_at_start),
        }
    }

    /// One reload attempt: swaps on success, keeps the old configuration on any error. What it
    /// read becomes what `watch` compares against (after an error, on top of what the running
    /// configuration was built from).
    pub async fn reload(&self) -> Result<(), ConfigError> {
        let mut read = Sources::default();
        let result = self.try_reload(&mut read).await;
        // What this reload let go, whether it took effect or not: the configuration it
        // replaced (unless a request still holds it: then its last such request's thread
        // frees it, handed back at a later reload), or the one it built and refused.
        super::memory::hand_back_freed();
        let mut sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => *sources = read,
            Err(_) => sources.merge(read),
        }
        result
    }

    async fn try_reload(&self, read: &mut Sources) -> Result<(), ConfigError> {
        let started = &self.started_with;
        let config = Config::reload(
            &self.path,
            read,
            started.redis.as_ref(),
            started.regions.as_ref(),
        );
        super::memory::hand_back_freed();
        let mut config = config?;
        let now = RestartOnly::of(&config);
        config
            .pending_upgrade
            .extend(self.started_with.changed_in(&now));
        let secret_changed = self.live.load().config.key_secret != config.key_secret;
        let summary = config.summary();
        // Every certificate is read and checked before anything changes.
        let swap_certificates = self.tls.prepare(&config, read)?;
        let snapshot = {
            // The site in force hands over only while the next one is built: its guard is not
            // held across the start below.
            let previous = self.live.load();
            let handover = Handover::of(&previous.site).with_health(previous.health());
            Arc::new(Snapshot::build(config, &self.lasting, handover, read)?)
        };
        snapshot.start().await;
        self.warm_decisions(&snapshot).await;
        swap_certificates();
        let retired = self.live.swap(Arc::clone(&snapshot));
        retired.retire();
        retired
            .metrics
            .retire_series_missing_from(&snapshot.metrics);
        log::info!("reload: {summary}");
        for change in &snapshot.config.pending_upgrade {
            log::warn!("reload: {}", waiting(change));
        }
        if secret_changed {
            log::warn!("reload: `key_secret` changed and applies now: it keys every key's hash, so every counter (monthly quotas included) and credit id starts anew");
        }
        durability::check_now(&self.policy, &snapshot.config, "after a reload").await;
        Ok(())
    }

    /// Loads the decision scripts `snapshot`'s limits may call before it takes effect, so its
    /// first decisions do not pay their load. A Redis that does not answer (or not within
    /// [`WARM_BOUND`]) does not hold the reload back: its failure mode applies meanwhile, and
    /// the connection keeper loads them once Redis answers.
    async fn warm_decisions(&self, snapshot: &Snapshot) {
        self.policy.want_scripts(snapshot.config.algorithms());
        if !self.policy.scripts_loaded_within(WARM_BOUND).await {
            log::warn!(
                "reload: the new limits' decision scripts are not loaded yet (the {} limiter does not answer, or not within {} ms); the reload takes effect now, and they load once it answers",
                self.policy.backend(),
                WARM_BOUND.as_millis()
            );
        }
    }
}

#[async_trait]
impl BackgroundService for ConfigService {
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let mut hangups = signal(SignalKind::hangup());
        let reopens = signal(SignalKind::user_defined1());
        self.live.load().start().await;
        ready.notify_ready();
        let hangups = match &mut hangups {
            Ok(hangups) => hangups,
            Err(e) => {
                log::error!("cannot listen for SIGHUP, hot reload is off: {e}");
                let _ = shutdown.changed().await;
                return;
            }
        };
        let mut reopens = match reopens {
            Ok(reopens) => Some(reopens),
            Err(e) => {
                log::error!(
                    "cannot listen for SIGUSR1, the access and audit logs are reopened only on reload: {e}"
                );
                None
            }
        };
        let mut watch = Watch::default();
        let mut ticks = tokio::time::interval(WATCH_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = next_signal(&mut reopens) => self.reopen_logs().await,
                _ = hangups.recv() => self.reload_counted("SIGHUP").await,
                _ = ticks.tick() => self.look(&mut watch).await,
                _ = shutdown.changed() => {
                    self.live.load().retire();
                    return;
                }
            }
        }
    }
}

impl ConfigService {
    /// SIGUSR1: opens the access and audit logs in force again by name (logrotate moved them).
    async fn reopen_logs(&self) {
        let snapshot = self.live.load_full();
        if let Some(access_log) = &snapshot.access_log {
            access_log.reopen();
        }
        snapshot.audit_log.reopen().await;
    }

    /// A reload for `cause`, counted and logged either way.
    async fn reload_counted(&self, cause: &str) {
        log::info!("reload: {cause}");
        match self.reload().await {
            Ok(()) => {
                self.lasting.views.reloads.record(cause, None);
                metrics::CONFIG_RELOADS
                    .with_label_values(&["success"])
                    .inc();
            }
            Err(error) => {
                let reloads = &self.lasting.views.reloads;
                reloads.record(cause, Some(error.to_string()));
                metrics::CONFIG_RELOADS.with_label_values(&["error"]).inc();
                for line in error.to_string().lines() {
                    log::error!("reload rejected, keeping the running configuration: {line}");
                }
            }
        }
    }

    /// `watch: true`: compares the files with what the last reload read; reloads once a
    /// difference has held for one interval.
    async fn look(&self, watch: &mut Watch) {
        if !self.live.load().config.watch {
            watch.pending = None;
            return;
        }
        let (now, changed) = {
            let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
            let now = sources.now();
            let changed = sources.first_difference(&now).map(PathBuf::from);
            (now, changed)
        };
        let Some(changed) = changed else {
            watch.pending = None;
            return;
        };
        if watch.pending.as_ref() == Some(&now) {
            watch.pending = None;
            let cause = format!("watch: {} changed", changed.display());
            self.reload_counted(&cause).await;
        } else {
            watch.pending = Some(now);
        }
    }
}

/// What `watch` saw changed at the last look, waiting to hold for one more interval.
#[derive(Default)]
struct Watch {
    pending: Option<Sources>,
}

/// The next signal of `signals`; never, when there is no stream to listen on.
async fn next_signal(signals: &mut Option<tokio::signal::unix::Signal>) {
    match signals {
        Some(signals) => {
            signals.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::runtime::memory::{self, counting};
    use crate::runtime::snapshot::testing;
    use arc_swap::ArcSwap;

    /// Listeners without certificates: nothing to read, nothing to swap; or, once `refuse` is
    /// set, certificates that do not read (a reload refused after its configuration is built).
    #[derive(Default)]
    struct NoCertificates {
        refuse: AtomicBool,
    }

    impl ListenerCertificates for NoCertificates {
        fn prepare(
            &self,
            _: &Config,
            _: &mut Sources,
        ) -> Result<Box<dyn FnOnce() + Send + '_>, ConfigError> {
            if self.refuse.load(Ordering::Relaxed) {
                let message = "cannot read the certificate".to_string();
                let file = std::path::Path::new("test.yaml");
                return Err(ConfigError::single(file, "listen", message));
            }
            Ok(Box::new(|| {}))
        }
    }

    #[tokio::test]
    async fn each_reload_hands_back_what_it_freed_whether_it_takes_effect_or_not() {
        let yaml = "listen: [127.0.0.1:1]\nroutes:\n  - { name: r, match: { path_prefix: / }, \
                    upstream: { servers: [127.0.0.1:1] } }\n";
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("sluice.yaml");
        std::fs::write(&path, yaml).expect("the file written");
        let (policy, snapshot) = testing::in_process(yaml);
        let certificates = Arc::new(NoCertificates::default());
        let service = ConfigService::new(
            path.clone(),
            RestartOnly::of(&snapshot.config),
            Arc::new(ArcSwap::from_pointee(snapshot)),
            Arc::new(policy),
            Arc::clone(&certificates) as Arc<dyn ListenerCertificates>,
            testing::lasting(),
            Sources::default(),
        );
        memory::set_hand_back(counting::hand_back);
        // One test thread (tokio's default for tests): every hand-back is counted here.
        let before = counting::calls();
        service.reload().await.expect("the same file reloads");
        let taken = counting::calls() - before;
        certificates.refuse.store(true, Ordering::Relaxed);
        assert!(service.reload().await.is_err());
        let refused_once_built = counting::calls() - before - taken;
        std::fs::write(&path, "routes: 5\n").expect("the file written");
        assert!(service.reload().await.is_err());
        let refused_at_reading = counting::calls() - before - taken - refused_once_built;
        // After the reading, and after the reload whatever became of it.
        assert_eq!((taken, refused_once_built, refused_at_reading), (2, 2, 2));
    }

    #[test]
    fn a_waiting_key_prefix_says_that_counters_start_anew_when_it_takes_effect() {
        let prefix = PendingChange {
            path: "redis.key_prefix",
            values: Some(("a".into(), "b".into())),
        };
        assert_eq!(
            waiting(&prefix),
            "`redis.key_prefix` changed in the file (a → b); the running value stays until a \
             graceful upgrade (sluice -u); when it takes effect every counter (monthly quotas \
             included), credit id and override starts anew under b"
        );
        let url = PendingChange {
            path: "redis.url",
            values: None,
        };
        assert_eq!(
            waiting(&url),
            "`redis.url` changed in the file; the running value stays until a graceful upgrade (sluice -u)"
        );
    }
}
