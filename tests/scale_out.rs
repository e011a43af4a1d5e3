//! Scale-out: three gateways share one exact limit through a standalone Redis and through a real
//! 3-master Redis Cluster; keys spread over every master; a hot limit split into shards keeps
//! its bound; a hot global limit in leased mode keeps its bound over two gateways with a
//! fraction of the Redis calls. Every figure is printed. Failovers, partitions and crashes are
//! the fault suite's (`tests/faults.rs`).

mod support;

use std::time::Duration;

use support::config::{route, Config, Route};
use support::limits::{fixed_window, gcra, sliding_log, sliding_window, token_bucket, Limit};
use support::topologies::{RedisCluster, MASTER_NAME};
use support::{hammer, metric, Gateway, RedisServer, Upstream};

/// Limits in Redis of this topology, with this deadline, failing closed.
fn redis_config(mode: &str, urls: &[String], timeout_ms: u64) -> Config {
    let list = format!("[{}]", urls.join(", "));
    let timeout = format!("timeout_ms: {timeout_ms}");
    let config = match mode {
        "standalone" => Config::new().redis_section(&[&format!("url: {}", urls[0]), &timeout]),
        "cluster" => {
            Config::new().redis_section(&["mode: cluster", &format!("nodes: {list}"), &timeout])
        }
        _ => Config::new().redis_section(&[
            "mode: sentinel",
            &format!("sentinels: {list}"),
            &format!("master_name: {MASTER_NAME}"),
            &timeout,
        ]),
    };
    config.failure_mode("deny")
}

/// A route on `/<name>` with these limits.
fn on_path(name: &str, limits: Vec<Limit>) -> Route {
    limits
        .into_iter()
        .fold(route(name).prefix(&format!("/{name}")), |r, l| r.limit(l))
}

const N: usize = 60;

/// Every test here runs several gateways and Redis servers under load, and the failover tests
/// measure latency against a 50 ms deadline: they run one at a time, not beside each other.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One route per algorithm, each with one limit of N per hour on one shared key.
fn exact_limit_routes(config: Config) -> Config {
    [
        ("gcra", gcra("shared", "60/h").burst(59)),
        ("token_bucket", token_bucket("shared", "60/h", 60)),
        ("fixed_window", fixed_window("shared", "60/h")),
        ("sliding_log", sliding_log("shared", "60/h")),
        ("sliding_window", sliding_window("shared", "60/h")),
    ]
    .into_iter()
    .fold(config, |config, (name, limit)| {
        config.route(on_path(name, vec![limit.key(&["route"])]))
    })
}

fn hour_of(redis_port: u16) -> u64 {
    let (seconds, _): (u64, u64) =
        support::topologies::query(redis_port, &mut redis::cmd("TIME")).expect("TIME");
    seconds / 3600
}

/// 30 concurrent clients over three gateways, 240 requests per algorithm: exactly N admitted.
fn three_gateways_admit_exactly_n(topology: &str, redis: Config, a_redis_port: u16) {
    let upstream = Upstream::start();
    let body = exact_limit_routes(redis).yaml();
    let gateways: Vec<Gateway> = (0..3)
        .map(|_| Gateway::start(&body, &upstream, None))
        .collect();
    // With failure_mode: deny, a gateway whose limiter cannot decide yet refuses (503) and says
    // so on /readyz: load goes to gateways that are ready, as a load balancer would send it.
    for gateway in &gateways {
        gateway.wait_ready();
    }
    let addresses: Vec<_> = gateways.iter().map(|g| g.proxy).collect();
    for name in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_log",
        "sliding_window",
    ] {
        let hour = hour_of(a_redis_port);
        let statuses = hammer(&addresses, 30, 240, &format!("/{name}/x"));
        let admitted = statuses.iter().filter(|s| **s == 200).count();
        let limited = statuses.iter().filter(|s| **s == 429).count();
        println!(
            "{topology}: {name}: 240 requests from 30 concurrent clients over 3 gateways, limit {N}: admitted {admitted}, limited {limited}"
        );
        let others: Vec<u16> = statuses
            .iter()
            .copied()
            .filter(|s| *s != 200 && *s != 429)
            .collect();
        assert!(
            others.is_empty(),
            "{topology} {name}: only 200 or 429, got {others:?}"
        );
        if name == "sliding_window" && hour_of(a_redis_port) != hour {
            // Across an aligned-window boundary the approximation's bound applies instead:
            // at most N in each aligned window.
            assert!(admitted <= 2 * N, "{topology} {name}: {admitted}");
        } else {
            assert_eq!(admitted, N, "{topology} {name}");
        }
    }
}

