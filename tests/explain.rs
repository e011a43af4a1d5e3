//! End to end: the explain endpoint (`GET /v1/explain` on the admin listener) and `sluice
//! explain` offline, through the real binary. The answer names the route, the caller, its plan
//! and tier, and every limit with the key it is counted under; the request then really meets
//! them (its keys are those written in Redis, its `RateLimit-Policy` the quotas told); the
//! peek consumes nothing (the caller is then admitted exactly what it said remained), on
//! Redis and on the in-process backend; offline, the same configuration gives the same keys.

mod support;

use std::process::Command;

use serde_json::Value;
use support::api_keys::KeyFile;
use support::config::{route, Config};
use support::limits::fixed_window;
use support::{http_call, http_get, Gateway, RedisServer, Upstream};

const TOKEN: &str = "explain-admin-token-0123456789";
const BEARER: &str = "Bearer explain-admin-token-0123456789";
const ALICE: &str = "sk_alice_explain_key_00000001";
const BOB: &str = "sk_bob_explain_key_0000000002";

/// A gateway config: alice on free, bob on pro; 5/h per consumer (8/h on pro), 100/h per
/// address; an admin token.
fn body(keys: &KeyFile, redis: bool) -> String {
    let mut config = Config::new();
    if redis {
        config = config.redis("REDIS_URL");
    }
    config
        .set("identity", keys.free_and_pro())
        .set("admin", format!("{{ token: {TOKEN} }}"))
        .route(
            route("api")
                .prefix("/api/")
                .set("auth", "required")
                .set("rate_limit_headers", "true")
                .limit(
                    fixed_window("per_consumer", "5/h")
                        .key(&["consumer"])
                        .set("mode", "exact")
                        .set("plans", "{ pro: { rate: 8/h } }"),
                )
                .limit(
                    fixed_window("per_address", "100/h")
                        .key(&["client_ip"])
                        .set("mode", "exact"),
                ),
        )
        .yaml()
}

/// `GET /v1/explain?query` with the token: status and JSON.
fn explain(gateway: &Gateway, query: &str, token: Option<&str>) -> (u16, Value) {
    let headers: Vec<(&str, &str)> = token.map(|t| ("authorization", t)).into_iter().collect();
    let path = format!("/v1/explain?{query}");
    let answer = http_call(gateway.admin, "GET", &path, None, &headers);
    let json = serde_json::from_str(&answer.body).unwrap_or(Value::String(answer.body.clone()));
    (answer.status, json)
}

/// The explained limit named `name`.
fn limit<'a>(answer: &'a Value, name: &str) -> &'a Value {
    let limits = answer["limits"].as_array().expect("limits");
    limits
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no limit {name} in {answer}"))
}

const ALICE_QUERY: &str =
    "host=example.com&path=/api/x&header=X-API-Key:%20sk_alice_explain_key_00000001";

fn ask(gateway: &Gateway, key: &str) -> support::Response {
    http_get(gateway.proxy, "/api/x", None, &[("x-api-key", key)])
}

