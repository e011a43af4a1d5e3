//! The fault suite: two gateways share one limit while a real Redis topology, the network or a
//! gateway fails mid-window, under traffic above the limit through both. For each fault the
//! bound the design states is computed before the fault is injected (docs/reliability.md says
//! why each holds), and the test fails on any admission beyond it; each prints a row of the
//! table in docs/reliability.md (`scripts/faults.sh` runs the long form and prints the table).
//!
//! The limit is a GCRA of `RATE` per second with a burst of `CAPACITY`: an exact limiter admits
//! at most `CAPACITY + RATE × seconds` of traffic, whatever the window boundaries, so the
//! bound is exact and boundary-free. Faults that lose state, split the gateways or lose a
//! gateway's units add what the design allows for them, no more.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use support::config::{route, Config, Route};
use support::faults::{decided, scaled, Load, Monitor, Row, Sample};
use support::limits::{concurrency, fixed_window, gcra};
use support::netns::Namespace;
use support::relay::Relay;
use support::topologies::{query, RedisCluster, RedisSentinels, MASTER_NAME};
use support::{Gateway, Launch, RedisServer, Upstream};

/// The shared limit: admitted per second, and the burst an idle key allows at once.
const RATE: u64 = 40;
const CAPACITY: u64 = 20;
/// Client threads per gateway: together far above `RATE`.
const CLIENTS: usize = 3;

/// Every test here runs several gateways and Redis servers under load and measures latency:
/// one at a time, not beside each other.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The route under test: `/api/...`, one GCRA limit on one key shared by every gateway.
fn api() -> Route {
    route("api").prefix("/api").limit(
        gcra("shared", &format!("{RATE}/s"))
            .burst(CAPACITY - 1)
            .key(&["route"]),
    )
}

/// A route the tests warm each gateway's Redis connections with (another key).
fn warm_route() -> Route {
    route("warm")
        .prefix("/warm")
        .limit(gcra("warm", "1000/s").key(&["route"]))
}

/// Redis's clock, in seconds, as the server on `port` reads it.
fn redis_seconds(port: u16) -> f64 {
    let (seconds, micros): (u64, u64) = query(port, &mut redis::cmd("TIME")).expect("TIME");
    seconds as f64 + micros as f64 / 1e6
}

/// What an exact limiter admits over `seconds` of traffic above the limit.
fn exact(seconds: f64) -> u64 {
    CAPACITY + (RATE as f64 * seconds).floor() as u64
}

/// Until each gateway decides in Redis: its limiter answers `/readyz` and a request of the warm
/// route carries the `RateLimit` header of a decision.
fn warm(gateways: &[&Gateway]) {
    for gateway in gateways {
        gateway.wait_ready();
        support::eventually(Duration::from_secs(20), "a decision in Redis", || {
            let response = gateway.get("/warm/x");
            response.status == 200 && response.header("ratelimit").is_some()
        });
    }
}

/// The failure mode's answers: none before the fault, only decisions (200, 429) or the failure
/// mode's 503 throughout; the gateways still run; each decides in Redis again at the end.
fn check_decisions(
    what: &str,
    samples: &[Sample],
    fault_at: Duration,
    gateways: &mut [&mut Gateway],
) {
    let odd: Vec<u16> = samples
        .iter()
        .map(|s| s.status)
        .filter(|s| ![200, 429, 503].contains(s))
        .collect();
    assert!(odd.is_empty(), "{what}: only 200, 429 or 503, got {odd:?}");
    let early: Vec<_> = samples
        .iter()
        .filter(|s| s.status == 503 && s.at + s.latency < fault_at)
        .map(|s| (s.at, s.latency))
        .collect();
    assert!(
        early.is_empty(),
        "{what}: a failure before the fault at {fault_at:?}: {early:?}"
    );
    for gateway in gateways.iter_mut() {
        assert!(gateway.is_running(), "{what}: the gateway still runs");
        support::eventually(
            Duration::from_secs(60),
            &format!("{what}: decided in Redis again"),
            || {
                let response = gateway.get("/warm/x");
                response.status == 200 && response.header("ratelimit").is_some()
            },
        );
    }
}

/// Two gateways of `body`, each deciding in Redis.
fn two_gateways(body: &str, upstream: &Upstream) -> (Gateway, Gateway) {
    let (a, b) = (
        Gateway::start(body, upstream, None),
        Gateway::start(body, upstream, None),
    );
    warm(&[&a, &b]);
    (a, b)
}

