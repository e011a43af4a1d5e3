//! A route's upstream as configured: its servers (resolved at config load), how one is chosen,
//! timeouts, retries, the path prefix to strip and the `Host` to send. The pools that choose
//! servers and health-check them are built from this by the glue (`pool.rs`), with each
//! configuration they serve.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
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

/// Everything about a route's upstream, as compiled from the config.
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    pub servers: Vec<SocketAddr>,
    pub balance: Balance,
    /// How often each server is probed with a TCP connect; `None`: never (all count healthy).
    pub health_check: Option<Duration>,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    /// Extra servers tried after a connection failure.
    pub retries: usize,
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
            servers,
            balance: Balance::RoundRobin,
            health_check: None,
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(30),
            retries: 0,
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
    fn strip_prefix_keeps_an_absolute_path() {
        let mut settings = UpstreamSettings::round_robin(vec!["127.0.0.1:1".parse().unwrap()]);
        settings.strip_prefix = Some("/api".into());
        assert_eq!(settings.upstream_path("/api/users"), "/users");
        assert_eq!(settings.upstream_path("/api"), "/");
        assert_eq!(settings.upstream_path("/other"), "/other");
    }
}
