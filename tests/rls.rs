//! Envoy's rate limit service against real processes: a real gRPC client (the Envoy protos of
//! `envoy-types`, over tonic) asks a real sluice backed by a real Redis. Allowed, over limit,
//! shadow, unlimited, blocked, `hits_addend`, several descriptors decided all or nothing, Redis
//! down under each failure mode, malformed requests; and envoyproxy/ratelimit's documented
//! example configurations, as fixtures, deciding as that project documents.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::config::{route, Config};
use support::{free_port, metric, Gateway, RedisServer, Upstream};
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A sluice serving the rate limit service on its own port, with `files` as its config dir.
struct Rls {
    gateway: Gateway,
    runtime: tokio::runtime::Runtime,
    client: RateLimitServiceClient<Channel>,
    _dir: tempfile::TempDir,
}

impl Rls {
    fn start(files: &[(&str, &str)], redis: Option<&RedisServer>, failure_mode: &str) -> Rls {
        Rls::start_with(files, redis, failure_mode, "")
    }

    /// As [`Rls::start`], with `extra` more members of `rls:` (each after a comma).
    fn start_with(
        files: &[(&str, &str)],
        redis: Option<&RedisServer>,
        failure_mode: &str,
        extra: &str,
    ) -> Rls {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let port = free_port();
        let mut config = Config::new().set(
            "rls",
            format!(
                "{{ listen: 127.0.0.1:{port}, config_dir: {}, failure_mode: {failure_mode}{extra} }}",
                dir.path().display()
            ),
        );
        if let Some(redis) = redis {
            config = config.redis(redis.url()).redis_key("timeout_ms", 100);
        }
        let upstream = Upstream::start();
        let gateway = Gateway::start(&config.route(route("all")).yaml(), &upstream, redis);
        wait_for_port(port);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let client = runtime.block_on(async {
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
                .await
                .expect("connect to the rate limit service")
        });
        Rls {
            gateway,
            runtime,
            client,
            _dir: dir,
        }
    }

    fn ask(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        let client = &mut self.client;
        self.runtime
            .block_on(async { client.should_rate_limit(request).await })
            .map(tonic::Response::into_inner)
    }

    /// One request of `descriptors` (each a list of entries) in `domain`.
    fn check(&mut self, domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        self.ask(request(domain, descriptors, 0))
            .expect("an answer")
    }
}

fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the rate limit service never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: hits,
    }
}

fn codes(response: &RateLimitResponse) -> (i32, Vec<i32>) {
    (
        response.overall_code,
        response.statuses.iter().map(|s| s.code).collect(),
    )
}

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: client
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /login
    rate_limit: { unit: hour, requests_per_unit: 1, name: login }
  - key: canary
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: internal
    rate_limit: { unlimited: true }
  - key: banned
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: tenant
    descriptors:
      - key: plan
        value: gold
        rate_limit: { unit: second, requests_per_unit: 1000, algorithm: gcra }
"#;

