//! End to end: consumers and plans. Real gateways verify API keys from a hashed key file, give
//! each consumer its plan's limits in one shared Redis, refuse bad credentials before any limit,
//! and answer the usage API without consuming anything.

mod support;

use std::collections::BTreeMap;

use redis::Commands;
use support::api_keys::KeyFile;
use support::config::{route, Config, Route};
use support::limits::{calendar, common, fixed_window, gcra, uses};
use support::{http_call, http_get, metric, Gateway, RedisServer, Upstream};

/// The admin token of these tests' usage API.
const TOKEN: &str = "test-admin-token-0123456789";

const KEY_A1: &str = "sk_consumer_a_first_key_0001";
const KEY_A2: &str = "sk_consumer_a_second_key_002";
const KEY_B: &str = "sk_consumer_b_pro_key_000003";
const KEY_VIP: &str = "sk_consumer_vip_key_00000004";
const KEY_REVOKED: &str = "sk_consumer_a_revoked_key_05";

fn keys() -> Vec<(&'static str, &'static str, Option<&'static str>, bool)> {
    vec![
        (KEY_A1, "alice", Some("free"), false),
        (KEY_A2, "alice", Some("free"), false),
        (KEY_B, "bob", Some("pro"), false),
        (KEY_VIP, "vip", Some("free"), false),
        (KEY_REVOKED, "alice", Some("free"), true),
    ]
}

/// Plans free and pro; API keys from `file`.
fn identity(file: &KeyFile) -> Config {
    Config::new()
        .redis("REDIS_URL")
        .set(
            "identity",
            format!(
                "{{ plans: [free, pro], default_plan: free, api_keys: {{ file: {} }} }}",
                file.path.display()
            ),
        )
        .set("admin", format!("{{ token: {TOKEN} }}"))
}

/// `/api/`: per consumer 10/h on free, 100/h on pro, 20/h for consumer vip.
fn plan_route() -> Route {
    route("api").prefix("/api/").set("auth", "required").limit(
        fixed_window("per_consumer", "10/h")
            .key(&["consumer"])
            .set("plans", "{ pro: { rate: 100/h } }")
            .set("consumers", "{ vip: { rate: 20/h } }"),
    )
}

fn get_with_key(gateway: &Gateway, path: &str, key: &str) -> support::Response {
    http_get(gateway.proxy, path, None, &[("x-api-key", key)])
}

#[test]
fn each_consumer_is_admitted_exactly_its_plan_whichever_gateway_and_key() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let config = identity(&file).route(plan_route());
    let one = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    let two = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    one.wait_ready();
    two.wait_ready();
    let gateways = [&one, &two];
    let mut admitted: BTreeMap<&str, usize> = BTreeMap::new();
    // Alice alternates her two keys and both gateways; each consumer asks for more than its plan.
    let callers = [
        ("alice", [KEY_A1, KEY_A2], 25),
        ("bob", [KEY_B, KEY_B], 130),
        ("vip", [KEY_VIP, KEY_VIP], 40),
    ];
    for (consumer, keys, asks) in callers {
        for i in 0..asks {
            let response = get_with_key(gateways[i % 2], "/api/x", keys[(i / 2) % 2]);
            match response.status {
                200 => *admitted.entry(consumer).or_default() += 1,
                429 => {}
                other => panic!("{consumer}: {other}: {}", response.body),
            }
        }
    }
    assert_eq!(
        admitted,
        BTreeMap::from([("alice", 10), ("bob", 100), ("vip", 20)]),
        "free 10/h (two keys, one bucket), pro 100/h, vip's own 20/h and not also free's 10/h"
    );
    let policy = |key| {
        get_with_key(&one, "/api/x", key)
            .header("ratelimit-policy")
            .map(str::to_string)
    };
    assert_eq!(
        policy(KEY_B).as_deref(),
        Some("\"per_consumer\";q=100;w=3600"),
        "each caller sees its own plan's limits"
    );
    assert_eq!(
        policy(KEY_A1).as_deref(),
        Some("\"per_consumer\";q=10;w=3600")
    );
    let metrics = one.metrics();
    let plan_count = |plan, decision| {
        metric(
            &metrics,
            "sluice_plan_requests_total",
            &[("route", "api"), ("plan", plan), ("decision", decision)],
        )
    };
    assert!(plan_count("pro", "allowed") > 0.0 && plan_count("free", "limited") > 0.0);
    assert!(
        !metrics.contains("alice") && !metrics.contains("bob"),
        "a consumer id is never a label"
    );
}

