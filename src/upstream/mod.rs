//! Where an admitted request goes: what the exchange asks of a route's upstream (`servers`: a
//! server to dial, and its TLS material carried unread; no Pingora), each route's pool of
//! servers on `pingora-load-balancing` that answers it (round robin or consistent hashing among
//! those the health record does not find unhealthy; `pool`), each server's health once per
//! configuration whatever the routes that list it (`health`: not checked, healthy, unhealthy;
//! written by its checks; ejected, by passive health), what the answers of a server tell of it
//! (`outlier`: failures in a row eject it for a while, Envoy's outlier detection), how many
//! retries may be in flight beside its requests (`budget`: Envoy's retry budget), and the TLS
//! material of HTTPS upstreams (`tls`). Which server a request dials next, within its deadline, is the exchange's
//! (`exchange/upstream.rs`).

pub mod budget;
pub(crate) mod health;
pub(crate) mod outlier;
pub(crate) mod pool;
pub mod servers;
pub(crate) mod tls;
