//! What the limiter made of one request, in the terms every consumer needs: its outcome (the
//! metric label, for the request and for each limit), what the limits said, and whom to give
//! back what it took. Nothing here is HTTP: how an outcome is answered is `crate::exchange::answer`'s.

use std::time::Duration;

use super::decision::{Retry, Source};
use super::id::RequestId;

/// What the limiter said about a request, or about one of its limits: the `decision` label of
/// `sluice_requests_total` and `sluice_limit_decisions_total`. The discriminant indexes metric
/// handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed = 0,
    Limited = 1,
    ShadowLimited = 2,
    FallbackAllowed = 3,
    FallbackLimited = 4,
    ErrorAllowed = 5,
    ErrorDenied = 6,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ShadowLimited,
        Outcome::FallbackAllowed,
        Outcome::FallbackLimited,
        Outcome::ErrorAllowed,
        Outcome::ErrorDenied,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::FallbackAllowed => "local_allowed",
            Outcome::FallbackLimited => "local_limited",
            Outcome::ErrorAllowed => "error_allowed",
            Outcome::ErrorDenied => "error_denied",
        }
    }

    /// The request goes upstream.
    pub fn admitted(self) -> bool {
        !matches!(
            self,
            Outcome::Limited | Outcome::FallbackLimited | Outcome::ErrorDenied
        )
    }

    /// The limiter could not decide, and the route's failure mode did (in-process fallback
    /// included).
    pub fn by_failure_mode(self) -> bool {
        matches!(
            self,
            Outcome::ErrorAllowed
                | Outcome::ErrorDenied
                | Outcome::FallbackAllowed
                | Outcome::FallbackLimited
        )
    }

    /// One limit's answer: whether it allowed, whether it is a shadow limit, and whether the
    /// in-process fallback gave it.
    pub(crate) fn of(allowed: bool, shadow: bool, local: bool) -> Outcome {
        match (allowed, shadow, local) {
            (true, _, false) => Outcome::Allowed,
            (true, _, true) => Outcome::FallbackAllowed,
            (false, true, _) => Outcome::ShadowLimited,
            (false, false, false) => Outcome::Limited,
            (false, false, true) => Outcome::FallbackLimited,
        }
    }
}

/// What answered a decided request, besides the statuses (which went into its records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answered {
    pub source: Source,
    /// How many requests' decisions the backend call carried (see `Decision::batch`).
    pub batch: usize,
    /// When the request could pass, as the deciding limit says.
    pub retry: Retry,
}

/// Who decided a request: whom to give back what it took (concurrency slots when it ends,
/// units when it is abandoned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Decider {
    /// No limiter (no limits, or the failure mode decided without one).
    #[default]
    Nobody,
    /// The configured backend.
    Backend,
    /// The in-process fallback (`failure_mode: local`).
    Fallback,
}

/// The policy's answer for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    /// What answered, when a limiter decided (what each limit said is in its record).
    pub answered: Option<Answered>,
    /// Shaping (`max_delay`): hold the admitted request this long before it goes upstream.
    pub delay: Duration,
    /// How long the limiter took to decide (zero when no limiter was asked).
    pub limiter_time: Duration,
    /// The id the limiter saw (sliding-log members, concurrency slots).
    pub id: RequestId,
    /// Who decided this request (its shared limits, when they are decided apart).
    pub decider: Decider,
    /// Its limits local to this gateway (`scope: local`) were decided apart, in-process, and
    /// hold what it took: their slots go back to them when it ends.
    pub local_scope_held: bool,
}

impl Verdict {
    /// A request on a route without limits.
    pub fn unlimited() -> Verdict {
        Verdict::undecided(Outcome::Allowed)
    }

    /// A request no limiter decided: `outcome` is the failure mode's (or `Allowed` without
    /// limits).
    pub fn undecided(outcome: Outcome) -> Verdict {
        Verdict {
            outcome,
            answered: None,
            delay: Duration::ZERO,
            limiter_time: Duration::ZERO,
            id: RequestId::default(),
            decider: Decider::Nobody,
            local_scope_held: false,
        }
    }

    /// The request goes upstream.
    pub fn admitted(&self) -> bool {
        self.outcome.admitted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_outcomes_are_the_ones_not_admitted() {
        let refused = [
            Outcome::Limited,
            Outcome::FallbackLimited,
            Outcome::ErrorDenied,
        ];
        for outcome in Outcome::ALL {
            assert_eq!(
                outcome.admitted(),
                !refused.contains(&outcome),
                "{outcome:?}"
            );
            assert_eq!(Outcome::ALL[outcome as usize], outcome);
        }
        assert!(Verdict::unlimited().admitted());
        assert!(!Verdict::undecided(Outcome::ErrorDenied).admitted());
    }
}