#[test]
fn bad_credentials_are_refused_before_any_limit_or_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let config = identity(&file).route(plan_route()).route(
        route("pro_only")
            .prefix("/pro/")
            .set("auth", "{ mode: required, plans: [pro] }"),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    let missing = gateway.get("/api/x");
    assert_eq!(missing.status, 401, "{}", missing.body);
    assert_eq!(
        missing.header("www-authenticate"),
        Some("ApiKey realm=\"sluice\", header=\"x-api-key\"")
    );
    assert!(missing.body.contains("This route requires a credential."));
    let unknown = get_with_key(&gateway, "/api/x", "sk_nobody_has_this_key_0000");
    assert_eq!(unknown.status, 401);
    let revoked = get_with_key(&gateway, "/api/x", KEY_REVOKED);
    assert_eq!(revoked.status, 403, "{}", revoked.body);
    assert_eq!(revoked.header("www-authenticate"), None);
    let repeated = http_get(
        gateway.proxy,
        "/api/x",
        None,
        &[("x-api-key", KEY_A1), ("x-api-key", KEY_A2)],
    );
    assert_eq!(repeated.status, 401);
    let wrong_plan = get_with_key(&gateway, "/pro/x", KEY_A1);
    assert_eq!(wrong_plan.status, 403, "{}", wrong_plan.body);
    assert_eq!(upstream.served(), 0, "nothing refused reached the upstream");
    let keys: Vec<String> = redis.connection().keys("*").unwrap();
    assert!(keys.is_empty(), "nor Redis: {keys:?}");
    let passed = http_get(
        gateway.proxy,
        "/pro/x",
        None,
        &[("x-api-key", KEY_B), ("x-consumer-id", "mallory")],
    );
    assert_eq!(passed.status, 200);
    assert!(
        passed.body.contains("x-consumer-id: bob\n")
            && passed.body.contains("x-consumer-plan: pro\n")
            && !passed.body.contains("mallory")
            && !passed.body.contains("x-api-key"),
        "the upstream learns the verified caller, never a client's claim or the key: {}",
        passed.body
    );

    let metrics = gateway.metrics();
    let failures = |route, reason| {
        metric(
            &metrics,
            "sluice_auth_failures_total",
            &[("route", route), ("reason", reason)],
        )
    };
    assert_eq!(
        (
            failures("api", "missing"),
            failures("api", "unknown_key"),
            failures("api", "revoked_key"),
            failures("api", "malformed"),
            failures("pro_only", "plan_not_allowed"),
        ),
        (1.0, 1.0, 1.0, 1.0, 1.0)
    );
    let decided = |decision| {
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", decision)],
        )
    };
    assert_eq!(
        (decided("unauthenticated"), decided("forbidden")),
        (3.0, 1.0)
    );
}

#[test]
fn an_optional_route_keys_anonymous_callers_by_address() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let config = identity(&file).route(
        route("open").prefix("/").set("auth", "optional").limit(
            fixed_window("per_caller", "2/h")
                .key(&["consumer"])
                .set("plans", "{ pro: { rate: 3/h } }"),
        ),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    let statuses = |source: &str| -> Vec<u16> {
        (0..3)
            .map(|_| gateway.get_from(source, "/x").status)
            .collect()
    };
    assert_eq!(statuses("127.0.0.1"), [200, 200, 429]);
    assert_eq!(
        statuses("127.0.0.2"),
        [200, 200, 429],
        "another address, its own bucket"
    );
    let bob: Vec<u16> = (0..4)
        .map(|_| get_with_key(&gateway, "/x", KEY_B).status)
        .collect();
    assert_eq!(bob, [200, 200, 200, 429], "a verified caller, its plan");
    assert_eq!(
        get_with_key(&gateway, "/x", "sk_wrong_key_is_not_anonymous").status,
        401,
        "a credential that does not verify is refused, never anonymous"
    );
}

