//! One record per limit. A request's limits travel as one sequence, each element holding
//! everything of one limit: compiled once, a [`PolicyLimit`] (the limit exact, and one
//! gateway's share of it); per request, a [`LimitRecord`] (what the request asks of it, what
//! the limiter answered, whether it decided, what the response said it cost). The policy takes
//! them paired, as [`Asked`]; where a compiled sequence meets a request's records they meet in
//! `limiter::pairs`, which refuses sequences of unequal length instead of silently dropping a
//! limit as `zip` would.

use smallvec::SmallVec;

use super::decision::{Decision, Source};
use super::error::LimiterError;
use super::key::Key;
use super::limit::{CostReport, Limit, Scope, LIMITS_INLINE};
use super::request::{Ask, Entries, Entry};
use super::rules::LimitRules;
use super::status::LimitStatus;
use super::verdict::{Answered, Decider, Outcome, Verdict};

/// A limit as the policy applies it, compiled once: exact, and one gateway's share of it for
/// `failure_mode: local`.
#[derive(Debug, Clone)]
pub struct PolicyLimit {
    pub exact: Limit,
    pub share: Limit,
}

impl PolicyLimit {
    /// `limit`, and its share among `instances` gateways.
    pub fn new(limit: Limit, instances: u64) -> PolicyLimit {
        PolicyLimit {
            share: limit.share(instances),
            exact: limit,
        }
    }
}

/// Which way a limit decided its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deciding {
    /// It denied, with the longest wait of the enforced limits that denied.
    Denied,
    /// A shadow limit that would have denied (the longest wait among them).
    ShadowDenied,
}

/// One limit of one request, from its ask to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitRecord {
    pub ask: Ask,
    /// What the limiter answered for it; `None` when nothing answered (not decided yet, or the
    /// failure mode decided without a limiter).
    pub status: Option<LimitStatus>,
    /// Whether it is the limit that decided the request.
    pub deciding: Option<Deciding>,
    /// What the response said it cost (`cost_from_response`); `Missing` until read.
    pub report: CostReport,
}

/// A request's records, one per limit, inline for routes of ordinary size.
pub type LimitRecords = SmallVec<[LimitRecord; LIMITS_INLINE]>;

impl LimitRecord {
    /// A limit asked at `key` for `cost` units (0: only read).
    pub fn new(key: Key, cost: u64) -> LimitRecord {
        LimitRecord {
            ask: Ask { key, cost },
            status: None,
            deciding: None,
            report: CostReport::Missing,
        }
    }

    /// What this limit (`limit`, as the request met it) said of the request whose verdict is
    /// `verdict`: its `sluice_limit_decisions_total` label, or `None` when it is not counted.
    /// A deny-cache answer counts only the limit whose cached denial answered (the others were
    /// not asked); when the failure mode decided without a limiter, every limit counts its
    /// outcome.
    pub fn outcome(&self, limit: &Limit, verdict: &Verdict) -> Option<Outcome> {
        let Some(status) = &self.status else {
            return match (verdict.answered, verdict.outcome) {
                (None, outcome @ (Outcome::ErrorAllowed | Outcome::ErrorDenied)) => Some(outcome),
                _ => None,
            };
        };
        let cached = verdict.answered.map(|a| a.source) == Some(Source::DenyCache);
        // The limits local to this gateway were asked all the same (before the shared ones).
        if cached && self.deciding != Some(Deciding::Denied) && limit.scope == Scope::Shared {
            return None;
        }
        // A limit local to this gateway decided as configured, whoever decided the others.
        let local = verdict.decider == Decider::Fallback && limit.scope == Scope::Shared;
        Some(Outcome::of(status.allowed, limit.shadow, local))
    }
}

/// One limit of one request as the policy takes it: the compiled limit and the request's record.
#[derive(Debug)]
pub struct AskedLimit<'a> {
    pub limit: &'a PolicyLimit,
    pub record: &'a mut LimitRecord,
}

/// Which of a compiled limit's forms a call is made under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// The limit as written (the backend).
    Exact,
    /// One gateway's share (the in-process fallback).
    Share,
}

