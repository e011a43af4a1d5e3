//! A route's limits per plan and per consumer (`plans:` / `consumers:` of each limit) →
//! [`Tiers`]: one compiled set of limits for each combination callers can meet, the same
//! combination compiled once.
//!
//! For a caller on plan P (or none) who is consumer C, each limit takes, most specific first:
//! its `consumers: { C: ... }` entry, its `plans: { P: ... }` entry, the limit as written. An
//! entry is `off` (the limit does not apply) or the parameters that differ.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::identity::known_plans;
use super::problem::Problems;
use super::raw::{RawEntry, RawLimit, RawParams};
use crate::caller::consumers::{PlanSlot, Plans};
use crate::limiter::regions::Regions;
use crate::limiter::{Limit, LimitRules, PolicyLimit};
use crate::route::keys::{KeySpec, RouteKeys};
use crate::route::pricing::CostHeaders;
use crate::route::tiers::{policy_header, Position, Tier, TierId, TierLimit, Tiers};

/// Longest consumer id a consumer entry may name (ids from credentials are bounded the same).
const MAX_CONSUMER_ID: usize = crate::caller::consumers::MAX_CONSUMER_ID;
/// The most tiers one route may compile to (plan and consumer entries multiply them).
const MAX_TIERS: usize = 1024;

/// One limit compiled for one kind of caller.
#[derive(Clone)]
struct Compiled {
    limit: Limit,
    spec: KeySpec,
    headers: CostHeaders,
}

/// What one limit is for one kind of caller: as written, one of its entries, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Pick {
    Written,
    Entry(usize),
    Off,
}

/// One `plans:` or `consumers:` entry of a limit.
#[derive(Clone)]
enum Entry {
    Off,
    Params(Box<Compiled>),
    /// It did not compile (reported); stands as the limit as written.
    Broken,
}

/// A limit as written, and each of its entries compiled.
#[derive(Clone)]
struct Variants {
    written: Compiled,
    entries: Vec<Entry>,
    /// Entry index per plan.
    by_plan: HashMap<usize, usize>,
    by_consumer: HashMap<Arc<str>, usize>,
}

/// What every tier of a route shares.
pub struct TierSettings<'a> {
    pub at: &'a str,
    pub plans: &'a Plans,
    pub instances: u64,
    pub failure_mode: crate::limiter::FailureMode,
    pub deadline: Option<std::time::Duration>,
    pub shadow: bool,
    pub rate_limit_headers: bool,
    pub keys: &'a RouteKeys,
}

/// One limit of a route, as written and per plan and consumer. A common limit's are compiled
/// once and copied into each route that uses it.
#[derive(Clone)]
pub struct LimitVariants(Variants);

impl LimitVariants {
    pub fn written(&self) -> (&Limit, &KeySpec) {
        (&self.0.written.limit, &self.0.written.spec)
    }

    /// The same limit as a common one: every variant keyed as one bucket across routes.
    pub fn common(mut self) -> LimitVariants {
        self.0.written.spec.common = true;
        for entry in &mut self.0.entries {
            if let Entry::Params(compiled) = entry {
                compiled.spec.common = true;
            }
        }
        self
    }
}

/// Compiles a limit and its entries; `None` when it does not compile (reported).
pub(super) fn compile_variants(
    at: &str,
    mut raw: RawLimit,
    plans: &Plans,
    regions: Option<&Regions>,
    p: &mut Problems,
) -> Option<LimitVariants> {
    let by_plan_raw = raw.plans.take().unwrap_or_default();
    let by_consumer_raw = raw.consumers.take().unwrap_or_default();
    let written = super::limits::compile_limit(at, raw.clone(), regions, p).map(compiled);
    let mut entries = Vec::new();
    let mut by_plan = HashMap::new();
    let mut by_consumer = HashMap::new();
    // The plans and consumers named are checked whether the limit as written compiled or not.
    for (name, entry) in by_plan_raw {
        let entry_at = format!("{at}.plans.{name}");
        let Some(plan) = plans.find(&name) else {
            p.add(
                entry_at,
                format!("unknown plan {name:?}: {}", known_plans(plans)),
            );
            continue;
        };
        // An entry inherits what the limit as written says: compiled only when that compiled
        // (else its problems would be told again, under the entry).
        if written.is_some() {
            by_plan.insert(usize::from(plan.0), entries.len());
            entries.push(compile_entry(&entry_at, &raw, entry, regions, p));
        }
    }
    for (name, entry) in by_consumer_raw {
        let entry_at = format!("{at}.consumers.{name}");
        if name.is_empty() || name.len() > MAX_CONSUMER_ID {
            p.add(
                entry_at,
                format!("a consumer id has 1 to {MAX_CONSUMER_ID} bytes"),
            );
            continue;
        }
        if written.is_some() {
            by_consumer.insert(name.as_str().into(), entries.len());
            entries.push(compile_entry(&entry_at, &raw, entry, regions, p));
        }
    }
    let mut variants = Variants {
        written: written?,
        entries,
        by_plan,
        by_consumer,
    };
    lease_all_or_none(&mut variants);
    Some(LimitVariants(variants))
}

