//! Wiring: a Pingora server with the configuration service, the proxy service and the admin
//! service, built from a validated [`Config`].

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use pingora::apps::http_app::HttpServer;
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{RunArgs, Server};
use pingora::services::background::GenBackgroundService;
use pingora::services::listening::Service;
use pingora::services::ServiceHandle;
use pingora::services::ServiceWithDependents;

use crate::config::listeners::Listener;
use crate::config::{Config, ConfigError, ServerSettings, Sources};
use crate::edge::admin::AdminApp;
use crate::edge::drain::{Drain, Relay, Signals, StoppedBy};
use crate::edge::listening::{BoundFirst, ReadyReport};
use crate::edge::proxy::front::FrontDoor;
use crate::edge::proxy::head_count::Counted;
use crate::edge::proxy::preface::Greeting;
use crate::edge::proxy::Gateway;
use crate::edge::rls::RlsService;
use crate::edge::tls::TlsListeners;
use crate::exchange::site::{Handover, Lasting};
use crate::limiter::clock::{Clock, SystemClock};
use crate::limiter::local::{LocalLimiter, DEFAULT_MAX_KEYS};
use crate::limiter::{Engine, Policy};
use crate::observe::metrics;
use crate::observe::traces::{TracerSlot, TracingService};
use crate::runtime::background::Background;
use crate::runtime::reload::{ConfigService, ListenerCertificates, RestartOnly};
use crate::runtime::snapshot::{InForce, Snapshot};
use pingora::apps::HttpServerOptions;

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
        // SIGTERM is sluice's (`drain.rs`): these two only shape the end of a graceful upgrade,
        // where Pingora stops the old instance's listeners, then sleeps its grace period (the
        // time requests in flight get: the shutdown timeout, as on SIGTERM), then shuts its
        // runtimes down, waiting its timeout only for threads that do not yield.
        grace_period_seconds: Some(settings.graceful_shutdown_timeout_seconds()),
        graceful_shutdown_timeout_seconds: Some(1),
        upstream_keepalive_pool_size: settings
            .upstream_keepalive_pool_size
            .unwrap_or(defaults.upstream_keepalive_pool_size),
        ..defaults
    }
}

/// What start needs beyond a valid file, checked by `sluice -t` too: certificates whose keys
/// match (with warnings for those that expire soon) and the files of HTTPS upstreams.
pub fn preflight(config: &Config, read: &mut Sources) -> Result<Vec<String>, ConfigError> {
    pingora::tls::install_default_crypto_provider();
    let mut problems = config.server.check_environment();
    let warnings = match crate::edge::tls::check(config, read) {
        Ok(warnings) => warnings,
        Err(mut error) => {
            problems.append(&mut error.problems);
            Vec::new()
        }
    };
    let clock = std::sync::Arc::new(crate::limiter::clock::SystemClock);
    let setup = crate::upstream::health::RecordSetup::unregistered(clock);
    if let Err(mut found) = crate::upstream::pool::Pools::build(&config.routes, read, &setup) {
        problems.append(&mut found);
    }
    if let Some(access_log) = &config.access_log {
        if let Err(e) = crate::observe::access_log::check(&access_log.target) {
            problems.push(crate::config::Problem::new(
                "access_log.path",
                crate::observe::access_log::cannot_open(e),
            ));
        }
    }
    if problems.is_empty() {
        Ok(warnings)
    } else {
        Err(ConfigError {
            file: config.source.clone(),
            problems,
        })
    }
}

/// The policy the configuration asks for: Redis (with the in-process fallback for
/// `failure_mode: local`) or in-process only. Nothing connects yet.
pub fn build_policy(config: &Config, clock: Arc<dyn Clock>) -> Result<Policy, String> {
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
                metrics::coalescing(redis.max_batch),
            )
            .map_err(|e| format!("redis client for {}: {e}", redis.topology.describe()))?;
            (engine, Some(local()))
        }
        None => (Engine::local(local()), None),
    };
    let meters = metrics::policy_meters(engine.name());
    Ok(Policy::new(engine, fallback, clock, meters))
}

/// What the services are wired from, taken from the configuration before it moves into the
/// first snapshot.
struct Wiring {
    listen: Vec<Listener>,
    admin_listen: Option<std::net::SocketAddr>,
    head_timeout: std::time::Duration,
    keepalive_timeout: std::time::Duration,
    source: std::path::PathBuf,
    restart_only: RestartOnly,
    tracing: Option<crate::config::observe::TracingSettings>,
    rls_listen: Option<std::net::SocketAddr>,
    grace_period_seconds: u64,
    shutdown_timeout_seconds: u64,
}

