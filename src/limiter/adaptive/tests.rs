//! Adaptive concurrency on the manual clock: the gradient, the probe, shedding by level.

use super::*;
use crate::limiter::clock::ManualClock;

fn settings(levels: u8, reserve: f64) -> AdaptiveSettings {
    AdaptiveSettings {
        min_limit: 2,
        max_limit: 100,
        sample_window: Duration::from_millis(100),
        probe_interval: Duration::from_secs(10),
        probe_requests: 4,
        tolerance: 0.25,
        reserve,
        levels,
    }
}

fn meters() -> AdaptiveMeters {
    AdaptiveMeters {
        limit: IntGauge::new("limit", "unregistered").expect("a gauge"),
        baseline_seconds: Gauge::new("baseline", "unregistered").expect("a gauge"),
    }
}

fn limiter(levels: u8, reserve: f64) -> (Arc<AdaptiveConcurrency>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let limiter = AdaptiveConcurrency::new(settings(levels, reserve), clock.clone(), meters());
    (Arc::new(limiter), clock)
}

/// `count` requests asked at level 0 (those admitted answered after `ms`), then the window
/// closed by one more.
fn window(limiter: &Arc<AdaptiveConcurrency>, clock: &ManualClock, count: u32, ms: u64) {
    let permits: Vec<Permit> = (0..count).filter_map(|_| limiter.admit(0)).collect();
    clock.advance_by(Duration::from_millis(ms));
    for permit in permits {
        permit.answered(Duration::from_millis(ms));
    }
    clock.advance_by(Duration::from_millis(100));
    if let Some(permit) = limiter.admit(0) {
        permit.answered(Duration::from_millis(ms));
    }
}

/// A limiter whose probe found a 20 ms baseline, then `windows` windows of 20 ms with the
/// whole limit in flight.
fn risen(windows: usize) -> (Arc<AdaptiveConcurrency>, Arc<ManualClock>) {
    let (limiter, clock) = limiter(1, 0.0);
    for _ in 0..4 {
        let permit = limiter.admit(0).expect("a place during the probe");
        permit.answered(Duration::from_millis(20));
    }
    for _ in 0..windows {
        window(&limiter, &clock, limiter.limit(), 20);
    }
    (limiter, clock)
}

#[test]
fn the_baseline_is_probed_at_the_minimum_then_the_limit_rises_while_latency_holds() {
    let (limiter, clock) = limiter(1, 0.0);
    assert_eq!(
        limiter.limit(),
        2,
        "the probe pins the limit to its minimum"
    );
    let held: Vec<Permit> = (0..3).filter_map(|_| limiter.admit(0)).collect();
    assert_eq!(held.len(), 2, "no more than the minimum during the probe");
    drop(held);
    for _ in 0..4 {
        limiter
            .admit(0)
            .unwrap()
            .answered(Duration::from_millis(20));
    }
    assert_eq!(limiter.meters.baseline_seconds.get(), 0.02);
    let mut limits = vec![limiter.limit()];
    for _ in 0..6 {
        window(&limiter, &clock, limiter.limit(), 20);
        limits.push(limiter.limit());
    }
    assert!(limits.windows(2).all(|w| w[1] > w[0]), "{limits:?}");
}

#[test]
fn the_limit_is_cut_when_latency_grows_and_not_raised_for_idle_traffic() {
    let (limiter, clock) = risen(8);
    let high = limiter.limit();
    window(&limiter, &clock, high, 80);
    let cut = limiter.limit();
    assert!(cut < high, "{cut} after {high}");
    // Two requests at a time cannot say that more would hold.
    window(&limiter, &clock, 2, 20);
    window(&limiter, &clock, 2, 20);
    assert_eq!(limiter.limit(), cut);
}

#[test]
fn the_baseline_is_probed_again_after_its_interval_from_requests_admitted_during_it() {
    let (limiter, clock) = risen(5);
    let before = limiter.limit();
    let old = limiter.admit(0).unwrap();
    clock.advance_by(Duration::from_secs(10));
    window(&limiter, &clock, 1, 20);
    assert_eq!(limiter.limit(), 2, "probing");
    // A request admitted before the probe is not one of its samples: after three of its own
    // (of four: the window's last request, admitted once it had begun, then two), it still runs.
    old.answered(Duration::from_millis(500));
    for _ in 0..2 {
        limiter
            .admit(0)
            .unwrap()
            .answered(Duration::from_millis(10));
    }
    assert_eq!(limiter.limit(), 2, "still probing");
    limiter
        .admit(0)
        .unwrap()
        .answered(Duration::from_millis(10));
    assert_eq!(limiter.meters.baseline_seconds.get(), 0.01);
    assert_eq!(
        limiter.limit(),
        before,
        "back to the limit before the probe"
    );
}

/// Probes again after the interval; each of its requests answered after `ms`.
fn probe(limiter: &Arc<AdaptiveConcurrency>, clock: &ManualClock, ms: u64) {
    clock.advance_by(Duration::from_secs(10));
    window(limiter, clock, 1, 20);
    assert_eq!(limiter.limit(), 2, "probing");
    for _ in 0..4 {
        let permit = limiter.admit(0).expect("a place during the probe");
        permit.answered(Duration::from_millis(ms));
    }
}

