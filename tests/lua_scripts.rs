//! The Lua limiter script, branch by branch, against a real redis-server with an explicit clock;
//! and a property test that the script and the in-process backend decide identically.

mod support;

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use redis::Commands;
use sluice::limiter::algorithm::{Period, Settled, State, Write};
use sluice::limiter::clock::ManualClock;
use sluice::limiter::local::LocalLimiter;
use sluice::limiter::script::{
    self, AdminScripts, Algorithms, Invoke, RELEASE_SOURCE, SETTLE_SOURCE,
};
use sluice::limiter::{
    asks, entries, Algorithm, Change, Cost, Decision, Limit, LimitRequest, RequestId,
};
use support::{limits, RedisServer};

const T0: u64 = 1_763_500_000_123_456; // a realistic Redis TIME in microseconds
const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;

fn gcra(rate: &str, burst: u64, cost: u64) -> Limit {
    limits::gcra("g", rate).burst(burst).cost(cost).compile()
}

/// GCRA that holds a request up to `max_delay_ms` instead of denying it (0: never).
fn shaped(rate: &str, burst: u64, max_delay_ms: u64, cost: u64) -> Limit {
    let limit = limits::gcra("g", rate).burst(burst).cost(cost);
    match max_delay_ms {
        0 => limit.compile(),
        ms => limit.set("max_delay", format!("{ms}ms")).compile(),
    }
}

fn window(rate: &str, cost: u64) -> Limit {
    limits::fixed_window("w", rate).cost(cost).compile()
}

fn sliding(rate: &str, cost: u64) -> Limit {
    limits::sliding_window("w", rate).cost(cost).compile()
}

fn log(rate: &str, cost: u64) -> Limit {
    limits::sliding_log("w", rate).cost(cost).compile()
}

fn concurrency(max: u64, lease_s: u64) -> Limit {
    limits::concurrency("c", max)
        .set("lease", format!("{lease_s}s"))
        .compile()
}

/// `limit` at a cost the configuration refuses (zero, or more than it can ever admit): what the
/// script itself answers.
fn costing(mut limit: Limit, cost: u64) -> Limit {
    limit.cost = Cost::Fixed(cost);
    limit
}

fn costs(limits: &[Limit]) -> Vec<u64> {
    limits
        .iter()
        .map(|l| match l.cost {
            Cost::Fixed(cost) => cost,
            Cost::Requested { default, .. } => default,
        })
        .collect()
}

/// The reply without its marks: five integers per limit (allowed, remaining, retry, reset,
/// delay). The marks have their own tests (`call_full`).
fn statuses_only(reply: Vec<i64>) -> Vec<i64> {
    reply
        .chunks(script::REPLY_STRIDE)
        .flat_map(|status| status[..5].to_vec())
        .collect()
}

/// Which decision script a call runs: the one holding exactly its limits' algorithms (what a
/// gateway sends), as a script or as a function library, or the script holding all of them
/// (`sluice --print-script`).
#[derive(Debug, Clone, Copy)]
enum Variant {
    Exact,
    All,
    Function,
}

impl Variant {
    fn script(self, limits: &[Limit]) -> &'static script::DecisionScript {
        script::decision_script(match self {
            Variant::Exact | Variant::Function => Algorithms::of_limits(limits),
            Variant::All => Algorithms::ALL,
        })
    }
}

/// Runs `command` (an `FCALL` or `EVALSHA` of `decision`), loading the library or the script
/// when Redis does not have it, as a gateway does.
fn run(
    con: &mut redis::Connection,
    decision: &script::DecisionScript,
    command: &redis::Cmd,
) -> redis::RedisResult<Vec<i64>> {
    match command.query(con) {
        Err(error) if error.detail() == Some("Function not found") => {
            redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(&decision.library)
                .query::<()>(con)?;
            command.query(con)
        }
        Err(error) if error.code() == Some("NOSCRIPT") => {
            decision.script.load(con)?;
            command.query(con)
        }
        reply => reply,
    }
}

/// The call of `limits` at `costs` under `keys`, as request `id`, at `now` (`None`: Redis's
/// clock), by the script `variant` names.
fn call_variant(
    variant: Variant,
    con: &mut redis::Connection,
    keys: &[&str],
    limits: &[Limit],
    costs: &[u64],
    now: Option<u64>,
    id: u128,
) -> redis::RedisResult<Vec<i64>> {
    let decision = variant.script(limits);
    let key_bytes: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    let asks = asks(&key_bytes, costs);
    let entries = entries(limits, &asks);
    let request = LimitRequest {
        id: RequestId(id),
        ..LimitRequest::new(&entries)
    };
    // Calendar bounds are computed around the clock the script is given, else the gateway's.
    let call = match now {
        Some(now) => script::Call::at(&request, now as i64),
        None => script::Call::of(&request),
    };
    let invoke = match variant {
        Variant::Function => Invoke::Function,
        Variant::Exact | Variant::All => Invoke::Script,
    };
    run(
        con,
        decision,
        &script::batch_command(decision, invoke, &[&call], now),
    )
}

/// The whole reply, marks included.
fn call_full(
    con: &mut redis::Connection,
    keys: &[&str],
    limits: &[Limit],
    now: Option<u64>,
    id: u128,
) -> redis::RedisResult<Vec<i64>> {
    call_variant(Variant::Exact, con, keys, limits, &costs(limits), now, id)
}

fn call_as(
    con: &mut redis::Connection,
    keys: &[&str],
    limits: &[Limit],
    now: Option<u64>,
    id: u128,
) -> redis::RedisResult<Vec<i64>> {
    call_full(con, keys, limits, now, id).map(statuses_only)
}

fn call_raw(
    con: &mut redis::Connection,
    keys: &[&str],
    limits: &[Limit],
    now: Option<u64>,
) -> redis::RedisResult<Vec<i64>> {
    call_as(con, keys, limits, now, 7)
}

fn call(con: &mut redis::Connection, keys: &[&str], limits: &[Limit], now: u64) -> Vec<i64> {
    call_raw(con, keys, limits, Some(now)).expect("script call")
}

fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).unwrap()
}

#[test]
fn gcra_first_request_stores_every_digit_of_the_tat_with_a_ttl() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = gcra("10/s", 4, 1);
    assert_eq!(call(&mut con, &["k"], &[limit], T0), vec![1, 4, 0, 100, 0]);
    let stored: String = con.get("k").unwrap();
    assert_eq!(
        stored,
        (T0 + 100 * MS).to_string(),
        "no %.14g rounding of the TAT"
    );
    let ttl = pttl(&mut con, "k");
    assert!((1..=100).contains(&ttl), "ttl {ttl} ms");
}

#[test]
fn gcra_admits_burst_plus_one_and_a_denial_writes_nothing() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = gcra("10/s", 4, 1);
    let replies: Vec<Vec<i64>> = (0..5)
        .map(|_| call(&mut con, &["k"], std::slice::from_ref(&limit), T0))
        .collect();
    assert!(replies.iter().all(|r| r[0] == 1));
    assert_eq!(replies[4], vec![1, 0, 0, 500, 0]);
    let before: String = con.get("k").unwrap();
    assert_eq!(
        call(&mut con, &["k"], std::slice::from_ref(&limit), T0),
        vec![0, 0, 100, 500, 0]
    );
    let after: String = con.get("k").unwrap();
    assert_eq!(before, after);
    // Exactly one emission interval later, exactly one more passes.
    assert_eq!(
        call(
            &mut con,
            &["k"],
            std::slice::from_ref(&limit),
            T0 + 100 * MS
        )[0],
        1
    );
    assert_eq!(
        call(
            &mut con,
            &["k"],
            std::slice::from_ref(&limit),
            T0 + 100 * MS
        )[0],
        0
    );
}

#[test]
fn gcra_refills_fully_after_idle() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = gcra("10/s", 4, 1);
    for _ in 0..5 {
        call(&mut con, &["k"], std::slice::from_ref(&limit), T0);
    }
    assert_eq!(
        call(&mut con, &["k"], &[limit], T0 + 3600 * SEC),
        vec![1, 4, 0, 100, 0]
    );
}

#[test]
fn gcra_cost_above_capacity_never_succeeds_and_says_so() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["k"], &[costing(gcra("10/s", 4, 1), 6)], T0),
        vec![0, 5, -1, 0, 0]
    );
    assert!(!con.exists::<_, bool>("k").unwrap());
}

#[test]
fn gcra_cost_zero_peeks_without_writing() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["k"], &[costing(gcra("10/s", 4, 1), 0)], T0),
        vec![1, 5, 0, 0, 0]
    );
    assert!(!con.exists::<_, bool>("k").unwrap());
}

#[test]
fn gcra_cost_above_one_consumes_that_many() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["k"], &[gcra("10/s", 4, 3)], T0),
        vec![1, 2, 0, 300, 0]
    );
    assert_eq!(
        call(&mut con, &["k"], &[gcra("10/s", 4, 3)], T0),
        vec![0, 2, 100, 300, 0]
    );
}

