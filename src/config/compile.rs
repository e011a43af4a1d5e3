//! Raw YAML structs → validated [`Config`], collecting every problem with its path.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use http::header::HeaderValue;
use http::Method;

use super::raw::{RawConfig, RawRedis, RawRoute, RawServer};
use super::{Config, FailureMode, Problem, RedisSettings, ServerSettings, Topology};
use ipnet::IpNet;

use crate::identity::{Identity, DEFAULT_IPV6_PREFIX};
use crate::keys::{KeyPart, KeySecret, RouteKeys};
use crate::limiter::{Algorithm, Limit};
use crate::path::PathPolicy;
use crate::router::{HostMatch, PathMatch, Route, RouteMatch, RouteTable};
use crate::upstream::{Balance, Upstream, UpstreamSettings};

pub const DEFAULT_REDIS_TIMEOUT_MS: u64 = 25;
pub const DEFAULT_KEY_PREFIX: &str = "sluice";
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 1_000;
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 30_000;
/// Other servers tried after a connection failure.
pub const DEFAULT_RETRIES: usize = 1;
const MAX_LIMITS_PER_ROUTE: usize = 16;
const MAX_NAME_LEN: usize = 64;

pub(crate) struct Problems<'a>(pub(crate) &'a mut Vec<Problem>);

impl Problems<'_> {
    pub(crate) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem::new(path, message));
    }
}

/// Compiles `raw`; returns `None` or a config, and appends every problem found to `problems`.
pub fn compile(source: &Path, raw: RawConfig, problems: &mut Vec<Problem>) -> Option<Config> {
    let mut p = Problems(problems);
    let server = compile_server(raw.server, &mut p);

    if raw.listen.is_empty() {
        p.add(
            "listen",
            "at least one listen address is required, e.g. [0.0.0.0:8080]",
        );
    }
    let listen: Vec<SocketAddr> = raw
        .listen
        .iter()
        .enumerate()
        .filter_map(|(i, text)| socket_addr(text, &format!("listen[{i}]"), &mut p))
        .collect();
    let admin_listen = raw
        .admin
        .and_then(|admin| admin.listen)
        .and_then(|text| socket_addr(&text, "admin.listen", &mut p));

    let redis = raw.redis.map(|redis| {
        let topology = compile_topology(&redis, &mut p);
        let timeout_ms = redis.timeout_ms.unwrap_or(DEFAULT_REDIS_TIMEOUT_MS);
        if !(1..=10_000).contains(&timeout_ms) {
            p.add(
                "redis.timeout_ms",
                format!("must be between 1 and 10000 ms, got {timeout_ms}"),
            );
        }
        let key_prefix = redis
            .key_prefix
            .unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_string());
        check_name(&key_prefix, "redis.key_prefix", &mut p);
        RedisSettings {
            topology,
            timeout: Duration::from_millis(timeout_ms),
            key_prefix,
        }
    });
    let key_prefix = redis
        .as_ref()
        .map_or(DEFAULT_KEY_PREFIX, |r| r.key_prefix.as_str())
        .to_string();

    let failure_mode = failure_mode(raw.failure_mode.as_deref(), "failure_mode", &mut p)
        .unwrap_or(FailureMode::Allow);

    // Without a configured secret the prefix keys the hashes: set key_secret in production.
    let secret = KeySecret::new(raw.key_secret.as_deref().unwrap_or(&key_prefix));
    let identity = compile_identity(&raw.trusted_proxies, raw.ipv6_prefix, &mut p);
    let paths = match raw.path.and_then(|path| path.encoded_slash).as_deref() {
        None | Some("reject") => PathPolicy {
            keep_encoded_slash: false,
        },
        Some("keep") => PathPolicy {
            keep_encoded_slash: true,
        },
        Some(other) => {
            p.add(
                "path.encoded_slash",
                format!("unknown value {other:?}: use reject or keep"),
            );
            PathPolicy::default()
        }
    };

    let instances = raw.instances.unwrap_or(1);
    if !(1..=10_000).contains(&instances) {
        p.add(
            "instances",
            format!("must be between 1 and 10000, got {instances}"),
        );
    }
    let access_log_sample = raw.access_log.and_then(|log| {
        let sample = log.sample.unwrap_or(1);
        if sample == 0 {
            p.add(
                "access_log.sample",
                "must be at least 1 (log 1 request in N)",
            );
        }
        log.enabled.unwrap_or(false).then_some(sample.max(1))
    });

    if raw.routes.is_empty() {
        p.add("routes", "at least one route is required");
    }
    let mut names = HashSet::new();
    let mut routes = Vec::new();
    for (index, raw_route) in raw.routes.into_iter().enumerate() {
        let at = format!("routes[{index}]");
        if let Some(name) = &raw_route.name {
            if !names.insert(name.clone()) {
                p.add(
                    format!("{at}.name"),
                    format!("duplicate route name {name:?}"),
                );
            }
        }
        if let Some(route) = compile_route(
            index,
            &at,
            raw_route,
            &key_prefix,
            secret,
            instances,
            &mut p,
        ) {
            routes.push(route);
        }
    }

    if !p.0.is_empty() {
        return None;
    }
    Some(Config {
        source: source.to_path_buf(),
        server,
        listen,
        admin_listen,
        redis,
        failure_mode,
        identity,
        paths,
        access_log_sample,
        routes: RouteTable::new(routes),
    })
}

