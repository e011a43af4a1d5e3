//! `routes[].limits[]` → [`Limit`]: the algorithm's parameters, the cost, and the checks that
//! make every limit satisfiable (a cost no request could ever pay is a config error).

use std::time::Duration;

use http::header::HeaderName;

use super::choice::{
    chosen, AlgorithmName, HeaderVisibility, LimitMode, OnMissingName, ScopeName, Spelled,
};
use super::problem::{required_name, Problems};
use super::rate::{parse_calendar_rate, parse_duration, parse_rate};
use super::raw::{RawLimit, RawResponseCost};
use crate::limiter::algorithm::{CalendarPeriods, Period};
use crate::limiter::regions::{Consistency, Global, Regions};
use crate::limiter::{
    Algorithm, Cost, Leasing, Limit, Rate, ResponsePrice, Scope, AUTO_MIN_UNITS, QUOTA_MEMORY_US,
};
use crate::route::keys::{KeyPart, KeySpec, OnMissing};
use crate::route::pricing::CostHeaders;

/// Keeps every microsecond quantity of the algorithms far below 2^53 (exact in Lua doubles).
const MAX_TOLERANCE_US: u64 = 1 << 50;
pub use crate::limiter::algorithm::MAX_SLIDING_LOG_LIMIT;
/// Holding requests longer than this is queueing, not shaping.
const MAX_DELAY: Duration = Duration::from_secs(60);
const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The optional fields each algorithm accepts.
fn accepts(algorithm: AlgorithmName, field: &str) -> bool {
    use AlgorithmName::*;
    match field {
        "rate" => algorithm != Concurrency,
        "time_zone" => algorithm == Calendar,
        "burst" => algorithm == Gcra,
        "capacity" => matches!(algorithm, TokenBucket | LeakyBucket),
        "max_delay" => matches!(algorithm, Gcra | LeakyBucket),
        "max" | "lease" => algorithm == Concurrency,
        "cost_header" | "cost_max" => algorithm != Concurrency,
        "cost_from_response" => matches!(algorithm, Gcra | TokenBucket | LeakyBucket | FixedWindow),
        _ => true,
    }
}

fn duration(text: Option<&str>, at: String, max: Duration, p: &mut Problems) -> Option<Duration> {
    let value = parse_duration(text?)
        .map_err(|e| p.add(at.clone(), e))
        .ok()?;
    if value > max {
        p.add(at, format!("must be at most {}s", max.as_secs()));
        return None;
    }
    Some(value)
}

/// The most sub-keys a split limit may have.
const MAX_SPLIT: u64 = 256;

pub(crate) fn compile_limit(
    at: &str,
    raw: RawLimit,
    regions: Option<&Regions>,
    p: &mut Problems,
) -> Option<(Limit, KeySpec, CostHeaders)> {
    let name = required_name(raw.name.clone(), &format!("{at}.name"), p);
    let parts = compile_key(at, raw.key.as_deref(), p);
    let on_missing = compile_on_missing(at, &raw, p);
    let kind = chosen(
        raw.algorithm.as_ref(),
        AlgorithmName::Gcra,
        &format!("{at}.algorithm"),
        p,
    )?;
    check_parameters(at, kind, &raw, p);
    let rate = compile_rate(at, kind, raw.rate.as_deref(), p);
    let algorithm = compile_algorithm(at, kind, &raw, rate, p);
    let shards = compile_split(at, &raw, algorithm.as_ref(), p);
    // A split limit is `shards` sub-keys, each an equal share of the whole.
    let algorithm = algorithm.map(|a| a.share(u64::from(shards)));
    let (scope, algorithm, global) = compile_where(at, kind, &raw, (algorithm, rate), regions, p);
    let leased = match scope {
        Some(Scope::Shared) => compile_leasing(at, &raw, algorithm.as_ref(), p),
        Some(Scope::Local) | None => None,
    };
    let (cost, priced_by_response, headers) =
        compile_pricing(at, kind, &raw, algorithm.as_ref(), p);
    let visibility = chosen(
        raw.headers.as_ref(),
        HeaderVisibility::Show,
        &format!("{at}.headers"),
        p,
    );
    let (name, algorithm, cost, parts, scope) = (name?, algorithm?, cost?, parts?, scope?);
    let spec = KeySpec {
        limit: fingerprinted(&name, &algorithm),
        on_missing,
        shards,
        local: scope == Scope::Local,
        ..KeySpec::new("", parts)
    };
    let limit = Limit {
        name: name.into(),
        algorithm,
        cost,
        advertised: rate.map(|rate| rate.advertised()),
        shadow: raw.shadow.unwrap_or(false),
        hidden: visibility? == HeaderVisibility::Hide,
        leased,
        priced_by_response,
        scope,
        global,
    };
    Some((limit, spec, headers))
}

/// `on_missing:` (default `use_empty`).
fn compile_on_missing(at: &str, raw: &RawLimit, p: &mut Problems) -> OnMissing {
    chosen(
        raw.on_missing.as_ref(),
        OnMissingName::UseEmpty,
        &format!("{at}.on_missing"),
        p,
    )
    .map_or(OnMissing::UseEmpty, on_missing)
}

