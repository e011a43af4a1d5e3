//! Compiled routes and limits told back in the words of the configuration: what the explain
//! endpoint, `sluice explain` and the dashboard show of a route's match and of each limit's
//! algorithm and parameters. Never a secret: keys are shown as stored (digests), never their
//! secret.

use serde_json::{json, Value};

use crate::limiter::algorithm::Period;
use crate::limiter::{Algorithm, Cost, Limit, Scope};
use crate::route::keys::LimitKey;
use crate::route::table::{HostMatch, PathMatch, RouteMatch};

/// What a route matches, as one line: `host *.example.com, path prefix /api, methods GET`.
pub fn route_match(matcher: &RouteMatch) -> String {
    let host = match &matcher.host {
        None => "any host".to_string(),
        Some(HostMatch::Exact(host)) => format!("host {host}"),
        Some(HostMatch::Suffix(suffix)) => format!("host *{suffix}"),
    };
    let path = match &matcher.path {
        PathMatch::Exact(path) => format!("path {path}"),
        PathMatch::Prefix(prefix) => format!("path prefix {prefix}"),
    };
    let methods = match &matcher.methods {
        None => "any method".to_string(),
        Some(methods) => {
            let names: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
            format!("methods {}", names.join(","))
        }
    };
    format!("{host}, {path}, {methods}")
}

/// One limit as configured: its name, algorithm and parameters, cost, key parts and the
/// flags that change how it applies.
pub fn limit(limit: &Limit, key: &LimitKey) -> Value {
    let cost = match limit.cost {
        Cost::Fixed(units) => json!(units),
        Cost::Requested { max, default } => {
            json!({ "from_request": { "max": max, "default": default } })
        }
    };
    let parts: Vec<String> = key.parts().iter().map(ToString::to_string).collect();
    json!({
        "name": &*limit.name,
        "algorithm": limit.algorithm.script_name(),
        "parameters": parameters(&limit.algorithm),
        "quota": limit.advertised.map(|(quota, _)| quota),
        "window_seconds": limit.advertised.map(|(_, window)| window),
        "per": limit.advertised.map(|(_, window)| per(&limit.algorithm, window)),
        "cost": cost,
        "key": parts,
        "scope": match limit.scope { Scope::Shared => "shared", Scope::Local => "local" },
        "common": key.common(),
        "mode": match limit.leased { Some(_) => "leased", None => "exact" },
        "shadow": limit.shadow,
        "hidden": limit.hidden,
        "priced_by_response": limit.priced_by_response.is_some(),
    })
}

/// What a limit's quota is counted per, in words: a calendar period with its zone (`month in
/// Europe/Paris`), an aligned period (`2592000 s aligned to the epoch`), or the window
/// `RateLimit-Policy` states (`3600 s`). `window_seconds` is that window for every limit (a
/// month counts as 30 days there): this says what it stands for.
fn per(algorithm: &Algorithm, window_seconds: u64) -> String {
    match algorithm {
        Algorithm::Calendar {
            period: Period::Calendar(periods),
            ..
        } => periods.describe(),
        Algorithm::Calendar {
            period: Period::Aligned { length_us },
            ..
        } => format!("{} s aligned to the epoch", length_us / 1_000_000),
        _ => format!("{window_seconds} s"),
    }
}

/// An algorithm's parameters, in milliseconds and units.
fn parameters(algorithm: &Algorithm) -> Value {
    let ms = |us: u64| match us % 1000 {
        0 => json!(us / 1000),
        _ => json!(us as f64 / 1000.0),
    };
    match *algorithm {
        Algorithm::Gcra {
            emission_us,
            tolerance_us,
            max_delay_us,
        } => json!({
            "emission_ms": ms(emission_us),
            "burst_window_ms": ms(tolerance_us),
            "capacity": algorithm.capacity(),
            "max_delay_ms": ms(max_delay_us),
        }),
        Algorithm::FixedWindow { limit, window_us }
        | Algorithm::SlidingWindow { limit, window_us }
        | Algorithm::SlidingLog { limit, window_us } => {
            json!({ "limit": limit, "window_ms": ms(window_us) })
        }
        Algorithm::Calendar { limit, period } => {
            let period = match period {
                Period::Aligned { length_us } => {
                    format!("{} s aligned to the epoch", length_us / 1_000_000)
                }
                Period::Calendar(periods) => periods.describe(),
            };
            json!({ "limit": limit, "period": period })
        }
        Algorithm::Concurrency { max, slot_ttl_us } => {
            json!({ "max": max, "slot_ttl_ms": ms(slot_ttl_us) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::{CalendarPeriods, CalendarUnit};

    #[test]
    fn a_quota_is_told_per_its_calendar_period_and_zone_or_its_window() {
        let paris = CalendarPeriods::of(CalendarUnit::Month, "Europe/Paris").expect("a zone");
        let monthly = Algorithm::Calendar {
            limit: 1000,
            period: Period::Calendar(paris),
        };
        assert_eq!(per(&monthly, 2_592_000), "month in Europe/Paris");
        let aligned = Algorithm::Calendar {
            limit: 1000,
            period: Period::Aligned {
                length_us: 2_592_000_000_000,
            },
        };
        assert_eq!(per(&aligned, 2_592_000), "2592000 s aligned to the epoch");
        let hourly = Algorithm::FixedWindow {
            limit: 3,
            window_us: 3_600_000_000,
        };
        assert_eq!(per(&hourly, 3600), "3600 s");
    }
}
