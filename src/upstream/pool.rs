//! Upstream pools on `pingora-load-balancing`, one per route of a configuration: a server chosen
//! round robin or by consistent hashing (ketama) of a key part, among those the
//! configuration's health record (`health.rs`: each server once, whatever the route) does not
//! find unhealthy. A pool is built with the configuration it serves; the record's checks run
//! once before that configuration goes live, then in the background until it is retired.

use std::net::SocketAddr;
use std::sync::Arc;

use pingora::lb::selection::{BackendIter, BackendSelection, Consistent, RoundRobin};
use pingora::lb::{Backend, LoadBalancer};
use prometheus::IntGauge;

use crate::config::{Problem, Sources};
use crate::route::table::RouteTable;
use crate::route::upstream::{Balance, UpstreamSettings};
use crate::upstream::health::{HealthChecks, HealthRecord, HealthState, ServerHealth};
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
        Ok(Pool {
            balancer,
            tls,
            health: health.collect::<Result<_, _>>()?,
        })
    }

    /// Whether `server` may be dialed: its record does not find it unhealthy.
    fn routable(&self, server: SocketAddr) -> bool {
        let health = self.health.iter().find(|health| health.server == server);
        health.is_none_or(|health| health.state().routable())
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
        lb.select_with(key, 256, |backend, _| {
            inet(backend).is_some_and(|addr| !avoid.contains(&addr) && self.routable(addr))
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
            Balancer::Single(server) => {
                Some(*server).filter(|server| !avoid.contains(server) && self.routable(*server))
            }
        }
    }

    fn tls(&self) -> Option<&PeerTls> {
        self.tls.as_ref()
    }
}

/// The pools of one configuration, indexed by route, and the health record they share.
pub struct Pools {
    by_route: Box<[Pool]>,
    health: Arc<HealthRecord>,
}

impl Pools {
    /// One pool per route of `routes`, by route index, over one health record whose gauges
    /// `gauge(route, server)` gives; `Err` lists what is wrong, by route.
    pub fn build(
        routes: &RouteTable,
        read: &mut Sources,
        gauge: impl Fn(&str, SocketAddr) -> IntGauge,
    ) -> Result<Pools, Vec<Problem>> {
        let health = Arc::new(HealthRecord::build(routes, gauge));
        let mut problems = Vec::new();
        let mut by_route = Vec::new();
        for route in routes.in_file_order() {
            match Pool::new(&route.upstream, read, &health) {
                Ok(pool) => by_route.push(pool),
                Err(reason) => problems.push(Problem::new(
                    format!("routes[{}].upstream", route.index),
                    reason,
                )),
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
        let servers: Vec<String> = settings.servers.iter().map(ToString::to_string).collect();
        let yaml = format!(
            "listen: [127.0.0.1:1]\nroutes:\n  - {{ name: r, match: {{ path_prefix: / }}, upstream: {{ servers: [{}] }} }}\n",
            servers.join(", ")
        );
        let config = crate::config::Config::from_yaml(std::path::Path::new("pool.yaml"), &yaml)
            .expect("it compiles");
        let record =
            HealthRecord::build(&config.routes, crate::upstream::health::unregistered_gauge);
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
