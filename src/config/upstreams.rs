//! `upstreams:` and `routes[].upstream`: servers resolved to addresses at load, balance,
//! timeouts, retries, health checks, the prefix to strip and the `Host` to send. A named
//! upstream is compiled once; a route that names it gets its settings, with its own
//! `strip_prefix` and `host` when it gives them, and shares its one pool (`upstream/pool.rs`).

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use http::header::HeaderValue;

use super::choice::{chosen, BalanceName, Spelled};
use super::limits::key_parts;
use super::problem::{check_name, millis_within, within, Problems};
use super::raw::{RawPassiveHealth, RawRetryBudget, RawRouteUpstream, RawUpstream, RawUpstreamTls};
use crate::route::upstream::CertificateFiles;
use crate::route::upstream::{Balance, PassiveHealth, UpstreamSettings, UpstreamTls};
use crate::route::upstream::{RetryBudgetRule, RetryCause, RetryPolicy};

pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 30_000;
/// Other servers tried after a connection failure.
pub const DEFAULT_RETRIES: usize = 1;

/// Timeouts and health check intervals: from 1 ms to an hour.
const MILLIS: std::ops::RangeInclusive<u64> = 1..=3_600_000;

/// The upstreams of `upstreams:`, by name, each compiled once (`None`: it did not compile, and
/// its problems were reported).
#[derive(Debug, Default)]
pub struct NamedUpstreams(BTreeMap<String, Option<UpstreamSettings>>);

impl NamedUpstreams {
    /// The settings of the upstream `name`, named at `at`: a problem when there is none.
    fn named(&self, name: &str, at: &str, p: &mut Problems) -> Option<UpstreamSettings> {
        match self.0.get(name) {
            Some(settings) => settings.clone(),
            None if self.0.is_empty() => {
                p.add(
                    at,
                    format!(
                        "unknown upstream {name:?}: no upstream is defined (upstreams: at the top)"
                    ),
                );
                None
            }
            None => {
                let names: Vec<&str> = self.0.keys().map(String::as_str).collect();
                let names = super::choice::or_list(&names);
                p.add(at, format!("unknown upstream {name:?}: use {names}"));
                None
            }
        }
    }
}

/// `upstreams:`: each name valid, each upstream compiled as a route's own would be, without
/// what only a route says (`use`, `strip_prefix`).
pub fn compile_named(raw: BTreeMap<String, RawUpstream>, p: &mut Problems) -> NamedUpstreams {
    let mut named = BTreeMap::new();
    for (name, mut raw) in raw {
        let at = format!("upstreams.{name}");
        let valid = check_name(&name, &at, p);
        if raw.uses.take().is_some() {
            p.add(
                format!("{at}.use"),
                "an upstream names its servers, not another upstream",
            );
        }
        if raw.strip_prefix.take().is_some() {
            p.add(
                format!("{at}.strip_prefix"),
                "a route's setting: give it beside use: on each route that wants it, e.g. \
                 upstream: { use: NAME, strip_prefix: /api }",
            );
        }
        let settings = compile_settings(&at, raw, p).filter(|_| valid);
        let shared: Arc<str> = name.as_str().into();
        named.insert(
            name,
            settings.map(|settings| UpstreamSettings {
                name: Some(shared),
                ..settings
            }),
        );
    }
    NamedUpstreams(named)
}

/// A route's `upstream:`: the name of one of `named`, a map that uses one (with the route's
/// own `strip_prefix` and `host`), or the route's own servers and settings.
pub fn compile(
    at: &str,
    raw: Option<RawRouteUpstream>,
    named: &NamedUpstreams,
    p: &mut Problems,
) -> Option<UpstreamSettings> {
    let at = &format!("{at}.upstream");
    match raw {
        None => {
            p.add(
                at,
                "required, e.g. { servers: [127.0.0.1:3000] }, or the name of one of upstreams:",
            );
            None
        }
        Some(RawRouteUpstream::Named(name)) => named.named(&name, at, p),
        Some(RawRouteUpstream::Inline(mut raw)) => match raw.uses.take() {
            Some(name) => compile_use(at, &name, *raw, named, p),
            None => compile_settings(at, *raw, p),
        },
    }
}

