//! One call of the rate limit service, decided: each descriptor finds its rule, blocked
//! descriptors refuse the call (and the others are only read), a limit another matched limit
//! `replaces` drops out, and every remaining limit is decided in one policy call, all or
//! nothing. What comes out is plain Rust; `edge::rls` maps it to and from protobuf.

use smallvec::SmallVec;

use crate::exchange::meters::DomainMetrics;
use crate::limiter::{Asked, FailureMode, LimitRecord, LimitRules, Outcome, Policy, Verdict};
use crate::route::descriptors::{key, DescriptorLimit, Domain, Entry, Rule, Unit};

/// What the `rls:` section says of every domain: where its counters live and what applies
/// when the limiter cannot decide.
#[derive(Debug, Clone, Copy)]
pub struct ServiceWide<'a> {
    pub key_prefix: &'a str,
    pub secret: (u64, u64),
    pub failure_mode: FailureMode,
}

/// One descriptor of a call: its entries (inline up to 4), and the hits it adds when it says
/// (`hits_addend`).
pub struct Descriptor<'a> {
    pub entries: SmallVec<[Entry<'a>; 4]>,
    pub hits: Option<u64>,
}

/// A call's descriptors (or one status per descriptor), inline up to 4.
pub type PerDescriptor<T> = SmallVec<[T; 4]>;

/// The limit a descriptor is held to, as the answer shows it (`current_limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown<'a> {
    pub name: &'a str,
    pub requests_per_unit: u64,
    pub unit: Unit,
}

/// What the call says of one descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Status<'a> {
    pub over: bool,
    pub limit: Option<Shown<'a>>,
    /// Units left (`u32::MAX` for an unlimited descriptor).
    pub remaining: u64,
    pub reset_after_ms: Option<u64>,
    /// Its limit was decided and enforced (not shadow, not quota mode): it goes into the
    /// `RateLimit` headers.
    pub enforced: bool,
    /// Its limit's `metadata` (`rls.response_dynamic_metadata`).
    pub metadata: Option<&'a serde_json::Value>,
}

/// The call's answer: whether it is over the limit, and each descriptor's status.
pub struct RlsReply<'a> {
    pub over: bool,
    pub statuses: PerDescriptor<Status<'a>>,
}

/// One descriptor that matched a limit: its place in the call, the limit, and the call's
/// record of it (key and cost, then what the limiter said).
struct Matched<'a> {
    descriptor: usize,
    limit: &'a DescriptorLimit,
    record: LimitRecord,
}

/// The descriptors' rules: the limits to decide, and the statuses rules fix by themselves
/// (unlimited, blocked).
struct Matches<'a> {
    matched: PerDescriptor<Matched<'a>>,
    statuses: PerDescriptor<Status<'a>>,
    /// The series of the blocked rules that matched: each refused the call.
    blocked: PerDescriptor<usize>,
}

/// Decides a call of `descriptors` against `domain`; `hits` is the call's `hits_addend`. What
/// the call and each limit said is counted on `meters`, the domain's handles.
pub async fn decide<'a>(
    domain: &'a Domain,
    service: ServiceWide<'_>,
    (policy, meters): (&Policy, Option<&DomainMetrics>),
    descriptors: &[Descriptor<'_>],
    hits: u64,
) -> RlsReply<'a> {
    let mut matches = match_rules(domain, service, descriptors, hits);
    let blocked = !matches.blocked.is_empty();
    // A blocked descriptor refuses the call: the others are only read (cost 0), so nothing is
    // consumed, as with any denied call.
    if blocked {
        for m in &mut matches.matched {
            m.record.ask.cost = 0;
        }
    }
    drop_replaced(&mut matches.matched);
    let verdict = decide_limits(&mut matches.matched, service, policy).await;
    let quotas_over = every_quota_over(&matches.matched);
    let outcome = if blocked || quotas_over {
        Outcome::Limited
    } else {
        verdict.outcome
    };
    if let Some(meters) = meters {
        meters.count(outcome);
        for &series in &matches.blocked {
            meters.count_limit(series, Outcome::Limited);
        }
        for m in &matches.matched {
            if let Some(said) = m.record.outcome(&m.limit.limit.exact, &verdict) {
                meters.count_limit(m.limit.series, said);
            }
        }
    }
    RlsReply {
        over: blocked || !verdict.admitted() || quotas_over,
        statuses: statuses(matches, &verdict),
    }
}

