//! sluice: a Pingora reverse proxy that enforces exact rate limits shared by every gateway
//! instance, decided by one Lua script call per request in Redis (or in-process without Redis).
//!
//! Layers: `proxy`, `admin` and `app` know Pingora; `config`, `router`, `identity`, `keys` and
//! `limiter` are plain Rust; `limiter::redis` and `limiter::local` are the two backends.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod config;
pub mod identity;
pub mod keys;
pub mod limiter;
pub mod metrics;
pub mod path;
pub mod proxy;
pub mod reload;
pub mod router;
pub mod upstream;