#[test]
fn three_gateways_share_one_exact_limit_on_standalone_redis() {
    let _alone = alone();
    let redis = RedisServer::start();
    three_gateways_admit_exactly_n(
        "standalone",
        redis_config("standalone", &[redis.url()], 200),
        redis.port,
    );
}

#[test]
fn three_gateways_share_one_exact_limit_on_a_redis_cluster() {
    let _alone = alone();
    let cluster = RedisCluster::start();
    let port = cluster.masters()[0];
    three_gateways_admit_exactly_n(
        "cluster",
        redis_config("cluster", &cluster.urls(), 200),
        port,
    );
}

#[test]
fn keys_of_many_clients_spread_over_every_master_and_a_split_limit_keeps_its_bound() {
    let _alone = alone();
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let per_client = || gcra("per_client", "1000/h").key(&["client_ip"]);
    let global = |rate: &str, split: u64| {
        fixed_window("global", rate)
            .key(&["route"])
            .set("split", split)
    };
    let body = redis_config("cluster", &cluster.urls(), 200)
        .set("trusted_proxies", "[127.0.0.1]")
        .route(on_path("per_client", vec![per_client()]))
        .route(on_path(
            "with_global",
            vec![per_client(), global("40/h", 8)],
        ))
        .route(on_path("global_only", vec![global("120/h", 4)]))
        .yaml();
    let gateways: Vec<Gateway> = (0..3)
        .map(|_| Gateway::start(&body, &upstream, None))
        .collect();
    for gateway in &gateways {
        gateway.wait_ready();
    }
    let addresses: Vec<_> = gateways.iter().map(|g| g.proxy).collect();

    // 300 clients, one request each: 300 per-client keys.
    let statuses: Vec<u16> = (0..300)
        .map(|i| {
            let client = format!("203.0.{}.{}", i / 200, i % 200 + 1);
            support::http_get(
                addresses[i % 3],
                "/per_client/x",
                None,
                &[("X-Forwarded-For", &client)],
            )
            .status
        })
        .collect();
    assert!(statuses.iter().all(|s| *s == 200));
    let spread = cluster.keys_per_master();
    println!("per_client: 300 clients -> keys per master {spread:?}");
    assert_eq!(spread.iter().map(|(_, n)| n).sum::<u64>(), 300);
    for (port, keys) in &spread {
        assert!(
            *keys >= 50,
            "master {port} holds only {keys} of 300 keys: {spread:?}"
        );
    }
    cluster.flush();

    // A per-client limit with a global limit split over 8 shards: 100 clients, 5 requests each.
    // Clients land on shards by digest; every shard sees far more than its 5 units, so exactly
    // the whole 40 pass, and the keys still spread.
    let mut admitted = 0;
    for round in 0..5 {
        for i in 0..100 {
            let client = format!("198.18.0.{}", i + 1);
            let status = support::http_get(
                addresses[(i + round) % 3],
                "/with_global/x",
                None,
                &[("X-Forwarded-For", &client)],
            )
            .status;
            admitted += usize::from(status == 200);
        }
    }
    let spread = cluster.keys_per_master();
    println!("with_global (split 8): 500 requests from 100 clients, global limit 40: admitted {admitted}; keys per master {spread:?}");
    assert_eq!(admitted, 40);
    assert!(spread.iter().all(|(_, n)| *n > 0), "{spread:?}");

    // A global limit alone, split over 4 shards taken in turn by each gateway: under a flood
    // every shard empties, exactly the whole 120 pass, never more.
    let statuses = hammer(&addresses, 30, 600, "/global_only/x");
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    let global_keys: Vec<(u16, u64)> = cluster.keys_per_master();
    println!("global_only (split 4): 600 requests from 30 clients over 3 gateways, limit 120: admitted {admitted}; keys per master {global_keys:?}");
    assert_eq!(admitted, 120);
}

