//! Upstream pools on `pingora-load-balancing`, one per route of a configuration: a server chosen
//! round robin or by consistent hashing (ketama) of a key part, among those the TCP health
//! checks find alive. A pool is built with the configuration it serves; its checks run once
//! before that configuration goes live, then in the background until it is retired.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::selection::{BackendIter, BackendSelection, Consistent, RoundRobin};
use pingora::lb::{Backend, LoadBalancer};
use prometheus::IntGauge;
use tokio::sync::watch;

use crate::config::{Problem, Sources};
use crate::route::table::RouteTable;
use crate::route::upstream::{Balance, UpstreamSettings};
use crate::upstream::servers::Servers;
use crate::upstream::tls::PeerTls;

/// One route's servers, chosen by its balance.
#[derive(Clone)]
enum Balancer {
    RoundRobin(Arc<LoadBalancer<RoundRobin>>),
    Consistent(Arc<LoadBalancer<Consistent>>),
    /// One server and no health check (a Kubernetes Service, a local backend): every balance
    /// chooses it, so no balancer is asked (one saves hashing the server on every pick).
    Single(SocketAddr),
}

/// Where a pool says which of its servers pass their checks: a gauge per server, 1 or 0.
type HealthGauges = Arc<[(SocketAddr, IntGauge)]>;

/// One route's upstream: its servers, and what an HTTPS connection to them needs.
#[derive(Clone)]
pub struct Pool {
    balancer: Balancer,
    tls: Option<PeerTls>,
    health: HealthGauges,
}

fn balancer<S>(settings: &UpstreamSettings) -> std::io::Result<Arc<LoadBalancer<S>>>
where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    let mut lb = LoadBalancer::<S>::try_from_iter(settings.servers.iter().copied())?;
    if let Some(interval) = settings.health_check {
        let mut check = TcpHealthCheck::new();
        check.peer_template.options.connection_timeout = Some(settings.connect_timeout);
        lb.set_health_check(check);
        lb.health_check_frequency = Some(interval);
        lb.parallel_health_check = true;
    }
    Ok(Arc::new(lb))
}

fn pick<S>(lb: &LoadBalancer<S>, key: &[u8], avoid: &[SocketAddr]) -> Option<SocketAddr>
where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    let inet = |b: &Backend| b.addr.as_inet().copied();
    lb.select_with(key, 256, |backend, healthy| {
        healthy && inet(backend).is_some_and(|addr| !avoid.contains(&addr))
    })
    .and_then(|b| inet(&b))
}

/// Sets each server's gauge from what the last checks found.
fn publish<S>(lb: &LoadBalancer<S>, health: &[(SocketAddr, IntGauge)])
where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    let backends = lb.backends();
    for backend in backends.get_backend().iter() {
        let Some(addr) = backend.addr.as_inet() else {
            continue;
        };
        if let Some((_, gauge)) = health.iter().find(|(server, _)| server == addr) {
            gauge.set(i64::from(backends.ready(backend)));
        }
    }
}

/// Runs `lb`'s health checks every `interval` until told to stop.
async fn check_until_stopped<S>(
    lb: Arc<LoadBalancer<S>>,
    interval: Duration,
    health: HealthGauges,
    mut stop: watch::Receiver<bool>,
) where
    S: BackendSelection + 'static,
    S::Iter: BackendIter,
{
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        lb.backends()
            .run_health_check(lb.parallel_health_check)
            .await;
        publish(&lb, &health);
    }
}

impl Pool {
    /// `settings.servers` must not be empty; the config compiler guarantees it. `Err` says
    /// what is wrong (a bad CA or client certificate file, a server list Pingora refuses).
    pub fn new(settings: &UpstreamSettings, read: &mut Sources) -> Result<Pool, String> {
        let built = |e: std::io::Error| format!("cannot build the pool: {e}");
        let balancer = match (&settings.balance, &settings.servers[..]) {
            (_, &[server]) if settings.health_check.is_none() => Balancer::Single(server),
            (Balance::RoundRobin, _) => Balancer::RoundRobin(balancer(settings).map_err(built)?),
            (Balance::Consistent(_), _) => Balancer::Consistent(balancer(settings).map_err(built)?),
        };
        let tls = match &settings.tls {
            Some(tls) => Some(PeerTls::load(tls, read)?),
            None => None,
        };
        Ok(Pool {
            balancer,
            tls,
            health: Arc::new([]),
        })
    }

    fn interval(&self) -> Option<Duration> {
        match &self.balancer {
            Balancer::RoundRobin(lb) => lb.health_check_frequency,
            Balancer::Consistent(lb) => lb.health_check_frequency,
            Balancer::Single(_) => None,
        }
    }

    /// One round of health checks (all servers at once), when the pool has them.
    async fn check_once(&self) {
        match &self.balancer {
            Balancer::RoundRobin(lb) if lb.health_check_frequency.is_some() => {
                lb.backends().run_health_check(true).await;
                publish(lb, &self.health);
            }
            Balancer::Consistent(lb) if lb.health_check_frequency.is_some() => {
                lb.backends().run_health_check(true).await;
                publish(lb, &self.health);
            }
            _ => {}
        }
    }