#[test]
fn gcra_clock_going_backwards_never_admits_more() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = gcra("1/s", 0, 1);
    assert_eq!(
        call(&mut con, &["k"], std::slice::from_ref(&limit), T0)[0],
        1
    );
    let stored: String = con.get("k").unwrap();
    let earlier = call(
        &mut con,
        &["k"],
        std::slice::from_ref(&limit),
        T0 - 10 * SEC,
    );
    assert_eq!(earlier[0], 0, "an earlier clock cannot reopen the bucket");
    assert_eq!(con.get::<_, String>("k").unwrap(), stored);
}

#[test]
fn gcra_one_per_day_and_rates_below_one_per_second() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let day = gcra("1/d", 0, 1);
    assert_eq!(
        call(&mut con, &["d"], std::slice::from_ref(&day), T0),
        vec![1, 0, 0, 86_400_000, 0]
    );
    assert_eq!(
        call(
            &mut con,
            &["d"],
            std::slice::from_ref(&day),
            T0 + 3600 * SEC
        ),
        vec![0, 0, 82_800_000, 82_800_000, 0]
    );
    assert!(pttl(&mut con, "d") > 86_000_000);
    let slow = gcra("3/m", 0, 1); // one every 20 s
    assert_eq!(
        call(&mut con, &["s"], std::slice::from_ref(&slow), T0)[0],
        1
    );
    assert_eq!(
        call(&mut con, &["s"], std::slice::from_ref(&slow), T0 + 19 * SEC),
        vec![0, 0, 1000, 1000, 0]
    );
    assert_eq!(
        call(&mut con, &["s"], std::slice::from_ref(&slow), T0 + 20 * SEC)[0],
        1
    );
}

#[test]
fn fixed_window_counts_with_incr_and_expires_at_the_window_end() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = window("3/s", 1);
    assert_eq!(
        call(&mut con, &["w"], std::slice::from_ref(&limit), T0),
        vec![1, 2, 0, 1000, 0]
    );
    let (end, count): (String, u64) = redis::cmd("HMGET")
        .arg("w")
        .arg("e")
        .arg("n")
        .query::<(String, u64)>(&mut con)
        .unwrap();
    assert_eq!((end, count), ((T0 + SEC).to_string(), 1));
    assert!((1..=1000).contains(&pttl(&mut con, "w")));
    assert_eq!(
        call(
            &mut con,
            &["w"],
            std::slice::from_ref(&limit),
            T0 + 100 * MS
        ),
        vec![1, 1, 0, 900, 0]
    );
    assert_eq!(
        call(
            &mut con,
            &["w"],
            std::slice::from_ref(&limit),
            T0 + 200 * MS
        ),
        vec![1, 0, 0, 800, 0]
    );
    assert_eq!(
        call(
            &mut con,
            &["w"],
            std::slice::from_ref(&limit),
            T0 + 300 * MS
        ),
        vec![0, 0, 700, 700, 0]
    );
    assert_eq!(
        con.hget::<_, _, u64>("w", "n").unwrap(),
        3,
        "a denial writes nothing"
    );
    // The window ends: a new one opens at the first hit.
    assert_eq!(
        call(&mut con, &["w"], std::slice::from_ref(&limit), T0 + SEC),
        vec![1, 2, 0, 1000, 0]
    );
}

#[test]
fn fixed_window_admits_up_to_twice_the_limit_across_a_boundary_gcra_does_not() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let fixed = window("5/s", 1);
    let g = gcra("5/s", 4, 1);
    call(&mut con, &["w-open"], std::slice::from_ref(&fixed), T0); // opens the window at T0
    call(
        &mut con,
        &["g-open"],
        std::slice::from_ref(&g),
        T0 - 5 * SEC,
    );
    let admitted = |con: &mut redis::Connection, key: &str, limit: &Limit| {
        let before = (0..10)
            .filter(|_| call(con, &[key], std::slice::from_ref(limit), T0 + SEC - MS)[0] == 1)
            .count();
        let after = (0..10)
            .filter(|_| call(con, &[key], std::slice::from_ref(limit), T0 + SEC)[0] == 1)
            .count();
        before + after
    };
    assert_eq!(
        admitted(&mut con, "w-open", &fixed),
        4 + 5,
        "fixed window: the rest of one window plus a full next one"
    );
    assert_eq!(
        admitted(&mut con, "g-open", &g),
        5,
        "gcra: the burst, and nothing refilled in 1 ms"
    );
}

#[test]
fn fixed_window_cost_above_limit_never_succeeds_and_the_clock_never_runs_back() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["w"], &[costing(window("3/s", 1), 4)], T0),
        vec![0, 3, -1, 1000, 0]
    );
    assert!(!con.exists::<_, bool>("w").unwrap());
    let limit = window("2/10s", 1);
    call(&mut con, &["b"], std::slice::from_ref(&limit), T0);
    call(&mut con, &["b"], std::slice::from_ref(&limit), T0);
    // Five seconds before the window opened: still the same window, still full.
    assert_eq!(
        call(&mut con, &["b"], std::slice::from_ref(&limit), T0 - 5 * SEC),
        vec![0, 0, 10_000, 10_000, 0]
    );
}

#[test]
fn one_call_consumes_nothing_unless_every_limit_allows() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limits = [gcra("10/s", 9, 1), window("1/m", 1)];
    assert_eq!(
        call(&mut con, &["a", "b"], &limits, T0),
        vec![1, 9, 0, 100, 0, 1, 0, 0, 60_000, 0]
    );
    let tat: String = con.get("a").unwrap();
    for _ in 0..3 {
        let reply = call(&mut con, &["a", "b"], &limits, T0);
        assert_eq!(
            &reply[..5],
            &[1, 9, 0, 100, 0],
            "gcra allows, is not consumed, and says so"
        );
        assert_eq!(&reply[5..], &[0, 0, 60_000, 60_000, 0]);
    }
    assert_eq!(con.get::<_, String>("a").unwrap(), tat);
}

#[test]
fn the_redis_clock_is_used_when_no_time_is_given() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let reply = call_raw(&mut con, &["k"], &[gcra("1/s", 0, 1)], None).unwrap();
    assert_eq!(reply, vec![1, 0, 0, 1000, 0]);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let tat: u64 = con.get("k").unwrap();
    let now = secs * SEC + micros;
    assert!(
        tat > now && tat <= now + SEC,
        "tat {tat} vs redis time {now}"
    );
}

#[test]
fn malformed_calls_are_refused_with_a_message() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let mut refused = |keys: &[&str], args: &[&str]| {
        let script = &script::decision_script(Algorithms::ALL).script;
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        invocation
            .invoke::<Vec<i64>>(&mut con)
            .unwrap_err()
            .to_string()
    };
    let gcra = ["gcra", "1000", "2000", "0", "1", "0"];
    fn one<'a>(id: &'a str, gcra: &[&'a str]) -> Vec<&'a str> {
        [&[id, "1"][..], gcra].concat()
    }
    let err = refused(&["k"], &[""]);
    assert!(err.contains("expected the number of requests"), "{err}");
    let err = refused(&["k"], &["", "0"]);
    assert!(err.contains("expected the number of requests"), "{err}");
    // Two requests announced, one given.
    let err = refused(&["k"], &[&["", "2"][..], &one("a", &gcra)].concat());
    assert!(err.contains("request 2 of 2 is malformed"), "{err}");
    // One key for two requests.
    let err = refused(
        &["k"],
        &[&["", "2"][..], &one("a", &gcra), &one("b", &gcra)].concat(),
    );
    assert!(err.contains("do not match 2 requests"), "{err}");
    // Arguments left over.
    let err = refused(
        &["k"],
        &[&["", "1"][..], &one("a", &gcra), &["extra"]].concat(),
    );
    assert!(err.contains("do not match 1 requests"), "{err}");
    let err = refused(
        &["k"],
        &["", "1", "id", "1", "leaky", "1", "1", "0", "1", "0"],
    );
    assert!(err.contains("unknown algorithm leaky"), "{err}");
}

/// A mark 2000 days ahead (more digits than Lua's %.14g keeps) comes back exact: the TAT the
/// script stored.
#[test]
fn a_mark_far_in_the_future_comes_back_with_every_digit() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = gcra("1/d", 2000, 2000);
    let reply = call_full(
        &mut con,
        &["far"],
        std::slice::from_ref(&limit),
        Some(T0),
        1,
    )
    .unwrap();
    assert_eq!(reply[0], 1, "allowed: {reply:?}");
    let stored: i64 = con.get("far").unwrap();
    assert_eq!(reply[5], stored);
    assert_eq!(stored, T0 as i64 + 2000 * 86_400_000_000);
}