/// `upstream: { use: NAME, strip_prefix, host }`: the named upstream's settings with the
/// route's own prefix and `Host`; anything else beside `use` is the upstream's to say.
fn compile_use(
    at: &str,
    name: &str,
    raw: RawUpstream,
    named: &NamedUpstreams,
    p: &mut Problems,
) -> Option<UpstreamSettings> {
    let elsewhere = [
        (!raw.servers.is_empty(), "servers"),
        (raw.connect_timeout_ms.is_some(), "connect_timeout_ms"),
        (raw.read_timeout_ms.is_some(), "read_timeout_ms"),
        (raw.balance.is_some(), "balance"),
        (raw.hash_key.is_some(), "hash_key"),
        (
            raw.health_check_interval_ms.is_some(),
            "health_check_interval_ms",
        ),
        (raw.retries.is_some(), "retries"),
        (raw.retry_on.is_some(), "retry_on"),
        (raw.retry_budget.is_some(), "retry_budget"),
        (raw.tls.is_some(), "tls"),
        (raw.http2.is_some(), "http2"),
        (raw.passive_health.is_some(), "passive_health"),
    ];
    let misplaced = elsewhere.iter().filter(|(given, _)| *given);
    let mut placed = true;
    for (_, field) in misplaced {
        p.add(
            format!("{at}.{field}"),
            format!("the upstream's setting: set it on upstreams.{name}, not beside use:"),
        );
        placed = false;
    }
    let strip_prefix = compile_strip_prefix(at, raw.strip_prefix, p);
    let host = compile_host(at, raw.host.as_deref(), p);
    let settings = named.named(name, &format!("{at}.use"), p)?;
    let (strip_prefix, host) = (strip_prefix.ok()?, host.ok()?);
    if !placed {
        return None;
    }
    Some(UpstreamSettings {
        strip_prefix,
        host: host.or(settings.host.clone()),
        ..settings
    })
}

/// An upstream's own servers and settings, at `at`.
fn compile_settings(at: &str, raw: RawUpstream, p: &mut Problems) -> Option<UpstreamSettings> {
    // No server is one problem among the upstream's others: they are checked too.
    let servers = if raw.servers.is_empty() {
        p.add(
            format!("{at}.servers"),
            "at least one upstream server is required",
        );
        None
    } else {
        compile_servers(at, &raw.servers, p)
    };
    let millis = |ms: u64, field: &str, p: &mut Problems| {
        millis_within(ms, MILLIS, &format!("{at}.{field}"), p)
    };
    let connect_timeout = raw.connect_timeout_ms.unwrap_or(DEFAULT_CONNECT_TIMEOUT_MS);
    let connect_timeout = millis(connect_timeout, "connect_timeout_ms", p);
    let read_timeout = raw.read_timeout_ms.unwrap_or(DEFAULT_READ_TIMEOUT_MS);
    let read_timeout = millis(read_timeout, "read_timeout_ms", p);
    let health_check = raw
        .health_check_interval_ms
        .map(|ms| millis(ms, "health_check_interval_ms", p).ok_or(()))
        .transpose();
    let balance = compile_balance(at, raw.balance.as_ref(), raw.hash_key, p);
    let retry = compile_retry(at, raw.retries, raw.retry_on.as_deref(), p);
    let retry_budget = compile_retry_budget(at, raw.retry_budget.as_ref(), p);
    let strip_prefix = compile_strip_prefix(at, raw.strip_prefix, p);
    let host = compile_host(at, raw.host.as_deref(), p);
    let tls = compile_tls(at, raw.tls, raw.servers.first().map(String::as_str), p);
    let passive_health = compile_passive_health(at, raw.passive_health, p);
    Some(UpstreamSettings {
        name: None,
        servers: servers?,
        balance: balance?,
        health_check: health_check.ok()?,
        connect_timeout: connect_timeout?,
        read_timeout: read_timeout?,
        retry: retry?.with_budget(retry_budget?),
        strip_prefix: strip_prefix.ok()?,
        host: host.ok()?,
        tls,
        http2: raw.http2.unwrap_or(false),
        passive_health: passive_health.ok()?,
    })
}