#[test]
fn descriptors_are_allowed_limited_shadowed_unlimited_and_blocked_all_or_nothing() {
    let redis = RedisServer::start();
    let mut rls = Rls::start(&[("edge.yaml", EDGE)], Some(&redis), "deny");

    // Over limit on the fourth; the status says which limit and how long until it resets.
    for remaining in [2, 1, 0] {
        let ok = rls.check("edge", &[&[("client", "a")]]);
        assert_eq!(codes(&ok), (OK, vec![OK]));
        assert_eq!(ok.statuses[0].limit_remaining, remaining);
    }
    let over = rls.check("edge", &[&[("client", "a")]]);
    assert_eq!(codes(&over), (OVER, vec![OVER]));
    let limit = over.statuses[0].current_limit.as_ref().expect("the limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, 2),
        "3 per minute"
    );
    let reset = over.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("reset");
    // The window is aligned to the epoch (as envoyproxy/ratelimit's): it may end within the
    // second, so the time left is positive and at most the minute, not always a whole second.
    assert!(
        (reset.seconds > 0 || reset.nanos > 0) && (reset.seconds, reset.nanos) <= (60, 0),
        "{reset:?}"
    );
    let headers: Vec<(&str, &str)> = over
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert!(
        headers.contains(&("RateLimit-Policy", "\"edge.client\";q=3;w=60")),
        "{headers:?}"
    );
    assert!(headers
        .iter()
        .any(|(k, v)| *k == "RateLimit" && v.starts_with("\"edge.client\";r=0;t=")));

    // Several descriptors in one request: all or nothing. The login limit (1/h) denies the
    // second; client b's quota is not touched by it.
    let both = [&[("client", "b")][..], &[("path", "/login")][..]];
    assert_eq!(codes(&rls.check("edge", &both)), (OK, vec![OK, OK]));
    assert_eq!(codes(&rls.check("edge", &both)), (OVER, vec![OK, OVER]));
    let alone = rls.check("edge", &[&[("client", "b")]]);
    assert_eq!(
        alone.statuses[0].limit_remaining, 1,
        "only two of b's three used"
    );

    // hits_addend: the request's, then a descriptor's own.
    let heavy = rls.ask(request("edge", &[&[("client", "c")]], 2)).unwrap();
    assert_eq!(
        (heavy.overall_code, heavy.statuses[0].limit_remaining),
        (OK, 1)
    );
    let too_heavy = rls.ask(request("edge", &[&[("client", "c")]], 2)).unwrap();
    assert_eq!(too_heavy.overall_code, OVER, "2 more do not fit in 1");
    let mut one = request("edge", &[&[("client", "c")]], 2);
    one.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    let fits = rls.ask(one).unwrap();
    assert_eq!(
        (fits.overall_code, fits.statuses[0].limit_remaining),
        (OK, 0)
    );

    // Shadow mode: counted, never limiting.
    for _ in 0..3 {
        assert_eq!(
            codes(&rls.check("edge", &[&[("canary", "x")]])),
            (OK, vec![OK])
        );
    }
    // Unlimited: always OK, remaining at its maximum, no limit reported.
    let free = rls.check("edge", &[&[("internal", "x")]]);
    assert_eq!(
        (free.overall_code, free.statuses[0].limit_remaining),
        (OK, u32::MAX)
    );
    assert!(free.statuses[0].current_limit.is_none());
    // requests_per_unit: 0 blocks, and takes nothing from the other descriptors.
    let blocked = rls.check("edge", &[&[("client", "d")], &[("banned", "x")]]);
    assert_eq!(codes(&blocked), (OVER, vec![OK, OVER]));
    assert_eq!(
        rls.check("edge", &[&[("client", "d")]]).statuses[0].limit_remaining,
        2,
        "the blocked request consumed nothing"
    );
    // Nested descriptors, with sluice's own algorithm.
    let gold = rls.check("edge", &[&[("tenant", "t"), ("plan", "gold")]]);
    assert_eq!(
        gold.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1000
    );
    // No rule: OK without a limit.
    assert_eq!(
        codes(&rls.check("edge", &[&[("other", "x")]])),
        (OK, vec![OK])
    );

    let metrics = rls.gateway.metrics();
    let count = |decision: &str| {
        metric(
            &metrics,
            "sluice_rls_requests_total",
            &[("domain", "edge"), ("decision", decision)],
        )
    };
    assert_eq!(count("shadow_limited"), 2.0);
    assert!(count("limited") >= 4.0);
    assert!(count("allowed") >= 8.0);
    // Per limit, as sluice_limit_decisions_total for routes: which limit said what.
    let said = |limit: &str, decision: &str| {
        metric(
            &metrics,
            "sluice_rls_limit_decisions_total",
            &[("domain", "edge"), ("limit", limit), ("decision", decision)],
        )
    };
    assert_eq!(
        (
            said("edge.client", "allowed"),
            said("edge.client", "limited")
        ),
        (10.0, 2.0),
        "a 3 + b 3 + c 2 + d 2 allowed; a's fourth and c's too heavy limited"
    );
    assert_eq!(
        (said("login", "allowed"), said("login", "limited")),
        (1.0, 1.0)
    );
    assert_eq!(
        (
            said("edge.canary", "allowed"),
            said("edge.canary", "shadow_limited")
        ),
        (1.0, 2.0)
    );
    assert_eq!(said("edge.banned", "limited"), 1.0);
}