/// Requests sent together in one call are decided in order, each as if alone: a batch admits
/// exactly what the same requests one by one would, and a denied request in the middle consumes
/// nothing while the requests after it are still decided.
#[test]
fn a_batch_decides_its_requests_in_order_each_as_if_alone() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    // The first limit would admit three at once (burst 2), the second only one (no burst).
    let limits = [gcra("1/s", 2, 1), gcra("10/s", 0, 1)];
    let key_bytes: Vec<&[u8]> = vec![b"{a}x".as_slice(), b"{a}y".as_slice()];
    let script = script::decision_script(Algorithms::of_limits(&limits));
    let costs = [[1, 1], [1, 1], [1, 1], [1, 1]];
    let mut calls = Vec::new();
    for (i, cost) in costs.iter().enumerate() {
        let asks = asks(&key_bytes, cost);
        let entries = entries(&limits, &asks);
        let request = LimitRequest {
            id: RequestId(i as u128 + 1),
            ..LimitRequest::new(&entries)
        };
        calls.push(script::Call::of(&request));
    }
    let refs: Vec<&script::Call> = calls.iter().collect();
    assert!(std::ptr::eq(script::script_for(&refs), script));
    let reply = run(
        &mut con,
        script,
        &script::batch_command(script, Invoke::Function, &refs, None),
    )
    .expect("batch call");
    assert_eq!(reply.len(), 4 * 2 * script::REPLY_STRIDE);
    let allowed: Vec<i64> = reply
        .chunks(script::REPLY_STRIDE)
        .map(|status| status[0])
        .collect();
    // Request 1 passes both; requests 2 to 4 pass the first limit but the second denies them,
    // so they consume nothing of the first: it still has 2 of its 3 units after the batch.
    assert_eq!(allowed, [1, 1, 1, 0, 1, 0, 1, 0]);
    assert_eq!(reply[3 * 2 * script::REPLY_STRIDE + 1], 2, "{reply:?}");
    // The same four one by one on fresh keys give the same answers.
    let mut one_by_one = Vec::new();
    for i in 0..4 {
        let reply = call_as(&mut con, &["{b}x", "{b}y"], &limits, None, 10 + i).unwrap();
        one_by_one.extend(reply.chunks(5).map(|status| status[0]));
    }
    assert_eq!(one_by_one, allowed);
}

#[test]
fn a_shadow_limit_is_decided_but_never_blocks_the_others() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let mut shadow = gcra("1/h", 0, 1);
    shadow.shadow = true;
    let limits = [gcra("10/s", 9, 1), shadow];
    let first = call(&mut con, &["enforced", "shadow"], &limits, T0);
    assert_eq!((first[0], first[5]), (1, 1));
    let full = call_full(&mut con, &["enforced", "shadow"], &limits, Some(T0), 7).unwrap();
    let second = statuses_only(full.clone());
    assert_eq!((second[0], second[5]), (1, 0), "the shadow limit denies...");
    assert_eq!(
        second[1], 8,
        "...and the enforced one still counts the request"
    );
    assert_eq!(
        (full[5], full[11]),
        ((T0 + 200 * MS) as i64, 0),
        "the enforced limit wrote its TAT, the shadow one nothing"
    );
    let decision =
        sluice::limiter::Decision::of(script::parse_statuses(&full, 2).unwrap(), &limits);
    assert_eq!(
        (decision.allowed(), decision.shadow_denied_by),
        (true, Some(1))
    );
}

#[test]
fn token_and_leaky_buckets_are_gcra_with_capacity_as_tolerance() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    // Token bucket: capacity 5, refill 1/s. Five at once, then one per second.
    let bucket = limits::token_bucket("b", "1/s", 5).compile();
    let passed = (0..8)
        .filter(|_| call(&mut con, &["t"], std::slice::from_ref(&bucket), T0)[0] == 1)
        .count();
    assert_eq!(passed, 5);
    assert_eq!(
        call(&mut con, &["t"], std::slice::from_ref(&bucket), T0 + SEC)[0],
        1
    );
    // Leaky bucket, capacity 3 draining 1/s: admitted iff level + cost <= capacity. It fills.
    let leaky = limits::leaky_bucket("l", "1/s", 3).cost(2).compile();
    assert_eq!(
        call(&mut con, &["l"], std::slice::from_ref(&leaky), T0)[..2],
        [1, 1]
    ); // level 2
    assert_eq!(
        call(&mut con, &["l"], std::slice::from_ref(&leaky), T0)[0],
        0
    ); // 2 + 2 > 3
    assert_eq!(
        call(&mut con, &["l"], std::slice::from_ref(&leaky), T0 + SEC)[0],
        1
    ); // 1 + 2 <= 3
    assert_eq!(
        call(&mut con, &["l"], std::slice::from_ref(&leaky), T0 + SEC)[0],
        0
    ); // full
}

#[test]
fn max_delay_admits_and_delays_instead_of_denying() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let shaped = shaped("10/s", 0, 250, 1);
    let replies: Vec<Vec<i64>> = (0..4)
        .map(|_| call(&mut con, &["s"], std::slice::from_ref(&shaped), T0))
        .collect();
    let delays: Vec<(i64, i64)> = replies.iter().map(|r| (r[0], r[4])).collect();
    assert_eq!(delays, vec![(1, 0), (1, 100), (1, 200), (0, 0)]);
    assert_eq!(
        replies[3][2], 50,
        "retry once the next slot is within max_delay"
    );
}

#[test]
fn sliding_window_weights_the_previous_window_and_has_no_boundary_burst() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = sliding("5/s", 1);
    let start = T0 - T0 % SEC; // windows are aligned to the shared clock
    let passed_before = (0..10)
        .filter(|_| {
            call(
                &mut con,
                &["w"],
                std::slice::from_ref(&limit),
                start + SEC - MS,
            )[0] == 1
        })
        .count();
    let passed_after = (0..10)
        .filter(|_| call(&mut con, &["w"], std::slice::from_ref(&limit), start + SEC)[0] == 1)
        .count();
    assert_eq!(
        (passed_before, passed_after),
        (5, 0),
        "the full previous window still counts at the boundary"
    );
    let (s, p, c): (u64, u64, u64) = redis::cmd("HMGET")
        .arg("w")
        .arg("s")
        .arg("p")
        .arg("c")
        .query(&mut con)
        .unwrap();
    assert_eq!((s, p, c), (start, 0, 5), "a denial writes nothing");
    // 25% into the next window, previous = 5 weighs ceil(3.75) = 4: one more fits.
    // Reset: this window's unit leaves the sliding window at the end of the next one, 1.75 s on.
    assert_eq!(
        call(
            &mut con,
            &["w"],
            std::slice::from_ref(&limit),
            start + SEC + SEC / 4
        ),
        vec![1, 0, 0, 1750, 0]
    );
    assert!((1..=1750).contains(&pttl(&mut con, "w")));
    // Now 4 + 1 = 5: one more fits once the weight is ceil(5 x (1 - e)) <= 3, at e = 40%.
    let denied = call(
        &mut con,
        &["w"],
        std::slice::from_ref(&limit),
        start + SEC + SEC / 4,
    );
    assert_eq!(denied, vec![0, 0, 150, 1750, 0]);
    assert_eq!(
        call(
            &mut con,
            &["w"],
            std::slice::from_ref(&limit),
            start + SEC + 400 * MS
        )[0],
        1
    );
}

#[test]
fn sliding_window_edge_cases() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["x"], &[costing(sliding("3/s", 1), 4)], T0)[2],
        -1,
        "cost above the limit never passes"
    );
    let day = sliding("1/d", 1);
    assert_eq!(call(&mut con, &["d"], std::slice::from_ref(&day), T0)[0], 1);
    assert_eq!(
        call(
            &mut con,
            &["d"],
            std::slice::from_ref(&day),
            T0 + 3600 * SEC
        )[0],
        0
    );
    let slow = sliding("2/m", 1); // below one per second
    let start = T0 - T0 % (60 * SEC);
    assert_eq!(
        call(&mut con, &["m"], std::slice::from_ref(&slow), start)[0],
        1
    );
    assert_eq!(
        call(&mut con, &["m"], std::slice::from_ref(&slow), start + SEC)[0],
        1
    );
    assert_eq!(
        call(
            &mut con,
            &["m"],
            std::slice::from_ref(&slow),
            start + 2 * SEC
        )[0],
        0
    );
    // An earlier clock counts as the stored window's start; it cannot reopen anything.
    assert_eq!(
        call(
            &mut con,
            &["m"],
            std::slice::from_ref(&slow),
            start - 600 * SEC
        )[0],
        0
    );
    // Idle for two windows: the state is as good as absent.
    assert_eq!(
        call(
            &mut con,
            &["m"],
            std::slice::from_ref(&slow),
            start + 120 * SEC
        )[..2],
        [1, 1]
    );
}

