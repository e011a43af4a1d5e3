//! The verdict of the limits of one request: one status per limit, and which limit denied.

use smallvec::SmallVec;

use super::limit::{Limit, LIMITS_INLINE};
use super::status::LimitStatus;

/// One status per limit.
pub type Statuses = SmallVec<[LimitStatus; LIMITS_INLINE]>;

/// The verdict on one request across all limits of its route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// One status per limit, in the route's order.
    pub statuses: Statuses,
    /// The denying limit with the longest wait, if any enforced limit denied.
    pub denied_by: Option<usize>,
    /// The same among shadow limits: the request would have been denied by this one.
    pub shadow_denied_by: Option<usize>,
    /// What answered: the backend, or a shortcut in front of it.
    pub source: Source,
    /// How many requests' decisions the backend call carried (coalesced decisions; 1 for a
    /// call of its own, 0 when no call was made: deny cache, leases held).
    pub batch: usize,
}

/// What answered a decision: the backend (Redis, or the in-process limiter), or the deny cache
/// or leases held, without a backend call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    #[default]
    Backend,
    DenyCache,
    Leases,
}

/// When a request could pass, as its decision says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// It was not denied.
    NotDenied,
    /// Never: a denying limit's cost exceeds its capacity.
    Never,
    /// After this many milliseconds.
    AfterMs(u64),
}

impl Retry {
    /// The wait, when there is one to wait out.
    pub fn after_ms(self) -> Option<u64> {
        match self {
            Retry::AfterMs(ms) => Some(ms),
            Retry::NotDenied | Retry::Never => None,
        }
    }
}

impl Decision {
    /// A decision where every limit is enforced.
    pub fn from_statuses(statuses: impl Into<Statuses>) -> Decision {
        Decision::judge(statuses, |_| false)
    }

    /// A decision over `limits`: shadow limits never deny (and never delay); their denials are
    /// reported in `shadow_denied_by`.
    pub fn of(statuses: impl Into<Statuses>, limits: &[Limit]) -> Decision {
        Decision::judge(statuses, |i| limits.get(i).is_some_and(|l| l.shadow))
    }

    /// A decision over limits whose shadow flags `shadow(i)` says.
    pub fn judge(statuses: impl Into<Statuses>, shadow: impl Fn(usize) -> bool) -> Decision {
        let mut statuses = statuses.into();
        let longest = |statuses: &[LimitStatus], in_shadow: bool| {
            statuses
                .iter()
                .enumerate()
                .filter(|(i, s)| !s.allowed && shadow(*i) == in_shadow)
                .max_by_key(|(_, s)| s.retry_after_ms.unwrap_or(u64::MAX))
                .map(|(index, _)| index)
        };
        for (i, status) in statuses.iter_mut().enumerate() {
            if shadow(i) {
                status.delay_ms = 0;
            }
        }
        let denied_by = longest(&statuses, false);
        let shadow_denied_by = longest(&statuses, true);
        Decision {
            statuses,
            denied_by,
            shadow_denied_by,
            source: Source::Backend,
            batch: 1,
        }
    }

    pub fn allowed(&self) -> bool {
        self.denied_by.is_none()
    }

    /// When the request could pass: the longest wait among the denying limits.
    pub fn retry(&self) -> Retry {
        match self.denied_by {
            None => Retry::NotDenied,
            Some(i) => match self.statuses.get(i).and_then(|s| s.retry_after_ms) {
                Some(ms) => Retry::AfterMs(ms),
                None => Retry::Never,
            },
        }
    }

    /// How long an allowed request must be held (the longest shaping delay of its limits).
    pub fn delay_ms(&self) -> u64 {
        if !self.allowed() {
            return 0;
        }
        self.statuses.iter().map(|s| s.delay_ms).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(allowed: bool, retry: Option<u64>) -> LimitStatus {
        LimitStatus {
            allowed,
            remaining: 0,
            retry_after_ms: retry,
            reset_after_ms: 0,
            delay_ms: 0,
            mark_us: 0,
        }
    }

    #[test]
    fn the_longest_denial_names_the_decision() {
        let d = Decision::from_statuses(vec![
            status(true, Some(0)),
            status(false, Some(20)),
            status(false, Some(90)),
        ]);
        assert_eq!((d.denied_by, d.retry()), (Some(2), Retry::AfterMs(90)));
        let never = Decision::from_statuses(vec![status(false, Some(5)), status(false, None)]);
        assert_eq!(never.retry(), Retry::Never);
        let allowed = Decision::from_statuses(vec![status(true, Some(0))]);
        assert!(allowed.allowed());
        assert_eq!(allowed.retry(), Retry::NotDenied);
    }

    #[test]
    fn shadow_limits_report_but_never_deny_or_delay() {
        let mut shaped = status(true, Some(0));
        shaped.delay_ms = 40;
        let d = Decision::judge(vec![status(false, Some(10)), shaped], |_| true);
        assert!(d.allowed());
        assert_eq!((d.shadow_denied_by, d.delay_ms()), (Some(0), 0));
    }
}
