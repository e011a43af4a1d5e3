//! `rls.config_dir`: envoyproxy/ratelimit's configuration files as is (a directory of YAML files,
//! one `domain` each, with nested `descriptors` of `key`/`value`, `rate_limit: { unit,
//! requests_per_unit, unlimited, name, replaces }`, `shadow_mode`, `detailed_metric`), compiled
//! into the [`Domains`] the rate limit service matches. Every problem is reported under
//! `rls.config_dir`, naming its file and the path in it; algorithms are named and built as the
//! routes' are (`choice::AlgorithmName`, `limits::gcra`, `limits::window`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::choice::{impl_choice, AlgorithmName, Spelled};
use super::limits::{gcra, window, MAX_SLIDING_LOG_LIMIT};
use super::problem::Problems;
use super::sources::Sources;
use crate::limiter::algorithm::Period;
use crate::limiter::{Algorithm, Limit, Rate};
use crate::route::descriptors::{DescriptorLimit, Domain, Domains, Node, Rule, Unit};

/// Where every problem of the directory is reported.
const AT: &str = "rls.config_dir";

/// A file's YAML as a domain; what is wrong with it (the first mistake, as serde stops there)
/// in an operator's words, with its path in the file.
fn read_domain(text: &str) -> Result<RawDomain, String> {
    let deserializer = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let (path, message) = super::wording::misfit(&error);
        if path.is_empty() {
            message
        } else {
            format!("{path}: {message}")
        }
    })
}

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
    quota_mode: bool,
    #[serde(default)]
    share_threshold: bool,
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    metadata: Option<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    unit: Option<Spelled<Unit>>,
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
    /// sluice's extension: the algorithm (default `rls.algorithm`, itself `fixed_window` as
    /// envoyproxy/ratelimit).
    algorithm: Option<Spelled<AlgorithmName>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: Option<String>,
}

// The units' names are the domain's own table (any case).
impl_choice!(Unit, "unit", Unit::parse, Unit::NAMES);

/// Reads every `.yaml`/`.yml` file of `dir` (one domain each) in name order; `algorithm` is that
/// of rate limits that name none. Every problem is added to `p`.
pub fn load(
    dir: &Path,
    algorithm: &Spelled<AlgorithmName>,
    sharing: Sharing,
    p: &mut Problems,
    read: &mut Sources,
) -> Domains {
    let mut domains = Domains::default();
    for file in yaml_files(dir, p, read) {
        let shown = file.display().to_string();
        let raw: RawDomain = match read
            .read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|text| read_domain(&text))
        {
            Ok(raw) => raw,
            Err(e) => {
                p.add(AT, format!("{shown}: {e}"));
                continue;
            }
        };
        if raw.domain.is_empty() {
            p.add(AT, format!("{shown}: domain: must not be empty"));
            continue;
        }
        if domains.get(&raw.domain).is_some() {
            p.add(
                AT,
                format!("{shown}: domain {:?} is defined twice", raw.domain),
            );
            continue;
        }
        let context = Context {
            file: &shown,
            algorithm,
            domain: &raw.domain,
            sharing,
        };
        let mut root = Node::default();
        let mut declared = HashSet::new();
        for (i, raw) in raw.descriptors.into_iter().enumerate() {
            let at = Place {
                path: &format!("descriptors[{i}]"),
                id_path: "",
            };
            add(&mut root, raw, at, &mut declared, &context, p);
        }
        domains.insert(Domain::new(raw.domain, root));
    }
    domains
}

/// The `.yaml` and `.yml` files of `dir`, sorted.
fn yaml_files(dir: &Path, p: &mut Problems, read: &mut Sources) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match read.read_dir(dir) {
        Ok(entries) => entries
            .into_iter()
            .filter(|path| {
                path.extension()
                    .is_some_and(|ext| ext == "yaml" || ext == "yml")
            })
            .collect(),
        Err(e) => {
            p.add(AT, format!("cannot read {}: {e}", dir.display()));
            return Vec::new();
        }
    };
    files.sort();
    files
}

/// The file being compiled.
struct Context<'a> {
    file: &'a str,
    algorithm: &'a Spelled<AlgorithmName>,
    domain: &'a str,
    sharing: Sharing,
}

/// How the rate limit service's limits are shared: by how many gateways (each rule's limit is
/// compiled with its share).
#[derive(Debug, Clone, Copy)]
pub struct Sharing {
    pub instances: u64,
}

