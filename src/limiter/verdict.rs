//! What happened to one request, in the terms every consumer of it needs: the metric outcome,
//! and, when the gateway answers the request itself, the rejection. One mapping turns a
//! rejection into its status, its problem title and detail, and its metric label.

use std::time::Duration;

use super::decision::Decision;
use super::id::RequestId;

/// The `decision` label of `sluice_requests_total`; the discriminant indexes metric handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed = 0,
    Limited = 1,
    ErrorAllowed = 2,
    ErrorDenied = 3,
    NoRoute = 4,
    BadRequest = 5,
    ShadowLimited = 6,
    LocalAllowed = 7,
    LocalLimited = 8,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ErrorAllowed,
        Outcome::ErrorDenied,
        Outcome::NoRoute,
        Outcome::BadRequest,
        Outcome::ShadowLimited,
        Outcome::LocalAllowed,
        Outcome::LocalLimited,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ErrorAllowed => "error_allowed",
            Outcome::ErrorDenied => "error_denied",
            Outcome::NoRoute => "no_route",
            Outcome::BadRequest => "bad_request",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::LocalAllowed => "local_allowed",
            Outcome::LocalLimited => "local_limited",
        }
    }

    /// The request goes upstream.
    pub fn admitted(self) -> bool {
        matches!(
            self,
            Outcome::Allowed
                | Outcome::ShadowLimited
                | Outcome::LocalAllowed
                | Outcome::ErrorAllowed
        )
    }
}

/// Why the gateway answers a request itself instead of the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    NoRoute,
    /// The request cannot be decided as sent (a malformed path, cost header or key part).
    BadRequest(&'static str),
    UriTooLong,
    HeadersTooLarge,
    /// The request body is larger than the route accepts (`max_body_bytes`).
    BodyTooLarge,
    /// A limit denied the request (the decision says which, and until when); `locally`: the
    /// in-process fallback decided while Redis was away.
    Limited {
        locally: bool,
    },
    /// The limiter could not decide, and the failure mode refuses.
    LimiterUnavailable,
}

impl Rejection {
    pub fn status(self) -> u16 {
        match self {
            Rejection::NoRoute => 404,
            Rejection::BadRequest(_) => 400,
            Rejection::UriTooLong => 414,
            Rejection::HeadersTooLarge => 431,
            Rejection::BodyTooLarge => 413,
            Rejection::Limited { .. } => 429,
            Rejection::LimiterUnavailable => 503,
        }
    }

    /// The problem's title: the status's reason phrase.
    pub fn title(self) -> &'static str {
        match self {
            Rejection::NoRoute => "Not Found",
            Rejection::BadRequest(_) => "Bad Request",
            Rejection::UriTooLong => "URI Too Long",
            Rejection::HeadersTooLarge => "Request Header Fields Too Large",
            Rejection::BodyTooLarge => "Content Too Large",
            Rejection::Limited { .. } => "Too Many Requests",
            Rejection::LimiterUnavailable => "Service Unavailable",
        }
    }

    /// The problem's detail, for every rejection but `Limited` (whose detail names the limit).
    pub fn detail(self) -> &'static str {
        match self {
            Rejection::NoRoute => "No route matches this request.",
            Rejection::BadRequest(detail) => detail,
            Rejection::UriTooLong => "The request target is too long.",
            Rejection::HeadersTooLarge => "The request headers are too large.",
            Rejection::BodyTooLarge => "The request body is larger than this route accepts.",
            Rejection::Limited { .. } => "A rate limit of this route is exceeded.",
            Rejection::LimiterUnavailable => "The rate limiter is unavailable.",
        }
    }

    /// The gRPC status a gRPC client gets instead (RESOURCE_EXHAUSTED for a limit, as Envoy's
    /// rate limit filter answers; the gRPC mapping of the HTTP status for the rest).
    pub fn grpc_status(self) -> GrpcStatus {
        match self {
            Rejection::Limited { .. } => GrpcStatus::ResourceExhausted,
            Rejection::LimiterUnavailable => GrpcStatus::Unavailable,
            Rejection::NoRoute => GrpcStatus::Unimplemented,
            Rejection::BadRequest(_)
            | Rejection::UriTooLong
            | Rejection::HeadersTooLarge
            | Rejection::BodyTooLarge => GrpcStatus::Internal,
        }
    }

    /// The metric label of a request answered with this rejection.
    pub fn outcome(self) -> Outcome {
        match self {
            Rejection::NoRoute => Outcome::NoRoute,
            Rejection::BadRequest(_)
            | Rejection::UriTooLong
            | Rejection::HeadersTooLarge
            | Rejection::BodyTooLarge => Outcome::BadRequest,
            Rejection::Limited { locally: false } => Outcome::Limited,
            Rejection::Limited { locally: true } => Outcome::LocalLimited,
            Rejection::LimiterUnavailable => Outcome::ErrorDenied,
        }
    }
}

