//! Where an admitted request goes: each route's pool of servers on `pingora-load-balancing`
//! (round robin or consistent hashing among those the health checks find alive; `pool`), and
//! the TLS material of HTTPS upstreams (`tls`). Which server a request dials next, within its
//! deadline, is the exchange's (`exchange/upstream.rs`).

pub(crate) mod pool;
pub(crate) mod tls;
