//! What verifying a bearer token gives: the verified consumer, plan and asked-for claims, or
//! the one reason it was refused (a metric label and a fixed problem text, never client bytes).

use smallvec::SmallVec;
use std::sync::Arc;

/// A token that verified: who is calling, on which plan, and the claims the key parts need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    /// The consumer claim's value (a string as is, a number in its JSON text).
    pub consumer: Arc<str>,
    /// The plan claim's value, when a plan claim is configured and the token has it (a string
    /// as is, a number in its JSON text).
    pub plan: Option<Box<str>>,
    /// The values of the claims named at construction, in that order: strings as is, numbers
    /// and booleans in their JSON text, anything else (or absent) `None`.
    pub claims: SmallVec<[Option<Box<str>>; 2]>,
}

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JwtRejection {
    /// Not three base64url parts of JSON, or a claim of the wrong type (a time claim that is not
    /// a number, a plan claim that is not a string or number).
    Malformed,
    /// The header's `alg` is not allowed here (`none` never is).
    AlgorithmNotAllowed,
    /// No key has the token's `kid` (or, without a `kid`, not exactly one key fits its `alg`).
    UnknownKey,
    /// The key of that `kid` is of another kind than the token's `alg` (algorithm confusion).
    KeyMismatch,
    /// The signature does not verify.
    BadSignature,
    /// No `exp` claim.
    NoExpiry,
    /// `exp` has passed (beyond the leeway).
    Expired,
    /// `nbf` is still ahead (beyond the leeway).
    NotYetValid,
    /// `iss` is not one of the configured issuers.
    WrongIssuer,
    /// `aud` holds none of the configured audiences.
    WrongAudience,
    /// The consumer claim is missing or empty.
    NoConsumer,
    /// No key is loaded yet (the JWKS URL has not answered since start).
    NoKeys,
}

impl JwtRejection {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            JwtRejection::Malformed => "malformed",
            JwtRejection::AlgorithmNotAllowed => "algorithm_not_allowed",
            JwtRejection::UnknownKey => "unknown_key",
            JwtRejection::KeyMismatch => "key_mismatch",
            JwtRejection::BadSignature => "bad_signature",
            JwtRejection::NoExpiry => "no_expiry",
            JwtRejection::Expired => "expired",
            JwtRejection::NotYetValid => "not_yet_valid",
            JwtRejection::WrongIssuer => "wrong_issuer",
            JwtRejection::WrongAudience => "wrong_audience",
            JwtRejection::NoConsumer => "no_consumer",
            JwtRejection::NoKeys => "no_keys",
        }
    }

    /// The problem text for the response body: fixed, never the client's bytes.
    pub fn detail(self) -> &'static str {
        match self {
            JwtRejection::Malformed => "the bearer token is not a well-formed JWT",
            JwtRejection::AlgorithmNotAllowed => "the token's signing algorithm is not accepted",
            JwtRejection::UnknownKey => "the token was signed with an unknown key",
            JwtRejection::KeyMismatch => "the token's algorithm does not match its key",
            JwtRejection::BadSignature => "the token's signature does not verify",
            JwtRejection::NoExpiry => "the token has no expiry (exp)",
            JwtRejection::Expired => "the token has expired",
            JwtRejection::NotYetValid => "the token is not valid yet",
            JwtRejection::WrongIssuer => "the token was issued by an issuer not accepted here",
            JwtRejection::WrongAudience => "the token is not meant for this audience",
            JwtRejection::NoConsumer => "the token names no consumer",
            JwtRejection::NoKeys => "no verification keys are loaded yet",
        }
    }

    /// Every rejection, for pre-resolving metric handles.
    pub const ALL: [JwtRejection; 12] = [
        JwtRejection::Malformed,
        JwtRejection::AlgorithmNotAllowed,
        JwtRejection::UnknownKey,
        JwtRejection::KeyMismatch,
        JwtRejection::BadSignature,
        JwtRejection::NoExpiry,
        JwtRejection::Expired,
        JwtRejection::NotYetValid,
        JwtRejection::WrongIssuer,
        JwtRejection::WrongAudience,
        JwtRejection::NoConsumer,
        JwtRejection::NoKeys,
    ];
}