/// Where the limit is counted: its scope, and for `scope: global` what this region decides of
/// it (its algorithm on its part, [`Global`]); `algorithm` as compiled, `None` when it did not.
fn compile_where(
    at: &str,
    kind: AlgorithmName,
    raw: &RawLimit,
    (algorithm, rate): (Option<Algorithm>, Option<Rate>),
    regions: Option<&Regions>,
    p: &mut Problems,
) -> (Option<Scope>, Option<Algorithm>, Option<Global>) {
    let named = chosen(
        raw.scope.as_ref(),
        ScopeName::Shared,
        &format!("{at}.scope"),
        p,
    );
    let scope = named.and_then(|named| compile_scope(at, kind, named, raw, p));
    let consistency = compile_consistency(at, kind, named, raw, p);
    match (algorithm, consistency) {
        (Some(algorithm), Some(consistency)) => {
            let whole = rate.map_or(algorithm.capacity(), |rate| rate.advertised().0);
            match compile_global(at, (algorithm, whole), consistency, regions, p) {
                Some((regional, global)) => (scope, Some(regional), Some(global)),
                None => (scope, None, None),
            }
        }
        (algorithm, _) => (scope, algorithm, None),
    }
}

/// `scope:` (default `shared`). A `local` limit is counted in-process by each gateway, so it is
/// never leased; its units go back when a shared limit of the route denies, which only GCRA,
/// fixed windows and concurrency slots give back exactly: other algorithms are refused.
fn compile_scope(
    at: &str,
    kind: AlgorithmName,
    named: ScopeName,
    raw: &RawLimit,
    p: &mut Problems,
) -> Option<Scope> {
    if named != ScopeName::Local {
        return Some(Scope::Shared);
    }
    let scope = Scope::Local;
    use AlgorithmName::*;
    if !matches!(kind, Gcra | FixedWindow | Concurrency) {
        p.add(
            format!("{at}.scope"),
            format!(
                "local applies to gcra, fixed_window and concurrency, not {kind}: a local limit's \
                 units go back when a shared limit denies, and only those give them back exactly"
            ),
        );
    }
    if matches!(raw.mode, Some(Spelled::Known(LimitMode::Leased))) {
        p.add(
            format!("{at}.mode"),
            "a local limit is counted in-process by each gateway: it is never leased",
        );
    }
    if raw.lease_units.is_some() {
        p.add(
            format!("{at}.lease_units"),
            "a local limit is counted in-process by each gateway: it is never leased",
        );
    }
    if raw.split.is_some_and(|shards| shards > 1) {
        p.add(
            format!("{at}.split"),
            "spreads a hot key over Redis Cluster's slots: a local limit is counted in-process",
        );
    }
    Some(scope)
}

/// `consistency:` and what `scope: global` asks of a limit: `Some` for a global limit (strict
/// unless said), `None` for any other; a consistency without `scope: global`, and the algorithms
/// and options a limit across regions cannot have, are problems.
fn compile_consistency(
    at: &str,
    kind: AlgorithmName,
    named: Option<ScopeName>,
    raw: &RawLimit,
    p: &mut Problems,
) -> Option<Consistency> {
    let consistency = chosen(
        raw.consistency.as_ref(),
        Consistency::Strict,
        &format!("{at}.consistency"),
        p,
    )?;
    if named != Some(ScopeName::Global) {
        if raw.consistency.is_some() {
            p.add(
                format!("{at}.consistency"),
                "applies only with scope: global (one limit across regions)",
            );
        }
        return None;
    }
    use AlgorithmName::*;
    if matches!(kind, SlidingLog | Concurrency | SlidingWindow) {
        p.add(
            format!("{at}.scope"),
            format!(
                "global applies to fixed_window, calendar, gcra, token_bucket and leaky_bucket, \
                 not {kind}"
            ),
        );
        return None;
    }
    if consistency == Consistency::Approx && !matches!(kind, FixedWindow | Calendar) {
        p.add(
            format!("{at}.consistency"),
            format!(
                "approx applies to fixed_window and calendar (counts region sync can add up), \
                 not {kind}: a global {kind} is kept strict, each region on its part of the rate"
            ),
        );
        return None;
    }
    if raw.split.is_some_and(|shards| shards > 1) {
        p.add(
            format!("{at}.split"),
            "a global limit is one key in each region's Redis: it cannot be split",
        );
        return None;
    }
    Some(consistency)
}

/// What this region decides of a global `algorithm` ([`Regions::compile`]); a limit too small to
/// give every region a unit is a problem.
fn compile_global(
    at: &str,
    (algorithm, whole): (Algorithm, u64),
    consistency: Consistency,
    regions: Option<&Regions>,
    p: &mut Problems,
) -> Option<(Algorithm, Global)> {
    let Some(regions) = regions else {
        p.add(
            format!("{at}.scope"),
            "global needs a regions: section without problems (this gateway's region and every region's Redis)",
        );
        return None;
    };
    let (regional, global) = regions.compile(algorithm, consistency, whole);
    // A rate's parts are rates (never below one unit per its period); a count's must be units.
    let counted = matches!(regional, Algorithm::Calendar { .. });
    if consistency == Consistency::Strict && counted {
        let quota = matches!(
            regional,
            Algorithm::Calendar {
                period: Period::Calendar(_),
                ..
            }
        );
        let smallest = (0..regions.list.len())
            .map(|r| regions.part(r, global.whole, quota))
            .min()
            .unwrap_or(0);
        if smallest == 0 {
            p.add(
                format!("{at}.rate"),
                format!(
                    "{} units cannot be split among {} regions by their weights and seed: \
                     each region's part must be at least one unit",
                    global.whole,
                    regions.list.len()
                ),
            );
            return None;
        }
    }
    Some((regional, global))
}

/// `key:` (default `[client_ip]`): the parts of a request the limit counts by.
fn compile_key(at: &str, texts: Option<&[String]>, p: &mut Problems) -> Option<Vec<KeyPart>> {
    let default = ["client_ip".to_string()];
    key_parts(texts.unwrap_or(&default), &format!("{at}.key"), p)
}

