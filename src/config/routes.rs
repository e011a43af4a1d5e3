//! `routes[]`: names, matches (host, path or prefix, methods), limits, failure mode and
//! their own deadlines, and the `RateLimit-Policy` header each route sends.

use crate::limiter::regions::Regions;
use std::collections::HashSet;

use http::Method;

use super::adaptive;
use super::common::{CommonLimits, Found};
use super::identity::compile_auth;
use super::problem::{millis_within, required_name, Problems};
use super::raw::{RawLimit, RawMatch, RawRoute};
use super::tiers::{self, LimitVariants, TierSettings};
use super::upstreams::NamedUpstreams;
use crate::caller::consumers::{AuthMode, Verifiers};
use crate::limiter::{FailureMode, Limit};
use crate::route::keys::{canonical_parts, KeyPart, KeySecret, KeySpec, RouteKeys};
use crate::route::path::{normalize, PathRules};
use crate::route::table::{HostMatch, PathMatch, Route, RouteMatch};

const MAX_LIMITS_PER_ROUTE: usize = 16;

/// What every route inherits from the top of the file.
#[derive(Debug, Clone, Copy)]
pub struct RouteDefaults<'a> {
    pub key_prefix: &'a str,
    pub secret: KeySecret,
    /// Gateways sharing the limits: `failure_mode: local` enforces `limit / instances`.
    pub instances: u64,
    pub failure_mode: FailureMode,
    /// The plans routes may name, and the verifiers their `auth:` needs.
    pub verifiers: &'a Verifiers,
    /// The common limits routes may use (`limits:` at the top).
    pub common: &'a CommonLimits,
    /// The upstreams routes may name (`upstreams:` at the top).
    pub upstreams: &'a NamedUpstreams,
    /// The regions a global limit spans (`regions:`).
    pub regions: Option<&'a Regions>,
}

/// Limits keyed on the caller (`consumer`, `claim:NAME`) need a route that verifies callers
/// (each limit that compiled; one that did not was reported already).
fn check_callers_are_known(
    at: &str,
    limits: &[Option<LimitVariants>],
    mode: AuthMode,
    p: &mut Problems,
) {
    if mode != AuthMode::Off {
        return;
    }
    for (i, limit) in limits.iter().enumerate() {
        let Some(limit) = limit else {
            continue;
        };
        let spec = limit.written().1;
        if let Some(part) = spec.parts.iter().find(|part| part.is_caller()) {
            let field = if spec.common { "use" } else { "key" };
            p.add(
                format!("{at}.limits[{i}].{field}"),
                format!("{part} needs the route to verify callers: auth: required or optional"),
            );
        }
    }
}

pub fn compile(
    index: usize,
    raw: RawRoute,
    defaults: RouteDefaults<'_>,
    p: &mut Problems,
) -> Option<Route> {
    let at = &format!("routes[{index}]");
    let name = required_name(raw.name, &format!("{at}.name"), p);
    let matcher = compile_match(at, raw.matcher, p);
    let upstream = super::upstreams::compile(at, raw.upstream, defaults.upstreams, p);
    let limits = compile_limits(at, raw.limits, defaults, p);
    let failure_mode = raw
        .failure_mode
        .as_ref()
        .and_then(|mode| mode.known(&format!("{at}.failure_mode"), p));
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
    let auth = compile_auth(raw.auth, defaults.verifiers, &format!("{at}.auth"), p);
    // Every part of the route is checked, whichever of them failed.
    check_callers_are_known(at, &limits, auth.mode, p);
    let addresses = super::addresses::compile(&format!("{at}.addresses"), raw.addresses, p);
    let adaptive = adaptive::compile(at, raw.adaptive_concurrency, defaults.verifiers.plans(), p);
    let limits = limits.into_iter().collect::<Option<Vec<LimitVariants>>>();
    let (name, matcher, upstream, limits) = (name?, matcher?, upstream?, limits?);
    let specs: Vec<KeySpec> = limits.iter().map(|l| l.written().1.clone()).collect();
    let keys = RouteKeys::new(defaults.key_prefix, &name, defaults.secret, &specs);
    let settings = TierSettings {
        at,
        plans: defaults.verifiers.plans(),
        instances: defaults.instances,
        failure_mode: failure_mode.unwrap_or(defaults.failure_mode),
        deadline: limiter_timeout,
        shadow: raw.shadow.unwrap_or(false),
        rate_limit_headers: raw.rate_limit_headers.unwrap_or(true),
        keys: &keys,
    };
    let tiers = tiers::build(&limits, &settings, p);
    Some(Route {
        index,
        name: name.into(),
        matcher,
        upstream,
        tiers,
        auth,
        addresses,
        max_body_bytes: raw.max_body_bytes,
        request_timeout,
        adaptive: adaptive?,
    })
}

