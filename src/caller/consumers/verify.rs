//! From a request's credentials to its consumer: the configured verifiers, tried in a fixed
//! order — a client certificate the listener verified, then an API key, then a bearer token
//! (`token.rs`).
//! The first credential presented decides: one that does not verify refuses the request even
//! where credentials are optional (a wrong key is a mistake to report, not an anonymous caller).

use std::collections::HashMap;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use smallvec::SmallVec;

use super::challenge::{self, Schemes};
use super::token::by_token;
use super::{AuthFailure, Consumer, PlanId, Plans, Via, MAX_CONSUMER_ID};
use crate::caller::api_keys::{presented_key, ApiKeys};
use crate::caller::client_cert::ClientCertificate;
use crate::caller::jwt::{JwtSettings, JwtVerifier};

/// What a request offers to verifiers.
#[derive(Clone, Copy)]
pub struct Credentials<'a> {
    pub headers: &'a HeaderMap,
    /// The client certificate the TLS listener verified, if the connection presented one.
    pub client_certificate: Option<&'a ClientCertificate>,
}

/// Which field of a verified client certificate names its consumer (`identity.mtls.consumer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum CertificateField {
    /// The subject's common name.
    SubjectCn,
    /// The first subjectAltName DNS name.
    SanDns,
    /// The first subjectAltName URI (a SPIFFE ID, say).
    SanUri,
    /// The first subjectAltName email.
    SanEmail,
    /// The certificate's SHA-256 fingerprint (64 hex digits).
    Fingerprint,
}

impl CertificateField {
    /// The field's value in `certificate`, if it has one.
    fn of(self, certificate: &ClientCertificate) -> Option<&str> {
        match self {
            CertificateField::SubjectCn => certificate.subject_cn.as_deref(),
            CertificateField::SanDns => certificate.dns_names.first().map(String::as_str),
            CertificateField::SanUri => certificate.uris.first().map(String::as_str),
            CertificateField::SanEmail => certificate.emails.first().map(String::as_str),
            CertificateField::Fingerprint => Some(&certificate.sha256),
        }
    }
}

/// Client certificates: the field that names the consumer, and consumers' plans.
#[derive(Debug, Clone)]
pub struct CertificateCheck {
    pub field: CertificateField,
    pub plans: HashMap<Arc<str>, PlanId>,
}

/// API keys: the header that presents one, and the keys of the file.
#[derive(Debug, Clone)]
pub struct KeyCheck {
    pub header: HeaderName,
    pub keys: Arc<ApiKeys>,
}

/// The configured verifiers and the plans their consumers may name.
#[derive(Debug, Default)]
pub struct Verifiers {
    plans: Plans,
    /// The claims `claim:NAME` key parts name: what a verified token's [`Consumer::claims`]
    /// hold, in this order.
    claim_names: Box<[Arc<str>]>,
    api_keys: Option<KeyCheck>,
    certificates: Option<CertificateCheck>,
    /// How bearer tokens are verified (`identity.jwt`); the verifier holding the keys and the
    /// tokens it verified is the running site's (`exchange::site`), handed to `identify`.
    jwt: Option<Arc<JwtSettings>>,
    /// The configuration names a verifier, even one that did not compile (its problems are
    /// reported where it is written, not again at each route asking for credentials).
    written: bool,
    /// `WWW-Authenticate` of a `401`, per [`AuthFailure`]: a challenge per verifier that takes a
    /// header, built at load.
    challenges: Box<[Option<HeaderValue>]>,
}

impl Verifiers {
    pub fn new(plans: Plans, claim_names: Vec<Arc<str>>) -> Verifiers {
        Verifiers {
            plans,
            claim_names: claim_names.into(),
            api_keys: None,
            certificates: None,
            jwt: None,
            written: false,
            challenges: Box::new([]),
        }
    }

    /// With API keys read from `api_keys`.
    pub fn with_api_keys(mut self, api_keys: Option<KeyCheck>) -> Verifiers {
        self.api_keys = api_keys;
        self.challenges = self.build_challenges();
        self
    }

    /// With bearer tokens verified as `jwt` says.
    pub fn with_jwt(mut self, jwt: Option<JwtSettings>) -> Verifiers {
        self.jwt = jwt.map(Arc::new);
        self.challenges = self.build_challenges();
        self
    }

    /// With consumers named by client certificates as `certificates` says.
    pub fn with_certificates(mut self, certificates: Option<CertificateCheck>) -> Verifiers {
        self.certificates = certificates;
        self
    }

    pub fn plans(&self) -> &Plans {
        &self.plans
    }

    pub fn claim_names(&self) -> &[Arc<str>] {
        &self.claim_names
    }

    /// The header API keys are presented in, when API keys are configured.
    pub fn api_key_header(&self) -> Option<&HeaderName> {
        self.api_keys.as_ref().map(|check| &check.header)
    }

    /// Marks a verifier as written in the configuration (compiled or not).
    pub fn written(mut self, written: bool) -> Verifiers {
        self.written = written;
        self
    }

    /// Whether the configuration names any verifier, compiled or not: routes may ask for
    /// credentials.
    pub fn any_written(&self) -> bool {
        self.written || self.verify_anything()
    }

