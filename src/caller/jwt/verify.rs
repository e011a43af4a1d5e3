//! Verifying a bearer token: the header's algorithm against the allow-list, the key by `kid`,
//! the signature (by `jsonwebtoken`), then the claims against the settings and the given time.
//! Nothing here waits: the keys are whatever the last load or fetch installed. A token verified
//! once is held (`cache.rs`) until other keys are installed; its times are checked every time.

use super::cache::{Validity, VerifiedTokens};
use super::jwks::{KeySet, Selection, VerifyKey};
use super::rejection::{JwtRejection, VerifiedToken};
use super::settings::{JwtSettings, KeySource, UrlSource};
use arc_swap::ArcSwap;
use base64::Engine;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};
use std::sync::Arc;
use tokio::sync::Notify;

type Claims = Map<String, Value>;

/// Verifies bearer tokens with the keys of one configuration.
pub struct JwtVerifier {
    settings: JwtSettings,
    /// Claims whose values [`VerifiedToken::claims`] carries, in this order.
    claim_names: Box<[Box<str>]>,
    /// One signature-only validation per allowed algorithm (claims are checked here).
    validations: Box<[(Algorithm, Validation)]>,
    keys: ArcSwap<KeySet>,
    /// Woken when a token names a `kid` no key has: the refresh may fetch early.
    refresh_wanted: Notify,
    /// Tokens verified with the keys in force (`cache.rs`).
    verified: VerifiedTokens,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("settings", &self.settings)
            .field("claim_names", &self.claim_names)
            .field("keys", &self.keys.load().keys.len())
            .finish()
    }
}

impl JwtVerifier {
    /// A verifier for `settings`, carrying the values of `claim_names` in each verified token.
    /// With `previous` of the same JWKS URL, its keys are kept until the next fetch (a reload
    /// does not drop to "no keys"); a file's keys are those the configuration just read.
    pub fn new(
        settings: JwtSettings,
        claim_names: &[&str],
        previous: Option<&JwtVerifier>,
    ) -> JwtVerifier {
        let keys = match &settings.source {
            Some(KeySource::File { keys, .. }) => Arc::clone(keys),
            _ => Arc::new(KeySet::default()),
        };
        let validations = settings
            .algorithms
            .iter()
            .map(|alg| (*alg, signature_only(*alg)))
            .collect();
        let verifier = JwtVerifier {
            claim_names: claim_names.iter().map(|name| (*name).into()).collect(),
            validations,
            keys: ArcSwap::new(keys),
            refresh_wanted: Notify::new(),
            verified: VerifiedTokens::default(),
            settings,
        };
        if let Some(previous) = previous {
            verifier.keep_keys_of(previous);
        }
        verifier
    }

    /// Takes over `previous`'s fetched keys when both fetch the same JWKS URL (a reload does
    /// not drop to "no keys" until the next fetch); `false`, and nothing changes, otherwise.
    pub fn keep_keys_of(&self, previous: &JwtVerifier) -> bool {
        let same_url = match (self.url_source(), previous.url_source()) {
            (Some(now), Some(before)) => now.url == before.url,
            _ => false,
        };
        if same_url {
            self.keys.store(previous.keys.load_full());
            self.verified.keys_changed();
        }
        same_url
    }

    /// Whether the keys of a JWKS URL are still to come: it has not answered since this
    /// verifier (or the one whose keys it kept) was made. Tokens of its keys are refused as
    /// [`JwtRejection::NoKeys`] meanwhile (an `hmac_secret`'s tokens still verify).
    pub fn awaits_keys(&self) -> bool {
        self.url_source().is_some() && self.keys.load().is_empty()
    }

    pub fn settings(&self) -> &JwtSettings {
        &self.settings
    }

    /// The JWKS URL, when the keys are fetched.
    pub fn url_source(&self) -> Option<&UrlSource> {
        match &self.settings.source {
            Some(KeySource::Url(url)) => Some(url),
            _ => None,
        }
    }

    /// The keys in force now.
    pub fn keys(&self) -> Arc<KeySet> {
        self.keys.load_full()
    }

    /// Puts `keys` in force (a fetch's result); tokens verified before are verified again.
    pub fn install(&self, keys: KeySet) {
        // Keys first, then the cache's generation: a verification that reads the new
        // generation also reads the new keys.
        self.keys.store(Arc::new(keys));
        self.verified.keys_changed();
    }

    /// Tokens held verified (tests and metrics).
    pub fn verified_tokens(&self) -> usize {
        self.verified.len()
    }

    /// Resolves when a token named an unknown `kid` since the last call.
    pub async fn refresh_wanted(&self) {
        self.refresh_wanted.notified().await;
    }

    /// Verifies `token` at `now_unix_secs`: from the cache of verified tokens when it holds it
    /// (its times checked again), else in full.
    pub fn verify(&self, token: &str, now_unix_secs: u64) -> Result<VerifiedToken, JwtRejection> {
        let now = now_unix_secs as f64;
        if let Some(held) = self.verified.get(token, now) {
            return held;
        }
        let generation = self.verified.generation();
        let (verified, validity) = self.verify_in_full(token, now)?;
        self.verified
            .insert(token, &verified, validity, generation, now);
        Ok(verified)
    }