/// `passive_health:`, on with Envoy's defaults unless `enabled: false`; `Err` when a setting
/// is out of range.
fn compile_passive_health(
    at: &str,
    raw: Option<RawPassiveHealth>,
    p: &mut Problems,
) -> Result<Option<PassiveHealth>, ()> {
    let at = &format!("{at}.passive_health");
    let Some(raw) = raw else {
        return Ok(Some(PassiveHealth::DEFAULT));
    };
    let defaults = PassiveHealth::DEFAULT;
    let failures = raw
        .consecutive_failures
        .unwrap_or(u64::from(defaults.consecutive_failures));
    let failures = within(
        failures,
        1..=1_000,
        &format!("{at}.consecutive_failures"),
        p,
    );
    let percent = raw
        .max_ejected_percent
        .unwrap_or(u64::from(defaults.max_ejected_percent));
    let percent = within(percent, 1..=100, &format!("{at}.max_ejected_percent"), p);
    let ms = |d: std::time::Duration| d.as_millis() as u64;
    let base = raw.base_ejection_ms.unwrap_or(ms(defaults.base_ejection));
    let base = millis_within(base, MILLIS, &format!("{at}.base_ejection_ms"), p).ok_or(());
    let max = raw.max_ejection_ms.unwrap_or(ms(defaults.max_ejection));
    let max = millis_within(max, MILLIS, &format!("{at}.max_ejection_ms"), p).ok_or(());
    if let (Ok(base), Ok(max)) = (base, max) {
        if max < base {
            p.add(
                format!("{at}.max_ejection_ms"),
                "must not be shorter than base_ejection_ms",
            );
            return Err(());
        }
    }
    let settings = PassiveHealth {
        consecutive_failures: failures.ok_or(())? as u32,
        base_ejection: base?,
        max_ejection: max?,
        max_ejected_percent: percent.ok_or(())? as u8,
    };
    Ok(raw.enabled.unwrap_or(true).then_some(settings))
}

/// `servers:`, resolved to addresses now (never per request); every one that does not is named.
fn compile_servers(at: &str, texts: &[String], p: &mut Problems) -> Option<Vec<SocketAddr>> {
    let mut servers = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        match text.to_socket_addrs().map(|mut addrs| addrs.next()) {
            Ok(Some(addr)) => servers.push(addr),
            Ok(None) => p.add(
                format!("{at}.servers[{i}]"),
                format!("{text:?} resolves to no address"),
            ),
            Err(e) => p.add(format!("{at}.servers[{i}]"), unresolved(text, &e)),
        }
    }
    (servers.len() == texts.len()).then_some(servers)
}

/// Why `text` gave no address: not HOST:PORT, or a name that could not be resolved.
fn unresolved(text: &str, e: &std::io::Error) -> String {
    let host = match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host,
        _ => {
            return format!(
                "invalid upstream server {text:?}: expected HOST:PORT with a port from 1 to \
                 65535, e.g. backend.internal:8080 or 10.0.0.5:8080"
            )
        }
    };
    let reason = e.to_string();
    let reason = reason
        .strip_prefix("failed to lookup address information: ")
        .unwrap_or(&reason);
    format!(
        "the name {host:?} could not be resolved ({reason}): sluice resolves upstream names once, \
         when it loads the configuration (at start and at each reload); check the name and the \
         resolver, or write IP:PORT"
    )
}

/// `balance:` (round robin unless set) and the `hash_key` consistent hashing needs.
fn compile_balance(
    at: &str,
    balance: Option<&Spelled<BalanceName>>,
    hash_key: Option<Vec<String>>,
    p: &mut Problems,
) -> Option<Balance> {
    let balance = chosen(
        balance,
        BalanceName::RoundRobin,
        &format!("{at}.balance"),
        p,
    )?;
    match (balance, hash_key) {
        (BalanceName::RoundRobin, None) => Some(Balance::RoundRobin),
        (BalanceName::Consistent, Some(texts)) if !texts.is_empty() => {
            key_parts(&texts, &format!("{at}.hash_key"), p).map(Balance::Consistent)
        }
        (BalanceName::Consistent, _) => {
            p.add(
                format!("{at}.hash_key"),
                "required with balance: consistent, e.g. [client_ip]",
            );
            None
        }
        (BalanceName::RoundRobin, Some(_)) => {
            p.add(
                format!("{at}.hash_key"),
                "applies only with balance: consistent",
            );
            None
        }
    }
}

