//! Coalesced decisions against real Redis servers: requests that arrive while a script call is in
//! flight go together in the next one. Exactness holds over two gateways and a Cluster while
//! batches larger than one form (the batch-size histogram says so); each request keeps its own
//! deadline inside a batch; a request that gave up before its batch left is never sent; a
//! `FUNCTION FLUSH` (or, on a server without functions, a `SCRIPT FLUSH`) in the middle of
//! batched traffic costs no decision; and the decision library survives a replica's promotion.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::limiter::redis::RedisLimiter;
use sluice::limiter::{
    asks, entries, Coalescing, LimitRequest, Limiter, LimiterError, RequestId, Topology,
};
use support::config::{route, Config};
use support::limits::{fixed_window, Limit};
use support::topologies::RedisCluster;
use support::{eventually, hammer, http_get, Gateway, RedisServer, Upstream};

/// These tests load several processes at once: one at a time.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `(calls, calls that carried more than one decision)` from a gateway's batch-size histogram.
fn batches(metrics: &str) -> (f64, f64) {
    let sample = |prefix: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(prefix))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let calls = sample("sluice_limiter_batch_size_count ");
    let alone = sample("sluice_limiter_batch_size_bucket{le=\"1\"} ");
    (calls, calls - alone)
}

/// A gateway config with one route under one fixed window shared by every client, failing closed,
/// decided exactly (`mode: exact`): what these tests are about is how exact decisions coalesce.
fn one_shared_limit(redis: &RedisServer, rate: &str) -> String {
    shared_limit_in_mode(redis, rate, "exact")
}

/// [`one_shared_limit`] in `mode`.
fn shared_limit_in_mode(redis: &RedisServer, rate: &str, mode: &str) -> String {
    Config::new()
        .redis(redis.url())
        .failure_mode("deny")
        .route(
            route("api").limit(
                fixed_window("shared", rate)
                    .key(&["route"])
                    .set("mode", mode),
            ),
        )
        .yaml()
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

#[test]
fn sixty_four_clients_over_two_gateways_admit_exactly_the_limit_in_batches() {
    let _alone = alone();
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = one_shared_limit(&redis, "500/h");
    let gateways: Vec<Gateway> = (0..2)
        .map(|_| Gateway::start(&body, &upstream, Some(&redis)))
        .collect();
    for gateway in &gateways {
        gateway.wait_ready();
    }
    let addrs: Vec<_> = gateways.iter().map(|g| g.proxy).collect();
    let statuses = hammer(&addrs, 64, 64 * 20, "/x");
    assert_eq!(count(&statuses, 200), 500, "admitted");
    assert_eq!(
        count(&statuses, 429),
        64 * 20 - 500,
        "everything else limited"
    );
    let (calls, batched): (f64, f64) = gateways
        .iter()
        .map(|g| batches(&g.metrics()))
        .fold((0.0, 0.0), |(c, b), (c1, b1)| (c + c1, b + b1));
    println!("{calls} script calls for 1280 decisions, {batched} of them batched");
    assert!(batched > 0.0, "no call carried more than one decision");
    assert!(calls < 1280.0, "{calls} calls for 1280 decisions");
}

/// A limiter on `url` batching up to 8 decisions, with its own batch-size histogram.
fn limiter(url: &str) -> (Arc<RedisLimiter>, sluice::limiter::meters::Histogram) {
    limiter_batching(url, 8)
}

fn limiter_batching(
    url: &str,
    max_batch: usize,
) -> (Arc<RedisLimiter>, sluice::limiter::meters::Histogram) {
    let sizes = sluice::limiter::meters::Histogram::new(prometheus::DEFAULT_BUCKETS);
    let limiter = RedisLimiter::new(
        &Topology::Standalone {
            url: url.to_string(),
        },
        &Default::default(),
        Duration::from_secs(2),
        Coalescing {
            max_batch,
            sizes: sizes.clone(),
        },
    )
    .expect("limiter");
    (Arc::new(limiter), sizes)
}

/// Decides one fixed-window limit of 100/h on `key` within `deadline`.
async fn decide(
    limiter: &RedisLimiter,
    key: &str,
    deadline: Duration,
) -> Result<bool, LimiterError> {
    let limits = [fixed_window("w", "100/h").compile()];
    let keys = [key.as_bytes()];
    let asks = asks(&keys, &[1]);
    let entries = entries(&limits, &asks);
    static IDS: AtomicUsize = AtomicUsize::new(1);
    let request = LimitRequest {
        id: RequestId(IDS.fetch_add(1, Ordering::Relaxed) as u128),
        deadline: Some(deadline),
        ..LimitRequest::new(&entries)
    };
    limiter
        .check(&request)
        .await
        .map(|decision| decision.denied_by.is_none())
}

fn pause_redis(redis: &RedisServer, millis: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(millis)
        .arg("ALL")
        .query(&mut redis.connection())
        .expect("CLIENT PAUSE");
}

/// Whether a decision on `key` reached Redis (it left state there).
fn counted(redis: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query(&mut redis.connection())
        .expect("EXISTS")
}

#[test]
fn each_request_in_a_batch_keeps_its_own_deadline() {
    let redis = RedisServer::start();
    let (limiter, sizes) = limiter(&redis.url());
    // One thread: the three requests are polled in order before anything is answered.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert!(decide(&limiter, "{w}arm", Duration::from_secs(2))
            .await
            .unwrap());
        pause_redis(&redis, 400);
        // The first finds the lane idle and goes alone; the other two wait behind it, and go
        // together when it gives up (50 ms), while Redis is still paused.
        let (blocker, hasty, patient) = tokio::join!(
            decide(&limiter, "{t}blocker", Duration::from_millis(50)),
            decide(&limiter, "{t}hasty", Duration::from_millis(100)),
            decide(&limiter, "{t}patient", Duration::from_secs(3)),
        );
        assert!(
            matches!(blocker, Err(LimiterError::Timeout(50))),
            "{blocker:?}"
        );
        assert!(
            matches!(hasty, Err(LimiterError::Timeout(100))),
            "the 100 ms request stopped waiting: {hasty:?}"
        );
        assert!(patient.expect("the 3 s request waited for the batch"));
    });
    assert_eq!(
        sizes.get_sample_count(),
        3,
        "the warm-up call, the lone call, then one batch"
    );
    assert_eq!(
        sizes.get_sample_sum(),
        4.0,
        "the batch carried both waiting requests"
    );
    // It was in the batch when it gave up: it counted (a late answer is never retried).
    assert!(counted(&redis, "{t}hasty"));
    assert!(counted(&redis, "{t}patient"));
}

