//! One compiled limit: its algorithm and parameters, what a request costs it, and how it is
//! enforced (exact, leased, or in shadow).

use std::sync::Arc;

use super::algorithm::{Algorithm, Period, MAX_SLIDING_LOG_LIMIT};
use super::rate::Rate;
use super::regions::Global;

/// The decision script's name for a limit kept across regions (`lua/global.lua`).
pub const GLOBAL_SCRIPT: &str = "global";

/// Limits a route can have without its per-request vectors touching the heap.
pub const LIMITS_INLINE: usize = 4;

/// Units one request consumes from a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    /// Said by the request (`cost_header`; where it is read is the route's business): a whole
    /// number from 1 to `max`; `default` when the request says nothing.
    Requested {
        max: u64,
        default: u64,
    },
}

/// What a request (or a response) said of a cost, where it says one: nothing, something that
/// is not one whole number (sent twice, a list, not a number), or a whole number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Nothing,
    Malformed,
    Number(u64),
}

/// A cost the request sent is not a whole number within the limit's `cost_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadCost;

impl Cost {
    /// What this request costs, given what it `sent`. A malformed cost is refused: it is never
    /// charged at one of its values.
    pub fn of(&self, sent: Sent) -> Result<u64, BadCost> {
        match (self, sent) {
            (Cost::Fixed(cost), _) => Ok(*cost),
            (Cost::Requested { default, .. }, Sent::Nothing) => Ok(*default),
            (Cost::Requested { max, .. }, Sent::Number(cost)) if (1..=*max).contains(&cost) => {
                Ok(cost)
            }
            (Cost::Requested { .. }, _) => Err(BadCost),
        }
    }

    /// The request says its cost.
    pub fn is_requested(&self) -> bool {
        matches!(self, Cost::Requested { .. })
    }
}

/// A limit priced by the response (`cost_from_response`): the request reserves its
/// estimate (the limit's [`Cost`]) at admission, and the cost the upstream reports (where it
/// reports it is the route's business) settles it when the response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponsePrice {
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
    /// What the response cost, given what it `sent`.
    pub fn report(&self, sent: Sent) -> CostReport {
        match sent {
            Sent::Nothing => CostReport::Missing,
            Sent::Malformed => CostReport::Invalid,
            Sent::Number(units) if units > self.max => CostReport::Capped(self.max),
            Sent::Number(units) => CostReport::Reported(units),
        }
    }
}

/// Where a limit is counted: `shared` by every gateway (in the configured backend: Redis, or
/// in-process without it), or `local` to this gateway (always in-process, never in Redis: a
/// per-gateway ceiling beside shared quotas). Its snake_case name is what the configuration
/// says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::EnumString, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum Scope {
    #[default]
    Shared,
    Local,
}

/// One compiled limit of a route: algorithm and parameters, fixed at config load.
#[derive(Debug, Clone)]
pub struct Limit {
    pub name: Arc<str>,
    pub algorithm: Algorithm,
    pub cost: Cost,
    /// What the `RateLimit-Policy` header advertises: quota `q` per `w` seconds; `None` for
    /// limits that are not rates (concurrency).
    pub advertised: Option<(u64, u64)>,
    /// Decided and counted, never enforced: a denial lets the request through (and consumes
    /// nothing from this limit), for rolling out new limits safely.
    pub shadow: bool,
    /// `headers: hide`: enforced as any other, but left out of the `RateLimit` fields, a `429`'s
    /// body and the usage API (a guard whose numbers are not the client's business).
    pub hidden: bool,
    /// `mode: leased` or `auto` (the default where leases apply): taken from Redis in leases
    /// and spent locally (`leased/`); `None`: exact, one decision in Redis per request.
    pub leased: Option<Leasing>,
    /// `cost_from_response`: the cost is the estimate at admission, settled by the response.
    pub priced_by_response: Option<ResponsePrice>,
    /// `scope: local`: counted by this gateway alone, decided before the shared limits.
    pub scope: Scope,
    /// `scope: global`: one limit across regions; its `algorithm` is this region's part of it
    /// (`regions::Regions::compile`), shared by the region's gateways.
    pub global: Option<Global>,
}

/// How a leased limit is leased: at most `max_units` (L) held unspent per gateway and key, and
/// a top-up takes at least `min_units` beyond its request's cost or none (the request is then
/// decided exactly): 1 for `mode: leased`, [`AUTO_MIN_UNITS`] for `mode: auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leasing {
    pub max_units: u64,
    pub min_units: u64,
}

/// `mode: auto` leases a key only while a top-up would take at least this many units beyond
/// its request's cost (this gateway's traffic on the key over the lease horizon, what it can
/// spend before they lapse, within L and what the limit has left): each lease then saves at
/// least this many Redis calls. Below it, the key is decided exactly.
pub const AUTO_MIN_UNITS: u64 = 4;

