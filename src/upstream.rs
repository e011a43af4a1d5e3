//! Upstream pools, on `pingora-load-balancing`: addresses resolved at config load, chosen round
//! robin or by consistent hashing (ketama) of a key part, optionally health-checked by TCP
//! connects; a server that refuses the connection is retried on another (never a request that
//! may have reached a server). The path prefix to strip and the `Host` to send live here too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
use pingora::lb::health_check::TcpHealthCheck;
use pingora::lb::selection::{BackendIter, BackendSelection, Consistent, RoundRobin};
use pingora::lb::{Backend, LoadBalancer};

use crate::keys::KeyPart;

/// How servers are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    RoundRobin,
    /// Ketama consistent hashing of the digest of these key parts: a client (or tenant, or path)
    /// sticks to a server while the pool is unchanged, and few move when it changes.
    Consistent(Vec<KeyPart>),
}

/// Everything about a route's upstream, as compiled from the config.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub servers: Vec<SocketAddr>,
    pub balance: Balance,
    pub health_check: Option<Duration>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Extra servers tried after a connection failure.
    pub retries: usize,
    pub strip_prefix: Option<String>,
    pub host: Option<HeaderValue>,
}

enum Pool {
    RoundRobin(Arc<LoadBalancer<RoundRobin>>),
    Consistent(Arc<LoadBalancer<Consistent>>),
}

/// A pool's health checker, for the server to run as a background service.
pub enum HealthChecker {
    RoundRobin(Arc<LoadBalancer<RoundRobin>>),
    Consistent(Arc<LoadBalancer<Consistent>>),
}

pub struct Upstream {
    pool: Pool,
    pub settings: UpstreamSettings,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("settings", &self.settings)
            .finish()
    }
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

impl Upstream {
    /// `settings.servers` must not be empty; the config compiler guarantees it.
    pub fn new(settings: UpstreamSettings) -> std::io::Result<Upstream> {
        let pool = match settings.balance {
            Balance::RoundRobin => Pool::RoundRobin(balancer(&settings)?),
            Balance::Consistent(_) => Pool::Consistent(balancer(&settings)?),
        };
        Ok(Upstream { pool, settings })
    }

    /// A simple round-robin pool (tests and defaults).
    pub fn round_robin(servers: Vec<SocketAddr>) -> std::io::Result<Upstream> {
        Upstream::new(UpstreamSettings {
            servers,
            balance: Balance::RoundRobin,
            health_check: None,
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(30),
            retries: 0,
            strip_prefix: None,
            host: None,
        })
    }

    /// A healthy server not in `avoid`; `key` drives consistent hashing.
    pub fn pick(&self, key: &[u8], avoid: &[SocketAddr]) -> Option<SocketAddr> {
        match &self.pool {
            Pool::RoundRobin(lb) => pick(lb, key, avoid),
            Pool::Consistent(lb) => pick(lb, key, avoid),
        }
    }

    /// The key parts consistent hashing uses, if any.
    pub fn hash_parts(&self) -> Option<&[KeyPart]> {
        match &self.settings.balance {
            Balance::Consistent(parts) => Some(parts),
            Balance::RoundRobin => None,
        }
    }

    /// The health checker to run in the background, when health checks are configured.
    pub fn health_checker(&self) -> Option<HealthChecker> {
        self.settings.health_check?;
        Some(match &self.pool {
            Pool::RoundRobin(lb) => HealthChecker::RoundRobin(Arc::clone(lb)),
            Pool::Consistent(lb) => HealthChecker::Consistent(Arc::clone(lb)),
        })
    }

    /// The path to send upstream: `path` without `strip_prefix` (never empty).
    pub fn upstream_path<'a>(&self, path: &'a str) -> std::borrow::Cow<'a, str> {
        match self
            .settings
            .strip_prefix
            .as_deref()
            .and_then(|p| path.strip_prefix(p))
        {
            Some(rest) if rest.starts_with('/') => rest.into(),
            Some(rest) => format!("/{rest}").into(),
            None => path.into(),
        }
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
        let pool = Upstream::round_robin(vec![addr(1), addr(2)]).unwrap();
        let mut picks: Vec<_> = (0..4).map(|_| pool.pick(b"", &[]).unwrap()).collect();
        picks.sort();
        assert_eq!(picks, vec![addr(1), addr(1), addr(2), addr(2)]);
        assert!((0..4).all(|_| pool.pick(b"", &[addr(1)]) == Some(addr(2))));
        assert_eq!(pool.pick(b"", &[addr(1), addr(2)]), None);
    }

    #[test]
    fn consistent_hashing_sticks_to_a_server() {
        let mut settings = Upstream::round_robin(vec![addr(1), addr(2), addr(3)])
            .unwrap()
            .settings;
        settings.balance = Balance::Consistent(vec![KeyPart::ClientIp]);
        let pool = Upstream::new(settings).unwrap();
        for key in [&b"alice"[..], b"bob", b"carol"] {
            let first = pool.pick(key, &[]);
            assert!((0..10).all(|_| pool.pick(key, &[]) == first));
        }
    }

    #[test]
    fn strip_prefix_keeps_an_absolute_path() {
        let mut settings = Upstream::round_robin(vec![addr(1)]).unwrap().settings;
        settings.strip_prefix = Some("/api".into());
        let pool = Upstream::new(settings).unwrap();
        assert_eq!(pool.upstream_path("/api/users"), "/users");
        assert_eq!(pool.upstream_path("/api"), "/");
        assert_eq!(pool.upstream_path("/other"), "/other");
    }
}
