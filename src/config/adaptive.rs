//! `routes[].adaptive_concurrency` → [`AdaptiveRoute`]: the gradient limiter's bounds, windows
//! and tolerance, and the priority of each plan (lowest first) with the share of the limit kept
//! for the highest.

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;

use super::problem::Problems;
use super::rate::parse_duration;
use crate::caller::consumers::Plans;
use crate::limiter::adaptive::AdaptiveSettings;
use crate::route::table::AdaptiveRoute;

/// The largest limit one gateway may give one route's upstream.
const MAX_LIMIT: u32 = 100_000;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdaptive {
    pub min_limit: Option<u32>,
    pub max_limit: Option<u32>,
    pub sample_window: Option<String>,
    pub probe_interval: Option<String>,
    pub probe_requests: Option<u32>,
    pub tolerance: Option<f64>,
    pub reserve: Option<f64>,
    /// Plans from the lowest priority to the highest.
    pub priorities: Option<Vec<String>>,
}

/// The route at `at`'s `adaptive_concurrency`, whose callers may be on `plans`: `Some(None)`
/// when it has none, `None` when it is wrong (each problem reported).
pub fn compile(
    at: &str,
    raw: Option<RawAdaptive>,
    plans: &Plans,
    p: &mut Problems,
) -> Option<Option<AdaptiveRoute>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let at = format!("{at}.adaptive_concurrency");
    let before = p.0.len();
    let settings = settings(&at, &raw, p);
    let levels_by_plan = priorities(raw.priorities, plans, &format!("{at}.priorities"), p);
    if p.0.len() > before {
        return None;
    }
    let levels = levels_by_plan.iter().copied().max().unwrap_or(0) + 1;
    // Every plan listed is a level of its own, the lowest shared with callers not listed.
    Some(Some(AdaptiveRoute {
        settings: AdaptiveSettings { levels, ..settings },
        levels_by_plan,
    }))
}

/// The limiter's settings written at `at` (one priority level: the caller's adds the rest).
fn settings(at: &str, raw: &RawAdaptive, p: &mut Problems) -> AdaptiveSettings {
    let path = |field: &str| format!("{at}.{field}");
    let min_limit = within(raw.min_limit, 3, 1..=MAX_LIMIT, &path("min_limit"), p);
    let max_limit = within(raw.max_limit, 1000, 1..=MAX_LIMIT, &path("max_limit"), p);
    if max_limit < min_limit {
        p.add(path("max_limit"), "must be at least min_limit");
    }
    let (sample_window, probe_interval) = windows(at, raw, p);
    AdaptiveSettings {
        min_limit,
        max_limit,
        sample_window,
        probe_interval,
        probe_requests: within(raw.probe_requests, 25, 1..=1000, &path("probe_requests"), p),
        tolerance: within(raw.tolerance, 0.25, 0.0..=10.0, &path("tolerance"), p),
        reserve: within(raw.reserve, 0.2, 0.0..=0.95, &path("reserve"), p),
        levels: 1,
    }
}

/// `sample_window` (10 ms to 60 s) and `probe_interval` (1 s to a day, longer than the
/// window) written at `at`.
fn windows(at: &str, raw: &RawAdaptive, p: &mut Problems) -> (Duration, Duration) {
    let path = |field: &str| format!("{at}.{field}");
    let samples = Duration::from_millis(10)..=Duration::from_secs(60);
    let sample_window = duration(
        &raw.sample_window,
        "100ms",
        samples,
        &path("sample_window"),
        p,
    );
    let probes = Duration::from_secs(1)..=Duration::from_secs(86_400);
    let probe_interval = duration(
        &raw.probe_interval,
        "60s",
        probes,
        &path("probe_interval"),
        p,
    );
    if probe_interval <= sample_window {
        p.add(path("probe_interval"), "must be longer than sample_window");
    }
    (sample_window, probe_interval)
}

/// A number within `range` (`default` when absent).
fn within<T: PartialOrd + Copy + std::fmt::Display>(
    value: Option<T>,
    default: T,
    range: std::ops::RangeInclusive<T>,
    at: &str,
    p: &mut Problems,
) -> T {
    let value = value.unwrap_or(default);
    if !range.contains(&value) {
        p.add(
            at,
            format!("must be from {} to {}", range.start(), range.end()),
        );
    }
    value
}

/// A duration within `range` (`default` when absent).
fn duration(
    text: &Option<String>,
    default: &str,
    range: std::ops::RangeInclusive<Duration>,
    at: &str,
    p: &mut Problems,
) -> Duration {
    let text = text.as_deref().unwrap_or(default);
    match parse_duration(text) {
        Ok(value) if range.contains(&value) => value,
        Ok(_) => {
            let (low, high) = (range.start(), range.end());
            p.add(at, format!("must be from {low:?} to {high:?}"));
            *low
        }
        Err(error) => {
            p.add(at, error);
            *range.start()
        }
    }
}

