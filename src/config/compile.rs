//! Raw YAML structs → a validated [`Config`]: each section compiled by its own module, the
//! top-level settings here; every problem collected with its path.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::choice::{chosen, EncodedSlash};
use super::listeners::socket_addr;
use super::model::Config;
use super::observe::{
    compile_access_log, compile_request_id, compile_tracing, RawAccessLog, RawRequestId, RawTracing,
};
use super::pending::PendingChange;
use super::problem::{within, Problems};
use super::raw::{RawAdmin, RawConfig, RawPath, RawRedis, RawRegions, RawRls, RawRoute, RawSecret};
use super::redis::{RedisInForce, RedisSettings, DEFAULT_KEY_PREFIX};
use super::routes::{self, RouteDefaults};
use super::sources::Sources;
use crate::caller::address::{TrustedProxies, DEFAULT_IPV6_PREFIX};
use crate::limiter::FailureMode;
use crate::limiter::Secret;
use crate::route::keys::KeySecret;
use crate::route::path::PathRules;
use crate::route::table::RouteTable;

/// The settings a configuration is compiled with: `redis:` as [`RedisInForce`] says, and
/// `regions:` the file's (`None`) or those the process runs with (`Some`, a reload), which a
/// reload keeps until a graceful upgrade.
#[derive(Debug, Clone, Copy, Default)]
pub struct InForce<'a> {
    pub redis: RedisInForce<'a>,
    pub regions: Option<Option<&'a super::RegionsSettings>>,
}

/// Compiles what of `raw` compiles with the `redis:` and `regions:` settings `from` says are in force,
/// adding every problem found to `p`: what start would check next (certificates, users,
/// directories) can be checked on it even when `p` is not empty.
pub fn compile_all(
    source: &Path,
    raw: RawConfig,
    from: InForce<'_>,
    p: &mut Problems,
    read: &mut Sources,
) -> Config {
    let serves_rls = raw.rls.is_some();
    let server = super::server::check(raw.server, p);
    let listen = super::listeners::compile(raw.listen, !serves_rls, p);
    let (admin_listen, admin_token, admin_audit_log) = compile_admin(raw.admin, p, read);
    let (redis, regions, pending_upgrade) = stores((raw.redis, raw.regions), from, p, read);
    let failure_mode = compile_failure_mode(raw.failure_mode, p);
    let (key_prefix, secret) = compile_keys(redis.as_ref(), raw.key_secret, p, read);
    let trusted_proxies = compile_trusted_proxies(&raw.trusted_proxies, raw.ipv6_prefix, p);
    let addresses = super::addresses::compile("addresses", raw.addresses, p);
    let consumers = super::identity::compile(raw.identity, (&raw.routes, &raw.limits), p, read);
    let paths = compile_paths(raw.path, p);
    let instances = compile_instances(raw.instances, p);
    let (access_log, request_id, tracing) =
        observe((raw.access_log, raw.request_id, raw.tracing), p);
    let (in_regions, plans) = (regions.as_ref().map(|r| &*r.regions), consumers.plans());
    let common = super::common::compile(raw.limits, plans, in_regions, p);
    let defaults = RouteDefaults {
        key_prefix: &key_prefix,
        secret,
        instances,
        failure_mode,
        verifiers: &consumers,
        common: &common,
        upstreams: &super::upstreams::compile_named(raw.upstreams, p),
        regions: in_regions,
    };
    let rls = compile_rls(raw.rls, source, defaults, p, read);
    let routes = compile_routes(raw.routes, defaults, serves_rls, p);
    Config {
        source: source.to_path_buf(),
        server,
        listen,
        admin_listen,
        admin_token,
        admin_audit_log,
        instances,
        redis,
        regions,
        pending_upgrade,
        key_secret: secret,
        failure_mode,
        trusted_proxies,
        consumers,
        addresses,
        paths,
        access_log,
        request_id,
        tracing,
        rls,
        watch: raw.watch.unwrap_or(false),
        routes,
    }
}