/// Why a request its limits admitted got no answer from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// No server could be reached: none healthy, connection refused or reset, TLS failed.
    Unreachable,
    /// A server did not answer within the route's timeouts.
    TimedOut,
}

impl UpstreamFailure {
    pub fn status(self) -> u16 {
        match self {
            UpstreamFailure::Unreachable => 502,
            UpstreamFailure::TimedOut => 504,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            UpstreamFailure::Unreachable => "Bad Gateway",
            UpstreamFailure::TimedOut => "Gateway Timeout",
        }
    }

    pub fn detail(self) -> &'static str {
        match self {
            UpstreamFailure::Unreachable => "The upstream server could not be reached.",
            UpstreamFailure::TimedOut => "The upstream server did not answer in time.",
        }
    }

    /// What a gRPC client gets instead: UNAVAILABLE (the gRPC mapping of 502 and 504).
    pub fn grpc_status(self) -> GrpcStatus {
        GrpcStatus::Unavailable
    }
}

/// The gRPC status codes sluice answers with (`grpc-status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcStatus {
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
}

impl GrpcStatus {
    pub fn code(self) -> u8 {
        self as u8
    }
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
    /// What the limits said, when a limiter decided.
    pub decision: Option<Decision>,
    /// Set when the gateway answers the request itself.
    pub rejection: Option<Rejection>,
    /// Shaping (`max_delay`): hold the admitted request this long before it goes upstream.
    pub delay: Duration,
    /// How long the limiter took to decide (zero when no limiter was asked).
    pub limiter_time: Duration,
    /// The id the limiter saw (sliding-log members, concurrency slots).
    pub id: RequestId,
    /// Who decided this request.
    pub decider: Decider,
}

impl Verdict {
    /// A request the gateway answers itself before any limiter is asked.
    pub fn rejected(rejection: Rejection) -> Verdict {
        Verdict {
            outcome: rejection.outcome(),
            rejection: Some(rejection),
            ..Verdict::unlimited()
        }
    }

    /// A request on a route without limits.
    pub fn unlimited() -> Verdict {
        Verdict {
            outcome: Outcome::Allowed,
            decision: None,
            rejection: None,
            delay: Duration::ZERO,
            limiter_time: Duration::ZERO,
            id: RequestId::default(),
            decider: Decider::Nobody,
        }
    }

    /// The request goes upstream.
    pub fn admitted(&self) -> bool {
        self.rejection.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rejection_maps_to_one_status_and_one_label() {
        let all = [
            (Rejection::NoRoute, 404, "no_route"),
            (Rejection::BadRequest("x"), 400, "bad_request"),
            (Rejection::UriTooLong, 414, "bad_request"),
            (Rejection::HeadersTooLarge, 431, "bad_request"),
            (Rejection::BodyTooLarge, 413, "bad_request"),
            (Rejection::Limited { locally: false }, 429, "limited"),
            (Rejection::Limited { locally: true }, 429, "local_limited"),
            (Rejection::LimiterUnavailable, 503, "error_denied"),
        ];
        for (rejection, status, label) in all {
            assert_eq!(
                (rejection.status(), rejection.outcome().label()),
                (status, label)
            );
            let verdict = Verdict::rejected(rejection);
            assert!(!verdict.admitted() && !verdict.outcome.admitted());
        }
        assert!(Verdict::unlimited().admitted());
    }
}
