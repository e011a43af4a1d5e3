//! Upstream pools on `pingora-load-balancing`, one per route of a configuration (one per named
//! upstream, shared by every route that names it: one rotation, one retry budget): a server chosen
//! round robin or by consistent hashing (ketama) of a key part, among those the
//! configuration's health record (`health.rs`: each server once, whatever the route) does not
//! find unhealthy, and not ejected by passive health while no more than the route's share of
//! its servers are (more: it balances over all of them, a panic threshold). A pool is built
//! with the configuration it serves; the record's checks run once before that configuration
//! goes live, then in the background until it is retired.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use pingora::lb::selection::{BackendIter, BackendSelection, Consistent, RoundRobin};
use pingora::lb::{Backend, LoadBalancer};

use crate::config::{Problem, Sources};
use crate::route::table::RouteTable;
use crate::route::upstream::{Balance, UpstreamSettings};
use crate::upstream::budget::RetryBudget;
use crate::upstream::health::{HealthChecks, HealthRecord, HealthState, RecordSetup, ServerHealth};
use crate::upstream::servers::Servers;
use crate::upstream::tls::PeerTls;

/// One route's servers, chosen by its balance.
#[derive(Clone)]
enum Balancer {
    RoundRobin(Arc<LoadBalancer<RoundRobin>>),
    Consistent(Arc<LoadBalancer<Consistent>>),
    /// One server (a Kubernetes Service, a local backend): every balance chooses it, so no
    /// balancer is asked (one saves hashing the server on every pick).
    Single(SocketAddr),
}

/// One route's upstream: its servers, what an HTTPS connection to them needs, and each
/// server's health in the configuration's record.
#[derive(Clone)]
pub struct Pool {
    balancer: Balancer,
    tls: Option<PeerTls>,
    /// The route's servers, in its order, as the record has them.
    health: Arc<[Arc<ServerHealth>]>,
    /// How many ejected servers it may skip at once (0: passive health is off for the route,
    /// or it has one server).
    max_ejected: usize,
    /// Its requests and retries in flight, and how many retries those allow.
    budget: Arc<RetryBudget>,
}

fn balancer<S>(settings: &UpstreamSettings) -> std::io::Result<Arc<LoadBalancer<S>>>
where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    let lb = LoadBalancer::<S>::try_from_iter(settings.servers.iter().copied())?;
    Ok(Arc::new(lb))
}

impl Pool {
    /// `settings.servers` must not be empty, and `record` must list them; the config compiler
    /// and [`Pools::build`] guarantee both. `Err` says what is wrong (a bad CA or client
    /// certificate file, a server list Pingora refuses).
    pub fn new(
        settings: &UpstreamSettings,
        read: &mut Sources,
        record: &HealthRecord,
    ) -> Result<Pool, String> {
        let built = |e: std::io::Error| format!("cannot build the pool: {e}");
        let balancer = match (&settings.balance, &settings.servers[..]) {
            (_, &[server]) => Balancer::Single(server),
            (Balance::RoundRobin, _) => Balancer::RoundRobin(balancer(settings).map_err(built)?),
            (Balance::Consistent(_), _) => Balancer::Consistent(balancer(settings).map_err(built)?),
        };
        let tls = match &settings.tls {
            Some(tls) => Some(PeerTls::load(tls, read)?),
            None => None,
        };
        let health = settings.servers.iter().map(|server| {
            let listed = record.of(*server).map(Arc::clone);
            listed.ok_or_else(|| format!("{server} is missing from the health record"))
        });
        let passive = settings.passive_health;
        Ok(Pool {
            balancer,
            tls,
            health: health.collect::<Result<_, _>>()?,
            max_ejected: passive.map_or(0, |rule| rule.max_ejected(settings.servers.len())),
            budget: Arc::new(RetryBudget::new(settings.retry.budget)),
        })
    }

    /// Whether `server` may be dialed: its record does not find it unhealthy, and it is not
    /// ejected when ejected servers are skipped (`skip_ejected`).
    fn routable(&self, server: SocketAddr, skip_ejected: bool) -> bool {
        let health = self.health.iter().find(|health| health.server == server);
        health
            .is_none_or(|health| health.checked().routable() && !(skip_ejected && health.ejected()))
    }

    /// Whether ejected servers are skipped now: some are, no more than the route's share, and
    /// a server neither ejected nor unhealthy is left. Otherwise the route balances over all
    /// its servers its checks allow (the panic threshold).
    fn skips_ejected(&self) -> bool {
        if self.max_ejected == 0 {
            return false;
        }
        let (mut ejected, mut left) = (0, 0);
        for health in self.health.iter() {
            if health.ejected() {
                ejected += 1;
            } else if health.checked().routable() {
                left += 1;
            }
        }
        ejected > 0 && ejected <= self.max_ejected && left > 0
    }

