//! Every answer the gateway gives in place of the upstream, as one type: why (a refusal before
//! the limits, a limit, the limiter's failure mode, an upstream failure, an unreadable request),
//! and what that means on the wire — HTTP status, problem title and detail, gRPC status — and
//! in the metrics and the access log. The proxy writes these out (`proxy::respond`); nothing
//! else decides a status code.

use strum::{EnumCount, IntoStaticStr, VariantArray};

use crate::caller::consumers::AuthFailure;
use crate::limiter::Outcome;

/// What the gateway answers a request with, instead of the upstream's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// No route matches the request.
    NoRoute,
    /// The request cannot be decided as sent (a malformed target, host, path, cost header or
    /// key part); the detail says which.
    BadRequest(&'static str),
    UriTooLong,
    HeadersTooLarge,
    /// The request body is larger than the route accepts (`max_body_bytes`).
    BodyTooLarge,
    /// The client stopped sending its request body for longer than the read timeout.
    RequestTimeout,
    /// The client's address is in a `deny` range.
    Forbidden,
    /// The caller's credential is missing or does not verify (`401`), the verified caller may
    /// not pass (`403`), or a token cannot be verified yet for want of keys (`503`).
    AuthFailed(AuthFailure),
    /// A limit denied the request (its decision says which, and until when); `by_fallback`: the
    /// in-process fallback decided while Redis was away.
    Limited {
        by_fallback: bool,
    },
    /// The limiter could not decide, and the route's failure mode refuses.
    LimiterUnavailable,
    /// The route's upstream is at its adaptive concurrency limit for the caller's priority.
    Shed,
    /// No upstream server could be reached: none healthy, refused, reset, TLS failed.
    UpstreamUnreachable,
    /// The upstream did not answer within the route's timeouts (or its `request_timeout` ran
    /// out).
    UpstreamTimedOut,
    /// The client's request could not be read (a protocol error on its side).
    Unreadable,
    /// The gateway failed in a way none of the above describes.
    Internal,
}

/// Why no limiter was asked about a request: the `decision` labels of `sluice_requests_total`
/// besides the limiter's [`Outcome`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Unasked {
    NoRoute = 0,
    BadRequest = 1,
    /// The client's address is in a `deny` range.
    Forbidden = 2,
    /// The client's address is in an `allow` range: proxied without asking the limits.
    Exempt = 3,
    /// The caller's credential is missing or does not verify.
    Unauthenticated = 4,
    /// The upstream was at its adaptive concurrency limit for the caller's priority.
    Shed = 5,
}

impl Unasked {
    pub const ALL: &'static [Unasked] = Unasked::VARIANTS;

    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// A request's `decision` label: what the limiter said, or why it was not asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decided {
    Limiter(Outcome),
    Unasked(Unasked),
}

impl Decided {
    /// Every label, in the order of [`Decided::index`].
    pub const COUNT: usize = Outcome::ALL.len() + Unasked::ALL.len();

    pub fn label(self) -> &'static str {
        match self {
            Decided::Limiter(outcome) => outcome.label(),
            Decided::Unasked(unasked) => unasked.label(),
        }
    }

    /// Its position among the [`Decided::COUNT`] labels.
    pub fn index(self) -> usize {
        match self {
            Decided::Limiter(outcome) => outcome as usize,
            Decided::Unasked(unasked) => Outcome::ALL.len() + unasked as usize,
        }
    }

    /// Every label, indexed by [`Decided::index`].
    pub fn all() -> [Decided; Decided::COUNT] {
        let mut all = [Decided::Unasked(Unasked::NoRoute); Decided::COUNT];
        for outcome in Outcome::ALL {
            all[outcome as usize] = Decided::Limiter(outcome);
        }
        for &unasked in Unasked::ALL {
            all[Outcome::ALL.len() + unasked as usize] = Decided::Unasked(unasked);
        }
        all
    }
}