#[test]
fn the_usage_api_peeks_without_consuming_and_needs_the_token() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let config = identity(&file).route(
        plan_route()
            .limit(fixed_window("per_address", "50/h").key(&["client_ip"]))
            .limit(fixed_window("guard", "1000/h").set("headers", "hide")),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    for _ in 0..3 {
        assert_eq!(get_with_key(&gateway, "/api/x", KEY_B).status, 200);
    }
    let admin = gateway.admin;
    let quota = |query: &str, token: Option<&str>| {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer
            .iter()
            .map(|value| ("authorization", value.as_str()))
            .collect();
        http_get(admin, &format!("/v1/quota?{query}"), None, &headers)
    };
    let read = quota("consumer=bob&route=api", Some(TOKEN));
    assert_eq!(read.status, 200, "{}", read.body);
    let usage: serde_json::Value = serde_json::from_str(&read.body).expect("JSON");
    assert_eq!(usage["plan"], "pro");
    assert_eq!(usage["limits"][0]["name"], "per_consumer");
    assert_eq!(usage["limits"][0]["limit"], 100);
    assert_eq!(usage["limits"][0]["remaining"], 97);
    assert!(usage["limits"][1]["unavailable"].is_string(), "{usage}");
    let listed = usage["limits"].as_array().map(Vec::len);
    assert_eq!(listed, Some(2), "a hidden limit is not listed: {usage}");
    let again = quota("consumer=bob&route=api", Some(TOKEN));
    assert_eq!(again.body, read.body, "a peek consumes nothing");
    let next = get_with_key(&gateway, "/api/x", KEY_B);
    let ratelimit = next.header("ratelimit").unwrap_or_default();
    assert!(
        ratelimit.starts_with("\"per_consumer\";r=96;"),
        "the peeks took nothing: {ratelimit}"
    );
    let after: serde_json::Value =
        serde_json::from_str(&quota("consumer=bob&route=api", Some(TOKEN)).body).unwrap();
    assert_eq!(after["limits"][0]["remaining"], 96);
    let alice: serde_json::Value =
        serde_json::from_str(&quota("consumer=alice&route=api", Some(TOKEN)).body).unwrap();
    assert_eq!(
        (&alice["plan"], &alice["limits"][0]["remaining"]),
        (&serde_json::json!("free"), &serde_json::json!(10))
    );
    assert_eq!(quota("consumer=bob&route=api", None).status, 401);
    assert_eq!(
        quota("consumer=bob&route=api", Some("not-the-token-at-all")).status,
        401
    );
    assert_eq!(quota("consumer=bob&route=nowhere", Some(TOKEN)).status, 404);
    assert_eq!(quota("route=api", Some(TOKEN)).status, 400);
    // One value per parameter: a consumer named twice is not one consumer.
    let twice = quota("consumer=bob&consumer=alice&route=api", Some(TOKEN));
    assert_eq!(twice.status, 400, "{}", twice.body);
    assert!(
        twice.body.contains("consumer is given more than once"),
        "{}",
        twice.body
    );
}

#[test]
fn a_reload_reads_the_key_file_again() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let config = identity(&file).route(plan_route());
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    assert_eq!(get_with_key(&gateway, "/api/x", KEY_B).status, 200);
    let mut revoked = keys();
    revoked[2].3 = true;
    file.rewrite(&revoked);
    assert!(gateway.reload(&config.yaml()), "the reload is taken");
    assert_eq!(get_with_key(&gateway, "/api/x", KEY_B).status, 403);
    // A key file that names an unknown plan fails the reload; the keys in force stay.
    let mut broken = keys();
    broken[0].2 = Some("gold");
    file.rewrite(&broken);
    assert!(!gateway.reload(&config.yaml()), "the reload is refused");
    assert_eq!(get_with_key(&gateway, "/api/x", KEY_B).status, 403);
    assert_eq!(get_with_key(&gateway, "/api/x", KEY_A1).status, 200);
}