impl Context<'_> {
    /// A problem at `path` of the file.
    fn problem(&self, p: &mut Problems, path: &str, message: impl std::fmt::Display) {
        p.add(AT, format!("{}: {path}: {message}", self.file));
    }
}

/// Where a descriptor is: its path in the file, and its parent's place in the domain
/// (`.key_value.key...`).
#[derive(Clone, Copy)]
struct Place<'a> {
    path: &'a str,
    id_path: &'a str,
}

/// Adds the descriptor at `at` (and its own descriptors) under `parent`; `declared` holds the
/// places of the file's descriptors so far, each declared once.
fn add(
    parent: &mut Node,
    raw: RawDescriptor,
    at: Place<'_>,
    declared: &mut HashSet<String>,
    cx: &Context,
    p: &mut Problems,
) {
    let Place { path, id_path } = at;
    // An empty value is no value, as upstream reads it: the key alone, any value.
    let value = raw.value.filter(|value| !value.is_empty());
    if raw.key.is_empty() {
        cx.problem(p, path, "key: must not be empty");
        return;
    }
    let id_path = match &value {
        Some(value) => format!("{id_path}.{}_{value}", raw.key),
        None => format!("{id_path}.{}", raw.key),
    };
    if !declared.insert(id_path.clone()) {
        let composite = format!("{}{id_path}", cx.domain);
        let message = format!("duplicate descriptor composite key '{composite}'");
        cx.problem(p, path, message);
        return;
    }
    let wildcard = value.as_ref().is_some_and(|v| v.contains('*'));
    if raw.share_threshold && !wildcard {
        let message = "share_threshold: only with a wildcard value (one with *)";
        cx.problem(p, path, message);
    }
    let metadata = raw
        .metadata
        .and_then(|yaml| compile_metadata(yaml, &format!("{path}.metadata"), cx, p));
    let node = parent.child(raw.key, value, raw.share_threshold);
    if let Some(rate) = raw.rate_limit {
        let modes = Modes {
            shadow: raw.shadow_mode,
            quota: raw.quota_mode,
            metadata,
        };
        let at = format!("{path}.rate_limit");
        node.set_rule(compile_rule(rate, modes, &id_path, &at, cx, p));
    }
    // Every limit has its own series already (sluice_rls_limit_decisions_total); the
    // descriptor values detailed_metric or value_to_metric would add are a request's bytes:
    // never a label.
    let _ = (raw.detailed_metric, raw.value_to_metric);
    for (i, child) in raw.descriptors.into_iter().enumerate() {
        let child_at = Place {
            path: &format!("{path}.descriptors[{i}]"),
            id_path: &id_path,
        };
        add(node, child, child_at, declared, cx, p);
    }
}

/// `metadata:` at `path`: a table of anything, as JSON (`rls.response_dynamic_metadata`).
fn compile_metadata(
    yaml: serde_yaml::Value,
    path: &str,
    cx: &Context,
    p: &mut Problems,
) -> Option<serde_json::Value> {
    match serde_json::to_value(yaml) {
        Ok(json) if json.is_object() => Some(json),
        Ok(_) => {
            cx.problem(p, path, "must be a table (key: value)");
            None
        }
        Err(e) => {
            cx.problem(p, path, e);
            None
        }
    }
}

/// How a descriptor's limit applies: `shadow_mode`, `quota_mode`, and its `metadata`.
struct Modes {
    shadow: bool,
    quota: bool,
    metadata: Option<serde_json::Value>,
}

/// Refuses, as envoyproxy/ratelimit does, an `unlimited` limit with a unit, and `replaces`
/// entries that are empty or name the limit itself.
fn check_rate_limit(raw: &RawRateLimit, path: &str, cx: &Context, p: &mut Problems) -> bool {
    let mut fine = true;
    if raw.unlimited && raw.unit.is_some() {
        cx.problem(p, path, "unit: not with unlimited: true");
        fine = false;
    }
    for (i, replaced) in raw.replaces.iter().enumerate() {
        let at = format!("{path}.replaces[{i}].name");
        match replaced.name.as_deref() {
            None | Some("") => cx.problem(p, &at, "must not be empty"),
            Some(name) if raw.name.as_deref() == Some(name) => {
                cx.problem(p, &at, "must not name the limit itself")
            }
            Some(_) => continue,
        }
        fine = false;
    }
    fine
}

