//! Leases never admit beyond a limit's allowance, whatever the traffic: every leasing algorithm
//! across 2 and 4 gateways under floods, trickles and silences, every interval of every run
//! checked; and leased gateways admit nearly what exact decisions would.

use std::sync::Arc;

use super::{call, leased_at_least};
use crate::limiter::algorithm::Algorithm;
use crate::limiter::backend::Limiter;
use crate::limiter::clock::{Clock, ManualClock};
use crate::limiter::decision::Decision;
use crate::limiter::error::LimiterError;
use crate::limiter::leased::simulation::{gcra_excess, Dice};
use crate::limiter::leased::{LeaseMeters, Leased};
use crate::limiter::limit::{Limit, AUTO_MIN_UNITS};
use crate::limiter::local::LocalLimiter;
use crate::limiter::request::LimitRequest;

/// The backend, remembering when each check reached it.
struct Recording {
    backend: Arc<LocalLimiter>,
    clock: Arc<ManualClock>,
    checks: std::sync::Mutex<Vec<i64>>,
}

impl Limiter for Recording {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        self.checks
            .lock()
            .expect("not poisoned")
            .push(self.clock.now_us());
        self.backend.check(request).await
    }
}

/// What a run of traffic did: when each request was admitted (us), when each backend
/// check was made, and the lease meters.
struct Run {
    admitted: Vec<i64>,
    checks: Vec<i64>,
    requests: usize,
    meters: LeaseMeters,
}

/// Sends `seconds` of traffic through `gateways` gateways leasing `limits` from one
/// backend, all on one clock: phases alternate between flooding the key (four times `rate`
/// requests per second), a trickle, silence (idle keys give their units back) and steady
/// traffic, each request at a random gateway, cost 1 (sometimes 2).
/// Idle units are swept every 100 ms, as the sweeper does.
async fn run(limits: &[Limit], rate: u64, gateways: usize, seconds: u64, seed: u64) -> Run {
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));
    let backend = Arc::new(Recording {
        backend: Arc::new(LocalLimiter::new(clock.clone(), 1000)),
        clock: clock.clone(),
        checks: std::sync::Mutex::new(Vec::new()),
    });
    let meters = LeaseMeters::unregistered();
    let fleet: Vec<_> = (0..gateways)
        .map(|_| {
            Leased::new(
                backend.clone(),
                backend.backend.clone(),
                clock.clone(),
                meters.clone(),
            )
            .swept_by_hand()
        })
        .collect();
    let mut dice = Dice(seed);
    let (start, end) = (clock.now_us(), clock.now_us() + seconds as i64 * 1_000_000);
    let mut next_sweep = start + 100_000;
    let (mut admitted, mut requests) = (Vec::new(), 0);
    // (length, requests per second): a flood, a trickle, silence, then steady traffic.
    let phases = [
        (250_000, rate * 4),
        (250_000, rate / 3),
        (500_000, 0),
        (250_000, rate * 3 / 2),
    ];
    let cycle: i64 = phases.iter().map(|&(length, _)| length).sum();
    while clock.now_us() < end {
        let mut into = (clock.now_us() - start) % cycle;
        let (mut length, mut per_second) = phases[0];
        for &(phase_length, phase_rate) in &phases {
            (length, per_second) = (phase_length, phase_rate);
            if into < phase_length {
                break;
            }
            into -= phase_length;
        }
        match 2_000_000_u64.checked_div(per_second) {
            // Gaps spread evenly between 0 and twice the mean.
            Some(twice_the_mean) => clock.advance(dice.below(twice_the_mean) as i64 + 1),
            None => clock.advance(length - into),
        }
        while clock.now_us() >= next_sweep {
            for gateway in &fleet {
                gateway.return_idle_units(clock.instant()).await;
            }
            next_sweep += 100_000;
        }
        if per_second == 0 || clock.now_us() >= end {
            continue;
        }
        let gateway = &fleet[dice.below(gateways as u64) as usize];
        let cost = if dice.below(8) == 0 { 2 } else { 1 };
        requests += 1;
        if call(gateway, limits, cost).await.allowed() {
            admitted.extend([clock.now_us()].repeat(cost as usize));
        }
    }
    let checks = backend.checks.lock().expect("not poisoned").clone();
    Run {
        admitted,
        checks,
        requests,
        meters,
    }
}

/// A counter's allowance: at most `limit` units in each of its windows, and none outside
/// one. `windows` are their `[start, start + len)`.
fn window_excess(admitted: &[i64], windows: &[i64], len: i64, limit: usize) -> Option<i64> {
    for &at in admitted {
        if !windows.iter().any(|&w| (w..w + len).contains(&at)) {
            return Some(at);
        }
    }
    windows
        .iter()
        .find(|&&w| {
            admitted
                .iter()
                .filter(|&&at| (w..w + len).contains(&at))
                .count()
                > limit
        })
        .copied()
}

