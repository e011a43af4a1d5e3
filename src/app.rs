//! Wiring: a Pingora server with the configuration service, the proxy service and the admin
//! service, built from a validated [`Config`].

use std::sync::Arc;

use arc_swap::ArcSwap;

use pingora::apps::http_app::HttpServer;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::GenBackgroundService;
use pingora::services::listening::Service;

use crate::admin::AdminApp;
use crate::config::{Config, ServerSettings};
use crate::limiter::clock::{Clock, SystemClock};
use crate::limiter::local::{LocalLimiter, DEFAULT_MAX_KEYS};
use crate::limiter::{Engine, Policy};
use crate::listening::{BoundFirst, ReadyReport};
use crate::metrics;
use crate::proxy::front::FrontDoor;
use crate::proxy::Gateway;
use crate::reload::{ConfigService, RestartOnly};
use crate::snapshot::{Live, Snapshot};

/// Command-line switches that change how the server starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    pub daemon: bool,
    pub upgrade: bool,
}

/// Pingora's settings from our `server:` section.
pub fn server_conf(settings: &ServerSettings, daemon: bool) -> ServerConf {
    let defaults = ServerConf::default();
    ServerConf {
        threads: settings.threads(),
        pid_file: settings.pid_file(),
        upgrade_sock: settings.upgrade_sock(),
        error_log: settings.error_log.clone(),
        user: settings.user.clone(),
        group: settings.group.clone(),
        daemon: daemon || settings.daemon,
        // Not `daemon_wait_for_ready`: in Pingora 0.9.1 the daemon's SIGUSR1 can reach the
        // launching process before it installs its handler, killing it (seen in tests/upgrade.rs).
        work_stealing: settings.work_stealing(),
        grace_period_seconds: Some(settings.grace_period_seconds()),
        graceful_shutdown_timeout_seconds: Some(settings.graceful_shutdown_timeout_seconds()),
        upstream_keepalive_pool_size: settings
            .upstream_keepalive_pool_size
            .unwrap_or(defaults.upstream_keepalive_pool_size),
        ..defaults
    }
}

/// The policy the configuration asks for: Redis (with the in-process fallback for
/// `failure_mode: local`) or in-process only. Nothing connects yet.
pub fn build_policy(config: &Config) -> Result<Policy, String> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let local = || Arc::new(LocalLimiter::new(Arc::clone(&clock), DEFAULT_MAX_KEYS));
    let (engine, fallback) = match &config.redis {
        Some(redis) => {
            let engine = Engine::redis(
                &redis.topology,
                &redis.auth,
                redis.timeout,
                Arc::clone(&clock),
                metrics::guard_meters(),
                metrics::lease_meters(),
            )
            .map_err(|e| format!("redis client for {}: {e}", redis.topology.describe()))?;
            (engine, Some(local()))
        }
        None => (Engine::local(local()), None),
    };
    let meters = metrics::policy_meters(engine.backend.name());
    Ok(Policy::new(engine, fallback, clock, meters))
}

/// Starts serving and never returns.
pub fn run(config: Config, options: RunOptions) -> Result<std::convert::Infallible, String> {
    metrics::init();
    let opt = Opt {
        upgrade: options.upgrade,
        daemon: options.daemon,
        ..Opt::default()
    };
    let mut server =
        Server::new_with_opt_and_conf(opt, server_conf(&config.server, options.daemon));
    // Bootstrap (taking the listeners over from an old instance with -u) runs as a service,
    // after daemonizing, and the listeners wait for it: a new instance can be started first and
    // waits for the sockets until the old one is told to hand them over (SIGQUIT).
    let bootstrap = server.bootstrap_as_a_service();

    let policy = Arc::new(build_policy(&config)?);
    log::info!("{}", config.summary());
    let (listen, admin_listen, failure_mode) = (
        config.listen.clone(),
        config.admin_listen,
        config.failure_mode,
    );
    let (head_timeout, keepalive_timeout) = (
        config.server.request_head_timeout(),
        config.server.keepalive_timeout(),
    );
    let (source, restart_only) = (config.source.clone(), RestartOnly::of(&config));
    let snapshot = Snapshot::build(config).map_err(|e| e.to_string())?;
    let live: Live = Arc::new(ArcSwap::from_pointee(snapshot));

    // The proxy serves only once the configuration service has probed the upstreams.
    let configuration = server.add_service(GenBackgroundService::new(
        "sluice configuration".to_string(),
        Arc::new(ConfigService::new(source, restart_only, Arc::clone(&live))),
    ));
    let gateway = pingora::proxy::http_proxy(
        &server.configuration,
        Gateway::new(live, Arc::clone(&policy)),
    );
    let mut proxy = Service::new(
        "sluice proxy".to_string(),
        FrontDoor::new(gateway, head_timeout, keepalive_timeout),
    );
    let addresses: Vec<String> = listen.iter().map(ToString::to_string).collect();
    for address in &addresses {
        proxy.add_tcp(address);
    }
    // Connect to Redis now, from the proxy's own runtime, rather than at the first request.
    let warm = Arc::clone(&policy);
    let proxy = BoundFirst::new(proxy, addresses).on_start(move || {
        tokio::spawn(async move {
            warm.readiness().await;
        });
    });
    let proxy = server.add_service(proxy);
    proxy.add_dependency(&bootstrap);
    proxy.add_dependency(&configuration);

    // `sluice -d` returns once this reports: listeners bound and configuration live (or, when
    // taking over from an old instance, once it waits for the sockets).
    let report = server.add_service(ReadyReport::service());
    report.add_dependency(&configuration);
    if !options.upgrade {
        report.add_dependency(&proxy);
    }

    if let Some(addr) = admin_listen {
        let mut admin = Service::new(
            "sluice admin".to_string(),
            HttpServer::new_app(AdminApp::new(policy, failure_mode)),
        );
        admin.add_tcp(&addr.to_string());
        let admin = server.add_service(BoundFirst::new(admin, vec![addr.to_string()]));
        admin.add_dependency(&bootstrap);
        if !options.upgrade {
            report.add_dependency(&admin);
        }
    }
    server.run_forever()
}