/// Traffic through gateways, the failure-mode decisions of some watched, from the start.
struct Run {
    load: Load,
    monitor: Monitor,
}

/// What a run of traffic saw.
struct Seen {
    samples: Vec<Sample>,
    /// How long it ran.
    seconds: f64,
    /// The last time a watched gateway counted a failure-mode decision (since the start).
    last_failure: Option<Duration>,
}

impl Run {
    /// `CLIENTS` clients per target on `path`; returns 2 s in, when the fault is due, with
    /// that time.
    fn until_the_fault(targets: &[&Gateway], watched: &[&Gateway], path: &str) -> (Run, Duration) {
        let proxies: Vec<SocketAddr> = targets.iter().map(|g| g.proxy).collect();
        let admins: Vec<SocketAddr> = watched.iter().map(|g| g.admin).collect();
        let load = Load::start(&proxies, CLIENTS, path);
        let monitor = Monitor::start(&admins, &load);
        std::thread::sleep(Duration::from_secs(2));
        let fault_at = load.elapsed();
        (Run { load, monitor }, fault_at)
    }

    /// Time since the traffic started.
    fn at(&self) -> Duration {
        self.load.elapsed()
    }

    /// Lets the traffic run `after` more, then stops it.
    fn end_after(self, after: Duration) -> Seen {
        std::thread::sleep(after);
        let seconds = self.load.elapsed().as_secs_f64();
        let samples = self.load.stop();
        Seen {
            samples,
            seconds,
            last_failure: self.monitor.stop(),
        }
    }
}

/// The row of what a run saw, with its bound (`extra` above exact, in requests and words);
/// heal is measured from `fault_end`.
fn row(
    fault: &str,
    mode: &'static str,
    seen: &Seen,
    extra: (u64, &str),
    fault_end: Duration,
) -> Row {
    let mut row = Row::of(fault, mode, &seen.samples);
    row.exact = exact(seen.seconds);
    row.bound = row.exact + 1 + extra.0;
    row.bound_text = extra.1.to_string();
    // The failure mode's last answer: a 503 when it refuses (exact, from the samples), else
    // the last time a gateway counted a failure-mode decision.
    let last_refusal = seen
        .samples
        .iter()
        .filter(|s| s.status == 503)
        .map(|s| s.at + s.latency)
        .max();
    row.heal = last_refusal
        .or(seen.last_failure)
        .map(|last| last.saturating_sub(fault_end));
    row
}

fn sentinel_config(redis: &RedisSentinels, timeout_ms: u64) -> Config {
    Config::new()
        .redis_section(&[
            "mode: sentinel",
            &format!("sentinels: [{}]", redis.urls().join(", ")),
            &format!("master_name: {MASTER_NAME}"),
            &format!("timeout_ms: {timeout_ms}"),
        ])
        .failure_mode("deny")
        .route(api())
        .route(warm_route())
}

/// The replication lag's worth of admissions a failover may lose (async replication): at most a
/// second of the limit's rate (a replica acknowledges every second; on one machine it trails
/// the master by far less).
const REPLICATION_ALLOWANCE: u64 = RATE;

/// A primary killed at `fault_at` and promoted over: decisions followed the failure mode meanwhile
/// (some 503s, nothing else), and no more was admitted than a failover may lose.
fn failed_over(fault: &str, seen: &Seen, fault_at: Duration, gateways: &mut [&mut Gateway]) {
    check_decisions(fault, &seen.samples, fault_at, gateways);
    assert!(
        seen.samples.iter().any(|s| s.status == 503),
        "{fault}: the failure mode applied while no primary answered"
    );
    let bound = (
        REPLICATION_ALLOWANCE,
        "limit + the writes the replication lag lost",
    );
    row(fault, "deny", seen, bound, fault_at).report();
}

#[test]
fn sentinel_primary_killed_mid_window() {
    let _alone = alone();
    let mut redis = RedisSentinels::start();
    let upstream = Upstream::start();
    let body = sentinel_config(&redis, 200).yaml();
    let (mut a, mut b) = two_gateways(&body, &upstream);
    let (run, fault_at) = Run::until_the_fault(&[&a, &b], &[&a, &b], "/api/x");
    redis.master.kill();
    // An election whose votes split is tried again after the failover timeout: wait for it.
    support::eventually(
        Duration::from_secs(60),
        "the sentinels promote the replica",
        || redis.current_master() == Some(redis.replica.port),
    );
    let seen = run.end_after(scaled(Duration::from_secs(4)));
    failed_over(
        "Sentinel: primary killed (SIGKILL), replica promoted",
        &seen,
        fault_at,
        &mut [&mut a, &mut b],
    );
}

