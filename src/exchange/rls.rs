//! One call of the rate limit service, decided: each descriptor finds its rule, blocked
//! descriptors refuse the call (and the others are only read), a limit another matched limit
//! `replaces` drops out, and every remaining limit is decided in one policy call, all or
//! nothing. What comes out is plain Rust; `edge::rls` maps it to and from protobuf.

use std::borrow::Cow;
use std::collections::HashSet;

use crate::limiter::{Ask, Asks, FailureMode, LimitSet, LimitStatus, Outcome, Policy, Verdict};
use crate::route::descriptors::{key, DescriptorLimit, Domain, Entry, Rule, Unit};

/// What the `rls:` section says of every domain: where its counters live and how this gateway
/// shares them.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub key_prefix: &'a str,
    pub secret: (u64, u64),
    pub instances: u64,
    pub failure_mode: FailureMode,
}

/// One descriptor of a call: its entries, and the hits it adds when it says (`hits_addend`).
pub struct Descriptor<'a> {
    pub entries: Vec<Entry<'a>>,
    pub hits: Option<u64>,
}

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
    /// Its limit was decided and enforced (not shadow): it goes into the `RateLimit` headers.
    pub enforced: bool,
}

/// The call's answer: whether it is over the limit, each descriptor's status, and what each
/// limit said (for `sluice_rls_*` metrics).
pub struct RlsReply<'a> {
    pub over: bool,
    /// The call's `decision` label.
    pub outcome: Outcome,
    pub statuses: Vec<Status<'a>>,
    pub limit_outcomes: Vec<(&'a str, Outcome)>,
}

/// One descriptor that matched a limit: its place in the call, the limit, its key and cost.
struct Matched<'a> {
    descriptor: usize,
    limit: &'a DescriptorLimit,
    ask: Ask,
}

/// The descriptors' rules: the limits to decide, and the statuses rules fix by themselves
/// (unlimited, blocked).
struct Matches<'a> {
    matched: Vec<Matched<'a>>,
    statuses: Vec<Status<'a>>,
    /// Names of the blocked rules that matched: each refused the call.
    blocked: Vec<&'a str>,
}

/// Decides a call of `descriptors` against `domain`; `hits` is the call's `hits_addend`.
pub async fn decide<'a>(
    domain: &'a Domain,
    scope: Scope<'_>,
    policy: &Policy,
    descriptors: &[Descriptor<'_>],
    hits: u64,
) -> RlsReply<'a> {
    let mut matches = match_rules(domain, scope, descriptors, hits);
    let blocked = !matches.blocked.is_empty();
    // A blocked descriptor refuses the call: the others are only read (cost 0), so nothing is
    // consumed, as with any denied call.
    if blocked {
        for m in &mut matches.matched {
            m.ask.cost = 0;
        }
    }
    drop_replaced(&mut matches.matched);
    let (set, verdict) = decide_limits(&matches.matched, scope, policy).await;
    let mut limit_outcomes: Vec<(&str, Outcome)> = matches
        .blocked
        .iter()
        .map(|name| (*name, Outcome::Limited))
        .collect();
    for (index, outcome) in Outcome::per_limit(set.limits(), &verdict) {
        limit_outcomes.push((matches.matched[index].limit.name.as_str(), outcome));
    }
    let statuses = statuses(matches, &verdict);
    RlsReply {
        over: blocked || !verdict.admitted(),
        outcome: if blocked {
            Outcome::Limited
        } else {
            verdict.outcome
        },
        statuses,
        limit_outcomes,
    }
}

/// Each descriptor's rule: limits to decide (with their keys and costs), or a status the rule
/// fixes by itself.
fn match_rules<'a>(
    domain: &'a Domain,
    scope: Scope<'_>,
    descriptors: &[Descriptor<'_>],
    hits: u64,
) -> Matches<'a> {
    let mut matches = Matches {
        matched: Vec::new(),
        statuses: vec![Status::default(); descriptors.len()],
        blocked: Vec::new(),
    };
    for (i, descriptor) in descriptors.iter().enumerate() {
        match domain.rule(&descriptor.entries) {
            Some(Rule::Limited(limit)) => {
                let key = key(
                    scope.key_prefix,
                    scope.secret,
                    &domain.name,
                    limit,
                    &descriptor.entries,
                );
                let cost = descriptor.hits.unwrap_or(hits);
                matches.matched.push(Matched {
                    descriptor: i,
                    limit,
                    ask: Ask { key, cost },
                });
            }
            Some(Rule::Unlimited) => matches.statuses[i].remaining = u64::from(u32::MAX),
            Some(Rule::Blocked { name, unit }) => {
                matches.blocked.push(name);
                matches.statuses[i] = Status {
                    over: true,
                    limit: Some(Shown {
                        name,
                        requests_per_unit: 0,
                        unit: *unit,
                    }),
                    ..Status::default()
                };
            }
            None => {}
        }
    }
    matches
}

/// A limit named in another matched limit's `replaces` does not apply.
fn drop_replaced(matched: &mut Vec<Matched<'_>>) {
    let replaced: HashSet<&str> = matched
        .iter()
        .flat_map(|m| m.limit.replaces.iter().map(String::as_str))
        .collect();
    if !replaced.is_empty() {
        matched.retain(|m| !replaced.contains(m.limit.name.as_str()));
    }
}

/// Every matched limit decided in one policy call, all or nothing. A call that matched one
/// limit takes that rule's own precompiled set; several are composed for the call.
async fn decide_limits<'a>(
    matched: &[Matched<'a>],
    scope: Scope<'_>,
    policy: &Policy,
) -> (Cow<'a, LimitSet>, Verdict) {
    let set = match matched {
        [one] => Cow::Borrowed(&one.limit.alone),
        _ => Cow::Owned(LimitSet::new(
            matched.iter().map(|m| m.limit.limit.clone()).collect(),
            scope.instances,
            scope.failure_mode,
            None,
        )),
    };
    let asks: Asks = matched.iter().map(|m| m.ask.clone()).collect();
    let verdict = policy.decide(&set, &asks).await;
    policy.finish(&set, &asks, &verdict).await;
    (set, verdict)
}

/// Each descriptor's status: what the rules fixed, then what each decided limit said.
fn statuses<'a>(matches: Matches<'a>, verdict: &Verdict) -> Vec<Status<'a>> {
    let mut statuses = matches.statuses;
    let decided = verdict.decision.as_ref().map(|d| &d.statuses);
    for (j, m) in matches.matched.iter().enumerate() {
        let status: Option<&LimitStatus> = decided.and_then(|s| s.get(j));
        let Some(status) = status else {
            // Nothing decided this limit (the limiter could not; the failure mode answered):
            // no limit, remaining or reset is claimed, so neither Envoy's rate limit headers
            // nor the RateLimit fields invent one ("nothing left" when nothing was counted).
            statuses[m.descriptor] = Status {
                over: verdict.outcome == Outcome::ErrorDenied,
                ..Status::default()
            };
            continue;
        };
        statuses[m.descriptor] = Status {
            over: !status.allowed && !m.limit.limit.shadow,
            limit: Some(Shown {
                name: &m.limit.name,
                requests_per_unit: m.limit.requests_per_unit,
                unit: m.limit.unit,
            }),
            remaining: status.remaining,
            reset_after_ms: Some(status.reset_after_ms),
            enforced: !m.limit.limit.shadow,
        };
    }
    statuses
}