/// A fixed window opens at the first check at or after the previous one's end.
fn fixed_windows(checks: &[i64], len: i64) -> Vec<i64> {
    let mut windows: Vec<i64> = Vec::new();
    for &at in checks {
        if windows.last().is_none_or(|&w| at >= w + len) {
            windows.push(at);
        }
    }
    windows
}

/// The algorithms leases apply to, named as a configuration would, with a traffic rate
/// around their own: GCRA and the token and leaky buckets (GCRA with tolerance = emission ×
/// capacity), a fixed window, an epoch-aligned calendar period.
fn leasing_algorithms() -> Vec<(&'static str, Algorithm, u64)> {
    let second = 1_000_000;
    let gcra = |emission_us, tolerance_us| Algorithm::Gcra {
        emission_us,
        tolerance_us,
        max_delay_us: 0,
    };
    let period = crate::limiter::algorithm::Period::Aligned {
        length_us: second / 2,
    };
    vec![
        ("gcra 1000/s burst 99", gcra(1_000, 100_000), 1_000),
        (
            "token_bucket 1000/s capacity 50",
            gcra(1_000, 50_000),
            1_000,
        ),
        ("leaky_bucket 500/s capacity 20", gcra(2_000, 40_000), 500),
        (
            "fixed_window 400/s",
            Algorithm::FixedWindow {
                limit: 400,
                window_us: second,
            },
            600,
        ),
        (
            "calendar 300 per aligned 500 ms",
            Algorithm::Calendar { limit: 300, period },
            600,
        ),
    ]
}

/// Where a run admitted more than `algorithm`'s allowance, if anywhere.
fn beyond_allowance(algorithm: Algorithm, run: &Run) -> Option<String> {
    match algorithm {
        Algorithm::Gcra {
            emission_us,
            tolerance_us,
            ..
        } => gcra_excess(&run.admitted, emission_us, tolerance_us, 0)
            .map(|(from, to)| format!("{from}..={to}")),
        Algorithm::FixedWindow { limit, window_us } => {
            let len = window_us as i64;
            let windows = fixed_windows(&run.checks, len);
            window_excess(&run.admitted, &windows, len, limit as usize).map(|at| format!("at {at}"))
        }
        Algorithm::Calendar { limit, period } => {
            let (first, step) = period.bounds(run.checks[0]);
            let step = step - first;
            let last = period.bounds(*run.checks.last()?).1;
            let windows: Vec<i64> = (first..last).step_by(step as usize).collect();
            window_excess(&run.admitted, &windows, step, limit as usize)
                .map(|at| format!("at {at}"))
        }
        _ => Some("not a leasing algorithm".into()),
    }
}

/// Every leasing algorithm, with leases (`mode: leased`, and `auto`), across 2 and 4
/// gateways under floods, lulls and silences: no interval admits more than the limit's
/// allowance (the leases are exact), leases were taken and spent (the test exercises
/// them), and the gateways admit nearly what exact decisions would have.
#[tokio::test]
async fn leases_never_admit_more_than_the_allowance_across_gateways() {
    for (name, algorithm, rate) in leasing_algorithms() {
        // Traffic around the limit's rate (floods deny), and a quarter of it (units are
        // still held when the silence comes, and go back).
        for (load, gateways, min_units) in [rate, rate / 4]
            .into_iter()
            .flat_map(|load| [(load, 2), (load, 4)])
            .flat_map(|(load, gateways)| [(load, gateways, 1), (load, gateways, AUTO_MIN_UNITS)])
        {
            {
                let seed = 0x5eed + gateways as u64 * 7 + min_units + load;
                let max_units = (algorithm.capacity() / 10).max(min_units);
                let limits = leased_at_least(algorithm, max_units, min_units);
                let leased = run(&limits, load, gateways, 3, seed).await;
                let case =
                    format!("{name}, load {load}/s, {gateways} gateways, min_units {min_units}");
                let excess = beyond_allowance(algorithm, &leased);
                assert_eq!(excess, None, "{case}: more than the allowance");
                let (top_ups, held) = (
                    leased.meters.top_ups.get(),
                    leased.meters.held_decisions.get(),
                );
                assert!(
                    top_ups > 0 && held > 0,
                    "{case}: {top_ups} top-ups, {held} held"
                );
                let mut exact_limits = limits.clone();
                exact_limits[0].leased = None;
                let exact = run(&exact_limits, load, gateways, 3, seed).await;
                eprintln!(
                    "{case}: {} requests, leased admitted {} in {} checks, exact {} in {}; {} units lapsed, {} returned",
                    leased.requests,
                    leased.admitted.len(),
                    leased.checks.len(),
                    exact.admitted.len(),
                    exact.checks.len(),
                    leased.meters.units_lapsed.get(),
                    leased.meters.units_returned.get(),
                );
                assert!(
                    leased.admitted.len() * 10 >= exact.admitted.len() * 9,
                    "{case}: leases admitted {} where exact decisions admitted {}",
                    leased.admitted.len(),
                    exact.admitted.len()
                );
            }
        }
    }
}