/// Leased in every tier or in none: every tier of a limit counts on the same key, and a tier
/// that gives units back mid-timeline (a shaped request whose client left, a response cheaper
/// than its estimate) must not move a GCRA key's TAT back under units another gateway holds.
/// So a limit some tier shapes or prices by the response is decided exactly in all of them.
fn lease_all_or_none(variants: &mut Variants) {
    let gives_back = |limit: &Limit| {
        limit.priced_by_response.is_some()
            || matches!(
                limit.algorithm,
                crate::limiter::Algorithm::Gcra { max_delay_us, .. } if max_delay_us > 0
            )
    };
    let exact = gives_back(&variants.written.limit)
        || variants.entries.iter().any(|entry| match entry {
            Entry::Params(compiled) => gives_back(&compiled.limit),
            Entry::Off | Entry::Broken => false,
        });
    if !exact {
        return;
    }
    variants.written.limit.leased = None;
    for entry in &mut variants.entries {
        if let Entry::Params(compiled) = entry {
            compiled.limit.leased = None;
        }
    }
}

fn compiled((limit, spec, headers): (Limit, KeySpec, CostHeaders)) -> Compiled {
    Compiled {
        limit,
        spec,
        headers,
    }
}

/// One entry: `off`, or the limit with the entry's parameters in place of its own.
fn compile_entry(
    at: &str,
    written: &RawLimit,
    entry: RawEntry,
    regions: Option<&Regions>,
    p: &mut Problems,
) -> Entry {
    let RawEntry::Params(params) = entry else {
        return Entry::Off;
    };
    let RawParams {
        rate,
        burst,
        capacity,
        max_delay,
        max,
    } = params;
    let mut raw = written.clone();
    raw.rate = rate.or(raw.rate);
    raw.burst = burst.or(raw.burst);
    raw.capacity = capacity.or(raw.capacity);
    raw.max_delay = max_delay.or(raw.max_delay);
    raw.max = max.or(raw.max);
    match super::limits::compile_limit(at, raw, regions, p) {
        Some(parts) => Entry::Params(Box::new(compiled(parts))),
        // Reported at the entry's path; the config is refused.
        None => Entry::Broken,
    }
}

/// The tiers of a route whose limits compiled to `limits`.
pub fn build(limits: &[LimitVariants], settings: &TierSettings<'_>, p: &mut Problems) -> Tiers {
    let mut builder = Builder {
        limits,
        settings,
        tiers: Vec::new(),
        known: HashMap::new(),
    };
    let written = vec![Pick::Written; limits.len()];
    builder.tier(&written);
    let plans = settings.plans.len();
    let by_plan: Vec<TierId> = PlanSlot::all(plans)
        .map(|slot| builder.tier(&builder.picks(slot, None)))
        .collect();
    let consumers: BTreeSet<&Arc<str>> =
        limits.iter().flat_map(|l| l.0.by_consumer.keys()).collect();
    let by_consumer = consumers
        .into_iter()
        .map(|consumer| {
            let tiers: Box<[TierId]> = PlanSlot::all(plans)
                .map(|slot| builder.tier(&builder.picks(slot, Some(consumer))))
                .collect();
            (Arc::clone(consumer), tiers)
        })
        .collect();
    if builder.tiers.len() > MAX_TIERS {
        p.add(
            format!("{}.limits", settings.at),
            format!(
                "plans and consumers make {} sets of limits: at most {MAX_TIERS}",
                builder.tiers.len()
            ),
        );
    }
    Tiers::new(builder.tiers, by_plan, by_consumer)
}

struct Builder<'a> {
    limits: &'a [LimitVariants],
    settings: &'a TierSettings<'a>,
    tiers: Vec<Tier>,
    known: HashMap<Vec<Pick>, TierId>,
}