fn reset_stats(redis: &RedisServer) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut redis.connection())
        .expect("CONFIG RESETSTAT");
}

/// The count a fixed window limit named `name` holds in Redis.
fn window_count(redis: &RedisServer, name: &str) -> u64 {
    let mut con = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{name}.*"))
        .query(&mut con)
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "one key for {name}: {keys:?}");
    redis::cmd("HGET")
        .arg(&keys[0])
        .arg("n")
        .query(&mut con)
        .expect("HGET")
}

/// Two gateways of `body` on the same upstream, each ready.
fn two_ready_gateways(body: &str, upstream: &Upstream) -> [Gateway; 2] {
    let gateways = [
        Gateway::start(body, upstream, None),
        Gateway::start(body, upstream, None),
    ];
    for gateway in &gateways {
        gateway.wait_ready();
    }
    gateways
}

/// The metric `name` (no labels) summed over `gateways`.
fn summed(gateways: &[Gateway], name: &str) -> f64 {
    gateways
        .iter()
        .map(|g| metric(&g.metrics(), name, &[]))
        .sum()
}

/// A hot global limit in exact and leased mode, over two gateways: leased admits exactly the
/// limit under a flood with a fraction of the Redis calls, and a gateway gives back the units it
/// did not spend once the key is idle.
#[test]
fn two_gateways_lease_a_hot_global_limit_and_give_back_what_they_did_not_spend() {
    let _alone = alone();
    const LIMIT: usize = 400;
    const L: u64 = 20;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let limit = |name: &str, leased: bool| {
        let limit = fixed_window(name, &format!("{LIMIT}/h")).key(&["route"]);
        on_path(
            name,
            vec![if leased {
                limit.leased(L)
            } else {
                limit.set("mode", "exact")
            }],
        )
    };
    let body = redis_config("standalone", &[redis.url()], 200)
        .route(limit("exact", false))
        .route(limit("leased", true))
        .route(limit("giveback", true))
        .route(limit("warm", false))
        .yaml();
    let gateways = two_ready_gateways(&body, &upstream);
    // A cold gateway's first decisions load the decision library and make its connections
    // inside the 200 ms deadline, and failure_mode deny would turn a cold stall into a denial:
    // the counts below are about leases, so each gateway decides on another route first, until
    // both decide over their own connections.
    support::eventually(Duration::from_secs(10), "warm gateways", || {
        gateways.iter().all(|g| g.get("/warm/x").status == 200)
            && redis::cmd("CLIENT")
                .arg("LIST")
                .query::<String>(&mut redis.connection())
                .map(|list| list.matches(" name=sluice-decisions ").count() == 2)
                .unwrap_or(false)
    });
    let addresses: Vec<_> = gateways.iter().map(|g| g.proxy).collect();

    let total = |name: &str| summed(&gateways, name) as u64;
    let mut calls = Vec::new();
    for name in ["exact", "leased"] {
        reset_stats(&redis);
        let returned_before = total("sluice_lease_units_returned_total");
        let statuses = hammer(&addresses, 8, 2 * LIMIT, &format!("/{name}/x"));
        let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
        let evalsha = redis.decision_calls();
        // Units a gateway took but had no request left to spend go back once the key is idle.
        let returned = || total("sluice_lease_units_returned_total") - returned_before;
        support::eventually(
            Duration::from_secs(10),
            &format!("{name}: the idle key's unspent units were given back"),
            || admitted + returned() >= LIMIT as u64,
        );
        let returned = returned();
        println!(
            "{name}: {} requests from 8 clients over 2 gateways, limit {LIMIT}, lease {L}: admitted {admitted}, given back unspent {returned}, decision calls {evalsha} ({:.3} per request)",
            2 * LIMIT,
            evalsha as f64 / (2 * LIMIT) as f64
        );
        assert_eq!(
            admitted + returned,
            LIMIT as u64,
            "{name}: every unit is admitted or given back, none more"
        );
        assert!(returned <= 2 * L, "{name}: at most L held per gateway");
        calls.push(evalsha);
    }
    assert!(
        calls[1] * 4 < calls[0],
        "leases cut Redis calls: exact {}, leased {}",
        calls[0],
        calls[1]
    );

    // Below the limit, Redis counts what was admitted plus what the gateways hold (at most
    // 2 × L); once the key is idle, the held units go back.
    let statuses = hammer(&addresses, 8, 200, "/giveback/x");
    assert!(statuses.iter().all(|s| *s == 200));
    let counted = window_count(&redis, "giveback");
    println!(
        "giveback: 200 admitted, Redis counted {counted} (held by the gateways: {})",
        counted - 200
    );
    assert!((200..=200 + 2 * L).contains(&counted), "{counted}");
    let returned_before = total("sluice_lease_units_returned_total");
    // The counter moves once Redis has taken the units back.
    support::eventually(
        Duration::from_secs(10),
        "the idle key's unspent units were given back",
        || total("sluice_lease_units_returned_total") - returned_before >= counted - 200,
    );
    assert_eq!(
        window_count(&redis, "giveback"),
        200,
        "unspent units were given back"
    );
    assert_eq!(
        total("sluice_lease_units_returned_total") - returned_before,
        counted - 200
    );
    assert_eq!(total("sluice_lease_units_held"), 0);
    let held = total("sluice_lease_held_decisions_total");
    println!("decisions paid from held units over both gateways: {held}");
    assert!(
        held > (LIMIT as u64 + 200) / 2,
        "most leased decisions made no Redis call"
    );
}