#[test]
fn one_slow_probe_does_not_raise_the_baseline_and_two_do() {
    let (limiter, clock) = risen(5);
    let baseline = || limiter.meters.baseline_seconds.get();
    probe(&limiter, &clock, 60);
    assert_eq!(baseline(), 0.02, "one probe read three times slower");
    probe(&limiter, &clock, 40);
    assert_eq!(
        baseline(),
        0.04,
        "the upstream stayed slower: the lower of 60 and 40 ms"
    );
    probe(&limiter, &clock, 10);
    assert_eq!(baseline(), 0.01, "a faster upstream is taken at once");
}

#[test]
fn the_lowest_levels_are_shed_first_and_the_reserve_is_kept_for_the_highest() {
    let (single, _) = limiter(1, 0.4);
    let (limiter, _) = limiter(3, 0.4);
    assert_eq!(limiter.threshold(10, 0), 6);
    assert_eq!(limiter.threshold(10, 1), 8);
    assert_eq!(limiter.threshold(10, 2), 10);
    assert_eq!(limiter.threshold(2, 0), 1, "at least one");
    assert_eq!(single.threshold(10, 0), 10, "one level: no reserve");
    // The probe's limit of 2: the lowest level gets 1, the highest both.
    let low = limiter.admit(0).expect("the first low request");
    assert!(
        limiter.admit(0).is_none(),
        "the low level is shed at its share"
    );
    let high = limiter.admit(2).expect("the reserve");
    assert!(limiter.admit(2).is_none(), "the whole limit in flight");
    drop((low, high));
    assert!(
        limiter.admit(0).is_some(),
        "dropped permits are no longer in flight"
    );
}

#[test]
fn requests_that_outlive_their_admission_do_not_starve_a_probe() {
    let (limiter, clock) = risen(5);
    let limit = limiter.limit();
    let mut long_lived: Vec<Permit> = (0..limit).filter_map(|_| limiter.admit(0)).collect();
    assert!(limiter.admit(0).is_none(), "the whole limit is in flight");
    clock.advance_by(Duration::from_secs(10));
    let last = long_lived.pop().expect("a long-lived request");
    last.answered(Duration::from_millis(20));
    assert_eq!(
        limiter.limit(),
        2,
        "probing, with the others still in flight"
    );
    for _ in 0..4 {
        let permit = limiter.admit(0).expect("the probe counts its own requests");
        permit.answered(Duration::from_millis(20));
    }
    assert_eq!(limiter.limit(), limit, "the probe ended");
    drop(long_lived);
    assert!(limiter.admit(0).is_some());
}

#[test]
fn demand_beyond_the_lowest_share_still_raises_the_limit() {
    // The lowest of two levels may hold 40 % of the limit: less than half of it.
    let (limiter, clock) = limiter(2, 0.6);
    for _ in 0..4 {
        let permit = limiter.admit(1).expect("a place during the probe");
        permit.answered(Duration::from_millis(20));
    }
    // (The first window's one request in flight is half the limit of 2: it rises anyway.)
    window(&limiter, &clock, limiter.limit(), 20);
    let before = limiter.limit();
    assert_eq!(
        limiter.threshold(before, 0),
        1,
        "less than half of {before}"
    );
    for _ in 0..3 {
        window(&limiter, &clock, limiter.limit(), 20);
    }
    assert!(
        limiter.limit() > before,
        "requests were shed: the demand was there"
    );
}

#[test]
fn an_exempt_request_counts_in_flight_and_is_never_shed() {
    let (limiter, _) = limiter(1, 0.0);
    let exempt: Vec<Permit> = (0..5).map(|_| limiter.enter()).collect();
    assert_eq!(limiter.in_flight.load(Ordering::Acquire), 5);
    drop(exempt);
    assert_eq!(limiter.in_flight.load(Ordering::Acquire), 0);
}

#[test]
fn a_timeout_halves_the_limit_and_is_never_a_probe_sample() {
    let (limiter, clock) = risen(6);
    let high = limiter.limit();
    let stuck = limiter.admit(0).expect("a place");
    clock.advance_by(Duration::from_millis(150));
    stuck.timed_out();
    assert_eq!(
        limiter.limit(),
        (high / 2).max(2),
        "halved at the window's end"
    );
    clock.advance_by(Duration::from_secs(10));
    window(&limiter, &clock, 1, 20);
    assert_eq!(limiter.limit(), 2, "probing");
    for _ in 0..4 {
        limiter.admit(0).expect("a probe place").timed_out();
    }
    assert_eq!(
        limiter.limit(),
        2,
        "timeouts are not latencies: still probing"
    );
    assert_eq!(limiter.meters.baseline_seconds.get(), 0.02);
}

#[test]
fn its_stats_say_the_limit_the_probe_the_baseline_and_what_is_in_flight() {
    let (limiter, _clock) = limiter(1, 0.0);
    let probing = limiter.stats();
    assert_eq!(
        (probing.limit, probing.probing, probing.baseline),
        (2, true, None),
        "pinned to the minimum until a baseline is known"
    );
    assert_eq!((probing.min_limit, probing.max_limit), (2, 100));
    let (risen, _clock) = risen(3);
    let held = risen.admit(0).expect("a place");
    let stats = risen.stats();
    assert!(!stats.probing);
    assert_eq!(stats.baseline, Some(Duration::from_millis(20)));
    assert_eq!(stats.limit, risen.limit());
    assert!(stats.limit > 2, "raised while latency holds: {stats:?}");
    assert_eq!(stats.in_flight, 1);
    drop(held);
    assert_eq!(risen.stats().in_flight, 0);
}