impl Builder<'_> {
    /// What each limit is for a caller in plan slot `slot` who is `consumer`.
    fn picks(&self, slot: PlanSlot, consumer: Option<&Arc<str>>) -> Vec<Pick> {
        self.limits
            .iter()
            .map(|LimitVariants(v)| {
                let own = consumer.and_then(|c| v.by_consumer.get(c));
                let plan = slot
                    .plan()
                    .and_then(|plan| v.by_plan.get(&usize::from(plan.0)));
                match own.or(plan).map(|&entry| (entry, &v.entries[entry])) {
                    Some((_, Entry::Off)) => Pick::Off,
                    Some((entry, Entry::Params(_))) => Pick::Entry(entry),
                    Some((_, Entry::Broken)) | None => Pick::Written,
                }
            })
            .collect()
    }

    /// The tier of `picks`, compiled the first time it is asked for.
    fn tier(&mut self, picks: &[Pick]) -> TierId {
        if let Some(&id) = self.known.get(picks) {
            return id;
        }
        let id = TierId(self.tiers.len().min(usize::from(u16::MAX)) as u16);
        let tier = self.compile(picks);
        self.tiers.push(tier);
        self.known.insert(picks.to_vec(), id);
        id
    }

    fn compile(&self, picks: &[Pick]) -> Tier {
        let mut chosen: Vec<(u8, Compiled)> = Vec::new();
        for (position, pick) in picks.iter().enumerate() {
            let Some(LimitVariants(v)) = self.limits.get(position) else {
                continue;
            };
            let compiled = match (pick, pick_entry(v, *pick)) {
                (Pick::Off, _) => continue,
                (_, Some(compiled)) => compiled,
                (_, None) => &v.written,
            };
            chosen.push((position as u8, compiled.clone()));
        }
        let s = self.settings;
        let limits: Box<[Arc<TierLimit>]> = chosen
            .into_iter()
            .map(|(position, compiled)| {
                let mut limit = compiled.limit;
                limit.shadow |= s.shadow;
                Arc::new(TierLimit {
                    limit: PolicyLimit::new(limit, s.instances),
                    key: s.keys.limit_key(&compiled.spec),
                    costs: compiled.headers,
                    position: Position(position),
                })
            })
            .collect();
        let exact = || limits.iter().map(|l| &l.limit.exact);
        Tier {
            policy_header: s
                .rate_limit_headers
                .then(|| policy_header(exact()))
                .flatten(),
            rate_limit_headers: s.rate_limit_headers,
            rules: LimitRules::new(exact(), s.failure_mode, s.deadline),
            keys: s.keys.clone(),
            limits,
        }
    }
}

