//! The limiter engine through real gateways: exact limits shared by two gateway processes,
//! concurrency leases released on completion, on disconnect and by expiry, shaping, and costs
//! read from a header.

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use support::config::{route, Config};
use support::limits::{
    calendar, concurrency, fixed_window, gcra, leaky_bucket, sliding_log, Limit,
};
use support::{connect, hammer, http_get, metric, Gateway, RedisServer, Upstream};

/// A configuration whose one route has the one `limit`, in Redis, failing closed.
fn config(limit: Limit) -> String {
    Config::new()
        .redis("REDIS_URL")
        .failure_mode("deny")
        .route(route("api").limit(limit))
        .yaml()
}

/// Concurrency leases in `redis` now: the members of every sorted set (one per key).
fn leases(redis: &RedisServer) -> usize {
    let mut con = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
    keys.iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(key).query(&mut con).expect("TYPE");
            if kind == "zset" {
                redis::cmd("ZCARD").arg(key).query(&mut con).expect("ZCARD")
            } else {
                0
            }
        })
        .sum()
}

/// Waits until the slow request sent just before holds its lease in `redis`.
fn wait_for_lease(redis: &RedisServer) {
    support::eventually(
        Duration::from_secs(10),
        "the slow request took its lease",
        || leases(redis) >= 1,
    );
}

/// A Redis, an upstream, and a gateway whose one route has the one `limit`.
fn one_limit(limit: Limit) -> (RedisServer, Upstream, Gateway) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&config(limit), &upstream, Some(&redis));
    (redis, upstream, gateway)
}

#[test]
fn two_gateways_sharing_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    for (name, limit) in [
        ("gcra", gcra("shared", "50/h").key(&["route"]).burst(49)),
        ("sliding_log", sliding_log("shared", "50/h").key(&["route"])),
        (
            "fixed_window",
            fixed_window("shared", "50/h").key(&["route"]),
        ),
    ] {
        redis::cmd("FLUSHALL")
            .query::<()>(&mut redis.connection())
            .unwrap();
        let body = config(limit);
        let (a, b) = (
            Gateway::start(&body, &upstream, Some(&redis)),
            Gateway::start(&body, &upstream, Some(&redis)),
        );
        let statuses = hammer(&[a.proxy, b.proxy], 20, 200, "/x");
        let admitted = statuses.iter().filter(|s| **s == 200).count();
        let limited = statuses.iter().filter(|s| **s == 429).count();
        println!("{name}: 200 concurrent requests over 2 gateways, limit 50: admitted {admitted}, limited {limited}");
        assert_eq!((admitted, limited), (50, 150), "{name}");
    }
}

#[test]
fn concurrency_leases_are_released_when_the_response_finishes() {
    let (redis, _upstream, gateway) = one_limit(concurrency("inflight", 1));
    let proxy = gateway.proxy;
    let slow = std::thread::spawn(move || http_get(proxy, "/slow/800", None, &[]).status);
    wait_for_lease(&redis);
    let busy = gateway.get("/fast");
    assert_eq!(busy.status, 429);
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(slow.join().unwrap(), 200);
    assert_eq!(
        gateway.get("/fast").status,
        200,
        "the finished request returned its lease"
    );
    assert_eq!(gateway.get("/fast").status, 200);
}

#[test]
fn concurrency_leases_are_released_when_the_client_goes_away() {
    let (redis, _upstream, gateway) = one_limit(concurrency("inflight", 1));
    let mut abandoned = connect(gateway.proxy, None);
    abandoned
        .write_all(b"GET /slow/30000 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    wait_for_lease(&redis);
    assert_eq!(
        gateway.get("/fast").status,
        429,
        "the slow request holds the only slot"
    );
    drop(abandoned);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut status = 429;
    while status == 429 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        status = gateway.get("/fast").status;
    }
    assert_eq!(
        status, 200,
        "the slot came back long before the 30 s request could have finished"
    );
}

#[test]
fn concurrency_leases_of_a_killed_gateway_expire() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let body = config(
        concurrency("inflight", 1)
            .key(&["route"])
            .set("lease", "2s"),
    );
    let doomed = Gateway::start(&body, &upstream, Some(&redis));
    let survivor = Gateway::start(&body, &upstream, Some(&redis));
    let mut holder = connect(doomed.proxy, None);
    // The lease is taken after this instant, so it cannot expire before 2 s from it.
    let sent = Instant::now();
    holder
        .write_all(b"GET /slow/30000 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    wait_for_lease(&redis);
    drop(doomed); // SIGKILL: the lease is never released
    let started = Instant::now();
    assert_eq!(
        survivor.get("/fast").status,
        429,
        "the dead gateway's lease still counts"
    );
    let mut status = 429;
    while status == 429 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        status = survivor.get("/fast").status;
    }
    assert_eq!(status, 200, "the lease expired");
    assert!(
        sent.elapsed() >= Duration::from_millis(1950),
        "not before the lease's 2 s were over ({:?})",
        sent.elapsed()
    );
}

#[test]
fn shaping_delays_a_burst_instead_of_rejecting_it() {
    let limit = leaky_bucket("smooth", "10/s", 1)
        .key(&["route"])
        .set("max_delay", "1s");
    let (_redis, _upstream, gateway) = one_limit(limit);
    let started = Instant::now();
    let statuses = hammer(&[gateway.proxy], 5, 5, "/x");
    assert_eq!(statuses, vec![200; 5], "held, not rejected");
    // The fifth request had to wait for its slot, 400 ms after the first.
    assert!(started.elapsed() >= Duration::from_millis(400));
    let statuses = hammer(&[gateway.proxy], 20, 20, "/x");
    assert!(
        statuses.contains(&429),
        "beyond max_delay requests are rejected: {statuses:?}"
    );
}