#[test]
fn sliding_log_is_exact_and_keeps_one_unique_member_per_unit() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = log("3/s", 1);
    for (i, at) in [0, 400 * MS, 800 * MS].into_iter().enumerate() {
        assert_eq!(
            call_as(
                &mut con,
                &["g"],
                std::slice::from_ref(&limit),
                Some(T0 + at),
                i as u128
            )
            .unwrap()[0],
            1
        );
    }
    let denied = call(
        &mut con,
        &["g"],
        std::slice::from_ref(&limit),
        T0 + 900 * MS,
    );
    assert_eq!(
        denied,
        vec![0, 0, 100, 900, 0],
        "retry when the oldest unit leaves the window"
    );
    assert_eq!(
        con.zcard::<_, u64>("g").unwrap(),
        3,
        "a denial writes nothing"
    );
    assert_eq!(
        call(&mut con, &["g"], std::slice::from_ref(&limit), T0 + SEC)[0],
        1
    );
    let members: Vec<String> = con.zrange("g", 0, -1).unwrap();
    assert_eq!(
        members.len(),
        3,
        "units out of the window are trimmed on commit: {members:?}"
    );
    assert!((1..=1000).contains(&pttl(&mut con, "g")));
    let heavy = log("10/s", 4);
    assert_eq!(
        call(&mut con, &["h"], std::slice::from_ref(&heavy), T0)[..2],
        [1, 6]
    );
    assert_eq!(
        con.zcard::<_, u64>("h").unwrap(),
        4,
        "one member per unit of cost"
    );
    assert_eq!(
        call(&mut con, &["n"], &[costing(log("3/s", 1), 4)], T0)[2],
        -1,
        "cost above the limit never passes"
    );
    // An earlier clock counts as the newest unit's time.
    assert_eq!(
        call(&mut con, &["g"], std::slice::from_ref(&limit), T0)[0],
        0
    );
}

#[test]
fn concurrency_leases_are_bounded_released_and_expire() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = concurrency(2, 30);
    assert_eq!(
        call_as(&mut con, &["c"], std::slice::from_ref(&limit), Some(T0), 1).unwrap(),
        vec![1, 1, 0, 30_000, 0]
    );
    assert_eq!(
        call_as(&mut con, &["c"], std::slice::from_ref(&limit), Some(T0), 2).unwrap()[..2],
        [1, 0]
    );
    let denied = call_as(&mut con, &["c"], std::slice::from_ref(&limit), Some(T0), 3).unwrap();
    assert_eq!(
        denied,
        vec![0, 0, 1000, 30_000, 0],
        "retry after at most a second"
    );
    let removed: i64 = redis::Script::new(RELEASE_SOURCE)
        .key("c")
        .arg(RequestId(1).to_string())
        .invoke(&mut con)
        .unwrap();
    assert_eq!(removed, 1);
    assert_eq!(
        call_as(&mut con, &["c"], std::slice::from_ref(&limit), Some(T0), 3).unwrap()[0],
        1
    );
    // A gateway that died never releases: its leases expire.
    assert_eq!(
        call_as(
            &mut con,
            &["c"],
            std::slice::from_ref(&limit),
            Some(T0 + 30 * SEC),
            4
        )
        .unwrap()[..2],
        [1, 1]
    );
    assert!((29_000..=30_000).contains(&pttl(&mut con, "c")));
}

/// Settles `change` on `key` of `limit` at `now` with `lua/settle.lua`; its reply (the number
/// of keys changed).
fn settle(con: &mut redis::Connection, key: &str, limit: &Limit, change: Change, now: u64) -> i64 {
    redis::Script::new(SETTLE_SOURCE)
        .key(key)
        .arg(now)
        .arg(script::settle_args(&limit.algorithm, change))
        .invoke(con)
        .expect("settle call")
}

/// Gives back `units` of `limit` at `now`, quoting the `mark` of the call that took them; its
/// reply (1: state changed).
fn refund(
    con: &mut redis::Connection,
    key: &str,
    limit: &Limit,
    units: u64,
    mark: i64,
    now: u64,
) -> i64 {
    settle(
        con,
        key,
        limit,
        Change::GiveBack {
            units,
            mark_us: mark,
        },
        now,
    )
}

/// The mark of a one-limit call: where it left the key.
fn take(con: &mut redis::Connection, key: &str, limit: &Limit, now: u64) -> (i64, i64) {
    let reply = call_full(con, &[key], std::slice::from_ref(limit), Some(now), 7).unwrap();
    (reply[0], reply[5])
}

#[test]
fn refunds_give_back_gcra_credit_and_window_counts_and_nothing_else() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    // GCRA 10/s, burst 9: take 6, give 2 back, 6 are admitted again (4 + 2).
    let limit = gcra("10/s", 9, 6);
    let (allowed, mark) = take(&mut con, "g", &limit, T0);
    assert_eq!(
        (allowed, mark),
        (1, (T0 + 600 * MS) as i64),
        "the mark is the TAT written"
    );
    assert_eq!(refund(&mut con, "g", &limit, 2, mark, T0), 1);
    let stored: u64 = con.get("g").unwrap();
    assert_eq!(stored, T0 + 400 * MS, "the TAT moved back by 2 emissions");
    assert!((1..=400).contains(&pttl(&mut con, "g")));
    let (_, mark) = take(&mut con, "g", &limit, T0);
    assert_eq!(
        mark,
        (T0 + SEC) as i64,
        "4 + 2 taken again: the bucket is empty"
    );
    // Giving back more than is taken is a full bucket: the key goes.
    assert_eq!(refund(&mut con, "g", &limit, 50, mark, T0), 1);
    assert!(!con.exists::<_, bool>("g").unwrap());
    assert_eq!(
        refund(&mut con, "g", &limit, 1, mark, T0),
        0,
        "no key, nothing to give back to"
    );

    // Fixed window 10/m: the count drops while the window is open, never below zero.
    let counted = window("10/m", 7);
    let (_, end) = take(&mut con, "w", &counted, T0);
    assert_eq!(end, (T0 + 60 * SEC) as i64, "the mark is the window's end");
    assert_eq!(refund(&mut con, "w", &counted, 3, end, T0 + SEC), 1);
    assert_eq!(con.hget::<_, _, u64>("w", "n").unwrap(), 4);
    assert_eq!(refund(&mut con, "w", &counted, 30, end, T0 + SEC), 1);
    assert_eq!(con.hget::<_, _, u64>("w", "n").unwrap(), 0);
    assert!(pttl(&mut con, "w") > 58_000, "the window's expiry is kept");
    // A closed window has nothing to give back to.
    let (_, end) = take(&mut con, "w", &counted, T0);
    assert_eq!(refund(&mut con, "w", &counted, 3, end, T0 + 60 * SEC), 0);
    assert_eq!(con.hget::<_, _, u64>("w", "n").unwrap(), 7);

    let err = redis::Script::new(SETTLE_SOURCE)
        .key("x")
        .arg(T0)
        .arg("sliding_log")
        .arg(1)
        .arg(-1)
        .arg(0)
        .invoke::<i64>(&mut con)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("settling does not apply to sliding_log"),
        "{err}"
    );
    let err = redis::Script::new(SETTLE_SOURCE)
        .key("x")
        .arg(T0)
        .arg("gcra")
        .arg(100)
        .arg(1)
        .invoke::<i64>(&mut con)
        .unwrap_err();
    assert!(err.to_string().contains("4 arguments per key"), "{err}");
    let err = redis::Script::new(SETTLE_SOURCE)
        .key("x")
        .arg(T0)
        .arg("gcra")
        .arg(100)
        .arg("many")
        .arg(0)
        .invoke::<i64>(&mut con)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("expects a parameter, a change and a mark"),
        "{err}"
    );
}