    fn verify_in_full(
        &self,
        token: &str,
        now: f64,
    ) -> Result<(VerifiedToken, Validity), JwtRejection> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| header_rejection(token))?;
        let validation = self
            .validations
            .iter()
            .find(|(alg, _)| *alg == header.alg)
            .map(|(_, validation)| validation)
            .ok_or(JwtRejection::AlgorithmNotAllowed)?;
        let keys = self.keys.load();
        let key = self.key_for(&keys, header.kid.as_deref(), header.alg)?;
        let claims = jsonwebtoken::decode::<Claims>(token, &key.key, validation)
            .map_err(|e| signature_rejection(e.kind()))?
            .claims;
        let validity = self.check_claims(&claims, now)?;
        Ok((self.verified(&claims)?, validity))
    }

    fn key_for<'k>(
        &'k self,
        keys: &'k KeySet,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<&'k VerifyKey, JwtRejection> {
        if let (None, Some(hmac)) = (kid, &self.settings.hmac) {
            if hmac.fits(alg) {
                return Ok(hmac);
            }
        }
        // No key at all where keys were to come (a JWKS URL that has not answered yet): the
        // token cannot be judged, which is not the same as a key unknown to a loaded set.
        if keys.is_empty() && (self.settings.source.is_some() || self.settings.hmac.is_none()) {
            return Err(JwtRejection::NoKeys);
        }
        keys.select(kid, alg).map_err(|selection| match selection {
            Selection::Unknown => {
                if kid.is_some() {
                    self.refresh_wanted.notify_one();
                }
                JwtRejection::UnknownKey
            }
            Selection::WrongKind => JwtRejection::KeyMismatch,
        })
    }

    /// `exp` (required), `nbf`, `iss`, `aud`, each of the right JSON type; what `exp` and `nbf`
    /// say, with the leeway, for the cache to check again.
    fn check_claims(&self, claims: &Claims, now: f64) -> Result<Validity, JwtRejection> {
        let leeway = self.settings.leeway_seconds as f64;
        let exp = claims.get("exp").ok_or(JwtRejection::NoExpiry)?;
        let exp = exp.as_f64().ok_or(JwtRejection::Malformed)?;
        let from = match claims.get("nbf") {
            Some(nbf) => Some(nbf.as_f64().ok_or(JwtRejection::Malformed)? - leeway),
            None => None,
        };
        let validity = Validity {
            until: exp + leeway,
            from,
        };
        validity.check(now)?;
        if !self.settings.issuers.is_empty() {
            let iss = claims.get("iss").and_then(Value::as_str);
            if !iss.is_some_and(|iss| self.settings.issuers.iter().any(|ok| **ok == *iss)) {
                return Err(JwtRejection::WrongIssuer);
            }
        }
        if !self.settings.audiences.is_empty() && !self.audience_matches(claims.get("aud")) {
            return Err(JwtRejection::WrongAudience);
        }
        Ok(validity)
    }

    fn audience_matches(&self, aud: Option<&Value>) -> bool {
        let accepted = |aud: &str| self.settings.audiences.iter().any(|ok| **ok == *aud);
        match aud {
            Some(Value::String(aud)) => accepted(aud),
            Some(Value::Array(auds)) => auds.iter().filter_map(Value::as_str).any(accepted),
            _ => false,
        }
    }

    fn verified(&self, claims: &Claims) -> Result<VerifiedToken, JwtRejection> {
        let consumer = claims
            .get(&*self.settings.consumer_claim)
            .and_then(scalar_text)
            .filter(|consumer| !consumer.is_empty())
            .ok_or(JwtRejection::NoConsumer)?;
        let plan = match self
            .settings
            .plan_claim
            .as_deref()
            .map(|name| claims.get(name))
        {
            None | Some(None | Some(Value::Null)) => None,
            Some(Some(value)) => Some(
                plan_text(value)
                    .filter(|plan| !plan.is_empty())
                    .ok_or(JwtRejection::Malformed)?,
            ),
        };
        let values = self
            .claim_names
            .iter()
            .map(|name| claims.get(&**name).and_then(scalar_text))
            .collect();
        Ok(VerifiedToken {
            consumer: consumer.into(),
            plan,
            claims: values,
        })
    }
}

/// A validation that checks only the signature and its algorithm: the claims are checked by
/// [`JwtVerifier::check_claims`] against the time it is given, with strict JSON types.
fn signature_only(alg: Algorithm) -> Validation {
    let mut validation = Validation::new(alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.leeway = 0;
    validation
}

/// A string as is; a number or boolean in its JSON text; anything else `None`.
fn scalar_text(value: &Value) -> Option<Box<str>> {
    match value {
        Value::String(text) => Some(text.as_str().into()),
        Value::Number(number) => Some(number.to_string().into()),
        Value::Bool(flag) => Some(if *flag { "true" } else { "false" }.into()),
        _ => None,
    }
}

/// A plan claim's text: a string, or a number in its JSON text (a boolean names no plan).
fn plan_text(value: &Value) -> Option<Box<str>> {
    match value {
        Value::String(_) | Value::Number(_) => scalar_text(value),
        _ => None,
    }
}

/// Why a header did not decode: an `alg` sluice does not know (`none` among them) is an
/// algorithm not allowed; anything else is a malformed token.
fn header_rejection(token: &str) -> JwtRejection {
    #[derive(serde::Deserialize)]
    struct AlgOnly {
        alg: String,
    }
    let header = token.split('.').next().unwrap_or_default();
    let named_alg = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|json| serde_json::from_slice::<AlgOnly>(&json).ok());
    match named_alg {
        Some(named) if named.alg.parse::<Algorithm>().is_err() => JwtRejection::AlgorithmNotAllowed,
        _ => JwtRejection::Malformed,
    }
}

fn signature_rejection(kind: &ErrorKind) -> JwtRejection {
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => JwtRejection::BadSignature,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => JwtRejection::KeyMismatch,
        _ => JwtRejection::Malformed,
    }
}
