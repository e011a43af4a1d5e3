//! `routes[].upstream`: servers resolved to addresses at load, balance, timeouts, retries,
//! health checks, the prefix to strip and the `Host` to send.

use std::net::ToSocketAddrs;
use std::time::Duration;

use http::header::HeaderValue;

use super::problem::Problems;
use super::raw::{RawUpstream, RawUpstreamTls};
use crate::keys::KeyPart;
use crate::pem::CertificateFiles;
use crate::upstream::{Balance, UpstreamSettings, UpstreamTls};

pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 30_000;
/// Other servers tried after a connection failure.
pub const DEFAULT_RETRIES: usize = 1;

pub fn compile(at: &str, raw: Option<RawUpstream>, p: &mut Problems) -> Option<UpstreamSettings> {
    let Some(raw) = raw else {
        p.add(
            format!("{at}.upstream"),
            "required, e.g. { servers: [127.0.0.1:3000] }",
        );
        return None;
    };
    if raw.servers.is_empty() {
        p.add(
            format!("{at}.upstream.servers"),
            "at least one upstream server is required",
        );
        return None;
    }
    let mut ok = true;
    let mut servers = Vec::new();
    for (i, text) in raw.servers.iter().enumerate() {
        match text.to_socket_addrs().map(|mut addrs| addrs.next()) {
            Ok(Some(addr)) => servers.push(addr),
            Ok(None) => {
                p.add(
                    format!("{at}.upstream.servers[{i}]"),
                    format!("{text:?} resolves to no address"),
                );
                ok = false;
            }
            Err(e) => {
                p.add(
                    format!("{at}.upstream.servers[{i}]"),
                    format!("invalid upstream server {text:?}: expected HOST:PORT ({e})"),
                );
                ok = false;
            }
        }
    }
    let mut millis = |value: Option<u64>, default: u64, field: &str, p: &mut Problems| {
        let ms = value.unwrap_or(default);
        if !(1..=3_600_000).contains(&ms) {
            p.add(
                format!("{at}.upstream.{field}"),
                format!("must be between 1 and 3600000 ms, got {ms}"),
            );
            ok = false;
        }
        Duration::from_millis(ms)
    };
    let connect_timeout = millis(
        raw.connect_timeout_ms,
        DEFAULT_CONNECT_TIMEOUT_MS,
        "connect_timeout_ms",
        p,
    );
    let read_timeout = millis(
        raw.read_timeout_ms,
        DEFAULT_READ_TIMEOUT_MS,
        "read_timeout_ms",
        p,
    );
    let health_check = raw
        .health_check_interval_ms
        .map(|ms| millis(Some(ms), ms, "health_check_interval_ms", p));
    let balance = match (raw.balance.as_deref(), raw.hash_key) {
        (None | Some("round_robin"), None) => Balance::RoundRobin,
        (Some("consistent"), Some(texts)) if !texts.is_empty() => {
            let parts: Vec<KeyPart> = texts
                .iter()
                .enumerate()
                .filter_map(|(i, text)| {
                    KeyPart::parse(text)
                        .map_err(|e| p.add(format!("{at}.upstream.hash_key[{i}]"), e))
                        .ok()
                })
                .collect();
            ok &= parts.len() == texts.len();
            Balance::Consistent(parts)
        }
        (Some("consistent"), _) => {
            p.add(
                format!("{at}.upstream.hash_key"),
                "required with balance: consistent, e.g. [client_ip]",
            );
            ok = false;
            Balance::RoundRobin
        }
        (None | Some("round_robin"), Some(_)) => {
            p.add(
                format!("{at}.upstream.hash_key"),
                "applies only with balance: consistent",
            );
            ok = false;
            Balance::RoundRobin
        }
        (Some(other), _) => {
            p.add(
                format!("{at}.upstream.balance"),
                format!("unknown balance {other:?}: use round_robin or consistent"),
            );
            ok = false;
            Balance::RoundRobin
        }
    };
    let retries = raw.retries.unwrap_or(DEFAULT_RETRIES);
    if retries > 10 {
        p.add(
            format!("{at}.upstream.retries"),
            format!("at most 10, got {retries}"),
        );
        ok = false;
    }
    if let Some(prefix) = &raw.strip_prefix {
        if !prefix.starts_with('/') || prefix.len() < 2 || prefix.ends_with('/') {
            p.add(
                format!("{at}.upstream.strip_prefix"),
                format!("must look like /api (no trailing slash), got {prefix:?}"),
            );
            ok = false;
        }
    }
    let host = raw
        .host
        .as_deref()
        .and_then(|h| match HeaderValue::from_str(h) {
            Ok(value) if !h.is_empty() => Some(value),
            _ => {
                p.add(
                    format!("{at}.upstream.host"),
                    format!("invalid Host value {h:?}"),
                );
                ok = false;
                None
            }
        });
    let tls = compile_tls(at, raw.tls, raw.servers.first().map(String::as_str), p);
    if !ok {
        return None;
    }
    Some(UpstreamSettings {
        servers,
        balance,
        health_check,
        connect_timeout,
        read_timeout,
        retries,
        strip_prefix: raw.strip_prefix,
        host,
        tls,
        http2: raw.http2.unwrap_or(false),
    })
}

