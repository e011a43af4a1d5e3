//! Envoy's rate limit service, the domain side: the descriptor tree of each domain that
//! envoyproxy/ratelimit's configuration describes (read from its files by `config::rls_files`),
//! and how a request's descriptors find their limits and keys.
//!
//! Matching is envoyproxy/ratelimit's: each entry of a descriptor descends one level, preferring
//! a node with the same key and value, then the first (in file order) whose value has `*`s and
//! matches it (each `*` any run of characters, none included), else a node with the key alone
//! (any value; each value then counts apart); the node reached by the last entry holds the
//! limit, if any. Values a wildcard with `share_threshold: true` matches count in one bucket.
//! `requests_per_unit: 0` refuses every request (a block list); `unlimited: true` admits every
//! one without counting.

use std::collections::HashMap;

use siphasher::sip128::{Hasher128, SipHasher13};
use smallvec::SmallVec;
use std::hash::Hasher;

use crate::limiter::redis::script::Algorithms;
use crate::limiter::{push_hex, Key, Limit, PolicyLimit, Scope};

/// The most descriptors one request may carry, and entries one descriptor may have.
pub const MAX_DESCRIPTORS: usize = 64;
pub const MAX_ENTRIES: usize = 16;
/// The longest domain, entry key or entry value accepted.
pub const MAX_TEXT: usize = 1024;

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
    /// The names a configuration accepts (in any case), for its messages.
    pub const NAMES: &'static str = "second, minute, hour, day, week, month or year";

    pub fn parse(text: &str) -> Option<Unit> {
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
        /// Its place among its domain's limit names (set by [`Domain::new`]).
        series: usize,
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
    /// The limit, and this gateway's share of it: compiled once, not per call.
    pub limit: PolicyLimit,
    /// Names of the limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `shadow_mode: true`: decided and counted, never over.
    pub shadow_mode: bool,
    /// `quota_mode: true`: over its limit, its descriptor says so, but the request is refused
    /// for it only when every quota-mode descriptor of the request is over (and it never stops
    /// the request's other limits from counting).
    pub quota_mode: bool,
    /// The descriptor's `metadata`, for `rls.response_dynamic_metadata`.
    pub metadata: Option<serde_json::Value>,
    /// Its place among its domain's limit names: which `limit` series counts it (set by
    /// [`Domain::new`]).
    pub series: usize,
    /// Where the node sits in its domain (part of every key it counts under).
    id: u64,
}

impl DescriptorLimit {
    /// `place` is where the limit's node sits: its domain and descriptor path; it is part of
    /// every key the limit counts under.
    pub fn new(
        place: &str,
        name: String,
        requests_per_unit: u64,
        unit: Unit,
        limit: Limit,
        replaces: Vec<String>,
        instances: u64,
    ) -> DescriptorLimit {
        DescriptorLimit {
            limit: PolicyLimit::new(limit, instances),
            id: xxhash_rust::xxh3::xxh3_64(place.as_bytes()),
            name,
            requests_per_unit,
            unit,
            replaces,
            shadow_mode: false,
            quota_mode: false,
            metadata: None,
            series: 0,
        }
    }
}

/// A level of a domain's descriptor tree: children by entry, and the rule of the descriptor
/// that ends here.
#[derive(Debug, Default)]
pub struct Node {
    /// `(key, value)` → child.
    /// `key` → `value` → child (two levels, so a request's entry is found without a copy).
    exact: HashMap<String, HashMap<String, Node>>,
    /// Values written with `*`, in file order.
    wildcard: Vec<Wildcard>,
    /// `key` (any value) → child.
    any: HashMap<String, Node>,
    rule: Option<Rule>,
}

/// A descriptor whose value has `*`s: each matches any run of characters, none included
/// (`files/*`, `/api*v1`, `svc*ep*rpc`).
#[derive(Debug)]
struct Wildcard {
    key: String,
    /// The value as written: what the values it matches count under when shared.
    written: String,
    /// The text between the stars, in order (the first a prefix, the last a suffix).
    parts: Vec<String>,
    /// `share_threshold: true`: every value it matches counts in one bucket.
    shared: bool,
    node: Node,
}

impl Wildcard {
    fn matches(&self, value: &str) -> bool {
        let Some((first, rest)) = self.parts.split_first() else {
            return true;
        };
        let Some(mut remainder) = value.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            return remainder.is_empty();
        };
        for part in middle {
            let Some(at) = remainder.find(part.as_str()) else {
                return false;
            };
            remainder = &remainder[at + part.len()..];
        }
        remainder.ends_with(last.as_str())
    }
}

impl Node {
    /// The child an entry `key` (with `value`, a value with `*`s, or any value when `None`)
    /// descends to, made if new; a wildcard is always a new child (they are tried in file
    /// order), its values counted in one bucket when `shared`.
    pub fn child(&mut self, key: String, value: Option<String>, shared: bool) -> &mut Node {
        let Some(value) = value else {
            return self.any.entry(key).or_default();
        };
        if !value.contains('*') {
            return self.exact.entry(key).or_default().entry(value).or_default();
        }
        self.wildcard.push(Wildcard {
            key,
            parts: value.split('*').map(str::to_string).collect(),
            written: value,
            shared,
            node: Node::default(),
        });
        let last = self.wildcard.len() - 1;
        &mut self.wildcard[last].node
    }

    pub fn has_rule(&self) -> bool {
        self.rule.is_some()
    }