/// `access_log:`, `request_id:` and `tracing:`.
fn observe(
    (access_log, request_id, tracing): (
        Option<RawAccessLog>,
        Option<RawRequestId>,
        Option<RawTracing>,
    ),
    p: &mut Problems,
) -> (
    Option<super::observe::AccessLogSettings>,
    Option<super::observe::RequestIdSettings>,
    Option<super::observe::TracingSettings>,
) {
    (
        compile_access_log(access_log, p),
        compile_request_id(request_id, p),
        compile_tracing(tracing, p),
    )
}

/// `redis:` and `regions:`: those in force (`from`), and what of the file's waits for a
/// graceful upgrade.
fn stores(
    (redis, regions): (Option<RawRedis>, Option<RawRegions>),
    from: InForce<'_>,
    p: &mut Problems,
    read: &mut Sources,
) -> (
    Option<RedisSettings>,
    Option<super::RegionsSettings>,
    Vec<PendingChange>,
) {
    let in_file = redis.map(|redis| super::redis::compile(redis, p, read));
    let (redis, mut pending) = super::redis::in_force(in_file, from.redis);
    let (regions, regions_pending) =
        super::regions::compile_in_force(regions, (redis.is_some(), from.regions), p, read);
    pending.extend(regions_pending);
    (redis, regions, pending)
}

/// `rls:`, its counters keyed as the routes' are (`defaults`), a relative `config_dir` taken
/// from the directory of `source`.
fn compile_rls(
    raw: Option<RawRls>,
    source: &Path,
    defaults: RouteDefaults<'_>,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<super::rls::RlsSettings> {
    let rls_defaults = super::rls::RlsDefaults {
        failure_mode: defaults.failure_mode,
        key_prefix: defaults.key_prefix,
        secret: defaults.secret.keys(),
        instances: defaults.instances,
        base: &directory_of(source),
    };
    super::rls::compile(raw, rls_defaults, p, read)
}

/// `failure_mode:`, `allow` unless set.
fn compile_failure_mode(
    raw: Option<super::choice::Spelled<FailureMode>>,
    p: &mut Problems,
) -> FailureMode {
    raw.and_then(|mode| mode.known("failure_mode", p))
        .unwrap_or(FailureMode::Allow)
}