#[test]
fn malformed_requests_get_a_clear_grpc_error() {
    let mut rls = Rls::start(&[("edge.yaml", EDGE)], None, "allow");
    let cases = [
        (
            request("", &[&[("client", "a")]], 0),
            tonic::Code::InvalidArgument,
            "domain",
        ),
        (
            request("edge", &[], 0),
            tonic::Code::InvalidArgument,
            "descriptors",
        ),
        (
            request("edge", &[&[]], 0),
            tonic::Code::InvalidArgument,
            "entries",
        ),
        (
            request("edge", &[&[("", "x")]], 0),
            tonic::Code::InvalidArgument,
            "entry keys",
        ),
        (
            request("nowhere", &[&[("client", "a")]], 0),
            tonic::Code::NotFound,
            "unknown domain",
        ),
    ];
    for (asked, code, says) in cases {
        let status = rls.ask(asked).expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    let huge = "v".repeat(100_000);
    let status = rls
        .ask(request("edge", &[&[("client", &huge)]], 0))
        .expect_err("a value longer than 1024 bytes is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(rls.gateway.is_running(), "no panic");
}

#[test]
fn with_redis_down_each_failure_mode_applies() {
    for (mode, expected) in [("allow", OK), ("deny", OVER), ("local", OK)] {
        let mut redis = RedisServer::start();
        let mut rls = Rls::start(&[("edge.yaml", EDGE)], Some(&redis), mode);
        redis.stop();
        let answer = rls.check("edge", &[&[("client", "z")]]);
        assert_eq!(answer.overall_code, expected, "failure_mode: {mode}");
        if mode != "local" {
            // Nothing was decided: no limit, remaining or reset is claimed.
            assert!(
                answer.response_headers_to_add.is_empty(),
                "{mode}: no RateLimit fields: {:?}",
                answer.response_headers_to_add
            );
            let status = &answer.statuses[0];
            assert!(status.current_limit.is_none(), "{mode}: {status:?}");
            assert!(status.duration_until_reset.is_none(), "{mode}: {status:?}");
        }
        if mode == "local" {
            // Decided in-process at this gateway's share: 3 per minute, so the fourth is over.
            for _ in 0..2 {
                assert_eq!(rls.check("edge", &[&[("client", "z")]]).overall_code, OK);
            }
            assert_eq!(rls.check("edge", &[&[("client", "z")]]).overall_code, OVER);
        }
    }
}

/// A file of envoyproxy/ratelimit's test suite (`tests/fixtures/envoy-ratelimit-suite`).
fn suite_file(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy-ratelimit-suite")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `sluice -t` with `files` (paths in the suite) as its `rls.config_dir`: success and stderr.
fn check_suite_files(files: &[&str]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rls")).unwrap();
    for file in files {
        let name = file.replace('/', "_");
        std::fs::write(dir.path().join("rls").join(name), suite_file(file)).unwrap();
    }
    let yaml = "rls: { listen: 127.0.0.1:1, config_dir: rls }\n";
    support::check_config(dir.path(), yaml)
}

#[test]
fn envoyproxy_ratelimit_test_suite_configs_are_accepted_or_refused_as_upstream_does() {
    let accepted = [
        "examples/ratelimit/config/config.yaml",
        "examples/ratelimit/config/example.yaml",
        "test/config/basic_config.yaml",
        "test/config/duplicate_domain.yaml",
        "test/config/merge_domain_key1.yaml",
        "test/config/merge_domain_key2.yaml",
        "test/config/metadata.yaml",
        "test/config/shadowmode_config.yaml",
        "test/config/share_threshold.yaml",
        "test/config/wildcard.yaml",
        "test/integration/runtime/current/ratelimit/config/another.yaml",
        "test/integration/runtime/current/ratelimit/config/basic.yaml",
        "test/integration/runtime/current/ratelimit/config/share_threshold.yaml",
        "test/integration/runtime/current/ratelimit/reload.yaml",
    ];
    for file in accepted {
        let (ok, said) = check_suite_files(&[file]);
        assert!(ok, "{file}: {said}");
    }
    // Upstream's test/config/config_test.go refuses these; sluice names the file and the path.
    let refused = [
        ("test/config/bad_limit_unit.yaml", "descriptors[0].rate_limit: unit \"foo\""),
        ("test/config/bad_yaml.yaml", "found unexpected end of stream"),
        (
            "test/config/duplicate_key.yaml",
            "descriptors[1]: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        ("test/config/empty_domain.yaml", "domain: required"),
        ("test/config/empty_key.yaml", "descriptors[0].key: required"),
        ("test/config/misspelled_key.yaml", "descriptors[0].ratelimit: "),
        (
            "test/config/misspelled_key2.yaml",
            "descriptors[0].rate_limit.requestsperunit: ",
        ),
        ("test/config/non_map_list.yaml", "descriptors[0]: expected a table"),
        ("test/config/non_string_key.yaml", "0.25: unknown key"),
        (
            "test/config/replaces_empty.yaml",
            "descriptors[0].descriptors[0].rate_limit.replaces[0].name: must not be empty",
        ),
        (
            "test/config/replaces_self.yaml",
            "descriptors[0].descriptors[0].rate_limit.replaces[0].name: must not name the limit itself",
        ),
        (
            "test/config/unlimited_with_unit.yaml",
            "descriptors[0].rate_limit: unit: not with unlimited: true",
        ),
    ];
    for (file, problem) in refused {
        let (ok, said) = check_suite_files(&[file]);
        assert!(!ok, "{file} is refused");
        let named = file.replace('/', "_");
        assert!(
            said.contains(&format!("{named}: {problem}")),
            "{file}: {said}"
        );
    }
    // Two files of one domain are refused (upstream merges them only when told to).
    let (ok, said) = check_suite_files(&[
        "test/config/basic_config.yaml",
        "test/config/duplicate_domain.yaml",
    ]);
    assert!(
        !ok && said.contains("domain \"test-domain\" is defined twice"),
        "{said}"
    );
}

/// Waits, if needed, until a fixed window of a minute has at least 3 s left: a test that fills
/// one and then checks it is refused never straddles two.
fn clear_of_a_minute_boundary() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = now.as_millis() % 60_000;
    if into > 57_000 {
        std::thread::sleep(Duration::from_millis((60_000 - into + 50) as u64));
    }
}

#[test]
fn share_threshold_counts_every_value_a_wildcard_matches_in_one_bucket() {
    let redis = RedisServer::start();
    let file = suite_file("test/config/share_threshold.yaml");
    let mut rls = Rls::start(&[("share.yaml", &file)], Some(&redis), "deny");
    clear_of_a_minute_boundary();
    let ask = |rls: &mut Rls, entries: &[(&str, &str)], hits: u32| {
        let answer = rls.ask(request("test-domain", &[entries], hits));
        answer.expect("an answer").overall_code
    };
    // files/* (100/min, shared): one value takes all 100, another value finds none left.
    assert_eq!(ask(&mut rls, &[("files", "files/a.pdf")], 100), OK);
    assert_eq!(ask(&mut rls, &[("files", "files/b.csv")], 1), OVER);
    // A star in the middle (/api*v1, 100/min, shared).
    assert_eq!(ask(&mut rls, &[("midpath", "/api/users/v1")], 100), OK);
    assert_eq!(ask(&mut rls, &[("midpath", "/api/orders/v1")], 1), OVER);
    assert_eq!(
        rls.check("test-domain", &[&[("midpath", "/api/users/v2")]])
            .statuses[0]
            .current_limit,
        None,
        "/api*v1 does not match a value ending in v2"
    );
    // An exact value beats the wildcard: test1 (50/min) apart from test* (100/min, shared).
    assert_eq!(ask(&mut rls, &[("file", "test1")], 50), OK);
    assert_eq!(ask(&mut rls, &[("file", "test1")], 1), OVER);
    assert_eq!(ask(&mut rls, &[("file", "test2")], 100), OK);
    assert_eq!(ask(&mut rls, &[("file", "test3")], 1), OVER);
    // path/* shared, then file/* not shared (120/min): each file value counts apart.
    let path = |p: &'static str, f: &'static str| [("path", p), ("file", f), ("type", "pdf")];
    assert_eq!(ask(&mut rls, &path("path/a", "file/x"), 120), OK);
    assert_eq!(
        ask(&mut rls, &path("path/b", "file/y"), 120),
        OK,
        "another file"
    );
    assert_eq!(
        ask(&mut rls, &path("path/c", "file/x"), 1),
        OVER,
        "the same file"
    );
}

#[test]
fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
    let file = suite_file("examples/ratelimit/config/example.yaml");
    let mut rls = Rls::start(&[("example.yaml", &file)], None, "deny");
    clear_of_a_minute_boundary();
    let one: &[(&str, &str)] = &[("service", "service_1")];
    let two: &[(&str, &str)] = &[("service", "service_2")];
    // service_1: a quota of 1 a minute.
    assert_eq!(codes(&rls.check("rl", &[one])), (OK, vec![OK]));
    assert_eq!(
        codes(&rls.check("rl", &[one])),
        (OVER, vec![OVER]),
        "its only quota is over"
    );
    // Beside service_2 (2 a minute), which passes: the call passes, service_1 still says over.
    assert_eq!(codes(&rls.check("rl", &[one, two])), (OK, vec![OVER, OK]));
    assert_eq!(codes(&rls.check("rl", &[one, two])), (OK, vec![OVER, OK]));
    assert_eq!(
        codes(&rls.check("rl", &[one, two])),
        (OVER, vec![OVER, OVER]),
        "every quota is over"
    );
    // A limit that is not a quota still refuses: unspec (2 a minute) over, with no quota.
    let unspec: &[(&str, &str)] = &[("unspec", "x")];
    for _ in 0..2 {
        assert_eq!(rls.check("rl", &[unspec]).overall_code, OK);
    }
    assert_eq!(codes(&rls.check("rl", &[unspec])), (OVER, vec![OVER]));
    // The calls refused for their quotas count as limited, with the one refused by unspec.
    let metrics = rls.gateway.metrics();
    let limited = [("domain", "rl"), ("decision", "limited")];
    assert_eq!(metric(&metrics, "sluice_rls_requests_total", &limited), 3.0);
}

const SHADOW_QUOTA: &str = r#"
domain: sq
descriptors:
  - key: q
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: s
    quota_mode: true
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
"#;

#[test]
fn a_shadow_quota_is_never_over_so_it_keeps_the_call_ok() {
    let mut rls = Rls::start(&[("sq.yaml", SHADOW_QUOTA)], None, "deny");
    clear_of_a_minute_boundary();
    let q: &[(&str, &str)] = &[("q", "x")];
    let s: &[(&str, &str)] = &[("s", "x")];
    assert_eq!(codes(&rls.check("sq", &[q, s])), (OK, vec![OK, OK]));
    // Both are past their one a minute; the shadow one says OK, so not every quota is over.
    assert_eq!(codes(&rls.check("sq", &[q, s])), (OK, vec![OVER, OK]));
    assert_eq!(codes(&rls.check("sq", &[q])), (OVER, vec![OVER]));
}

#[test]
fn metadata_of_the_descriptors_that_passed_reaches_envoy_when_asked_for() {
    let file = suite_file("examples/ratelimit/config/example.yaml");
    let files = [("example.yaml", file.as_str())];
    let metadata_of = |rls: &mut Rls, descriptors: &[&[(&str, &str)]]| {
        let answer = rls.check("rl", descriptors);
        answer
            .dynamic_metadata
            .map(|table| json(Some(&Kind::StructValue(table))))
    };
    let mut plain = Rls::start(&files, None, "deny");
    let one: &[(&str, &str)] = &[("service", "service_1")];
    let two: &[(&str, &str)] = &[("service", "service_2")];
    assert_eq!(metadata_of(&mut plain, &[two]), None, "off by default");

    let mut rls = Rls::start_with(&files, None, "deny", ", response_dynamic_metadata: true");
    clear_of_a_minute_boundary();
    let first = metadata_of(&mut rls, &[one, two]).expect("metadata");
    assert_eq!(first["domain"], "rl");
    assert_eq!(
        first["descriptors"],
        serde_json::json!([{"entries": ["service=service_1"]}, {"entries": ["service=service_2"]}])
    );
    // Both passed: their tables merge, the first value of a field kept.
    assert_eq!(first["metadata"]["service_with_quota"]["name"], "service_1");
    // service_1 is over now: only service_2's metadata.
    let next = metadata_of(&mut rls, &[one, two]).expect("metadata");
    assert_eq!(next["metadata"]["service_with_quota"]["name"], "service_2");
    // Nothing passed: no metadata member.
    let none = metadata_of(&mut rls, &[one]).expect("metadata");
    assert!(none.get("metadata").is_none(), "{none}");
}

/// A protobuf value as JSON, for comparing.
fn json(kind: Option<&Kind>) -> serde_json::Value {
    match kind {
        Some(Kind::StringValue(s)) => serde_json::json!(s),
        Some(Kind::NumberValue(n)) => serde_json::json!(n),
        Some(Kind::BoolValue(b)) => serde_json::json!(b),
        Some(Kind::ListValue(list)) => list.values.iter().map(|v| json(v.kind.as_ref())).collect(),
        Some(Kind::StructValue(table)) => table
            .fields
            .iter()
            .map(|(name, v)| (name.clone(), json(v.kind.as_ref())))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
    }
}

fn fixture(name: &str) -> (String, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy-ratelimit")
        .join(name);
    (
        name.to_string(),
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
}

#[test]
fn envoyproxy_ratelimit_documented_examples_load_and_decide_as_documented() {
    let names = [
        "example1.yaml",
        "example2.yaml",
        "example3.yaml",
        "example4.yaml",
        "example5.yaml",
        "example6.yaml",
        "example7.yaml",
        "example8.yaml",
        "example9.yaml",
    ];
    let files: Vec<(String, String)> = names.iter().map(|n| fixture(n)).collect();
    let borrowed: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let redis = RedisServer::start();
    let mut rls = Rls::start(&borrowed, Some(&redis), "deny");
    let limit_of = |response: &RateLimitResponse| {
        response.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit))
    };
    // 1: (database, users) 500/s.
    let r = rls.check("mongo_cps", &[&[("database", "users")]]);
    assert_eq!(limit_of(&r), Some((500, 1)));
    // 2: marketing messages to a number 5/day; any number 100/day; both in one request.
    let marketing = [("message_type", "marketing"), ("to_number", "2061111111")];
    let r = rls.check("messaging", &[&marketing, &[("to_number", "2061111111")]]);
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert_eq!(limit_of(&r), Some((5, 4)));
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        100
    );
    for _ in 0..4 {
        assert_eq!(rls.check("messaging", &[&marketing]).overall_code, OK);
    }
    assert_eq!(
        rls.check("messaging", &[&marketing]).overall_code,
        OVER,
        "the sixth marketing message"
    );
    let other = [("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(
        rls.check("messaging", &[&other]).overall_code,
        OK,
        "each number counts apart"
    );
    // 3: the most specific match: 50.0.0.5 is blocked, others get 10/s.
    assert_eq!(
        rls.check("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]])
            .overall_code,
        OVER
    );
    let r = rls.check("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]]);
    assert_eq!((r.overall_code, limit_of(&r)), (OK, Some((10, 1))));
    // 4: a two-entry descriptor matches only the two-level configuration.
    let r = rls.check("example4", &[&[("key", "value"), ("subkey", "subvalue")]]);
    assert_eq!(limit_of(&r), Some((300, 1)));
    let r = rls.check("example4", &[&[("key", "value")]]);
    assert_eq!(limit_of(&r), None, "one entry: no rule at that level");
    // 5: unlimited ldap (remaining MaxUint32), azure 100/min.
    let r = rls.check("internal", &[&[("ldap", "x")]]);
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OK, u32::MAX)
    );
    assert_eq!(
        limit_of(&rls.check("internal", &[&[("azure", "x")]])),
        Some((100, 2))
    );
    // 6: user-a in shadow mode is never limited; user-b is limited at 20/s.
    let a = [("service", "auth-service"), ("user", "user-a")];
    for _ in 0..15 {
        assert_eq!(rls.check("example6", &[&a]).overall_code, OK);
    }
    let b = [("service", "auth-service"), ("user", "user-b")];
    let r = rls.check("example6", &[&b]);
    assert_eq!(limit_of(&r), Some((20, 1)));
    // 7: together, the 10/s rule replaces the 5/s one, which is left untouched.
    let one = [("key_1", "value_1"), ("user", "bkthomps")];
    let two = [("key_2", "value_2"), ("user", "bkthomps")];
    for _ in 0..8 {
        let r = rls.check("example7", &[&one, &two]);
        assert_eq!(r.overall_code, OK, "only the 10/s limit applies");
        assert!(
            r.statuses[0].current_limit.is_none(),
            "the replaced limit is not evaluated"
        );
    }
    let r = rls.check("example7", &[&one]);
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OK, 4),
        "5/s untouched so far"
    );
    // 8: detailed_metric accepted; value1 20/min, any other value 10/min.
    assert_eq!(
        limit_of(&rls.check("example8", &[&[("key1", "value1")]])),
        Some((20, 2))
    );
    assert_eq!(
        limit_of(&rls.check("example8", &[&[("key1", "other")]])),
        Some((10, 2))
    );
    // 9: a value ending in * matches by prefix.
    assert_eq!(
        limit_of(&rls.check("example9", &[&[("key1", "value_2")]])),
        Some((20, 2))
    );
    assert_eq!(
        limit_of(&rls.check("example9", &[&[("key1", "nope")]])),
        None
    );
}

