//! Why a limiter could not decide, with a stable kind for metric labels.

/// Why a limiter could not decide. `kind()` is the metric label.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimiterError {
    #[error("limiter call exceeded its {0} ms deadline")]
    Timeout(u64),
    #[error("redis connection failed: {0}")]
    Connection(String),
    #[error("redis replied with an error ({code}): {message}")]
    Server { code: &'static str, message: String },
    #[error("unexpected limiter reply: {0}")]
    Reply(String),
    #[error("in-process limiter is full ({0} keys tracked)")]
    LocalCapacity(usize),
    #[error("the Redis circuit breaker is open")]
    BreakerOpen,
}

impl LimiterError {
    /// Errors that deny the request whatever the failure mode: admitting would mean admitting a
    /// request the limiter cannot track.
    pub fn always_denies(&self) -> bool {
        matches!(self, LimiterError::LocalCapacity(_))
    }

    /// Every value `kind()` can take, so metrics can show them at zero from the start.
    pub const KINDS: [&'static str; 14] = [
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
    ];

    pub fn kind(&self) -> &'static str {
        match self {
            LimiterError::Timeout(_) => "timeout",
            LimiterError::Connection(_) => "connection",
            LimiterError::Server { code, .. } => code,
            LimiterError::Reply(_) => "reply",
            LimiterError::LocalCapacity(_) => "local_capacity",
            LimiterError::BreakerOpen => "breaker_open",
        }
    }

    /// The position of `kind()` in [`LimiterError::KINDS`] (`server` for a code not listed).
    pub fn kind_index(&self) -> usize {
        let kind = self.kind();
        LimiterError::KINDS
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_place() {
        assert_eq!(LimiterError::KINDS[10], "server");
        for (error, kind) in [
            (LimiterError::Timeout(1), "timeout"),
            (LimiterError::BreakerOpen, "breaker_open"),
            (LimiterError::LocalCapacity(1), "local_capacity"),
            (
                LimiterError::Server {
                    code: "oom",
                    message: String::new(),
                },
                "oom",
            ),
        ] {
            assert_eq!(LimiterError::KINDS[error.kind_index()], kind);
        }
    }
}
