//! The compiled JWT settings: which algorithms are allowed, where the keys come from, and
//! which claims must hold what (issuer, audience, expiry with a leeway), and which claims name
//! the consumer and the plan.

use super::jwks::{KeySet, VerifyKey};
use jsonwebtoken::Algorithm;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The algorithms allowed when the operator names none: the asymmetric families. HMAC needs a
/// secret shared with every issuer and must be asked for by name.
pub const DEFAULT_ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Every algorithm sluice verifies, by its JOSE name.
pub const ALGORITHM_NAMES: [(&str, Algorithm); 12] = [
    ("RS256", Algorithm::RS256),
    ("RS384", Algorithm::RS384),
    ("RS512", Algorithm::RS512),
    ("PS256", Algorithm::PS256),
    ("PS384", Algorithm::PS384),
    ("PS512", Algorithm::PS512),
    ("ES256", Algorithm::ES256),
    ("ES384", Algorithm::ES384),
    ("EdDSA", Algorithm::EdDSA),
    ("HS256", Algorithm::HS256),
    ("HS384", Algorithm::HS384),
    ("HS512", Algorithm::HS512),
];

pub const DEFAULT_LEEWAY_SECONDS: u64 = 60;
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(300);
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_JWKS_BYTES: usize = 1024 * 1024;

/// Compiled `jwt:` settings.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// Tokens signed with another algorithm are refused before any key is looked at.
    pub algorithms: Box<[Algorithm]>,
    /// The JWKS, when there is one.
    pub source: Option<KeySource>,
    /// The HMAC secret (`hmac_secret`), for tokens without a `kid`.
    pub hmac: Option<Arc<VerifyKey>>,
    /// Accepted `iss` values; empty: `iss` is not checked.
    pub issuers: Box<[Box<str>]>,
    /// Accepted `aud` values (a token's `aud` must hold one); empty: `aud` is not checked.
    pub audiences: Box<[Box<str>]>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway_seconds: u64,
    /// The claim naming the consumer (`sub` by default).
    pub consumer_claim: Box<str>,
    /// The claim naming the consumer's plan, if any.
    pub plan_claim: Option<Box<str>>,
}

/// Where the JWKS comes from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// A file, read when the configuration is compiled (at start and at each reload).
    File { path: PathBuf, keys: Arc<KeySet> },
    /// A URL fetched in the background, never on a request's path.
    Url(UrlSource),
}

/// A JWKS URL and how it is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlSource {
    pub url: Box<str>,
    pub refresh: Duration,
    pub fetch_timeout: Duration,
    pub max_bytes: usize,
    /// The shortest time between two fetches when unknown `kid`s ask for an early one.
    pub early_refresh_gap: Duration,
}

/// The early-refresh gap for a refresh interval: `min(refresh, 10 s)`.
pub fn early_refresh_gap(refresh: Duration) -> Duration {
    refresh.min(Duration::from_secs(10))
}

/// The JOSE name of `alg`.
pub fn algorithm_name(alg: Algorithm) -> &'static str {
    ALGORITHM_NAMES
        .iter()
        .find(|(_, known)| *known == alg)
        .map_or("?", |(name, _)| name)
}
