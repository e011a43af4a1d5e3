//! The Lua limiter script, branch by branch, against a real redis-server with an explicit clock;
//! and a property test that the script and the in-process backend decide identically.

mod support;

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use redis::Commands;
use sluice::config::rate::parse_rate;
use sluice::limiter::clock::ManualClock;
use sluice::limiter::local::LocalLimiter;
use sluice::limiter::script::{self, SOURCE};
use sluice::limiter::{Algorithm, Decision, Limit};
use support::RedisServer;

const T0: u64 = 1_763_500_000_123_456; // a realistic Redis TIME in microseconds
const MS: u64 = 1_000;
const SEC: u64 = 1_000_000;

fn gcra(rate: &str, burst: u64, cost: u64) -> Limit {
    let rate = parse_rate(rate).unwrap();
    let emission_us = rate.period_us().div_ceil(rate.count.get());
    Limit {
        name: "g".into(),
        algorithm: Algorithm::Gcra {
            emission_us,
            tolerance_us: emission_us * (burst + 1),
        },
        cost,
        rate,
    }
}

fn window(rate: &str, cost: u64) -> Limit {
    let rate = parse_rate(rate).unwrap();
    Limit {
        name: "w".into(),
        algorithm: Algorithm::FixedWindow {
            limit: rate.count.get(),
            window_us: rate.period_us(),
        },
        cost,
        rate,
    }
}

fn call_raw(
    con: &mut redis::Connection,
    keys: &[&str],
    limits: &[Limit],
    now: Option<u64>,
) -> redis::RedisResult<Vec<i64>> {
    let script = redis::Script::new(SOURCE);
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    script::push_args(&mut invocation, limits, now);
    invocation.invoke(con)
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
    assert_eq!(call(&mut con, &["k"], &[limit], T0), vec![1, 4, 0, 100]);
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
    assert_eq!(replies[4], vec![1, 0, 0, 500]);
    let before: String = con.get("k").unwrap();
    assert_eq!(
        call(&mut con, &["k"], std::slice::from_ref(&limit), T0),
        vec![0, 0, 100, 500]
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
        vec![1, 4, 0, 100]
    );
}

#[test]
fn gcra_cost_above_capacity_never_succeeds_and_says_so() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["k"], &[gcra("10/s", 4, 6)], T0),
        vec![0, 5, -1, 0]
    );
    assert!(!con.exists::<_, bool>("k").unwrap());
}

#[test]
fn gcra_cost_zero_peeks_without_writing() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["k"], &[gcra("10/s", 4, 0)], T0),
        vec![1, 5, 0, 0]
    );
    assert!(!con.exists::<_, bool>("k").unwrap());
}

#[test]
fn gcra_cost_above_one_consumes_that_many() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    assert_eq!(
        call(&mut con, &["k"], &[gcra("10/s", 4, 3)], T0),
        vec![1, 2, 0, 300]
    );
    assert_eq!(
        call(&mut con, &["k"], &[gcra("10/s", 4, 3)], T0),
        vec![0, 2, 100, 300]
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
        vec![1, 0, 0, 86_400_000]
    );
    assert_eq!(
        call(
            &mut con,
            &["d"],
            std::slice::from_ref(&day),
            T0 + 3600 * SEC
        ),
        vec![0, 0, 82_800_000, 82_800_000]
    );
    assert!(pttl(&mut con, "d") > 86_000_000);
    let slow = gcra("3/m", 0, 1); // one every 20 s
    assert_eq!(
        call(&mut con, &["s"], std::slice::from_ref(&slow), T0)[0],
        1
    );
    assert_eq!(
        call(&mut con, &["s"], std::slice::from_ref(&slow), T0 + 19 * SEC),
        vec![0, 0, 1000, 1000]
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
        vec![1, 2, 0, 1000]
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
        vec![1, 1, 0, 900]
    );
    assert_eq!(
        call(
            &mut con,
            &["w"],
            std::slice::from_ref(&limit),
            T0 + 200 * MS
        ),
        vec![1, 0, 0, 800]
    );
    assert_eq!(
        call(
            &mut con,
            &["w"],
            std::slice::from_ref(&limit),
            T0 + 300 * MS
        ),
        vec![0, 0, 700, 700]
    );
    assert_eq!(
        con.hget::<_, _, u64>("w", "n").unwrap(),
        3,
        "a denial writes nothing"
    );
    // The window ends: a new one opens at the first hit.
    assert_eq!(
        call(&mut con, &["w"], std::slice::from_ref(&limit), T0 + SEC),
        vec![1, 2, 0, 1000]
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
        call(&mut con, &["w"], &[window("3/s", 4)], T0),
        vec![0, 3, -1, 1000]
    );
    assert!(!con.exists::<_, bool>("w").unwrap());
    let limit = window("2/10s", 1);
    call(&mut con, &["b"], std::slice::from_ref(&limit), T0);
    call(&mut con, &["b"], std::slice::from_ref(&limit), T0);
    // Five seconds before the window opened: still the same window, still full.
    assert_eq!(
        call(&mut con, &["b"], std::slice::from_ref(&limit), T0 - 5 * SEC),
        vec![0, 0, 10_000, 10_000]
    );
}