/// The key parts listed at `at` (a limit's `key`, an upstream's `hash_key`); `None` if any is
/// wrong, each reported.
pub(crate) fn key_parts(texts: &[String], at: &str, p: &mut Problems) -> Option<Vec<KeyPart>> {
    let parts: Vec<KeyPart> = texts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            KeyPart::parse(text)
                .map_err(|e| p.add(format!("{at}[{i}]"), e))
                .ok()
        })
        .collect();
    (parts.len() == texts.len()).then_some(parts)
}

fn on_missing(name: OnMissingName) -> OnMissing {
    match name {
        OnMissingName::UseEmpty => OnMissing::UseEmpty,
        OnMissingName::Skip => OnMissing::Skip,
        OnMissingName::Deny => OnMissing::Deny,
    }
}

/// The limit's name in its keys, with a fingerprint of what its stored state means
/// ([`Algorithm::state_meaning`]): a reload (or another plan) that changes only what the state
/// is compared with (a count, a burst, a capacity, a max) keeps the key and the usage counted
/// in it; one that changes what the state means (a window length, GCRA's rate, a calendar unit
/// or zone, another algorithm) starts fresh.
pub(crate) fn fingerprinted(name: &str, algorithm: &Algorithm) -> String {
    let definition = algorithm.state_meaning();
    let fingerprint = xxhash_rust::xxh3::xxh3_64(definition.as_bytes()) as u32;
    format!("{name}.{fingerprint:08x}")
}

/// Every parameter written that the algorithm does not take is reported.
fn check_parameters(at: &str, kind: AlgorithmName, raw: &RawLimit, p: &mut Problems) {
    let present = [
        ("burst", raw.burst.is_some()),
        ("capacity", raw.capacity.is_some()),
        ("max_delay", raw.max_delay.is_some()),
        ("max", raw.max.is_some()),
        ("lease", raw.lease.is_some()),
        ("rate", raw.rate.is_some()),
        ("time_zone", raw.time_zone.is_some()),
        ("cost_header", raw.cost_header.is_some()),
        ("cost_max", raw.cost_max.is_some()),
        ("cost_from_response", raw.cost_from_response.is_some()),
    ];
    for (field, _) in present
        .iter()
        .filter(|(field, set)| *set && !accepts(kind, field))
    {
        p.add(
            format!("{at}.{field}"),
            format!("does not apply to algorithm {kind}"),
        );
    }
}

/// `rate:`, required by every algorithm but concurrency.
fn compile_rate(
    at: &str,
    kind: AlgorithmName,
    text: Option<&str>,
    p: &mut Problems,
) -> Option<Rate> {
    if !accepts(kind, "rate") {
        return None;
    }
    let Some(text) = text else {
        let example = if kind == AlgorithmName::Calendar {
            "100000/month"
        } else {
            "10/s or 100/30s"
        };
        p.add(format!("{at}.rate"), format!("required, e.g. {example}"));
        return None;
    };
    if kind == AlgorithmName::Calendar {
        return parse_calendar_rate(text)
            .map(|(rate, _)| rate)
            .map_err(|e| p.add(format!("{at}.rate"), e))
            .ok();
    }
    parse_rate(text)
        .map_err(|e| p.add(format!("{at}.rate"), e))
        .ok()
}

/// `split: N`: how many sub-keys a hot limit is cut into (1 = not split).
fn compile_split(at: &str, raw: &RawLimit, algorithm: Option<&Algorithm>, p: &mut Problems) -> u32 {
    let Some(split) = raw.split else {
        return 1;
    };
    if !(1..=MAX_SPLIT).contains(&split) {
        p.add(
            format!("{at}.split"),
            format!("must be between 1 and {MAX_SPLIT}, got {split}"),
        );
        return 1;
    }
    if let Some(algorithm) = algorithm {
        if matches!(algorithm, Algorithm::Concurrency { .. }) {
            p.add(
                format!("{at}.split"),
                "does not apply to algorithm concurrency (leases are released by key)",
            );
            return 1;
        }
        // Every shard must keep at least one unit, or N shards would admit more than the whole.
        let whole = match *algorithm {
            Algorithm::Gcra {
                tolerance_us,
                emission_us,
                ..
            } => tolerance_us / emission_us,
            ref other => other.capacity(),
        };
        if whole < split {
            p.add(
                format!("{at}.split"),
                format!("{split} shards need a limit (or burst) of at least {split} units, this one has {whole}"),
            );
            return 1;
        }
    }
    split as u32
}

/// A lease is this share of the limit's capacity unless `lease_units` says otherwise.
const DEFAULT_LEASE_DIVISOR: u64 = 10;

/// `mode: auto | exact | leased` and `lease_units`: leases apply to limits whose units lapse
/// exactly and whose unspent units can be given back (GCRA and its buckets without shaping, the
/// fixed window, the calendar), not to limits priced by the response (a lease is spent before
/// any response). `auto`, the default, leases where they apply and says nothing where they do
/// not; `leased` says so.
/// Why `mode: auto` decides a limit exactly, if it does: leases do not apply, or it is priced
/// by the response, or it is a GCRA quota. A GCRA takes back only the units that are still its
/// key's last; the others free themselves as their slots pass, within the burst: for a rate,
/// moments; for a GCRA whose burst spans an hour or more (a quota), hours of a caller's quota
/// (`mode: leased` still leases it).
fn auto_declines(
    mode: LimitMode,
    algorithm: &Algorithm,
    leasable: bool,
    raw: &RawLimit,
) -> Option<&'static str> {
    let gcra_quota = matches!(*algorithm, Algorithm::Gcra { tolerance_us, .. } if tolerance_us >= QUOTA_MEMORY_US);
    if mode != LimitMode::Auto || (leasable && !gcra_quota && raw.cost_from_response.is_none()) {
        return None;
    }
    Some(match leasable && gcra_quota && raw.cost_from_response.is_none() {
        true => "a gcra, token_bucket or leaky_bucket whose burst spans an hour or more is decided exactly under mode: auto (its unspent units could stay charged for hours): set mode: leased to lease it",
        false => "applies only to a limit that can be leased: gcra, token_bucket, leaky_bucket (without max_delay), fixed_window or calendar, not priced by the response",
    })
}