/// Warms the limiter up, pauses Redis for 400 ms, sends a patient call ({t}first, 3 s) and,
/// once it has left (`sizes` counted its batch), a hasty one ({t}second, 50 ms) that gives up;
/// returns once the first is answered.
async fn a_patient_call_then_a_hasty_one(
    limiter: &Arc<RedisLimiter>,
    redis: &RedisServer,
    sizes: &sluice::limiter::meters::Histogram,
) {
    assert!(decide(limiter, "{w}arm", Duration::from_secs(2))
        .await
        .unwrap());
    pause_redis(redis, 400);
    let first = {
        let limiter = Arc::clone(limiter);
        tokio::spawn(async move { decide(&limiter, "{t}first", Duration::from_secs(3)).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while sizes.get_sample_count() < 2 {
        assert!(Instant::now() < deadline, "the first call left within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = decide(limiter, "{t}second", Duration::from_millis(50)).await;
    assert!(
        matches!(second, Err(LimiterError::Timeout(50))),
        "{second:?}"
    );
    assert!(first.await.unwrap().expect("the first call is answered"));
}

#[test]
fn a_request_that_gave_up_before_its_batch_left_is_never_sent() {
    let redis = RedisServer::start();
    let (limiter, sizes) = limiter(&redis.url());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The first call leaves at once and waits on the paused server; the second queues behind
    // it and gives up before it returns.
    runtime.block_on(a_patient_call_then_a_hasty_one(&limiter, &redis, &sizes));
    assert!(!counted(&redis, "{t}second"), "never sent");
    assert!(counted(&redis, "{t}first"));
    assert_eq!(
        sizes.get_sample_count(),
        2,
        "the warm-up call and the first"
    );
}

#[test]
fn with_max_batch_one_every_request_sends_its_own_call_at_once() {
    let redis = RedisServer::start();
    let (limiter, sizes) = limiter_batching(&redis.url(), 1);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // No queue behind the first call: the second is on the wire before it gives up.
        a_patient_call_then_a_hasty_one(&limiter, &redis, &sizes).await;
        // Exactness with one call per decision: 100/h on one key, 120 at once.
        let calls = (0..120).map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move { decide(&limiter, "{t}one", Duration::from_secs(3)).await })
        });
        let mut admitted = 0;
        for call in calls.collect::<Vec<_>>() {
            admitted += usize::from(call.await.unwrap().expect("decided"));
        }
        assert_eq!(admitted, 100);
    });
    assert!(counted(&redis, "{t}second"), "sent at once, so it counted");
    assert_eq!(sizes.get_sample_count(), 123, "one call per decision");
    assert_eq!(sizes.get_sample_sum(), 123.0, "each carrying one decision");
}