/// `retries:` (other servers tried, at most 10) and `retry_on:` (the causes; a failed
/// connection by default).
fn compile_retry(
    at: &str,
    retries: Option<usize>,
    retry_on: Option<&[Spelled<RetryCause>]>,
    p: &mut Problems,
) -> Option<RetryPolicy> {
    let retries = retries.unwrap_or(DEFAULT_RETRIES);
    let attempts = if retries > 10 {
        p.add(
            format!("{at}.retries"),
            format!("at most 10, got {retries}"),
        );
        None
    } else {
        Some(retries)
    };
    let causes = match retry_on {
        None => Some(vec![RetryCause::ConnectFailure]),
        Some(spelled) => {
            let known = spelled
                .iter()
                .enumerate()
                .map(|(i, cause)| cause.known(&format!("{at}.retry_on[{i}]"), p));
            known.collect::<Vec<_>>().into_iter().collect()
        }
    };
    Some(RetryPolicy::connect_failures(attempts?).on(causes?))
}

/// `retry_budget:`, Envoy's defaults (20 %, at least 3) for what it leaves out.
fn compile_retry_budget(
    at: &str,
    raw: Option<&RawRetryBudget>,
    p: &mut Problems,
) -> Option<RetryBudgetRule> {
    let defaults = RetryBudgetRule::DEFAULT;
    let Some(raw) = raw else {
        return Some(defaults);
    };
    let at = &format!("{at}.retry_budget");
    let percent = raw.percent.unwrap_or(u64::from(defaults.percent));
    let percent = within(percent, 0..=100, &format!("{at}.percent"), p);
    let min = raw
        .min_concurrency
        .unwrap_or(u64::from(defaults.min_concurrency));
    let min = within(min, 0..=10_000, &format!("{at}.min_concurrency"), p);
    Some(RetryBudgetRule {
        percent: u8::try_from(percent?).ok()?,
        min_concurrency: u32::try_from(min?).ok()?,
    })
}

/// `strip_prefix:`, a path prefix such as `/api`; `Err` when it is not one.
fn compile_strip_prefix(
    at: &str,
    prefix: Option<String>,
    p: &mut Problems,
) -> Result<Option<String>, ()> {
    match prefix {
        Some(prefix) if !prefix.starts_with('/') || prefix.len() < 2 || prefix.ends_with('/') => {
            p.add(
                format!("{at}.strip_prefix"),
                format!("must look like /api (no trailing slash), got {prefix:?}"),
            );
            Err(())
        }
        prefix => Ok(prefix),
    }
}