/// The compiled entry a pick names, if it names one.
fn pick_entry(v: &Variants, pick: Pick) -> Option<&Compiled> {
    match pick {
        Pick::Entry(entry) => match v.entries.get(entry) {
            Some(Entry::Params(compiled)) => Some(compiled),
            _ => None,
        },
        Pick::Written | Pick::Off => None,
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::caller::consumers::{test_consumer as consumer, Consumer, PlanId};
    use crate::config::problem::problems_of;
    use crate::limiter::FailureMode;
    use crate::limiter::Mismatch;
    use crate::route::keys::{KeySecret, RequestFacts, Rotation};

    fn plans() -> Plans {
        Plans::new(vec!["free".into(), "pro".into()], Some(PlanId(0)))
    }

    /// The tiers of a route with `limits` (YAML list).
    fn tiers(limits: &str) -> (Option<Tiers>, Vec<String>) {
        problems_of(limits, |raw: Vec<RawLimit>, p: &mut Problems| {
            let plans = plans();
            let compiled: Option<Vec<LimitVariants>> = raw
                .into_iter()
                .enumerate()
                .map(|(i, raw)| {
                    compile_variants(&format!("routes[0].limits[{i}]"), raw, &plans, None, p)
                })
                .collect();
            let compiled = compiled?;
            let specs: Vec<KeySpec> = compiled.iter().map(|l| l.written().1.clone()).collect();
            let keys = RouteKeys::new("t", "r", KeySecret::new("s"), &specs);
            let settings = TierSettings {
                at: "routes[0]",
                plans: &plans,
                instances: 1,
                failure_mode: FailureMode::Allow,
                deadline: None,
                shadow: false,
                rate_limit_headers: true,
                keys: &keys,
            };
            Some(build(&compiled, &settings, p))
        })
    }

    /// The `RateLimit-Policy` a caller sees: the limits it meets.
    fn policy(tiers: &Tiers, caller: Option<&Consumer>) -> String {
        let tier = tiers.get(tiers.choose(caller));
        tier.policy_header
            .as_ref()
            .map_or(String::new(), |v| v.to_str().unwrap().to_string())
    }

    const TIERED: &str = "
- name: per_consumer
  key: [consumer]
  rate: 10/m
  plans:
    pro: { rate: 100/m }
  consumers:
    acme: { rate: 1000/m }
    bob: off
- name: per_ip
  key: [client_ip]
  rate: 50/s
  plans:
    pro: off
";

    #[test]
    fn a_requests_limits_come_each_beside_its_record_and_records_of_another_length_mismatch() {
        let tiers = tiers(TIERED).0.expect("tiers");
        let tier = tiers.shared(TierId(0));
        let headers = http::HeaderMap::new();
        let carol = consumer("carol", None);
        let facts = RequestFacts {
            client_ip: std::net::Ipv4Addr::LOCALHOST.into(),
            method: "GET",
            host: "h",
            path: "/t",
            query: None,
            headers: &headers,
            route: "r",
            consumer: Some(&carol),
            claim_names: &[],
        };
        let met = tier.met(&facts, &Rotation::default()).expect("keys");
        let records = tier.records(&facts, &Rotation::default()).expect("keys");
        assert_eq!((met.len(), records.len()), (2, 2));
        for (index, met) in met.iter().enumerate() {
            assert!(
                Arc::ptr_eq(&met.limit, &tier.limits[index]),
                "its own limit"
            );
            assert_eq!(met.record, records[index]);
        }
        let mut fewer = records[..1].to_vec();
        let mismatch = Mismatch {
            at: "a tier's limits and records",
            left: 2,
            right: 1,
        };
        assert_eq!(tier.asked(&mut fewer).err(), Some(mismatch));
        assert_eq!(tier.said(&fewer).err(), Some(mismatch));
    }

    #[test]
    fn each_caller_meets_its_most_specific_limits_and_never_also_the_default() {
        let (tiers, problems) = tiers(TIERED);
        assert!(problems.is_empty(), "{problems:?}");
        let tiers = tiers.unwrap();
        let free = consumer("carol", Some(0));
        let pro = consumer("dave", Some(1));
        assert_eq!(
            policy(&tiers, None),
            "\"per_consumer\";q=10;w=60, \"per_ip\";q=50;w=1"
        );
        assert_eq!(policy(&tiers, Some(&free)), policy(&tiers, None));
        assert_eq!(
            policy(&tiers, Some(&pro)),
            "\"per_consumer\";q=100;w=60",
            "pro's own rate, and the limit pro turns off is gone"
        );
        assert_eq!(
            policy(&tiers, Some(&consumer("acme", Some(1)))),
            "\"per_consumer\";q=1000;w=60",
            "acme's entry, over pro's, and pro's per_ip off still holds"
        );
        assert_eq!(
            policy(&tiers, Some(&consumer("acme", Some(0)))),
            "\"per_consumer\";q=1000;w=60, \"per_ip\";q=50;w=1"
        );
        assert_eq!(
            policy(&tiers, Some(&consumer("bob", Some(0)))),
            "\"per_ip\";q=50;w=1"
        );
        let pro_tier = tiers.get(tiers.choose(Some(&pro)));
        let series: Vec<u8> = pro_tier.limits.iter().map(|l| l.position.0).collect();
        assert_eq!(series, [0], "places in the route's list");
    }

    #[test]
    fn a_limit_some_tier_shapes_or_prices_by_the_response_is_leased_in_no_tier() {
        let leased = |limits: &str| {
            let (tiers, problems) = tiers(limits);
            assert!(problems.is_empty(), "{problems:?}");
            let tiers = tiers.unwrap();
            [None, Some(consumer("dave", Some(1)))]
                .iter()
                .map(|caller| {
                    let tier = tiers.get(tiers.choose(caller.as_ref()));
                    tier.limits[0].limit.exact.leased.is_some()
                })
                .collect::<Vec<bool>>()
        };
        let plain = "
- name: global
  key: [route]
  rate: 1000/s
  burst: 999
  plans:
    pro: { rate: 2000/s }
";
        assert_eq!(leased(plain), [true, true], "no mode: both tiers lease");
        let shaped = "
- name: global
  key: [route]
  rate: 1000/s
  burst: 999
  plans:
    pro: { rate: 2000/s, max_delay: 1s }
";
        assert_eq!(
            leased(shaped),
            [false, false],
            "pro shapes: the key is exact"
        );
    }

    #[test]
    fn entries_name_known_plans_and_compile_like_the_limit() {
        let (_, problems) = tiers(
            "
- name: l
  rate: 10/m
  plans:
    gold: { rate: 1/s }
    pro: { rate: 0/s }
",
        );
        assert_eq!(
            problems,
            [
                "routes[0].limits[0].plans.gold: unknown plan \"gold\": the plans are free, pro",
                "routes[0].limits[0].plans.pro.rate: invalid rate \"0/s\": the request count must be at least 1",
            ]
        );
    }
}