fn compile_leasing(
    at: &str,
    raw: &RawLimit,
    algorithm: Option<&Algorithm>,
    p: &mut Problems,
) -> Option<Leasing> {
    let mode = chosen(raw.mode.as_ref(), LimitMode::Auto, &format!("{at}.mode"), p)?;
    if mode == LimitMode::Exact {
        if raw.lease_units.is_some() {
            p.add(
                format!("{at}.lease_units"),
                "applies only with mode: leased or auto",
            );
        }
        return None;
    }
    let algorithm = algorithm?;
    let leasable = match *algorithm {
        Algorithm::Gcra { max_delay_us, .. } => max_delay_us == 0,
        Algorithm::FixedWindow { .. } | Algorithm::Calendar { .. } => true,
        _ => false,
    };
    if let Some(why) = auto_declines(mode, algorithm, leasable, raw) {
        if raw.lease_units.is_some() {
            p.add(format!("{at}.lease_units"), why);
        }
        return None;
    }
    if !leasable {
        p.add(
            format!("{at}.mode"),
            "leased applies to gcra, token_bucket, leaky_bucket (without max_delay), fixed_window and calendar",
        );
        return None;
    }
    let capacity = algorithm.capacity();
    let max_units = raw
        .lease_units
        .unwrap_or((capacity / DEFAULT_LEASE_DIVISOR).max(1));
    if !(1..=capacity).contains(&max_units) {
        p.add(
            format!("{at}.lease_units"),
            format!("must be between 1 and the limit's capacity ({capacity}), got {max_units}"),
        );
        return None;
    }
    let min_units = match mode {
        LimitMode::Auto => AUTO_MIN_UNITS,
        _ => 1,
    };
    // A lease too small to pay is never taken: the key is decided exactly, without holdings.
    (max_units >= min_units).then_some(Leasing {
        max_units,
        min_units,
    })
}

/// The algorithm of `kind` with the limit's parameters; every problem reported.
fn compile_algorithm(
    at: &str,
    kind: AlgorithmName,
    raw: &RawLimit,
    rate: Option<Rate>,
    p: &mut Problems,
) -> Option<Algorithm> {
    let max_delay = duration(
        raw.max_delay.as_deref(),
        format!("{at}.max_delay"),
        MAX_DELAY,
        p,
    )
    .unwrap_or_default();
    let max_delay_us = max_delay.as_micros() as u64;
    match kind {
        AlgorithmName::Gcra => {
            let units = raw.burst.unwrap_or(0).saturating_add(1);
            compile_gcra(at, rate?, units, "burst", max_delay_us, p)
        }
        AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => match raw.capacity {
            Some(capacity) if capacity >= 1 => {
                compile_gcra(at, rate?, capacity, "capacity", max_delay_us, p)
            }
            Some(_) => {
                p.add(format!("{at}.capacity"), "must be at least 1");
                None
            }
            None => {
                p.add(format!("{at}.capacity"), format!("required for {kind}"));
                None
            }
        },
        AlgorithmName::FixedWindow | AlgorithmName::SlidingWindow | AlgorithmName::SlidingLog => {
            let window = window(kind, rate?);
            if window.is_none() {
                p.add(
                    format!("{at}.rate"),
                    format!(
                        "sliding_log keeps one entry per request: at most {MAX_SLIDING_LOG_LIMIT} per window (use sliding_window or gcra)"
                    ),
                );
            }
            window
        }
        AlgorithmName::Calendar => compile_calendar(at, raw, rate?, p),
        AlgorithmName::Concurrency => compile_concurrency(at, raw, p),
    }
}

/// `algorithm: calendar`: `rate: N/<day|week|month|year>` (already checked as `rate`) counted
/// per calendar period in `time_zone` (an IANA name, default UTC).
fn compile_calendar(at: &str, raw: &RawLimit, rate: Rate, p: &mut Problems) -> Option<Algorithm> {
    let (_, unit) = parse_calendar_rate(raw.rate.as_deref()?).ok()?;
    let zone = raw.time_zone.as_deref().unwrap_or("UTC");
    let periods = CalendarPeriods::of(unit, zone)
        .map_err(|e| p.add(format!("{at}.time_zone"), e))
        .ok()?;
    Some(Algorithm::Calendar {
        limit: rate.count.get(),
        period: Period::Calendar(periods),
    })
}

/// GCRA at `rate` with `units` of credit (`burst + 1`, or a bucket's capacity), admitting a
/// request up to `max_delay_us` early by holding it; `None` when the credit is too large to stay
/// exact in Lua. Routes and the rate limit service build GCRA here.
pub(crate) fn gcra(rate: Rate, units: u64, max_delay_us: u64) -> Option<Algorithm> {
    let emission_us = rate.period_us().div_ceil(rate.count.get());
    let tolerance_us = units
        .checked_mul(emission_us)
        .filter(|&t| t <= MAX_TOLERANCE_US)?;
    Some(Algorithm::Gcra {
        emission_us,
        tolerance_us,
        max_delay_us,
    })
}

