//! What the exchange asks of a route's upstream, without the machinery that answers: a server
//! to dial (healthy, not ejected, not one to avoid), what securing the connection needs, carried
//! to the edge unread, and where each attempt's end is told (passive health). [`crate::upstream::pool::Pool`] answers on Pingora's load balancer; [`InOrder`]
//! answers from the list as written, for the exchange's tests and `sluice explain`. Nothing here names Pingora, so the
//! exchange, which is generic over [`Servers`], reaches no Pingora type through it.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::route::table::RouteTable;
use crate::upstream::budget::RetryBudget;

/// A route's upstream servers as the exchange uses them.
pub trait Servers: Clone + Send + Sync + 'static {
    /// What a connection to these servers needs to be secured (TLS material the edge turns into
    /// its peer); opaque to the exchange.
    type Tls: Send + Sync;

    /// A server to dial, not one of `avoid`; `key` drives consistent hashing. `None` when none
    /// is left.
    fn pick(&self, key: &[u8], avoid: &[SocketAddr]) -> Option<SocketAddr>;

    /// How connections to these servers are secured; `None`: plain TCP.
    fn tls(&self) -> Option<&Self::Tls>;

    /// An attempt on `server` ended: `failed` (a `5xx` response, a failed connection) or
    /// answered otherwise. What passive health learns from; nothing by default.
    fn attempt_ended(&self, _server: SocketAddr, _failed: bool) {}

    /// Each server, in the route's order, and the name of its health state now
    /// (`not-checked`, `healthy`, `unhealthy`, `ejected`); `None`: not known.
    fn states(&self) -> Vec<(SocketAddr, Option<&'static str>)>;

    /// The retry budget of these servers; `None`: retries are bounded by their count alone.
    fn retry_budget(&self) -> Option<&RetryBudget> {
        None
    }
}

/// Servers in the order written: the first one not avoided. No health checks, no TLS (the
/// exchange's tests, and `sluice explain`, which dials nothing).
#[derive(Debug, Clone)]
pub struct InOrder(Arc<[SocketAddr]>);

impl InOrder {
    pub fn new(servers: &[SocketAddr]) -> InOrder {
        InOrder(servers.into())
    }

    /// Each route's servers as written, in file order.
    pub fn of(routes: &RouteTable) -> Vec<InOrder> {
        let routes = routes.in_file_order();
        routes
            .iter()
            .map(|route| InOrder::new(&route.upstream.servers))
            .collect()
    }
}

impl Servers for InOrder {
    type Tls = ();

    fn pick(&self, _key: &[u8], avoid: &[SocketAddr]) -> Option<SocketAddr> {
        self.0
            .iter()
            .copied()
            .find(|server| !avoid.contains(server))
    }

    fn tls(&self) -> Option<&()> {
        None
    }

    /// Nothing is known of their health: they are never dialed.
    fn states(&self) -> Vec<(SocketAddr, Option<&'static str>)> {
        self.0.iter().map(|server| (*server, None)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_takes_the_first_server_not_avoided() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        );
        let servers = InOrder::new(&[a, b]);
        assert_eq!(servers.pick(b"k", &[]), Some(a));
        assert_eq!(servers.pick(b"k", &[a]), Some(b));
        assert_eq!(servers.pick(b"k", &[a, b]), None);
        assert!(servers.tls().is_none());
    }
}