#[test]
fn sluice_t_names_the_file_and_path_of_every_problem_in_the_directory() {
    let upstream = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("twice.yaml"), "domain: d\n").unwrap();
    let body = Config::new()
        .set(
            "rls",
            format!(
                "{{ listen: 127.0.0.1:{}, config_dir: {} }}",
                free_port(),
                dir.path().display()
            ),
        )
        .route(route("all"))
        .yaml();
    let config = support::GatewayConfig::write(&body, &upstream, None, 0);
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["-t", "-c"])
        .arg(&config.path)
        .output()
        .unwrap();
    assert_eq!(checked.status.code(), Some(1));
    let said = String::from_utf8_lossy(&checked.stderr);
    assert!(said.contains("rls.config_dir"), "{said}");
    assert!(
        said.contains("bad.yaml: descriptors[0].rate_limit: unit \"fortnight\""),
        "{said}"
    );
    assert!(
        said.contains("twice.yaml: domain \"d\" is defined twice"),
        "{said}"
    );
}

/// Runs `sluice` with `args` until it exits (at most 20 s): its exit status and standard error.
fn run_to_exit(args: &[&std::ffi::OsStr]) -> (std::process::ExitStatus, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start sluice");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("sluice kept running with its rate limit service's port taken");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("its output");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_taken_rate_limit_service_port_fails_the_start_with_its_reason() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start();
    let body = Config::new()
        .set(
            "rls",
            format!(
                "{{ listen: 127.0.0.1:{port}, config_dir: {} }}",
                dir.path().display()
            ),
        )
        .route(route("all"))
        .yaml();
    let config = support::GatewayConfig::write(&body, &upstream, None, 0);
    let path = config.path.as_os_str();
    for daemon in [false, true] {
        let mut args = vec![std::ffi::OsStr::new("-c"), path];
        if daemon {
            args.push(std::ffi::OsStr::new("-d"));
        }
        let (status, stderr) = run_to_exit(&args);
        assert!(!status.success(), "-d {daemon}: started anyway: {stderr}");
        let reason = format!("cannot listen on 127.0.0.1:{port}: Address already in use");
        assert_eq!(
            stderr.matches(&reason).count(),
            1,
            "-d {daemon}: the reason, said once: {stderr}"
        );
    }
    drop(taken);
}