impl Wiring {
    fn of(config: &Config) -> Wiring {
        Wiring {
            listen: config.listen.clone(),
            admin_listen: config.admin_listen,
            head_timeout: config.server.request_head_timeout(),
            keepalive_timeout: config.server.keepalive_timeout(),
            // Read again at each reload, after daemonizing moved to `/`: absolute.
            source: crate::config::paths::absolute(&config.source),
            restart_only: RestartOnly::of(config),
            tracing: config.tracing.clone(),
            rls_listen: config.rls.as_ref().map(|rls| rls.listen),
            grace_period_seconds: config.server.grace_period_seconds(),
            shutdown_timeout_seconds: config.server.graceful_shutdown_timeout_seconds(),
        }
    }
}

impl Wiring {
    /// The graceful shutdown the `server:` section asks for.
    fn drain(&self) -> Arc<Drain> {
        Drain::new(
            Duration::from_secs(self.grace_period_seconds),
            Duration::from_secs(self.shutdown_timeout_seconds),
        )
    }
}

/// The rate limit service, started after `configuration`: it stops accepting with the proxies,
/// and the drain waits for the calls it serves.
fn add_rls(
    server: &mut Server,
    service: RlsService,
    drain: &Arc<Drain>,
    configuration: &ServiceHandle,
) -> ServiceHandle {
    let serving = Arc::clone(drain);
    let service = StoppedBy::new(service, drain.closing(), move || Some(serving.in_flight()));
    add_background(
        server,
        "sluice rate limit service",
        service,
        &[configuration],
    )
}

/// What every proxy service shares: the live configuration, the limiter, the TLS listeners'
/// certificates and the tracer; and the background work the first of them starts.
struct Shared {
    live: InForce,
    policy: Arc<Policy>,
    background: Arc<Background>,
    tls: Arc<TlsListeners>,
    tracing: Option<TracerSlot>,
    /// The graceful shutdown the services stop by.
    drain: Arc<Drain>,
}

/// The Pingora server `options` and the `server:` section ask for.
fn new_server(config: &Config, options: &RunOptions) -> Server {
    let opt = Opt {
        upgrade: options.upgrade,
        daemon: options.daemon,
        ..Opt::default()
    };
    Server::new_with_opt_and_conf(opt, server_conf(&config.server, options.daemon))
}

/// Starts serving and never returns; `read` is what loading `config` read (what `watch`
/// follows, with what starting reads).
pub fn run(
    config: Config,
    mut read: Sources,
    options: RunOptions,
) -> Result<std::convert::Infallible, String> {
    metrics::init();
    // One rustls provider for the process: listeners, HTTPS upstreams and `rediss://` use it.
    pingora::tls::install_default_crypto_provider();
    let mut server = new_server(&config, &options);
    // Bootstrap (taking the listeners over with -u) runs as a service after daemonizing; the
    // listeners wait for it, so a new instance waits for the sockets until SIGQUIT to the old.
    let bootstrap = server.bootstrap_as_a_service();
    // One clock for the process, the limiter's and every request's; the live views beside it.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let policy = Arc::new(build_policy(&config, Arc::clone(&clock))?);
    let lasting = Lasting::new(clock);
    log_start(&config);
    let wiring = Wiring::of(&config);
    let tls = Arc::new(TlsListeners::load(&config, &mut read).map_err(|e| e.to_string())?);
    let live = live_at_start(config, &lasting, &mut read)?;
    let drain = wiring.drain();
    let reloads = config_service(&wiring, &live, &policy, &tls, lasting, read);
    let configuration = add_configuration(&mut server, reloads, &drain);
    let rls = wiring.rls_listen.map(|listen| {
        let service = RlsService::new(
            listen,
            Arc::clone(&live),
            Arc::clone(&policy),
            options.upgrade,
        );
        add_rls(&mut server, service, &drain, &configuration)
    });
    let tracing = wiring
        .tracing
        .clone()
        .map(|s| add_tracing(&mut server, s, &drain));
    let shared = Shared {
        background: Arc::new(Background::new(Arc::clone(&policy), Arc::clone(&live))),
        live,
        policy: Arc::clone(&policy),
        tls,
        tracing: tracing.as_ref().map(|(slot, _)| Arc::clone(slot)),
        drain: Arc::clone(&drain),
    };
    let mut before = vec![&bootstrap, &configuration];
    before.extend(tracing.as_ref().map(|(_, service)| service));
    let mut serving = add_proxies(&mut server, &wiring, &shared, &before);
    serving.extend(rls);
    if let Some(addr) = wiring.admin_listen {
        let admin = admin_service(addr, policy, Arc::clone(&shared.live), Arc::clone(&drain));
        serving.push(add_bound(&mut server, admin, &[&bootstrap]));
    }
    add_ready_report(&mut server, &configuration, &serving, options.upgrade);
    let signals = Box::new(Signals(drain));
    server.run(RunArgs {
        shutdown_signal: signals,
    });
    std::process::exit(0)
}