/// Why an upstream attempt failed: `sluice_upstream_errors_total`'s `kind`, the access log's
/// `error` and the upstream span's status. Several attempts of one request may fail; the
/// request's [`Answer`] is what the last one means to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, VariantArray, EnumCount)]
#[strum(serialize_all = "snake_case")]
pub enum UpstreamError {
    Refused = 0,
    Timeout = 1,
    Reset = 2,
    Tls = 3,
    Unreachable = 4,
}

/// The status the access log and the request duration show for a request whose client left
/// before any response was sent (nginx's "client closed request"); never sent on the wire.
pub const CLIENT_CLOSED: u16 = 499;

/// Why the client's side of a request failed: `sluice_client_errors_total`'s `kind` and the
/// access log's `client_error`. The client's counterpart of [`UpstreamError`]: neither is the
/// gateway's fault, nor the upstream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, VariantArray, EnumCount)]
#[strum(serialize_all = "snake_case")]
pub enum ClientError {
    /// It stopped sending its request body for longer than the read timeout: `408`.
    BodyTimeout = 0,
    /// It closed its connection (or reset its stream) before the response was complete.
    Closed = 1,
}

impl ClientError {
    pub const ALL: &'static [ClientError] = ClientError::VARIANTS;

    pub fn label(self) -> &'static str {
        self.into()
    }

    /// What the client is answered, if it still can be.
    pub fn answer(self) -> Option<Answer> {
        match self {
            ClientError::BodyTimeout => Some(Answer::RequestTimeout),
            ClientError::Closed => None,
        }
    }
}

impl UpstreamError {
    pub const ALL: &'static [UpstreamError] = UpstreamError::VARIANTS;

    pub fn label(self) -> &'static str {
        self.into()
    }

    /// What the client is answered when this was the last attempt.
    pub fn answer(self) -> Answer {
        match self {
            UpstreamError::Timeout => Answer::UpstreamTimedOut,
            UpstreamError::Refused
            | UpstreamError::Reset
            | UpstreamError::Tls
            | UpstreamError::Unreachable => Answer::UpstreamUnreachable,
        }
    }
}