#[test]
fn sentinel_primary_paused_promoted_over_and_resumed_as_a_stale_replica() {
    let _alone = alone();
    let redis = RedisSentinels::start();
    let upstream = Upstream::start();
    let body = sentinel_config(&redis, 200).yaml();
    let (mut a, mut b) = two_gateways(&body, &upstream);
    let old = redis.master.port;
    let (run, fault_at) = Run::until_the_fault(&[&a, &b], &[&a, &b], "/api/x");
    signal(redis.master.pid(), "STOP");
    support::eventually(
        Duration::from_secs(30),
        "the sentinels promote the replica",
        || redis.current_master() == Some(redis.replica.port),
    );
    signal(redis.master.pid(), "CONT");
    let resumed_at = run.at();
    // Calls sent before the pause wait in its sockets, and run as it resumes: they were sent
    // to a primary. Give them a moment to.
    std::thread::sleep(Duration::from_millis(100));
    // What the old primary runs from now on, before and after the sentinels demote it, is a
    // decision no other gateway sees: none may reach it.
    let calls = |port| {
        support::command_calls(
            &query::<String>(port, redis::cmd("INFO").arg("commandstats")).unwrap_or_default(),
            &["fcall", "evalsha", "eval"],
        )
    };
    let at_resume = calls(old);
    support::eventually(
        Duration::from_secs(30),
        "the old primary is demoted to a replica",
        || {
            query::<String>(old, redis::cmd("INFO").arg("replication"))
                .is_some_and(|info| info.contains("role:slave"))
        },
    );
    let stale_writes = calls(old).saturating_sub(at_resume);
    let seen = run.end_after(scaled(Duration::from_secs(3)));
    check_decisions(
        "sentinel pause",
        &seen.samples,
        fault_at,
        &mut [&mut a, &mut b],
    );
    println!("sentinel pause: resumed at {resumed_at:?}; decision calls the stale primary ran after it resumed: {stale_writes}");
    assert_eq!(stale_writes, 0, "no gateway wrote to the demoted primary");
    row(
        "Sentinel: primary paused (SIGSTOP), promoted over, resumed",
        "deny",
        &seen,
        (
            REPLICATION_ALLOWANCE,
            "limit + the writes the replication lag lost; none to the stale primary",
        ),
        fault_at,
    )
    .report();
}

fn cluster_config(cluster: &RedisCluster, timeout_ms: u64) -> Config {
    Config::new()
        .redis_section(&[
            "mode: cluster",
            &format!("nodes: [{}]", cluster.urls().join(", ")),
            &format!("timeout_ms: {timeout_ms}"),
        ])
        .failure_mode("deny")
        .route(api())
        .route(warm_route())
}

