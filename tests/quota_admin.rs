//! End to end: the quota admin API. Two real gateways on one real Redis: a reset, a credit and
//! an override made through one gateway hold on both (exact: the change is made in Redis, and
//! each gateway forgets the denials it cached); a credit sent twice counts once, and ids are
//! bytes; every write is audited and counted, and refused without the token; what the API
//! cannot do (an unknown consumer, a limit local to each gateway) is refused in one answer; a
//! consumer is put on another plan on every route in one call, exactly that plan's limits; the
//! overrides come back when Redis restarts empty, and quotas on a Redis without persistence are
//! warned about. The in-process backend answers the same calls. The audit file is opened again
//! by name on SIGUSR1 and on every reload (logrotate), at the path the configuration names.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::api_keys::KeyFile;
use support::config::{route, Config};
use support::limits::{fixed_window, gcra};
use support::tokens::{claims, now, write_jwks, Algorithm, Family, TestKey};
use support::{http_call, http_get, metric, Gateway, Launch, RedisServer, Upstream};

const TOKEN: &str = "test-admin-token-0123456789";
const ALICE: &str = "sk_alice_quota_admin_key_0001";
const BEARER: &str = "Bearer test-admin-token-0123456789";

/// Calls the quota admin API of `gateway` with the token, as actor `ops`.
fn admin(gateway: &Gateway, method: &str, path_and_query: &str) -> (u16, Value) {
    let headers = [("authorization", BEARER), ("x-audit-actor", "ops")];
    let answer = http_call(gateway.admin, method, path_and_query, None, &headers);
    let json = serde_json::from_str(&answer.body).unwrap_or(Value::String(answer.body.clone()));
    (answer.status, json)
}

fn ask(gateway: &Gateway) -> support::Response {
    http_get(gateway.proxy, "/api/x", None, &[("x-api-key", ALICE)])
}