#[test]
fn costs_come_from_a_header_within_a_cap() {
    let limit = fixed_window("units", "10/h")
        .key(&["route"])
        .set("cost_header", "x-cost")
        .set("cost_max", 5);
    let (_redis, _upstream, gateway) = one_limit(limit);
    let heavy = http_get(gateway.proxy, "/x", None, &[("x-cost", "4")]);
    assert_eq!(heavy.header("ratelimit"), Some("\"units\";r=6;t=3600"));
    assert_eq!(
        http_get(gateway.proxy, "/x", None, &[]).header("ratelimit"),
        Some("\"units\";r=5;t=3600"),
        "default cost 1"
    );
    for bad in ["0", "6", "-1", "lots"] {
        let response = http_get(gateway.proxy, "/x", None, &[("x-cost", bad)]);
        assert_eq!(response.status, 400, "cost {bad:?}");
    }
    assert_eq!(
        http_get(gateway.proxy, "/x", None, &[("x-cost", "5")]).status,
        200
    );
    assert_eq!(
        http_get(gateway.proxy, "/x", None, &[("x-cost", "1")]).status,
        429
    );
    let metrics = gateway.metrics();
    assert_eq!(
        metric(
            &metrics,
            "sluice_requests_total",
            &[("route", "api"), ("decision", "bad_request")]
        ),
        4.0
    );
}

/// The microseconds of the Unix clock now (the scale of Redis TIME on this machine).
fn unix_now_us() -> i64 {
    jiff::Timestamp::now().as_microsecond()
}

/// Issue 24: a calendar quota through the real gateway: its units pass, then 429 with
/// `Retry-After` and the `RateLimit` reset pointing at the next local midnight in its zone.
#[test]
fn a_calendar_quota_denies_until_the_next_local_midnight() {
    let zone = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
    let limit = calendar("daily", "3/day", "Europe/Berlin").key(&["route"]);
    let (_redis, _upstream, gateway) = one_limit(limit);
    for _ in 0..3 {
        assert_eq!(gateway.get("/x").status, 200);
    }
    let before = unix_now_us();
    let denied = gateway.get("/x");
    let after = unix_now_us();
    assert_eq!(denied.status, 429);
    // The next local midnight, computed here from the clock the request was decided within.
    let today = jiff::Timestamp::from_microsecond(after)
        .unwrap()
        .to_zoned(zone.clone())
        .date();
    let midnight = today
        .tomorrow()
        .unwrap()
        .to_zoned(zone)
        .unwrap()
        .timestamp()
        .as_microsecond();
    let (lo, hi) = (
        (midnight - after) / 1_000_000,
        (midnight - before) / 1_000_000 + 1,
    );
    let retry: i64 = denied.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (lo..=hi).contains(&retry),
        "Retry-After {retry} not in {lo}..={hi}"
    );
    let ratelimit = denied.header("ratelimit").unwrap();
    let reset: i64 = ratelimit
        .rsplit_once(";t=")
        .and_then(|(_, t)| t.parse().ok())
        .unwrap_or_else(|| panic!("RateLimit: {ratelimit}"));
    assert!(
        (lo..=hi).contains(&reset),
        "RateLimit {ratelimit} not in {lo}..={hi}"
    );
    assert!(ratelimit.starts_with("\"daily\";r=0;"), "{ratelimit}");
}

/// Sends `n` requests and returns how many passed before the first 429 (all must pass or stop
/// at the first denial).
fn admitted(gateway: &Gateway, n: usize) -> usize {
    let statuses: Vec<u16> = (0..n).map(|_| gateway.get("/x").status).collect();
    let passed = statuses.iter().take_while(|s| **s == 200).count();
    assert!(statuses[passed..].iter().all(|s| *s == 429), "{statuses:?}");
    passed
}

/// Issue 24, quota continuity across reloads: a rate rewritten and reloaded by SIGHUP keeps the
/// usage counted before (100/d with 8 used, then 10/d: 2 more pass); a change of the window
/// length starts fresh counters, as documented (100/d with 8 used, then 5/h: 5 pass). The limit
/// is exact, so Redis counts the 8 alone: with leases (no mode: auto) the gateway may hold
/// units of 100/d that it gives back only once the key is idle, and whether any are left to
/// give back depends on how the 8 fell into top-ups (units held across a reload are
/// `tests/scale_out.rs`'s and `limiter/leased/`'s).
#[test]
fn a_reload_keeps_the_usage_of_a_limit_whose_state_keeps_its_meaning() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    for (after, passes) in [("10/d", 2), ("5/h", 5)] {
        redis::cmd("FLUSHALL")
            .query::<()>(&mut redis.connection())
            .unwrap();
        let exact = |rate| {
            let limit = fixed_window("daily", rate).key(&["route"]);
            config(limit.set("mode", "exact"))
        };
        let gateway = Gateway::start(&exact("100/d"), &upstream, Some(&redis));
        assert_eq!(admitted(&gateway, 8), 8);
        assert!(
            gateway.reload(&exact(after)),
            "the reload to {after} is accepted"
        );
        assert_eq!(
            admitted(&gateway, 12),
            passes,
            "after the reload to {after}"
        );
    }
}