/// The cluster key of the `api` route's limit and its slot (after a first decision wrote it).
/// A master that does not answer one query (a loaded machine) is asked again, for a bounded
/// time.
fn api_key(cluster: &RedisCluster) -> (String, u16) {
    let deadline = Instant::now() + scaled(Duration::from_secs(10));
    while Instant::now() < deadline {
        for port in cluster.masters() {
            let keys: Vec<String> =
                query(port, redis::cmd("KEYS").arg("*api*shared*")).unwrap_or_default();
            let Some(key) = keys.into_iter().next() else {
                continue;
            };
            if let Some(slot) = query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key)) {
                return (key, slot);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no master holds the api route's key");
}

#[test]
fn cluster_primary_failover_mid_window() {
    let _alone = alone();
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let body = cluster_config(&cluster, 200).yaml();
    let (mut a, mut b) = two_gateways(&body, &upstream);
    assert_eq!(a.get("/api/first").status, 200);
    let (key, _) = api_key(&cluster);
    let victim = cluster.master_of(&key).expect("a master serves the key");
    let (run, fault_at) = Run::until_the_fault(&[&a, &b], &[&a, &b], "/api/x");
    cluster.kill(victim);
    let seen = run.end_after(scaled(Duration::from_secs(7)));
    assert!(cluster.is_ok(), "the cluster healed");
    failed_over(
        "Cluster: the key's primary killed, its replica promoted",
        &seen,
        fault_at,
        &mut [&mut a, &mut b],
    );
}

fn node_id(port: u16) -> String {
    query(port, redis::cmd("CLUSTER").arg("MYID")).expect("CLUSTER MYID")
}

#[test]
fn cluster_slot_migrated_under_traffic() {
    let _alone = alone();
    let cluster = RedisCluster::start();
    let upstream = Upstream::start();
    let body = cluster_config(&cluster, 200).yaml();
    let (mut a, mut b) = two_gateways(&body, &upstream);
    assert_eq!(a.get("/api/first").status, 200);
    let (key, slot) = api_key(&cluster);
    let source = cluster.master_of(&key).expect("the key's master");
    let target = *cluster
        .masters()
        .iter()
        .find(|&&p| p != source)
        .expect("another master");
    let (source_id, target_id) = (node_id(source), node_id(target));
    let (run, fault_at) = Run::until_the_fault(&[&a, &b], &[&a, &b], "/api/x");
    // The steps of `redis-cli --cluster reshard`, with traffic between them: ASK redirects
    // while the slot is migrating, MOVED once it has moved.
    let set_slot = |port: u16, state: &str, node: &str| {
        let _: () = query(
            port,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(node),
        )
        .unwrap_or_else(|| panic!("CLUSTER SETSLOT {slot} {state} on {port}"));
    };
    set_slot(target, "IMPORTING", &source_id);
    set_slot(source, "MIGRATING", &target_id);
    std::thread::sleep(Duration::from_millis(500));
    let keys: Vec<String> = query(
        source,
        redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100),
    )
    .unwrap_or_default();
    for key in &keys {
        let _: String = query(
            source,
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(target)
                .arg(key)
                .arg(0)
                .arg(5000),
        )
        .expect("MIGRATE");
    }
    std::thread::sleep(Duration::from_millis(500));
    for port in cluster.masters() {
        set_slot(port, "NODE", &target_id);
    }
    let moved_at = run.at();
    let seen = run.end_after(scaled(Duration::from_secs(4)));
    assert_eq!(cluster.master_of(&key), Some(target), "the slot moved");
    check_decisions(
        "slot migration",
        &seen.samples,
        fault_at,
        &mut [&mut a, &mut b],
    );
    println!("slot {slot} ({} keys) moved from {source} to {target} between {fault_at:?} and {moved_at:?}", keys.len());
    row(
        "Cluster: the key's slot migrated (ASK, then MOVED)",
        "deny",
        &seen,
        (0, "limit (a key moves whole: MIGRATE)"),
        moved_at,
    )
    .report();
}

fn standalone_config(url: &str, timeout_ms: u64, mode: &str) -> Config {
    Config::new()
        .redis_section(&[&format!("url: {url}"), &format!("timeout_ms: {timeout_ms}")])
        .failure_mode(mode)
        .route(api())
        .route(warm_route())
}

/// Redis killed at 2 s and started again at 3 s on its port, with `persistence` arguments.
fn restarted(fault: &str, persistence: &[&str], extra: (u64, &str)) {
    let _alone = alone();
    let mut redis = RedisServer::start_with_args(persistence);
    let upstream = Upstream::start();
    let body = standalone_config(&redis.url(), 200, "deny").yaml();
    let (mut a, mut b) = two_gateways(&body, &upstream);
    let (run, fault_at) = Run::until_the_fault(&[&a, &b], &[&a, &b], "/api/x");
    redis.stop();
    std::thread::sleep(Duration::from_secs(1));
    redis.restart(persistence);
    let back_at = run.at();
    let seen = run.end_after(scaled(Duration::from_secs(4)));
    check_decisions(fault, &seen.samples, fault_at, &mut [&mut a, &mut b]);
    row(fault, "deny", &seen, extra, back_at).report();
}

#[test]
fn redis_restarted_without_persistence() {
    restarted(
        "Standalone: killed, restarted without persistence (1 s down)",
        &[],
        (
            CAPACITY,
            "limit + one window (GCRA: one burst) — the state is gone",
        ),
    );
}

#[test]
fn redis_restarted_with_aof_everysec() {
    restarted(
        "Standalone: killed, restarted with AOF everysec (1 s down)",
        &["--appendonly", "yes", "--appendfsync", "everysec"],
        (RATE, "limit + at most 1 s of writes (the fsync interval)"),
    );
}