/// A request's limits as the policy takes them: the rules, and each compiled limit with the
/// request's record of it. Built per call, inline.
#[derive(Debug)]
pub struct Asked<'a> {
    pub rules: LimitRules,
    pub limits: SmallVec<[AskedLimit<'a>; LIMITS_INLINE]>,
}

impl<'a> Asked<'a> {
    /// Each compiled limit of `pairs` with the request's record of it, under `rules`.
    pub fn new(
        rules: &'a LimitRules,
        pairs: impl Iterator<Item = (&'a PolicyLimit, &'a mut LimitRecord)>,
    ) -> Asked<'a> {
        let limits = pairs
            .map(|(limit, record)| AskedLimit { limit, record })
            .collect();
        Asked {
            rules: *rules,
            limits,
        }
    }

    /// The limits of `scope` among these, as a set of their own (the rules theirs): a route's
    /// limits local to this gateway, or its shared ones.
    pub fn scoped(&mut self, scope: Scope) -> Asked<'_> {
        let limits: SmallVec<[AskedLimit<'_>; LIMITS_INLINE]> = self
            .limits
            .iter_mut()
            .filter(|asked| asked.limit.exact.scope == scope)
            .map(|asked| AskedLimit {
                limit: asked.limit,
                record: &mut *asked.record,
            })
            .collect();
        let rules = LimitRules::new(
            limits.iter().map(|asked| &asked.limit.exact),
            self.rules.failure_mode(),
            self.rules.deadline(),
        );
        Asked { rules, limits }
    }

    /// The seam's entries: each record's key and cost under its limit's `scale`d form.
    pub fn entries(&self, scale: Scale) -> Entries<'_> {
        self.limits
            .iter()
            .map(|asked| Entry {
                limit: match scale {
                    Scale::Exact => &asked.limit.exact,
                    Scale::Share => &asked.limit.share,
                },
                key: &asked.record.ask.key,
                cost: asked.record.ask.cost,
            })
            .collect()
    }

    /// Writes the seam's reply into the records: each status into its limit's record, and
    /// which limit decided. `Err` when the reply does not hold one status per limit.
    pub fn take(&mut self, decision: Decision) -> Result<Answered, LimiterError> {
        if decision.statuses.len() != self.limits.len() {
            return Err(LimiterError::Reply(format!(
                "{} statuses for {} limits",
                decision.statuses.len(),
                self.limits.len()
            )));
        }
        let answered = Answered {
            source: decision.source,
            batch: decision.batch,
            retry: decision.retry(),
        };
        let statuses = decision.statuses.into_iter();
        for (index, (asked, status)) in self.limits.iter_mut().zip(statuses).enumerate() {
            asked.record.status = Some(status);
            asked.record.deciding = if decision.denied_by == Some(index) {
                Some(Deciding::Denied)
            } else if decision.shadow_denied_by == Some(index) {
                Some(Deciding::ShadowDenied)
            } else {
                None
            };
        }
        Ok(answered)
    }
}

/// The limit that decided among `limits`, each beside its record: the one that denied, else
/// the shadow limit that would have; with its record.
pub fn deciding<'a, L>(
    limits: impl IntoIterator<Item = (L, &'a LimitRecord)>,
) -> Option<(L, &'a LimitRecord)> {
    let mut shadow = None;
    for (limit, record) in limits {
        match record.deciding {
            Some(Deciding::Denied) => return Some((limit, record)),
            Some(Deciding::ShadowDenied) => shadow = shadow.or(Some((limit, record))),
            None => {}
        }
    }
    shadow
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(deciding: Option<Deciding>) -> LimitRecord {
        LimitRecord {
            deciding,
            ..LimitRecord::new(Key::from_slice(b"k"), 1)
        }
    }

    #[test]
    fn the_deciding_limit_comes_with_its_record_a_denial_before_a_shadow_one() {
        let (none, shadow, denied) = (
            record(None),
            record(Some(Deciding::ShadowDenied)),
            record(Some(Deciding::Denied)),
        );
        let all = [("a", &none), ("b", &shadow), ("c", &denied)];
        assert_eq!(deciding(all), Some(("c", &denied)));
        let shadows = [("a", &none), ("b", &shadow), ("c", &shadow)];
        assert_eq!(deciding(shadows), Some(("b", &shadow)));
        assert_eq!(deciding([("a", &none)]), None);
    }
}
