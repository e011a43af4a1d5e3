//! One limit across regions (`scope: global`): each region decides on its own part of the
//! whole, in its own Redis, and region sync moves parts between regions (strict) or tells each
//! region the others' counts (approx). See docs/multi-region.md for the mechanism and its bounds.
//!
//! * [`Regions`]: the regions as configured, and how a global limit splits among them;
//! * `ledger`: a global key's state in one region and the records regions publish of it;
//! * `notes`: the global keys this gateway decided on, for region sync to find;
//! * `plan`: which units move where (strict), from the records seen;
//! * `sync`: one tick of region sync over a [`sync::Here`] and its [`sync::Peer`]s;
//! * `simulation` (tests): regions, delays, partitions and losses on one manual clock.

pub mod ledger;
pub mod notes;
pub mod plan;
pub mod simulation;
pub mod sync;

use std::sync::Arc;
use std::time::Duration;

use super::algorithm::{Algorithm, Period};

/// The most regions one limit spans: a global key's ledger holds a field per peer.
pub const MAX_REGIONS: usize = 16;

/// How a global limit holds across regions. Its snake_case name is what the configuration says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, strum::EnumString, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum Consistency {
    /// Never more than the limit across regions: each region decides on its part, and parts
    /// move only as unspent units a region gives away.
    #[default]
    Strict,
    /// Each region admits while its count and the others' latest known counts stay under the
    /// limit: never unavailable, over by at most the bound docs/multi-region.md states.
    Approx,
}

impl Consistency {
    pub fn name(self) -> &'static str {
        match self {
            Consistency::Strict => "strict",
            Consistency::Approx => "approx",
        }
    }
}

/// How a global key is kept across regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Strict, its parts weighted.
    Strict,
    /// Strict, a calendar quota: home holds all but the seeds.
    Quota,
    /// Approx: the others' counts come off the whole.
    Approx,
}

impl Kind {
    pub fn letter(self) -> char {
        match self {
            Kind::Strict => 's',
            Kind::Quota => 'q',
            Kind::Approx => 'a',
        }
    }

    pub fn of_letter(text: &str) -> Option<Kind> {
        match text {
            "s" => Some(Kind::Strict),
            "q" => Some(Kind::Quota),
            "a" => Some(Kind::Approx),
            _ => None,
        }
    }

    /// The base a region decides this kind of key against ([`Regions::base`]).
    pub fn base(self, regions: &Regions, region: usize, whole: u64) -> u64 {
        match self {
            Kind::Strict => regions.part(region, whole, false),
            Kind::Quota => regions.part(region, whole, true),
            Kind::Approx => whole,
        }
    }
}

/// What `scope: global` made of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Global {
    pub consistency: Consistency,
    /// The limit across every region.
    pub whole: u64,
    /// Decided by `lua/global.lua` and kept by region sync; `false`: decided on this region's
    /// part alone (a window too short to rebalance in time, or an algorithm with no count to
    /// move), see [`Regions::compile`].
    pub synced: bool,
    /// How soon units another region gives may arrive, 2(T + d): a strict denial is retried no
    /// later (its `Retry-After`, and how long the deny cache keeps it).
    pub recheck_ms: u64,
}

impl Global {
    /// Caps a strict denial's retry at [`Global::recheck_ms`]: units given by another region
    /// may arrive long before the period ends, and a `cost` above this region's room but within
    /// the whole may be paid then. An approx denial waits for the period: counts only grow
    /// within it.
    pub fn cap_retry(&self, status: &mut crate::limiter::status::LimitStatus, cost: u64) {
        if self.consistency != Consistency::Strict || status.allowed {
            return;
        }
        status.retry_after_ms = match status.retry_after_ms {
            Some(ms) => Some(ms.min(self.recheck_ms)),
            None if cost <= self.whole => Some(self.recheck_ms),
            None => None,
        };
    }
}

/// One region as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    pub name: Arc<str>,
    /// Its share of a strict limit's parts, against the sum of every region's weight.
    pub weight: u64,
}

/// The regions, as every region's configuration lists them (`regions:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regions {
    /// This gateway's region: an index into `list`.
    pub this: usize,
    pub list: Vec<Region>,
    /// The exchange period T: how often region sync publishes and reads.
    pub every: Duration,
    /// The one-way delay d between regions that the bounds assume.
    pub max_delay: Duration,
    /// Where a calendar quota's units start (an index into `list`): every other region starts
    /// with its `seed` and borrows the rest from here as it needs them.
    pub home: usize,
    /// A calendar quota's part of each region but home, in percent of the whole.
    pub seed_percent: u64,
}

/// How many exchange periods (of T + d each) a window must span to be kept across regions.
pub const PERIODS_TO_REBALANCE: u32 = 4;

impl Regions {
    pub fn this_name(&self) -> &Arc<str> {
        &self.list[self.this].name
    }

