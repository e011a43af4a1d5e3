//! The edge: everything that knows Pingora (or tonic) and turns the outside world into calls of
//! the exchange. `server` wires the Pingora server (its services, their order, its settings);
//! `proxy` is the `ProxyHttp` adapter (each hook at most 40 lines: Pingora types in, the
//! exchange's answers out, `respond.rs` the one place answers become responses); `listening`
//! binds first and reports readiness; `tls` serves each listener's certificates and verifies
//! client certificates; `drain` is SIGTERM's graceful shutdown; `admin`, `usage`, `quota_admin`,
//! `explain` and `dashboard` answer the admin listener (`admin_http`: its token's check, its responses;
//! `admin_error`: why any of their calls gets no answer, each refusal with its one status;
//! `query`: their parameters read into typed structs;
//! `readiness`: the one state `/readyz` and the dashboard both tell); `rls` is Envoy's rate limit
//! service over gRPC.

pub(crate) mod admin;
pub(crate) mod admin_error;
mod admin_http;
pub(crate) mod dashboard;
pub(crate) mod drain;
pub mod explain;
pub(crate) mod listening;
pub(crate) mod proxy;
pub(crate) mod query;
pub(crate) mod quota_admin;
pub(crate) mod readiness;
pub(crate) mod rls;
mod rls_metadata;
pub mod server;
pub(crate) mod tls;
pub(crate) mod usage;
