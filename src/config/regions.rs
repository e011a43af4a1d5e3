//! `regions:` → [`RegionsSettings`]: this gateway's region, every region's weight and the Redis
//! region sync reads its records from, the exchange period and the delay the bounds assume
//! (`limiter::regions`). Restart-only, as `redis:` is: a reload that changes it waits for a
//! graceful upgrade.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::pending::PendingChange;
use super::problem::{check_name, required_name, within, Problem, Problems};
use super::rate::parse_duration;
use super::raw::RawRegions;
use super::redis::RedisSettings;
use super::sources::Sources;
use crate::limiter::regions::{Region, Regions, MAX_REGIONS};

/// What `regions:` compiles to.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionsSettings {
    pub regions: Arc<Regions>,
    /// Every other region's Redis, by its index in the list: only read, never written.
    pub peers: Vec<(usize, RedisSettings)>,
}

/// Compiles the file's `regions:` (`raw`; `has_redis`: whether `redis:` is set) and says which
/// is in force ([`in_force`]).
pub fn compile_in_force(
    raw: Option<RawRegions>,
    (has_redis, running): (bool, Option<Option<&RegionsSettings>>),
    p: &mut Problems,
    read: &mut Sources,
) -> (Option<RegionsSettings>, Option<PendingChange>) {
    let file = raw.and_then(|raw| compile(raw, has_redis, p, read));
    in_force(file, running)
}

/// The `regions:` in force of a file whose section compiles to `file`: the file's at start
/// (`running` is `None`), those the process runs with after a reload (`Some`: region sync reads
/// them once, at start), the file's change pending until a graceful upgrade.
pub fn in_force(
    file: Option<RegionsSettings>,
    running: Option<Option<&RegionsSettings>>,
) -> (Option<RegionsSettings>, Option<PendingChange>) {
    match running {
        None => (file, None),
        Some(running) => {
            let pending = (running != file.as_ref()).then_some(PendingChange {
                path: "regions",
                values: None,
            });
            (running.cloned(), pending)
        }
    }
}

const DEFAULT_EVERY: Duration = Duration::from_secs(1);
const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(250);

/// Compiles `regions:`; `has_redis`: whether `redis:` is set (this region's Redis).
pub fn compile(
    raw: RawRegions,
    has_redis: bool,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<RegionsSettings> {
    if !has_redis {
        p.add(
            "regions",
            "needs redis: (this region's Redis, where its gateways decide)",
        );
    }
    let list = compile_list(&raw, p);
    let (this, home) = this_and_home(&raw, &list, p);
    let every = duration(
        raw.every.as_deref(),
        DEFAULT_EVERY,
        "regions.every",
        100..=60_000,
        p,
    );
    let max_delay = duration(
        raw.max_delay.as_deref(),
        DEFAULT_MAX_DELAY,
        "regions.max_delay",
        0..=60_000,
        p,
    );
    let seed_percent = within(
        raw.seed_percent.unwrap_or(1),
        1..=50,
        "regions.seed_percent",
        p,
    );
    let peers = compile_peers(raw, this, p, read);
    let regions = Regions {
        this: this?,
        list,
        every: every?,
        max_delay: max_delay?,
        home: home?,
        seed_percent: seed_percent?,
    };
    if regions.list.len() < 2 {
        return None;
    }
    Some(RegionsSettings {
        regions: Arc::new(regions),
        peers: peers?,
    })
}

/// `regions.this` (required) and `regions.home` (the first listed unless said): each one of
/// `list`'s names.
fn this_and_home(
    raw: &RawRegions,
    list: &[Region],
    p: &mut Problems,
) -> (Option<usize>, Option<usize>) {
    let names: Vec<&str> = list.iter().map(|r| &*r.name).collect();
    let find = |name: &Option<String>, at: &str, p: &mut Problems| -> Option<usize> {
        let name = name.as_deref()?;
        let found = names.iter().position(|n| *n == name);
        if found.is_none() {
            p.add(
                at,
                format!("{name:?} is not in regions.list ({})", names.join(", ")),
            );
        }
        found
    };
    let this = required_name(raw.this.clone(), "regions.this", p)
        .and_then(|_| find(&raw.this, "regions.this", p));
    let home = match raw.home {
        Some(_) => find(&raw.home, "regions.home", p),
        None => Some(0),
    };
    (this, home)
}

/// `regions.list`: 2 to [`MAX_REGIONS`] regions, each named once, weights of at least 1.
fn compile_list(raw: &RawRegions, p: &mut Problems) -> Vec<Region> {
    if !(2..=MAX_REGIONS).contains(&raw.list.len()) {
        p.add(
            "regions.list",
            format!("lists 2 to {MAX_REGIONS} regions, every region's configuration the same list"),
        );
    }
    let mut seen = HashSet::new();
    let mut list = Vec::new();
    for (i, region) in raw.list.iter().enumerate() {
        let at = format!("regions.list[{i}]");
        let Some(name) = required_name(region.name.clone(), &format!("{at}.name"), p) else {
            continue;
        };
        if !check_name(&name, &format!("{at}.name"), p) {
            continue;
        }
        if !seen.insert(name.clone()) {
            p.add(format!("{at}.name"), format!("duplicate region {name:?}"));
        }
        let weight = within(
            region.weight.unwrap_or(1),
            1..=1000,
            &format!("{at}.weight"),
            p,
        );
        list.push(Region {
            name: name.into(),
            weight: weight.unwrap_or(1),
        });
    }
    list
}

/// Every region's `redis:` but this one's (which is `redis:` itself; one written here is not
/// used), its problems told under its own path.
fn compile_peers(
    raw: RawRegions,
    this: Option<usize>,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<Vec<(usize, RedisSettings)>> {
    let mut peers = Vec::new();
    let mut complete = true;
    for (i, region) in raw.list.into_iter().enumerate() {
        if Some(i) == this {
            continue;
        }
        let at = format!("regions.list[{i}]");
        let Some(redis) = region.redis else {
            p.add(
                format!("{at}.redis"),
                "required for every region but this one: region sync reads its records there",
            );
            complete = false;
            continue;
        };
        let mut inner = Problems::default();
        let settings = super::redis::compile(redis, &mut inner, read);
        for Problem { path, message } in inner.0 {
            p.add(format!("{at}.{path}"), message);
        }
        peers.push((i, settings));
    }
    complete.then_some(peers)
}

fn duration(
    text: Option<&str>,
    default: Duration,
    at: &str,
    range_ms: std::ops::RangeInclusive<u64>,
    p: &mut Problems,
) -> Option<Duration> {
    let value = match text {
        Some(text) => parse_duration(text).map_err(|e| p.add(at, e)).ok()?,
        None => default,
    };
    let ms = u64::try_from(value.as_millis()).unwrap_or(u64::MAX);
    within(ms, range_ms, at, p).map(|_| value)
}