/// Admitted of `asks` requests with `key`; every other answer is a 429.
fn admitted(gateway: &Gateway, key: &str, asks: usize) -> usize {
    (0..asks)
        .filter(|_| match get_with_key(gateway, "/api/x", key).status {
            200 => true,
            429 => false,
            other => panic!("{other}"),
        })
        .count()
}

#[test]
fn a_changed_rate_or_plan_keeps_each_consumers_usage() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let monthly = |free: &str| {
        identity(&file).route(
            route("api").prefix("/api/").set("auth", "required").limit(
                calendar("monthly", free, "Europe/Berlin")
                    .key(&["consumer"])
                    .set("plans", "{ pro: { rate: 20/month } }"),
            ),
        )
    };
    let gateway = Gateway::start(&monthly("10/month").yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    assert_eq!(admitted(&gateway, KEY_A1, 6), 6);
    // The operator tightens the free plan: alice's six still count against the new eight.
    assert!(
        gateway.reload(&monthly("8/month").yaml()),
        "the reload is taken"
    );
    assert_eq!(
        admitted(&gateway, KEY_A2, 5),
        2,
        "8 - 6 left, not a fresh 8"
    );
    // Alice upgrades to pro (each of her keys says so: one plan per consumer): her eight still
    // count against pro's twenty.
    let mut upgraded = keys();
    for alices in [0, 1, 4] {
        upgraded[alices].2 = Some("pro");
    }
    file.rewrite(&upgraded);
    assert!(
        gateway.reload(&monthly("8/month").yaml()),
        "the reload is taken"
    );
    let r = get_with_key(&gateway, "/api/x", KEY_A1);
    eprintln!("DEBUG {} {:?} {}", r.status, r.headers, r.body);
    assert_eq!(
        admitted(&gateway, KEY_A1, 15),
        11,
        "20 - 8 left, not a fresh 20"
    );
    // Another consumer was never touched by either change.
    assert_eq!(admitted(&gateway, KEY_VIP, 9), 8);
}

/// Issue 50: a monthly quota beside a per-second burst limit, both per consumer, no `mode` (so
/// the quota is leased): five bursts of 12 requests 1.5 s apart. The burst limit refuses the
/// rest of each burst; the quota is charged exactly what was served, in Redis and as the usage
/// API tells it, and no leased unit lapsed (a refused request once cost the quota a unit a burst).
#[test]
fn a_monthly_quota_beside_a_burst_limit_is_charged_exactly_what_was_served() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let config = identity(&file).route(
        route("api")
            .prefix("/api/")
            .set("auth", "required")
            .limit(calendar("monthly", "1000/month", "UTC").key(&["consumer"]))
            .limit(gcra("per_second", "5/s").burst(5).key(&["consumer"])),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    let mut served = 0;
    for burst in 0..5 {
        if burst > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1500));
        }
        for _ in 0..12 {
            let status = get_with_key(&gateway, "/api/x", KEY_A1).status;
            assert!(status == 200 || status == 429, "{status}");
            served += u64::from(status == 200);
        }
    }
    assert!((30..=40).contains(&served), "about 6 a burst: {served}");
    let metrics = gateway.metrics();
    assert!(
        metric(&metrics, "sluice_lease_top_ups_total", &[]) > 0.0,
        "the quota was leased"
    );
    let mut connection = redis.connection();
    let monthly: Vec<String> = connection.keys("*monthly*").expect("KEYS");
    assert_eq!(monthly.len(), 1, "{monthly:?}");
    let mut counted = || -> u64 { connection.hget(&monthly[0], "n").expect("HGET") };
    support::eventually(
        std::time::Duration::from_secs(10),
        "the quota counts what was served",
        || counted() == served,
    );
    let read = http_get(
        gateway.admin,
        "/v1/quota?consumer=alice&route=api",
        None,
        &[("authorization", &format!("Bearer {TOKEN}"))],
    );
    let usage: serde_json::Value = serde_json::from_str(&read.body).expect("JSON");
    assert_eq!(usage["limits"][0]["name"], "monthly");
    assert_eq!(usage["limits"][0]["remaining"], 1000 - served, "{usage}");
    let lapsed = metric(&gateway.metrics(), "sluice_lease_units_lapsed_total", &[]);
    assert_eq!(lapsed, 0.0);
}