/// The `CLIENT LIST` lines of the connections named `name`.
fn clients_named(redis: &RedisServer, name: &str) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut redis.connection())
        .expect("CLIENT LIST");
    let name = format!(" name={name} ");
    list.lines()
        .filter(|line| line.contains(&name))
        .map(str::to_string)
        .collect()
}

/// A `CLIENT LIST` line's `field=` value.
fn client_field<'a>(line: &'a str, field: &str) -> &'a str {
    line.split(' ')
        .find_map(|pair| pair.strip_prefix(field)?.strip_prefix('='))
        .unwrap_or_default()
}

#[test]
fn decisions_go_over_the_lanes_own_connection_and_outlive_its_loss() {
    let redis = RedisServer::start_with_password("direct-secret");
    let (limiter, _) = limiter(&format!(
        "redis://:direct-secret@127.0.0.1:{}/3",
        redis.port
    ));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let direct = || clients_named(&redis, "sluice-decisions");
    let decide_all = |key: &'static str, n: usize| {
        runtime.block_on(async {
            for _ in 0..n {
                assert!(decide(&limiter, key, Duration::from_secs(2))
                    .await
                    .expect("decided"));
            }
        })
    };
    // The first decision goes over the shared connection and starts the direct one, which
    // authenticates, selects database 3 and names itself.
    decide_all("{d}one", 1);
    eventually(Duration::from_secs(10), "the direct connection", || {
        direct().len() == 1
    });
    let first = direct().remove(0);
    assert_eq!(client_field(&first, "db"), "3", "{first}");
    // The shared connection answers a PING; the decisions then go direct.
    let ready = runtime.block_on(sluice::limiter::Backend::readiness(&*limiter));
    assert_eq!(ready, sluice::limiter::Readiness::Ready);
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut redis.connection())
        .unwrap();
    decide_all("{d}one", 20);
    assert_eq!(redis.decision_calls(), 20, "one call per decision");
    let line = direct().remove(0);
    assert_eq!(client_field(&line, "cmd"), "fcall", "{line}");
    assert_eq!(client_field(&line, "id"), client_field(&first, "id"));
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut redis.connection())
        .unwrap();
    assert!(
        list.lines()
            .filter(|l| client_field(l, "db") == "3")
            .all(|l| client_field(l, "name") == "sluice-decisions"
                || client_field(l, "cmd") == "ping"),
        "only the direct connection ran the decisions:\n{list}"
    );
    // Closed by the server while idle (a restart, `timeout`, `CLIENT KILL`): the next decision
    // notices before writing, goes over the shared connection, and a new direct one follows.
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(client_field(&first, "id"))
        .query(&mut redis.connection())
        .unwrap();
    eventually(Duration::from_secs(5), "the kill", || direct().is_empty());
    std::thread::sleep(Duration::from_millis(50));
    decide_all("{d}one", 5);
    eventually(Duration::from_secs(10), "a new direct connection", || {
        direct().len() == 1
    });
    decide_all("{d}one", 5);
    let again = direct().remove(0);
    assert_ne!(client_field(&again, "id"), client_field(&first, "id"));
    assert_eq!(client_field(&again, "cmd"), "fcall", "{again}");
    // Every one of the 31 decisions counted once: 69 more fill the 100/h window.
    decide_all("{d}one", 69);
    let over = runtime.block_on(decide(&limiter, "{d}one", Duration::from_secs(2)));
    assert!(!over.expect("decided"), "the 101st is denied");
}

