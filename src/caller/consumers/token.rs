//! The bearer-token step of identifying a caller: the token of `Authorization: Bearer`, verified
//! by the configured [`JwtVerifier`], becomes a [`Consumer`] — its id from the consumer claim (at
//! most [`MAX_CONSUMER_ID`] bytes), its plan from the plan claim through [`Plans`] (a plan not
//! declared: refused; no plan claim: the default plan), and the claims `claim:NAME` key parts
//! use (a value over [`MAX_CLAIM_VALUE`] bytes counts as missing). Each refusal of the verifier
//! is one [`AuthFailure`].

use http::header::AUTHORIZATION;
use http::HeaderMap;

use super::{AuthFailure, Consumer, Plans, Via, MAX_CLAIM_VALUE, MAX_CONSUMER_ID};
use crate::caller::jwt::{bearer_token, BearerProblem, JwtRejection, JwtVerifier, VerifiedToken};

/// The consumer of the request's bearer token at `now_unix_secs`; `Ok(None)` when the request
/// presents none (no `Authorization` header, or one of another scheme, which is not sluice's to
/// verify).
pub fn by_token(
    verifier: &JwtVerifier,
    plans: &Plans,
    headers: &HeaderMap,
    now_unix_secs: u64,
) -> Result<Option<Consumer>, AuthFailure> {
    let values = headers.get_all(AUTHORIZATION).iter().map(|v| v.as_bytes());
    let token = match bearer_token(values) {
        Ok(Some(token)) => token,
        Ok(None) | Err(BearerProblem::OtherScheme) => return Ok(None),
        // Repeated, `Bearer` without a token, too long, bytes no token holds.
        Err(_) => return Err(AuthFailure::Malformed),
    };
    let verified = verifier.verify(token, now_unix_secs).map_err(failure_of)?;
    consumer_of(verified, plans).map(Some)
}

/// The consumer a verified token names.
fn consumer_of(token: VerifiedToken, plans: &Plans) -> Result<Consumer, AuthFailure> {
    if token.consumer.len() > MAX_CONSUMER_ID {
        return Err(AuthFailure::NoConsumer);
    }
    let plan = match token.plan.as_deref() {
        None => plans.of(None),
        Some(name) => Some(plans.find(name).ok_or(AuthFailure::UnknownPlan)?),
    };
    let mut claims = token.claims;
    for value in &mut claims {
        if value.as_ref().is_some_and(|v| v.len() > MAX_CLAIM_VALUE) {
            *value = None;
        }
    }
    Ok(Consumer {
        id: token.consumer,
        plan,
        claims,
        via: Via::Jwt,
    })
}

