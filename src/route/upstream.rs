//! A route's upstream as configured: its servers (resolved at config load), how one is chosen,
//! timeouts, retries (which failures, how many, within what budget), the path prefix to strip
//! and the `Host` to send. The pools that choose
//! servers and health-check them are built from this by the glue (`pool.rs`), with each
//! configuration they serve.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;

use crate::route::keys::KeyPart;

/// TLS to the upstream servers (HTTPS upstreams).
/// A certificate chain and its private key, in PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// The name sent by SNI and, with `verify`, checked against the server's certificate.
    pub sni: String,
    /// Check the server's certificate chain and name (on by default).
    pub verify: bool,
    /// CA certificates to trust instead of the system's.
    pub ca: Option<PathBuf>,
    /// A client certificate, for upstreams that require mutual TLS.
    pub client: Option<CertificateFiles>,
}

/// How servers are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Balance {
    RoundRobin,
    /// Ketama consistent hashing of the digest of these key parts: a client (or tenant, or path)
    /// sticks to a server while the pool is unchanged, and few move when it changes.
    Consistent(Vec<KeyPart>),
}

/// Passive health (outlier detection, as Envoy's): what the answers of a route's servers
/// tell of them. A server that fails `consecutive_failures` attempts in a row (a `5xx`
/// response, a refused, reset or timed-out connection) is ejected for `base_ejection` times the
/// number of its ejections, at most `max_ejection`; the route skips ejected servers while no
/// more than `max_ejected_percent` of its servers (at least one, never all) are out, and
/// balances over all of them when more are (a panic threshold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassiveHealth {
    pub consecutive_failures: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
    pub max_ejected_percent: u8,
}

impl PassiveHealth {
    /// The defaults: 5 failures in a row, 30 s growing by 30 s per ejection up to 300 s
    /// (Envoy's), at most half the servers out at once (Envoy's panic threshold).
    pub const DEFAULT: PassiveHealth = PassiveHealth {
        consecutive_failures: 5,
        base_ejection: Duration::from_secs(30),
        max_ejection: Duration::from_secs(300),
        max_ejected_percent: 50,
    };

    /// How many of `servers` servers may be skipped for being ejected: the percentage, at
    /// least one, never all.
    pub fn max_ejected(&self, servers: usize) -> usize {
        let share = servers * usize::from(self.max_ejected_percent) / 100;
        share.max(1).min(servers.saturating_sub(1))
    }
}

/// A failure of one try that `upstream.retry_on` may name: the request is then tried on
/// another server. Only `connect_failure` is retried for any request (the server never saw
/// it); the others only for a request that can be sent again whole (see
/// [`RetryPolicy::allows`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::VariantNames, strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
pub enum RetryCause {
    /// The connection could not be made (refused, timed out, TLS, unreachable).
    ConnectFailure,
    /// The connection closed or broke after the request was sent, before the response head.
    Reset,
    /// The server sent nothing for the read timeout (the per-try timeout).
    Timeout,
    #[strum(serialize = "http_502")]
    Http502,
    /// A `503` without `Retry-After`: one with it is the upstream asking callers to wait, and
    /// goes to the client as it is.
    #[strum(serialize = "http_503")]
    Http503,
    #[strum(serialize = "http_504")]
    Http504,
}