#[test]
fn charges_land_past_the_limit_and_keys_keep_a_ttl() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    // GCRA 10/s, burst 9 (1 s of credit): take 4 at T0, then a response reports 15 more.
    let limit = gcra("10/s", 9, 4);
    let (_, mark) = take(&mut con, "g", &limit, T0);
    assert_eq!(
        settle(&mut con, "g", &limit, Change::Charge { units: 15 }, T0),
        1
    );
    let tat: u64 = con.get("g").unwrap();
    assert_eq!(
        tat,
        mark as u64 + 15 * 100 * MS,
        "the TAT moves on by 15 emissions"
    );
    assert!(
        (1_800..=1_900).contains(&pttl(&mut con, "g")),
        "kept until the TAT is past"
    );
    // In debt: one more unit passes once its TAT (2.0 s) is within the tolerance (1 s) of now.
    let one = gcra("10/s", 9, 1);
    assert_eq!(
        take(&mut con, "g", &one, T0 + 900 * MS).0,
        0,
        "still in debt"
    );
    assert_eq!(take(&mut con, "g", &one, T0 + SEC).0, 1, "paid off");
    // A charge on a key with no state (expired, or never written) starts at now.
    assert_eq!(
        settle(&mut con, "fresh", &limit, Change::Charge { units: 3 }, T0),
        1
    );
    assert_eq!(con.get::<_, u64>("fresh").unwrap(), T0 + 300 * MS);
    // A TAT in the past counts as now.
    assert_eq!(
        settle(
            &mut con,
            "g",
            &limit,
            Change::Charge { units: 1 },
            T0 + 10 * SEC
        ),
        1
    );
    assert_eq!(con.get::<_, u64>("g").unwrap(), T0 + 10 * SEC + 100 * MS);
    // What the script does, the in-process twin does.
    assert_eq!(
        limit.algorithm.charge(
            Some(&State::Gcra {
                tat_us: (T0 + 2 * SEC) as i64
            }),
            (T0 + SEC) as i64,
            15
        ),
        Settled::Store(Write {
            state: State::Gcra {
                tat_us: (T0 + 3_500 * MS) as i64
            },
            ttl_us: (2_500 * MS) as i64
        })
    );

    // Fixed window 10/m: a charge counts in the open window, beyond its limit.
    let counted = window("10/m", 4);
    let (_, end) = take(&mut con, "w", &counted, T0);
    assert_eq!(
        settle(
            &mut con,
            "w",
            &counted,
            Change::Charge { units: 20 },
            T0 + SEC
        ),
        1
    );
    assert_eq!(con.hget::<_, _, u64>("w", "n").unwrap(), 24);
    assert_eq!(con.hget::<_, _, i64>("w", "e").unwrap(), end, "same window");
    assert_eq!(take(&mut con, "w", &window("10/m", 1), T0 + 2 * SEC).0, 0);
    // After the window ends, a charge opens a new one, from now, with a TTL of one window.
    assert_eq!(
        settle(
            &mut con,
            "w",
            &counted,
            Change::Charge { units: 3 },
            T0 + 61 * SEC
        ),
        1
    );
    assert_eq!(con.hget::<_, _, u64>("w", "n").unwrap(), 3);
    assert_eq!(
        con.hget::<_, _, u64>("w", "e").unwrap(),
        T0 + 121 * SEC,
        "a window from now"
    );
    assert!((59_000..=60_000).contains(&pttl(&mut con, "w")));
    // No key at all: the same.
    assert_eq!(
        settle(&mut con, "w2", &counted, Change::Charge { units: 2 }, T0),
        1
    );
    assert_eq!(con.hget::<_, _, u64>("w2", "n").unwrap(), 2);
    assert!((59_000..=60_000).contains(&pttl(&mut con, "w2")));
    assert_eq!(
        counted.algorithm.charge(
            Some(&State::Window {
                end_us: (T0 + 60 * SEC) as i64,
                count: 4
            }),
            (T0 + 61 * SEC) as i64,
            3
        ),
        Settled::Store(Write {
            state: State::Window {
                end_us: (T0 + 121 * SEC) as i64,
                count: 3
            },
            ttl_us: (60 * SEC) as i64
        }),
        "the in-process twin opens a window from now too"
    );
}

/// Several keys of one request settle in one call, each by its own change; a malformed change
/// anywhere leaves every key as it was.
#[test]
fn one_call_settles_every_key_of_a_request_or_none() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let per_second = gcra("10/s", 9, 5);
    let per_minute = window("100/m", 5);
    let (_, tat_mark) = take(&mut con, "{k}s", &per_second, T0);
    let (_, window_end) = take(&mut con, "{k}m", &per_minute, T0);
    let changed: i64 = redis::Script::new(SETTLE_SOURCE)
        .key("{k}s")
        .key("{k}m")
        .arg(T0)
        .arg(script::settle_args(
            &per_second.algorithm,
            Change::GiveBack {
                units: 2,
                mark_us: tat_mark,
            },
        ))
        .arg(script::settle_args(
            &per_minute.algorithm,
            Change::Charge { units: 7 },
        ))
        .invoke(&mut con)
        .unwrap();
    assert_eq!(changed, 2);
    assert_eq!(con.get::<_, u64>("{k}s").unwrap(), T0 + 300 * MS);
    assert_eq!(con.hget::<_, _, u64>("{k}m", "n").unwrap(), 12);
    assert_eq!(con.hget::<_, _, i64>("{k}m", "e").unwrap(), window_end);

    let err = redis::Script::new(SETTLE_SOURCE)
        .key("{k}s")
        .key("{k}m")
        .arg(T0)
        .arg(script::settle_args(
            &per_second.algorithm,
            Change::Charge { units: 1 },
        ))
        .arg("sliding_window")
        .arg(1)
        .arg(1)
        .arg(0)
        .invoke::<i64>(&mut con)
        .unwrap_err();
    assert!(err.to_string().contains("does not apply"), "{err}");
    assert_eq!(
        con.get::<_, u64>("{k}s").unwrap(),
        T0 + 300 * MS,
        "the valid change before it did not land either"
    );
}

/// Two gateways interleaved on one key with an explicit clock: gateway A leases units, gateway
/// B consumes, A's refund arrives late. B's consumption always survives it.
#[test]
fn a_late_refund_never_gives_back_what_another_gateway_consumed() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let peek = |con: &mut redis::Connection, key: &str, limit: &Limit, now: u64| {
        call_variant(
            Variant::Exact,
            con,
            &[key],
            std::slice::from_ref(limit),
            &[0],
            Some(now),
            9,
        )
        .expect("script call")[1]
    };

    // GCRA 10/s, burst 9 (100 ms per unit). A leases 5 at T0: TAT T0 + 500 ms.
    let lease = gcra("10/s", 9, 5);
    let one = gcra("10/s", 9, 1);
    let (_, mark) = take(&mut con, "g", &lease, T0);
    // 400 ms later B takes 3: TAT T0 + 800 ms. Then A gives its 5 back.
    for _ in 0..3 {
        take(&mut con, "g", &one, T0 + 400 * MS);
    }
    assert_eq!(refund(&mut con, "g", &lease, 5, mark, T0 + 400 * MS), 1);
    assert_eq!(
        peek(&mut con, "g", &one, T0 + 400 * MS),
        7,
        "only the 100 ms of A's units time had not drained went back: B's 3 are still counted"
    );

    // After a full refill, B takes 3; A's refund of units taken before the refill gives nothing.
    let (_, mark) = take(&mut con, "r", &lease, T0);
    for _ in 0..3 {
        take(&mut con, "r", &one, T0 + 2 * SEC);
    }
    assert_eq!(refund(&mut con, "r", &lease, 5, mark, T0 + 2 * SEC), 0);
    assert_eq!(peek(&mut con, "r", &one, T0 + 2 * SEC), 7);

    // Fixed window 10/m: A leases 5 in the window ending at T0 + 60 s. The window closes; B opens
    // the next one with 4. A's late refund belongs to the old window: nothing changes.
    let window_lease = window("10/m", 5);
    let (_, end) = take(&mut con, "w", &window_lease, T0);
    let four = window("10/m", 4);
    take(&mut con, "w", &four, T0 + 61 * SEC);
    assert_eq!(
        refund(&mut con, "w", &window_lease, 5, end, T0 + 61 * SEC),
        0
    );
    assert_eq!(con.hget::<_, _, u64>("w", "n").unwrap(), 4);
    // In its own window, it still goes back.
    let (_, end) = take(&mut con, "w", &window_lease, T0 + 62 * SEC);
    assert_eq!(
        refund(&mut con, "w", &window_lease, 5, end, T0 + 62 * SEC),
        1
    );
    assert_eq!(con.hget::<_, _, u64>("w", "n").unwrap(), 4);
}

/// A lease's unspent units (`Change::Return`) go back only where nothing can have been built on
/// them: a GCRA key takes them back while they are still the last units it took (another
/// gateway's leased units after them stay spendable until their own slots begin, so the TAT
/// must not move back under them); a calendar period takes them back while it is open, as a
/// fixed window does. The in-process twin agrees.
#[test]
fn a_lease_returns_its_units_only_while_nothing_came_after_them() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let returned = |units, mark_us| Change::Return { units, mark_us };
    // GCRA 10/s, burst 9: A leases 5 at T0 (TAT T0 + 500 ms) and returns 2: nothing came after.
    let lease = gcra("10/s", 9, 5);
    let (_, mark) = take(&mut con, "g", &lease, T0);
    assert_eq!(settle(&mut con, "g", &lease, returned(2, mark), T0), 1);
    assert_eq!(con.get::<_, u64>("g").unwrap(), T0 + 300 * MS);
    // A leases 5 more (TAT T0 + 800 ms); B takes 1 after them (T0 + 900 ms): A's return waits
    // for nothing and changes nothing.
    let (_, mark) = take(&mut con, "g", &lease, T0);
    take(&mut con, "g", &gcra("10/s", 9, 1), T0);
    assert_eq!(settle(&mut con, "g", &lease, returned(5, mark), T0), 0);
    assert_eq!(con.get::<_, u64>("g").unwrap(), T0 + 900 * MS);
    let after = State::Gcra {
        tat_us: (T0 + 900 * MS) as i64,
    };
    assert_eq!(
        lease
            .algorithm
            .settle(Some(&after), T0 as i64, returned(5, mark)),
        Settled::Unchanged
    );
    assert_eq!(
        lease.algorithm.settle(
            Some(&State::Gcra { tat_us: mark }),
            T0 as i64,
            returned(5, mark)
        ),
        Settled::Store(Write {
            state: State::Gcra {
                tat_us: (T0 + 300 * MS) as i64
            },
            ttl_us: (300 * MS) as i64
        }),
        "the twin gives back as the script does while nothing came after"
    );
    // A plain give-back (a response cheaper than its estimate) still gives back what time has
    // not drained, whatever came after: its keys are never leased.
    assert_eq!(refund(&mut con, "g", &lease, 5, mark, T0), 1);

    // Calendar 100/day: the mark of a call is its period's end; a return lands while the
    // period is open and is the key's, and never below zero.
    let quota = calendar("100/day", "UTC", 5);
    let (allowed, end) = take(&mut con, "q", &quota, T0);
    assert_eq!(allowed, 1);
    assert!(
        end > T0 as i64 && end <= (T0 + 86_400 * SEC) as i64,
        "{end}"
    );
    assert_eq!(settle(&mut con, "q", &quota, returned(3, end), T0 + SEC), 1);
    assert_eq!(con.hget::<_, _, u64>("q", "n").unwrap(), 2);
    assert_eq!(
        settle(&mut con, "q", &quota, returned(3, end - 1), T0 + SEC),
        0
    );
    assert_eq!(
        settle(&mut con, "q", &quota, returned(3, end), end as u64),
        0,
        "a closed period has nothing to take back"
    );
    assert_eq!(con.hget::<_, _, u64>("q", "n").unwrap(), 2);
    let start = con.hget::<_, _, i64>("q", "s").unwrap();
    let period = State::Period {
        start_us: start,
        end_us: end,
        count: 2,
    };
    assert_eq!(
        quota
            .algorithm
            .settle(Some(&period), (T0 + SEC) as i64, returned(5, end)),
        Settled::Store(Write {
            state: State::Period {
                start_us: start,
                end_us: end,
                count: 0
            },
            ttl_us: end - (T0 + SEC) as i64
        })
    );
    let err = redis::Script::new(SETTLE_SOURCE)
        .key("q")
        .arg(T0)
        .arg("calendar")
        .arg(1)
        .arg(3)
        .arg(end)
        .invoke::<i64>(&mut con)
        .unwrap_err();
    assert!(
        err.to_string().contains("calendar only gives back"),
        "{err}"
    );
}

