//! `routes[]`: names, matches (host, path or prefix, methods), limits, failure mode and
//! deadline overrides, and the `RateLimit-Policy` header each route sends.

use std::collections::HashSet;

use http::header::HeaderValue;
use http::Method;

use super::problem::{check_name, millis_within, Problems};
use super::raw::{RawMatch, RawRoute};
use crate::keys::{KeySecret, RouteKeys};
use crate::limiter::{FailureMode, Limit, LimitSet};
use crate::path::{normalize, PathPolicy};
use crate::router::{HostMatch, PathMatch, Route, RouteMatch};

const MAX_LIMITS_PER_ROUTE: usize = 16;

/// What every route inherits from the top of the file.
#[derive(Debug, Clone, Copy)]
pub struct RouteDefaults<'a> {
    pub key_prefix: &'a str,
    pub secret: KeySecret,
    /// Gateways sharing the limits: `failure_mode: local` enforces `limit / instances`.
    pub instances: u64,
    pub failure_mode: FailureMode,
}

pub fn compile(
    index: usize,
    raw: RawRoute,
    defaults: RouteDefaults<'_>,
    p: &mut Problems,
) -> Option<Route> {
    let at = &format!("routes[{index}]");
    let name = match raw.name {
        Some(name) => check_name(&name, &format!("{at}.name"), p).then_some(name),
        None => {
            p.add(format!("{at}.name"), "required");
            None
        }
    };
    let matcher = compile_match(at, raw.matcher, p);
    let upstream = super::upstreams::compile(at, raw.upstream, p);

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
    let limiter_timeout = raw
        .limiter_timeout_ms
        .and_then(|ms| millis_within(ms, 1..=10_000, &format!("{at}.limiter_timeout_ms"), p));
    let request_timeout = raw
        .request_timeout_ms
        .and_then(|ms| millis_within(ms, 1..=86_400_000, &format!("{at}.request_timeout_ms"), p));
    if raw.max_body_bytes == Some(0) {
        p.add(
            format!("{at}.max_body_bytes"),
            "must be at least 1 (omit it for no limit)",
        );
    }
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
        keys: RouteKeys::new(defaults.key_prefix, &name, defaults.secret, &key_specs),
        name: name.into(),
        matcher,
        upstream,
        limits: LimitSet::new(
            limits,
            defaults.instances,
            route_failure_mode.unwrap_or(defaults.failure_mode),
            limiter_timeout,
        ),
        policy_header,
        max_body_bytes: raw.max_body_bytes,
        request_timeout,
    })
}

/// `failure_mode:` at `at`, when set.
pub fn failure_mode(text: Option<&str>, at: &str, p: &mut Problems) -> Option<FailureMode> {
    let text = text?;
    let mode = FailureMode::parse(text);
    if mode.is_none() {
        p.add(
            at,
            format!("unknown failure mode {text:?}: use {}", FailureMode::NAMES),
        );
    }
    mode
}

fn compile_match(at: &str, raw: Option<RawMatch>, p: &mut Problems) -> Option<RouteMatch> {
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
    match normalize(
        text,
        PathPolicy {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn route(yaml: &str) -> (Option<Route>, Vec<String>) {
        let defaults = RouteDefaults {
            key_prefix: "t",
            secret: KeySecret::new("s"),
            instances: 2,
            failure_mode: FailureMode::Deny,
        };
        problems_of(yaml, |raw: RawRoute, p: &mut Problems| {
            compile(3, raw, defaults, p)
        })
    }

    const UPSTREAM: &str = "upstream: { servers: [127.0.0.1:1] }\n";

    #[test]
    fn a_route_inherits_the_failure_mode_and_sends_its_policy() {
        let (compiled, problems) = route(&format!(
            "name: api\nmatch: {{ path_prefix: /api/ }}\n{UPSTREAM}limits:\n  - {{ name: a, rate: 10/s }}\n  - {{ name: b, algorithm: concurrency, max: 2 }}\n"
        ));
        assert!(problems.is_empty(), "{problems:?}");
        let compiled = compiled.unwrap();
        assert_eq!(compiled.limits.failure_mode(), FailureMode::Deny);
        assert_eq!(compiled.limits.len(), 2);
        assert_eq!(
            compiled.policy_header.unwrap(),
            "\"a\";q=10;w=1",
            "concurrency is not a rate"
        );
    }

    #[test]
    fn matches_names_and_overrides_are_checked() {
        let (compiled, problems) = route(&format!(
            "name: \"a b\"\nmatch: {{ path: /x, path_prefix: /y, host: \"bad host\", methods: [\"G T\"] }}\n{UPSTREAM}failure_mode: maybe\nlimiter_timeout_ms: 0\nlimits:\n  - {{ name: l, rate: 1/s }}\n  - {{ name: l, rate: 1/s }}\n"
        ));
        assert!(compiled.is_none());
        assert_eq!(
            problems,
            [
                "routes[3].name: invalid name \"a b\": use 1 to 64 of A-Z a-z 0-9 _ . -",
                "routes[3].match: path and path_prefix are exclusive: use one",
                "routes[3].match.host: invalid host \"bad host\": a DNS name without port, or *.suffix",
                "routes[3].match.methods[0]: invalid HTTP method \"G T\"",
                "routes[3].limits[1].name: duplicate limit name \"l\" in this route",
                "routes[3].failure_mode: unknown failure mode \"maybe\": use allow, deny or local",
                "routes[3].limiter_timeout_ms: must be between 1 and 10000 ms, got 0",
            ]
        );
    }

    #[test]
    fn a_pattern_that_is_not_normalized_could_never_match() {
        let (_, problems) = route(&format!(
            "name: r\nmatch: {{ path_prefix: /a/../b }}\n{UPSTREAM}"
        ));
        assert_eq!(
            problems,
            ["routes[3].match.path_prefix: must be a normalized absolute path starting with '/', got \"/a/../b\""]
        );
    }
}
