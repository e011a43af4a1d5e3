//! One record of upstream server health per configuration: each server once, whatever the
//! routes that list it, in one of four states — not checked (no route listing it asks for a
//! check), healthy, unhealthy, ejected (its answers failed too often in a row: passive health,
//! `outlier.rs`). Every route's pool consults it when it picks a server, and the
//! dashboard and `sluice_upstream_healthy{route,server}` show it, so what routing does and what
//! the operator sees agree, and a server has one state on every route.
//!
//! Active TCP checks write it: one per server, checked when any route listing it asks for
//! checks, every shortest interval asked, each connection given the longest connect timeout of
//! those routes. [`ServerHealth::set`] is where their state comes in. The answers of requests
//! write its passive state (`outlier.rs`), under the strictest rule of the routes that ask for
//! one (fewest failures in a row, shortest ejection times); that state outlives the record: a
//! reload hands it to the next configuration's record for the servers it keeps.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::watch;

use crate::limiter::clock::Clock;
use crate::route::table::RouteTable;
use crate::route::upstream::PassiveHealth;
use crate::upstream::outlier::{EjectionMeters, Outlier};

/// What is known of a server's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// No route listing it asks for checks: nothing is known, every request may dial it.
    NotChecked,
    /// It passed its last check.
    Healthy,
    /// It failed its last check: no route dials it until it passes one.
    Unhealthy,
    /// Its answers failed too often in a row (passive health): routes skip it until its
    /// ejection time has passed, unless too many of their servers are out.
    Ejected,
}

impl HealthState {
    /// Its name, a CSS class and `data-state` on the dashboard.
    pub fn name(self) -> &'static str {
        match self {
            HealthState::NotChecked => "not-checked",
            HealthState::Healthy => "healthy",
            HealthState::Unhealthy => "unhealthy",
            HealthState::Ejected => "ejected",
        }
    }

    /// In words.
    pub fn words(self) -> &'static str {
        match self {
            HealthState::NotChecked => "not checked",
            HealthState::Healthy => "healthy",
            HealthState::Unhealthy => "unhealthy",
            HealthState::Ejected => "ejected",
        }
    }

    /// Whether a request may dial a server in this state of its checks (an ejected server's
    /// turn is its route's pool's to decide).
    pub fn routable(self) -> bool {
        self != HealthState::Unhealthy
    }

    fn from_u8(value: u8) -> HealthState {
        match value {
            1 => HealthState::Healthy,
            2 => HealthState::Unhealthy,
            _ => HealthState::NotChecked,
        }
    }
}

/// How a server is checked: how often, and how long a connection may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Check {
    interval: Duration,
    connect_timeout: Duration,
}

/// One server's health, shared by every pool that lists it.
pub struct ServerHealth {
    pub server: SocketAddr,
    check: Option<Check>,
    /// A [`HealthState`], as its `u8`.
    state: AtomicU8,
    /// The routes that list it, in file order.
    routes: Box<[Arc<str>]>,
    /// `sluice_upstream_healthy` of each of those routes and this server.
    gauges: Box<[IntGauge]>,
    /// What its answers tell of it, kept across reloads.
    pub(crate) outlier: Arc<Outlier>,
    /// When its answers eject it: the strictest rule of the routes that ask; `None`: no route
    /// listing it does.
    passive: Option<PassiveHealth>,
}

impl ServerHealth {
    /// Its state, ejected included: what the operator sees.
    pub fn state(&self) -> HealthState {
        match self.checked() {
            HealthState::Unhealthy => HealthState::Unhealthy,
            _ if self.outlier.ejected() => HealthState::Ejected,
            state => state,
        }
    }