    /// A server of `lb` that may be dialed and is not in `avoid`; `key` drives consistent
    /// hashing.
    fn pick_from<S>(
        &self,
        lb: &LoadBalancer<S>,
        key: &[u8],
        avoid: &[SocketAddr],
    ) -> Option<SocketAddr>
    where
        S: BackendSelection + 'static,
        S::Iter: BackendIter,
    {
        let inet = |b: &Backend| b.addr.as_inet().copied();
        let skip = self.skips_ejected();
        lb.select_with(key, 256, |backend, _| {
            inet(backend).is_some_and(|addr| !avoid.contains(&addr) && self.routable(addr, skip))
        })
        .and_then(|b| inet(&b))
    }

    /// Each server and its state in the configuration's health record, in the route's order.
    pub fn health(&self) -> Vec<(SocketAddr, HealthState)> {
        let servers = self.health.iter();
        servers
            .map(|health| (health.server, health.state()))
            .collect()
    }
}

impl Servers for Pool {
    type Tls = PeerTls;

    /// A server not unhealthy and not in `avoid`; `key` drives consistent hashing.
    fn pick(&self, key: &[u8], avoid: &[SocketAddr]) -> Option<SocketAddr> {
        match &self.balancer {
            Balancer::RoundRobin(lb) => self.pick_from(lb, key, avoid),
            Balancer::Consistent(lb) => self.pick_from(lb, key, avoid),
            Balancer::Single(server) => Some(*server)
                .filter(|server| !avoid.contains(server) && self.routable(*server, false)),
        }
    }

    fn tls(&self) -> Option<&PeerTls> {
        self.tls.as_ref()
    }

    /// Passive health learns of `server`'s attempt, once per attempt.
    fn attempt_ended(&self, server: SocketAddr, failed: bool) {
        if let Some(health) = self.health.iter().find(|health| health.server == server) {
            health.attempt_ended(failed);
        }
    }

    fn states(&self) -> Vec<(SocketAddr, Option<&'static str>)> {
        let health = self.health().into_iter();
        health
            .map(|(server, state)| (server, Some(state.name())))
            .collect()
    }

    fn retry_budget(&self) -> Option<&RetryBudget> {
        Some(&self.budget)
    }
}

/// The pools of one configuration, indexed by route (routes naming one upstream hold clones of
/// its one pool), and the health record they share.
pub struct Pools {
    by_route: Box<[Pool]>,
    health: Arc<HealthRecord>,
}