#[test]
fn a_server_that_refuses_the_direct_handshake_decides_over_the_shared_connection() {
    let redis = RedisServer::start();
    // A user that may run scripts and functions but not `CLIENT`: the direct connection's
    // `CLIENT SETNAME` is refused, once, and every decision goes over the shared connection.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "limited", "on", ">pw", "~*", "+@all", "-client"])
        .query(&mut redis.connection())
        .expect("ACL SETUSER");
    let (limiter, _) = limiter(&format!("redis://limited:pw@127.0.0.1:{}/0", redis.port));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // `INFO commandstats` counts the calls ACL refused.
    let setname_refusals = || {
        let stats = redis.commandstats();
        let line = stats
            .lines()
            .find(|line| line.starts_with("cmdstat_client|setname:"))
            .unwrap_or_default()
            .to_string();
        client_field(&line.replace(',', " "), "rejected_calls")
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    runtime.block_on(async {
        assert!(decide(&limiter, "{r}one", Duration::from_secs(2))
            .await
            .expect("decided"));
    });
    eventually(Duration::from_secs(10), "the refused handshake", || {
        setname_refusals() == 1
    });
    runtime.block_on(async {
        for _ in 0..99 {
            assert!(decide(&limiter, "{r}one", Duration::from_secs(2))
                .await
                .expect("decided"));
        }
        let over = decide(&limiter, "{r}one", Duration::from_secs(2)).await;
        assert!(!over.expect("decided"), "the 101st is denied");
    });
    assert_eq!(setname_refusals(), 1, "refused once, never tried again");
}

/// Hammers a gateway on `redis` (its limit in `mode`) while a thread sends `flush` every 25 ms:
/// no decision fails, the count stays exact, and Redis refused calls (`refusal`, in its error
/// statistics, when given) meanwhile.
fn a_flush_in_the_middle_of_batched_traffic_costs_no_decision(
    redis: &RedisServer,
    flush: [&'static str; 2],
    (mode, refusal): (&str, Option<&str>),
) {
    let upstream = Upstream::start();
    let body = shared_limit_in_mode(redis, "300/h", mode);
    let gateway = Gateway::start(&body, &upstream, Some(redis));
    gateway.wait_ready();
    let stop = Arc::new(AtomicBool::new(false));
    let flushes = Arc::new(AtomicUsize::new(0));
    let flusher = {
        let (stop, flushes) = (Arc::clone(&stop), Arc::clone(&flushes));
        let mut admin = redis.connection();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _: () = redis::cmd(flush[0])
                    .arg(flush[1])
                    .query(&mut admin)
                    .expect("flush");
                flushes.fetch_add(1, Ordering::Relaxed);
                // Far more often than any operator would; a call that meets a flush loads the
                // library or script and tries again, a few times at most.
                std::thread::sleep(Duration::from_millis(25));
            }
        })
    };
    let statuses = hammer(&[gateway.proxy], 32, 32 * 25, "/x");
    stop.store(true, Ordering::Relaxed);
    flusher.join().unwrap();
    let errors: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut redis.connection())
        .expect("INFO errorstats");
    println!(
        "{} flushes; {}",
        flushes.load(Ordering::Relaxed),
        errors.trim()
    );
    if let Some(refusal) = refusal {
        assert!(
            errors.contains(refusal),
            "the flushes made calls be refused"
        );
    }
    assert_eq!(count(&statuses, 503), 0, "no decision failed");
    assert_eq!(count(&statuses, 200), 300);
    assert_eq!(count(&statuses, 429), 32 * 25 - 300);
}

/// Redis 7: decisions are `FCALL`s; a `FUNCTION FLUSH` makes them meet `Function not found`
/// (an `ERR`), and the library is loaded again.
#[test]
fn function_flush_in_the_middle_of_batched_traffic_costs_no_decision() {
    let _alone = alone();
    let redis = RedisServer::start();
    a_flush_in_the_middle_of_batched_traffic_costs_no_decision(
        &redis,
        ["FUNCTION", "FLUSH"],
        ("exact", Some("errorstat_ERR")),
    );
    let info = redis.commandstats();
    assert!(support::command_calls(&info, &["fcall"]) > 0, "{info}");
    assert_eq!(support::command_calls(&info, &["evalsha"]), 0, "{info}");
}

/// The same with the limit leased (`mode: auto`, the default): top-ups and the exact calls near
/// exhaustion meet the flushes (fewer calls, so some runs see none refused).
#[test]
fn function_flush_in_the_middle_of_leased_traffic_costs_no_decision() {
    let _alone = alone();
    let redis = RedisServer::start();
    a_flush_in_the_middle_of_batched_traffic_costs_no_decision(
        &redis,
        ["FUNCTION", "FLUSH"],
        ("auto", None),
    );
}

/// A server without functions (here `FUNCTION` and `FCALL` are renamed away, as before Redis
/// 7): decisions are `EVALSHA`s, and a `SCRIPT FLUSH` makes them meet `NOSCRIPT`.
#[test]
fn without_functions_decisions_are_scripts_and_a_script_flush_costs_no_decision() {
    let _alone = alone();
    let redis = RedisServer::start_with_args(&[
        "--rename-command",
        "FCALL",
        "",
        "--rename-command",
        "FUNCTION",
        "",
    ]);
    a_flush_in_the_middle_of_batched_traffic_costs_no_decision(
        &redis,
        ["SCRIPT", "FLUSH"],
        ("exact", Some("errorstat_NOSCRIPT")),
    );
    let info = redis.commandstats();
    assert!(support::command_calls(&info, &["evalsha"]) > 0, "{info}");
    assert_eq!(
        support::command_calls(&info, &["function|load"]),
        0,
        "{info}"
    );
}