/// A gateway inside its own network namespace (`b`), beside one on the host (`a`); both share
/// the Redis that listens on loopback and on the namespace's host end.
struct Split {
    namespace: Namespace,
    redis: RedisServer,
    upstream: Upstream,
}

impl Split {
    fn new() -> Split {
        let namespace = Namespace::new();
        let host = namespace.host_ip.to_string();
        let redis =
            RedisServer::start_with_args(&["--bind", "127.0.0.1", &host, "--protected-mode", "no"]);
        let upstream = Upstream::start_on(IpAddr::V4(namespace.host_ip));
        Split {
            namespace,
            redis,
            upstream,
        }
    }

    /// The configuration `config` makes for a Redis at `url`.
    fn gateways(&self, config: impl Fn(&str) -> Config) -> (Gateway, Gateway) {
        let inside = format!("redis://{}:{}/0", self.namespace.host_ip, self.redis.port);
        let a = Gateway::start(&config(&self.redis.url()).yaml(), &self.upstream, None);
        let b = Gateway::launch_in(
            &self.namespace,
            &config(&inside).yaml(),
            &self.upstream,
            &Launch::default(),
        );
        (a, b)
    }
}

/// The `api` route under each failure mode: `/allow`, `/deny`, `/local`, each its own key.
fn per_mode(url: &str) -> Config {
    ["allow", "deny", "local"].into_iter().fold(
        Config::new()
            .redis_section(&[&format!("url: {url}"), "timeout_ms: 100"])
            .set("instances", 2)
            .route(warm_route()),
        |config, mode| {
            config.route(
                route(mode)
                    .prefix(&format!("/{mode}"))
                    .set("failure_mode", mode)
                    .limit(
                        gcra(mode, &format!("{RATE}/s"))
                            .burst(CAPACITY - 1)
                            .key(&["route"]),
                    ),
            )
        },
    )
}

#[test]
fn one_gateway_cut_off_from_redis_under_each_failure_mode() {
    let _alone = alone();
    let split = Split::new();
    let (mut a, mut b) = split.gateways(per_mode);
    warm(&[&a, &b]);
    // One run per route, started together: the fault is due at the same time for each.
    let runs: Vec<(Run, Duration)> = std::thread::scope(|scope| {
        let started: Vec<_> = ["allow", "deny", "local"]
            .iter()
            .map(|mode| {
                let (a, b) = (&a, &b);
                scope.spawn(move || Run::until_the_fault(&[a, b], &[b], &format!("/{mode}/x")))
            })
            .collect();
        started
            .into_iter()
            .map(|run| run.join().expect("a run"))
            .collect()
    });
    let fault_at = runs[0].1;
    split.namespace.cut(split.redis.port);
    let cut_for = scaled(Duration::from_secs(3));
    std::thread::sleep(cut_for);
    // Timed before the command: its own run counts toward the time to heal.
    let healed_at = runs[0].0.at();
    split.namespace.heal(split.redis.port);
    std::thread::sleep(scaled(Duration::from_secs(3)));
    let seen: Vec<Seen> = runs
        .into_iter()
        .map(|(run, _)| run.end_after(Duration::ZERO))
        .collect();
    let cut = cut_for.as_secs_f64() + 1.0;
    let allowed_blind = decided(&[&b], "error_allowed");
    // The cut-off gateway's share: half of each limit, the burst's time kept (instances: 2).
    let share = CAPACITY / 2 + ((RATE / 2) as f64 * cut).ceil() as u64;
    for (mode, seen, extra) in [
        (
            "allow",
            &seen[0],
            (
                allowed_blind,
                "limit + every request the cut-off gateway admitted blind (allow fails open)"
                    .to_string(),
            ),
        ),
        (
            "deny",
            &seen[1],
            (0, "limit (the cut-off gateway refuses)".to_string()),
        ),
        (
            "local",
            &seen[2],
            (
                share,
                format!("limit + the cut-off gateway's share over the cut ({share})"),
            ),
        ),
    ] {
        let mode: &'static str = mode;
        row(
            &format!(
                "one of 2 gateways cut off from Redis (iptables DROP) for {:.0} s",
                cut_for.as_secs_f64()
            ),
            mode,
            seen,
            (extra.0, &extra.1),
            healed_at,
        )
        .report();
    }
    check_decisions("cut off", &seen[1].samples, fault_at, &mut [&mut a, &mut b]);
}

