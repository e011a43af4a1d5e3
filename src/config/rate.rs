//! `rate:` values: `N/s`, `N/m`, `N/h`, `N/d`, or `N/<count><unit>` such as `100/30s` or `5/500ms`.

use std::num::NonZeroU64;
use std::time::Duration;

use crate::limiter::algorithm::CalendarUnit;
use crate::limiter::Rate;

/// The longest period a rate may have: one year keeps every microsecond count far below 2^53,
/// so the Lua scripts (doubles) and the Rust backend compute identical integers.
const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// The request count of a rate: a whole number, at most `u64::MAX`.
fn parse_count(text: &str, count: &str) -> Result<u64, String> {
    count.parse().map_err(|_| {
        if !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()) {
            format!(
                "invalid rate {text:?}: {count} is too large: at most one request per microsecond \
                 can be limited, so the largest count is {} (per 366d, the longest period)",
                MAX_PERIOD.as_micros()
            )
        } else {
            format!("invalid rate {text:?}: {count:?} is not a whole number of requests")
        }
    })
}

pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let (count, period) = text.split_once('/').ok_or_else(|| {
        format!("invalid rate {text:?}: expected N/<period>, e.g. 10/s or 100/30s")
    })?;
    let count = parse_count(text, count.trim())?;
    let count = NonZeroU64::new(count)
        .ok_or_else(|| format!("invalid rate {text:?}: the request count must be at least 1"))?;
    let period =
        parse_period(period.trim()).map_err(|reason| format!("invalid rate {text:?}: {reason}"))?;
    if period > MAX_PERIOD {
        return Err(format!(
            "invalid rate {text:?}: the period may be at most 366d"
        ));
    }
    if u128::from(count.get()) > period.as_micros() {
        return Err(format!(
            "invalid rate {text:?}: at most one request per microsecond can be limited: \
             at most {} in this period",
            period.as_micros()
        ));
    }
    Ok(Rate { count, period })
}

/// A calendar quota's `rate:`: `N/day`, `N/week`, `N/month` or `N/year`, and the nominal
/// period the `RateLimit-Policy` header advertises (a month: 30 days, a year: 365).
pub fn parse_calendar_rate(text: &str) -> Result<(Rate, CalendarUnit), String> {
    let (count, unit) = text
        .split_once('/')
        .ok_or_else(|| format!("invalid rate {text:?}: expected N/<unit>, e.g. 100000/month"))?;
    let count = parse_count(text, count.trim())?;
    let (unit, days) = match unit.trim() {
        "day" => (CalendarUnit::Day, 1),
        "week" => (CalendarUnit::Week, 7),
        "month" => (CalendarUnit::Month, 30),
        "year" => (CalendarUnit::Year, 365),
        other => {
            return Err(format!(
            "invalid rate {text:?}: unknown calendar unit {other:?}: use day, week, month or year"
        ))
        }
    };
    let rate = Rate::new(count, Duration::from_secs(days * 86_400))
        .ok_or_else(|| format!("invalid rate {text:?}: the request count must be at least 1"))?;
    if u128::from(count) > MAX_PERIOD.as_micros() {
        return Err(format!(
            "invalid rate {text:?}: at most one request per microsecond can be limited"
        ));
    }
    Ok((rate, unit))
}

/// A duration such as `500ms`, `2s`, `1m`, `1h`, `1d` (a bare unit means one of it).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_period(text.trim()).map_err(|reason| format!("invalid duration {text:?}: {reason}"))
}

/// The units a period may be written in, and their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

fn parse_period(text: &str) -> Result<Duration, String> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let multiple: u64 = if number.is_empty() {
        1
    } else {
        number
            .parse()
            .map_err(|_| format!("period {text:?} is too large"))?
    };
    if multiple == 0 {
        return Err("the period must be longer than zero".to_string());
    }
    let Some(&(_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(unknown_unit(number, unit));
    };
    multiple
        .checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("period {text:?} is too large"))
}