    /// The regions but this one, with their indices.
    pub fn peers(&self) -> impl Iterator<Item = (usize, &Region)> {
        self.list
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != self.this)
    }

    /// The index of region `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.list.iter().position(|r| &*r.name == name)
    }

    /// The shortest window kept across regions: [`PERIODS_TO_REBALANCE`] × (T + d).
    pub fn shortest_window(&self) -> Duration {
        (self.every + self.max_delay) * PERIODS_TO_REBALANCE
    }

    /// Region `region`'s part of a strict limit of `whole` over `period`: a calendar quota's
    /// seed (home: the rest), else its weighted share, rounded down so the parts never sum past
    /// the whole.
    pub fn part(&self, region: usize, whole: u64, quota: bool) -> u64 {
        if quota {
            let seed = self.seed(whole);
            let others = seed * (self.list.len() as u64 - 1);
            return if region == self.home {
                whole.saturating_sub(others)
            } else {
                seed
            };
        }
        let total: u64 = self.list.iter().map(|r| r.weight).sum();
        let weight = self.list[region].weight;
        let part = u128::from(whole) * u128::from(weight) / u128::from(total.max(1));
        u64::try_from(part).unwrap_or(whole)
    }

    /// A calendar quota's seed: `seed_percent` of the whole, rounded down, at least one unit.
    pub fn seed(&self, whole: u64) -> u64 {
        (whole * self.seed_percent / 100).max(1)
    }

    /// What the script decides a global limit's key against in this region (its `base`):
    /// strict, this region's part; approx, the whole (the others' counts come off it).
    pub fn base(&self, global: &Global, quota: bool) -> u64 {
        match global.consistency {
            Consistency::Strict => self.part(self.this, global.whole, quota),
            Consistency::Approx => global.whole,
        }
    }

    /// A limit whose `algorithm` counts `whole` units across regions, as this region decides
    /// it: the algorithm this region runs and what scope: global made of it. Windows and periods
    /// of at least [`Regions::shortest_window`] are synced; others, and the algorithms with no
    /// count to move, are decided on this region's part alone (strict: exact; approx: the
    /// whole in each region).
    /// `whole` is the limit as written: units per window or period, or a rate's count per its
    /// period (what `RateLimit-Policy` advertises).
    pub fn compile(
        &self,
        algorithm: Algorithm,
        consistency: Consistency,
        whole: u64,
    ) -> (Algorithm, Global) {
        let period = match algorithm {
            Algorithm::Calendar { period, .. } => Some(period),
            Algorithm::FixedWindow { window_us, .. } => Some(Period::Aligned {
                length_us: window_us,
            }),
            _ => None,
        };
        let long_enough = period.is_some_and(|period| match period {
            Period::Aligned { length_us } => {
                Duration::from_micros(length_us) >= self.shortest_window()
            }
            Period::Calendar(_) => true,
        });
        let global = Global {
            consistency,
            whole,
            synced: long_enough,
            recheck_ms: ((self.every + self.max_delay) * 2).as_millis() as u64,
        };
        let regional = match (period, consistency) {
            (Some(period), _) => Algorithm::Calendar {
                limit: self
                    .base(
                        &global,
                        long_enough && matches!(period, Period::Calendar(_)),
                    )
                    .max(1),
                period,
            },
            (None, Consistency::Approx) => algorithm,
            (None, Consistency::Strict) => {
                let total: u64 = self.list.iter().map(|r| r.weight).sum();
                algorithm.scaled(self.list[self.this].weight, total)
            }
        };
        (regional, global)
    }
}

#[cfg(test)]
pub(crate) fn three(this: usize) -> Regions {
    let region = |name: &str| Region {
        name: name.into(),
        weight: 1,
    };
    Regions {
        this,
        list: vec![region("us-east"), region("eu-west"), region("ap-south")],
        every: Duration::from_millis(250),
        max_delay: Duration::from_millis(250),
        home: 0,
        seed_percent: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_parts_never_sum_past_the_whole_and_approx_decides_on_the_whole() {
        for whole in [1, 2, 3, 10, 999, 1000, 1_000_003] {
            let sum: u64 = (0..3).map(|r| three(0).part(r, whole, false)).sum();
            assert!(sum <= whole && sum + 3 > whole, "{whole}: {sum}");
        }
        let window = Algorithm::FixedWindow {
            limit: 300,
            window_us: 10_000_000,
        };
        let (strict, global) = three(1).compile(window, Consistency::Strict, 300);
        assert!(global.synced);
        let aligned = Period::Aligned {
            length_us: 10_000_000,
        };
        assert_eq!(
            strict,
            Algorithm::Calendar {
                limit: 100,
                period: aligned
            }
        );
        let (approx, _) = three(1).compile(window, Consistency::Approx, 300);
        assert_eq!(
            approx,
            Algorithm::Calendar {
                limit: 300,
                period: aligned
            }
        );
    }

    #[test]
    fn short_windows_and_rates_are_decided_per_region() {
        let short = Algorithm::FixedWindow {
            limit: 300,
            window_us: 1_000_000,
        };
        let (algorithm, global) = three(0).compile(short, Consistency::Strict, 300);
        assert!(!global.synced, "1 s < 4 × (250 ms + 250 ms)");
        assert_eq!(algorithm.capacity(), 100, "strict keeps its part: exact");
        let gcra = Algorithm::Gcra {
            emission_us: 1_000,
            tolerance_us: 300_000,
            max_delay_us: 0,
        };
        let (shared, global) = three(0).compile(gcra, Consistency::Strict, 1000);
        assert!(!global.synced);
        assert_eq!(shared, gcra.scaled(1, 3));
    }

    #[test]
    fn a_calendar_quota_starts_at_home_but_for_the_seeds() {
        let regions = three(0);
        assert_eq!(regions.part(0, 100_000, true), 98_000);
        assert_eq!(regions.part(1, 100_000, true), 1_000);
        assert_eq!(regions.part(2, 100_000, true), 1_000);
    }
}