/// A calendar quota (`rate: N/<unit>` in `zone`) at `cost`.
fn calendar(rate: &str, zone: &str, cost: u64) -> Limit {
    limits::calendar("q", rate, zone).cost(cost).compile()
}

/// A counter per window of `length_us` aligned to the epoch (the rate limit service's).
fn aligned(limit: u64, length_us: u64, cost: u64) -> Limit {
    Limit::new(
        "a",
        Algorithm::Calendar {
            limit,
            period: Period::Aligned { length_us },
        },
        cost,
        sluice::limiter::Rate::new(limit, std::time::Duration::from_micros(length_us)).unwrap(),
    )
}

/// A time written as RFC 3339, in microseconds.
fn instant(text: &str) -> u64 {
    text.parse::<jiff::Timestamp>().unwrap().as_microsecond() as u64
}

/// One request `id` against `limit` (key `q`) at `now`, in Redis and in process: both decide
/// the same, and the decision is returned.
fn both_as(
    con: &mut redis::Connection,
    local: &LocalLimiter,
    limit: &Limit,
    now: u64,
    id: u128,
) -> Decision {
    let limits = std::slice::from_ref(limit);
    let reply = call_full(con, &["q"], limits, Some(now), id).unwrap();
    let from_redis = script::parse_reply(&reply, 1).unwrap();
    let asks = asks(&[b"q".as_slice()], &costs(limits));
    let entries = entries(limits, &asks);
    let request = LimitRequest {
        id: RequestId(id),
        ..LimitRequest::new(&entries)
    };
    let from_local = local.check_at(&request, now as i64).unwrap();
    assert_eq!(from_redis, from_local, "at {now} with {limit:?}");
    from_redis
}

fn both(con: &mut redis::Connection, local: &LocalLimiter, limit: &Limit, now: u64) -> Decision {
    both_as(con, local, limit, now, 7)
}

/// Issue 24, quota continuity: a limit whose state keeps its meaning under new parameters keeps
/// its key ([`Algorithm::state_meaning`]), and each script reads state written under the old
/// parameters safely: usage above a lowered limit (tokens above a lowered capacity, slots above
/// a lowered max) denies; below it, what is left passes. Identically in Redis and in process.
#[test]
fn state_written_under_other_parameters_keeps_counting() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    // (before, used under it, after, admitted under it before the first denial)
    let cases: Vec<(Limit, u64, Limit, u64)> = vec![
        (window("100/d", 1), 8, window("10/d", 1), 2),
        (window("100/d", 1), 8, window("5/d", 1), 0),
        (window("10/d", 1), 8, window("20/d", 1), 12),
        (gcra("100/d", 99, 1), 8, gcra("100/d", 9, 1), 2),
        (gcra("100/d", 99, 1), 8, gcra("100/d", 4, 1), 0),
        (
            limits::token_bucket("b", "100/d", 100).compile(),
            8,
            limits::token_bucket("b", "100/d", 10).compile(),
            2,
        ),
        (sliding("100/d", 1), 8, sliding("10/d", 1), 2),
        (log("100/d", 1), 8, log("10/d", 1), 2),
        (log("100/d", 1), 8, log("5/d", 1), 0),
        (concurrency(5, 60), 3, concurrency(4, 60), 1),
        (concurrency(5, 60), 3, concurrency(2, 60), 0),
        (
            calendar("100/day", "UTC", 1),
            8,
            calendar("10/day", "UTC", 1),
            2,
        ),
        (
            calendar("100/day", "UTC", 1),
            8,
            calendar("5/day", "UTC", 1),
            0,
        ),
    ];
    for (before, used, after, admitted) in cases {
        assert_eq!(
            before.algorithm.state_meaning(),
            after.algorithm.state_meaning(),
            "{before:?} and {after:?} share their key"
        );
        redis::cmd("FLUSHDB").query::<()>(&mut con).unwrap();
        let local = LocalLimiter::new(Arc::new(ManualClock::new(0)), 100);
        let mut id = 0;
        let mut next = |limit: &Limit, con: &mut redis::Connection| {
            id += 1;
            both_as(con, &local, limit, T0 + id as u64 * MS, id)
        };
        for _ in 0..used {
            assert!(next(&before, &mut con).allowed());
        }
        let mut passed = 0;
        while next(&after, &mut con).allowed() {
            passed += 1;
            assert!(passed <= 100, "{after:?} never denies");
        }
        assert_eq!(passed, admitted, "{before:?} -> {after:?}");
    }
}

/// Required by issue 24: a monthly quota in Europe/Berlin resets at local midnight on the 1st,
/// whether the month holds the change to summer time (March) or back (October), identically in
/// Redis and in process.
#[test]
fn a_monthly_quota_in_berlin_resets_at_local_midnight_across_daylight_saving() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    for (inside, last_instant, first_of_next) in [
        // March 2026: CET until the 29th, then CEST; April starts at 00:00 CEST = 22:00Z.
        (
            "2026-03-29T12:00:00Z",
            "2026-03-31T21:59:59.999Z",
            "2026-03-31T22:00:00Z",
        ),
        // October 2026: CEST until the 25th, then CET; November starts at 00:00 CET = 23:00Z.
        (
            "2026-10-25T12:00:00Z",
            "2026-10-31T22:59:59.999Z",
            "2026-10-31T23:00:00Z",
        ),
    ] {
        redis::cmd("FLUSHDB").query::<()>(&mut con).unwrap();
        let local = LocalLimiter::new(Arc::new(ManualClock::new(0)), 100);
        let quota = calendar("3/month", "Europe/Berlin", 1);
        let (inside, last, next) = (
            instant(inside),
            instant(last_instant),
            instant(first_of_next),
        );
        for _ in 0..3 {
            assert!(both(&mut con, &local, &quota, inside).allowed());
        }
        let denied = both(&mut con, &local, &quota, inside);
        assert!(!denied.allowed());
        let until_next_ms = (next - inside) / MS;
        assert_eq!(denied.statuses[0].retry_after_ms, Some(until_next_ms));
        assert_eq!(denied.statuses[0].reset_after_ms, until_next_ms);
        assert!(
            !both(&mut con, &local, &quota, last).allowed(),
            "{last_instant}"
        );
        let reopened = both(&mut con, &local, &quota, next);
        assert!(reopened.allowed(), "{first_of_next}");
        assert_eq!(reopened.statuses[0].remaining, 2);
        // The key ends with its period: its TTL reaches to the end of the next month.
        assert!(pttl(&mut con, "q") > 27 * 24 * 3600 * 1000);
    }
}