/// The window algorithms (`fixed_window`, `sliding_window`, `sliding_log`): the rate's count per
/// window of its period. `None` for other kinds, and for a sliding log longer than
/// [`MAX_SLIDING_LOG_LIMIT`]. Routes and the rate limit service build windows here.
pub(crate) fn window(kind: AlgorithmName, rate: Rate) -> Option<Algorithm> {
    let limit = rate.count.get();
    let window_us = rate.period_us();
    Some(match kind {
        AlgorithmName::FixedWindow => Algorithm::FixedWindow { limit, window_us },
        AlgorithmName::SlidingWindow => Algorithm::SlidingWindow { limit, window_us },
        AlgorithmName::SlidingLog if limit <= MAX_SLIDING_LOG_LIMIT => {
            Algorithm::SlidingLog { limit, window_us }
        }
        _ => return None,
    })
}

/// [`gcra`], or a problem at `{at}.{field}` when `field` makes the credit too large.
fn compile_gcra(
    at: &str,
    rate: Rate,
    units: u64,
    field: &str,
    max_delay_us: u64,
    p: &mut Problems,
) -> Option<Algorithm> {
    let algorithm = gcra(rate, units, max_delay_us);
    if algorithm.is_none() {
        p.add(
            format!("{at}.{field}"),
            format!("{field} is too large for rate {rate}"),
        );
    }
    algorithm
}

/// `algorithm: concurrency`: `max` requests in flight per key, each slot leased for `lease`.
fn compile_concurrency(at: &str, raw: &RawLimit, p: &mut Problems) -> Option<Algorithm> {
    let lease = duration(raw.lease.as_deref(), format!("{at}.lease"), MAX_LEASE, p)
        .unwrap_or(DEFAULT_LEASE);
    match raw.max {
        Some(max) if max >= 1 => Some(Algorithm::Concurrency {
            max,
            slot_ttl_us: lease.as_micros() as u64,
        }),
        Some(_) => {
            p.add(format!("{at}.max"), "must be at least 1");
            None
        }
        None => {
            p.add(
                format!("{at}.max"),
                "required for concurrency (requests in flight per key)",
            );
            None
        }
    }
}

/// What a request costs: fixed or from a request header, or reserved and settled by the
/// response (`cost_from_response`), which then also names how the response is priced.
fn compile_pricing(
    at: &str,
    kind: AlgorithmName,
    raw: &RawLimit,
    algorithm: Option<&Algorithm>,
    p: &mut Problems,
) -> (Option<Cost>, Option<ResponsePrice>, CostHeaders) {
    match &raw.cost_from_response {
        Some(response) if accepts(kind, "cost_from_response") => {
            match compile_response_cost(at, raw, response, algorithm, p) {
                Some((estimate, price, header)) => (
                    Some(Cost::Fixed(estimate)),
                    Some(price),
                    CostHeaders {
                        request: None,
                        response: Some(header),
                    },
                ),
                None => (None, None, CostHeaders::default()),
            }
        }
        _ => {
            let (cost, request) = compile_cost(at, raw, algorithm.map(Algorithm::capacity), p);
            let headers = CostHeaders {
                request,
                response: None,
            };
            (cost, None, headers)
        }
    }
}

/// The cost of a request to the limit at `at`, and the request header that says it, if one
/// does.
fn compile_cost(
    at: &str,
    raw: &RawLimit,
    capacity: Option<u64>,
    p: &mut Problems,
) -> (Option<Cost>, Option<HeaderName>) {
    let fixed = raw.cost.unwrap_or(1);
    if fixed == 0 {
        p.add(format!("{at}.cost"), "must be at least 1");
        return (None, None);
    }
    let too_large = |value: u64, field: &str, p: &mut Problems| match capacity {
        Some(capacity) if value > capacity => {
            p.add(
                format!("{at}.{field}"),
                format!("{field} {value} exceeds what this limit can ever admit ({capacity}): no request could ever pass"),
            );
            true
        }
        _ => false,
    };
    match (&raw.cost_header, raw.cost_max) {
        (None, None) => (
            (!too_large(fixed, "cost", p)).then_some(Cost::Fixed(fixed)),
            None,
        ),
        (None, Some(_)) => {
            p.add(format!("{at}.cost_max"), "applies only with cost_header");
            (None, None)
        }
        (Some(_), None) => {
            p.add(
                format!("{at}.cost_max"),
                "required with cost_header: the largest cost a request may claim",
            );
            (None, None)
        }
        (Some(header), Some(max)) => {
            let name = header_name(header, &format!("{at}.cost_header"), p);
            if max == 0 || fixed > max {
                p.add(
                    format!("{at}.cost_max"),
                    format!("must be at least 1 and at least cost ({fixed})"),
                );
                return (None, None);
            }
            if too_large(max, "cost_max", p) || name.is_none() {
                return (None, None);
            }
            let cost = Cost::Requested {
                max,
                default: fixed,
            };
            (Some(cost), name)
        }
    }
}

/// A header name, or a problem at `at`.
fn header_name(text: &str, at: &str, p: &mut Problems) -> Option<HeaderName> {
    HeaderName::from_bytes(text.as_bytes())
        .map_err(|_| p.add(at, format!("invalid header name {text:?}")))
        .ok()
}

/// `cost_from_response: { header, estimate, max }`: the estimate each request reserves (and
/// must find left), the header or trailer that reports the real cost, and the most one response
/// is charged (default: the limit's capacity). Settling gives back and charges exactly, which
/// GCRA (without shaping) and the fixed window can; leased units are spent before any response.
fn compile_response_cost(
    at: &str,
    raw: &RawLimit,
    response: &RawResponseCost,
    algorithm: Option<&Algorithm>,
    p: &mut Problems,
) -> Option<(u64, ResponsePrice, HeaderName)> {
    let at = format!("{at}.cost_from_response");
    let conflicts = response_cost_conflicts(raw, algorithm);
    let conflicting = !conflicts.is_empty();
    for conflict in conflicts {
        p.add(at.clone(), conflict);
    }
    let header = match response.header.as_deref() {
        Some(text) => header_name(text, &format!("{at}.header"), p),
        None => {
            p.add(
                format!("{at}.header"),
                "required: the response header or trailer that reports the cost, e.g. x-usage-tokens",
            );
            None
        }
    };
    let (estimate, max) = compile_response_bounds(&at, response, algorithm?, p)?;
    let header = header?;
    (!conflicting).then_some((estimate, ResponsePrice { max }, header))
}