impl RetryCause {
    /// The cause a response status is, if it is one.
    pub fn of_status(status: u16) -> Option<RetryCause> {
        match status {
            502 => Some(RetryCause::Http502),
            503 => Some(RetryCause::Http503),
            504 => Some(RetryCause::Http504),
            _ => None,
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The retry budget of an upstream (Envoy's): retries in flight may be at most `percent` of
/// its requests in flight, or `min_concurrency`, whichever is more. What keeps a retry storm
/// from multiplying the load on a failing upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryBudgetRule {
    pub percent: u8,
    pub min_concurrency: u32,
}

impl RetryBudgetRule {
    /// Envoy's defaults: 20 %, at least 3.
    pub const DEFAULT: RetryBudgetRule = RetryBudgetRule {
        percent: 20,
        min_concurrency: 3,
    };

    /// How many retries may be in flight beside `requests` requests in flight.
    pub fn allowed(&self, requests: u32) -> u32 {
        let share = u64::from(requests) * u64::from(self.percent) / 100;
        u32::try_from(share)
            .unwrap_or(u32::MAX)
            .max(self.min_concurrency)
    }
}

/// Which failed tries are tried again on another server, how many times, within what budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Other servers tried, at most, after the first (`retries:`).
    pub attempts: usize,
    /// The causes retried (a set of [`RetryCause`] bits).
    on: u8,
    pub budget: RetryBudgetRule,
}

impl RetryPolicy {
    /// `attempts` other servers after a failed connection, within Envoy's default budget.
    pub fn connect_failures(attempts: usize) -> RetryPolicy {
        RetryPolicy {
            attempts,
            on: RetryCause::ConnectFailure.bit(),
            budget: RetryBudgetRule::DEFAULT,
        }
    }

    /// The policy retrying on `causes`.
    pub fn on(mut self, causes: impl IntoIterator<Item = RetryCause>) -> RetryPolicy {
        self.on = causes.into_iter().fold(0, |on, cause| on | cause.bit());
        self
    }

    /// The policy within `budget`.
    pub fn with_budget(mut self, budget: RetryBudgetRule) -> RetryPolicy {
        self.budget = budget;
        self
    }

    pub fn retries_on(&self, cause: RetryCause) -> bool {
        self.on & cause.bit() != 0
    }

    /// Whether a try that failed by `cause` may be tried again, for a request that can
    /// (`replayable`) or cannot be sent again whole: a failed connection always may (the server
    /// never saw the request); any other failure only when the request can be replayed — an
    /// idempotent method whose body is still held whole, not a gRPC call or an upgrade.
    pub fn allows(&self, cause: RetryCause, replayable: bool) -> bool {
        self.retries_on(cause) && (cause == RetryCause::ConnectFailure || replayable)
    }
}

/// Everything about a route's upstream, as compiled from the config.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// The named upstream (`upstreams:`) these settings are, shared by every route that names
    /// it (one pool); `None`: the route's own servers.
    pub name: Option<Arc<str>>,
    pub servers: Vec<SocketAddr>,
    pub balance: Balance,
    /// How often each server is probed with a TCP connect; `None`: never (all count healthy).
    pub health_check: Option<Duration>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Which failed tries go to another server, how many, within what budget.
    pub retry: RetryPolicy,
    pub strip_prefix: Option<String>,
    pub host: Option<HeaderValue>,
    /// HTTPS to the servers; `None`: plain HTTP.
    pub tls: Option<UpstreamTls>,
    /// Speak HTTP/2 to the servers (by ALPN over TLS, with prior knowledge in the clear): what
    /// gRPC upstreams need.
    pub http2: bool,
    /// Passive health (outlier detection); `None`: off for this route.
    pub passive_health: Option<PassiveHealth>,
}

impl UpstreamSettings {
    /// A round-robin pool with default timeouts and no retries (tests and tools).
    pub fn round_robin(servers: Vec<SocketAddr>) -> UpstreamSettings {
        UpstreamSettings {
            name: None,
            servers,
            balance: Balance::RoundRobin,
            health_check: None,
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(30),
            retry: RetryPolicy::connect_failures(0),
            strip_prefix: None,
            host: None,
            tls: None,
            http2: false,
            passive_health: Some(PassiveHealth::DEFAULT),
        }
    }

    /// The key parts consistent hashing uses, if any.
    pub fn hash_parts(&self) -> Option<&[KeyPart]> {
        match &self.balance {
            Balance::Consistent(parts) => Some(parts),
            Balance::RoundRobin => None,
        }
    }

    /// The path to send upstream: `path` without `strip_prefix` (never empty).
    pub fn upstream_path<'a>(&self, path: &'a str) -> Cow<'a, str> {
        match self
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

    #[test]
    fn only_a_failed_connection_is_retried_for_a_request_that_cannot_be_replayed() {
        let policy = RetryPolicy::connect_failures(1).on([
            RetryCause::ConnectFailure,
            RetryCause::Http503,
            RetryCause::Reset,
        ]);
        assert!(policy.allows(RetryCause::ConnectFailure, false));
        assert!(!policy.allows(RetryCause::Http503, false));
        assert!(policy.allows(RetryCause::Http503, true));
        assert!(!policy.allows(RetryCause::Timeout, true), "not named");
    }

    #[test]
    fn the_budget_is_a_share_of_requests_in_flight_with_a_floor() {
        let rule = RetryBudgetRule::DEFAULT;
        assert_eq!(rule.allowed(0), 3);
        assert_eq!(rule.allowed(10), 3);
        assert_eq!(rule.allowed(100), 20);
        assert_eq!(rule.allowed(u32::MAX), u32::MAX / 5);
    }

    #[test]
    fn strip_prefix_keeps_an_absolute_path() {
        let mut settings = UpstreamSettings::round_robin(vec!["127.0.0.1:1".parse().unwrap()]);
        settings.strip_prefix = Some("/api".into());
        assert_eq!(settings.upstream_path("/api/users"), "/users");
        assert_eq!(settings.upstream_path("/api"), "/");
        assert_eq!(settings.upstream_path("/other"), "/other");
    }
}