    /// Its state as its active checks found it.
    pub fn checked(&self) -> HealthState {
        HealthState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Whether it is ejected now (passive health).
    pub fn ejected(&self) -> bool {
        self.outlier.ejected()
    }

    /// An attempt on it ended: `failed` (a `5xx`, a failed connection) or answered. Whether
    /// that ejected it (never when no route listing it asks for passive health).
    pub fn attempt_ended(&self, failed: bool) -> bool {
        match (failed, &self.passive) {
            (false, Some(_)) => {
                self.outlier.succeeded();
                false
            }
            (true, Some(rule)) => self.outlier.failed(rule),
            (_, None) => false,
        }
    }

    /// The routes that list it, in file order.
    pub fn routes(&self) -> &[Arc<str>] {
        &self.routes
    }

    /// Records what was found of the server: passed (`true`) or failed. Every route's pool
    /// and gauge follow at once.
    pub fn set(&self, healthy: bool) {
        let state = match healthy {
            true => HealthState::Healthy,
            false => HealthState::Unhealthy,
        };
        self.state.store(state as u8, Ordering::Release);
        self.publish();
    }

    /// Each route's gauge: 1 while the server may be dialed, 0 while it is unhealthy.
    fn publish(&self) {
        let routable = i64::from(self.checked().routable());
        for gauge in self.gauges.iter() {
            gauge.set(routable);
        }
    }

    /// One check, when the server is checked: a TCP connection within the connect timeout.
    async fn check(&self) {
        let Some(check) = self.check else { return };
        let connected = tokio::net::TcpStream::connect(self.server);
        let passed = matches!(
            tokio::time::timeout(check.connect_timeout, connected).await,
            Ok(Ok(_))
        );
        self.set(passed);
    }

    /// Checks the server every interval until told to stop.
    async fn check_until_stopped(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let Some(check) = self.check else { return };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(check.interval) => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
            self.check().await;
        }
    }
}

/// A gauge registered nowhere, for a record that shows nothing (`sluice -t`, tests).
pub fn unregistered_gauge(_route: &str, _server: SocketAddr) -> IntGauge {
    IntGauge::new("sluice_upstream_healthy", "unregistered").expect("a valid gauge name")
}

/// What a health record is built with besides its routes: the clock ejections are timed on,
/// where each server shows its health, and the record in force (whose passive state the
/// servers it shares with the new one keep).
pub struct RecordSetup<'a> {
    pub clock: Arc<dyn Clock>,
    /// `sluice_upstream_healthy` of a route and a server.
    pub gauge: fn(&str, SocketAddr) -> IntGauge,
    /// A server's ejection counter and gauge.
    pub ejection: fn(SocketAddr) -> EjectionMeters,
    pub previous: Option<&'a HealthRecord>,
}

impl RecordSetup<'_> {
    /// A setup that shows nothing (`sluice -t`, tests), on `clock`.
    pub fn unregistered(clock: Arc<dyn Clock>) -> RecordSetup<'static> {
        RecordSetup {
            clock,
            gauge: unregistered_gauge,
            ejection: EjectionMeters::unregistered,
            previous: None,
        }
    }

    /// `server`'s passive state: the record in force's, or a new one.
    fn outlier(&self, server: SocketAddr) -> Arc<Outlier> {
        let kept = self.previous.and_then(|record| record.of(server));
        match kept {
            Some(health) => Arc::clone(&health.outlier),
            None => Arc::new(Outlier::new(
                server,
                Arc::clone(&self.clock),
                (self.ejection)(server),
            )),
        }
    }
}

/// Every upstream server of one configuration, each once.
pub struct HealthRecord {
    servers: Box<[Arc<ServerHealth>]>,
}

/// Stops the background checks of a record when dropped (or told to).
pub struct HealthChecks {
    stop: watch::Sender<bool>,
}