/// What `cost_from_response` does not combine with: another cost, leases, shaping.
fn response_cost_conflicts(raw: &RawLimit, algorithm: Option<&Algorithm>) -> Vec<String> {
    let mut conflicts = Vec::new();
    for (field, set) in [
        ("cost", raw.cost.is_some()),
        ("cost_header", raw.cost_header.is_some()),
        ("cost_max", raw.cost_max.is_some()),
    ] {
        if set {
            conflicts.push(format!(
                "does not combine with {field}: the request's cost is cost_from_response.estimate"
            ));
        }
    }
    if matches!(raw.mode, Some(Spelled::Known(LimitMode::Leased))) {
        conflicts.push(
            "does not combine with mode: leased (a lease is spent before any response)".into(),
        );
    }
    if let Some(Algorithm::Gcra { max_delay_us, .. }) = algorithm {
        if *max_delay_us > 0 {
            conflicts
                .push("does not combine with max_delay (a held request is not settled)".into());
        }
    }
    conflicts
}

/// `cost_from_response.estimate` (default 1) and `.max` (default the capacity): the estimate
/// must be admissible, and the largest charge exact in Lua doubles.
fn compile_response_bounds(
    at: &str,
    response: &RawResponseCost,
    algorithm: &Algorithm,
    p: &mut Problems,
) -> Option<(u64, u64)> {
    let capacity = algorithm.capacity();
    let estimate = response.estimate.unwrap_or(1);
    if !(1..=capacity).contains(&estimate) {
        p.add(
            format!("{at}.estimate"),
            format!(
                "must be between 1 and what this limit can ever admit ({capacity}), got {estimate}"
            ),
        );
        return None;
    }
    // A charge moves a GCRA key on by max × emission: keep it exact in Lua doubles.
    let per_unit_us = match *algorithm {
        Algorithm::Gcra { emission_us, .. } => emission_us,
        _ => 1,
    };
    let largest = MAX_TOLERANCE_US / per_unit_us;
    let max = response.max.unwrap_or(capacity);
    if !(estimate..=largest).contains(&max) {
        p.add(
            format!("{at}.max"),
            format!("must be at least the estimate ({estimate}) and at most {largest} for this rate, got {max}"),
        );
        return None;
    }
    Some((estimate, max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn limit(yaml: &str) -> (Option<Limit>, Vec<String>) {
        let (compiled, problems) = problems_of(yaml, |raw: RawLimit, p: &mut Problems| {
            compile_limit("routes[0].limits[0]", raw, None, p)
        });
        (compiled.map(|(limit, _, _)| limit), problems)
    }

    #[test]
    fn a_gcra_limit_compiles_to_its_emission_interval_and_tolerance() {
        let (compiled, problems) = limit("{ name: api, rate: 10/s, burst: 4 }");
        assert!(problems.is_empty(), "{problems:?}");
        let compiled = compiled.unwrap();
        assert_eq!(
            compiled.algorithm,
            Algorithm::Gcra {
                emission_us: 100_000,
                tolerance_us: 500_000,
                max_delay_us: 0
            }
        );
        assert_eq!(
            (compiled.advertised, compiled.cost),
            (Some((10, 1)), Cost::Fixed(1))
        );
    }

    #[test]
    fn a_limit_is_shown_unless_it_says_hide_and_anything_else_is_refused_at_its_path() {
        let shown = |yaml: &str| limit(yaml).0.map(|l| l.shown());
        assert_eq!(shown("{ name: a, rate: 1/s }"), Some(true));
        assert_eq!(shown("{ name: a, rate: 1/s, headers: show }"), Some(true));
        assert_eq!(shown("{ name: a, rate: 1/s, headers: hide }"), Some(false));
        let (compiled, problems) = limit("{ name: a, rate: 1/s, headers: secret }");
        assert!(compiled.is_none());
        assert_eq!(
            problems,
            ["routes[0].limits[0].headers: unknown value \"secret\": use show or hide"]
        );
    }

    #[test]
    fn a_calendar_quota_names_its_unit_and_zone_and_each_mistake_is_reported() {
        let (compiled, problems) =
            limit("{ name: q, algorithm: calendar, rate: 100000/month, time_zone: Europe/Berlin }");
        assert!(problems.is_empty(), "{problems:?}");
        let compiled = compiled.unwrap();
        assert_eq!(compiled.advertised, Some((100_000, 30 * 86_400)));
        assert_eq!(
            compiled.algorithm.state_meaning(),
            "calendar:month@Europe/Berlin"
        );
        let (utc, _) = limit("{ name: q, algorithm: calendar, rate: 5/week }");
        assert_eq!(utc.unwrap().algorithm.state_meaning(), "calendar:week@UTC");
        for (yaml, problem) in [
            (
                "{ name: q, algorithm: calendar, rate: 5/d }",
                "routes[0].limits[0].rate: invalid rate \"5/d\": unknown calendar unit \"d\": use day, week, month or year",
            ),
            (
                "{ name: q, algorithm: calendar }",
                "routes[0].limits[0].rate: required, e.g. 100000/month",
            ),
            (
                "{ name: q, algorithm: calendar, rate: 5/day, time_zone: Europe/Atlantis }",
                "routes[0].limits[0].time_zone: unknown time zone \"Europe/Atlantis\": use an IANA name such as UTC or Europe/Berlin",
            ),
            (
                "{ name: q, rate: 5/s, time_zone: UTC }",
                "routes[0].limits[0].time_zone: does not apply to algorithm gcra",
            ),
            (
                "{ name: q, algorithm: sliding_log, rate: 5/s, mode: leased }",
                "routes[0].limits[0].mode: leased applies to gcra, token_bucket, leaky_bucket (without max_delay), fixed_window and calendar",
            ),
        ] {
            assert_eq!(limit(yaml).1, [problem], "{yaml}");
        }
    }

    /// Keys keep their fingerprint where the stored state keeps its meaning (quota continuity
    /// across reloads and plans), and change where it would not.
    #[test]
    fn the_fingerprint_follows_what_the_state_means_not_the_count() {
        let key = |yaml: &str| fingerprinted("l", &limit(yaml).0.unwrap().algorithm);
        let same = [
            (
                "{ name: l, algorithm: fixed_window, rate: 100/d }",
                "{ name: l, algorithm: fixed_window, rate: 10/d }",
            ),
            (
                "{ name: l, algorithm: sliding_window, rate: 100/h }",
                "{ name: l, algorithm: sliding_window, rate: 3/h }",
            ),
            (
                "{ name: l, algorithm: sliding_log, rate: 100/h }",
                "{ name: l, algorithm: sliding_log, rate: 3/h }",
            ),
            (
                "{ name: l, rate: 10/s, burst: 20 }",
                "{ name: l, rate: 10/s, burst: 2, max_delay: 1s }",
            ),
            (
                "{ name: l, rate: 10/s }",
                "{ name: l, algorithm: token_bucket, rate: 10/s, capacity: 5 }",
            ),
            (
                "{ name: l, algorithm: concurrency, max: 5 }",
                "{ name: l, algorithm: concurrency, max: 1, lease: 5s }",
            ),
            (
                "{ name: l, algorithm: calendar, rate: 9/month }",
                "{ name: l, algorithm: calendar, rate: 1/month, time_zone: UTC }",
            ),
        ];
        for (a, b) in same {
            assert_eq!(key(a), key(b), "{a} and {b}");
        }
        let different = [
            (
                "{ name: l, algorithm: fixed_window, rate: 100/d }",
                "{ name: l, algorithm: fixed_window, rate: 100/h }",
            ),
            (
                "{ name: l, algorithm: fixed_window, rate: 10/h }",
                "{ name: l, algorithm: sliding_window, rate: 10/h }",
            ),
            ("{ name: l, rate: 10/s }", "{ name: l, rate: 20/s }"),
            (
                "{ name: l, algorithm: calendar, rate: 9/month }",
                "{ name: l, algorithm: calendar, rate: 9/day }",
            ),
            (
                "{ name: l, algorithm: calendar, rate: 9/month }",
                "{ name: l, algorithm: calendar, rate: 9/month, time_zone: Asia/Tokyo }",
            ),
        ];
        for (a, b) in different {
            assert_ne!(key(a), key(b), "{a} and {b}");
        }
    }

    #[test]
    fn parameters_of_other_algorithms_and_unpayable_costs_are_refused() {
        let (compiled, problems) =
            limit("{ name: w, algorithm: fixed_window, rate: 3/s, burst: 2, max: 1, cost: 4 }");
        assert!(compiled.is_none());
        assert_eq!(
            problems,
            [
                "routes[0].limits[0].burst: does not apply to algorithm fixed_window",
                "routes[0].limits[0].max: does not apply to algorithm fixed_window",
                "routes[0].limits[0].cost: cost 4 exceeds what this limit can ever admit (3): no request could ever pass",
            ]
        );
    }

    #[test]
    fn leases_splits_and_concurrency_are_checked() {
        let (_, problems) = limit("{ name: c, algorithm: concurrency, split: 2, mode: leased }");
        assert_eq!(
            problems,
            ["routes[0].limits[0].max: required for concurrency (requests in flight per key)",]
        );
        let (_, problems) =
            limit("{ name: s, algorithm: sliding_window, rate: 10/s, mode: leased }");
        assert_eq!(
            problems,
            ["routes[0].limits[0].mode: leased applies to gcra, token_bucket, leaky_bucket (without max_delay), fixed_window and calendar"]
        );
        let (compiled, problems) =
            limit("{ name: h, algorithm: fixed_window, rate: 100/m, mode: leased, split: 4 }");
        assert!(problems.is_empty(), "{problems:?}");
        let leased = compiled.unwrap();
        assert_eq!(
            leased.leased,
            Some(Leasing {
                max_units: 2,
                min_units: 1
            }),
            "a tenth of the shard's 25"
        );
    }

    #[test]
    fn with_no_mode_a_limit_leases_where_leases_apply_and_pay() {
        let leasing = |text: &str| {
            let (compiled, problems) = limit(text);
            assert!(problems.is_empty(), "{text}: {problems:?}");
            compiled.unwrap().leased
        };
        let auto = |max_units| {
            Some(Leasing {
                max_units,
                min_units: AUTO_MIN_UNITS,
            })
        };
        assert_eq!(leasing("{ name: g, rate: 1000/s, burst: 499 }"), auto(50));
        assert_eq!(
            leasing("{ name: w, algorithm: fixed_window, rate: 400/m }"),
            auto(40)
        );
        assert_eq!(
            leasing("{ name: q, algorithm: calendar, rate: 100000/month }"),
            auto(10_000)
        );
        assert_eq!(
            leasing("{ name: l, rate: 1000/s, burst: 99, mode: auto, lease_units: 7 }"),
            auto(7)
        );
        // Exact where a lease could not pay (L below AUTO_MIN_UNITS), could not lapse or be
        // given back exactly, or is spent before the response that prices it.
        for exact in [
            "{ name: small, rate: 30/m }",
            "{ name: shaped, rate: 100/s, max_delay: 1s }",
            "{ name: s, algorithm: sliding_window, rate: 1000/s }",
            "{ name: c, algorithm: concurrency, max: 100 }",
            "{ name: t, rate: 1000/m, cost_from_response: { header: x-usage-tokens } }",
            "{ name: e, rate: 1000/s, mode: exact }",
            "{ name: daily, rate: 10000/d, burst: 9999 }",
        ] {
            assert_eq!(leasing(exact), None, "{exact}");
        }
        // A GCRA quota (its burst spans an hour or more) is leased only when asked for.
        assert_eq!(
            leasing("{ name: daily, rate: 10000/d, burst: 9999, mode: leased }"),
            Some(Leasing {
                max_units: 1000,
                min_units: 1
            })
        );
        let (_, problems) = limit("{ name: e, rate: 1000/s, mode: exact, lease_units: 5 }");
        assert_eq!(
            problems,
            ["routes[0].limits[0].lease_units: applies only with mode: leased or auto"]
        );
        let (_, problems) =
            limit("{ name: s, algorithm: sliding_window, rate: 1000/s, lease_units: 5 }");
        assert_eq!(
            problems,
            ["routes[0].limits[0].lease_units: applies only to a limit that can be leased: gcra, token_bucket, leaky_bucket (without max_delay), fixed_window or calendar, not priced by the response"]
        );
    }

    #[test]
    fn a_local_limit_is_counted_in_process_never_leased_and_gives_back_exactly() {
        let (compiled, problems) = limit("{ name: g, rate: 1000/s, scope: local }");
        assert!(problems.is_empty(), "{problems:?}");
        let compiled = compiled.unwrap();
        assert_eq!(compiled.scope, Scope::Local);
        assert_eq!(compiled.leased, None, "mode auto stays exact in-process");
        let (compiled, _) = limit("{ name: g, rate: 1000/s }");
        assert_eq!(compiled.unwrap().scope, Scope::Shared, "shared by default");
        let (_, problems) =
            limit("{ name: s, algorithm: sliding_window, rate: 10/s, scope: local }");
        assert_eq!(
            problems,
            ["routes[0].limits[0].scope: local applies to gcra, fixed_window and concurrency, not sliding_window: a local limit's units go back when a shared limit denies, and only those give them back exactly"]
        );
        let (_, problems) =
            limit("{ name: g, rate: 1000/s, scope: local, mode: leased, lease_units: 5 }");
        assert_eq!(
            problems,
            [
                "routes[0].limits[0].mode: a local limit is counted in-process by each gateway: it is never leased",
                "routes[0].limits[0].lease_units: a local limit is counted in-process by each gateway: it is never leased",
            ]
        );
        let (_, problems) = limit("{ name: g, rate: 1000/s, burst: 10, scope: local, split: 4 }");
        assert_eq!(
            problems,
            ["routes[0].limits[0].split: spreads a hot key over Redis Cluster's slots: a local limit is counted in-process"]
        );
        let (_, problems) = limit("{ name: g, rate: 10/s, scope: nearby }");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("routes[0].limits[0].scope: unknown scope \"nearby\""));
    }

    #[test]
    fn a_limit_priced_by_the_response_reserves_its_estimate() {
        let (compiled, problems) = limit(
            "{ name: t, algorithm: token_bucket, rate: 1000/m, capacity: 1000, cost_from_response: { header: x-usage-tokens, estimate: 50, max: 4000 } }",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let compiled = compiled.unwrap();
        assert_eq!(compiled.cost, Cost::Fixed(50));
        assert_eq!(
            compiled.priced_by_response,
            Some(ResponsePrice { max: 4000 })
        );
        let (compiled, problems) = limit(
            "{ name: t, algorithm: fixed_window, rate: 500/h, cost_from_response: { header: x-cost } }",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let compiled = compiled.unwrap();
        assert_eq!(compiled.cost, Cost::Fixed(1), "the estimate defaults to 1");
        assert_eq!(
            compiled.priced_by_response.unwrap().max,
            500,
            "max: the capacity"
        );
    }

    #[test]
    fn a_limit_priced_by_the_response_is_checked() {
        let (compiled, problems) = limit(
            "{ name: t, rate: 10/s, burst: 9, max_delay: 1s, cost: 2, cost_from_response: { estimate: 30, max: 1 } }",
        );
        assert!(compiled.is_none());
        assert_eq!(
            problems,
            [
                "routes[0].limits[0].cost_from_response: does not combine with cost: the request's cost is cost_from_response.estimate",
                "routes[0].limits[0].cost_from_response: does not combine with max_delay (a held request is not settled)",
                "routes[0].limits[0].cost_from_response.header: required: the response header or trailer that reports the cost, e.g. x-usage-tokens",
                "routes[0].limits[0].cost_from_response.estimate: must be between 1 and what this limit can ever admit (20), got 30",
            ]
        );
        let (_, problems) = limit(
            "{ name: t, rate: 10/s, mode: leased, cost_from_response: { header: 'bad header', max: 0 } }",
        );
        assert_eq!(
            problems,
            [
                "routes[0].limits[0].cost_from_response: does not combine with mode: leased (a lease is spent before any response)",
                "routes[0].limits[0].cost_from_response.header: invalid header name \"bad header\"",
                "routes[0].limits[0].cost_from_response.max: must be at least the estimate (1) and at most 11258999068 for this rate, got 0",
            ]
        );
        let (_, problems) = limit(
            "{ name: t, algorithm: sliding_window, rate: 10/s, cost_from_response: { header: x-cost } }",
        );
        assert_eq!(
            problems,
            ["routes[0].limits[0].cost_from_response: does not apply to algorithm sliding_window"]
        );
    }
}
