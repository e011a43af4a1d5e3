//! One compiled limit: its algorithm and parameters, what a request costs it, and how it is
//! enforced (exact, leased, or in shadow).

use std::sync::Arc;

use http::header::{HeaderMap, HeaderName};

use super::algorithm::Algorithm;
use super::rate::Rate;

/// Limits a route can have without its per-request vectors touching the heap.
pub const LIMITS_INLINE: usize = 4;

/// Units one request consumes from a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    /// Read from a request header: a whole number from 1 to `max`; `default` when absent.
    Header {
        name: HeaderName,
        max: u64,
        default: u64,
    },
}

/// A cost header the request sent is not a whole number within the limit's `cost_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadCost;

impl Cost {
    /// What this request costs. A cost header sent twice, or holding a list, is refused: it
    /// is never charged at one of its values.
    pub fn of(&self, headers: &HeaderMap) -> Result<u64, BadCost> {
        match self {
            Cost::Fixed(cost) => Ok(*cost),
            Cost::Header { name, max, default } => match whole_number(headers, name) {
                None => Ok(*default),
                Some(cost) => cost.filter(|cost| (1..=*max).contains(cost)).ok_or(BadCost),
            },
        }
    }
}

/// The whole number a header (or trailer) holds: `None` when absent; `Some(None)` when it is
/// sent twice, holds a list, or is not one whole number — never one of its values.
fn whole_number(headers: &HeaderMap, name: &HeaderName) -> Option<Option<u64>> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return Some(None);
    }
    Some(
        std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok()),
    )
}

/// A limit priced by the response (`cost_from_response`): the request reserves its
/// estimate (the limit's [`Cost`]) at admission, and the cost the upstream reports in a
/// response header or trailer settles it when the response ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponsePrice {
    pub header: HeaderName,
    /// The most one response is charged; a larger report is charged this.
    pub max: u64,
}

/// What a response said it cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostReport {
    /// No such header or trailer: the estimate stands.
    Missing,
    /// Not one whole number (or sent twice): the estimate stands.
    Invalid,
    /// A whole number within `max`.
    Reported(u64),
    /// Above `max`: charged `max`.
    Capped(u64),
}

impl CostReport {
    pub const LABELS: [&'static str; 4] = ["missing", "invalid", "reported", "capped"];

    /// The units to charge, when the report says.
    pub fn units(self) -> Option<u64> {
        match self {
            CostReport::Reported(units) | CostReport::Capped(units) => Some(units),
            CostReport::Missing | CostReport::Invalid => None,
        }
    }

    /// Its index in [`CostReport::LABELS`].
    pub fn index(self) -> usize {
        match self {
            CostReport::Missing => 0,
            CostReport::Invalid => 1,
            CostReport::Reported(_) => 2,
            CostReport::Capped(_) => 3,
        }
    }
}

impl ResponsePrice {
    /// What `headers` (a response head or its trailers) say the response cost.
    pub fn read(&self, headers: &HeaderMap) -> CostReport {
        match whole_number(headers, &self.header) {
            None => CostReport::Missing,
            Some(None) => CostReport::Invalid,
            Some(Some(units)) if units > self.max => CostReport::Capped(self.max),
            Some(Some(units)) => CostReport::Reported(units),
        }
    }
}

/// One compiled limit of a route: algorithm and parameters, fixed at config load.
#[derive(Debug, Clone)]
pub struct Limit {
    pub name: Arc<str>,
    pub algorithm: Algorithm,
    pub cost: Cost,
    /// What the `RateLimit-Policy` header advertises: quota `q` per `w` seconds; `None` for
    /// limits that are not rates (concurrency).
    pub policy: Option<(u64, u64)>,
    /// Decided and counted, never enforced: a denial lets the request through (and consumes
    /// nothing from this limit), for rolling out new limits safely.
    pub shadow: bool,
    /// `mode: leased`: taken from Redis in leases and spent locally (`leased.rs`); `None`:
    /// exact, one decision in Redis per request.
    pub leased: Option<Leasing>,
    /// `cost_from_response`: the cost is the estimate at admission, settled by the response.
    pub priced_by_response: Option<Box<ResponsePrice>>,
}

/// How a leased limit is leased: at most `max_units` (L) held unspent per gateway and key, so
/// `instances × L` bounds what leasing can admit beyond the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leasing {
    pub max_units: u64,
}

