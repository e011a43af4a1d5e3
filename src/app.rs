//! Wiring: a Pingora server with the proxy service and the admin service, built from a
//! validated [`Config`].

use std::sync::Arc;

use arc_swap::ArcSwap;

use pingora::apps::http_app::HttpServer;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::Server;
use pingora::services::background::GenBackgroundService;
use pingora::services::listening::Service;

use crate::admin::AdminApp;
use crate::config::{Config, ServerSettings};
use crate::limiter::clock::SystemClock;
use crate::limiter::guard::Guarded;
use crate::limiter::leased::Leased;
use crate::limiter::local::LocalLimiter;
use crate::limiter::redis::RedisLimiter;
use crate::limiter::Limiter;
use crate::metrics;
use crate::proxy::{Active, ActiveConfig, Gateway};
use crate::reload::{Reloader, RestartOnly};
use crate::upstream::HealthChecker;

/// Keys the in-process backend tracks at most (see `limiter/local.rs`).
pub const LOCAL_MAX_KEYS: usize = 1_000_000;

/// Command-line switches that change how the server starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    pub daemon: bool,
    pub upgrade: bool,
}

/// Pingora's settings from our `server:` section; unset fields get sluice's defaults.
pub fn server_conf(settings: &ServerSettings, daemon: bool) -> ServerConf {
    let defaults = ServerConf::default();
    ServerConf {
        threads: settings.threads.unwrap_or(2),
        pid_file: settings
            .pid_file
            .clone()
            .unwrap_or_else(|| "/tmp/sluice.pid".to_string()),
        upgrade_sock: settings
            .upgrade_sock
            .clone()
            .unwrap_or_else(|| "/tmp/sluice_upgrade.sock".to_string()),
        error_log: settings.error_log.clone(),
        user: settings.user.clone(),
        group: settings.group.clone(),
        daemon: daemon || settings.daemon,
        // Not `daemon_wait_for_ready`: in Pingora 0.9.1 the daemon's SIGUSR1 can reach the
        // launching process before it installs its handler, killing it (seen in tests/upgrade.rs).
        work_stealing: settings.work_stealing.unwrap_or(true),
        grace_period_seconds: Some(settings.grace_period_seconds.unwrap_or(5)),
        graceful_shutdown_timeout_seconds: Some(
            settings.graceful_shutdown_timeout_seconds.unwrap_or(10),
        ),
        upstream_keepalive_pool_size: settings
            .upstream_keepalive_pool_size
            .unwrap_or(defaults.upstream_keepalive_pool_size),
        ..defaults
    }
}

/// Builds the limiter the configuration asks for. Nothing connects yet.
pub fn build_limiter(config: &Config) -> Result<Arc<dyn Limiter>, String> {
    Ok(match &config.redis {
        Some(redis) => {
            let backend = RedisLimiter::new(&redis.topology, redis.timeout)
                .map_err(|e| format!("redis client for {}: {e}", redis.topology.describe()))?;
            // The deny cache and the circuit breaker keep a flood or an outage away from Redis;
            // leases serve `mode: leased` limits locally, in front of both, so units a gateway
            // holds are spent even while a denial of their key is cached.
            let guarded = Guarded::new(Arc::new(backend), true);
            Arc::new(Leased::new(Arc::new(guarded)))
        }
        None => Arc::new(LocalLimiter::new(Arc::new(SystemClock), LOCAL_MAX_KEYS)),
    })
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

    let limiter = build_limiter(&config)?;
    log::info!("{}", config.summary());
    let checkers: Vec<(String, HealthChecker)> = config
        .routes
        .in_file_order()
        .iter()
        .filter_map(|r| {
            Some((
                format!("health check {}", r.name),
                r.upstream.health_checker()?,
            ))
        })
        .collect();
    let (listen, admin_listen, failure_mode) = (
        config.listen.clone(),
        config.admin_listen,
        config.failure_mode,
    );

    let (source, restart_only) = (config.source.clone(), RestartOnly::of(&config));
    let active: ActiveConfig = Arc::new(ArcSwap::from_pointee(Active::new(config)));
    let reloader = Reloader::new(source, restart_only, Arc::clone(&active));
    server.add_service(GenBackgroundService::new(
        "sluice reload".to_string(),
        Arc::new(reloader),
    ));
    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(active, Arc::clone(&limiter)),
        "sluice proxy",
    );
    for addr in &listen {
        proxy.add_tcp(&addr.to_string());
    }
    server.add_service(proxy).add_dependency(&bootstrap);

    for (name, checker) in checkers {
        match checker {
            HealthChecker::RoundRobin(lb) => {
                server.add_service(GenBackgroundService::new(name, lb))
            }
            HealthChecker::Consistent(lb) => {
                server.add_service(GenBackgroundService::new(name, lb))
            }
        };
    }

    if let Some(addr) = admin_listen {
        let mut admin = Service::new(
            "sluice admin".to_string(),
            HttpServer::new_app(AdminApp::new(limiter, failure_mode)),
        );
        admin.add_tcp(&addr.to_string());
        server.add_service(admin).add_dependency(&bootstrap);
    }
    server.run_forever()
}