/// Asks until one request passes (each gateway may hold a cached denial until it reads the
/// change, within a second), then `more` requests across `gateways` in turn: how many passed
/// in all. Denied requests consume nothing, so the count is the units the change made.
fn admitted_after_change(gateways: &[&Gateway], more: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    while ask(gateways[0]).status != 200 {
        assert!(
            Instant::now() < deadline,
            "no request passed after the change"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let passed = (0..more)
        .filter(|i| ask(gateways[i % gateways.len()]).status == 200)
        .count();
    1 + passed
}

/// Asks until `gateway` denies (it has read the change), at most 5 s.
fn denied_eventually(gateway: &Gateway) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while ask(gateway).status != 429 {
        assert!(Instant::now() < deadline, "the gateway never denied");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The audit lines written to `path`.
fn audit_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| serde_json::from_str(line).expect("an audit line is JSON"))
        .collect()
}

/// A gateway config: alice on plan free, 3/h per consumer, exact; admin token; audit to `audit`.
fn body(keys: &KeyFile, audit: &Path, redis: bool) -> String {
    body_with(keys, audit, redis, "")
}

/// [`body`] with `more` in `identity:` (e.g. `, jwt: {...}`).
fn body_with(keys: &KeyFile, audit: &Path, redis: bool, more: &str) -> String {
    let mut config = Config::new();
    if redis {
        config = config.redis("REDIS_URL");
    }
    config
        .set(
            "identity",
            format!(
                "{{ plans: [free], default_plan: free, api_keys: {{ file: {} }}{more} }}",
                keys.path.display()
            ),
        )
        .set(
            "admin",
            format!("{{ token: {TOKEN}, audit_log: {} }}", audit.display()),
        )
        .route(
            route("api")
                .prefix("/api/")
                .set("auth", "required")
                .limit(
                    fixed_window("per_consumer", "3/h")
                        .key(&["consumer"])
                        .set("mode", "exact"),
                )
                .limit(fixed_window("per_address", "100/h").key(&["client_ip"]))
                .limit(
                    fixed_window("per_gateway", "1000/h")
                        .key(&["consumer"])
                        .set("scope", "local"),
                ),
        )
        .route(
            route("open")
                .prefix("/open/")
                .limit(fixed_window("per_caller", "100/h").key(&["route"])),
        )
        .yaml()
}

#[test]
fn resets_credits_and_overrides_hold_on_every_gateway_at_once() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let (audit_a, audit_b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let a = Gateway::start(&body(&keys, &audit_a, true), &upstream, Some(&redis));
    let b = Gateway::start(&body(&keys, &audit_b, true), &upstream, Some(&redis));
    a.wait_ready();
    b.wait_ready();
    for _ in 0..3 {
        let first = ask(&a);
        assert_eq!(first.status, 200, "{}", first.body);
    }
    assert_eq!(ask(&a).status, 429, "a caches this denial");
    assert_eq!(ask(&b).status, 429);

    // Refused without the token, and nothing changes.
    let anonymous = http_call(
        b.admin,
        "POST",
        "/v1/quota/reset?route=api&consumer=alice",
        None,
        &[],
    );
    assert_eq!(anonymous.status, 401);
    let wrong = [("authorization", "Bearer not-the-token-at-all")];
    let path = "/v1/quota/reset?route=api&consumer=alice";
    assert_eq!(http_call(b.admin, "POST", path, None, &wrong).status, 401);

    // Reset through b: alice has her 3 again, on both gateways together (a forgets its denial).
    let (status, reset) = admin(&b, "POST", "/v1/quota/reset?route=api&consumer=alice");
    assert_eq!(status, 200, "{reset}");
    assert_eq!(reset["before"][0]["limit"], "per_consumer");
    assert_eq!(reset["before"][0]["remaining"], 0);
    assert_eq!(reset["after"][0]["remaining"], 3);
    assert_eq!(
        reset["before"].as_array().map(Vec::len),
        Some(1),
        "client_ip not named: {reset}"
    );
    assert_eq!(admitted_after_change(&[&a, &b], 6), 3);

    // Credit 2 through a, and the same credit again through b: 2 units in all.
    let credit = "/v1/quota/credit?route=api&limit=per_consumer&consumer=alice&units=2&id=refund-7";
    let (status, first) = admin(&a, "POST", credit);
    assert_eq!(
        (status, first["credit"].as_str()),
        (200, Some("credited")),
        "{first}"
    );
    let (status, again) = admin(&b, "POST", credit);
    assert_eq!(
        (status, again["credit"].as_str()),
        (200, Some("repeated")),
        "{again}"
    );
    assert_eq!(again["after"][0]["remaining"], 2, "{again}");
    assert_eq!(admitted_after_change(&[&b, &a], 6), 2);

    // Lifted for alice through a: b lets her through within a second, and without counting.
    let off =
        "/v1/quota/overrides?route=api&limit=per_consumer&consumer=alice&quota=off&ttl_seconds=60";
    let (status, set) = admin(&a, "PUT", off);
    assert_eq!(status, 200, "{set}");
    assert_eq!(admitted_after_change(&[&b, &a], 9), 10);
    let (status, listed) = admin(&b, "GET", "/v1/quota/overrides");
    assert_eq!(status, 200);
    let one = &listed["overrides"][0];
    assert_eq!(
        (&one["consumer"], &one["quota"], &one["actor"]),
        (
            &Value::from("alice"),
            &Value::from("off"),
            &Value::from("ops")
        )
    );
    assert!(
        one["expires_in_seconds"]
            .as_u64()
            .is_some_and(|s| (1..=60).contains(&s)),
        "{listed}"
    );

    // Another quota instead, then none: 5 an hour leaves her 2 (she used 3), on both.
    let five =
        "/v1/quota/overrides?route=api&limit=per_consumer&consumer=alice&quota=5&ttl_seconds=60";
    let (status, replaced) = admin(&b, "PUT", five);
    assert_eq!(status, 200, "{replaced}");
    assert_eq!(replaced["before"]["quota"], "off", "{replaced}");
    // a reads the change within a second; until then it still lifts the limit.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (status, policy) = loop {
        let answer = ask(&a);
        let policy = answer
            .header("ratelimit-policy")
            .unwrap_or_default()
            .to_string();
        if policy.contains("\"per_consumer\"") || Instant::now() > deadline {
            break (answer.status, policy);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 200, "{policy}");
    assert!(
        policy.contains("\"per_consumer\";q=5;"),
        "a meets quota 5: {policy}"
    );
    let more = (0..6)
        .filter(|i| ask([&a, &b][i % 2]).status == 200)
        .count();
    assert_eq!(more, 1, "5 in all");
    let (status, _) = admin(
        &a,
        "DELETE",
        "/v1/quota/overrides?route=api&limit=per_consumer&consumer=alice",
    );
    assert_eq!(status, 200);
    denied_eventually(&b);
    let (status, listed) = admin(&a, "GET", "/v1/quota/overrides");
    assert_eq!(
        (status, listed["overrides"].as_array().map(Vec::len)),
        (200, Some(0))
    );

    // Bad targets are refused at their cause.
    let refusals = [
        (
            "PUT",
            "/v1/quota/overrides?route=api&limit=nope&quota=off&ttl_seconds=60",
            404,
        ),
        (
            "PUT",
            "/v1/quota/overrides?route=api&limit=per_consumer&quota=0&ttl_seconds=60",
            400,
        ),
        (
            "PUT",
            "/v1/quota/overrides?route=api&limit=per_consumer&quota=off",
            400,
        ),
        (
            "POST",
            "/v1/quota/reset?route=api&limit=per_address&consumer=alice",
            409,
        ),
        (
            "POST",
            "/v1/quota/credit?route=api&limit=per_consumer&consumer=alice&units=1",
            400,
        ),
        ("POST", "/v1/quota/reset?route=nowhere&consumer=alice", 404),
        (
            "DELETE",
            "/v1/quota/overrides?route=api&limit=per_consumer",
            404,
        ),
        ("GET", "/v1/quota/reset?route=api&consumer=alice", 405),
        // The route verifies no caller: no request of it is a consumer's.
        ("POST", "/v1/quota/reset?route=open&consumer=alice", 409),
        ("PUT", "/v1/quota/overrides?route=open&limit=per_caller&consumer=alice&quota=off&ttl_seconds=9", 409),
    ];
    for (method, call, expected) in refusals {
        assert_eq!(admin(&a, method, call).0, expected, "{method} {call}");
    }

    // Audited: who, what, before and after; counted.
    let lines = audit_lines(&audit_b);
    let reset_line = lines
        .iter()
        .find(|l| l["action"] == "reset")
        .expect("the reset's line");
    assert_eq!(
        (&reset_line["actor"], &reset_line["result"]),
        (&Value::from("ops"), &Value::from("applied"))
    );
    assert_eq!(reset_line["consumer"], "alice");
    assert_eq!(reset_line["after"][0]["remaining"], 3);
    assert!(
        reset_line["time"].is_string() && reset_line["peer"].is_string(),
        "{reset_line}"
    );
    let repeated = lines
        .iter()
        .filter(|l| l["action"] == "credit" && l["result"] == "repeated");
    assert_eq!(repeated.count(), 1);
    let metrics = b.metrics();
    let count = |action: &str, result: &str| {
        metric(
            &metrics,
            "sluice_admin_changes_total",
            &[("action", action), ("result", result)],
        )
    };
    assert_eq!(count("credit", "repeated"), 1.0);
    assert_eq!(count("reset", "applied"), 1.0);
    assert_eq!(count("override_set", "applied"), 1.0);
    let on_a = audit_lines(&audit_a);
    let refused = on_a.iter().filter(|l| l["result"] == "refused").count();
    assert_eq!(
        refused, 9,
        "every refusal past the token is audited: {on_a:?}"
    );
}

/// The `detail` of a problem answer.
fn detail(answer: &Value) -> &str {
    answer["detail"].as_str().unwrap_or_default()
}

#[test]
fn what_the_api_cannot_do_is_refused_and_credit_ids_are_bytes() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = dir.path().join("audit.jsonl");
    let a = Gateway::start(&body(&keys, &audit, true), &upstream, Some(&redis));
    let b = Gateway::start(&body(&keys, &audit, true), &upstream, Some(&redis));
    a.wait_ready();
    b.wait_ready();

    // A consumer no key, no identity.mtls.plans entry and no limit names: 404 naming it, for
    // every call that names a consumer.
    let unknown = [
        ("GET", "/v1/quota?route=api&consumer=mallory"),
        ("POST", "/v1/quota/reset?route=api&consumer=mallory"),
        (
            "POST",
            "/v1/quota/credit?route=api&limit=per_consumer&consumer=mallory&units=1&id=c-1",
        ),
        (
            "PUT",
            "/v1/quota/overrides?route=api&limit=per_consumer&consumer=mallory&quota=off&ttl_seconds=60",
        ),
    ];
    for (method, call) in unknown {
        let (status, answer) = admin(&a, method, call);
        assert_eq!(status, 404, "{method} {call}: {answer}");
        assert!(detail(&answer).contains("\"mallory\""), "{answer}");
    }
    assert_eq!(
        admin(&a, "GET", "/v1/quota/overrides").1["overrides"],
        json!([])
    );

    // A limit local to each gateway: one answer for every write; removing an override of it
    // is still a removal (none is in force).
    let local = [
        ("POST", "/v1/quota/reset?route=api&limit=per_gateway&consumer=alice"),
        (
            "POST",
            "/v1/quota/credit?route=api&limit=per_gateway&consumer=alice&units=1&id=c-2",
        ),
        (
            "PUT",
            "/v1/quota/overrides?route=api&limit=per_gateway&consumer=alice&quota=off&ttl_seconds=60",
        ),
    ];
    let words = "limit \"per_gateway\" is local to each gateway (scope: local): the quota admin API changes only what every gateway shares";
    for (method, call) in local {
        let (status, answer) = admin(&b, method, call);
        assert_eq!((status, detail(&answer)), (409, words), "{method} {call}");
    }
    let delete = "/v1/quota/overrides?route=api&limit=per_gateway&consumer=alice";
    assert_eq!(admin(&b, "DELETE", delete).0, 404, "no such override");

    // Two ids that are not UTF-8 are two credits; the same bytes again are one.
    for _ in 0..3 {
        assert_eq!(ask(&a).status, 200);
    }
    assert_eq!(ask(&b).status, 429);
    let credit = |id: &str| {
        let call =
            format!("/v1/quota/credit?route=api&limit=per_consumer&consumer=alice&units=1&id={id}");
        admin(&a, "POST", &call).1
    };
    let ff = credit("%FF");
    assert_eq!(
        (&ff["credit"], &ff["id"]),
        (&json!("credited"), &json!("%FF")),
        "{ff}"
    );
    assert_eq!(ff["id_encoding"], "percent");
    assert_eq!(credit("%FE")["credit"], "credited", "another id");
    assert_eq!(credit("%FF")["credit"], "repeated");
    assert_eq!(admitted_after_change(&[&b, &a], 4), 2);
    let lines = audit_lines(&audit);
    let credited: Vec<&Value> = lines
        .iter()
        .filter(|l| l["action"] == "credit" && l["result"] == "applied")
        .collect();
    assert_eq!(credited.len(), 2, "{lines:?}");
    assert_eq!(credited[1]["id"], "%FE");
    // A query that is not one: not audited.
    let (status, answer) = admin(&a, "POST", "/v1/quota/reset?route=api&consumer=%FF");
    assert_eq!(status, 400, "{answer}");
    assert!(detail(&answer).contains("consumer"), "{answer}");
}