/// envoyproxy/ratelimit's `quota_mode`: a call with quota-mode limits is refused for them only
/// when every one of them is over (their denials never stop the call's other limits: they are
/// decided as shadow limits are). A shadow quota is never over, so it keeps the call OK; one
/// that nothing decided (the failure mode answered) is not over either.
fn every_quota_over(matched: &[Matched<'_>]) -> bool {
    let mut quotas = matched.iter().filter(|m| m.limit.quota_mode).peekable();
    let over = |m: &Matched<'_>| {
        let denied = m.record.status.as_ref().is_some_and(|s| !s.allowed);
        denied && !m.limit.shadow_mode
    };
    quotas.peek().is_some() && quotas.all(over)
}

/// Each descriptor's rule: limits to decide (with their keys and costs), or a status the rule
/// fixes by itself.
fn match_rules<'a>(
    domain: &'a Domain,
    service: ServiceWide<'_>,
    descriptors: &[Descriptor<'_>],
    hits: u64,
) -> Matches<'a> {
    let mut matches = Matches {
        matched: PerDescriptor::new(),
        statuses: descriptors.iter().map(|_| Status::default()).collect(),
        blocked: PerDescriptor::new(),
    };
    for (i, descriptor) in descriptors.iter().enumerate() {
        let Some(shown) = matches.statuses.get_mut(i) else {
            continue;
        };
        let Some((rule, shared)) = domain.find(&descriptor.entries) else {
            continue;
        };
        match rule {
            Rule::Limited(limit) => {
                let key = key(
                    service.key_prefix,
                    service.secret,
                    &domain.name,
                    limit,
                    &descriptor.entries,
                    &shared,
                );
                let cost = descriptor.hits.unwrap_or(hits);
                matches.matched.push(Matched {
                    descriptor: i,
                    limit,
                    record: LimitRecord::new(key, cost),
                });
            }
            Rule::Unlimited => shown.remaining = u64::from(u32::MAX),
            Rule::Blocked { name, unit, series } => {
                matches.blocked.push(*series);
                *shown = Status {
                    over: true,
                    limit: Some(Shown {
                        name,
                        requests_per_unit: 0,
                        unit: *unit,
                    }),
                    ..Status::default()
                };
            }
        }
    }
    matches
}

/// A limit named in another matched limit's `replaces` does not apply.
fn drop_replaced(matched: &mut PerDescriptor<Matched<'_>>) {
    let replaced = |name: &str| {
        let names = |m: &Matched<'_>| m.limit.replaces.iter().any(|r| r == name);
        matched.iter().any(names)
    };
    let dropped: PerDescriptor<bool> = matched.iter().map(|m| replaced(&m.limit.name)).collect();
    if dropped.contains(&true) {
        let mut kept = dropped.iter().map(|drop| !drop);
        matched.retain(|_| kept.next().unwrap_or(true));
    }
}

/// Every matched limit decided in one policy call, all or nothing: the same decision entry as
/// a route's request, each limit compiled at load paired with the call's record of it.
async fn decide_limits(
    matched: &mut [Matched<'_>],
    service: ServiceWide<'_>,
    policy: &Policy,
) -> Verdict {
    let exact = matched.iter().map(|m| &m.limit.limit.exact);
    let rules = LimitRules::new(exact, service.failure_mode, None);
    let pairs = matched.iter_mut().map(|m| (&m.limit.limit, &mut m.record));
    let asked = &mut Asked::new(&rules, pairs);
    let verdict = policy.decide(asked).await;
    policy.finish(asked, &verdict).await;
    verdict
}

/// Each descriptor's status: what the rules fixed, then what each decided limit said.
fn statuses<'a>(matches: Matches<'a>, verdict: &Verdict) -> PerDescriptor<Status<'a>> {
    let mut statuses = matches.statuses;
    for m in &matches.matched {
        let Some(shown) = statuses.get_mut(m.descriptor) else {
            continue;
        };
        let Some(status) = &m.record.status else {
            // Nothing decided this limit (the limiter could not; the failure mode answered):
            // no limit, remaining or reset is claimed, so neither Envoy's rate limit headers
            // nor the RateLimit fields invent one ("nothing left" when nothing was counted).
            *shown = Status {
                over: verdict.outcome == Outcome::ErrorDenied,
                metadata: m.limit.metadata.as_ref(),
                ..Status::default()
            };
            continue;
        };
        // A quota-mode limit is decided as a shadow one, but its descriptor says it is over.
        let shadow = m.limit.limit.exact.shadow;
        *shown = Status {
            over: !status.allowed && !m.limit.shadow_mode,
            limit: Some(Shown {
                name: &m.limit.name,
                requests_per_unit: m.limit.requests_per_unit,
                unit: m.limit.unit,
            }),
            remaining: status.remaining,
            reset_after_ms: Some(status.reset_after_ms),
            enforced: !shadow,
            metadata: m.limit.metadata.as_ref(),
        };
    }
    statuses
}