/// Issue 37: with no mode set (`auto`), a hot shared GCRA limit (key `[route]`) across two
/// gateways is paid mostly from leases and admits no more than its allowance (burst + rate ×
/// the load's length), while a cold per-client limit on the same gateways keeps one exact call
/// per request. The exactness of every interval is judged by the lease simulation
/// (`limiter::leased::tests`); here, the real binary and a real Redis over a whole run.
#[test]
fn with_no_mode_a_hot_shared_limit_leases_and_a_cold_per_client_limit_stays_exact() {
    let _alone = alone();
    const RATE: f64 = 400.0;
    const CAPACITY: f64 = 400.0;
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let hot = gcra("hot", "400/s").set("burst", 399).key(&["route"]);
    let cold = gcra("cold", "400/s").set("burst", 399).key(&["client_ip"]);
    let body = redis_config("standalone", &[redis.url()], 200)
        .set("trusted_proxies", "[127.0.0.1]")
        .route(on_path("hot", vec![hot]))
        .route(on_path("cold", vec![cold]))
        .yaml();
    let gateways = two_ready_gateways(&body, &upstream);
    let addresses: Vec<_> = gateways.iter().map(|g| g.proxy).collect();

    // Cold: 300 clients, one request each, one gateway after the other.
    reset_stats(&redis);
    for i in 0..300 {
        let client = format!("203.0.{}.{}", i / 200, i % 200 + 1);
        let response = support::http_get(
            addresses[i % 2],
            "/cold/x",
            None,
            &[("X-Forwarded-For", &client)],
        );
        assert_eq!(response.status, 200);
    }
    let cold_calls = redis.decision_calls();
    println!(
        "cold per-client limit: 300 requests, {cold_calls} decision calls ({:.2} per request)",
        cold_calls as f64 / 300.0
    );
    assert_eq!(
        cold_calls, 300,
        "a cold key is decided exactly, one call each"
    );

    // Hot: 8 clients flood the shared key through both gateways.
    reset_stats(&redis);
    let started = std::time::Instant::now();
    let samples = support::load_for(&addresses, 8, Duration::from_millis(1500), "/hot/x");
    let length = started.elapsed().as_secs_f64();
    let admitted = samples.iter().filter(|s| s.status == 200).count();
    let hot_calls = redis.decision_calls();
    let allowance = CAPACITY + RATE * length;
    let held = summed(&gateways, "sluice_lease_held_decisions_total");
    println!(
        "hot shared limit: {} requests in {length:.2} s, admitted {admitted} (allowance {allowance:.0}), {held} paid from leases, {hot_calls} decision calls ({:.3} per request)",
        samples.len(),
        hot_calls as f64 / samples.len() as f64
    );
    assert!(
        admitted as f64 <= allowance,
        "admitted {admitted}, allowance {allowance:.0}"
    );
    assert!(
        admitted as f64 >= 0.8 * RATE * length.min(1.5),
        "leases lapse little: admitted {admitted} in {length:.2} s"
    );
    assert!(
        held * 4.0 >= admitted as f64,
        "the hot key was leased: {held} of {admitted} admissions paid from leases"
    );
}