impl Limit {
    /// A limit with a fixed cost and the policy implied by `rate` (tests and tools).
    pub fn new(name: &str, algorithm: Algorithm, cost: u64, rate: Rate) -> Limit {
        Limit {
            name: name.into(),
            algorithm,
            cost: Cost::Fixed(cost),
            policy: Some(rate.policy()),
            shadow: false,
            leased: None,
            priced_by_response: None,
        }
    }

    /// This limit as one of `instances` gateways' equal share, for enforcing in-process while
    /// Redis is away (see [`Algorithm::share`]).
    pub fn share(&self, instances: u64) -> Limit {
        Limit {
            algorithm: self.algorithm.share(instances),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_share_divides_rates_and_counts_but_keeps_at_least_one_unit() {
        let rate = Rate::new(10, Duration::from_secs(1)).unwrap();
        let gcra = Limit::new(
            "g",
            Algorithm::Gcra {
                emission_us: 100_000,
                tolerance_us: 1_000_000,
                max_delay_us: 0,
            },
            1,
            rate,
        );
        assert_eq!(
            gcra.share(2).algorithm,
            Algorithm::Gcra {
                emission_us: 200_000,
                tolerance_us: 1_000_000,
                max_delay_us: 0
            },
            "half the rate, half the burst (the tolerance in time stays)"
        );
        let window = Limit::new(
            "w",
            Algorithm::FixedWindow {
                limit: 3,
                window_us: 1,
            },
            1,
            rate,
        );
        assert_eq!(
            window.share(2).algorithm,
            Algorithm::FixedWindow {
                limit: 1,
                window_us: 1
            }
        );
        assert_eq!(
            window.share(10).algorithm,
            Algorithm::FixedWindow {
                limit: 1,
                window_us: 1
            }
        );
    }

    #[test]
    fn header_costs_are_whole_numbers_within_the_cap() {
        let cost = Cost::Header {
            name: HeaderName::from_static("x-cost"),
            max: 5,
            default: 2,
        };
        let mut headers = HeaderMap::new();
        assert_eq!(cost.of(&headers), Ok(2));
        for (value, expected) in [
            ("3", Ok(3)),
            (" 5 ", Ok(5)),
            ("6", Err(BadCost)),
            ("0", Err(BadCost)),
            ("x", Err(BadCost)),
            ("1, 5", Err(BadCost)),
        ] {
            headers.insert("x-cost", value.parse().unwrap());
            assert_eq!(cost.of(&headers), expected, "{value:?}");
        }
        headers.insert("x-cost", "5".parse().unwrap());
        headers.append("x-cost", "1".parse().unwrap());
        assert_eq!(
            cost.of(&headers),
            Err(BadCost),
            "twice is never the smaller"
        );
    }

    #[test]
    fn a_response_reports_one_whole_number_and_is_capped_at_max() {
        let price = ResponsePrice {
            header: HeaderName::from_static("x-usage-tokens"),
            max: 100,
        };
        let mut headers = HeaderMap::new();
        assert_eq!(price.read(&headers), CostReport::Missing);
        for (value, expected) in [
            ("0", CostReport::Reported(0)),
            (" 42 ", CostReport::Reported(42)),
            ("100", CostReport::Reported(100)),
            ("101", CostReport::Capped(100)),
            ("99999999999999999999999", CostReport::Invalid),
            ("-1", CostReport::Invalid),
            ("1.5", CostReport::Invalid),
            ("1, 2", CostReport::Invalid),
        ] {
            headers.insert("x-usage-tokens", value.parse().unwrap());
            assert_eq!(price.read(&headers), expected, "{value:?}");
        }
        headers.append("x-usage-tokens", "1".parse().unwrap());
        assert_eq!(price.read(&headers), CostReport::Invalid, "sent twice");
        assert_eq!(CostReport::Capped(100).units(), Some(100));
        assert_eq!(CostReport::Invalid.units(), None);
    }
}
