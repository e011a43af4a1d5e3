//! Why a limiter could not decide, with a stable kind for metric labels.

use strum::{EnumCount, IntoStaticStr, VariantArray};

use super::pairs::Mismatch;

/// Why a limiter could not decide. `kind()` is the metric label.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    #[error("limiter call exceeded its {0} ms deadline")]
    Timeout(u64),
    #[error("redis connection failed: {0}")]
    Connection(String),
    #[error("redis replied with an error ({kind}): {message}")]
    Server { kind: ErrorKind, message: String },
    #[error("unexpected limiter reply: {0}")]
    Reply(String),
    #[error("in-process limiter is full ({0} keys tracked)")]
    LocalCapacity(usize),
    #[error("the Redis circuit breaker is open")]
    BreakerOpen,
    /// A limiter's answer that is not one for one with the limits it was asked (a bug): counted
    /// as a `reply`, as any reply that does not fit what was asked.
    #[error("limiter reply does not fit its call: {0}")]
    Mismatch(#[from] Mismatch),
}

/// The kind of a [`LimiterError`]: the `kind` label of `sluice_limiter_errors_total` (its
/// snake_case name) and, by its discriminant, the index of its counter handle.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, EnumCount, VariantArray, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum ErrorKind {
    Timeout,
    Connection,
    Noscript,
    Readonly,
    Loading,
    Busy,
    Oom,
    Crossslot,
    Cluster,
    Auth,
    /// A Redis error reply of no kind above.
    Server,
    Reply,
    LocalCapacity,
    BreakerOpen,
}

impl ErrorKind {
    /// Every kind, in index order, so metrics can show them at zero from the start.
    pub const ALL: &'static [ErrorKind] = <ErrorKind as VariantArray>::VARIANTS;
    pub const COUNT: usize = <ErrorKind as EnumCount>::COUNT;

    /// The metric label.
    pub fn label(self) -> &'static str {
        self.into()
    }

    /// The index of this kind's counter handle.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl LimiterError {
    /// Errors that deny the request whatever the failure mode: admitting would mean admitting a
    /// request the limiter cannot track.
    pub fn always_denies(&self) -> bool {
        matches!(self, LimiterError::LocalCapacity(_))
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            LimiterError::Timeout(_) => ErrorKind::Timeout,
            LimiterError::Connection(_) => ErrorKind::Connection,
            LimiterError::Server { kind, .. } => *kind,
            LimiterError::Reply(_) | LimiterError::Mismatch(_) => ErrorKind::Reply,
            LimiterError::LocalCapacity(_) => ErrorKind::LocalCapacity,
            LimiterError::BreakerOpen => ErrorKind::BreakerOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_label_and_place() {
        let labels: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.label()).collect();
        assert_eq!(
            labels,
            [
                "timeout",
                "connection",
                "noscript",
                "readonly",
                "loading",
                "busy",
                "oom",
                "crossslot",
                "cluster",
                "auth",
                "server",
                "reply",
                "local_capacity",
                "breaker_open",
            ]
        );
        for (index, kind) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), index);
        }
        for (error, kind) in [
            (LimiterError::Timeout(1), "timeout"),
            (LimiterError::BreakerOpen, "breaker_open"),
            (LimiterError::LocalCapacity(1), "local_capacity"),
            (
                LimiterError::Server {
                    kind: ErrorKind::Oom,
                    message: String::new(),
                },
                "oom",
            ),
        ] {
            assert_eq!(error.kind().label(), kind);
        }
    }
}