/// Alice spends 2 of her 5; explained twice, she has 3 left both times; she is then admitted
/// exactly 3 more.
fn explained_remaining_is_what_she_then_gets(gateway: &Gateway) -> Value {
    for _ in 0..2 {
        assert_eq!(ask(gateway, ALICE).status, 200);
    }
    let (status, first) = explain(gateway, ALICE_QUERY, Some(BEARER));
    assert_eq!(status, 200, "{first}");
    let (_, second) = explain(gateway, ALICE_QUERY, Some(BEARER));
    for answer in [&first, &second] {
        assert_eq!(limit(answer, "per_consumer")["remaining"], 3, "{answer}");
        assert_eq!(limit(answer, "per_address")["remaining"], 98, "{answer}");
    }
    assert_eq!(first["route"]["name"], "api");
    assert_eq!(first["consumer"]["id"], "alice");
    assert_eq!(first["consumer"]["plan"], "free");
    assert_eq!(first["standing"], "limited");
    assert_eq!(first["answer"], Value::Null, "its limits decide");
    let per_consumer = limit(&first, "per_consumer");
    assert_eq!(per_consumer["algorithm"], "fixed_window");
    assert_eq!(
        (
            per_consumer["quota"].clone(),
            per_consumer["window_seconds"].clone()
        ),
        (5.into(), 3600.into())
    );
    assert_eq!(per_consumer["per"], "3600 s", "the window in words");
    assert_eq!(per_consumer["key"], serde_json::json!(["consumer"]));
    let said = ask(gateway, ALICE);
    assert_eq!(said.status, 200);
    let policy = said
        .header("ratelimit-policy")
        .unwrap_or_default()
        .to_string();
    assert!(
        policy.contains("\"per_consumer\";q=5;w=3600"),
        "the quota told is the one met: {policy}"
    );
    let passed = 1 + (0..6).filter(|_| ask(gateway, ALICE).status == 200).count();
    assert_eq!(passed, 3, "admitted exactly the remaining the peek read");
    first
}

#[test]
fn explain_names_what_a_request_then_meets_and_consumes_nothing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[
        (ALICE, "alice", Some("free"), false),
        (BOB, "bob", Some("pro"), false),
    ]);
    let gateway = Gateway::start(&body(&keys, true), &upstream, Some(&redis));
    gateway.wait_ready();
    let first = explained_remaining_is_what_she_then_gets(&gateway);

    // The keys told are the ones her requests were counted under.
    let mut connection = redis.connection();
    for name in ["per_consumer", "per_address"] {
        let key = limit(&first, name)["stored_key"]
            .as_str()
            .expect("a key")
            .to_string();
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut connection)
            .expect("EXISTS");
        assert!(exists, "{name}: {key} is in Redis");
    }

    // A consumer named instead of credentials meets its plan's tier.
    let (_, bob) = explain(
        &gateway,
        "host=example.com&path=/api/y&consumer=bob",
        Some(BEARER),
    );
    assert_eq!(bob["tier"]["name"], "plan pro", "{bob}");
    assert_eq!(limit(&bob, "per_consumer")["quota"], 8);
    assert_eq!(limit(&bob, "per_consumer")["remaining"], 8);
    assert_eq!(
        ask(&gateway, BOB)
            .header("ratelimit-policy")
            .map(|p| p.contains("q=8")),
        Some(true)
    );

    // What the gateway answers before its limits, and why no route.
    let (_, anonymous) = explain(&gateway, "host=example.com&path=/api/x", Some(BEARER));
    assert_eq!(anonymous["answer"]["status"], 401, "{anonymous}");
    let (_, nowhere) = explain(&gateway, "host=example.com&path=/elsewhere", Some(BEARER));
    assert_eq!(
        (
            nowhere["route"].clone(),
            nowhere["answer"]["status"].clone()
        ),
        (Value::Null, 404.into())
    );

    // Behind the token; bad descriptions are refused.
    assert_eq!(explain(&gateway, ALICE_QUERY, None).0, 401);
    assert_eq!(explain(&gateway, ALICE_QUERY, Some("Bearer wrong")).0, 401);
    assert_eq!(
        explain(&gateway, "path=/api/x", Some(BEARER)).0,
        400,
        "host is required"
    );
    assert_eq!(explain(&gateway, "host=a&peer=nope", Some(BEARER)).0, 400);
    // Every refusal is JSON, as the answers are: a problem, in the proxy's shape.
    let refusals = [
        (ALICE_QUERY, None, 401),
        (ALICE_QUERY, Some("Bearer wrong"), 401),
        ("path=/api/x", Some(BEARER), 400),
        ("host=a&peer=nope", Some(BEARER), 400),
        ("host=a&colour=blue", Some(BEARER), 400),
        ("host=a&host=b", Some(BEARER), 400),
        ("host=a&consumer=%FF", Some(BEARER), 400),
        ("host=example.com&consumer=bob&plan=gold", Some(BEARER), 404),
    ];
    for (query, token, status) in refusals {
        let (got, problem) = explain(&gateway, query, token);
        assert_eq!(got, status, "{query}: {problem}");
        assert_eq!(problem["status"], status, "{query}: {problem}");
        assert_eq!(problem["type"], "about:blank", "{problem}");
        assert!(
            problem["title"].is_string() && problem["detail"].is_string(),
            "{problem}"
        );
    }
    // A refusal says what is wrong, and what the endpoint takes instead.
    let (_, unknown) = explain(&gateway, "host=a&colour=blue", Some(BEARER));
    assert_eq!(
        unknown["detail"],
        "unknown parameter \"colour\": use method, host, path, header, headers, peer, consumer and plan"
    );
    let (_, twice) = explain(&gateway, "host=a&host=b", Some(BEARER));
    assert_eq!(twice["detail"], "host is given more than once");
    let path = format!("/v1/explain?{ALICE_QUERY}");
    let anonymous = http_call(gateway.admin, "GET", &path, None, &[]);
    assert_eq!(
        (
            anonymous.header("content-type"),
            anonymous.header("www-authenticate")
        ),
        (
            Some("application/problem+json"),
            Some("Bearer realm=\"sluice admin\"")
        ),
        "the challenge stays"
    );
    let posted = http_call(
        gateway.admin,
        "POST",
        &path,
        None,
        &[("authorization", BEARER)],
    );
    let problem: Value = serde_json::from_str(&posted.body).expect("JSON");
    assert_eq!((posted.status, &problem["status"]), (405, &405.into()));

    // Offline, the same file gives the same route, caller and keys, with nothing read.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["explain", "-c"])
        .arg(&gateway.config_path)
        .args([
            "GET",
            "http://example.com/api/x",
            "-H",
            &format!("X-API-Key: {ALICE}"),
        ])
        .output()
        .expect("sluice explain runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let offline: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(offline["route"], first["route"]);
    assert_eq!(offline["consumer"], first["consumer"]);
    for name in ["per_consumer", "per_address"] {
        assert_eq!(
            limit(&offline, name)["stored_key"],
            limit(&first, name)["stored_key"]
        );
        assert_eq!(
            limit(&offline, name)["remaining"],
            Value::Null,
            "offline reads nothing"
        );
    }
}

