//! What the policy applies to a set of limits besides the limits themselves: the failure mode
//! (what a request gets when the limiter cannot decide), the deadline, and what the limits
//! need of a call (a request id, slots given back, a response settled), computed once.

use std::time::Duration;

use super::algorithm::Algorithm;
use super::limit::{Limit, Scope};

/// What a request gets when the limiter cannot decide (Redis error or deadline missed). Its
/// snake_case name (`allow`, `deny`, `local`) is what the configuration says (`FromStr`, the
/// names listed by `VariantNames`) and what logs and labels show (`label()`, `Display`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    strum::EnumString,
    strum::VariantNames,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum FailureMode {
    Allow,
    Deny,
    /// Enforce the limits in-process at `limit / instances` while Redis is unavailable: the
    /// in-process fallback. The configuration spells it `local`, its only other meaning beside
    /// `scope: local` (docs/architecture.md's glossary).
    #[strum(serialize = "local")]
    Fallback,
}

impl FailureMode {
    /// The name, as the configuration spells it.
    pub fn label(self) -> &'static str {
        self.into()
    }

    /// Whether requests are refused while the limiter is unreachable.
    pub fn refuses(self) -> bool {
        self == FailureMode::Deny
    }
}

/// What the policy knows of a set of limits besides the limits: the failure mode, the deadline,
/// and what the limits need (computed once from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitRules {
    failure_mode: FailureMode,
    /// Overrides the backend's deadline for these limits' calls.
    deadline: Option<Duration>,
    /// Some limit stores per-request entries (sliding log, concurrency): calls need an id.
    pub(super) needs_request_id: bool,
    /// Some limit is a concurrency limit: admitted requests give their slot back when done.
    pub(super) holds_slots: bool,
    /// Some limit is priced by the response: admitted requests are settled when it ends.
    pub(super) priced_by_response: bool,
    /// Some limit is local to this gateway (`scope: local`): with a shared backend, those are
    /// decided first, in-process, and the others after.
    pub(super) has_local_scope: bool,
}

impl LimitRules {
    /// The rules of `limits` (folded, nothing allocated).
    pub fn new<'a>(
        limits: impl IntoIterator<Item = &'a Limit>,
        failure_mode: FailureMode,
        deadline: Option<Duration>,
    ) -> LimitRules {
        let mut rules = LimitRules {
            failure_mode,
            deadline,
            ..LimitRules::none()
        };
        for limit in limits {
            rules.needs_request_id |= limit.algorithm.needs_request_id();
            rules.holds_slots |= matches!(limit.algorithm, Algorithm::Concurrency { .. });
            rules.priced_by_response |= limit.priced_by_response.is_some();
            rules.has_local_scope |= limit.scope == Scope::Local;
        }
        rules
    }

    /// The rules of no limits.
    pub fn none() -> LimitRules {
        LimitRules {
            failure_mode: FailureMode::Allow,
            deadline: None,
            needs_request_id: false,
            holds_slots: false,
            priced_by_response: false,
            has_local_scope: false,
        }
    }

    pub fn failure_mode(&self) -> FailureMode {
        self.failure_mode
    }

    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// Some limit is priced by the response (`cost_from_response`).
    pub fn priced_by_response(&self) -> bool {
        self.priced_by_response
    }
}