#[test]
fn one_gateway_slower_than_the_deadline() {
    let _alone = alone();
    let redis = RedisServer::start();
    let relay = Relay::to(SocketAddr::from(([127, 0, 0, 1], redis.port)));
    let upstream = Upstream::start();
    let config = |url: &str| standalone_config(url, 100, "deny").yaml();
    let mut a = Gateway::start(&config(&redis.url()), &upstream, None);
    let mut b = Gateway::start(
        &config(&format!("redis://{}/0", relay.addr)),
        &upstream,
        None,
    );
    warm(&[&a, &b]);
    let (run, fault_at) = Run::until_the_fault(&[&a, &b], &[&b], "/api/x");
    relay.delay(Duration::from_millis(300));
    let slowed_for = scaled(Duration::from_secs(3));
    std::thread::sleep(slowed_for);
    relay.delay(Duration::ZERO);
    let healed_at = run.at();
    let seen = run.end_after(scaled(Duration::from_secs(3)));
    check_decisions("slow link", &seen.samples, fault_at, &mut [&mut a, &mut b]);
    let worst_b = seen
        .samples
        .iter()
        .filter(|s| s.gateway == 1)
        .map(|s| s.latency)
        .max()
        .unwrap_or_default();
    println!("slow link: the slowed gateway's worst latency {worst_b:?} (deadline 100 ms)");
    row(
        &format!(
            "one of 2 gateways' link delayed 300 ms (3 × the deadline) for {} s",
            slowed_for.as_secs()
        ),
        "deny",
        &seen,
        (
            0,
            "limit (a call past its deadline may still count: under-admission only)",
        ),
        healed_at,
    )
    .report();
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A standalone Redis, an upstream, and two gateways whose `route` has `limit` on its own key,
/// failing closed; both decide in Redis.
fn two_gateways_limiting(
    route: Route,
    limit: support::limits::Limit,
) -> (RedisServer, Upstream, Gateway, Gateway) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = Config::new()
        .redis(redis.url())
        .failure_mode("deny")
        .route(route.limit(limit.key(&["route"])))
        .route(warm_route())
        .yaml();
    let (a, b) = two_gateways(&body, &upstream);
    (redis, upstream, a, b)
}