/// The gRPC status codes sluice answers with (`grpc-status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcStatus {
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl GrpcStatus {
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl Answer {
    /// The answer of a request its limiter `outcome` refused; `None` when it was admitted.
    pub fn refusing(outcome: Outcome) -> Option<Answer> {
        match outcome {
            Outcome::Limited => Some(Answer::Limited { by_fallback: false }),
            Outcome::FallbackLimited => Some(Answer::Limited { by_fallback: true }),
            Outcome::ErrorDenied => Some(Answer::LimiterUnavailable),
            _ => None,
        }
    }

    pub fn status(self) -> u16 {
        match self {
            Answer::NoRoute => 404,
            Answer::BadRequest(_) | Answer::Unreadable => 400,
            Answer::UriTooLong => 414,
            Answer::HeadersTooLarge => 431,
            Answer::BodyTooLarge => 413,
            Answer::RequestTimeout => 408,
            Answer::Forbidden => 403,
            Answer::AuthFailed(failure) if failure.forbids() => 403,
            Answer::AuthFailed(failure) if failure.unavailable() => 503,
            Answer::AuthFailed(_) => 401,
            Answer::Limited { .. } => 429,
            Answer::LimiterUnavailable | Answer::Shed => 503,
            Answer::UpstreamUnreachable => 502,
            Answer::UpstreamTimedOut => 504,
            Answer::Internal => 500,
        }
    }

    /// The problem's title: the status's reason phrase.
    pub fn title(self) -> &'static str {
        match self {
            Answer::NoRoute => "Not Found",
            Answer::BadRequest(_) | Answer::Unreadable => "Bad Request",
            Answer::UriTooLong => "URI Too Long",
            Answer::HeadersTooLarge => "Request Header Fields Too Large",
            Answer::BodyTooLarge => "Content Too Large",
            Answer::RequestTimeout => "Request Timeout",
            Answer::Forbidden => "Forbidden",
            Answer::AuthFailed(failure) if failure.forbids() => "Forbidden",
            Answer::AuthFailed(failure) if failure.unavailable() => "Service Unavailable",
            Answer::AuthFailed(_) => "Unauthorized",
            Answer::Limited { .. } => "Too Many Requests",
            Answer::LimiterUnavailable | Answer::Shed => "Service Unavailable",
            Answer::UpstreamUnreachable => "Bad Gateway",
            Answer::UpstreamTimedOut => "Gateway Timeout",
            Answer::Internal => "Internal Server Error",
        }
    }

    /// The problem's detail (a `429`'s own detail names the limit; this is its fallback).
    pub fn detail(self) -> &'static str {
        match self {
            Answer::NoRoute => "No route matches this request.",
            Answer::BadRequest(detail) => detail,
            Answer::UriTooLong => "The request target is too long.",
            Answer::HeadersTooLarge => "The request has too many header fields, or too large ones.",
            Answer::BodyTooLarge => "The request body is larger than this route accepts.",
            Answer::RequestTimeout => "The request body did not arrive in time.",
            Answer::Forbidden => "This client's address may not use this route.",
            Answer::AuthFailed(failure) => failure.detail(),
            Answer::Limited { .. } => "A rate limit of this route is exceeded.",
            Answer::LimiterUnavailable => "The rate limiter is unavailable.",
            Answer::Shed => "The upstream is at its concurrency limit; retry shortly.",
            Answer::UpstreamUnreachable => "The upstream server could not be reached.",
            Answer::UpstreamTimedOut => "The upstream server did not answer in time.",
            Answer::Unreadable => "The request could not be read.",
            Answer::Internal => "The gateway failed to handle this request.",
        }
    }

    /// The gRPC status a gRPC client gets instead: RESOURCE_EXHAUSTED for a limit (as Envoy's
    /// rate limit filter answers), UNAVAILABLE when the limiter or the upstream is away, the
    /// gRPC mapping of the HTTP status for the rest.
    pub fn grpc_status(self) -> GrpcStatus {
        match self {
            Answer::Limited { .. } => GrpcStatus::ResourceExhausted,
            Answer::LimiterUnavailable
            | Answer::Shed
            | Answer::UpstreamUnreachable
            | Answer::UpstreamTimedOut => GrpcStatus::Unavailable,
            Answer::NoRoute => GrpcStatus::Unimplemented,
            Answer::Forbidden => GrpcStatus::PermissionDenied,
            Answer::AuthFailed(failure) if failure.forbids() => GrpcStatus::PermissionDenied,
            Answer::AuthFailed(failure) if failure.unavailable() => GrpcStatus::Unavailable,
            Answer::AuthFailed(_) => GrpcStatus::Unauthenticated,
            Answer::BadRequest(_)
            | Answer::UriTooLong
            | Answer::HeadersTooLarge
            | Answer::BodyTooLarge
            | Answer::RequestTimeout
            | Answer::Unreadable
            | Answer::Internal => GrpcStatus::Internal,
        }
    }

    /// Why no limiter was asked, for an answer given before the limits: the request's
    /// `decision` label. `None` for answers that follow a limiter's verdict (its outcome is the
    /// label) or an admission (upstream failures).
    pub fn unasked(self) -> Option<Unasked> {
        match self {
            Answer::NoRoute => Some(Unasked::NoRoute),
            Answer::Forbidden => Some(Unasked::Forbidden),
            Answer::AuthFailed(failure) if failure.forbids() => Some(Unasked::Forbidden),
            Answer::AuthFailed(_) => Some(Unasked::Unauthenticated),
            Answer::BadRequest(_)
            | Answer::UriTooLong
            | Answer::HeadersTooLarge
            | Answer::BodyTooLarge
            | Answer::Unreadable => Some(Unasked::BadRequest),
            Answer::Shed => Some(Unasked::Shed),
            Answer::Limited { .. }
            | Answer::LimiterUnavailable
            | Answer::UpstreamUnreachable
            | Answer::UpstreamTimedOut
            | Answer::RequestTimeout
            | Answer::Internal => None,
        }
    }

    /// The connection is not kept after this answer: a head too large to take is a client's
    /// mistake or an attack, and the front door may have dropped part of it (`414`, `431`).
    pub fn closes_connection(self) -> bool {
        matches!(self, Answer::UriTooLong | Answer::HeadersTooLarge)
    }

    /// Its name in the access log's `answer` field.
    pub fn label(self) -> &'static str {
        match self {
            Answer::NoRoute => "no_route",
            Answer::BadRequest(_) => "bad_request",
            Answer::UriTooLong => "uri_too_long",
            Answer::HeadersTooLarge => "headers_too_large",
            Answer::BodyTooLarge => "body_too_large",
            Answer::RequestTimeout => "request_timeout",
            Answer::Forbidden => "forbidden",
            Answer::AuthFailed(failure) if failure.forbids() => "forbidden",
            Answer::AuthFailed(_) => "unauthenticated",
            Answer::Limited { .. } => "limited",
            Answer::LimiterUnavailable => "limiter_unavailable",
            Answer::Shed => "shed",
            Answer::UpstreamUnreachable => "upstream_unreachable",
            Answer::UpstreamTimedOut => "upstream_timeout",
            Answer::Unreadable => "unreadable",
            Answer::Internal => "internal",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_has_one_status_one_grpc_status_and_one_label() {
        let all = [
            (Answer::NoRoute, 404, 12, Some("no_route")),
            (Answer::BadRequest("x"), 400, 13, Some("bad_request")),
            (Answer::UriTooLong, 414, 13, Some("bad_request")),
            (Answer::HeadersTooLarge, 431, 13, Some("bad_request")),
            (Answer::BodyTooLarge, 413, 13, Some("bad_request")),
            (Answer::Forbidden, 403, 7, Some("forbidden")),
            (
                Answer::AuthFailed(AuthFailure::Expired),
                401,
                16,
                Some("unauthenticated"),
            ),
            (
                Answer::AuthFailed(AuthFailure::PlanNotAllowed),
                403,
                7,
                Some("forbidden"),
            ),
            (
                Answer::AuthFailed(AuthFailure::NoKeys),
                503,
                14,
                Some("unauthenticated"),
            ),
            (Answer::Unreadable, 400, 13, Some("bad_request")),
            (Answer::Limited { by_fallback: false }, 429, 8, None),
            (Answer::Limited { by_fallback: true }, 429, 8, None),
            (Answer::LimiterUnavailable, 503, 14, None),
            (Answer::Shed, 503, 14, Some("shed")),
            (Answer::UpstreamUnreachable, 502, 14, None),
            (Answer::UpstreamTimedOut, 504, 14, None),
            (Answer::RequestTimeout, 408, 13, None),
            (Answer::Internal, 500, 13, None),
        ];
        for (answer, status, grpc, unasked) in all {
            assert_eq!(
                (
                    answer.status(),
                    answer.grpc_status().code(),
                    answer.unasked().map(Unasked::label)
                ),
                (status, grpc, unasked),
                "{answer:?}"
            );
            assert!(!answer.title().is_empty() && !answer.detail().is_empty());
        }
    }

    #[test]
    fn refused_outcomes_have_an_answer_and_admitted_ones_none() {
        for outcome in Outcome::ALL {
            assert_eq!(
                Answer::refusing(outcome).is_some(),
                !outcome.admitted(),
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn decided_labels_are_indexed_once_each() {
        let all = Decided::all();
        for (index, decided) in all.iter().enumerate() {
            assert_eq!(decided.index(), index);
        }
        let mut labels: Vec<_> = all.iter().map(|d| d.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Decided::COUNT);
    }
}