/// How long a limit's state must be remembered for the limit to be a quota: an hour.
pub const QUOTA_MEMORY_US: u64 = 3_600_000_000;

impl Limit {
    /// Whether it is a quota: a calendar period, or state remembered an hour or more (a window
    /// of an hour or more; a GCRA whose burst spans an hour or more) — what a store that
    /// restarts empty would visibly give back, in full, to every caller.
    pub fn is_quota(&self) -> bool {
        match self.algorithm {
            Algorithm::Calendar {
                period: Period::Aligned { length_us },
                ..
            } => length_us >= QUOTA_MEMORY_US,
            Algorithm::Calendar { .. } => true,
            Algorithm::FixedWindow { window_us, .. }
            | Algorithm::SlidingWindow { window_us, .. }
            | Algorithm::SlidingLog { window_us, .. } => window_us >= QUOTA_MEMORY_US,
            Algorithm::Gcra { tolerance_us, .. } => tolerance_us >= QUOTA_MEMORY_US,
            Algorithm::Concurrency { .. } => false,
        }
    }

    /// A limit with a fixed cost and the policy implied by `rate` (tests and tools).
    pub fn new(name: &str, algorithm: Algorithm, cost: u64, rate: Rate) -> Limit {
        Limit {
            name: name.into(),
            algorithm,
            cost: Cost::Fixed(cost),
            advertised: Some(rate.advertised()),
            shadow: false,
            hidden: false,
            leased: None,
            priced_by_response: None,
            scope: Scope::Shared,
            global: None,
        }
    }

    /// Whether region sync keeps it across regions: decided by `lua/global.lua` on this
    /// region's part moved by the transfers beside its count.
    pub fn synced(&self) -> bool {
        self.global.is_some_and(|global| global.synced)
    }