impl Pools {
    /// One pool per route of `routes`, by route index, over one health record built with
    /// `setup`; `Err` lists what is wrong, by route.
    pub fn build(
        routes: &RouteTable,
        read: &mut Sources,
        setup: &RecordSetup<'_>,
    ) -> Result<Pools, Vec<Problem>> {
        let health = Arc::new(HealthRecord::build(routes, setup));
        let mut problems = Vec::new();
        let mut by_route = Vec::new();
        // A named upstream's one pool, built for the first route that names it.
        let mut named: HashMap<&str, Pool> = HashMap::new();
        let mut unbuilt: HashSet<&str> = HashSet::new();
        for route in routes.in_file_order() {
            let name = route.upstream.name.as_deref();
            if let Some(pool) = name.and_then(|name| named.get(name)) {
                by_route.push(pool.clone());
                continue;
            }
            if name.is_some_and(|name| unbuilt.contains(name)) {
                continue;
            }
            match Pool::new(&route.upstream, read, &health) {
                Ok(pool) => {
                    if let Some(name) = name {
                        named.insert(name, pool.clone());
                    }
                    by_route.push(pool);
                }
                Err(reason) => {
                    let at = match name {
                        Some(name) => format!("upstreams.{name}"),
                        None => format!("routes[{}].upstream", route.index),
                    };
                    problems.push(Problem::new(at, reason));
                    if let Some(name) = name {
                        // Said once, whatever the routes naming it.
                        unbuilt.insert(name);
                    }
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Pools {
            by_route: by_route.into(),
            health,
        })
    }

    /// Every route's pool, in route order.
    pub fn iter(&self) -> impl Iterator<Item = &Pool> {
        self.by_route.iter()
    }

    /// The configuration's record of server health.
    pub fn health(&self) -> &Arc<HealthRecord> {
        &self.health
    }

    /// Checks every checked server once, all at once: what a configuration knows of its
    /// servers before it goes live.
    pub async fn check_once(&self) {
        self.health.check_once().await;
    }

    /// Starts the background checks, in the current runtime, until the handle is dropped.
    pub fn start_checks(&self) -> HealthChecks {
        self.health.start_checks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// The pool of `settings`, over a record of its servers alone (none checked).
    fn pool(settings: &UpstreamSettings) -> (Pool, HealthRecord) {
        pool_on(
            settings,
            Arc::new(crate::limiter::clock::ManualClock::default()),
        )
    }

    impl Pool {
        fn health_of(&self, server: SocketAddr) -> &ServerHealth {
            let found = self.health.iter().find(|h| h.server == server);
            found.expect("a server of the pool")
        }
    }

    /// [`pool`], its ejections timed on `clock`.
    fn pool_on(
        settings: &UpstreamSettings,
        clock: Arc<dyn crate::limiter::clock::Clock>,
    ) -> (Pool, HealthRecord) {
        let servers: Vec<String> = settings.servers.iter().map(ToString::to_string).collect();
        let passive = match settings.passive_health {
            Some(_) => "",
            None => ", passive_health: { enabled: false }",
        };
        let yaml = format!(
            "listen: [127.0.0.1:1]\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, upstream: {{ servers: [{}]{passive} }} }}\n",
            servers.join(", ")
        );
        let config = crate::config::Config::from_yaml(std::path::Path::new("pool.yaml"), &yaml)
            .expect("it compiles");
        let record = HealthRecord::build(&config.routes, &RecordSetup::unregistered(clock));
        let pool = Pool::new(settings, &mut Sources::default(), &record).expect("a pool");
        (pool, record)
    }

    #[test]
    fn round_robin_visits_every_server_and_avoids_failed_ones() {
        let (pool, record) = pool(&UpstreamSettings::round_robin(vec![addr(1), addr(2)]));
        let mut picks: Vec<_> = (0..4).map(|_| pool.pick(b"", &[]).unwrap()).collect();
        picks.sort();
        assert_eq!(picks, vec![addr(1), addr(1), addr(2), addr(2)]);
        assert!((0..4).all(|_| pool.pick(b"", &[addr(1)]) == Some(addr(2))));
        assert_eq!(pool.pick(b"", &[addr(1), addr(2)]), None);
        record.of(addr(2)).expect("listed").set(false);
        assert!(
            (0..4).all(|_| pool.pick(b"", &[]) == Some(addr(1))),
            "a server the record finds unhealthy is not picked"
        );
    }

    /// Fails `server`'s attempts in a row until passive health ejects it.
    fn eject(pool: &Pool, server: SocketAddr) {
        let ejected: Vec<bool> = (0..5)
            .map(|_| pool.health_of(server).attempt_ended(true))
            .collect();
        assert_eq!(ejected, [false, false, false, false, true], "on the fifth");
    }

    #[test]
    fn ejected_servers_are_skipped_within_the_share_then_all_are_balanced_over() {
        let servers = [addr(1), addr(2), addr(3), addr(4)];
        let (pool, record) = pool(&UpstreamSettings::round_robin(servers.to_vec()));
        assert_eq!(pool.max_ejected, 2, "half of four");
        eject(&pool, addr(1));
        let picks: Vec<_> = (0..30).filter_map(|_| pool.pick(b"", &[])).collect();
        assert!(!picks.contains(&addr(1)), "an ejected server is skipped");
        assert_eq!(
            record.of(addr(1)).map(|h| h.state()),
            Some(HealthState::Ejected)
        );
        eject(&pool, addr(2));
        let picks: Vec<_> = (0..30).filter_map(|_| pool.pick(b"", &[])).collect();
        assert!(
            picks.iter().all(|p| [addr(3), addr(4)].contains(p)),
            "two of four skipped"
        );
        eject(&pool, addr(3));
        let picks: Vec<_> = (0..40).filter_map(|_| pool.pick(b"", &[])).collect();
        assert!(
            servers.iter().all(|s| picks.contains(s)),
            "three of four out: balanced over all (the panic threshold)"
        );
    }

    #[test]
    fn an_ejected_server_returns_after_its_time_and_a_success_keeps_it_in() {
        let clock = Arc::new(crate::limiter::clock::ManualClock::new(1_000_000_000));
        let settings = UpstreamSettings::round_robin(vec![addr(1), addr(2)]);
        let (pool, _record) = pool_on(&settings, clock.clone());
        eject(&pool, addr(1));
        assert!((0..4).all(|_| pool.pick(b"", &[]) == Some(addr(2))));
        clock.advance(30_000_000);
        let picks: Vec<_> = (0..4).filter_map(|_| pool.pick(b"", &[])).collect();
        assert!(picks.contains(&addr(1)), "back after 30 s");
        pool.attempt_ended(addr(1), false);
        for _ in 0..4 {
            pool.attempt_ended(addr(1), true);
            pool.attempt_ended(addr(1), false);
        }
        assert!(
            !pool.health_of(addr(1)).ejected(),
            "a success between failures keeps it in"
        );
        let mut off = settings.clone();
        off.passive_health = None;
        let (off, _record) = pool_on(&off, clock);
        for _ in 0..10 {
            off.attempt_ended(addr(1), true);
        }
        assert!(!off.health_of(addr(1)).ejected(), "off: never ejected");
    }

    #[test]
    fn consistent_hashing_sticks_to_a_server() {
        let mut settings = UpstreamSettings::round_robin(vec![addr(1), addr(2), addr(3)]);
        settings.balance = Balance::Consistent(vec![crate::route::keys::KeyPart::ClientIp]);
        let (pool, _record) = pool(&settings);
        for key in [&b"alice"[..], b"bob", b"carol"] {
            let first = pool.pick(key, &[]);
            assert!((0..10).all(|_| pool.pick(key, &[]) == first));
        }
    }
}