#[test]
fn a_crashed_gateways_concurrency_slots_come_back_within_their_ttl() {
    let _alone = alone();
    const MAX: u64 = 4;
    const TTL_S: u64 = 3;
    let slots = concurrency("inflight", MAX).set("lease", format!("{TTL_S}s"));
    let (_redis, _upstream, mut a, b) =
        two_gateways_limiting(route("slots").prefix("/slots"), slots);
    // The concurrency script is another library than the warm route's: load it on both.
    for gateway in [&a, &b] {
        support::eventually(Duration::from_secs(20), "a concurrency decision", || {
            gateway.get("/slots/x").status == 200
        });
    }
    // `a` holds every slot with requests that take a minute. A slot is given back once its
    // response is sent: a holder that came too soon after the warm-up is refused, and tries again.
    let proxy = a.proxy;
    let holders: Vec<_> = (0..MAX)
        .map(|_| {
            std::thread::spawn(move || {
                while support::faults::try_get(proxy, "/slots/slow/60000") == 429 {
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    support::eventually(Duration::from_secs(10), "every slot held", || {
        b.get("/slots/x").status == 429
    });
    signal(a.pid(), "KILL");
    let killed = Instant::now();
    support::eventually(Duration::from_secs(5), "the gateway is gone", || {
        !a.is_running()
    });
    let load = Load::start(&[b.proxy], 1, "/slots/x");
    support::eventually(
        Duration::from_secs(TTL_S + 10),
        "a slot is free again",
        || b.get("/slots/x").status == 200,
    );
    let back = killed.elapsed();
    let samples = load.stop();
    for holder in holders {
        let _ = holder.join();
    }
    // Until their TTL the dead gateway's slots count: the other gateway admits nothing beyond
    // the limit meanwhile (its first admission is the slot coming back).
    let mut row = Row::of(
        &format!("a gateway holding all {MAX} concurrency slots killed (SIGKILL)"),
        "deny",
        &samples,
    );
    row.bound_text = format!(
        "at most {MAX} in flight; the dead gateway's slots back within their TTL ({TTL_S} s)"
    );
    row.admitted = MAX + u64::from(row.admitted > 0);
    row.exact = MAX + 1;
    row.bound = MAX + 1;
    row.heal = Some(back);
    row.report();
    println!("slots: free again {back:?} after the kill (slot TTL {TTL_S} s)");
}

#[test]
fn a_crashed_gateways_leased_units_are_lost_to_the_window_at_most() {
    let _alone = alone();
    const LIMIT: u64 = 400;
    const LEASE: u64 = 20;
    let hot = fixed_window("hot", &format!("{LIMIT}/h")).leased(LEASE);
    let (redis, _upstream, mut a, b) =
        two_gateways_limiting(route("leased").prefix("/leased"), hot);
    let hour = (redis_seconds(redis.port) / 3600.0) as u64;
    // Both gateways spend leased units; `a` dies holding what it took and did not spend.
    let load = Load::start(&[a.proxy, b.proxy], 2, "/leased/x");
    support::eventually(
        Duration::from_secs(10),
        "both gateways spend leases",
        || decided(&[&a], "allowed") >= 30 && decided(&[&b], "allowed") >= 30,
    );
    let killed_at = load.elapsed();
    signal(a.pid(), "KILL");
    // The signal takes a moment to land: until then the gateway still admits.
    a.exit_within(Duration::from_secs(5))
        .expect("the gateway is gone");
    let dead_at = load.elapsed();
    std::thread::sleep(scaled(Duration::from_secs(2)));
    let mut samples = load.stop();
    // Requests the dead gateway may have admitted and never answered (sent before it died,
    // not answered before the signal) spent their units too.
    let unanswered = samples
        .iter()
        .filter(|s| s.gateway == 0 && s.status == 0)
        .filter(|s| s.at < dead_at && s.at + s.latency >= killed_at)
        .count() as u64;
    // Requests sent to the dead gateway find no one: they are not the limiter's answers (what
    // it answered before it died is).
    samples.retain(|s| s.gateway == 1 || s.status == 200 || s.at + s.latency < killed_at);
    // What is left of the window, `b` admits until Redis says it is spent.
    let mut after = 0;
    while b.get("/leased/after").status == 200 {
        after += 1;
    }
    let same_hour = (redis_seconds(redis.port) / 3600.0) as u64 == hour;
    let mut row = Row::of(
        &format!("a gateway holding leased units (lease {LEASE}) killed (SIGKILL)"),
        "deny",
        &samples,
    );
    row.admitted += after;
    row.exact = LIMIT;
    // A window that ended during the test allows a second one.
    row.bound = if same_hour { LIMIT } else { 2 * LIMIT };
    row.bound_text = format!(
        "limit; lost until the window ends: the dead gateway's unspent units (at most {LEASE}) and the requests it admitted and never answered"
    );
    println!(
        "leased: killed at {killed_at:?} with {unanswered} requests in flight; admitted {} during the load, {after} after",
        row.admitted - after
    );
    row.report();
    if same_hour {
        assert!(
            row.under() <= LEASE + unanswered,
            "at most one lease lost, and the requests in flight: under {}",
            row.under()
        );
    }
}

#[test]
fn reload_bursts_under_traffic_change_nothing_that_was_counted() {
    let _alone = alone();
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = |n: usize| {
        format!(
            "# reload {n}\n{}",
            standalone_config(&redis.url(), 200, "deny").yaml()
        )
    };
    let a = Gateway::start(&body(0), &upstream, None);
    let b = Gateway::start(&format!("watch: true\n{}", body(0)), &upstream, None);
    warm(&[&a, &b]);
    let (run, fault_at) = Run::until_the_fault(&[&a, &b], &[&a, &b], "/api/x");
    let reloads_before = support::metric(
        &a.metrics(),
        "sluice_config_reloads_total",
        &[("result", "success")],
    );
    // The n-th rewrite of a file: its marker line changes, so the file changes.
    let rewrite = |path: &std::path::Path, n: usize| {
        let text = std::fs::read_to_string(path).expect("read the config");
        let next = text.replacen(&format!("# reload {}", n - 1), &format!("# reload {n}"), 1);
        std::fs::write(path, next).expect("rewrite the config");
    };
    for n in 1..=10 {
        // `a`: a burst of SIGHUPs; `b`: its file rewritten under its watch.
        rewrite(&a.config_path, n);
        signal(a.pid(), "HUP");
        rewrite(&b.config_path, n);
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = run.end_after(scaled(Duration::from_secs(3)));
    let reloads = support::metric(
        &a.metrics(),
        "sluice_config_reloads_total",
        &[("result", "success")],
    ) - reloads_before;
    let watched = support::metric(
        &b.metrics(),
        "sluice_config_reloads_total",
        &[("result", "success")],
    );
    println!("reloads: {reloads} by SIGHUP, {watched} by watch");
    assert!(reloads >= 1.0 && watched >= 1.0, "both gateways reloaded");
    let failed: Vec<_> = seen
        .samples
        .iter()
        .filter(|s| s.status != 200 && s.status != 429)
        .collect();
    assert!(
        failed.is_empty(),
        "reloads refuse nothing: {failed:?} (fault at {fault_at:?})"
    );
    row(
        "10 SIGHUP reloads in 1 s on one gateway, 10 watched rewrites on the other",
        "deny",
        &seen,
        (0, "limit (the counts live in Redis)"),
        fault_at,
    )
    .report();
}

/// The breaker under a blackhole (packets to Redis dropped: connects hang, calls miss their
/// deadline): each failed probe doubles its pause up to 200 ms, so during an outage few
/// requests wait out the deadline, and the log says so once a second, not once a probe.
#[test]
fn a_blackholed_redis_backs_the_breaker_off() {
    let _alone = alone();
    const CLIENTS: usize = 8;
    const DEADLINE_MS: u64 = 50;
    let split = Split::new();
    let inside = format!("redis://{}:{}/0", split.namespace.host_ip, split.redis.port);
    let body = standalone_config(&inside, DEADLINE_MS, "allow").yaml();
    let launch = Launch {
        capture_log: true,
        ..Launch::default()
    };
    let gateway = Gateway::launch_in(&split.namespace, &body, &split.upstream, &launch);
    warm(&[&gateway]);
    let timeouts = || {
        support::metric(
            &gateway.metrics(),
            "sluice_limiter_errors_total",
            &[("kind", "timeout")],
        ) as u64
    };
    let before = timeouts();
    let load = Load::start(&[gateway.proxy], CLIENTS, "/warm/x");
    let cut_at = Instant::now();
    split.namespace.cut(split.redis.port);
    std::thread::sleep(scaled(Duration::from_secs(3)));
    let outage = cut_at.elapsed();
    let samples = load.stop();
    let waited = timeouts() - before;
    split.namespace.heal(split.redis.port);
    assert!(
        samples.iter().all(|s| s.status == 200 || s.status == 429),
        "failure_mode allow serves: no 503, no failed connection"
    );
    // The calls that can wait out the deadline: those in flight when it opened (one per
    // client), the failures that open it, then one probe per pause: 50, 100, then 200 ms.
    let probes = 2 + outage.as_millis() as u64 / 200 + 1;
    let most = CLIENTS as u64 + 3 + probes;
    println!("blackhole: {} requests in {outage:?}, {waited} waited out the {DEADLINE_MS} ms deadline (at most {most})", samples.len());
    assert!(
        waited <= most,
        "the breaker backs off: {waited} calls waited, at most {most}"
    );
    let log = gateway.log();
    let warnings = log.lines().filter(|l| l.contains(" WARN ")).count() as u64;
    let seconds = outage.as_secs() + 1;
    println!("blackhole: {warnings} warnings in {seconds} s\n{log}");
    assert!(
        warnings <= seconds + 2,
        "about one warning a second: {warnings} in {seconds} s"
    );
}

/// Redis restarted while no request runs: every connection the gateway had is broken. They are
/// found and made again in the background (the shared one and the decision lane's own), so
/// the first requests after are decided, not refused.
#[test]
fn connections_broken_while_idle_are_replaced_before_a_request_needs_them() {
    let _alone = alone();
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = standalone_config(&redis.url(), 200, "deny").yaml();
    let gateway = Gateway::start(&body, &upstream, None);
    warm(&[&gateway]);
    redis.stop();
    redis.restart(&[]);
    let clients = || {
        redis::cmd("CLIENT")
            .arg("LIST")
            .query::<String>(&mut redis.connection())
            .unwrap_or_default()
    };
    // Nothing asks: the gateway reconnects on its own, its decision lane included.
    support::eventually(
        Duration::from_secs(10),
        "the gateway connects again by itself",
        || {
            let list = clients();
            list.contains("name=sluice-decisions") && list.lines().count() >= 3
        },
    );
    let statuses = support::hammer(&[gateway.proxy], 8, 64, "/warm/x");
    let refused = statuses.iter().filter(|s| **s == 503).count();
    assert_eq!(
        refused, 0,
        "no request met a broken connection: {statuses:?}"
    );
}
