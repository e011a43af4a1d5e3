//! Counters per aligned period: calendar quotas (day, week, month, year in an IANA time zone)
//! and the epoch-aligned windows of the Envoy rate limit service. Mirrors `lua/calendar.lua`.
//!
//! The gateway computes the boundaries of the period around its own clock (cached per period:
//! no time zone arithmetic per request) and passes them; the decision picks the period that
//! holds the deciding clock (Redis TIME in Redis): the one given, the one before it (the gateway
//! is ahead), or the one after it (the gateway is behind). A period is recognised in the stored
//! state by whichever of its two boundaries is known, so gateways whose clocks straddle a
//! boundary count in the same period. A bound that is not known is stored as 0.

use std::fmt;
use std::sync::{Mutex, OnceLock, RwLock};

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use super::count_against;
use super::state::{State, Write};
use crate::limiter::status::LimitStatus;

/// A calendar unit: periods start at local midnight, weeks on Monday (ISO 8601).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    Day,
    Week,
    Month,
    Year,
}

impl CalendarUnit {
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }

    /// The first day of the period holding `date`.
    fn first_day(self, date: Date) -> Date {
        match self {
            CalendarUnit::Day => date,
            CalendarUnit::Week => {
                let back = i64::from(date.weekday().to_monday_zero_offset());
                date.checked_sub(back.days()).unwrap_or(date)
            }
            CalendarUnit::Month => date.first_of_month(),
            CalendarUnit::Year => date.first_of_year(),
        }
    }

    /// The first day of the period after the one starting on `first`.
    fn next_first_day(self, first: Date) -> Date {
        let span = match self {
            CalendarUnit::Day => 1.day(),
            CalendarUnit::Week => 1.week(),
            CalendarUnit::Month => 1.month(),
            CalendarUnit::Year => 1.year(),
        };
        first.checked_add(span).unwrap_or(first)
    }
}

/// Calendar periods of one unit in one time zone, with the bounds of the last period asked
/// for. Interned (see [`CalendarPeriods::of`]): one per (unit, zone) for the process's life.
pub struct CalendarPeriods {
    unit: CalendarUnit,
    zone_name: Box<str>,
    zone: TimeZone,
    current: RwLock<(i64, i64)>,
}

impl fmt::Debug for CalendarPeriods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.unit.name(), self.zone_name)
    }
}

impl PartialEq for CalendarPeriods {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && self.zone_name == other.zone_name
    }
}
impl Eq for CalendarPeriods {}

/// Every (unit, zone) asked for: a config names a handful, and reloads reuse them.
static INTERNED: OnceLock<Mutex<Vec<&'static CalendarPeriods>>> = OnceLock::new();

impl CalendarPeriods {
    /// As configured: `month in Europe/Paris`.
    pub fn describe(&self) -> String {
        format!("{} in {}", self.unit.name(), self.zone_name)
    }

    /// The periods of `unit` in the IANA zone `zone_name` (`UTC` included); `Err` names an
    /// unknown zone. Each distinct pair is built once and kept.
    pub fn of(unit: CalendarUnit, zone_name: &str) -> Result<&'static CalendarPeriods, String> {
        let interned = INTERNED.get_or_init(|| Mutex::new(Vec::new()));
        let mut interned = interned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = interned
            .iter()
            .find(|p| p.unit == unit && &*p.zone_name == zone_name)
        {
            return Ok(found);
        }
        let zone = TimeZone::get(zone_name).map_err(|_| {
            format!(
                "unknown time zone {zone_name:?}: use an IANA name such as UTC or Europe/Berlin"
            )
        })?;
        let periods: &'static CalendarPeriods = Box::leak(Box::new(CalendarPeriods {
            unit,
            zone_name: zone_name.into(),
            zone,
            current: RwLock::new((0, 0)),
        }));
        interned.push(periods);
        Ok(periods)
    }

    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// `[start, end)` of the period holding `now_us`, from the cache while it holds `now_us`.
    pub fn bounds(&self, now_us: i64) -> (i64, i64) {
        let cached = *self.current.read().unwrap_or_else(|e| e.into_inner());
        if cached.0 <= now_us && now_us < cached.1 {
            return cached;
        }
        let fresh = self.compute(now_us);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        fresh
    }

    /// `[start, end)` of the period holding `now_us`, computed in the zone: each bound is the
    /// first instant of its local day (midnight, or the end of a gap that swallows it).
    pub fn compute(&self, now_us: i64) -> (i64, i64) {
        let start_of = |date: Date| {
            date.to_zoned(self.zone.clone())
                .and_then(|zoned| zoned.start_of_day())
                .map_or(now_us, |zoned| zoned.timestamp().as_microsecond())
        };
        let now = Timestamp::from_microsecond(now_us).unwrap_or(Timestamp::UNIX_EPOCH);
        let first = self.unit.first_day(now.to_zoned(self.zone.clone()).date());
        (start_of(first), start_of(self.unit.next_first_day(first)))
    }
}