/// `rate_limit:` at `path`: unlimited, blocked (`requests_per_unit: 0`), or a limit.
fn compile_rule(
    raw: RawRateLimit,
    modes: Modes,
    id_path: &str,
    path: &str,
    cx: &Context,
    p: &mut Problems,
) -> Option<Rule> {
    if !check_rate_limit(&raw, path, cx, p) {
        return None;
    }
    if raw.unlimited {
        return Some(Rule::Unlimited);
    }
    let Some(Spelled::Known(unit)) = raw.unit else {
        let spelled = match raw.unit {
            Some(Spelled::Unknown(text)) => text,
            _ => String::new(),
        };
        cx.problem(p, path, format!("unit {spelled:?}: use {}", Unit::NAMES));
        return None;
    };
    let Some(count) = raw.requests_per_unit else {
        cx.problem(p, path, "requests_per_unit: required");
        return None;
    };
    let place = format!("{}{id_path}", cx.domain);
    let name = raw.name.unwrap_or_else(|| place.clone());
    let Some(rate) = Rate::new(count, Duration::from_secs(unit.seconds())) else {
        return Some(Rule::Blocked {
            name,
            unit,
            series: 0,
        });
    };
    let chosen = raw.algorithm.as_ref().unwrap_or(cx.algorithm);
    let Some(algorithm) = algorithm(chosen, rate) else {
        let spelled = chosen.spelling();
        cx.problem(
            p,
            path,
            format!("algorithm {spelled:?}: use fixed_window, sliding_window, sliding_log (at most {MAX_SLIDING_LOG_LIMIT} per unit) or gcra"),
        );
        return None;
    };
    let mut limit = Limit::new(&name, algorithm, 1, rate);
    // A quota-mode limit never stops the call's other limits: decided as a shadow one.
    limit.shadow = modes.shadow || modes.quota;
    let replaces = raw.replaces.into_iter().filter_map(|r| r.name).collect();
    let instances = cx.sharing.instances;
    let mut limit = DescriptorLimit::new(&place, name, count, unit, limit, replaces, instances);
    limit.shadow_mode = modes.shadow;
    limit.quota_mode = modes.quota;
    limit.metadata = modes.metadata;
    Some(Rule::Limited(Box::new(limit)))
}

