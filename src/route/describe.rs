//! Compiled routes and limits told back in the words of the configuration: what the explain
//! endpoint, `sluice explain` and the dashboard show of a route's match and of each limit's
//! algorithm and parameters. Never a secret: keys are shown as stored (digests), never their
//! secret.

use serde::{Serialize, Serializer};

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

/// One limit as shown: as configured (its name, algorithm and parameters, cost, key parts and
/// the flags that change how it applies), and what a request's record of it says (`None`, shown
/// as `null`, where no request was asked: the routes page, a request refused before its
/// limits). Its fields are in alphabetical order, the order its JSON has always had.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitShown {
    pub algorithm: &'static str,
    pub common: bool,
    pub cost: CostShown,
    /// `scope: global`: how it holds across regions (absent for any other limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global: Option<GlobalShown>,
    pub hidden: bool,
    /// The key's parts as configured (`consumer`, `header:x-tenant`).
    pub key: Vec<String>,
    pub mode: Mode,
    pub name: String,
    pub parameters: Parameters,
    /// What the quota is counted per, in words (see [`per`]).
    pub per: Option<String>,
    pub priced_by_response: bool,
    /// The quota `RateLimit-Policy` advertises.
    pub quota: Option<u64>,
    /// What the limit has left, when read (a peek).
    pub remaining: Option<u64>,
    /// What the request costs it.
    pub request_cost: Option<u64>,
    /// When it is full again, in whole seconds, when read.
    pub reset_seconds: Option<u64>,
    pub scope: ScopeShown,
    pub shadow: bool,
    /// The key the request is counted under, as stored (a digest, never the key secret).
    pub stored_key: Option<String>,
    pub window_seconds: Option<u64>,
}

/// A limit across regions, as this region decides it: `part` is what it counts against here
/// (strict: its part of `whole` before transfers; approx: the whole), `remaining` beside it is
/// this region's standing (transfers and, approx, the others' counts included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GlobalShown {
    pub consistency: &'static str,
    pub part: u64,
    /// Kept across regions by region sync; `false`: decided on this region's part alone.
    pub synced: bool,
    pub whole: u64,
}

/// What a request costs a limit, as configured: a fixed number of units, or what the request
/// says (`{"from_request": {"default": 1, "max": 10}}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum CostShown {
    Fixed(u64),
    FromRequest { from_request: Requested },
}

/// A cost the request says: `default` when it says nothing, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Requested {
    pub default: u64,
    pub max: u64,
}

/// How a limit is enforced: one decision in Redis per request, or in leases spent locally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Exact,
    Leased,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Leased => "leased",
        }
    }
}

/// Where a limit is counted: on every gateway at once, or by each at its share (the
/// limit's `scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScopeShown {
    Shared,
    Local,
    Global,
}

impl ScopeShown {
    pub fn label(self) -> &'static str {
        match self {
            ScopeShown::Shared => "shared",
            ScopeShown::Local => "local",
            ScopeShown::Global => "global",
        }
    }
}

/// An algorithm's parameters, in milliseconds and units; each variant's fields in
/// alphabetical order, as its JSON has always had them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Parameters {
    Gcra {
        burst_window_ms: Millis,
        capacity: u64,
        emission_ms: Millis,
        max_delay_ms: Millis,
    },
    /// A fixed window, a sliding window or a sliding log.
    Window {
        limit: u64,
        window_ms: Millis,
    },
    Calendar {
        limit: u64,
        /// The period in words (see [`per`]).
        period: String,
    },
    Concurrency {
        max: u64,
        slot_ttl_ms: Millis,
    },
}

/// A duration in milliseconds, kept in microseconds: a whole number of milliseconds is
/// shown as an integer (`100`), a part of one as a float (`0.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Millis {
    pub us: u64,
}

impl Millis {
    /// Whole milliseconds, or `None` for a part of one.
    fn whole(self) -> Option<u64> {
        (self.us % 1000 == 0).then_some(self.us / 1000)
    }

    /// As a number of milliseconds.
    pub fn ms(self) -> f64 {
        self.us as f64 / 1000.0
    }
}

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.whole() {
            Some(ms) => write!(f, "{ms}"),
            None => write!(f, "{}", self.ms()),
        }
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.whole() {
            Some(ms) => serializer.serialize_u64(ms),
            None => serializer.serialize_f64(self.ms()),
        }
    }
}