/// The calendar's branches: the gateway's bounds on either side of Redis's clock, a peek, a
/// count above a lowered limit, a cost above the limit.
#[test]
fn calendar_counts_in_the_period_of_the_redis_clock_whatever_side_the_gateway_is_on() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let (b0, b1, b2) = (T0 - T0 % (60 * SEC), T0 - T0 % (60 * SEC) + 60 * SEC, 0);
    let b2 = b2 + b1 + 60 * SEC;
    // One call with the bounds a gateway computed, deciding at Redis's `now`.
    let mut decider = redis.connection();
    let mut raw = |now: u64, limit: u64, start: u64, end: u64, cost: u64| -> Vec<i64> {
        let script =
            &script::decision_script(Algorithms::of_limits(&[calendar("2/day", "UTC", 1)])).script;
        let reply: Vec<i64> = script
            .prepare_invoke()
            .key("k")
            .arg(now)
            .arg(1)
            .arg("00")
            .arg(1)
            .arg(("calendar", limit, start, end, cost, 0))
            .invoke(&mut decider)
            .unwrap();
        reply[..5].to_vec()
    };
    // A gateway ahead of Redis (it already computed [b1, b2)) counts in the period ending at b1.
    assert_eq!(raw(b1 - SEC, 2, b1, b2, 1), [1, 1, 0, 1000, 0]);
    // One on time recognises that period by its end and fills in its start.
    assert_eq!(raw(b1 - SEC / 2, 2, b0, b1, 1), [1, 0, 0, 500, 0]);
    assert_eq!(raw(b1 - SEC / 2, 2, b0, b1, 1), [0, 0, 500, 500, 0]);
    // A gateway behind Redis (still on [b0, b1)) counts in the period starting at b1; its end is
    // reported as one more period of the same length.
    assert_eq!(raw(b1 + SEC, 2, b0, b1, 1), [1, 1, 0, 59_000, 0]);
    // One on time recognises it by its start.
    assert_eq!(raw(b1 + 2 * SEC, 2, b1, b2, 1), [1, 0, 0, 58_000, 0]);
    // A peek never denies and writes nothing; a count above a lowered limit denies until the
    // period ends; a cost above the limit is never admitted.
    assert_eq!(raw(b1 + 3 * SEC, 2, b1, b2, 0), [1, 0, 0, 57_000, 0]);
    assert_eq!(raw(b1 + 3 * SEC, 1, b1, b2, 1), [0, 0, 57_000, 57_000, 0]);
    assert_eq!(raw(b1 + 3 * SEC, 5, b1, b2, 6), [0, 3, -1, 57_000, 0]);
    let stored: Vec<u64> = redis::cmd("HMGET")
        .arg("k")
        .arg(&["s", "e", "n"])
        .query(&mut con)
        .unwrap();
    assert_eq!(stored, [b1, b2, 2]);
    // The next period starts from nothing; a clock gone back across the boundary still counts
    // in it (the clock never runs backwards inside a key).
    assert_eq!(raw(b2, 2, b2, b2 + 60 * SEC, 1), [1, 1, 0, 60_000, 0]);
    assert_eq!(raw(b2 - SEC, 2, b1, b2, 1), [1, 0, 0, 61_000, 0]);
    assert_eq!(raw(b2 - SEC, 2, b1, b2, 1), [0, 0, 61_000, 61_000, 0]);
}

fn arb_limit() -> impl Strategy<Value = Limit> {
    let rate = (1u64..20, 1u64..4).prop_map(|(count, secs)| (count, format!("{count}/{secs}s")));
    prop_oneof![
        (rate.clone(), 0u64..6, 0u64..300_000, 1u64..4).prop_map(
            |((_, rate), burst, delay, cost)| {
                let delay = if delay < 150_000 { 0 } else { delay };
                shaped(&rate, burst, delay / 1000, cost.min(burst + 1))
            }
        ),
        (rate.clone(), 1u64..4).prop_map(|((count, rate), cost)| window(&rate, cost.min(count))),
        (rate.clone(), 1u64..4).prop_map(|((count, rate), cost)| sliding(&rate, cost.min(count))),
        (rate, 1u64..4).prop_map(|((count, rate), cost)| log(&rate, cost.min(count))),
        (1u64..4, 1u64..3).prop_map(|(max, secs)| concurrency(max, secs)),
        (1u64..20, 1u64..4, 1u64..4).prop_map(|(count, secs, cost)| aligned(
            count,
            secs * SEC,
            cost.min(count)
        )),
        (1u64..20, 1u64..4).prop_map(|(count, cost)| calendar(
            &format!("{count}/day"),
            "Europe/Berlin",
            cost.min(count)
        )),
    ]
}

/// Random limits of every algorithm and random sequences of (time step, request, release): the
/// script in Redis and the in-process backend give identical decisions, remaining counts,
/// retry, reset and delay times. Each call runs the script of exactly its limits' algorithms,
/// as a gateway sends it.
#[test]
fn script_and_in_process_backend_agree() {
    scripts_and_in_process_backend_agree(Variant::Exact);
}

/// The same with the script of every algorithm (the public contract's).
#[test]
fn the_script_of_every_algorithm_and_the_in_process_backend_agree() {
    scripts_and_in_process_backend_agree(Variant::All);
}

/// The same with each call's script as a function library (`FCALL`, what a gateway sends to
/// Redis 7).
#[test]
fn the_function_libraries_and_the_in_process_backend_agree() {
    scripts_and_in_process_backend_agree(Variant::Function);
}

fn scripts_and_in_process_backend_agree(variant: Variant) {
    let redis = RedisServer::start();
    let con = std::cell::RefCell::new(redis.connection());
    let cases = (
        prop::collection::vec(arb_limit(), 1..4),
        prop::collection::vec(
            (0u64..400_000, any::<bool>(), any::<bool>(), any::<u8>()),
            1..60,
        ),
    );
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    });
    runner
        .run(&cases, |(limits, steps)| {
            let mut con = con.borrow_mut();
            redis::cmd("FLUSHDB").query::<()>(&mut *con).unwrap();
            let local = LocalLimiter::new(Arc::new(ManualClock::new(0)), 10_000);
            let names: Vec<String> = (0..limits.len()).map(|i| format!("prop:{i}")).collect();
            let keys: Vec<&str> = names.iter().map(String::as_str).collect();
            let key_bytes: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
            let costs = costs(&limits);
            let mut now = T0;
            let mut admitted: Vec<(u128, usize)> = Vec::new();
            for (i, (step, only_first, release, peek)) in steps.into_iter().enumerate() {
                // Now and then the first limit is only peeked (cost 0), as `on_missing: skip` does.
                let mut costs = costs.clone();
                if peek % 5 == 0 {
                    costs[0] = 0;
                }
                now += step;
                let n = if only_first { 1 } else { limits.len() };
                if release && !admitted.is_empty() {
                    let (id, n) = admitted.remove(0);
                    let asks = asks(&key_bytes[..n], &costs[..n]);
                    let entries = entries(&limits[..n], &asks);
                    local.release_now(&LimitRequest {
                        id: RequestId(id),
                        ..LimitRequest::new(&entries)
                    });
                    let release_script = redis::Script::new(RELEASE_SOURCE);
                    let mut invocation = release_script.prepare_invoke();
                    for (limit, key) in limits[..n].iter().zip(&keys[..n]) {
                        if let Algorithm::Concurrency { .. } = limit.algorithm {
                            invocation.key(*key);
                        }
                    }
                    invocation
                        .arg(RequestId(id).to_string())
                        .invoke::<i64>(&mut *con)
                        .unwrap();
                }
                let id = i as u128;
                let reply = call_variant(
                    variant,
                    &mut con,
                    &keys[..n],
                    &limits[..n],
                    &costs[..n],
                    Some(now),
                    id,
                )
                .expect("script call");
                let from_redis = script::parse_reply(&reply, n).unwrap();
                let asks = asks(&key_bytes[..n], &costs[..n]);
                let entries = entries(&limits[..n], &asks);
                let request = LimitRequest {
                    id: RequestId(id),
                    ..LimitRequest::new(&entries)
                };
                let from_local: Decision = local.check_at(&request, now as i64).unwrap();
                prop_assert_eq!(
                    &from_redis,
                    &from_local,
                    "at {} with {:?}",
                    now,
                    &limits[..n]
                );
                if from_local.allowed() {
                    admitted.push((id, n));
                }
            }
            Ok(())
        })
        .unwrap();
}

/// The admin scripts (`lua/admin/`), hashed once.
fn scripts() -> &'static AdminScripts {
    static SCRIPTS: std::sync::OnceLock<AdminScripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(AdminScripts::new)
}

/// Runs the admin script `pick` chooses (`lua/admin/<name>.lua`) on `keys` at `now` with
/// `args`.
fn admin<T: redis::FromRedisValue>(
    con: &mut redis::Connection,
    pick: fn(&AdminScripts) -> &redis::Script,
    keys: &[&str],
    now: u64,
    args: &[&str],
) -> T {
    let mut invocation = pick(scripts()).prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    invocation.arg(now);
    for arg in args {
        invocation.arg(*arg);
    }
    invocation.invoke(con).expect("admin call")
}

/// Runs `lua/admin/reset.lua` on `keys` (it takes no clock).
fn reset(con: &mut redis::Connection, keys: &[&str]) -> i64 {
    let mut invocation = scripts().reset.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    invocation.invoke(con).expect("reset call")
}

/// Empties Redis's script cache, as a restart or an operator's `SCRIPT FLUSH` does.
fn flush_scripts(con: &mut redis::Connection) {
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query::<()>(con)
        .expect("SCRIPT FLUSH");
}

