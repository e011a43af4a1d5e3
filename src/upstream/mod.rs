//! Where an admitted request goes: what the exchange asks of a route's upstream (`servers`: a
//! server to dial, and its TLS material carried unread; no Pingora), each route's pool of
//! servers on `pingora-load-balancing` that answers it (round robin or consistent hashing among
//! those the health checks find alive; `pool`), and the TLS material of HTTPS upstreams
//! (`tls`). Which server a request dials next, within its deadline, is the exchange's
//! (`exchange/upstream.rs`).

pub(crate) mod pool;
pub mod servers;
pub(crate) mod tls;