#[test]
fn one_call_consumes_nothing_unless_every_limit_allows() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let limits = [gcra("10/s", 9, 1), window("1/m", 1)];
    assert_eq!(
        call(&mut con, &["a", "b"], &limits, T0),
        vec![1, 9, 0, 100, 1, 0, 0, 60_000]
    );
    let tat: String = con.get("a").unwrap();
    for _ in 0..3 {
        let reply = call(&mut con, &["a", "b"], &limits, T0);
        assert_eq!(
            &reply[..4],
            &[1, 9, 0, 100],
            "gcra allows, is not consumed, and says so"
        );
        assert_eq!(&reply[4..], &[0, 0, 60_000, 60_000]);
    }
    assert_eq!(con.get::<_, String>("a").unwrap(), tat);
}

#[test]
fn the_redis_clock_is_used_when_no_time_is_given() {
    let redis = RedisServer::start();
    let mut con = redis.connection();
    let reply = call_raw(&mut con, &["k"], &[gcra("1/s", 0, 1)], None).unwrap();
    assert_eq!(reply, vec![1, 0, 0, 1000]);
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
    let err = redis::Script::new(SOURCE)
        .key("k")
        .arg("")
        .invoke::<Vec<i64>>(&mut con)
        .unwrap_err();
    assert!(
        err.to_string().contains("expected 5 arguments, got 1"),
        "{err}"
    );
    let err = redis::Script::new(SOURCE)
        .key("k")
        .arg(T0)
        .arg("leaky")
        .arg(1)
        .arg(1)
        .arg(1)
        .invoke::<Vec<i64>>(&mut con)
        .unwrap_err();
    assert!(err.to_string().contains("unknown algorithm leaky"), "{err}");
}

fn arb_limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..20, 1u64..4, 0u64..6, 1u64..4).prop_map(|(count, secs, burst, cost)| {
            let cost = cost.min(burst + 1);
            gcra(&format!("{count}/{secs}s"), burst, cost)
        }),
        (1u64..20, 1u64..4, 1u64..4)
            .prop_map(|(count, secs, cost)| window(&format!("{count}/{secs}s"), cost.min(count))),
    ]
}

/// Random limits and random (time step, request) sequences: the script in Redis and the
/// in-process backend give identical decisions, remaining counts and times.
#[test]
fn script_and_in_process_backend_agree() {
    let redis = RedisServer::start();
    let con = std::cell::RefCell::new(redis.connection());
    let cases = (
        prop::collection::vec(arb_limit(), 1..4),
        prop::collection::vec((0u64..400_000, any::<bool>()), 1..60),
    );
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(&cases, |(limits, steps)| {
            let mut con = con.borrow_mut();
            redis::cmd("FLUSHDB").query::<()>(&mut *con).unwrap();
            let local = LocalLimiter::new(Arc::new(ManualClock::new(0)), 10_000);
            let names: Vec<String> = (0..limits.len()).map(|i| format!("prop:{i}")).collect();
            let keys: Vec<&str> = names.iter().map(String::as_str).collect();
            let key_bytes: Vec<Vec<u8>> = names.iter().map(|n| n.clone().into_bytes()).collect();
            let mut now = T0;
            for (step, only_first) in steps {
                now += step;
                let n = if only_first { 1 } else { limits.len() };
                let reply = call(&mut con, &keys[..n], &limits[..n], now);
                let from_redis = script::parse_reply(&reply, n).unwrap();
                let from_local: Decision = local
                    .check_at(&limits[..n], &key_bytes[..n], now as i64)
                    .unwrap();
                prop_assert_eq!(from_redis, from_local, "at {} with {:?}", now, &limits[..n]);
            }
            Ok(())
        })
        .unwrap();
}
