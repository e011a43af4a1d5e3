//! Whether this gateway should get traffic now, as one typed state: `/readyz` answers its
//! status and line (`admin.rs`), the dashboard's overview draws its name, colour and words
//! (`dashboard/`). Both read the state, never each other's text, so a degraded gateway cannot
//! be drawn as a ready one.

use crate::limiter::FailureMode;

/// This gateway's readiness, worst first when several hold: a drain, then missing JWT keys,
/// then the limiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyState {
    /// The limiter backend (`redis`, `local`) answers.
    Ready { backend: &'static str },
    /// The backend does not answer and the failure mode in force still serves (`allow`,
    /// `local`): ready, degraded.
    Degraded {
        backend: &'static str,
        reason: String,
        failure_mode: FailureMode,
    },
    /// The backend does not answer and the failure mode in force refuses (`deny`).
    Refusing {
        backend: &'static str,
        reason: String,
        failure_mode: FailureMode,
    },
    /// Routes verify JWTs and the JWKS URL has not answered yet: every token would be refused.
    AwaitingKeys,
    /// A graceful shutdown (SIGTERM) is under way.
    Draining,
}

impl ReadyState {
    /// `/readyz`'s status: `200` while traffic should come (degraded included), else `503`.
    pub fn status(&self) -> u16 {
        match self {
            ReadyState::Ready { .. } | ReadyState::Degraded { .. } => 200,
            _ => 503,
        }
    }

    /// Its name, a CSS class and `data-state` on the dashboard.
    pub fn name(&self) -> &'static str {
        match self {
            ReadyState::Ready { .. } => "ready",
            ReadyState::Degraded { .. } => "degraded",
            ReadyState::Refusing { .. } => "refusing",
            ReadyState::AwaitingKeys => "awaiting-keys",
            ReadyState::Draining => "draining",
        }
    }

    /// `/readyz`'s line, ending with a newline.
    pub fn line(&self) -> String {
        match self {
            ReadyState::Ready { backend } => format!("ready: {backend} limiter\n"),
            ReadyState::Degraded {
                backend,
                reason,
                failure_mode,
            } => format!(
                "degraded: {backend} limiter unavailable ({reason}); failure_mode {} applies\n",
                failure_mode.label()
            ),
            ReadyState::Refusing {
                backend,
                reason,
                failure_mode,
            } => format!(
                "not ready: {backend} limiter unavailable ({reason}); failure_mode {} refuses requests\n",
                failure_mode.label()
            ),
            ReadyState::AwaitingKeys => {
                "not ready: no JWT verification keys yet (identity.jwt.jwks_url has not answered)\n"
                    .into()
            }
            ReadyState::Draining => "not ready: shutting down (SIGTERM), draining\n".into(),
        }
    }

    /// What the dashboard says of it: what it means for traffic, in words.
    pub fn words(&self) -> String {
        match self {
            ReadyState::Ready { backend } => format!("Ready: the {backend} limiter answers"),
            ReadyState::Degraded {
                backend,
                reason,
                failure_mode,
            } => format!(
                "Degraded: the {backend} limiter is unavailable ({reason}); serving by failure_mode {}: {}",
                failure_mode.label(),
                match failure_mode {
                    FailureMode::Fallback => "limits enforced in-process at this gateway's share",
                    _ => "requests admitted without their limits",
                }
            ),
            ReadyState::Refusing {
                backend,
                reason,
                failure_mode,
            } => format!(
                "Not ready: the {backend} limiter is unavailable ({reason}); failure_mode {} refuses requests with 503",
                failure_mode.label()
            ),
            ReadyState::AwaitingKeys => "Not ready: no JWT verification keys yet (identity.jwt.jwks_url has not answered): every token is refused".into(),
            ReadyState::Draining => "Not ready: shutting down (SIGTERM), draining: requests in flight finish, new traffic belongs elsewhere".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_has_its_own_status_name_and_words() {
        let states = [
            ReadyState::Ready { backend: "redis" },
            ReadyState::Degraded {
                backend: "redis",
                reason: "connection refused".into(),
                failure_mode: FailureMode::Allow,
            },
            ReadyState::Refusing {
                backend: "redis",
                reason: "connection refused".into(),
                failure_mode: FailureMode::Deny,
            },
            ReadyState::AwaitingKeys,
            ReadyState::Draining,
        ];
        let statuses: Vec<u16> = states.iter().map(ReadyState::status).collect();
        assert_eq!(statuses, [200, 200, 503, 503, 503]);
        let mut names: Vec<&str> = states.iter().map(ReadyState::name).collect();
        names.dedup();
        assert_eq!(names.len(), states.len(), "one name each");
        assert_eq!(
            states[1].line(),
            "degraded: redis limiter unavailable (connection refused); failure_mode allow applies\n"
        );
        assert!(
            states[1].words().starts_with("Degraded"),
            "{}",
            states[1].words()
        );
        assert!(states.iter().all(|s| s.line().ends_with('\n')));
    }
}