/// `limits:` of the route at `at`: at most [`MAX_LIMITS_PER_ROUTE`], each name once, split
/// limits cut into the same number of shards; each compiled as written and per plan and
/// consumer, or the common limit a `use:` entry names, `None` for one that does not compile
/// (its problems reported).
fn compile_limits(
    at: &str,
    raw: Vec<RawLimit>,
    defaults: RouteDefaults<'_>,
    p: &mut Problems,
) -> Vec<Option<LimitVariants>> {
    if raw.len() > MAX_LIMITS_PER_ROUTE {
        p.add(
            format!("{at}.limits"),
            format!("at most {MAX_LIMITS_PER_ROUTE} limits per route"),
        );
    }
    let mut limit_names = HashSet::new();
    for (i, raw_limit) in raw.iter().enumerate() {
        if let Some(name) = raw_limit.name.as_ref().or(raw_limit.uses.as_ref()) {
            if !limit_names.insert(name.clone()) {
                p.add(
                    format!("{at}.limits[{i}].name"),
                    format!("duplicate limit name {name:?} in this route"),
                );
            }
        }
    }
    let compiled: Vec<Option<LimitVariants>> = raw
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            let at = format!("{at}.limits[{i}]");
            match raw.uses.clone() {
                Some(name) => used(&at, &name, &raw, defaults.common, p),
                None => tiers::compile_variants(
                    &at,
                    raw,
                    defaults.verifiers.plans(),
                    defaults.regions,
                    p,
                ),
            }
        })
        .collect();
    let written: Vec<(&Limit, &KeySpec)> = compiled.iter().flatten().map(|l| l.written()).collect();
    let specs: Vec<&KeySpec> = written.iter().map(|(_, spec)| *spec).collect();
    check_shards(at, &specs, p);
    check_common(at, &written, p);
    compiled
}

/// The common limit a route's `use:` entry (at `at`) names; the entry names nothing else.
fn used(
    at: &str,
    name: &str,
    raw: &RawLimit,
    common: &CommonLimits,
    p: &mut Problems,
) -> Option<LimitVariants> {
    for field in raw.fields_beside_use() {
        p.add(
            format!("{at}.{field}"),
            "a use: entry names a common limit and nothing else: set it where the limit is defined",
        );
    }
    match common.find(name) {
        Found::Limit(limit) => Some(limit.clone()),
        Found::Broken => None,
        Found::Unknown(words) => {
            p.add(format!("{at}.use"), words);
            None
        }
    }
}

/// A route that uses common limits keys every limit under their parts (`route::keys`): its
/// common limits are keyed on the same parts, it has no split limit, and each limit of its own
/// counted in Redis is keyed on at least those parts, so one caller's keys of one call share
/// one Redis Cluster slot on every route.
fn check_common(at: &str, limits: &[(&Limit, &KeySpec)], p: &mut Problems) {
    let mut common = limits.iter().filter(|(_, spec)| spec.common);
    let Some((_, first)) = common.next() else {
        return;
    };
    let parts = canonical_parts(&first.parts);
    let named = |parts: &[KeyPart]| -> String {
        let names: Vec<String> = parts.iter().map(ToString::to_string).collect();
        format!("[{}]", names.join(", "))
    };
    for (limit, spec) in common {
        if canonical_parts(&spec.parts) != parts {
            p.add(
                format!("{at}.limits"),
                format!(
                    "the common limits a route uses must be keyed on the same parts: {} is keyed on {}, another on {}",
                    limit.name, named(&spec.parts), named(&parts)
                ),
            );
        }
    }
    if limits.iter().any(|(_, spec)| spec.shards > 1) {
        p.add(
            format!("{at}.limits"),
            "a route that uses a common limit cannot have split limits: each shard is a slot of its own",
        );
    }
    for (limit, spec) in limits
        .iter()
        .filter(|(_, spec)| !spec.common && !spec.local)
    {
        let missing: Vec<KeyPart> = parts
            .iter()
            .filter(|part| !spec.parts.contains(part))
            .cloned()
            .collect();
        if !missing.is_empty() {
            p.add(
                format!("{at}.limits"),
                format!(
                    "limit {} lacks {} of the common limits' key {}: every limit of a route that uses a common limit is counted in that caller's Redis Cluster slot (add the parts, or scope: local)",
                    limit.name, named(&missing), named(&parts)
                ),
            );
        }
    }
}