    /// The function of the decision script that decides it (`Algorithm::script_name`, or
    /// `global` for a synced limit).
    pub fn script_name(&self) -> &'static str {
        if self.synced() {
            GLOBAL_SCRIPT
        } else {
            self.algorithm.script_name()
        }
    }

    /// Whether clients see this limit (the `RateLimit` fields, a `429`'s body, the usage API):
    /// enforced (not shadow) and not hidden (`headers: hide`).
    pub fn shown(&self) -> bool {
        !self.shadow && !self.hidden
    }

    /// The quota policy clients are told of (`RateLimit-Policy`, `RateLimit`,
    /// `violated-policies`): a shown limit's, if it is a rate (not concurrency).
    pub fn advertised_policy(&self) -> Option<(u64, u64)> {
        self.advertised.filter(|_| self.shown())
    }

    /// This limit at another quota (the quota admin API's overrides): `quota` units per the
    /// same window (`RateLimit-Policy`'s `q`), or at most `quota` in flight for concurrency.
    /// Rates and counts scale by `quota / q`, so a split limit's shards stay equal shares of
    /// it; a GCRA keeps its burst window in time (its burst in units follows the rate, as
    /// [`Limit::share`] does). Its state key is the same: what was used counts against the new
    /// quota. It is decided exactly, never from leases: units leased under the old quota go
    /// back with their own parameters.
    pub fn with_quota(&self, quota: u64) -> Result<Limit, String> {
        if quota == 0 {
            return Err("a quota is at least 1 (use off to lift the limit)".into());
        }
        let written = self
            .advertised
            .map_or(self.algorithm.capacity(), |(q, _)| q)
            .max(1);
        let algorithm = self.algorithm.scaled(quota, written);
        if let Algorithm::SlidingLog { limit, .. } = algorithm {
            if limit > MAX_SLIDING_LOG_LIMIT {
                return Err(format!(
                    "a sliding log keeps one entry per unit: at most {MAX_SLIDING_LOG_LIMIT}"
                ));
            }
        }
        Ok(Limit {
            algorithm,
            advertised: self.advertised.map(|(_, window)| (quota, window)),
            leased: None,
            ..self.clone()
        })
    }

    /// This limit as one of `instances` gateways' equal share, for enforcing in-process while
    /// Redis is away (see [`Algorithm::share`]). A limit local to each gateway is its own share.
    pub fn share(&self, instances: u64) -> Limit {
        if self.scope == Scope::Local {
            return self.clone();
        }
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
    fn a_quota_is_a_calendar_period_or_state_kept_an_hour_or_more() {
        let rate = Rate::new(10, Duration::from_secs(1)).unwrap();
        let of = |algorithm| Limit::new("q", algorithm, 1, rate).is_quota();
        let hour = QUOTA_MEMORY_US;
        assert!(of(Algorithm::FixedWindow {
            limit: 1,
            window_us: hour
        }));
        assert!(!of(Algorithm::SlidingWindow {
            limit: 1,
            window_us: hour - 1
        }));
        assert!(of(Algorithm::Gcra {
            emission_us: 86_400,
            tolerance_us: 86_400_000_000,
            max_delay_us: 0
        }));
        assert!(!of(Algorithm::Gcra {
            emission_us: 100_000,
            tolerance_us: 1_000_000,
            max_delay_us: 0
        }));
        assert!(of(Algorithm::Calendar {
            limit: 1,
            period: Period::Aligned { length_us: hour }
        }));
        assert!(!of(Algorithm::Calendar {
            limit: 1,
            period: Period::Aligned {
                length_us: 1_000_000
            }
        }));
        assert!(!of(Algorithm::Concurrency {
            max: 1,
            slot_ttl_us: hour * 2
        }));
    }

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

    fn algorithm_of_any_kind() -> Algorithm {
        Algorithm::Concurrency {
            max: 1,
            slot_ttl_us: 1,
        }
    }

    fn per_minute(count: u64) -> Rate {
        Rate::new(count, Duration::from_secs(60)).unwrap()
    }

    #[test]
    fn another_quota_keeps_a_split_limit_s_shards_equal_shares_and_decides_exactly() {
        let shard = Limit {
            algorithm: Algorithm::FixedWindow {
                limit: 25,
                window_us: 60_000_000,
            },
            leased: Some(Leasing {
                max_units: 5,
                min_units: 1,
            }),
            ..Limit::new("split", algorithm_of_any_kind(), 1, per_minute(100))
        };
        let quartered = shard.with_quota(400).expect("a quota");
        assert_eq!(
            quartered.algorithm,
            Algorithm::FixedWindow {
                limit: 100,
                window_us: 60_000_000
            },
            "one of 4 shards of 100/m at 400/m: a quarter of 400"
        );
        assert_eq!(quartered.leased, None, "decided exactly");
    }

    #[test]
    fn another_quota_scales_a_rate_and_sets_a_count() {
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
        let faster = gcra.with_quota(40).expect("a quota");
        assert_eq!(
            faster.algorithm,
            Algorithm::Gcra {
                emission_us: 25_000,
                tolerance_us: 1_000_000,
                max_delay_us: 0
            }
        );
        assert_eq!(faster.advertised, Some((40, 1)));
        let slower = gcra.with_quota(1).expect("a quota").algorithm;
        let Algorithm::Gcra {
            emission_us,
            tolerance_us,
            ..
        } = slower
        else {
            panic!("{slower:?}")
        };
        assert_eq!((emission_us, tolerance_us), (1_000_000, 1_000_000));
        let window = Limit::new(
            "w",
            Algorithm::FixedWindow {
                limit: 3,
                window_us: 60_000_000,
            },
            1,
            per_minute(3),
        );
        assert_eq!(
            window.with_quota(7).expect("a quota").algorithm,
            Algorithm::FixedWindow {
                limit: 7,
                window_us: 60_000_000
            }
        );
        assert!(window.with_quota(0).is_err());
        let log = Limit::new(
            "l",
            Algorithm::SlidingLog {
                limit: 3,
                window_us: 1,
            },
            1,
            per_minute(3),
        );
        assert!(log.with_quota(MAX_SLIDING_LOG_LIMIT + 1).is_err());
    }

    #[test]
    fn a_limit_local_to_each_gateway_is_its_own_share() {
        let rate = Rate::new(10, Duration::from_secs(1)).unwrap();
        let algorithm = Algorithm::FixedWindow {
            limit: 10,
            window_us: 1_000_000,
        };
        let local = Limit {
            scope: Scope::Local,
            ..Limit::new("ceiling", algorithm, 1, rate)
        };
        assert_eq!(local.share(4).algorithm, algorithm);
        assert_ne!(
            Limit::new("quota", algorithm, 1, rate).share(4).algorithm,
            algorithm
        );
    }

    #[test]
    fn a_requested_cost_is_a_whole_number_within_the_cap_and_a_report_is_capped() {
        let cost = Cost::Requested { max: 5, default: 2 };
        assert_eq!(cost.of(Sent::Nothing), Ok(2));
        assert_eq!(cost.of(Sent::Number(5)), Ok(5));
        for refused in [Sent::Number(6), Sent::Number(0), Sent::Malformed] {
            assert_eq!(cost.of(refused), Err(BadCost), "{refused:?}");
        }
        assert_eq!(
            Cost::Fixed(3).of(Sent::Malformed),
            Ok(3),
            "a fixed cost reads nothing"
        );
        let price = ResponsePrice { max: 100 };
        assert_eq!(price.report(Sent::Nothing), CostReport::Missing);
        assert_eq!(price.report(Sent::Malformed), CostReport::Invalid);
        assert_eq!(price.report(Sent::Number(100)), CostReport::Reported(100));
        assert_eq!(price.report(Sent::Number(101)), CostReport::Capped(100));
        assert_eq!(CostReport::Capped(100).units(), Some(100));
        assert_eq!(CostReport::Invalid.units(), None);
    }
}
