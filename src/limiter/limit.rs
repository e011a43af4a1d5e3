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
            Cost::Header { name, max, default } => {
                let mut values = headers.get_all(name).iter();
                let Some(value) = values.next() else {
                    return Ok(*default);
                };
                if values.next().is_some() {
                    return Err(BadCost);
                }
                std::str::from_utf8(value.as_bytes())
                    .ok()
                    .and_then(|text| text.trim().parse::<u64>().ok())
                    .filter(|cost| (1..=*max).contains(cost))
                    .ok_or(BadCost)
            }
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
}
