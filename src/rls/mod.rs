//! Envoy's rate limit service, the domain side: envoyproxy/ratelimit's configuration format as is
//! (a directory of YAML files, one `domain` each, with nested `descriptors` of `key`/`value`,
//! `rate_limit: { unit, requests_per_unit, unlimited, name, replaces }`, `shadow_mode`,
//! `detailed_metric`), and how a request's descriptors find their limits and keys.
//!
//! Matching is envoyproxy/ratelimit's: each entry of a descriptor descends one level, preferring
//! a node with the same key and value, then one whose value ends in `*` and prefixes it, else a
//! node with the key alone (any value; each value then counts apart); the node reached by the
//! last entry holds the limit, if any. `requests_per_unit: 0` refuses every request (a block
//! list); `unlimited: true` admits every one without counting.

pub mod decide;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;

use crate::limiter::{push_hex, Algorithm, Key, Limit, Rate};

/// The most descriptors one request may carry, and entries one descriptor may have.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 16;
/// The longest domain, entry key or entry value accepted.
pub const MAX_TEXT: usize = 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDomain {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RawRateLimit>,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<String>,
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
    /// sluice's extension: the algorithm (default `fixed_window`, as envoyproxy/ratelimit).
    algorithm: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: String,
}

/// The time unit of a limit, with its `RateLimitResponse.RateLimit.Unit` number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The proto enum number (`envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`).
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }
}

/// What a matched descriptor is held to.
#[derive(Debug, Clone)]
pub enum Rule {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit, never counted.
    Blocked {
        name: String,
        unit: Unit,
    },
    Limited(Box<DescriptorLimit>),
}

/// A limit of the configuration, compiled for the limiter.
#[derive(Debug, Clone)]
pub struct DescriptorLimit {
    /// `name` of the rate limit, or the descriptor path (`key_value.key...`).
    pub name: String,
    pub requests_per_unit: u64,
    pub unit: Unit,
    pub limit: Limit,
    /// Names of the limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// Where the node sits in its domain (part of every key it counts under).
    id: u64,
}

#[derive(Debug, Default)]
struct Node {
    /// `(key, value)` → child.
    exact: HashMap<(String, String), Node>,
    /// `(key, value prefix)` of values written `prefix*`, in file order.
    wildcard: Vec<(String, String, Node)>,
    /// `key` (any value) → child.
    any: HashMap<String, Node>,
    rule: Option<Rule>,
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: String,
    root: Node,
}

impl Domain {
    /// The names of its limits (`rate_limit.name`, or the descriptor path), each once: the
    /// `limit` label of its metrics, bounded by the configuration (never a request's values).
    pub fn limit_names(&self) -> Vec<&str> {
        let mut names = Vec::new();
        let mut nodes = vec![&self.root];
        while let Some(node) = nodes.pop() {
            match &node.rule {
                Some(Rule::Limited(limit)) => names.push(limit.name.as_str()),
                Some(Rule::Blocked { name, .. }) => names.push(name.as_str()),
                Some(Rule::Unlimited) | None => {}
            }
            nodes.extend(node.exact.values());
            nodes.extend(node.wildcard.iter().map(|(_, _, child)| child));
            nodes.extend(node.any.values());
        }
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// Every domain of the configuration directory, by name.
#[derive(Debug, Default)]
pub struct Domains {
    by_name: HashMap<String, Domain>,
}

/// What is wrong with the configuration directory: one message per problem, each naming its
/// file and the path in it.
#[derive(Debug, Default)]
pub struct Problems(pub Vec<String>);

impl Problems {
    fn add(&mut self, message: String) {
        self.0.push(message);
    }
}

/// One entry of a request descriptor.
pub type Entry<'a> = (&'a str, &'a str);

impl Domains {
    /// Reads every `.yaml`/`.yml` file of `dir` (one domain each); every problem is added to `p`
    /// under `at` with the file it is in.
    pub fn load(dir: &Path, algorithm: &str, p: &mut Problems) -> Domains {
        let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|path| {
                    path.extension()
                        .is_some_and(|ext| ext == "yaml" || ext == "yml")
                })
                .collect(),
            Err(e) => {
                p.add(format!("cannot read {}: {e}", dir.display()));
                return Domains::default();
            }
        };
        files.sort();
        let mut domains = Domains::default();
        for file in files {
            let shown = file.display().to_string();
            let raw: RawDomain = match std::fs::read_to_string(&file)
                .map_err(|e| e.to_string())
                .and_then(|text| serde_yaml::from_str(&text).map_err(|e| e.to_string()))
            {
                Ok(raw) => raw,
                Err(e) => {
                    p.add(format!("{shown}: {e}"));
                    continue;
                }
            };
            if raw.domain.is_empty() {
                p.add(format!("{shown}: domain: must not be empty"));
                continue;
            }
            if domains.by_name.contains_key(&raw.domain) {
                p.add(format!("{shown}: domain {:?} is defined twice", raw.domain));
                continue;
            }
            let mut root = Node::default();
            let context = Context {
                file: &shown,
                algorithm,
                domain: &raw.domain,
            };
            for (i, raw) in raw.descriptors.into_iter().enumerate() {
                add(
                    &mut root,
                    raw,
                    &format!("descriptors[{i}]"),
                    "",
                    &context,
                    p,
                );
            }
            domains.by_name.insert(
                raw.domain.clone(),
                Domain {
                    name: raw.domain,
                    root,
                },
            );
        }
        domains
    }

