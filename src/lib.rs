//! sluice: a Pingora reverse proxy that enforces exact rate limits shared by every gateway
//! instance, decided by one Lua script call per request in Redis (or in-process without Redis).
//!
//! A request goes down these folders, top to bottom, and each imports only the folders below it
//! (`tests/layering.rs` checks it); docs/architecture.md follows one request through them.
#![forbid(unsafe_code)]

/// Pingora in, answers out: the server's wiring, the proxy's hooks, listeners and their TLS,
/// graceful drain, the admin and usage API, the rate limit service over gRPC.
pub mod edge;

/// The configuration in force: the snapshot a reload swaps, the reload itself, `-d`.
pub mod runtime;

/// One request from head to end, without Pingora: admit, the upstream steps, end; every answer.
pub mod exchange;

/// Where an admitted request goes: pools, health checks, upstream TLS.
pub mod upstream;

/// What the operator sees: metric families, the access log, traces, the process log.
pub mod observe;

/// The YAML file compiled into typed values, every problem reported at once.
pub mod config;

/// What a request meets: the route table, paths, tiers, keys, pricing, the upstream as
/// configured, the rate limit service's descriptors.
pub mod route;

/// Who is calling: client address, address lists, API keys, client certificates, consumers, JWT.
pub mod caller;

/// The decision: policy, engine, algorithms (Lua twins), Redis and in-process backends, leases.
pub mod limiter;