/// The level of each plan: its place in `priorities` (lowest first, from 0), 0 for a plan not
/// listed (it ranks with the lowest); every plan in declared order when `priorities` is absent.
fn priorities(listed: Option<Vec<String>>, plans: &Plans, at: &str, p: &mut Problems) -> Box<[u8]> {
    let names: Vec<String> = match listed {
        Some(listed) => listed,
        None => plans.names().iter().map(|name| name.to_string()).collect(),
    };
    let mut levels = vec![0u8; plans.names().len()];
    let mut seen = HashSet::new();
    for (i, name) in names.iter().enumerate() {
        let Some(plan) = plans.find(name) else {
            p.add(
                format!("{at}[{i}]"),
                format!("unknown plan {name:?}: declare it in identity.plans"),
            );
            continue;
        };
        if !seen.insert(plan) {
            p.add(
                format!("{at}[{i}]"),
                format!("plan {name:?} is listed twice"),
            );
            continue;
        }
        if let Some(level) = levels.get_mut(usize::from(plan.0)) {
            // At most 255 plans can be listed: more levels than that are one.
            *level = u8::try_from(i).unwrap_or(u8::MAX);
        }
    }
    levels.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::consumers::PlanId;
    use crate::config::problem::problems_of;

    fn plans() -> Plans {
        Plans::new(vec!["free".into(), "pro".into(), "business".into()], None)
    }

    fn compiled(yaml: &str) -> (Option<Option<AdaptiveRoute>>, Vec<String>) {
        problems_of(yaml, |raw: RawAdaptive, p: &mut Problems| {
            compile("routes[0]", Some(raw), &plans(), p)
        })
    }

    #[test]
    fn defaults_follow_envoys_and_plans_rank_in_declared_order() {
        let (route, problems) = compiled("{}");
        assert!(problems.is_empty(), "{problems:?}");
        let route = route.flatten().unwrap();
        assert_eq!(route.settings.min_limit, 3);
        assert_eq!(route.settings.max_limit, 1000);
        assert_eq!(route.settings.sample_window, Duration::from_millis(100));
        assert_eq!(route.settings.probe_interval, Duration::from_secs(60));
        assert_eq!(
            route.settings.levels, 3,
            "free (and no plan), pro, business"
        );
        assert_eq!(route.level(None), 0);
        assert_eq!(route.level(Some(PlanId(0))), 0);
        assert_eq!(route.level(Some(PlanId(2))), 2);
    }

    #[test]
    fn priorities_name_plans_lowest_first_and_unlisted_plans_rank_with_the_lowest() {
        let (route, problems) = compiled("{ priorities: [pro, business], reserve: 0.3 }");
        assert!(problems.is_empty(), "{problems:?}");
        let route = route.flatten().unwrap();
        assert_eq!(
            route.level(Some(PlanId(0))),
            0,
            "free is not listed: with the lowest"
        );
        assert_eq!(route.level(Some(PlanId(1))), 0);
        assert_eq!(route.level(Some(PlanId(2))), 1);
        assert_eq!(route.settings.levels, 2);
    }

    #[test]
    fn every_wrong_value_is_reported_at_its_path() {
        let (route, problems) = compiled(
            "{ min_limit: 0, max_limit: 200000, sample_window: 5ms, probe_interval: soon, probe_requests: 0, tolerance: -1, reserve: 1, priorities: [gold, pro, pro] }",
        );
        assert!(route.is_none());
        let at = "routes[0].adaptive_concurrency";
        assert_eq!(
            problems,
            [
                format!("{at}.min_limit: must be from 1 to 100000"),
                format!("{at}.max_limit: must be from 1 to 100000"),
                format!("{at}.sample_window: must be from 10ms to 60s"),
                format!("{at}.probe_interval: invalid duration \"soon\": unknown period unit \"soon\": use ms, s, m, h or d"),
                format!("{at}.probe_requests: must be from 1 to 1000"),
                format!("{at}.tolerance: must be from 0 to 10"),
                format!("{at}.reserve: must be from 0 to 0.95"),
                format!("{at}.priorities[0]: unknown plan \"gold\": declare it in identity.plans"),
                format!("{at}.priorities[2]: plan \"pro\" is listed twice"),
            ]
        );
        let (_, problems) = compiled("{ min_limit: 50, max_limit: 10 }");
        assert_eq!(
            problems,
            [format!("{at}.max_limit: must be at least min_limit")]
        );
    }
}