    fn spawn_checks(&self, stop: watch::Receiver<bool>) {
        let Some(interval) = self.interval() else {
            return;
        };
        match &self.balancer {
            Balancer::RoundRobin(lb) => {
                let health = Arc::clone(&self.health);
                tokio::spawn(check_until_stopped(Arc::clone(lb), interval, health, stop));
            }
            Balancer::Consistent(lb) => {
                let health = Arc::clone(&self.health);
                tokio::spawn(check_until_stopped(Arc::clone(lb), interval, health, stop));
            }
            Balancer::Single(_) => {}
        }
    }
}

impl Pool {
    /// Each server and whether the health checks last found it healthy (a server without
    /// checks always is), from the pool's own gauges.
    pub fn health(&self) -> Vec<(SocketAddr, bool)> {
        let gauges = self.health.iter();
        gauges
            .map(|(server, gauge)| (*server, gauge.get() == 1))
            .collect()
    }
}

impl Servers for Pool {
    type Tls = PeerTls;

    /// A healthy server not in `avoid`; `key` drives consistent hashing.
    fn pick(&self, key: &[u8], avoid: &[SocketAddr]) -> Option<SocketAddr> {
        match &self.balancer {
            Balancer::RoundRobin(lb) => pick(lb, key, avoid),
            Balancer::Consistent(lb) => pick(lb, key, avoid),
            Balancer::Single(server) => Some(*server).filter(|server| !avoid.contains(server)),
        }
    }

    fn tls(&self) -> Option<&PeerTls> {
        self.tls.as_ref()
    }
}

/// The pools of one configuration, indexed by route.
pub struct Pools {
    by_route: Box<[Pool]>,
}

/// Stops the background health checks of a set of pools when dropped (or told to).
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

impl Pools {
    /// One pool per route of `routes`, by route index; `Err` lists what is wrong, by route.
    pub fn build(routes: &RouteTable, read: &mut Sources) -> Result<Pools, Vec<Problem>> {
        let mut problems = Vec::new();
        let mut by_route = Vec::new();
        for route in routes.in_file_order() {
            match Pool::new(&route.upstream, read) {
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
        })
    }

    /// Reports each server's health on the gauge `gauge(route, server)` gives: 1 from now
    /// (a server without checks is always chosen), then what every round of checks finds.
    pub fn report_health(
        &mut self,
        routes: &RouteTable,
        gauge: impl Fn(&str, SocketAddr) -> IntGauge,
    ) {
        for (pool, route) in self.by_route.iter_mut().zip(routes.in_file_order()) {
            let gauges: Vec<(SocketAddr, IntGauge)> = route
                .upstream
                .servers
                .iter()
                .map(|server| (*server, gauge(&route.name, *server)))
                .collect();
            for (_, gauge) in &gauges {
                gauge.set(1);
            }
            pool.health = gauges.into();
        }
    }

    /// Every route's pool, in route order.
    pub fn iter(&self) -> impl Iterator<Item = &Pool> {
        self.by_route.iter()
    }

    /// Probes every server of every health-checked pool once, all at once: what a
    /// configuration knows of its servers before it goes live.
    pub async fn check_once(&self) {
        let mut rounds = tokio::task::JoinSet::new();
        for pool in self
            .by_route
            .iter()
            .filter(|pool| pool.interval().is_some())
        {
            let pool = pool.clone();
            rounds.spawn(async move { pool.check_once().await });
        }
        while rounds.join_next().await.is_some() {}
    }

    /// Starts the background checks, in the current runtime, until the handle is dropped.
    pub fn start_checks(&self) -> HealthChecks {
        let (stop, watching) = watch::channel(false);
        for pool in self.by_route.iter() {
            pool.spawn_checks(watching.clone());
        }
        HealthChecks { stop }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn round_robin_visits_every_server_and_avoids_failed_ones() {
        let pool = Pool::new(
            &UpstreamSettings::round_robin(vec![addr(1), addr(2)]),
            &mut Sources::default(),
        )
        .unwrap();
        let mut picks: Vec<_> = (0..4).map(|_| pool.pick(b"", &[]).unwrap()).collect();
        picks.sort();
        assert_eq!(picks, vec![addr(1), addr(1), addr(2), addr(2)]);
        assert!((0..4).all(|_| pool.pick(b"", &[addr(1)]) == Some(addr(2))));
        assert_eq!(pool.pick(b"", &[addr(1), addr(2)]), None);
    }

    #[test]
    fn consistent_hashing_sticks_to_a_server() {
        let mut settings = UpstreamSettings::round_robin(vec![addr(1), addr(2), addr(3)]);
        settings.balance = Balance::Consistent(vec![crate::route::keys::KeyPart::ClientIp]);
        let pool = Pool::new(&settings, &mut Sources::default()).unwrap();
        for key in [&b"alice"[..], b"bob", b"carol"] {
            let first = pool.pick(key, &[]);
            assert!((0..10).all(|_| pool.pick(key, &[]) == first));
        }
    }
}
