//! Upstream pools: addresses resolved at config load, chosen round robin per request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[derive(Debug)]
pub struct Upstream {
    servers: Box<[SocketAddr]>,
    next: AtomicUsize,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
}

impl Upstream {
    /// `servers` must not be empty; the config compiler guarantees it.
    pub fn new(
        servers: Vec<SocketAddr>,
        connect_timeout: Duration,
        read_timeout: Duration,
    ) -> Upstream {
        Upstream {
            servers: servers.into(),
            next: AtomicUsize::new(0),
            connect_timeout,
            read_timeout,
        }
    }

    /// The next server, round robin.
    pub fn pick(&self) -> Option<SocketAddr> {
        let n = self.servers.len();
        if n == 0 {
            return None;
        }
        Some(self.servers[self.next.fetch_add(1, Ordering::Relaxed) % n])
    }

    pub fn servers(&self) -> &[SocketAddr] {
        &self.servers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_visits_every_server() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let pool = Upstream::new(vec![a, b], Duration::from_secs(1), Duration::from_secs(1));
        let picks: Vec<_> = (0..4).map(|_| pool.pick().unwrap()).collect();
        assert_eq!(picks, vec![a, b, a, b]);
    }
}
