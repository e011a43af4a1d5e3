//! sluice: a Pingora reverse proxy that enforces exact rate limits shared by every gateway
//! instance, decided by one Lua script call per request in Redis (or in-process without Redis).
//!
//! Layers (arrows point down only; `tests/layering.rs` checks it):
//! * glue, which knows Pingora: `app` (wiring), `reload` (the configuration service),
//!   `snapshot` (what a reload swaps), `pool` (upstream pools and health checks), `proxy`, `admin`,
//!   `access_log` (the log's writer thread and files), `traces` (the OpenTelemetry pipeline);
//! * domain, plain Rust: `config`, `api_keys`, `router`, `identity`, `keys`, `path`, `upstream`, `metrics`,
//!   and the limiter's policy (`limiter::policy`, which owns the verdict);
//! * backends: `limiter::redis` and `limiter::local`, with their decorators.
#![forbid(unsafe_code)]

pub mod access_log;
pub mod addresses;
pub mod admin;
pub mod answer;
pub mod api_keys;
pub mod app;
pub mod client_cert;
pub mod config;
pub mod consumers;
pub mod daemon;
pub mod drain;
pub mod exchange;
pub mod identity;
pub mod jwt;
pub mod keys;
pub mod limiter;
pub mod listening;
pub mod logging;
pub mod metrics;
pub mod path;
pub mod pem;
pub mod pool;
pub mod pricing;
pub mod proxy;
pub mod reload;
pub mod rls;
pub mod rls_service;
pub mod router;
pub mod secret;
pub mod snapshot;
pub mod sources;
pub mod tiers;
pub mod tls;
pub mod traces;
pub mod upstream;
pub mod usage;