fn failure_mode(text: Option<&str>, at: &str, p: &mut Problems<'_>) -> Option<FailureMode> {
    match text? {
        "allow" => Some(FailureMode::Allow),
        "deny" => Some(FailureMode::Deny),
        "local" => Some(FailureMode::Local),
        other => {
            p.add(
                at,
                format!("unknown failure mode {other:?}: use allow, deny or local"),
            );
            None
        }
    }
}

fn compile_identity(trusted: &[String], ipv6_prefix: Option<u8>, p: &mut Problems<'_>) -> Identity {
    let nets = trusted
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let parsed = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<IpAddr>().map(IpNet::from));
            match parsed {
                Ok(net) => Some(net.trunc()),
                Err(_) => {
                    p.add(
                        format!("trusted_proxies[{i}]"),
                        format!("invalid address or CIDR {text:?}"),
                    );
                    None
                }
            }
        })
        .collect();
    let prefix = ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
    if !(1..=128).contains(&prefix) {
        p.add(
            "ipv6_prefix",
            format!("must be between 1 and 128, got {prefix}"),
        );
    }
    Identity::new(nets, prefix)
}

fn compile_server(raw: RawServer, p: &mut Problems<'_>) -> ServerSettings {
    if let Some(threads) = raw.threads {
        if !(1..=1024).contains(&threads) {
            p.add(
                "server.threads",
                format!("must be between 1 and 1024, got {threads}"),
            );
        }
    }
    ServerSettings {
        threads: raw.threads,
        pid_file: raw.pid_file,
        upgrade_sock: raw.upgrade_sock,
        error_log: raw.error_log,
        user: raw.user,
        group: raw.group,
        daemon: raw.daemon.unwrap_or(false),
        work_stealing: raw.work_stealing,
        grace_period_seconds: raw.grace_period_seconds,
        graceful_shutdown_timeout_seconds: raw.graceful_shutdown_timeout_seconds,
        upstream_keepalive_pool_size: raw.upstream_keepalive_pool_size,
    }
}

fn socket_addr(text: &str, at: &str, p: &mut Problems<'_>) -> Option<SocketAddr> {
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            p.add(
                at,
                format!("invalid address {text:?}: expected IP:PORT, e.g. 127.0.0.1:8080"),
            );
            None
        }
    }
}