/// The auth failure of a refused token.
pub fn failure_of(rejection: JwtRejection) -> AuthFailure {
    match rejection {
        JwtRejection::Malformed => AuthFailure::MalformedToken,
        JwtRejection::AlgorithmNotAllowed => AuthFailure::AlgorithmNotAllowed,
        JwtRejection::UnknownKey => AuthFailure::UnknownSigningKey,
        JwtRejection::KeyMismatch => AuthFailure::KeyMismatch,
        JwtRejection::BadSignature => AuthFailure::BadSignature,
        JwtRejection::NoExpiry => AuthFailure::NoExpiry,
        JwtRejection::Expired => AuthFailure::Expired,
        JwtRejection::NotYetValid => AuthFailure::NotYetValid,
        JwtRejection::WrongIssuer => AuthFailure::WrongIssuer,
        JwtRejection::WrongAudience => AuthFailure::WrongAudience,
        JwtRejection::NoConsumer => AuthFailure::NoConsumer,
        JwtRejection::NoKeys => AuthFailure::NoKeys,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::HeaderValue;
    use serde_json::json;

    use super::*;
    use crate::caller::consumers::PlanId;
    use crate::caller::jwt::jwks;
    use crate::caller::jwt::testing::{self, Family, TestKey};
    use crate::caller::jwt::{Algorithm, JwtSettings, KeySource};

    const NOW: u64 = 1_800_000_000;

    fn key() -> &'static TestKey {
        static KEY: std::sync::OnceLock<TestKey> = std::sync::OnceLock::new();
        KEY.get_or_init(|| TestKey::generate(Family::P256, Algorithm::ES256, Some("k1")))
    }

    fn verifier() -> JwtVerifier {
        let keys = jwks::parse(testing::jwks(&[key()]).as_bytes()).unwrap().set;
        let settings = JwtSettings {
            algorithms: [Algorithm::ES256].into(),
            source: Some(KeySource::File {
                path: "/test/jwks.json".into(),
                keys: Arc::new(keys),
            }),
            hmac: None,
            issuers: Box::default(),
            audiences: Box::default(),
            leeway_seconds: 0,
            consumer_claim: "sub".into(),
            plan_claim: Some("plan".into()),
        };
        JwtVerifier::new(settings, &["org"], None)
    }

    fn plans() -> Plans {
        Plans::new(vec!["free".into(), "pro".into()], Some(PlanId(0)))
    }

    fn identify(authorization: &[&str]) -> Result<Option<Consumer>, AuthFailure> {
        let mut headers = HeaderMap::new();
        for value in authorization {
            headers.append(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        }
        by_token(&verifier(), &plans(), &headers, NOW)
    }

    fn bearer(claims: serde_json::Value) -> String {
        format!("Bearer {}", key().sign(&claims))
    }

    fn claims(extra: serde_json::Value) -> serde_json::Value {
        let mut claims = json!({"sub": "alice", "exp": NOW + 60});
        for (name, value) in extra.as_object().unwrap() {
            claims[name] = value.clone();
        }
        claims
    }

    #[test]
    fn a_verified_token_names_its_consumer_plan_and_claims() {
        let consumer = identify(&[&bearer(claims(json!({"plan": "pro", "org": "acme"})))])
            .unwrap()
            .unwrap();
        assert_eq!(&*consumer.id, "alice");
        assert_eq!(consumer.plan, Some(PlanId(1)));
        assert_eq!(consumer.claims[0].as_deref(), Some("acme"));
        assert_eq!(consumer.via, Via::Jwt);
        let without_plan = identify(&[&bearer(claims(json!({"org": 42})))])
            .unwrap()
            .unwrap();
        assert_eq!(without_plan.plan, Some(PlanId(0)), "the default plan");
        assert_eq!(without_plan.claims[0].as_deref(), Some("42"));
    }

    #[test]
    fn an_unknown_plan_is_refused_and_over_long_values_are_bounded() {
        assert_eq!(
            identify(&[&bearer(claims(json!({"plan": "gold"})))]),
            Err(AuthFailure::UnknownPlan)
        );
        let long_id = "a".repeat(MAX_CONSUMER_ID + 1);
        assert_eq!(
            identify(&[&bearer(claims(json!({"sub": long_id})))]),
            Err(AuthFailure::NoConsumer)
        );
        let long_claim = "o".repeat(MAX_CLAIM_VALUE + 1);
        let consumer = identify(&[&bearer(claims(json!({"org": long_claim})))])
            .unwrap()
            .unwrap();
        assert_eq!(
            consumer.claims[0], None,
            "an over-long claim counts as missing"
        );
    }

    #[test]
    fn another_scheme_is_no_token_and_a_broken_header_is_malformed() {
        assert_eq!(identify(&[]), Ok(None));
        assert_eq!(identify(&["Basic dXNlcjpwdw=="]), Ok(None));
        assert_eq!(identify(&["Bearer"]), Err(AuthFailure::Malformed));
        let token = bearer(claims(json!({})));
        assert_eq!(identify(&[&token, &token]), Err(AuthFailure::Malformed));
        assert_eq!(
            identify(&["Bearer not.a.jwt"]),
            Err(AuthFailure::MalformedToken)
        );
        assert_eq!(
            identify(&[&bearer(json!({"sub": "alice", "exp": NOW - 1}))]),
            Err(AuthFailure::Expired)
        );
    }

    #[test]
    fn every_rejection_is_a_token_failure() {
        for rejection in JwtRejection::ALL {
            assert_eq!(failure_of(rejection).via(), Some(Via::Jwt), "{rejection:?}");
        }
    }
}