    pub fn get(&self, name: &str) -> Option<&Domain> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Domain> {
        self.by_name.values()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

struct Context<'a> {
    file: &'a str,
    algorithm: &'a str,
    domain: &'a str,
}

fn add(
    parent: &mut Node,
    raw: RawDescriptor,
    path: &str,
    id_path: &str,
    cx: &Context,
    p: &mut Problems,
) {
    let problem = |p: &mut Problems, message: String| {
        p.add(format!("{}: {path}: {message}", cx.file));
    };
    if raw.key.is_empty() {
        problem(p, "key: must not be empty".to_string());
        return;
    }
    let id_path = match &raw.value {
        Some(value) => format!("{id_path}.{}_{value}", raw.key),
        None => format!("{id_path}.{}", raw.key),
    };
    let node = match raw.value {
        Some(value) => match value.strip_suffix('*') {
            Some(prefix) => {
                parent
                    .wildcard
                    .push((raw.key, prefix.to_string(), Node::default()));
                match parent.wildcard.last_mut() {
                    Some((_, _, node)) => node,
                    None => return,
                }
            }
            None => parent.exact.entry((raw.key, value)).or_default(),
        },
        None => parent.any.entry(raw.key).or_default(),
    };
    if node.rule.is_some() {
        problem(p, "the same key and value appear twice".to_string());
        return;
    }
    if let Some(rate) = raw.rate_limit {
        node.rule = compile_rule(rate, raw.shadow_mode, &id_path, path, cx, p);
    }
    // Every limit has its own series already (sluice_rls_limit_decisions_total); the
    // descriptor values detailed_metric would add are a request's bytes: never a label.
    let _ = raw.detailed_metric;
    for (i, child) in raw.descriptors.into_iter().enumerate() {
        add(
            node,
            child,
            &format!("{path}.descriptors[{i}]"),
            &id_path,
            cx,
            p,
        );
    }
}

fn compile_rule(
    raw: RawRateLimit,
    shadow: bool,
    id_path: &str,
    path: &str,
    cx: &Context,
    p: &mut Problems,
) -> Option<Rule> {
    let problem = |p: &mut Problems, message: String| {
        p.add(format!("{}: {path}.rate_limit: {message}", cx.file));
    };
    if raw.unlimited {
        return Some(Rule::Unlimited);
    }
    let Some(unit) = raw.unit.as_deref().and_then(Unit::parse) else {
        problem(
            p,
            format!(
                "unit {:?}: use second, minute, hour, day, week, month or year",
                raw.unit.unwrap_or_default()
            ),
        );
        return None;
    };
    let Some(count) = raw.requests_per_unit else {
        problem(p, "requests_per_unit: required".to_string());
        return None;
    };
    let name = raw
        .name
        .clone()
        .unwrap_or_else(|| format!("{}{id_path}", cx.domain));
    let Some(rate) = Rate::new(count, Duration::from_secs(unit.seconds())) else {
        return Some(Rule::Blocked { name, unit });
    };
    let algorithm_name = raw.algorithm.as_deref().unwrap_or(cx.algorithm);
    let Some(algorithm) = algorithm(algorithm_name, rate) else {
        problem(
            p,
            format!(
                "algorithm {algorithm_name:?}: use fixed_window, sliding_window, sliding_log (at most {} per unit) or gcra",
                crate::limiter::algorithm::MAX_SLIDING_LOG_LIMIT
            ),
        );
        return None;
    };
    let mut limit = Limit::new(&name, algorithm, 1, rate);
    limit.shadow = shadow;
    Some(Rule::Limited(Box::new(DescriptorLimit {
        id: xxhash_rust::xxh3::xxh3_64(format!("{}{id_path}", cx.domain).as_bytes()),
        name,
        requests_per_unit: count,
        unit,
        limit,
        replaces: raw.replaces.into_iter().map(|r| r.name).collect(),
    })))
}

/// The algorithm a descriptor limit runs: envoyproxy/ratelimit's fixed window by default;
/// `gcra` is a token bucket holding a whole unit's requests, refilled evenly.
fn algorithm(name: &str, rate: Rate) -> Option<Algorithm> {
    let count = rate.count.get();
    let window_us = rate.period_us();
    Some(match name {
        "fixed_window" => Algorithm::FixedWindow {
            limit: count,
            window_us,
        },
        "sliding_window" => Algorithm::SlidingWindow {
            limit: count,
            window_us,
        },
        "sliding_log" if count <= crate::limiter::algorithm::MAX_SLIDING_LOG_LIMIT => {
            Algorithm::SlidingLog {
                limit: count,
                window_us,
            }
        }
        "gcra" => {
            let emission_us = window_us.div_ceil(count);
            Algorithm::Gcra {
                emission_us,
                tolerance_us: emission_us.checked_mul(count)?,
                max_delay_us: 0,
            }
        }
        _ => return None,
    })
}

impl Domain {
    /// The rule of the node `entries` lead to, if any (envoyproxy/ratelimit's matching).
    pub fn rule(&self, entries: &[Entry<'_>]) -> Option<&Rule> {
        let mut node = &self.root;
        for (key, value) in entries {
            node = node
                .exact
                .get(&((*key).to_string(), (*value).to_string()))
                .or_else(|| {
                    node.wildcard
                        .iter()
                        .find(|(k, prefix, _)| k == key && value.starts_with(prefix.as_str()))
                        .map(|(_, _, child)| child)
                })
                .or_else(|| node.any.get(*key))?;
        }
        node.rule.as_ref()
    }
}

/// The counter key of `limit` for a descriptor with `entries` in `domain`: the key prefix, a
/// hash tag per domain (so one request's keys share a Redis Cluster slot), and a keyed digest
/// of the limit and the entries — never the client's bytes themselves.
pub fn key(
    prefix: &str,
    secret: (u64, u64),
    domain: &str,
    limit: &DescriptorLimit,
    entries: &[Entry<'_>],
) -> Key {
    let mut key = Key::new();
    key.extend_from_slice(prefix.as_bytes());
    key.extend_from_slice(b":{rls.");
    push_hex(
        &mut key,
        &xxhash_rust::xxh3::xxh3_64(domain.as_bytes()).to_be_bytes()[..4],
    );
    key.extend_from_slice(b"}:");
    push_hex(&mut key, &limit.id.to_be_bytes()[..4]);
    key.push(b':');
    let mut hasher = SipHasher13::new_with_keys(secret.0, secret.1);
    hasher.write(domain.as_bytes());
    hasher.write_u8(0xff);
    for (k, v) in entries {
        hasher.write_usize(k.len());
        hasher.write(k.as_bytes());
        hasher.write_usize(v.len());
        hasher.write(v.as_bytes());
    }
    push_hex(&mut key, &hasher.finish128().as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domains(files: &[(&str, &str)]) -> (Domains, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let mut p = Problems::default();
        let domains = Domains::load(dir.path(), "fixed_window", &mut p);
        (domains, p.0)
    }

    #[test]
    fn a_value_match_wins_over_a_key_match_and_nesting_descends() {
        let (domains, problems) = domains(&[(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: k\n    value: v\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n  - key: outer\n    descriptors:\n      - key: inner\n        rate_limit: { unlimited: true }\n",
        )]);
        assert!(problems.is_empty(), "{problems:?}");
        let d = domains.get("d").unwrap();
        let unit = |entries: &[Entry<'_>]| match d.rule(entries) {
            Some(Rule::Limited(l)) => Some(l.unit),
            _ => None,
        };
        assert_eq!(unit(&[("k", "v")]), Some(Unit::Minute));
        assert_eq!(unit(&[("k", "other")]), Some(Unit::Second));
        assert!(matches!(
            d.rule(&[("outer", "x"), ("inner", "y")]),
            Some(Rule::Unlimited)
        ));
        assert!(
            d.rule(&[("outer", "x")]).is_none(),
            "no limit on the outer level"
        );
        assert!(d.rule(&[("nope", "x")]).is_none());
    }

    #[test]
    fn every_problem_is_reported_with_its_file() {
        let (_, problems) = domains(&[
            ("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n"),
            ("b.yaml", "domain: d\n"),
            ("c.yml", "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: second }\n    colour: red\n"),
        ]);
        let text = problems.join("\n");
        assert!(
            text.contains("a.yaml: descriptors[0].rate_limit: unit \"fortnight\""),
            "{text}"
        );
        assert!(
            text.contains("b.yaml: domain \"d\" is defined twice"),
            "{text}"
        );
        assert!(text.contains("c.yml"), "{text}");
    }

    #[test]
    fn keys_are_bounded_and_differ_per_value_and_limit() {
        let (domains, _) = domains(&[(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
        )]);
        let Some(Rule::Limited(limit)) = domains.get("d").unwrap().rule(&[("k", "v")]) else {
            panic!("a limit");
        };
        let long = "x".repeat(1000);
        let a = key("sluice", (1, 2), "d", limit, &[("k", "v")]);
        let b = key("sluice", (1, 2), "d", limit, &[("k", &long)]);
        assert_ne!(a, b);
        assert_eq!(a.len(), b.len(), "the value's length does not show");
        assert!(a.starts_with(b"sluice:{rls."));
    }
}