/// The directory of the configuration file, absolute: a relative `rls.config_dir` is taken from
/// it.
fn directory_of(source: &Path) -> PathBuf {
    super::paths::absolute(source)
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

/// The key prefix (`redis.key_prefix`) and `key_secret`, the key of every key hash. Without a
/// secret the prefix keys the hashes: set key_secret in production.
fn compile_keys(
    redis: Option<&RedisSettings>,
    raw: Option<RawSecret>,
    p: &mut Problems,
    read: &mut Sources,
) -> (String, KeySecret) {
    let key_prefix = redis.map_or(DEFAULT_KEY_PREFIX, |r| r.key_prefix.as_str());
    let key_secret = raw.and_then(|secret| super::secrets::compile(secret, "key_secret", p, read));
    let secret = KeySecret::new(key_secret.as_ref().map_or(key_prefix, |s| s.expose()));
    (key_prefix.to_string(), secret)
}

/// The shortest admin token accepted: it guards every consumer's usage.
const MIN_ADMIN_TOKEN: usize = 16;

/// `admin:`: the listener, the token its usage and quota admin APIs ask for, and where the
/// quota admin API's audit lines go.
fn compile_admin(
    raw: Option<RawAdmin>,
    p: &mut Problems,
    read: &mut Sources,
) -> (Option<SocketAddr>, Option<Secret>, Option<PathBuf>) {
    let Some(raw) = raw else {
        return (None, None, None);
    };
    let audit_log = raw.audit_log.and_then(|path| {
        if path.is_empty() {
            p.add("admin.audit_log", "is empty: a file path");
            return None;
        }
        Some(PathBuf::from(path))
    });
    let listen = raw
        .listen
        .and_then(|text| socket_addr(&text, "admin.listen", p));
    let token = raw
        .token
        .and_then(|token| super::secrets::compile(token, "admin.token", p, read))
        .filter(|token| {
            let long_enough = token.expose().len() >= MIN_ADMIN_TOKEN;
            if !long_enough {
                p.add(
                    "admin.token",
                    format!("too short: at least {MIN_ADMIN_TOKEN} characters (e.g. `openssl rand -hex 32`)"),
                );
            }
            long_enough
        });
    (listen, token, audit_log)
}

/// `instances:`, the gateways sharing the limits (1 unless set).
fn compile_instances(raw: Option<u64>, p: &mut Problems) -> u64 {
    let instances = raw.unwrap_or(1);
    within(instances, 1..=10_000, "instances", p);
    instances
}

/// `routes:`: at least one (none needed by a gateway that only serves the rate limit service,
/// `serves_rls`), each name once, each route compiled. `positions` are those of the routes in the
/// file when some could not be read (empty: in order).
fn compile_routes(
    raw: Vec<RawRoute>,
    defaults: RouteDefaults<'_>,
    serves_rls: bool,
    p: &mut Problems,
) -> RouteTable {
    if raw.is_empty() && !serves_rls {
        p.add(
            "routes",
            "at least one route is required (a gateway that only serves Envoy's rate limit service sets rls: instead)",
        );
    }
    let mut names = HashSet::new();
    let mut compiled = Vec::new();
    for (index, raw_route) in raw.into_iter().enumerate() {
        if let Some(name) = &raw_route.name {
            if !names.insert(name.clone()) {
                p.add(
                    format!("routes[{index}].name"),
                    format!("duplicate route name {name:?}"),
                );
            }
        }
        compiled.extend(routes::compile(index, raw_route, defaults, p));
    }
    RouteTable::new(compiled)
}

fn compile_trusted_proxies(
    trusted: &[String],
    ipv6_prefix: Option<u8>,
    p: &mut Problems,
) -> TrustedProxies {
    let nets = trusted
        .iter()
        .enumerate()
        .filter_map(|(i, text)| match super::addresses::address_or_cidr(text) {
            Some(net) => Some(net),
            None => {
                p.add(
                    format!("trusted_proxies[{i}]"),
                    format!("invalid address or CIDR {text:?}"),
                );
                None
            }
        })
        .collect();
    let prefix = ipv6_prefix.unwrap_or(DEFAULT_IPV6_PREFIX);
    within(u64::from(prefix), 1..=128, "ipv6_prefix", p);
    TrustedProxies::new(nets, prefix)
}

fn compile_paths(raw: Option<RawPath>, p: &mut Problems) -> PathRules {
    let encoded_slash = raw.and_then(|path| path.encoded_slash);
    match chosen(
        encoded_slash.as_ref(),
        EncodedSlash::Reject,
        "path.encoded_slash",
        p,
    ) {
        Some(EncodedSlash::Keep) => PathRules {
            keep_encoded_slash: true,
        },
        Some(EncodedSlash::Reject) => PathRules {
            keep_encoded_slash: false,
        },
        None => PathRules::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn config(yaml: &str) -> (Option<Config>, Vec<String>) {
        problems_of(yaml, |raw: RawConfig, p: &mut Problems| {
            let config = compile_all(
                Path::new("t.yaml"),
                raw,
                InForce::default(),
                p,
                &mut Sources::default(),
            );
            p.is_empty().then_some(config)
        })
    }

    const ROUTE: &str = "routes:\n  - { name: r, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:1] } }\n";

    #[test]
    fn top_level_settings_are_checked_together() {
        let (compiled, problems) = config(&format!(
            "listen: [nowhere]\nadmin: {{ listen: \"1.2.3.4\" }}\nfailure_mode: maybe\ntrusted_proxies: [10.0.0.0/40]\nipv6_prefix: 0\npath: {{ encoded_slash: allow }}\ninstances: 0\naccess_log: {{ enabled: true, sample: 0 }}\n{ROUTE}"
        ));
        assert!(compiled.is_none());
        assert_eq!(
            problems,
            [
                "listen[0]: invalid address \"nowhere\": expected IP:PORT, e.g. 127.0.0.1:8080",
                "admin.listen: invalid address \"1.2.3.4\": expected IP:PORT, e.g. 127.0.0.1:8080",
                "failure_mode: unknown failure mode \"maybe\": use allow, deny or local",
                "trusted_proxies[0]: invalid address or CIDR \"10.0.0.0/40\"",
                "ipv6_prefix: must be between 1 and 128, got 0",
                "path.encoded_slash: unknown value \"allow\": use reject or keep",
                "instances: must be between 1 and 10000, got 0",
                "access_log.sample: must be at least 1 (log 1 request in N)",
            ]
        );
    }

    #[test]
    fn listeners_and_routes_are_required_and_route_names_unique() {
        let (_, problems) = config("routes: []\n");
        assert_eq!(
            problems,
            [
                "listen: at least one listen address is required, e.g. [0.0.0.0:8080] (a gateway that only serves Envoy's rate limit service sets rls: instead)",
                "routes: at least one route is required (a gateway that only serves Envoy's rate limit service sets rls: instead)",
            ]
        );
        // A gateway that only serves Envoy's rate limit service needs neither.
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/envoy-ratelimit"
        );
        let (compiled, problems) = config(&format!(
            "rls: {{ listen: 127.0.0.1:1, config_dir: {dir} }}\n"
        ));
        assert_eq!(problems, Vec::<String>::new());
        let compiled = compiled.unwrap();
        assert!(compiled.listen.is_empty() && compiled.rls.is_some());
        let (_, problems) = config(&format!(
            "listen: [127.0.0.1:1]\n{ROUTE}  - {{ name: r, match: {{ path_prefix: /x }}, upstream: {{ servers: [127.0.0.1:1] }} }}\n"
        ));
        assert_eq!(problems, ["routes[1].name: duplicate route name \"r\""]);
        let (compiled, problems) = config(&format!("listen: [127.0.0.1:1]\n{ROUTE}"));
        assert!(problems.is_empty());
        assert_eq!(compiled.unwrap().failure_mode, FailureMode::Allow);
    }

    #[test]
    fn watch_is_off_unless_set_and_must_be_a_boolean() {
        let (compiled, _) = config(&format!("listen: [127.0.0.1:1]\n{ROUTE}"));
        assert!(!compiled.unwrap().watch);
        let (compiled, _) = config(&format!("listen: [127.0.0.1:1]\nwatch: true\n{ROUTE}"));
        assert!(compiled.unwrap().watch);
        let text = format!("listen: [127.0.0.1:1]\nwatch: sometimes\n{ROUTE}");
        let error = Config::from_yaml(Path::new("t.yaml"), &text).unwrap_err();
        let problems: Vec<String> = error.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            problems,
            ["watch: expected true or false, got \"sometimes\""]
        );
    }

    /// `text` read into the configuration's raw model as `misfits.rs` reads it: what reads, and
    /// every misfit told.
    fn read_misfits(
        text: &str,
    ) -> (
        Option<super::super::misfits::Read<RawConfig>>,
        Vec<(String, String)>,
    ) {
        let mut p = Problems::default();
        let read = super::super::misfits::read(text, &mut p);
        let told = p.0.into_iter().map(|x| (x.path, x.message)).collect();
        (read, told)
    }

    #[test]
    fn every_misfit_of_one_route_is_told_in_one_read() {
        let text = "routes:\n  - name: a\n    limiter_timeout_ms: fast\n    shadow: [1]\n    upstream: { servers: [127.0.0.1:1], retries: -1 }\n    limits:\n      - { name: l, rate: 1/s, burst: 1.5 }\n      - { name: m, rate: [1] }\n  - name: b\n";
        let (read, told) = read_misfits(text);
        let told: std::collections::BTreeMap<String, String> = told.into_iter().collect();
        let paths: Vec<&str> = told.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "routes[0].limiter_timeout_ms",
                "routes[0].limits[0].burst",
                "routes[0].limits[1].rate",
                "routes[0].shadow",
                "routes[0].upstream.retries",
            ]
        );
        assert_eq!(
            told["routes[0].upstream.retries"],
            "expected a whole number ≥ 0, got -1"
        );
        assert_eq!(
            told["routes[0].limits[0].burst"],
            "expected a whole number ≥ 0, got 1.5 (a decimal)"
        );
        let read = read.expect("the rest reads");
        assert_eq!(read.raw.routes.len(), 2, "both routes kept");
        assert_eq!(read.raw.routes[0].limits.len(), 2, "both limits kept");
        assert!(read.misfits.follows("routes[0].limits[1].rate"));
        assert!(!read.misfits.follows("routes[0].limits[1].name"));
        assert!(!read.misfits.follows("routes[0].limiter_timeout_msx"));
    }

    #[test]
    fn a_route_of_the_wrong_shape_keeps_the_others_in_place() {
        let (read, told) = read_misfits("routes:\n  - just a string\n  - name: b\n");
        assert_eq!(
            told,
            [(
                "routes[0]".to_string(),
                "expected a table (key: value), got \"just a string\"".to_string()
            )]
        );
        let read = read.expect("the rest reads");
        assert_eq!(read.raw.routes.len(), 2);
        assert_eq!(read.raw.routes[1].name.as_deref(), Some("b"));
    }

    /// A file with a misspelled key in every table of the configuration.
    const MISSPELLED: &str = "\
acess_log: {}
access_log: { smaple: 1 }
server: { threds: 1 }
listen:
  - adr: 127.0.0.1:1
    tls:
      certificats: []
      client_auth: { mod: required }
      certificates: [{ crt: a }]