/// The first configuration in force: `config`'s snapshot (built, not started yet), whose
/// requests read `lasting`'s clock and count into its live views.
fn live_at_start(config: Config, lasting: &Lasting, read: &mut Sources) -> Result<InForce, String> {
    let snapshot = Snapshot::build(config, lasting, Handover::default(), read);
    let snapshot = snapshot.map_err(|e| e.to_string())?;
    Ok(Arc::new(ArcSwap::from_pointee(snapshot)))
}

/// What a start (and a graceful upgrade) puts in force: the summary, and the key prefix every
/// count in Redis is kept under (a reload keeps it: `runtime/reload.rs`).
fn log_start(config: &Config) {
    log::info!("{}", config.summary());
    if let Some(redis) = &config.redis {
        log::info!(
            "redis: key prefix {}: every counter, credit id and quota override is kept under it",
            redis.key_prefix
        );
    }
}

/// The configuration service: it reloads on SIGHUP and when a file `read` noted changes (with
/// `watch`), through the same clock, live views and listeners as the start.
fn config_service(
    wiring: &Wiring,
    live: &InForce,
    policy: &Arc<Policy>,
    tls: &Arc<TlsListeners>,
    lasting: Lasting,
    read: Sources,
) -> ConfigService {
    ConfigService::new(
        wiring.source.clone(),
        wiring.restart_only.clone(),
        Arc::clone(live),
        Arc::clone(policy),
        Arc::clone(tls) as Arc<dyn ListenerCertificates>,
        lasting,
        read,
    )
}

/// The configuration service (the proxy serves only once it has probed the upstreams), and
/// the relay that tells the services a drain began.
fn add_configuration(
    server: &mut Server,
    reloads: ConfigService,
    drain: &Arc<Drain>,
) -> ServiceHandle {
    let relay = Relay(Arc::clone(drain));
    add_background(server, "sluice shutdown relay", relay, &[]);
    let reloads = StoppedBy::new(reloads, drain.finishing(), || None);
    add_background(server, "sluice configuration", reloads, &[])
}

/// `sluice -d` returns once this reports: listeners bound and configuration live (or, when
/// taking over from an old instance, once it waits for the sockets).
fn add_ready_report(
    server: &mut Server,
    configuration: &ServiceHandle,
    serving: &[ServiceHandle],
    upgrade: bool,
) {
    let report = server.add_service(ReadyReport::service());
    report.add_dependency(configuration);
    if !upgrade {
        serving
            .iter()
            .for_each(|service| report.add_dependency(service));
    }
}

/// The admin listener (`/metrics`, `/healthz`, `/readyz`) on `addr`.
fn admin_service(
    addr: std::net::SocketAddr,
    policy: Arc<Policy>,
    live: InForce,
    drain: Arc<Drain>,
) -> BoundFirst<Service<Counted<HttpServer<AdminApp>>>> {
    let finishing = drain.finishing();
    // Its heads are counted as the proxy's are, so it answers a target or a head too large.
    let mut admin = Service::new(
        "sluice admin".to_string(),
        Counted::new(HttpServer::new_app(AdminApp::new(policy, live, drain))),
    );
    admin.add_tcp(&addr.to_string());
    // It answers `/readyz` (503) through the whole drain, so it stops last.
    BoundFirst::new(admin, vec![addr.to_string()]).stopped_by(finishing)
}

/// Spans, when asked for: the pipeline starts with the services (after daemonizing); the slot
/// holds its tracer once it runs.
fn add_tracing(
    server: &mut Server,
    settings: crate::config::observe::TracingSettings,
    drain: &Arc<Drain>,
) -> (TracerSlot, ServiceHandle) {
    let slot = TracerSlot::default();
    let service = TracingService::new(settings, Arc::clone(&slot));
    // It sends the spans of the last requests when everything else has stopped.
    let flushing = Arc::clone(drain);
    let service = StoppedBy::new(service, drain.finishing(), move || {
        Some(flushing.finishing_last())
    });
    let handle = add_background(server, "sluice tracing", service, &[]);
    (slot, handle)
}