    pub fn set_rule(&mut self, rule: Option<Rule>) {
        self.rule = rule;
    }
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: String,
    root: Node,
    /// The names of its limits, each once, sorted: a rule's `series` indexes them.
    names: Box<[String]>,
    /// The algorithms of its limits.
    algorithms: Algorithms,
    /// The names of its limits that are quotas (`Limit::is_quota`) shared by every gateway,
    /// each once.
    quotas: Box<[String]>,
}

impl Node {
    /// This node and every node below it.
    fn walk_mut(&mut self, visit: &mut impl FnMut(&mut Node)) {
        visit(self);
        let exact = self.exact.values_mut().flat_map(HashMap::values_mut);
        let wildcard = self.wildcard.iter_mut().map(|w| &mut w.node);
        for child in exact.chain(wildcard).chain(self.any.values_mut()) {
            child.walk_mut(visit);
        }
    }
}

impl Domain {
    /// The domain `name` of the tree under `root`; each rule learns its place among the
    /// domain's limit names.
    pub fn new(name: String, mut root: Node) -> Domain {
        let (mut names, mut quotas) = (Vec::new(), Vec::new());
        let mut algorithms = Algorithms::default();
        root.walk_mut(&mut |node| match &node.rule {
            Some(Rule::Limited(limit)) => {
                names.push(limit.name.clone());
                let exact = &limit.limit.exact;
                algorithms = algorithms.with(Algorithms::of(&exact.algorithm));
                if exact.is_quota() && exact.scope == Scope::Shared {
                    quotas.push(limit.name.clone());
                }
            }
            Some(Rule::Blocked { name, .. }) => names.push(name.clone()),
            Some(Rule::Unlimited) | None => {}
        });
        names.sort_unstable();
        names.dedup();
        let place = |name: &str| {
            names
                .binary_search_by(|n| n.as_str().cmp(name))
                .unwrap_or(0)
        };
        root.walk_mut(&mut |node| match &mut node.rule {
            Some(Rule::Limited(limit)) => limit.series = place(&limit.name),
            Some(Rule::Blocked { name, series, .. }) => *series = place(name),
            Some(Rule::Unlimited) | None => {}
        });
        quotas.sort_unstable();
        quotas.dedup();
        Domain {
            name,
            root,
            names: names.into(),
            algorithms,
            quotas: quotas.into(),
        }
    }

    /// The algorithms of its limits: those a call may use, in any combination.
    pub fn algorithms(&self) -> Algorithms {
        self.algorithms
    }

    /// The names of its limits that are quotas shared by every gateway (a calendar period, or
    /// state kept an hour or more), each once, sorted.
    pub fn quota_limits(&self) -> impl Iterator<Item = &str> {
        self.quotas.iter().map(String::as_str)
    }

    /// The names of its limits (`rate_limit.name`, or the descriptor path), each once, sorted:
    /// the `limit` label of its metrics, bounded by the configuration (never a request's
    /// values). A rule's `series` is its place here.
    pub fn limit_names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }
}

/// Every domain of the configuration directory, by name.
#[derive(Debug, Default)]
pub struct Domains {
    by_name: HashMap<String, Domain>,
}

/// One entry of a request descriptor.
pub type Entry<'a> = (&'a str, &'a str);

impl Domains {
    /// Adds `domain`, in place of any of the same name.
    pub fn insert(&mut self, domain: Domain) {
        self.by_name.insert(domain.name.clone(), domain);
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

/// Which entries of a descriptor count under a shared wildcard's written value instead of their
/// own (`share_threshold`): by their place among the entries.
pub type Shared<'d> = SmallVec<[(usize, &'d str); 2]>;

impl Domain {
    /// The rule of the node `entries` lead to, if any (envoyproxy/ratelimit's matching), with
    /// the entries that shared wildcards matched.
    pub fn find(&self, entries: &[Entry<'_>]) -> Option<(&Rule, Shared<'_>)> {
        let mut node = &self.root;
        let mut shared = Shared::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            if let Some(child) = node.exact.get(*key).and_then(|values| values.get(*value)) {
                node = child;
                continue;
            }
            let wildcard = node
                .wildcard
                .iter()
                .find(|w| w.key == *key && w.matches(value));
            node = match wildcard {
                Some(wildcard) => {
                    if wildcard.shared {
                        shared.push((i, wildcard.written.as_str()));
                    }
                    &wildcard.node
                }
                None => node.any.get(*key)?,
            };
        }
        Some((node.rule.as_ref()?, shared))
    }
}

/// The counter key of `limit` for a descriptor with `entries` in `domain`: the key prefix, a
/// hash tag per domain (so one request's keys share a Redis Cluster slot), and a keyed digest
/// of the limit and the entries — never the client's bytes themselves. An entry a shared
/// wildcard matched counts under the wildcard's written value.
pub fn key(
    prefix: &str,
    secret: (u64, u64),
    domain: &str,
    limit: &DescriptorLimit,
    entries: &[Entry<'_>],
    shared: &Shared<'_>,
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
    for (i, (k, v)) in entries.iter().enumerate() {
        hasher.write_usize(k.len());
        hasher.write(k.as_bytes());
        match shared.iter().find(|(at, _)| *at == i) {
            Some((_, written)) => {
                // Apart from any value (no value is usize::MAX bytes long): a request's value
                // cannot reach a shared bucket's key.
                hasher.write_usize(usize::MAX);
                hasher.write_usize(written.len());
                hasher.write(written.as_bytes());
            }
            None => {
                hasher.write_usize(v.len());
                hasher.write(v.as_bytes());
            }
        }
    }
    push_hex(&mut key, &hasher.finish128().as_bytes());
    key
}