/// Whether Redis's script cache holds the admin script `pick` chooses.
fn cached(con: &mut redis::Connection, pick: fn(&AdminScripts) -> &redis::Script) -> bool {
    let held: Vec<bool> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(pick(scripts()).get_hash())
        .query(con)
        .expect("SCRIPT EXISTS");
    held == [true]
}

#[test]
fn each_admin_script_is_loaded_again_after_a_script_flush_and_answers_its_contract() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let keys = ["{p:admin}:overrides", "{p:admin}:epoch"];
    let _: () = con.set("w", "1").unwrap();
    flush_scripts(&mut con);
    assert_eq!(reset(&mut con, &["w"]), 1, "reset");
    assert!(cached(&mut con, |s| &s.reset));
    flush_scripts(&mut con);
    let args = ["gcra", "100000", "1", "60000"];
    let credited: i64 = admin(&mut con, |s| &s.credit, &["k", "k:credit:a"], T0, &args);
    assert_eq!(credited, 0, "credit: nothing used");
    assert!(cached(&mut con, |s| &s.credit));
    flush_scripts(&mut con);
    let value = ["f", "{}", "1000", "2"];
    let put: (i64, String) = admin(&mut con, |s| &s.override_put, &keys, T0, &value);
    assert_eq!(put, (1, String::new()), "override_put");
    assert!(cached(&mut con, |s| &s.override_put));
    flush_scripts(&mut con);
    let restored: i64 = admin(&mut con, |s| &s.override_restore, &keys, T0, &value);
    assert_eq!(restored, 0, "override_restore: one is in force");
    assert!(cached(&mut con, |s| &s.override_restore));
    flush_scripts(&mut con);
    let removed: Option<String> = admin(&mut con, |s| &s.override_delete, &keys, T0, &["f"]);
    assert_eq!(removed.as_deref(), Some("{}"), "override_delete");
    assert!(cached(&mut con, |s| &s.override_delete));
    flush_scripts(&mut con);
    let epoch: i64 = admin(&mut con, |s| &s.announce, &keys[1..], T0, &[]);
    assert_eq!(epoch as u64, T0 + 2, "announce: the put, the delete, this");
    assert!(cached(&mut con, |s| &s.announce));
}

#[test]
fn a_credit_moves_a_gcra_back_at_most_to_full_and_counts_once_per_id() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = gcra("10/s", 4, 1);
    for _ in 0..5 {
        assert_eq!(
            call(&mut con, &["k"], std::slice::from_ref(&limit), T0)[0],
            1
        );
    }
    assert_eq!(
        call(&mut con, &["k"], std::slice::from_ref(&limit), T0)[0],
        0,
        "full"
    );
    let credit = |con: &mut redis::Connection, units: &str, id: &str| -> i64 {
        let args = ["gcra", "100000", units, "60000"];
        admin(
            con,
            |s| &s.credit,
            &["k", &format!("k:credit:{id}")],
            T0,
            &args,
        )
    };
    assert_eq!(credit(&mut con, "2", "a"), 1);
    assert_eq!(credit(&mut con, "2", "a"), -1, "the same id again");
    let stored: i64 = con.get("k").unwrap();
    assert_eq!(stored as u64, T0 + 300 * MS, "two emissions back");
    for expected in [1, 1, 0] {
        assert_eq!(
            call(&mut con, &["k"], std::slice::from_ref(&limit), T0)[0],
            expected
        );
    }
    assert_eq!(credit(&mut con, "1000", "b"), 1);
    assert!(
        !con.exists::<_, bool>("k").unwrap(),
        "never beyond a full bucket: no key"
    );
    assert_eq!(
        credit(&mut con, "1", "c"),
        0,
        "nothing used: nothing to credit"
    );
    let remembered = pttl(&mut con, "k:credit:a");
    assert!(
        (1..=60_000).contains(&remembered),
        "the id lives {remembered} ms"
    );
}

#[test]
fn a_credit_lowers_an_open_window_s_count_and_a_reset_deletes_the_key() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limit = window("3/s", 1);
    for _ in 0..3 {
        call(&mut con, &["w"], std::slice::from_ref(&limit), T0);
    }
    let args = ["count", "1", "5", "60000"];
    let credited: i64 = admin(&mut con, |s| &s.credit, &["w", "w:credit:x"], T0, &args);
    assert_eq!(credited, 1);
    let count: String = con.hget("w", "n").unwrap();
    assert_eq!(count, "0", "never below 0");
    let late: i64 = admin(
        &mut con,
        |s| &s.credit,
        &["w", "w:credit:y"],
        T0 + 2 * SEC,
        &args,
    );
    assert_eq!(late, 0, "a closed window is full already");
    let existed: i64 = reset(&mut con, &["w", "nothing"]);
    assert_eq!(existed, 1);
    assert!(!con.exists::<_, bool>("w").unwrap());
}

#[test]
fn overrides_carry_their_expiry_and_every_change_counts_in_the_epoch() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let keys = ["{p:admin}:overrides", "{p:admin}:epoch"];
    let put = |con: &mut redis::Connection, field: &str, value: &str| -> (i64, String) {
        admin(
            con,
            |s| &s.override_put,
            &keys,
            T0,
            &[field, value, "1000", "2"],
        )
    };
    assert_eq!(put(&mut con, "f", "{\"a\":1}"), (1, String::new()));
    assert_eq!(
        put(&mut con, "f", "{\"a\":2}"),
        (1, "{\"a\":1}".to_string())
    );
    assert_eq!(put(&mut con, "g", "{}"), (1, String::new()));
    let stored: String = con.hget(keys[0], "f").unwrap();
    assert_eq!(
        stored,
        format!("{} {{\"a\":2}}", T0 / MS + 1000),
        "expiry on the script's clock"
    );
    assert_eq!(
        put(&mut con, "h", "{}"),
        (0, String::new()),
        "at most 2 in force: a reply, not an error"
    );
    assert!(!con.hexists::<_, _, bool>(keys[0], "h").unwrap());
    let later = T0 + 2 * SEC;
    let room: (i64, String) = admin(
        &mut con,
        |s| &s.override_put,
        &keys,
        later,
        &["h", "{}", "1000", "2"],
    );
    assert_eq!(room, (1, String::new()), "the expired ones make room");
    assert_eq!(con.hlen::<_, u64>(keys[0]).unwrap(), 1);
    let ttl = pttl(&mut con, keys[0]);
    assert!(
        (1..=1000).contains(&ttl),
        "the table lives as its longest override: {ttl}"
    );
    let removed: Option<String> = admin(&mut con, |s| &s.override_delete, &keys, later, &["h"]);
    assert_eq!(removed.as_deref(), Some("{}"));
    let announced: i64 = admin(&mut con, |s| &s.announce, &keys[1..], T0, &[]);
    assert_eq!(
        announced as u64,
        later + 2,
        "at least the time (of the last put), then one more per change: delete h, this"
    );
    let nothing: Option<String> = admin(&mut con, |s| &s.override_delete, &keys, later, &["h"]);
    assert_eq!(nothing, None);
    let unchanged: u64 = con.get(keys[1]).unwrap();
    assert_eq!(
        unchanged as i64, announced,
        "removing nothing changes nothing"
    );
    let _: () = con.del(keys[1]).unwrap();
    let after_a_flush: i64 = admin(&mut con, |s| &s.announce, &keys[1..], T0 + 3 * SEC, &[]);
    assert!(
        after_a_flush > announced,
        "a lost epoch never comes back to a value seen"
    );
    let epoch_ttl = pttl(&mut con, keys[1]);
    assert!(epoch_ttl > 0, "the epoch lives {epoch_ttl} ms");
}

#[test]
fn an_override_is_written_back_only_where_none_is_in_force() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let keys = ["{p:admin}:overrides", "{p:admin}:epoch"];
    let restore = |con: &mut redis::Connection, field: &str, value: &str, at: u64| -> i64 {
        admin(
            con,
            |s| &s.override_restore,
            &keys,
            at,
            &[field, value, "1000", "2"],
        )
    };
    assert_eq!(restore(&mut con, "f", "{\"a\":1}", T0), 1, "written back");
    let epoch: u64 = con.get(keys[1]).unwrap();
    assert!(epoch >= T0, "a change counted in the epoch");
    assert_eq!(
        restore(&mut con, "f", "{\"a\":2}", T0),
        0,
        "one is in force"
    );
    let stored: String = con.hget(keys[0], "f").unwrap();
    assert_eq!(stored, format!("{} {{\"a\":1}}", T0 / MS + 1000));
    let unchanged: u64 = con.get(keys[1]).unwrap();
    assert_eq!(unchanged, epoch, "nothing written, nothing counted");
    assert_eq!(restore(&mut con, "g", "{}", T0), 1);
    assert_eq!(restore(&mut con, "h", "{}", T0), -1, "at most 2 in force");
    assert_eq!(
        restore(&mut con, "f", "{\"a\":3}", T0 + 2 * SEC),
        1,
        "expired: written again"
    );
}