/// A route with a ceiling local to each gateway (3 at once, in-process) beside a quota shared
/// by both (1 per caller, in Redis), over two gateways: the shared quota holds across them, a
/// flood beyond the local ceiling makes no Redis call, and a request the shared quota denies
/// gives its local unit back.
#[test]
fn a_local_ceiling_beside_a_shared_quota_stops_floods_without_redis_and_gives_back_on_denial() {
    let _alone = alone();
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let route = on_path(
        "mixed",
        vec![
            gcra("per_gateway", "3/h")
                .burst(2)
                .key(&["route"])
                .set("scope", "local"),
            fixed_window("per_user", "1/h")
                .key(&["header:x-user"])
                .set("mode", "exact"),
        ],
    );
    let body = redis_config("standalone", &[redis.url()], 200)
        .route(route)
        .yaml();
    let [one, two] = two_ready_gateways(&body, &upstream);
    let ask = |gateway: &Gateway, user: &str| {
        support::http_get(gateway.proxy, "/mixed", None, &[("x-user", user)])
    };
    let first = ask(&one, "a");
    assert_eq!(first.status, 200);
    let policy = first.header("ratelimit-policy").expect("RateLimit-Policy");
    assert!(
        policy.contains("\"per_gateway\"") && policy.contains("\"per_user\""),
        "{policy}"
    );
    // The quota is shared: a's one request is spent on the other gateway too.
    let shared = ask(&two, "a");
    assert_eq!(shared.status, 429);
    assert!(
        shared.body.contains("\"limit\":\"per_user\""),
        "{}",
        shared.body
    );
    // Its local unit went back: three more callers pass the second gateway's ceiling of 3.
    for user in ["b", "c", "d"] {
        assert_eq!(ask(&two, user).status, 200, "user {user}");
    }
    let calls = redis.decision_calls();
    for user in 0..20 {
        let flood = ask(&two, &format!("f{user}"));
        assert_eq!(flood.status, 429);
        assert!(
            flood.body.contains("\"limit\":\"per_gateway\""),
            "{}",
            flood.body
        );
    }
    assert_eq!(
        redis.decision_calls(),
        calls,
        "the local ceiling asked Redis nothing"
    );
    // Each gateway has its own ceiling: the first has used 1 of its 3.
    for user in ["x", "y"] {
        assert_eq!(ask(&one, user).status, 200, "user {user}");
    }
    assert_eq!(ask(&one, "z").status, 429);
    let decisions = |gateway: &Gateway, limit: &str, decision: &str| {
        let labels = [("limit", limit), ("decision", decision)];
        metric(&gateway.metrics(), "sluice_limit_decisions_total", &labels)
    };
    // A request is counted when it ends, after its answer was sent.
    let counted = || {
        [
            decisions(&two, "per_gateway", "limited"),
            decisions(&two, "per_gateway", "allowed"),
            decisions(&two, "per_user", "limited"),
            decisions(&two, "per_user", "allowed"),
            decisions(&one, "per_gateway", "limited"),
        ]
    };
    let expected = [20.0, 4.0, 1.0, 3.0, 1.0];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while counted() != expected && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(counted(), expected);
}