impl HealthChecks {
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for HealthChecks {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the routes listing one server ask of it, gathered in file order.
struct Listed {
    server: SocketAddr,
    check: Option<Check>,
    passive: Option<PassiveHealth>,
    routes: Vec<Arc<str>>,
}

impl Listed {
    /// Adds a route asking for checks every `interval` (if at all), connecting within
    /// `connect_timeout`: the shortest interval and the longest timeout win.
    fn ask(&mut self, interval: Option<Duration>, connect_timeout: Duration) {
        let Some(interval) = interval else { return };
        self.check = Some(match self.check {
            None => Check {
                interval,
                connect_timeout,
            },
            Some(check) => Check {
                interval: check.interval.min(interval),
                connect_timeout: check.connect_timeout.max(connect_timeout),
            },
        });
    }

    /// Each server of `routes` once, with what the routes listing it ask of it.
    fn all(routes: &RouteTable) -> Vec<Listed> {
        let mut listed: Vec<Listed> = Vec::new();
        for route in routes.in_file_order() {
            let settings = &route.upstream;
            for &server in &settings.servers {
                let at = match listed.iter().position(|l| l.server == server) {
                    Some(at) => at,
                    None => {
                        let new = Listed {
                            server,
                            check: None,
                            passive: None,
                            routes: Vec::new(),
                        };
                        listed.push(new);
                        listed.len() - 1
                    }
                };
                let one = &mut listed[at];
                one.ask(settings.health_check, settings.connect_timeout);
                one.watch(settings.passive_health);
                if !one.routes.contains(&route.name) {
                    one.routes.push(Arc::clone(&route.name));
                }
            }
        }
        listed
    }

    /// Adds a route's passive health rule (if it has one): the strictest wins.
    fn watch(&mut self, rule: Option<PassiveHealth>) {
        let Some(rule) = rule else { return };
        self.passive = Some(match self.passive {
            None => rule,
            Some(kept) => PassiveHealth {
                consecutive_failures: kept.consecutive_failures.min(rule.consecutive_failures),
                base_ejection: kept.base_ejection.min(rule.base_ejection),
                max_ejection: kept.max_ejection.min(rule.max_ejection),
                max_ejected_percent: kept.max_ejected_percent.max(rule.max_ejected_percent),
            },
        });
    }
}

impl HealthRecord {
    /// Each server of `routes` once, with the routes that list it, checked when one of them
    /// asks; `setup.gauge(route, server)` is where each route shows it. A checked server counts
    /// as healthy until its first check ([`HealthRecord::check_once`] runs before the
    /// configuration goes live).
    pub fn build(routes: &RouteTable, setup: &RecordSetup<'_>) -> HealthRecord {
        let servers = Listed::all(routes).into_iter().map(|one| {
            let state = match one.check {
                Some(_) => HealthState::Healthy,
                None => HealthState::NotChecked,
            };
            let gauges = one
                .routes
                .iter()
                .map(|route| (setup.gauge)(route, one.server))
                .collect();
            let health = ServerHealth {
                server: one.server,
                check: one.check,
                state: AtomicU8::new(state as u8),
                routes: one.routes.into(),
                gauges,
                outlier: setup.outlier(one.server),
                passive: one.passive,
            };
            health.publish();
            Arc::new(health)
        });
        HealthRecord {
            servers: servers.collect(),
        }
    }

    /// Every server, in the order the routes first list them.
    pub fn servers(&self) -> &[Arc<ServerHealth>] {
        &self.servers
    }

    /// The health of `server`, if a route lists it.
    pub fn of(&self, server: SocketAddr) -> Option<&Arc<ServerHealth>> {
        self.servers.iter().find(|health| health.server == server)
    }

    /// Checks every checked server once, all at once: what a configuration knows of its
    /// servers before it goes live.
    pub async fn check_once(&self) {
        let mut rounds = tokio::task::JoinSet::new();
        for health in self.servers.iter().filter(|h| h.check.is_some()) {
            let health = Arc::clone(health);
            rounds.spawn(async move { health.check().await });
        }
        while rounds.join_next().await.is_some() {}
    }

    /// Starts the background checks, in the current runtime, until the handle is dropped.
    pub fn start_checks(&self) -> HealthChecks {
        let (stop, watching) = watch::channel(false);
        for health in self.servers.iter().filter(|h| h.check.is_some()) {
            tokio::spawn(Arc::clone(health).check_until_stopped(watching.clone()));
        }
        HealthChecks { stop }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    /// The record of `routes` (YAML route entries), its gauges unregistered.
    fn record(routes: &str) -> HealthRecord {
        let yaml = format!("listen: [127.0.0.1:1]\nroutes:\n{routes}");
        let config = Config::from_yaml(Path::new("health.yaml"), &yaml).expect("it compiles");
        let clock = Arc::new(crate::limiter::clock::ManualClock::default());
        HealthRecord::build(&config.routes, &RecordSetup::unregistered(clock))
    }

    #[tokio::test]
    async fn a_server_has_one_state_whatever_the_routes_that_list_it() {
        let live = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let live = live.local_addr().expect("its address");
        let dead = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            socket.local_addr().expect("its address")
        };
        let unlisted = SocketAddr::from(([127, 0, 0, 1], 1));
        let record = record(&format!(
            "  - {{ name: plain, match: {{ path_prefix: /p }}, upstream: {{ servers: [{unlisted}, {dead}] }} }}\n\
             \x20 - {{ name: checked, match: {{ path_prefix: /c }}, upstream: {{ servers: [{live}, {dead}], health_check_interval_ms: 500 }} }}\n\
             \x20 - {{ name: often, match: {{ path_prefix: /o }}, upstream: {{ servers: [{dead}], health_check_interval_ms: 100, connect_timeout_ms: 1500 }} }}\n"
        ));
        assert_eq!(record.servers().len(), 3, "each server once");
        let of = |server| record.of(server).expect("listed");
        assert_eq!(of(unlisted).state(), HealthState::NotChecked);
        assert_eq!(
            of(dead).check.map(|c| c.interval),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            of(dead).check.map(|c| c.connect_timeout),
            Some(Duration::from_millis(1500)),
            "the longest connect timeout asked"
        );
        let routes: Vec<&str> = of(dead).routes().iter().map(|r| &**r).collect();
        assert_eq!(routes, ["plain", "checked", "often"]);
        record.check_once().await;
        assert_eq!(of(live).state(), HealthState::Healthy);
        assert_eq!(
            of(dead).state(),
            HealthState::Unhealthy,
            "for the route that does not check it too"
        );
        assert_eq!(
            of(unlisted).state(),
            HealthState::NotChecked,
            "never checked"
        );
        assert!(
            of(dead).gauges.iter().all(|g| g.get() == 0),
            "every route's gauge"
        );
        assert!(of(unlisted).gauges.iter().all(|g| g.get() == 1));
    }

    #[test]
    fn a_reload_keeps_the_passive_state_of_the_servers_it_keeps() {
        let (kept, dropped, added): (SocketAddr, SocketAddr, SocketAddr) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
            "127.0.0.1:3".parse().unwrap(),
        );
        let route = |servers: String| {
            let yaml = format!(
                "listen: [127.0.0.1:1]\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, upstream: {{ servers: [{servers}] }} }}\n"
            );
            Config::from_yaml(Path::new("health.yaml"), &yaml).expect("it compiles")
        };
        let clock = Arc::new(crate::limiter::clock::ManualClock::default());
        let setup = RecordSetup::unregistered(clock.clone());
        let first = HealthRecord::build(&route(format!("{kept}, {dropped}")).routes, &setup);
        let of = |record: &HealthRecord, server| Arc::clone(record.of(server).expect("listed"));
        for _ in 0..5 {
            of(&first, kept).attempt_ended(true);
        }
        assert_eq!(of(&first, kept).state(), HealthState::Ejected);
        let setup = RecordSetup {
            previous: Some(&first),
            ..RecordSetup::unregistered(clock)
        };
        let next = HealthRecord::build(&route(format!("{kept}, {added}")).routes, &setup);
        assert_eq!(
            of(&next, kept).state(),
            HealthState::Ejected,
            "kept, still out"
        );
        assert!(Arc::ptr_eq(
            &of(&first, kept).outlier,
            &of(&next, kept).outlier
        ));
        assert_eq!(of(&next, added).state(), HealthState::NotChecked);
        assert!(next.of(dropped).is_none());
    }
}