/// How a counter's periods are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// Windows of `length_us` aligned to the Unix epoch (`now - now % length`), as
    /// envoyproxy/ratelimit cuts them.
    Aligned { length_us: u64 },
    /// Calendar periods in a time zone.
    Calendar(&'static CalendarPeriods),
}

impl Period {
    /// `[start, end)` of the period holding `now_us`.
    pub fn bounds(&self, now_us: i64) -> (i64, i64) {
        match *self {
            Period::Aligned { length_us } => {
                let length = length_us.max(1) as i64;
                let start = now_us - now_us.rem_euclid(length);
                (start, start + length)
            }
            Period::Calendar(periods) => periods.bounds(now_us),
        }
    }
}

/// The period holding `now`, given the bounds `[start, end)` the gateway computed: the given
/// one, the one ending at `start`, or the one starting at `end`. 0 is an unknown bound.
fn holding(start: i64, end: i64, now: i64) -> (i64, i64) {
    if now < start {
        (0, start)
    } else if now >= end {
        (end, 0)
    } else {
        (start, end)
    }
}

/// Decides against the counter `stored` (start, end, count) with the period bounds the
/// gateway gave. Mirrors `calendar_decide` in `lua/calendar.lua`.
pub fn decide(
    limit: u64,
    (start, end): (i64, i64),
    stored: Option<(i64, i64, u64)>,
    now: i64,
    cost: u64,
) -> (LimitStatus, Option<Write>) {
    let (mut from, mut to) = holding(start, end, now);
    let mut count = 0;
    if let Some((s, e, n)) = stored {
        // The clock never runs backwards inside a key: a counter of a later period than the one
        // holding `now` is the period the request counts in.
        if s != 0 && to != 0 && s >= to {
            (from, to) = (s, e);
        }
        if (from != 0 && s == from) || (to != 0 && e == to) {
            count = n;
            if from == 0 {
                from = s;
            }
            if to == 0 {
                to = e;
            }
        }
    }
    let length = end - start;
    // An end not known yet (the gateway is behind): reported as one more period of the same
    // length, and kept a period longer than that.
    let (reset, ttl) = if to != 0 {
        (to - now, to - now)
    } else {
        (end + length - now, end + 2 * length - now)
    };
    count_against(limit, count, cost, (reset, ttl), |count| State::Period {
        start_us: from,
        end_us: to,
        count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> i64 {
        text.parse::<Timestamp>().unwrap().as_microsecond()
    }

    #[test]
    fn months_in_berlin_start_at_local_midnight_across_daylight_saving() {
        let month = CalendarPeriods::of(CalendarUnit::Month, "Europe/Berlin").unwrap();
        // March 2026 starts in CET (+01) and ends in CEST (+02): the clocks change on the 29th.
        assert_eq!(
            month.compute(at("2026-03-29T12:00:00Z")),
            (at("2026-02-28T23:00:00Z"), at("2026-03-31T22:00:00Z"))
        );
        // October 2026 ends in CET again (the 25th).
        assert_eq!(
            month.compute(at("2026-10-31T23:30:00Z")),
            (at("2026-10-31T23:00:00Z"), at("2026-11-30T23:00:00Z"))
        );
        assert_eq!(
            month.compute(at("2026-10-31T22:59:59Z")),
            (at("2026-09-30T22:00:00Z"), at("2026-10-31T23:00:00Z"))
        );
    }

    #[test]
    fn weeks_start_on_monday_days_and_years_at_midnight() {
        let week = CalendarPeriods::of(CalendarUnit::Week, "UTC").unwrap();
        // 2026-11-24 is a Tuesday.
        assert_eq!(
            week.compute(at("2026-11-24T10:00:00Z")),
            (at("2026-11-23T00:00:00Z"), at("2026-11-30T00:00:00Z"))
        );
        let day = CalendarPeriods::of(CalendarUnit::Day, "America/New_York").unwrap();
        // The day the clocks go back is 25 hours long.
        assert_eq!(
            day.compute(at("2026-11-01T12:00:00Z")),
            (at("2026-11-01T04:00:00Z"), at("2026-11-02T05:00:00Z"))
        );
        let year = CalendarPeriods::of(CalendarUnit::Year, "Asia/Tokyo").unwrap();
        assert_eq!(
            year.compute(at("2026-12-31T15:00:00Z")),
            (at("2026-12-31T15:00:00Z"), at("2027-12-31T15:00:00Z"))
        );
    }

    #[test]
    fn unknown_zones_are_refused_and_pairs_are_interned() {
        assert!(CalendarPeriods::of(CalendarUnit::Day, "Mars/Olympus")
            .unwrap_err()
            .contains("unknown time zone"));
        let a = CalendarPeriods::of(CalendarUnit::Day, "UTC").unwrap();
        let b = CalendarPeriods::of(CalendarUnit::Day, "UTC").unwrap();
        assert!(std::ptr::eq(a, b));
    }

    #[test]
    fn aligned_windows_divide_the_epoch() {
        let minute = Period::Aligned {
            length_us: 60_000_000,
        };
        assert_eq!(minute.bounds(61_500_000), (60_000_000, 120_000_000));
        assert_eq!(minute.bounds(60_000_000), (60_000_000, 120_000_000));
    }

    #[test]
    fn a_gateway_on_either_side_of_a_boundary_counts_in_the_period_of_the_deciding_clock() {
        let (b0, b1, b2) = (1_000, 2_000, 3_000);
        // Written by a gateway that already computed [b1, b2) at 1_990 (it is ahead): the
        // request belongs to the period ending at b1.
        let (status, write) = decide(5, (b1, b2), Some((b0, b1, 4)), 1_990, 1);
        assert_eq!(
            (status.allowed, status.remaining, status.reset_after_ms),
            (true, 0, 1)
        );
        let write = write.unwrap();
        assert_eq!(
            write.state,
            State::Period {
                start_us: b0,
                end_us: b1,
                count: 5
            },
            "the start it did not know is taken from the stored counter"
        );
        // A gateway still on [b0, b1) at 2_010 (it is behind) counts in the period starting at
        // b1, which one on time then recognises by its start.
        let (_, write) = decide(5, (b0, b1), None, 2_010, 1);
        let Some(Write {
            state:
                State::Period {
                    start_us,
                    end_us,
                    count,
                },
            ..
        }) = write
        else {
            panic!("allowed")
        };
        assert_eq!((start_us, end_us, count), (b1, 0, 1));
        let (status, _) = decide(1, (b1, b2), Some((start_us, end_us, count)), 2_020, 1);
        assert!(
            !status.allowed,
            "the count written by the late gateway holds"
        );
    }

    #[test]
    fn the_bundled_time_zone_database_serves_where_the_system_has_none() {
        // What a container without /usr/share/zoneinfo falls back to (`tzdb-bundle-always`).
        let bundled = jiff::tz::TimeZoneDatabase::bundled();
        assert!(bundled.get("Europe/Berlin").is_ok());
    }

    #[test]
    fn a_clock_gone_back_across_a_boundary_keeps_counting_in_the_later_period() {
        let (status, write) = decide(2, (1_000, 2_000), Some((2_000, 3_000, 2)), 1_500, 1);
        assert!(!status.allowed);
        assert_eq!(status.reset_after_ms, 2, "until the stored period ends");
        assert!(write.is_none());
    }

    #[test]
    fn a_count_above_a_lowered_limit_denies_and_a_peek_never_does() {
        let (status, write) = decide(10, (0, 1_000_000), Some((0, 1_000_000, 12)), 10, 1);
        assert_eq!((status.allowed, status.remaining), (false, 0));
        assert_eq!(status.retry_after_ms, Some(1000));
        assert!(write.is_none());
        let (peek, write) = decide(10, (0, 1_000_000), Some((0, 1_000_000, 12)), 10, 0);
        assert!(peek.allowed && write.is_none());
    }
}