#[test]
fn the_in_process_backend_answers_the_same_calls() {
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = dir.path().join("audit.jsonl");
    let gateway = Gateway::start(&body(&keys, &audit, false), &upstream, None);
    gateway.wait_ready();
    for _ in 0..3 {
        assert_eq!(ask(&gateway).status, 200);
    }
    assert_eq!(ask(&gateway).status, 429);
    let (status, reset) = admin(&gateway, "POST", "/v1/quota/reset?route=api&consumer=alice");
    assert_eq!(
        (status, &reset["after"][0]["remaining"]),
        (200, &Value::from(3)),
        "{reset}"
    );
    assert_eq!(admitted_after_change(&[&gateway], 5), 3);
    let credit = "/v1/quota/credit?route=api&limit=per_consumer&consumer=alice&units=1&id=c1";
    assert_eq!(admin(&gateway, "POST", credit).1["credit"], "credited");
    assert_eq!(admin(&gateway, "POST", credit).1["credit"], "repeated");
    assert_eq!(admitted_after_change(&[&gateway], 5), 1);
    // A reset of the per-address limit by the client's address.
    let by_address = "/v1/quota/reset?route=api&limit=per_address&client_ip=127.0.0.1";
    let (status, reset) = admin(&gateway, "POST", by_address);
    assert_eq!(
        (status, &reset["after"][0]["remaining"]),
        (200, &Value::from(100)),
        "{reset}"
    );
    let off = "/v1/quota/overrides?route=api&limit=per_consumer&quota=off&ttl_seconds=30";
    assert_eq!(admin(&gateway, "PUT", off).0, 200);
    assert_eq!(
        admitted_after_change(&[&gateway], 4),
        5,
        "lifted for every caller"
    );
    let (_, listed) = admin(&gateway, "GET", "/v1/quota/overrides");
    assert_eq!(listed["overrides"][0]["consumer"], Value::Null);
    let delete = "/v1/quota/overrides?route=api&limit=per_consumer";
    assert_eq!(admin(&gateway, "DELETE", delete).0, 200);
    assert_eq!(
        ask(&gateway).status,
        429,
        "this gateway applies its own write at once"
    );
    assert_eq!(audit_lines(&audit).len(), 6, "one line per write");
}

