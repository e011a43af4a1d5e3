//! A set of verification keys: parsed from JWKS JSON (RFC 7517) or made from an HMAC secret,
//! each key tied to its algorithm family (and to one algorithm when the JWK names it), so a key
//! can only ever verify tokens of its own kind.

use jsonwebtoken::jwk::{Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};
use std::str::FromStr;

/// The family of `alg` (jsonwebtoken 10.3 keeps its own `Algorithm::family` to itself).
pub fn family_of(alg: Algorithm) -> AlgorithmFamily {
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => AlgorithmFamily::Hmac,
        Algorithm::ES256 | Algorithm::ES384 => AlgorithmFamily::Ec,
        Algorithm::EdDSA => AlgorithmFamily::Ed,
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => AlgorithmFamily::Rsa,
    }
}

/// One key a token may be verified with.
pub struct VerifyKey {
    /// The JWK's `kid`; `None` for a key without one (or the configured HMAC secret).
    pub kid: Option<Box<str>>,
    /// The one algorithm the JWK allows (`alg`), when it names one.
    pub alg: Option<Algorithm>,
    pub key: DecodingKey,
}

impl VerifyKey {
    /// Whether this key may verify a token signed with `alg`: same family (an RSA public key
    /// never verifies an HS256 token), and the JWK's own `alg` when it has one.
    pub fn fits(&self, alg: Algorithm) -> bool {
        self.key.family() == family_of(alg) && self.alg.is_none_or(|own| own == alg)
    }
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field("family", &self.key.family())
            .finish()
    }
}

/// The keys loaded from one source, in the order the set lists them.
#[derive(Debug, Default)]
pub struct KeySet {
    pub keys: Box<[VerifyKey]>,
}

/// What a JWKS document held: its usable keys, and how many entries were skipped (encryption
/// keys, unsupported key types or algorithms, broken parameters).
#[derive(Debug)]
pub struct ParsedJwks {
    pub set: KeySet,
    pub skipped: usize,
}

impl KeySet {
    /// The key for a token with `kid` and `alg`: with a `kid`, the key of that id (`Err` when
    /// none has it, `Ok(None)` when it has another kind); without one, the only key that fits
    /// `alg` (`Err` when none or several do: trying each would multiply the cost of a forged
    /// token).
    pub fn select(&self, kid: Option<&str>, alg: Algorithm) -> Result<&VerifyKey, Selection> {
        match kid {
            Some(kid) => {
                let key = self
                    .keys
                    .iter()
                    .find(|key| key.kid.as_deref() == Some(kid))
                    .ok_or(Selection::Unknown)?;
                if key.fits(alg) {
                    Ok(key)
                } else {
                    Err(Selection::WrongKind)
                }
            }
            None => {
                let mut fitting = self.keys.iter().filter(|key| key.fits(alg));
                match (fitting.next(), fitting.next()) {
                    (Some(key), None) => Ok(key),
                    _ => Err(Selection::Unknown),
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// Why no key was selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// No key has the token's `kid` (or, without one, not exactly one key fits its algorithm).
    Unknown,
    /// The key of that `kid` is of another family or algorithm than the token claims.
    WrongKind,
}

/// Parses a JWKS document (`{"keys": [...]}`); `Err` when it is not one. Keys that cannot be
/// used for signatures are skipped and counted, never fatal: one exotic key must not hide the
/// others.
pub fn parse(text: &[u8]) -> Result<ParsedJwks, String> {
    #[derive(serde::Deserialize)]
    struct Document {
        keys: Vec<serde_json::Value>,
    }
    let document: Document =
        serde_json::from_slice(text).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut keys = Vec::with_capacity(document.keys.len());
    let mut skipped = 0;
    for entry in document.keys {
        match key_of(entry) {
            Some(key) => keys.push(key),
            None => skipped += 1,
        }
    }
    Ok(ParsedJwks {
        set: KeySet { keys: keys.into() },
        skipped,
    })
}

/// The verification key of one JWK, when it is a signature key of a supported kind.
fn key_of(entry: serde_json::Value) -> Option<VerifyKey> {
    let jwk: Jwk = serde_json::from_value(entry).ok()?;
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(named) => Some(signature_algorithm(named)?),
    };
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    if alg.is_some_and(|alg| family_of(alg) != key.family()) {
        return None;
    }
    Some(VerifyKey {
        kid: jwk.common.key_id.map(String::into_boxed_str),
        alg,
        key,
    })
}

/// The signature algorithm a JWK's `alg` names; `None` for encryption algorithms.
fn signature_algorithm(named: KeyAlgorithm) -> Option<Algorithm> {
    Algorithm::from_str(&named.to_string()).ok()
}

/// A key set holding one HMAC secret (no `kid`).
pub fn hmac_key(secret: &[u8]) -> VerifyKey {
    VerifyKey {
        kid: None,
        alg: None,
        key: DecodingKey::from_secret(secret),
    }
}