/// `redis.mode` and the addresses that mode needs; every problem reported.
fn compile_topology(redis: &RawRedis, p: &mut Problems) -> Topology {
    let mode = redis.mode.as_deref().unwrap_or("standalone");
    let check_url = |url: &str, path: &str, p: &mut Problems| {
        if let Err(e) = redis::Client::open(url) {
            p.add(path, format!("invalid redis URL: {e}"));
        }
    };
    let check_list = |list: &Option<Vec<String>>, path: &str, p: &mut Problems| -> Vec<String> {
        let list = list.clone().unwrap_or_default();
        if list.is_empty() {
            p.add(
                path,
                format!("required in {mode} mode: a list of redis:// URLs"),
            );
        }
        for (i, url) in list.iter().enumerate() {
            check_url(url, &format!("{path}[{i}]"), p);
        }
        list
    };
    // Every mode-specific key, and the modes that use it.
    let mode_keys: [(&str, bool, &[&str]); 6] = [
        ("url", redis.url.is_some(), &["standalone"]),
        ("nodes", redis.nodes.is_some(), &["cluster"]),
        ("sentinels", redis.sentinels.is_some(), &["sentinel"]),
        ("master_name", redis.master_name.is_some(), &["sentinel"]),
        (
            "master_username",
            redis.master_username.is_some(),
            &["sentinel"],
        ),
        (
            "master_password",
            redis.master_password.is_some(),
            &["sentinel"],
        ),
    ];
    if matches!(mode, "standalone" | "cluster" | "sentinel") {
        for (key, present, modes) in mode_keys {
            if present && !modes.contains(&mode) {
                p.add(format!("redis.{key}"), format!("not used in {mode} mode"));
            }
        }
    }
    match mode {
        "standalone" => {
            let url = redis.url.clone().unwrap_or_default();
            if url.is_empty() {
                p.add("redis.url", "required when the redis section is present (omit the section for in-process limits)");
            } else {
                check_url(&url, "redis.url", p);
            }
            Topology::Standalone { url }
        }
        "cluster" => Topology::Cluster {
            nodes: check_list(&redis.nodes, "redis.nodes", p),
        },
        "sentinel" => {
            let sentinels = check_list(&redis.sentinels, "redis.sentinels", p);
            let master_name = redis.master_name.clone().unwrap_or_default();
            if master_name.is_empty() {
                p.add(
                    "redis.master_name",
                    "required in sentinel mode: the name the sentinels monitor",
                );
            }
            Topology::Sentinel {
                sentinels,
                master_name,
                master_username: redis.master_username.clone(),
                master_password: redis.master_password.clone(),
            }
        }
        other => {
            p.add(
                "redis.mode",
                format!("unknown mode {other:?}: use standalone, cluster or sentinel"),
            );
            Topology::Standalone { url: String::new() }
        }
    }
}

/// Names end up in Redis keys and response headers: a short, safe alphabet, no braces.
pub(crate) fn check_name(name: &str, at: &str, p: &mut Problems<'_>) -> bool {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !ok {
        p.add(
            at,
            format!("invalid name {name:?}: use 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 _ . -"),
        );
    }
    ok
}

fn compile_route(
    index: usize,
    at: &str,
    raw: RawRoute,
    key_prefix: &str,
    secret: KeySecret,
    instances: u64,
    p: &mut Problems<'_>,
) -> Option<Route> {
    let name = match raw.name {
        Some(name) => check_name(&name, &format!("{at}.name"), p).then_some(name),
        None => {
            p.add(format!("{at}.name"), "required");
            None
        }
    };
    let matcher = compile_match(at, raw.matcher, p);
    let upstream = compile_upstream(at, raw.upstream, p);

    if raw.limits.len() > MAX_LIMITS_PER_ROUTE {
        p.add(
            format!("{at}.limits"),
            format!("at most {MAX_LIMITS_PER_ROUTE} limits per route"),
        );
    }
    let mut limit_names = HashSet::new();
    let mut limits = Vec::new();
    let mut key_specs = Vec::new();
    for (i, raw_limit) in raw.limits.into_iter().enumerate() {
        let limit_at = format!("{at}.limits[{i}]");
        if let Some(name) = &raw_limit.name {
            if !limit_names.insert(name.clone()) {
                p.add(
                    format!("{limit_at}.name"),
                    format!("duplicate limit name {name:?} in this route"),
                );
            }
        }
        if let Some((limit, spec)) = super::limits::compile_limit(&limit_at, raw_limit, p) {
            key_specs.push(spec);
            limits.push(limit);
        }
    }

    let mut splits: Vec<u32> = key_specs
        .iter()
        .map(|s| s.shards)
        .filter(|&n| n > 1)
        .collect();
    splits.sort_unstable();
    splits.dedup();
    if splits.len() > 1 {
        p.add(
            format!("{at}.limits"),
            format!(
                "split limits of one route must have the same number of shards, got {splits:?}"
            ),
        );
    }

    let route_failure_mode = failure_mode(
        raw.failure_mode.as_deref(),
        &format!("{at}.failure_mode"),
        p,
    );
    let limiter_timeout = raw.limiter_timeout_ms.and_then(|ms| {
        if (1..=10_000).contains(&ms) {
            Some(Duration::from_millis(ms))
        } else {
            p.add(
                format!("{at}.limiter_timeout_ms"),
                format!("must be between 1 and 10000 ms, got {ms}"),
            );
            None
        }
    });
    let (name, matcher, upstream) = (name?, matcher?, upstream?);
    if raw.shadow.unwrap_or(false) {
        for limit in &mut limits {
            limit.shadow = true;
        }
    }
    let policy_header = if raw.rate_limit_headers.unwrap_or(true) {
        policy_header(&limits)
    } else {
        None
    };
    Some(Route {
        index,
        keys: RouteKeys::new(key_prefix, &name, secret, &key_specs),
        name: name.into(),
        matcher,
        upstream,
        needs_request_id: limits.iter().any(|l| l.algorithm.needs_request_id()),
        failure_mode: route_failure_mode,
        limiter_timeout,
        local_limits: limits.iter().map(|l| l.share(instances)).collect(),
        holds_leases: limits
            .iter()
            .any(|l| matches!(l.algorithm, Algorithm::Concurrency { .. })),
        limits: limits.into(),
        policy_header,
    })
}