    /// How bearer tokens are verified, when they are.
    pub fn jwt(&self) -> Option<&JwtSettings> {
        self.jwt.as_deref()
    }

    /// A verifier of bearer tokens as `identity.jwt` says, keeping the claims key parts name;
    /// its keys are a JWKS file's, or none yet for a JWKS URL.
    pub fn jwt_verifier(&self) -> Option<JwtVerifier> {
        let settings = self.jwt.as_deref()?;
        let names: Vec<&str> = self.claim_names.iter().map(|name| &**name).collect();
        Some(JwtVerifier::new(settings.clone(), &names, None))
    }

    /// Whether any verifier is configured: routes may ask for credentials.
    pub fn verify_anything(&self) -> bool {
        self.api_keys.is_some() || self.certificates.is_some() || self.jwt.is_some()
    }

    /// The plan of consumer `id` as the verifiers know it (the API-key file or `identity.mtls`
    /// names it), else the default plan. A JWT names its plan only in each token: a consumer
    /// known only by tokens is on the default plan here.
    pub fn plan_of(&self, id: &str) -> Option<PlanId> {
        let named = self.api_keys.as_ref().and_then(|check| {
            let (_, key) = check.keys.keys().find(|(_, key)| &**key.consumer == id)?;
            key.plan
        });
        let by_certificate = self.certificates.as_ref().and_then(|c| c.plans.get(id));
        by_certificate.copied().or_else(|| self.plans.of(named))
    }

    /// Whether a verifier that lists its consumers names consumer `id`: a key of the API-key
    /// file (revoked or not), or an `identity.mtls.plans` entry.
    pub fn lists(&self, id: &str) -> bool {
        let by_key = self.api_keys.as_ref().is_some_and(|check| {
            let mut keys = check.keys.keys();
            keys.any(|(_, key)| &**key.consumer == id)
        });
        by_key
            || self
                .certificates
                .as_ref()
                .is_some_and(|c| c.plans.contains_key(id))
    }

    /// Whether a verifier names consumers it cannot list: bearer tokens (a claim of any token
    /// that verifies) or client certificates (a field of any certificate the listener
    /// verifies).
    pub fn names_unlisted(&self) -> bool {
        self.jwt.is_some() || self.certificates.is_some()
    }

    /// The `WWW-Authenticate` value of a `401` for `failure`.
    pub fn challenge(&self, failure: AuthFailure) -> Option<&HeaderValue> {
        self.challenges.get(failure as usize)?.as_ref()
    }

    /// The consumer the request's credential names; `Ok(None)` when it presents none. Bearer
    /// tokens are verified by `jwt`, the running site's verifier.
    pub fn identify(
        &self,
        credentials: &Credentials<'_>,
        now_unix_secs: u64,
        jwt: Option<&JwtVerifier>,
    ) -> Result<Option<Consumer>, AuthFailure> {
        if let (Some(check), Some(certificate)) =
            (&self.certificates, credentials.client_certificate)
        {
            return self.by_certificate(check, certificate).map(Some);
        }
        if let Some(check) = &self.api_keys {
            match presented_key(credentials.headers, &check.header) {
                Ok(Some(presented)) => return self.by_api_key(check, presented).map(Some),
                Ok(None) => {}
                Err(_) => return Err(AuthFailure::Malformed),
            }
        }
        match (&self.jwt, jwt) {
            (Some(_), Some(jwt)) => by_token(jwt, &self.plans, credentials.headers, now_unix_secs),
            // Tokens are verified, but by no verifier here: refuse rather than read as anonymous.
            (Some(_), None) => Err(AuthFailure::NoKeys),
            (None, _) => Ok(None),
        }
    }

    /// The consumer of the API key `presented`.
    fn by_api_key(&self, check: &KeyCheck, presented: &[u8]) -> Result<Consumer, AuthFailure> {
        let key = check
            .keys
            .verify(presented)
            .ok_or(AuthFailure::UnknownKey)?;
        if key.disabled {
            return Err(AuthFailure::RevokedKey);
        }
        Ok(Consumer {
            id: Arc::clone(key.consumer),
            plan: self.plans.of(key.plan),
            claims: SmallVec::new(),
            via: Via::ApiKey,
        })
    }

    /// The consumer a verified client certificate names.
    fn by_certificate(
        &self,
        check: &CertificateCheck,
        certificate: &ClientCertificate,
    ) -> Result<Consumer, AuthFailure> {
        let id = check
            .field
            .of(certificate)
            .filter(|id| !id.is_empty() && id.len() <= MAX_CONSUMER_ID)
            .ok_or(AuthFailure::CertificateWithoutConsumer)?;
        let id: Arc<str> = id.into();
        let plan = check
            .plans
            .get(&id)
            .copied()
            .or_else(|| self.plans.of(None));
        Ok(Consumer {
            id,
            plan,
            claims: SmallVec::new(),
            via: Via::ClientCertificate,
        })
    }

    /// One `WWW-Authenticate` value per failure, for the verifiers that read a header.
    fn build_challenges(&self) -> Box<[Option<HeaderValue>]> {
        challenge::challenges(Schemes {
            api_key_header: self.api_key_header(),
            bearer: self.jwt.is_some(),
        })
    }
}