admin: { tokn: x }
redis: { key_prefx: a, tls: { kye: a }, password: { flie: a } }
addresses: { alow: [] }
identity:
  plan: []
  api_keys: { hedaer: x }
  jwt: { audiences: a }
  mtls: { consumr: subject_cn }
path: { encoded_slsh: keep }
request_id: { headr: x }
tracing: { endpont: x }
rls: { config_dri: x }
routes:
  - limiter_timeout: 1
    match: { path_prefx: /a }
    upstream: { retrys: 1, tls: { verfy: true } }
    auth: { mdoe: required }
    adaptive_concurrency: { min_limt: 1 }
    addresses: { dney: [] }
    limits:
      - algoritm: gcra
        cost_from_response: { headr: x }
        plans: { pro: { brust: 1 } }
";

    /// Each misspelled key of [`MISSPELLED`] and the known key it is told to be.
    const MEANT: &[(&str, &str)] = &[
        ("acess_log", "access_log"),
        ("access_log.smaple", "sample"),
        ("server.threds", "threads"),
        ("listen[0].adr", "addr"),
        ("listen[0].tls.certificats", "certificates"),
        ("listen[0].tls.client_auth.mod", "mode"),
        ("listen[0].tls.certificates[0].crt", "cert"),
        ("admin.tokn", "token"),
        ("redis.key_prefx", "key_prefix"),
        ("redis.tls.kye", "key"),
        ("redis.password.flie", "file"),
        ("addresses.alow", "allow"),
        ("identity.plan", "plans"),
        ("identity.api_keys.hedaer", "header"),
        ("identity.jwt.audiences", "audience"),
        ("identity.mtls.consumr", "consumer"),
        ("path.encoded_slsh", "encoded_slash"),
        ("request_id.headr", "header"),
        ("tracing.endpont", "endpoint"),
        ("rls.config_dri", "config_dir"),
        ("routes[0].limiter_timeout", "limiter_timeout_ms"),
        ("routes[0].match.path_prefx", "path_prefix"),
        ("routes[0].upstream.retrys", "retries"),
        ("routes[0].upstream.tls.verfy", "verify"),
        ("routes[0].auth.mdoe", "mode"),
        ("routes[0].adaptive_concurrency.min_limt", "min_limit"),
        ("routes[0].addresses.dney", "deny"),
        ("routes[0].limits[0].algoritm", "algorithm"),
        ("routes[0].limits[0].cost_from_response.headr", "header"),
        ("routes[0].limits[0].plans.pro.brust", "burst"),
    ];

    #[test]
    fn an_unknown_key_of_every_table_is_told_with_the_nearest_known_key() {
        let (read, told) = read_misfits(MISSPELLED);
        assert!(read.is_some(), "the rest reads");
        let wrong: Vec<&(String, String)> = told
            .iter()
            .filter(|(_, message)| !message.starts_with("unknown key: did you mean `"))
            .collect();
        assert!(wrong.is_empty(), "{wrong:?}");
        let told: std::collections::BTreeMap<&str, &str> = told
            .iter()
            .map(|(path, message)| (path.as_str(), message.as_str()))
            .collect();
        for &(path, known) in MEANT {
            assert_eq!(
                told.get(path).copied(),
                Some(format!("unknown key: did you mean `{known}`?").as_str()),
                "{path} in {told:#?}"
            );
        }
    }
}