fn compile_match(
    at: &str,
    raw: Option<super::raw::RawMatch>,
    p: &mut Problems<'_>,
) -> Option<RouteMatch> {
    let Some(raw) = raw else {
        p.add(
            format!("{at}.match"),
            "required, e.g. { path_prefix: /api/ }",
        );
        return None;
    };
    let mut ok = true;
    let path = match (raw.path, raw.path_prefix) {
        (Some(_), Some(_)) => {
            p.add(
                format!("{at}.match"),
                "path and path_prefix are exclusive: use one",
            );
            ok = false;
            PathMatch::Prefix("/".to_string())
        }
        (Some(exact), None) => PathMatch::Exact(exact),
        (None, prefix) => PathMatch::Prefix(prefix.unwrap_or_else(|| "/".to_string())),
    };
    let (field, text) = match &path {
        PathMatch::Exact(p) => ("path", p),
        PathMatch::Prefix(p) => ("path_prefix", p),
    };
    // Requests are matched on their normalized path: a pattern that is not normalized could
    // never match.
    match crate::path::normalize(
        text,
        crate::path::PathPolicy {
            keep_encoded_slash: true,
        },
    ) {
        Ok(normal) if normal == text.as_str() => {}
        _ => {
            p.add(
                format!("{at}.match.{field}"),
                format!("must be a normalized absolute path starting with '/', got {text:?}"),
            );
            ok = false;
        }
    }
    let host = raw
        .host
        .map(|h| h.trim_end_matches('.').to_ascii_lowercase());
    let host = match host {
        None => None,
        Some(host) => {
            let (suffix, name) = match host.strip_prefix("*.") {
                Some(rest) => (true, rest),
                None => (false, host.as_str()),
            };
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                p.add(
                    format!("{at}.match.host"),
                    format!("invalid host {host:?}: a DNS name without port, or *.suffix"),
                );
                ok = false;
            }
            Some(if suffix {
                HostMatch::Suffix(format!(".{name}"))
            } else {
                HostMatch::Exact(host)
            })
        }
    };
    let methods = raw.methods.map(|list| {
        list.iter()
            .enumerate()
            .filter_map(
                |(i, m)| match Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                    Ok(method) => Some(method),
                    Err(_) => {
                        p.add(
                            format!("{at}.match.methods[{i}]"),
                            format!("invalid HTTP method {m:?}"),
                        );
                        ok = false;
                        None
                    }
                },
            )
            .collect()
    });
    ok.then_some(RouteMatch {
        path,
        host,
        methods,
    })
}

fn compile_upstream(
    at: &str,
    raw: Option<super::raw::RawUpstream>,
    p: &mut Problems<'_>,
) -> Option<Upstream> {
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
    let mut millis = |value: Option<u64>, default: u64, field: &str, p: &mut Problems<'_>| {
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
    if !ok {
        return None;
    }
    let settings = UpstreamSettings {
        servers,
        balance,
        health_check,
        connect_timeout,
        read_timeout,
        retries,
        strip_prefix: raw.strip_prefix,
        host,
    };
    Upstream::new(settings)
        .map_err(|e| {
            p.add(
                format!("{at}.upstream.servers"),
                format!("cannot build the pool: {e}"),
            )
        })
        .ok()
}

/// `"a";q=10;w=1, "b";q=100;w=60`: the IETF httpapi RateLimit-Policy list, built once.
/// Limits that are not rates (concurrency) are not listed.
fn policy_header(limits: &[Limit]) -> Option<HeaderValue> {
    let items: Vec<String> = limits
        .iter()
        .filter(|l| !l.shadow)
        .filter_map(|l| l.policy.map(|(q, w)| format!("\"{}\";q={q};w={w}", l.name)))
        .collect();
    if items.is_empty() {
        return None;
    }
    // Names are checked to be a safe ASCII subset, so this cannot fail.
    HeaderValue::from_str(&items.join(", ")).ok()
}