/// The algorithm a descriptor limit runs: envoyproxy/ratelimit's fixed window by default
/// (aligned to the epoch as it cuts them: `now - now % unit`, a month of 30 days, a year of
/// 365), the other windows, or `gcra`: a token bucket holding a whole unit's requests, refilled
/// evenly.
fn algorithm(chosen: &Spelled<AlgorithmName>, rate: Rate) -> Option<Algorithm> {
    match *chosen {
        Spelled::Known(AlgorithmName::Gcra) => gcra(rate, rate.count.get(), 0),
        Spelled::Known(AlgorithmName::FixedWindow) => Some(Algorithm::Calendar {
            limit: rate.count.get(),
            period: Period::Aligned {
                length_us: rate.period_us(),
            },
        }),
        Spelled::Known(kind) => window(kind, rate),
        Spelled::Unknown(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::descriptors::{key, Domain, Entry, Shared};

    /// The rule `entries` lead to in `domain`.
    fn rule<'d>(domain: &'d Domain, entries: &[Entry<'_>]) -> Option<&'d Rule> {
        domain.find(entries).map(|(rule, _)| rule)
    }

    fn domains(files: &[(&str, &str)]) -> (Domains, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let mut p = Problems::default();
        let fixed_window = Spelled::Known(AlgorithmName::FixedWindow);
        let sharing = Sharing { instances: 1 };
        let domains = load(
            dir.path(),
            &fixed_window,
            sharing,
            &mut p,
            &mut Sources::default(),
        );
        (domains, p.lines())
    }

    #[test]
    fn a_value_match_wins_over_a_key_match_and_nesting_descends() {
        let (domains, problems) = domains(&[(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: k\n    value: v\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n  - key: outer\n    descriptors:\n      - key: inner\n        rate_limit: { unlimited: true }\n",
        )]);
        assert!(problems.is_empty(), "{problems:?}");
        let d = domains.get("d").unwrap();
        let unit = |entries: &[Entry<'_>]| match rule(d, entries) {
            Some(Rule::Limited(l)) => Some(l.unit),
            _ => None,
        };
        assert_eq!(unit(&[("k", "v")]), Some(Unit::Minute));
        assert_eq!(unit(&[("k", "other")]), Some(Unit::Second));
        assert!(matches!(
            rule(d, &[("outer", "x"), ("inner", "y")]),
            Some(Rule::Unlimited)
        ));
        assert!(
            rule(d, &[("outer", "x")]).is_none(),
            "no limit on the outer level"
        );
        assert!(rule(d, &[("nope", "x")]).is_none());
    }

    #[test]
    fn every_problem_is_reported_with_its_file() {
        let (_, problems) = domains(&[
            ("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n  - key: l\n    rate_limit: { unit: Second, requests_per_unit: 1, algorithm: token_bucket }\n  - key: m\n    rate_limit: { unit: second, requests_per_unit: 1, algorithm: leaky }\n"),
            ("b.yaml", "domain: d\n"),
            ("c.yml", "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: second }\n    colour: red\n"),
        ]);
        let text = problems.join("\n");
        for expected in [
            "a.yaml: descriptors[0].rate_limit: unit \"fortnight\": use second, minute, hour, day, week, month or year",
            "a.yaml: descriptors[1].rate_limit: algorithm \"token_bucket\": use fixed_window",
            "a.yaml: descriptors[2].rate_limit: algorithm \"leaky\": use fixed_window",
            "b.yaml: domain \"d\" is defined twice",
            "c.yml",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        assert!(problems.iter().all(|p| p.starts_with("rls.config_dir: ")));
    }

    #[test]
    fn values_a_shared_wildcard_matches_count_under_one_key_and_others_apart() {
        let (domains, problems) = domains(&[(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: s\n    value: a*z\n    share_threshold: true\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: p\n    value: a*z\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
        )]);
        assert!(problems.is_empty(), "{problems:?}");
        let d = domains.get("d").unwrap();
        let key_of = |entry: (&str, &str)| {
            let entries = [entry];
            let Some((Rule::Limited(limit), shared)) = d.find(&entries) else {
                panic!("{entry:?} matches");
            };
            key("sluice", (1, 2), "d", limit, &entries, &shared)
        };
        assert_eq!(key_of(("s", "abz")), key_of(("s", "a-long-z")));
        assert_ne!(key_of(("p", "abz")), key_of(("p", "a-long-z")));
        for unmatched in ["az-", "za", "a"] {
            assert!(d.find(&[("s", unmatched)]).is_none(), "{unmatched}");
        }
        assert!(
            d.find(&[("s", "az")]).is_some(),
            "a star matches nothing too"
        );
    }

    #[test]
    fn an_empty_value_is_the_key_alone_as_upstream_reads_it() {
        let any = "domain: d\ndescriptors:\n  - key: k\n    value: \"\"\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
        let (read, problems) = domains(&[("a.yaml", any)]);
        assert!(problems.is_empty(), "{problems:?}");
        assert!(rule(read.get("d").unwrap(), &[("k", "anything")]).is_some());
        let twice =
            format!("{any}  - key: k\n    rate_limit: {{ unit: second, requests_per_unit: 2 }}\n");
        let (_, problems) = domains(&[("a.yaml", &twice)]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        let expected = "a.yaml: descriptors[1]: duplicate descriptor composite key 'd.k'";
        assert!(problems[0].ends_with(expected), "{problems:?}");
    }

    #[test]
    fn share_threshold_needs_a_wildcard_and_metadata_a_table() {
        let (_, problems) = domains(&[(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: s\n    value: plain\n    share_threshold: true\n    rate_limit: { unit: second, requests_per_unit: 1 }\n  - key: m\n    metadata: [1]\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
        )]);
        let text = problems.join("\n");
        for expected in [
            "a.yaml: descriptors[0]: share_threshold: only with a wildcard value (one with *)",
            "a.yaml: descriptors[1].metadata: must be a table (key: value)",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
    }

    #[test]
    fn keys_are_bounded_and_differ_per_value_and_limit() {
        let (domains, _) = domains(&[(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
        )]);
        let Some(Rule::Limited(limit)) = rule(domains.get("d").unwrap(), &[("k", "v")]) else {
            panic!("a limit");
        };
        let long = "x".repeat(1000);
        let none = Shared::new();
        let a = key("sluice", (1, 2), "d", limit, &[("k", "v")], &none);
        let b = key("sluice", (1, 2), "d", limit, &[("k", &long)], &none);
        assert_ne!(a, b);
        assert_eq!(a.len(), b.len(), "the value's length does not show");
        assert!(a.starts_with(b"sluice:{rls."));
    }
}