/// `host:`, the `Host` header sent upstream; `Err` when it is not a header value.
fn compile_host(at: &str, host: Option<&str>, p: &mut Problems) -> Result<Option<HeaderValue>, ()> {
    let Some(host) = host else {
        return Ok(None);
    };
    match HeaderValue::from_str(host) {
        Ok(value) if !host.is_empty() => Ok(Some(value)),
        _ => {
            p.add(format!("{at}.host"), format!("invalid Host value {host:?}"));
            Err(())
        }
    }
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
        p.add(format!("{at}.tls.sni"), "required: the server's name");
    }
    let client = match (raw.cert, raw.key) {
        (Some(cert), Some(key)) => Some(CertificateFiles {
            cert: super::paths::absolute(cert),
            key: super::paths::absolute(key),
        }),
        (None, None) => None,
        _ => {
            p.add(
                format!("{at}.tls"),
                "a client certificate needs both cert and key",
            );
            None
        }
    };
    Some(UpstreamTls {
        sni,
        verify: raw.verify.unwrap_or(true),
        ca: raw.ca.map(super::paths::absolute),
        client,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::problem::problems_of;

    fn upstream(yaml: &str) -> (Option<UpstreamSettings>, Vec<String>) {
        problems_of(yaml, |raw: RawUpstream, p: &mut Problems| {
            compile_settings("routes[0].upstream", raw, p)
        })
    }

    /// A file's `upstreams:` and one route's `upstream:`.
    #[derive(serde::Deserialize)]
    struct Both {
        #[serde(default)]
        upstreams: BTreeMap<String, RawUpstream>,
        upstream: Option<RawRouteUpstream>,
    }

    fn named(yaml: &str) -> (Option<UpstreamSettings>, Vec<String>) {
        problems_of(yaml, |raw: Both, p: &mut Problems| {
            let named = compile_named(raw.upstreams, p);
            compile("routes[0]", raw.upstream, &named, p)
        })
    }

    const BILLING: &str =
        "upstreams: { billing: { servers: [127.0.0.1:1, 127.0.0.1:2], retries: 2, host: b.internal } }\n";

    #[test]
    fn a_route_names_an_upstream_or_uses_it_with_its_own_prefix_and_host() {
        let (settings, problems) = named(&format!("{BILLING}upstream: billing\n"));
        assert!(problems.is_empty(), "{problems:?}");
        let settings = settings.expect("it compiles");
        assert_eq!(settings.name.as_deref(), Some("billing"));
        assert_eq!((settings.servers.len(), settings.retry.attempts), (2, 2));
        assert_eq!(settings.host, Some(HeaderValue::from_static("b.internal")));
        let (settings, problems) = named(&format!(
            "{BILLING}upstream: {{ use: billing, strip_prefix: /pay, host: pay.internal }}\n"
        ));
        assert!(problems.is_empty(), "{problems:?}");
        let settings = settings.expect("it compiles");
        assert_eq!(settings.name.as_deref(), Some("billing"));
        assert_eq!(settings.strip_prefix.as_deref(), Some("/pay"));
        assert_eq!(
            settings.host,
            Some(HeaderValue::from_static("pay.internal"))
        );
        let (settings, _) = named(&format!("{BILLING}upstream: {{ use: billing }}\n"));
        assert_eq!(
            settings.and_then(|s| s.host),
            Some(HeaderValue::from_static("b.internal")),
            "the upstream's host when the route gives none"
        );
    }

    #[test]
    fn every_mistake_with_named_upstreams_is_named_with_its_path() {
        let (_, problems) = named(&format!("{BILLING}upstream: bililng\n"));
        assert_eq!(
            problems,
            ["routes[0].upstream: unknown upstream \"bililng\": use billing"]
        );
        let (_, problems) = named("upstream: billing\n");
        assert_eq!(
            problems,
            [
                "routes[0].upstream: unknown upstream \"billing\": no upstream is defined \
              (upstreams: at the top)"
            ]
        );
        let (settings, problems) = named(&format!(
            "{BILLING}upstream: {{ use: billing, retries: 3, servers: [127.0.0.1:3] }}\n"
        ));
        assert!(settings.is_none());
        assert_eq!(
            problems,
            [
                "routes[0].upstream.servers: the upstream's setting: set it on upstreams.billing, \
                 not beside use:",
                "routes[0].upstream.retries: the upstream's setting: set it on upstreams.billing, \
                 not beside use:",
            ]
        );
        let (_, problems) = named(
            "upstreams:\n  \"bad name\": { servers: [127.0.0.1:1] }\n  a: { use: b, strip_prefix: /x, servers: [127.0.0.1:1] }\nupstream: { servers: [127.0.0.1:1] }\n",
        );
        assert_eq!(
            problems,
            [
                "upstreams.a.use: an upstream names its servers, not another upstream",
                "upstreams.a.strip_prefix: a route's setting: give it beside use: on each route \
                 that wants it, e.g. upstream: { use: NAME, strip_prefix: /api }",
                "upstreams.bad name: invalid name \"bad name\": use 1 to 64 of A-Z a-z 0-9 _ . -",
            ]
        );
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
        assert_eq!(settings.retry.attempts, DEFAULT_RETRIES);
        assert!(settings.retry.retries_on(RetryCause::ConnectFailure));
        assert!(!settings.retry.retries_on(RetryCause::Http503));
        assert_eq!(settings.retry.budget, RetryBudgetRule::DEFAULT);
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
        let (_, problems) = upstream("servers: [127.0.0.1:1]\nbalance: random\nhash_key: [x]\n");
        assert_eq!(
            problems,
            ["routes[0].upstream.balance: unknown balance \"random\": use round_robin or consistent"]
        );
        let (_, problems) = upstream("servers: [127.0.0.1:1]\nhash_key: [client_ip]\n");
        assert_eq!(
            problems,
            ["routes[0].upstream.hash_key: applies only with balance: consistent"]
        );
    }

    #[test]
    fn retries_name_their_causes_and_budget_and_each_mistake_is_named() {
        let (settings, problems) = upstream(
            "servers: [127.0.0.1:1, 127.0.0.1:2]\nretries: 2\nretry_on: [connect_failure, reset, timeout, http_503]\nretry_budget: { percent: 10, min_concurrency: 1 }\n",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let retry = settings.expect("it compiles").retry;
        assert_eq!(retry.attempts, 2);
        assert!(retry.retries_on(RetryCause::Http503) && retry.retries_on(RetryCause::Timeout));
        assert!(!retry.retries_on(RetryCause::Http502));
        assert_eq!(
            retry.budget,
            RetryBudgetRule {
                percent: 10,
                min_concurrency: 1
            }
        );
        let (settings, problems) = upstream(
            "servers: [127.0.0.1:1]\nretry_on: [http_503, 500]\nretry_budget: { percent: 120, min_concurrency: 20000 }\n",
        );
        assert!(settings.is_none());
        assert_eq!(
            problems,
            [
                "routes[0].upstream.retry_on[1]: unknown retry cause \"500\": use connect_failure, \
                 reset, timeout, http_502, http_503 or http_504",
                "routes[0].upstream.retry_budget.percent: must be between 0 and 100, got 120",
                "routes[0].upstream.retry_budget.min_concurrency: must be between 0 and 10000, \
                 got 20000",
            ]
        );
    }

    #[test]
    fn passive_health_is_on_by_default_and_its_mistakes_are_named() {
        let (settings, _) = upstream("servers: [127.0.0.1:1]\n");
        let settings = settings.expect("it compiles");
        assert_eq!(settings.passive_health, Some(PassiveHealth::DEFAULT));
        let (settings, _) =
            upstream("servers: [127.0.0.1:1]\npassive_health: { enabled: false }\n");
        assert_eq!(settings.expect("it compiles").passive_health, None);
        let (settings, _) = upstream(
            "servers: [127.0.0.1:1]\npassive_health: { consecutive_failures: 3, base_ejection_ms: 1000, max_ejection_ms: 5000, max_ejected_percent: 20 }\n",
        );
        let rule = settings.and_then(|s| s.passive_health).expect("on");
        assert_eq!(
            (
                rule.consecutive_failures,
                rule.base_ejection,
                rule.max_ejection,
                rule.max_ejected_percent
            ),
            (3, Duration::from_secs(1), Duration::from_secs(5), 20)
        );
        let (settings, problems) = upstream(
            "servers: [127.0.0.1:1]\npassive_health: { consecutive_failures: 0, max_ejected_percent: 101, base_ejection_ms: 0 }\n",
        );
        assert!(settings.is_none());
        assert_eq!(
            problems,
            [
                "routes[0].upstream.passive_health.consecutive_failures: must be between 1 and 1000, got 0",
                "routes[0].upstream.passive_health.max_ejected_percent: must be between 1 and 100, got 101",
                "routes[0].upstream.passive_health.base_ejection_ms: must be between 1 and 3600000 ms, got 0",
            ]
        );
        let (_, problems) = upstream(
            "servers: [127.0.0.1:1]\npassive_health: { base_ejection_ms: 5000, max_ejection_ms: 1000 }\n",
        );
        assert_eq!(
            problems,
            ["routes[0].upstream.passive_health.max_ejection_ms: must not be shorter than base_ejection_ms"]
        );
    }
}
