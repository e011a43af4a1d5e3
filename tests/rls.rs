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
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let port = free_port();
        let mut config = Config::new().set(
            "rls",
            format!(
                "{{ listen: 127.0.0.1:{port}, config_dir: {}, failure_mode: {failure_mode} }}",
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