/// One quota over several routes: a monthly quota defined once (`limits:` at the top) and used
/// by two routes counts one bucket per consumer, whichever route and gateway a request takes;
/// each route's own limit stays its own; Redis holds one key of the quota per consumer.
#[test]
fn a_common_quota_counts_one_bucket_over_every_route_that_uses_it() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let file = KeyFile::write(&keys());
    let config = identity(&file)
        .set(
            "limits",
            common(&[calendar("monthly", "10/month", "UTC")
                .key(&["consumer"])
                .set("plans", "{ pro: { rate: 15/month } }")]),
        )
        .route(
            route("orders")
                .prefix("/orders/")
                .set("auth", "required")
                .limit(uses("monthly"))
                .limit(fixed_window("per_path", "4/h").key(&["consumer", "path"])),
        )
        .route(
            route("billing")
                .prefix("/billing/")
                .set("auth", "required")
                .limit(uses("monthly")),
        );
    let one = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    let two = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    one.wait_ready();
    two.wait_ready();
    let mut admitted: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for i in 0..24 {
        for (consumer, key) in [("alice", KEY_A1), ("bob", KEY_B)] {
            let (gateway, path) = match i % 3 {
                0 => (&one, format!("/orders/{}", i % 2)),
                1 => (&two, "/billing/x".to_string()),
                _ => (&two, format!("/orders/{}", i % 2)),
            };
            let status = get_with_key(gateway, &path, key).status;
            assert!(status == 200 || status == 429, "{status}");
            if status == 200 {
                let route = if path.starts_with("/orders/") {
                    "orders"
                } else {
                    "billing"
                };
                *admitted.entry((consumer, route)).or_default() += 1;
            }
        }
    }
    let total = |consumer| -> usize {
        admitted
            .iter()
            .filter(|((c, _), _)| *c == consumer)
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(
        total("alice"),
        10,
        "free: 10 a month over both routes: {admitted:?}"
    );
    assert_eq!(
        total("bob"),
        15,
        "pro: 15 a month over both routes: {admitted:?}"
    );
    assert!(admitted[&("alice", "billing")] > 0 && admitted[&("alice", "orders")] > 0);
    assert!(
        admitted[&("bob", "orders")] <= 8,
        "orders' own limit, 4 an hour per path: {admitted:?}"
    );
    let mut connection = redis.connection();
    let quota_keys: Vec<String> = connection.keys("*@monthly*").expect("KEYS");
    assert_eq!(quota_keys.len(), 2, "one key per consumer: {quota_keys:?}");
    let own: Vec<String> = connection.keys("*:orders:per_path*").expect("KEYS");
    assert!(!own.is_empty(), "the route's own limit, named after it");
    for key in quota_keys.iter().chain(&own) {
        assert!(key.starts_with("t:{@."), "tagged by the consumer: {key}");
    }
    let policy = get_with_key(&one, "/billing/x", KEY_A1);
    assert_eq!(policy.status, 429);
    assert_eq!(
        policy.header("ratelimit-policy"),
        Some("\"monthly\";q=10;w=2592000")
    );
    let bearer = format!("Bearer {TOKEN}");
    let admin = |gateway: &Gateway, path: &str| -> serde_json::Value {
        let answer = http_get(gateway.admin, path, None, &[("authorization", &bearer)]);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        serde_json::from_str(&answer.body).expect("JSON")
    };
    // Explain tells the same limit, as common, on both routes, with what the bucket has left.
    for path in ["/orders/0", "/billing/x"] {
        let explained = admin(
            &two,
            &format!("/v1/explain?host=localhost&path={path}&consumer=bob&plan=pro"),
        );
        let monthly = &explained["limits"][0];
        assert_eq!(monthly["name"], "monthly", "{explained}");
        assert_eq!(monthly["common"], true);
        assert_eq!(monthly["remaining"], 0, "{explained}");
    }
    // The usage API shows the bucket once without a route, and as common on a route.
    let usage = admin(&one, "/v1/quota?consumer=alice");
    let listed = usage["limits"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 1, "{usage}");
    assert_eq!(listed[0]["name"], "monthly");
    assert_eq!(listed[0]["common"], true);
    assert_eq!(listed[0]["remaining"], 0, "{usage}");
    let on_orders = admin(&one, "/v1/quota?consumer=alice&route=orders");
    assert_eq!(on_orders["limits"][0]["common"], true, "{on_orders}");
    assert!(
        on_orders["limits"][1].get("common").is_none(),
        "{on_orders}"
    );
    // The quota admin API names a common limit without a route: one reset gives alice her
    // month back on both routes, and one override sets its quota on both.
    let call = |method: &str, path: &str| {
        http_call(one.admin, method, path, None, &[("authorization", &bearer)])
    };
    let reset = call("POST", "/v1/quota/reset?consumer=alice&limit=monthly");
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_eq!(get_with_key(&two, "/billing/x", KEY_A1).status, 200);
    let set = call(
        "PUT",
        "/v1/quota/overrides?consumer=alice&limit=monthly&quota=12&ttl_seconds=60",
    );
    assert_eq!(set.status, 200, "{}", set.body);
    for (gateway, path) in [
        (&one, "/orders/1"),
        (&two, "/billing/x"),
        (&two, "/orders/0"),
    ] {
        support::eventually(
            std::time::Duration::from_secs(10),
            "the override reaches every route using the limit, on every gateway",
            || {
                get_with_key(gateway, path, KEY_A1)
                    .header("ratelimit-policy")
                    .is_some_and(|p| p.starts_with("\"monthly\";q=12;w=2592000"))
            },
        );
    }
    // Set again through another route, it is the same one override (the bucket's), listed once
    // for every route using the limit, and removed through either.
    let again = call(
        "PUT",
        "/v1/quota/overrides?route=billing&consumer=alice&limit=monthly&quota=13&ttl_seconds=60",
    );
    assert_eq!(again.status, 200, "{}", again.body);
    let listed = admin(&one, "/v1/quota/overrides");
    let overrides = listed["overrides"].as_array().cloned().unwrap_or_default();
    assert_eq!(overrides.len(), 1, "{listed}");
    assert_eq!(overrides[0]["route"], "(common)");
    assert_eq!(overrides[0]["quota"], 13);
    let removed = call(
        "DELETE",
        "/v1/quota/overrides?route=orders&consumer=alice&limit=monthly",
    );
    assert_eq!(removed.status, 200, "{}", removed.body);
    let listed = admin(&one, "/v1/quota/overrides");
    assert_eq!(
        listed["overrides"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
    // The dashboard's live view counts the bucket once, under (common): the two routes' counts
    // added, as /metrics counts them per route.
    let metrics = two.metrics();
    let allowed_on = |route| {
        metric(
            &metrics,
            "sluice_limit_decisions_total",
            &[
                ("route", route),
                ("limit", "monthly"),
                ("decision", "allowed"),
            ],
        )
    };
    let counted = allowed_on("orders") + allowed_on("billing");
    support::eventually(
        std::time::Duration::from_secs(10),
        "the live view samples the common limit once",
        || {
            let live = admin(&two, "/ui/live.json");
            let series = live["series"].as_array().cloned().unwrap_or_default();
            let monthly: Vec<&serde_json::Value> =
                series.iter().filter(|s| s["limit"] == "monthly").collect();
            monthly.len() == 1
                && monthly[0]["route"] == "(common)"
                && monthly[0]["totals"]["allowed"].as_f64() == Some(counted)
        },
    );
}