/// One request's keys are cut into one number of shards: split limits of a route agree.
fn check_shards(at: &str, key_specs: &[&KeySpec], p: &mut Problems) {
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
}

/// `match:`: the path (exact or prefix), the host and the methods; `None` if any is wrong. A
/// route without one matches every request (`path_prefix: /`, any host, any method).
fn compile_match(at: &str, raw: Option<RawMatch>, p: &mut Problems) -> Option<RouteMatch> {
    let raw = raw.unwrap_or_default();
    let path = compile_path(at, raw.path, raw.path_prefix, p);
    let host = raw.host.map(|host| compile_host(at, host, p).ok_or(()));
    let methods = raw
        .methods
        .map(|list| compile_methods(at, &list, p).ok_or(()));
    Some(RouteMatch {
        path: path?,
        host: host.transpose().ok()?,
        methods: methods.transpose().ok()?,
    })
}

/// `match.path` or `match.path_prefix` (default `/`), which must be normalized: requests are
/// matched on their normalized path, so a pattern that is not could never match.
fn compile_path(
    at: &str,
    exact: Option<String>,
    prefix: Option<String>,
    p: &mut Problems,
) -> Option<PathMatch> {
    let (path, field) = match (exact, prefix) {
        (Some(_), Some(_)) => {
            p.add(
                format!("{at}.match"),
                "path and path_prefix are exclusive: use one",
            );
            return None;
        }
        (Some(exact), None) => (PathMatch::Exact(exact), "path"),
        (None, prefix) => (
            PathMatch::Prefix(prefix.unwrap_or_else(|| "/".to_string())),
            "path_prefix",
        ),
    };
    let (PathMatch::Exact(text) | PathMatch::Prefix(text)) = &path;
    let policy = PathRules {
        keep_encoded_slash: true,
    };
    match normalize(text, policy) {
        Ok(normal) if normal == text.as_str() => Some(path),
        _ => {
            p.add(
                format!("{at}.match.{field}"),
                format!("must be a normalized absolute path starting with '/', got {text:?}"),
            );
            None
        }
    }
}

/// `match.host`: a DNS name (any case, trailing dot ignored), or `*.suffix`.
fn compile_host(at: &str, host: String, p: &mut Problems) -> Option<HostMatch> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let (suffix, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host.as_str()),
    };
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !valid {
        p.add(
            format!("{at}.match.host"),
            format!("invalid host {host:?}: a DNS name without port, or *.suffix"),
        );
        return None;
    }
    Some(if suffix {
        HostMatch::Suffix(format!(".{name}"))
    } else {
        HostMatch::Exact(host)
    })
}

/// `match.methods`: HTTP methods, any case; every invalid one reported.
fn compile_methods(at: &str, list: &[String], p: &mut Problems) -> Option<Vec<Method>> {
    let methods: Vec<Method> = list
        .iter()
        .enumerate()
        .filter_map(
            |(i, m)| match Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                Ok(method) => Some(method),
                Err(_) => {
                    p.add(
                        format!("{at}.match.methods[{i}]"),
                        format!("invalid HTTP method {m:?}"),
                    );
                    None
                }
            },
        )
        .collect();
    (methods.len() == list.len()).then_some(methods)
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
            verifiers: &Verifiers::default(),
            common: &CommonLimits::default(),
            upstreams: &NamedUpstreams::default(),
            regions: None,
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
        let tier = compiled.tiers.default();
        assert_eq!(tier.rules.failure_mode(), FailureMode::Deny);
        assert_eq!(tier.limits.len(), 2);
        assert_eq!(
            tier.policy_header.clone().unwrap(),
            "\"a\";q=10;w=1",
            "concurrency is not a rate"
        );
    }

    #[test]
    fn a_route_without_match_serves_every_request() {
        let (compiled, problems) = route(&format!("name: all\n{UPSTREAM}"));
        assert!(problems.is_empty(), "{problems:?}");
        let matcher = compiled.unwrap().matcher;
        assert_eq!(matcher.path, PathMatch::Prefix("/".into()));
        assert!(matcher.host.is_none() && matcher.methods.is_none());
    }

    #[test]
    fn matches_names_and_route_settings_are_checked() {
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