/// `upstream.tls`: SNI (by default the host of the first server as written), verification (on
/// by default), a CA file, a client certificate.
fn compile_tls(
    at: &str,
    raw: Option<RawUpstreamTls>,
    first_server: Option<&str>,
    p: &mut Problems,
) -> Option<UpstreamTls> {
    let raw = raw?;
    let host_of = |server: &str| {
        let host = server.rsplit_once(':').map_or(server, |(host, _)| host);
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string()
    };
    let sni = raw
        .sni
        .or_else(|| first_server.map(host_of))
        .unwrap_or_default();
    if sni.is_empty() {
        p.add(
            format!("{at}.upstream.tls.sni"),
            "required: the server's name",
        );
    }
    let client = match (raw.cert, raw.key) {
        (Some(cert), Some(key)) => Some(CertificateFiles {
            cert: cert.into(),
            key: key.into(),
        }),
        (None, None) => None,
        _ => {
            p.add(
                format!("{at}.upstream.tls"),
                "a client certificate needs both cert and key",
            );
            None
        }
    };
    Some(UpstreamTls {
        sni,
        verify: raw.verify.unwrap_or(true),
        ca: raw.ca.map(Into::into),
        client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn upstream(yaml: &str) -> (Option<UpstreamSettings>, Vec<String>) {
        problems_of(yaml, |raw: RawUpstream, p: &mut Problems| {
            compile("routes[0]", Some(raw), p)
        })
    }

    #[test]
    fn servers_resolve_at_load_and_defaults_apply() {
        let (settings, problems) = upstream(
            "servers: [127.0.0.1:3000, localhost:3001]
",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let settings = settings.unwrap();
        assert_eq!(settings.servers[0].to_string(), "127.0.0.1:3000");
        assert_eq!(settings.retries, DEFAULT_RETRIES);
        assert_eq!(
            settings.connect_timeout,
            Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS)
        );
        assert_eq!(settings.balance, Balance::RoundRobin);
    }

    #[test]
    fn every_mistake_is_named_with_its_path() {
        let (settings, problems) = upstream(
            "servers: [nowhere]
retries: 11
balance: consistent
strip_prefix: api/
read_timeout_ms: 0
",
        );
        assert!(settings.is_none());
        let expected = [
            "routes[0].upstream.servers[0]: invalid upstream server \"nowhere\"",
            "routes[0].upstream.read_timeout_ms: must be between 1 and 3600000 ms, got 0",
            "routes[0].upstream.hash_key: required with balance: consistent",
            "routes[0].upstream.retries: at most 10, got 11",
            "routes[0].upstream.strip_prefix: must look like /api (no trailing slash), got \"api/\"",
        ];
        assert_eq!(problems.len(), expected.len(), "{problems:?}");
        for (problem, expected) in problems.iter().zip(expected) {
            assert!(problem.starts_with(expected), "{problem} / {expected}");
        }
        let (_, problems) = upstream(
            "servers: []
",
        );
        assert_eq!(
            problems,
            ["routes[0].upstream.servers: at least one upstream server is required"]
        );
    }
}