/// The library a gateway loaded on a master is replicated: after the replica is promoted, a
/// gateway on it decides with `FCALL` at once, loading nothing, and counts on from the state the
/// master had.
#[test]
fn functions_survive_a_replicas_promotion_without_a_reload() {
    // The replica's first sync starts at once (not after the default 5 s wait for others).
    let master = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port.to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (on_master, _) = limiter(&master.url());
    let first = runtime.block_on(decide(&on_master, "{f}key", Duration::from_secs(2)));
    assert!(first.expect("decided on the master"), "1 of 100 used");
    assert_eq!(
        support::command_calls(&master.commandstats(), &["function|load"]),
        1,
        "the gateway loaded its library on the master"
    );
    // The library and the key reach the replica.
    let mut replica_admin = replica.connection();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let libraries: redis::Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .query(&mut replica_admin)
            .expect("FUNCTION LIST");
        let exists: bool = redis::cmd("EXISTS")
            .arg("{f}key")
            .query(&mut replica_admin)
            .expect("EXISTS");
        if exists && format!("{libraries:?}").contains("sluice_") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicated within 10 s: {libraries:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica_admin)
        .expect("promote the replica");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut replica_admin)
        .expect("CONFIG RESETSTAT");
    let (on_promoted, _) = limiter(&replica.url());
    let window: Vec<u64> = runtime.block_on(async {
        let mut remaining = Vec::new();
        for _ in 0..2 {
            assert!(decide(&on_promoted, "{f}key", Duration::from_secs(2))
                .await
                .expect("decided"));
        }
        let stored: Vec<u64> = redis::cmd("HMGET")
            .arg("{f}key")
            .arg("n")
            .query(&mut replica.connection())
            .expect("HMGET");
        remaining.extend(stored);
        remaining
    });
    assert_eq!(window, [3], "counted on from the master's state");
    let info = replica.commandstats();
    assert_eq!(support::command_calls(&info, &["fcall"]), 2, "{info}");
    assert_eq!(
        support::command_calls(&info, &["function|load", "evalsha", "eval", "script|load"]),
        0,
        "nothing loaded after the promotion: {info}"
    );
}

#[test]
fn a_cluster_batches_per_slot_with_keys_on_every_master_and_stays_exact() {
    let _alone = alone();
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let per_client: Limit = fixed_window("per_client", "50/h").key(&["client_ip"]);
    let body = Config::new()
        .redis_section(&[
            "mode: cluster",
            &format!("nodes: [{}]", cluster.urls().join(", ")),
            "timeout_ms: 500",
        ])
        .failure_mode("deny")
        .set("trusted_proxies", "[127.0.0.1]")
        .route(route("api").limit(per_client))
        .yaml();
    let gateway = Gateway::start(&body, &upstream, None);
    gateway.wait_ready();
    // 30 clients (their keys land on every master: each misses one of three with odds of
    // 2/3^30), 3 threads each sending 24 requests: 72 per client, 50 admitted.
    const CLIENTS: usize = 30;
    let threads: Vec<_> = (0..CLIENTS * 3)
        .map(|thread| {
            let proxy = gateway.proxy;
            std::thread::spawn(move || {
                let client = format!("198.51.100.{}", thread % CLIENTS + 1);
                (0..24)
                    .map(|_| {
                        let status =
                            http_get(proxy, "/x", None, &[("x-forwarded-for", &client)]).status;
                        (thread % CLIENTS, status)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut admitted = [0usize; CLIENTS];
    for thread in threads {
        for (client, status) in thread.join().unwrap() {
            assert!(status == 200 || status == 429, "status {status}");
            if status == 200 {
                admitted[client] += 1;
            }
        }
    }
    assert_eq!(
        admitted, [50; CLIENTS],
        "each client gets exactly its limit"
    );
    let per_master = cluster.keys_per_master();
    println!("keys per master: {per_master:?}");
    assert!(
        per_master.iter().all(|(_, keys)| *keys > 0),
        "keys on every master: {per_master:?}"
    );
    let (calls, batched) = batches(&gateway.metrics());
    println!(
        "{calls} script calls for {} decisions, {batched} batched",
        CLIENTS * 72
    );
    assert!(batched > 0.0, "no call carried more than one decision");
}