/// The `action`s of the audit lines in `path`, in order.
fn audited_actions(path: &Path) -> Vec<String> {
    audit_lines(path)
        .iter()
        .map(|line| line["action"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_audit_file_is_opened_again_on_sigusr1_and_on_every_reload() {
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let (audit, rotated) = (dir.path().join("audit.jsonl"), dir.path().join("audit.1"));
    let gateway = Gateway::start(&body(&keys, &audit, false), &upstream, None);
    gateway.wait_ready();
    let set = "/v1/quota/overrides?route=api&limit=per_consumer&quota=off&ttl_seconds=30";
    let delete = "/v1/quota/overrides?route=api&limit=per_consumer";
    assert_eq!(admin(&gateway, "PUT", set).0, 200);
    // As logrotate does: move the file, then signal.
    std::fs::rename(&audit, &rotated).expect("the audit file moved away");
    gateway.signal("USR1");
    support::eventually(Duration::from_secs(10), "SIGUSR1 opens it again", || {
        audit.exists()
    });
    assert_eq!(admin(&gateway, "DELETE", delete).0, 200);
    assert_eq!(audited_actions(&rotated), ["override_set"], "the old file");
    assert_eq!(audited_actions(&audit), ["override_delete"], "the new one");

    // A reload that names another file: its lines go there.
    let elsewhere = dir.path().join("elsewhere.jsonl");
    assert!(gateway.reload(&body(&keys, &elsewhere, false)));
    assert_eq!(admin(&gateway, "PUT", set).0, 200);
    assert_eq!(audited_actions(&elsewhere), ["override_set"]);
    assert_eq!(
        audited_actions(&audit),
        ["override_delete"],
        "left as it was"
    );

    // Moved away, then a reload (no SIGUSR1): the path is opened again too.
    let moved = dir.path().join("elsewhere.1");
    std::fs::rename(&elsewhere, &moved).expect("moved away");
    assert!(gateway.reload(&body(&keys, &elsewhere, false)));
    assert_eq!(admin(&gateway, "DELETE", delete).0, 200);
    assert_eq!(audited_actions(&moved), ["override_set"]);
    assert_eq!(audited_actions(&elsewhere), ["override_delete"]);
}

#[test]
fn a_consumer_only_tokens_name_is_taken_and_a_reset_that_finds_nothing_of_it_is_404() {
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let (audit, jwks) = (dir.path().join("audit.jsonl"), dir.path().join("jwks.json"));
    let key = TestKey::generate(Family::P256, Algorithm::ES256, Some("k1"));
    write_jwks(&jwks, &[&key]);
    let jwt = format!(
        ", jwt: {{ jwks_file: {}, algorithms: [ES256] }}",
        jwks.display()
    );
    let gateway = Gateway::start(&body_with(&keys, &audit, false, &jwt), &upstream, None);
    gateway.wait_ready();
    // No list holds tok-user, but a token may name it: its usage is read, its overrides taken.
    let (status, usage) = admin(&gateway, "GET", "/v1/quota?route=api&consumer=tok-user");
    assert_eq!(status, 200, "{usage}");
    // A reset that finds nothing counted for it: no request may ever have been its.
    let reset = "/v1/quota/reset?route=api&consumer=tok-user";
    let (status, answer) = admin(&gateway, "POST", reset);
    assert_eq!(status, 404, "{answer}");
    assert!(detail(&answer).contains("\"tok-user\""), "{answer}");
    let token = key.sign(&claims("tok-user", "any", "any", now()));
    let authorization = format!("Bearer {token}");
    let served = http_get(
        gateway.proxy,
        "/api/x",
        None,
        &[("authorization", &authorization)],
    );
    assert_eq!(served.status, 200, "{}", served.body);
    let (status, answer) = admin(&gateway, "POST", reset);
    // per_consumer and per_gateway: without Redis, the limits local to each gateway are all.
    assert_eq!(
        (status, &answer["keys_reset"]),
        (200, &json!(2)),
        "{answer}"
    );
}

const BOB: &str = "sk_bob_quota_admin_key_00002";

/// Plans free and pro (alice on free, bob on pro); route `api` (a per-consumer quota and a
/// per-second GCRA, each with pro's own parameters), route `other` (pro's own quota), route
/// `pro_only` (only pro may call it).
fn plans_body(keys: &KeyFile, audit: &Path, redis: bool) -> String {
    let mut config = Config::new();
    if redis {
        config = config.redis("REDIS_URL");
    }
    let consumer = |limit: support::limits::Limit, pro: &str| {
        limit
            .key(&["consumer"])
            .set("mode", "exact")
            .set("plans", format!("{{ pro: {{ {pro} }} }}"))
    };
    config
        .set(
            "identity",
            format!(
                "{{ plans: [free, pro], default_plan: free, api_keys: {{ file: {} }} }}",
                keys.path.display()
            ),
        )
        .set(
            "admin",
            format!("{{ token: {TOKEN}, audit_log: {} }}", audit.display()),
        )
        .route(
            route("api")
                .prefix("/api/")
                .set("auth", "required")
                .limit(consumer(fixed_window("per_consumer", "3/h"), "rate: 6/h"))
                .limit(consumer(
                    gcra("per_second", "5/s").burst(5),
                    "rate: 20/s, burst: 21",
                )),
        )
        .route(
            route("other")
                .prefix("/other/")
                .set("auth", "required")
                .limit(consumer(fixed_window("daily", "2/h"), "rate: 4/h")),
        )
        .route(
            route("pro_only")
                .prefix("/pro/")
                .set("auth", "{ mode: required, plans: [pro] }"),
        )
        .yaml()
}

/// `key`'s request for `path` through `gateway`.
fn ask_as(gateway: &Gateway, key: &str, path: &str) -> support::Response {
    http_get(gateway.proxy, path, None, &[("x-api-key", key)])
}

/// The `RateLimit-Policy` `key` meets on `path` through `gateway` (one request).
fn policy_of(gateway: &Gateway, key: &str, path: &str) -> String {
    let answer = ask_as(gateway, key, path);
    answer
        .header("ratelimit-policy")
        .unwrap_or_default()
        .to_string()
}

/// Asks until alice meets `expected` on `path` through `gateway` (within 5 s).
fn alice_meets(gateway: &Gateway, path: &str, expected: &str) {
    support::eventually(Duration::from_secs(5), "alice's policy", || {
        policy_of(gateway, ALICE, path) == expected
    });
}

#[test]
fn a_plan_override_puts_a_consumer_on_another_plan_on_every_route_and_every_gateway() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[
        (ALICE, "alice", Some("free"), false),
        (BOB, "bob", Some("pro"), false),
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    let (audit_a, audit_b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let a = Gateway::start(&plans_body(&keys, &audit_a, true), &upstream, Some(&redis));
    let b = Gateway::start(&plans_body(&keys, &audit_b, true), &upstream, Some(&redis));
    a.wait_ready();
    b.wait_ready();
    let pro_api = policy_of(&a, BOB, "/api/x");
    let free_api = policy_of(&a, ALICE, "/api/x");
    assert!(pro_api.contains("\"per_consumer\";q=6;"), "{pro_api}");
    assert_ne!(pro_api, free_api);
    assert_eq!(ask_as(&b, ALICE, "/pro/x").status, 403, "not on pro");

    // Refused at their cause.
    let refusals = [
        (
            "PUT",
            "/v1/quota/plans?consumer=alice&plan=gold&ttl_seconds=60",
            404,
        ),
        (
            "PUT",
            "/v1/quota/plans?consumer=mallory&plan=pro&ttl_seconds=60",
            404,
        ),
        ("PUT", "/v1/quota/plans?consumer=alice&plan=pro", 400),
        (
            "PUT",
            "/v1/quota/plans?consumer=alice&plan=pro&until=2020-01-01T00:00:00Z",
            400,
        ),
        ("DELETE", "/v1/quota/plans?consumer=alice", 404),
        ("GET", "/v1/quota/plans?consumer=alice", 405),
    ];
    for (method, call, expected) in refusals {
        let (status, answer) = admin(&a, method, call);
        assert_eq!(status, expected, "{method} {call}: {answer}");
    }

    // Alice on pro for an hour, in one call through a: every route, on both gateways.
    let until = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600);
    let call = format!("/v1/quota/plans?consumer=alice&plan=pro&until={until}");
    let (status, set) = admin(&a, "PUT", &call);
    assert_eq!(status, 200, "{set}");
    assert_eq!(
        (&set["after"]["plan"], &set["before"]),
        (&json!("pro"), &Value::Null)
    );
    alice_meets(&b, "/api/x", &pro_api);
    alice_meets(&a, "/api/x", &pro_api);
    assert_eq!(
        ask_as(&b, ALICE, "/pro/x").status,
        200,
        "auth.plans reads pro"
    );
    // Exactly pro's quota on the other route, counted across both gateways: 4 an hour (the
    // polls above and below included; before b read the change she met free's 2 on the same key).
    let pro_other = policy_of(&a, BOB, "/other/x");
    let mut admitted = 0;
    support::eventually(Duration::from_secs(5), "b reads the plan", || {
        let answer = ask_as(&b, ALICE, "/other/x");
        admitted += usize::from(answer.status == 200);
        answer.header("ratelimit-policy") == Some(pro_other.as_str())
    });
    for i in 0..8 {
        let gateway = [&a, &b][i % 2];
        admitted += usize::from(ask_as(gateway, ALICE, "/other/x").status == 200);
    }
    assert_eq!(admitted, 4, "pro's 4 an hour, not free's 2 scaled");

    // Listed, audited and counted.
    let (_, listed) = admin(&b, "GET", "/v1/quota/overrides");
    let one = &listed["overrides"][0];
    assert_eq!(
        (&one["kind"], &one["consumer"], &one["plan"], &one["actor"]),
        (
            &json!("plan"),
            &json!("alice"),
            &json!("pro"),
            &json!("ops")
        ),
        "{listed}"
    );
    let left = one["expires_in_seconds"].as_u64().unwrap_or_default();
    assert!((3590..=3600).contains(&left), "{listed}");
    let line = audit_lines(&audit_a)
        .into_iter()
        .find(|l| l["action"] == "plan_set" && l["result"] == "applied")
        .expect("the plan override's audit line");
    assert_eq!(
        (&line["consumer"], &line["plan"]),
        (&json!("alice"), &json!("pro"))
    );
    let set_count = metric(
        &a.metrics(),
        "sluice_admin_changes_total",
        &[("action", "plan_set"), ("result", "applied")],
    );
    assert_eq!(set_count, 1.0);

    // Removed: back on free everywhere.
    let (status, removed) = admin(&b, "DELETE", "/v1/quota/plans?consumer=alice");
    assert_eq!(
        (status, &removed["before"]["plan"]),
        (200, &json!("pro")),
        "{removed}"
    );
    alice_meets(&a, "/api/x", &free_api);
    alice_meets(&b, "/api/x", &free_api);
    assert_eq!(ask_as(&a, ALICE, "/pro/x").status, 403);
    let deleted = audit_lines(&audit_b)
        .into_iter()
        .filter(|l| l["action"] == "plan_delete" && l["result"] == "applied")
        .count();
    assert_eq!(deleted, 1);

    // Expiring: a second's override lapses on both gateways without another call.
    let (status, _) = admin(
        &a,
        "PUT",
        "/v1/quota/plans?consumer=alice&plan=pro&ttl_seconds=1",
    );
    assert_eq!(status, 200);
    alice_meets(&b, "/api/x", &pro_api);
    alice_meets(&b, "/api/x", &free_api);
    alice_meets(&a, "/api/x", &free_api);
    assert_eq!(
        admin(&a, "GET", "/v1/quota/overrides").1["overrides"],
        json!([])
    );
}

#[test]
fn the_in_process_backend_puts_a_consumer_on_another_plan_too() {
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[
        (ALICE, "alice", Some("free"), false),
        (BOB, "bob", Some("pro"), false),
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = dir.path().join("audit.jsonl");
    let gateway = Gateway::start(&plans_body(&keys, &audit, false), &upstream, None);
    gateway.wait_ready();
    let pro_api = policy_of(&gateway, BOB, "/api/x");
    let free_api = policy_of(&gateway, ALICE, "/api/x");
    let call = "/v1/quota/plans?consumer=alice&plan=pro&ttl_seconds=60";
    assert_eq!(admin(&gateway, "PUT", call).0, 200);
    assert_eq!(
        policy_of(&gateway, ALICE, "/api/x"),
        pro_api,
        "applied at once"
    );
    let (_, usage) = admin(&gateway, "GET", "/v1/quota?route=api&consumer=alice");
    assert_eq!(
        usage["plan"], "pro",
        "the usage API reads the plan in force: {usage}"
    );
    assert_eq!(
        admin(&gateway, "DELETE", "/v1/quota/plans?consumer=alice").0,
        200
    );
    assert_eq!(policy_of(&gateway, ALICE, "/api/x"), free_api);
}

/// The audit lines of `paths` together.
fn audit_lines_of(paths: &[&Path]) -> Vec<Value> {
    paths.iter().flat_map(|path| audit_lines(path)).collect()
}

/// The overrides `gateway` lists (none while it cannot read them: Redis restarting).
fn listed(gateway: &Gateway) -> Vec<Value> {
    let (_, listed) = admin(gateway, "GET", "/v1/quota/overrides");
    listed["overrides"].as_array().cloned().unwrap_or_default()
}

/// A gateway whose log (at `info`) is kept for [`Gateway::log`].
fn logged(body: &str, upstream: &Upstream, redis: Option<&RedisServer>) -> Gateway {
    let launch = Launch {
        capture_log: true,
        log_level: Some("info"),
        ..Launch::default()
    };
    Gateway::launch(body, upstream, redis, &launch)
}

#[test]
fn overrides_held_by_the_gateways_come_back_when_redis_restarts_empty() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[
        (ALICE, "alice", Some("free"), false),
        (BOB, "bob", Some("pro"), false),
    ]);
    let dir = tempfile::tempdir().expect("temp dir");
    let (audit_a, audit_b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let a = logged(&plans_body(&keys, &audit_a, true), &upstream, Some(&redis));
    let b = logged(&plans_body(&keys, &audit_b, true), &upstream, Some(&redis));
    a.wait_ready();
    b.wait_ready();
    let pro_api = policy_of(&a, BOB, "/api/x");
    // Alice on pro, with her own quota of 3 on `other`; and an override set, then deleted.
    let calls = [
        (
            "PUT",
            "/v1/quota/plans?consumer=alice&plan=pro&ttl_seconds=600",
        ),
        (
            "PUT",
            "/v1/quota/overrides?route=other&limit=daily&consumer=alice&quota=3&ttl_seconds=600",
        ),
        (
            "PUT",
            "/v1/quota/overrides?route=api&limit=per_consumer&quota=off&ttl_seconds=600",
        ),
        ("DELETE", "/v1/quota/overrides?route=api&limit=per_consumer"),
    ];
    for (method, call) in calls {
        let (status, answer) = admin(&a, method, call);
        assert_eq!(status, 200, "{method} {call}: {answer}");
    }
    let other = "\"daily\";q=3;";
    for gateway in [&a, &b] {
        alice_meets(gateway, "/api/x", &pro_api);
        support::eventually(Duration::from_secs(5), "the override of other", || {
            policy_of(gateway, ALICE, "/other/x").contains(other)
        });
        support::eventually(Duration::from_secs(5), "the deletion", || {
            policy_of(gateway, BOB, "/api/x").contains("\"per_consumer\"")
        });
    }
    let before = listed(&a);
    assert_eq!(before.len(), 2, "{before:?}");

    // Redis restarts empty: the gateways write back what they hold.
    redis.restart(&[]);
    support::eventually(Duration::from_secs(10), "the overrides back", || {
        listed(&b).len() == 2
    });
    for one in listed(&b) {
        let was = before
            .iter()
            .find(|w| w["kind"] == one["kind"])
            .expect("the same kinds");
        let (left, had) = (&one["expires_in_seconds"], &was["expires_in_seconds"]);
        assert!(left.as_u64() <= had.as_u64(), "{one} after {was}");
        assert_eq!(
            (&one["consumer"], &one["actor"]),
            (&json!("alice"), &json!("ops"))
        );
    }
    alice_meets(&b, "/api/x", &pro_api);
    alice_meets(&a, "/api/x", &pro_api);
    assert!(policy_of(&b, ALICE, "/other/x").contains(other));
    assert!(
        policy_of(&a, BOB, "/api/x").contains("\"per_consumer\""),
        "the deleted override stays deleted"
    );
    // One `restored` line per override, across both gateways; and it is counted.
    let restored = || {
        let lines = audit_lines_of(&[&audit_a, &audit_b]);
        let restored: Vec<Value> = lines
            .into_iter()
            .filter(|l| l["action"] == "restore" && l["result"] == "restored")
            .collect();
        restored
    };
    support::eventually(Duration::from_secs(5), "the restore's audit", || {
        restored().len() == 2
    });
    std::thread::sleep(Duration::from_millis(1500));
    let lines = restored();
    let kinds: Vec<&Value> = lines.iter().map(|l| &l["kind"]).collect();
    assert_eq!(
        lines.len(),
        2,
        "once per override, whoever wrote it: {lines:?}"
    );
    assert!(
        kinds.contains(&&json!("plan")) && kinds.contains(&&json!("limit")),
        "{lines:?}"
    );
    let counted: f64 = [&a, &b]
        .iter()
        .map(|g| {
            let labels = [("action", "restore"), ("result", "restored")];
            metric(&g.metrics(), "sluice_admin_changes_total", &labels)
        })
        .sum();
    assert_eq!(counted, 2.0);
    let said = format!("{}{}", a.log(), b.log());
    assert!(said.contains("Redis lost its admin tables"), "{said}");
    assert!(
        said.contains("calendar quotas included, was lost"),
        "{said}"
    );

    // Restarted empty again, and written to at once, before any gateway's next read: the write
    // reads the epoch first, so the loss is still found and the overrides come back with it.
    redis.restart(&[]);
    let bob_off =
        "/v1/quota/overrides?route=api&limit=per_consumer&consumer=bob&quota=off&ttl_seconds=600";
    support::eventually(
        Duration::from_secs(10),
        "a write once Redis answers",
        || admin(&a, "PUT", bob_off).0 == 200,
    );
    support::eventually(
        Duration::from_secs(10),
        "the overrides back beside it",
        || listed(&b).len() == 3,
    );
}

/// `/readyz` of `gateway`: its status and text.
fn readyz(gateway: &Gateway) -> (u16, String) {
    let answer = http_get(gateway.admin, "/readyz", None, &[]);
    (answer.status, answer.body)
}

#[test]
fn quotas_on_a_redis_without_persistence_are_warned_about() {
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = dir.path().join("audit.jsonl");

    // The test Redis runs without persistence: a quota limit (3 an hour) is at risk, said in
    // the log, on /readyz (still ready) and on the dashboard.
    let plain = RedisServer::start();
    let gateway = logged(&plans_body(&keys, &audit, true), &upstream, Some(&plain));
    gateway.wait_ready();
    support::eventually(Duration::from_secs(10), "the warning", || {
        readyz(&gateway).1.contains("quota durability:")
    });
    let (status, said) = readyz(&gateway);
    assert_eq!(status, 200, "{said}");
    assert!(said.starts_with("ready:"), "{said}");
    assert!(
        said.contains("runs without persistence (neither AOF nor RDB)"),
        "{said}"
    );
    assert!(
        said.contains("api/per_consumer") && said.contains("appendfsync everysec"),
        "{said}"
    );
    assert!(
        gateway.log().contains("runs without persistence"),
        "{}",
        gateway.log()
    );
    let headers = [("authorization", BEARER)];
    let overview = http_call(gateway.admin, "GET", "/ui/", None, &headers).body;
    assert!(overview.contains("Quota durability"), "{overview}");
    assert!(overview.contains("runs without persistence"), "{overview}");

    // With an append-only file: nothing to say.
    let durable = RedisServer::start_with_args(&["--appendonly", "yes"]);
    let kept = logged(&plans_body(&keys, &audit, true), &upstream, Some(&durable));
    kept.wait_ready();
    support::eventually(Duration::from_secs(10), "the reading", || {
        kept.log().contains("keeps an append-only file")
    });
    assert!(
        !readyz(&kept).1.contains("quota durability"),
        "{}",
        readyz(&kept).1
    );

    // CONFIG renamed away, as managed Redis does: it cannot tell.
    let managed = RedisServer::start_with_args(&["--rename-command", "CONFIG", ""]);
    let unsure = logged(&plans_body(&keys, &audit, true), &upstream, Some(&managed));
    unsure.wait_ready();
    support::eventually(Duration::from_secs(10), "cannot tell", || {
        readyz(&unsure)
            .1
            .contains("cannot tell whether it persists")
    });

    // No quota limit, nothing to say; a reload that adds one reads Redis again.
    let rates = Config::new()
        .redis("REDIS_URL")
        .route(
            route("api")
                .prefix("/api/")
                .limit(gcra("per_second", "5/s")),
        )
        .yaml();
    let fast = logged(&rates, &upstream, Some(&plain));
    fast.wait_ready();
    assert!(!readyz(&fast).1.contains("quota durability"));
    let hourly = Config::new()
        .redis("REDIS_URL")
        .route(
            route("api")
                .prefix("/api/")
                .limit(fixed_window("per_hour", "100/h")),
        )
        .yaml();
    assert!(fast.reload(&hourly), "{}", fast.log());
    support::eventually(
        Duration::from_secs(10),
        "the warning after the reload",
        || readyz(&fast).1.contains("api/per_hour"),
    );
}

#[test]
fn every_master_of_a_cluster_is_read() {
    let cluster = support::topologies::RedisCluster::start();
    let upstream = Upstream::start();
    let config = Config::new()
        .redis_section(&[
            "mode: cluster",
            &format!("nodes: [{}]", cluster.urls().join(", ")),
            "timeout_ms: 500",
        ])
        .route(
            route("api")
                .prefix("/api/")
                .limit(fixed_window("per_day", "1000/d")),
        )
        .yaml();
    let gateway = logged(&config, &upstream, None);
    gateway.wait_ready();
    support::eventually(Duration::from_secs(20), "each master's reading", || {
        let said = readyz(&gateway).1;
        let masters = cluster.masters();
        said.contains("api/per_day")
            && masters.len() == 3
            && masters.iter().all(|port| {
                said.contains(&format!(
                    ":{port} runs without persistence (neither AOF nor RDB)"
                ))
            })
    });
}