/// Why a period whose unit is `unit` (after the number `number`) is not one: no unit at all is
/// told as such (`30` → `write 30s`), else the units there are.
fn unknown_unit(number: &str, unit: &str) -> String {
    let names: Vec<&str> = UNITS.iter().map(|(name, _)| *name).collect();
    if unit.is_empty() && !number.is_empty() {
        let others: Vec<&str> = names.iter().copied().filter(|&n| n != "s").collect();
        return format!(
            "no unit after {number}: write {number}s (or {})",
            others.join(", ")
        );
    }
    if unit.is_empty() {
        return format!(
            "empty: write a number and a unit, e.g. 30s ({})",
            names.join(", ")
        );
    }
    let (last, first) = names.split_last().unwrap_or((&"", &[]));
    format!(
        "unknown period unit {unit:?}: use {} or {last}",
        first.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(count: u64, ms: u64) -> Rate {
        Rate {
            count: NonZeroU64::new(count).unwrap(),
            period: Duration::from_millis(ms),
        }
    }

    #[test]
    fn parses_every_unit_and_multiples() {
        assert_eq!(parse_rate("10/s"), Ok(rate(10, 1_000)));
        assert_eq!(parse_rate("5/m"), Ok(rate(5, 60_000)));
        assert_eq!(parse_rate("2/h"), Ok(rate(2, 3_600_000)));
        assert_eq!(parse_rate("1/d"), Ok(rate(1, 86_400_000)));
        assert_eq!(parse_rate("100/30s"), Ok(rate(100, 30_000)));
        assert_eq!(parse_rate("3/500ms"), Ok(rate(3, 500)));
        assert_eq!(parse_rate(" 7 / 2m "), Ok(rate(7, 120_000)));
    }

    #[test]
    fn calendar_rates_name_a_calendar_unit() {
        let (rate, unit) = parse_calendar_rate("100000/month").unwrap();
        assert_eq!((rate.count.get(), unit), (100_000, CalendarUnit::Month));
        assert_eq!(rate.advertised(), (100_000, 30 * 86_400));
        assert_eq!(
            parse_calendar_rate(" 5 / week ").unwrap().1,
            CalendarUnit::Week
        );
        assert_eq!(
            parse_calendar_rate("10/d").unwrap_err(),
            "invalid rate \"10/d\": unknown calendar unit \"d\": use day, week, month or year"
        );
        assert!(parse_calendar_rate("0/day")
            .unwrap_err()
            .contains("at least 1"));
        assert!(parse_calendar_rate("10").unwrap_err().contains("N/<unit>"));
    }

    #[test]
    fn rejects_malformed_rates_with_a_reason() {
        assert!(parse_rate("10")
            .unwrap_err()
            .contains("expected N/<period>"));
        assert!(parse_rate("ten/s")
            .unwrap_err()
            .contains("not a whole number"));
        assert_eq!(
            parse_rate("99999999999999999999/s").unwrap_err(),
            "invalid rate \"99999999999999999999/s\": 99999999999999999999 is too large: at most \
             one request per microsecond can be limited, so the largest count is 31622400000000 \
             (per 366d, the longest period)"
        );
        assert!(parse_rate("0/s").unwrap_err().contains("at least 1"));
        assert!(parse_rate("10/fortnight")
            .unwrap_err()
            .contains("unknown period unit"));
        assert_eq!(
            parse_rate("10/30").unwrap_err(),
            "invalid rate \"10/30\": no unit after 30: write 30s (or ms, m, h, d)"
        );
        assert_eq!(
            parse_duration("30").unwrap_err(),
            "invalid duration \"30\": no unit after 30: write 30s (or ms, m, h, d)"
        );
        assert_eq!(
            parse_duration("").unwrap_err(),
            "invalid duration \"\": empty: write a number and a unit, e.g. 30s (ms, s, m, h, d)"
        );
        assert_eq!(
            parse_duration("2w").unwrap_err(),
            "invalid duration \"2w\": unknown period unit \"w\": use ms, s, m, h or d"
        );
        assert!(parse_rate("10/0s")
            .unwrap_err()
            .contains("longer than zero"));
        assert!(parse_rate("1/400d").unwrap_err().contains("at most 366d"));
        assert_eq!(
            parse_rate("2000/1ms").unwrap_err(),
            "invalid rate \"2000/1ms\": at most one request per microsecond can be limited: at \
             most 1000 in this period"
        );
    }
}