/// Windows are aligned to the clock as envoyproxy/ratelimit cuts them (`now - now % unit`, a
/// week of 7 days, a month of 30, a year of 365, all from the Unix epoch): the reset of an
/// exhausted limit is the time to the end of the aligned window, not a whole unit from the
/// first hit.
#[test]
fn windows_are_aligned_to_the_unix_epoch_like_envoyproxy_ratelimit() {
    const DOMAIN: &str = "domain: aligned\ndescriptors:\n  - key: per\n    value: day\n    rate_limit: { unit: day, requests_per_unit: 1 }\n  - key: per\n    value: week\n    rate_limit: { unit: week, requests_per_unit: 1 }\n  - key: per\n    value: month\n    rate_limit: { unit: month, requests_per_unit: 1 }\n  - key: per\n    value: year\n    rate_limit: { unit: year, requests_per_unit: 1 }\n";
    let redis = RedisServer::start();
    let mut rls = Rls::start(&[("aligned.yaml", DOMAIN)], Some(&redis), "deny");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    for (value, unit) in [
        ("day", 86_400),
        ("week", 7 * 86_400),
        ("month", 30 * 86_400),
        ("year", 365 * 86_400),
    ] {
        assert_eq!(codes(&rls.check("aligned", &[&[("per", value)]])).0, OK);
        let before = now();
        let over = rls.check("aligned", &[&[("per", value)]]);
        let after = now();
        assert_eq!(codes(&over).0, OVER, "{value}");
        let reset = over.statuses[0]
            .duration_until_reset
            .as_ref()
            .expect("reset")
            .seconds as u64;
        // The end of the aligned window, seen from either side of the call (to the second).
        let (lo, hi) = (unit - after % unit - 1, unit - before % unit + 1);
        assert!(
            (lo..=hi).contains(&reset),
            "{value}: reset {reset}s, the aligned window ends in {lo}..={hi}s"
        );
    }
}
