//! Verified identity from JWT bearer tokens: the bearer token of a request (`bearer`), key sets
//! from JWKS documents or an HMAC secret (`jwks`), fetched in the background from a URL
//! (`fetch`, `refresh`), the verifier itself (`verify`), its settings and its answers.
//! Signatures are checked by the `jsonwebtoken` crate; no cryptography is written here.

pub(crate) mod bearer;
pub(crate) mod cache;
pub(crate) mod fetch;
pub mod jwks;
pub(crate) mod refresh;
pub(crate) mod rejection;
pub(crate) mod settings;
#[doc(hidden)]
pub mod testing;
pub(crate) mod verify;

pub use bearer::{bearer_token, BearerProblem};
pub use refresh::{refresh_once, start_refresh, FetchOutcome, JwksRefresh};
pub use rejection::{JwtRejection, VerifiedToken};
pub use settings::{JwtSettings, KeySource, UrlSource};
pub use verify::JwtVerifier;
#[cfg(test)]
mod tests;
pub use jsonwebtoken::Algorithm;