#[test]
fn explain_peeks_the_in_process_backend_too() {
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let gateway = Gateway::start(&body(&keys, false), &upstream, None);
    gateway.wait_ready();
    explained_remaining_is_what_she_then_gets(&gateway);
}

#[test]
fn sluice_explain_says_why_it_cannot_answer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "listen: [127.0.0.1:1]\nroutes: nope\n").expect("write");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .output()
            .expect("sluice runs")
    };
    let conf = bad.to_str().expect("a path");
    let out = run(&["explain", "-c", conf, "GET", "http://a/"]);
    assert_eq!(out.status.code(), Some(1), "an invalid configuration");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("routes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["explain", "-c", conf, "GET", "/no-host"]);
    assert_eq!(out.status.code(), Some(2), "a URL without a host");
    let good = dir.path().join("good.yaml");
    let routes =
        "routes: [{ name: r, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:1] } }]";
    std::fs::write(&good, format!("listen: [127.0.0.1:1]\n{routes}\n")).expect("write");
    let conf = good.to_str().expect("a path");
    for bad in [
        &["explain", "-c", conf, "GE T", "http://a/"][..],
        &[
            "explain",
            "-c",
            conf,
            "GET",
            "http://a/",
            "-H",
            "Bad Name: x",
        ],
        &[
            "explain",
            "-c",
            conf,
            "GET",
            "http://a/",
            "--consumer",
            "c",
            "--plan",
            "gold",
        ],
    ] {
        let out = run(bad);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(&["explain", "-c", conf, "GET", "http://a/x"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