/// Adds the background service `service` named `name`, started after `before`.
fn add_background<S>(
    server: &mut Server,
    name: &str,
    service: S,
    before: &[&ServiceHandle],
) -> ServiceHandle
where
    S: pingora::services::background::BackgroundService + Send + Sync + 'static,
{
    let handle = server.add_service(GenBackgroundService::new(
        name.to_string(),
        Arc::new(service),
    ));
    for dependency in before {
        handle.add_dependency(*dependency);
    }
    handle
}

/// Adds `service` once it has bound `addresses` itself (`BoundFirst`), started after `before`.
fn add_bound<S>(
    server: &mut Server,
    service: BoundFirst<S>,
    before: &[&ServiceHandle],
) -> ServiceHandle
where
    BoundFirst<S>: ServiceWithDependents + 'static,
{
    let handle = server.add_service(service);
    for dependency in before {
        handle.add_dependency(*dependency);
    }
    handle
}

/// The proxy services: plain and TLS listeners in one; cleartext HTTP/2 listeners (h2c) in
/// another, since prior-knowledge HTTP/2 is a setting of the whole service.
fn add_proxies(
    server: &mut Server,
    wiring: &Wiring,
    shared: &Shared,
    before: &[&ServiceHandle],
) -> Vec<ServiceHandle> {
    let (h2c, others): (Vec<&Listener>, Vec<&Listener>) = wiring.listen.iter().partition(|l| l.h2c);
    [
        ("sluice proxy", others, false),
        ("sluice proxy h2c", h2c, true),
    ]
    .into_iter()
    .filter(|(_, listeners, _)| !listeners.is_empty())
    .enumerate()
    .map(|(nth, (name, listeners, cleartext_h2))| {
        let mut service = proxy_service(server, wiring, shared, name, &listeners, cleartext_h2);
        if nth == 0 {
            // The background work starts once, in the runtime of the first proxy service.
            let background = Arc::clone(&shared.background);
            service = service.on_start(move || background.start());
        }
        add_bound(server, service.stopped_by(shared.drain.closing()), before)
    })
    .collect()
}

/// One proxy service on `listeners`, behind the front door's deadlines. The first one's start
/// starts the background work (`runtime::background`) in its runtime: it connects to Redis
/// then rather than at the first request and keeps the connections usable while idle
/// (`Policy::keep_connections`); the quota overrides in force are read from then on
/// (`runtime::overrides`), what Redis persists is read once it answers
/// (`runtime::durability`), and the dashboard's live decisions sampled (`runtime::sampler`).
fn proxy_service(
    server: &Server,
    wiring: &Wiring,
    shared: &Shared,
    name: &str,
    listeners: &[&Listener],
    cleartext_h2: bool,
) -> BoundFirst<Service<Greeting<FrontDoor<pingora::proxy::HttpProxy<Gateway>>>>> {
    let gateway = Gateway::new(
        Arc::clone(&shared.live),
        Arc::clone(&shared.policy),
        shared.tracing.clone(),
        Arc::clone(&shared.drain),
    );
    let mut app = pingora::proxy::http_proxy(&server.configuration, gateway);
    let mut options = HttpServerOptions::default();
    options.h2c = cleartext_h2;
    // An HTTP/2 connection with no stream open closes after the keep-alive timeout, as an
    // idle HTTP/1.1 connection does (FrontDoor).
    options.h2_idle_timeout = Some(wiring.keepalive_timeout);
    app.server_options = Some(options);
    let (head, keepalive) = (wiring.head_timeout, wiring.keepalive_timeout);
    let front = FrontDoor::new(app, head, keepalive);
    let drain = Arc::clone(&shared.drain);
    let greeting = Greeting::new(front, head, keepalive, cleartext_h2, drain);
    let mut service = Service::new(name.to_string(), greeting);
    let mut addresses = Vec::new();
    for listener in listeners {
        let address = listener.addr.to_string();
        match shared.tls.settings(listener) {
            Some(settings) => service.add_tls_with_settings(&address, None, settings),
            None => service.add_tcp(&address),
        }
        addresses.push(address);
    }
    BoundFirst::new(service, addresses)
}