/// One limit as configured, with no request's record of it.
pub fn limit(limit: &Limit, key: &LimitKey) -> LimitShown {
    let cost = match limit.cost {
        Cost::Fixed(units) => CostShown::Fixed(units),
        Cost::Requested { max, default } => CostShown::FromRequest {
            from_request: Requested { default, max },
        },
    };
    LimitShown {
        algorithm: limit.algorithm.script_name(),
        common: key.common(),
        cost,
        global: global(limit),
        hidden: limit.hidden,
        key: key.parts().iter().map(ToString::to_string).collect(),
        mode: match limit.leased {
            Some(_) => Mode::Leased,
            None => Mode::Exact,
        },
        name: limit.name.to_string(),
        parameters: parameters(&limit.algorithm),
        per: limit
            .advertised
            .map(|(_, window)| per(&limit.algorithm, window)),
        priced_by_response: limit.priced_by_response.is_some(),
        quota: limit.advertised.map(|(quota, _)| quota),
        remaining: None,
        request_cost: None,
        reset_seconds: None,
        scope: match (limit.scope, limit.global) {
            (Scope::Local, _) => ScopeShown::Local,
            (Scope::Shared, Some(_)) => ScopeShown::Global,
            (Scope::Shared, None) => ScopeShown::Shared,
        },
        shadow: limit.shadow,
        stored_key: None,
        window_seconds: limit.advertised.map(|(_, window)| window),
    }
}

/// A limit across regions as this region decides it (`None`: any other limit).
pub fn global(limit: &Limit) -> Option<GlobalShown> {
    limit.global.map(|global| GlobalShown {
        consistency: global.consistency.name(),
        part: limit.algorithm.capacity(),
        synced: global.synced,
        whole: global.whole,
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
fn parameters(algorithm: &Algorithm) -> Parameters {
    let ms = |us: u64| Millis { us };
    match *algorithm {
        Algorithm::Gcra {
            emission_us,
            tolerance_us,
            max_delay_us,
        } => Parameters::Gcra {
            burst_window_ms: ms(tolerance_us),
            capacity: algorithm.capacity(),
            emission_ms: ms(emission_us),
            max_delay_ms: ms(max_delay_us),
        },
        Algorithm::FixedWindow { limit, window_us }
        | Algorithm::SlidingWindow { limit, window_us }
        | Algorithm::SlidingLog { limit, window_us } => Parameters::Window {
            limit,
            window_ms: ms(window_us),
        },
        Algorithm::Calendar { limit, period } => {
            let period = match period {
                Period::Aligned { length_us } => {
                    format!("{} s aligned to the epoch", length_us / 1_000_000)
                }
                Period::Calendar(periods) => periods.describe(),
            };
            Parameters::Calendar { limit, period }
        }
        Algorithm::Concurrency { max, slot_ttl_us } => Parameters::Concurrency {
            max,
            slot_ttl_ms: ms(slot_ttl_us),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithm::{CalendarPeriods, CalendarUnit};

    #[test]
    fn milliseconds_are_whole_numbers_where_whole_and_floats_where_not() {
        let whole = serde_json::to_string(&Millis { us: 3_600_000_000 }).expect("JSON");
        assert_eq!(whole, "3600000");
        let part = serde_json::to_string(&Millis { us: 500 }).expect("JSON");
        assert_eq!(part, "0.5");
        assert_eq!(Millis { us: 100_500 }.to_string(), "100.5");
    }

    #[test]
    fn parameters_are_written_as_the_algorithm_has_them() {
        let gcra = Algorithm::Gcra {
            emission_us: 100_000,
            tolerance_us: 1_500,
            max_delay_us: 0,
        };
        let written = serde_json::to_string(&parameters(&gcra)).expect("JSON");
        let capacity = gcra.capacity();
        assert_eq!(
            written,
            format!(
                "{{\"burst_window_ms\":1.5,\"capacity\":{capacity},\"emission_ms\":100,\"max_delay_ms\":0}}"
            )
        );
        let log = Algorithm::SlidingLog {
            limit: 3,
            window_us: 60_000_000,
        };
        let written = serde_json::to_string(&parameters(&log)).expect("JSON");
        assert_eq!(written, "{\"limit\":3,\"window_ms\":60000}");
        let fixed = CostShown::Fixed(2);
        assert_eq!(serde_json::to_string(&fixed).expect("JSON"), "2");
        let requested = CostShown::FromRequest {
            from_request: Requested {
                default: 1,
                max: 10,
            },
        };
        let written = serde_json::to_string(&requested).expect("JSON");
        assert_eq!(written, "{\"from_request\":{\"default\":1,\"max\":10}}");
    }

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
