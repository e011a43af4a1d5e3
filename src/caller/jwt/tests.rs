//! The verifier against tokens signed here with every family, and every refusal.

use super::jwks::{self, KeySet};
use super::rejection::JwtRejection;
use super::settings::{JwtSettings, KeySource, DEFAULT_ALGORITHMS};
use super::testing::{self, Family, TestKey};
use super::verify::JwtVerifier;
use jsonwebtoken::Algorithm;
use serde_json::json;
use std::sync::{Arc, OnceLock};

const ISS: &str = "https://idp.example";
const AUD: &str = "api";
const NOW: u64 = 1_800_000_000;

struct Keys {
    rsa: TestKey,
    p256: TestKey,
    p384: TestKey,
    ed: TestKey,
    hmac: TestKey,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| Keys {
        rsa: TestKey::generate(Family::Rsa, Algorithm::RS256, Some("rsa-1")),
        p256: TestKey::generate(Family::P256, Algorithm::ES256, Some("ec-256")),
        p384: TestKey::generate(Family::P384, Algorithm::ES384, Some("ec-384")),
        ed: TestKey::generate(Family::Ed25519, Algorithm::EdDSA, Some("ed-1")),
        hmac: TestKey::hmac(&[7u8; 32], Algorithm::HS256, Some("oct-1")),
    })
}

fn key_set(keys: &[&TestKey]) -> Arc<KeySet> {
    Arc::new(jwks::parse(testing::jwks(keys).as_bytes()).unwrap().set)
}

fn settings(keys: &[&TestKey], algorithms: &[Algorithm]) -> JwtSettings {
    JwtSettings {
        algorithms: algorithms.into(),
        source: Some(KeySource::File {
            path: "/test/jwks.json".into(),
            keys: key_set(keys),
        }),
        hmac: None,
        issuers: [ISS.into()].into(),
        audiences: ["other".into(), AUD.into()].into(),
        leeway_seconds: 60,
        consumer_claim: "sub".into(),
        plan_claim: Some("plan".into()),
    }
}

fn every_family() -> JwtVerifier {
    let k = keys();
    let mut algorithms = DEFAULT_ALGORITHMS.to_vec();
    algorithms.extend([Algorithm::HS256, Algorithm::HS384, Algorithm::HS512]);
    JwtVerifier::new(
        settings(&[&k.rsa, &k.p256, &k.p384, &k.ed, &k.hmac], &algorithms),
        &["tenant", "level"],
        None,
    )
}

fn good_claims() -> serde_json::Value {
    testing::claims("alice", ISS, AUD, NOW)
}

#[test]
fn a_token_of_every_family_verifies_and_carries_its_consumer_plan_and_claims() {
    let k = keys();
    let verifier = every_family();
    let mut claims = good_claims();
    claims["plan"] = json!("pro");
    claims["tenant"] = json!("acme");
    claims["level"] = json!(3);
    let signers = [
        k.rsa.clone(),
        k.rsa.with_alg(Algorithm::RS384),
        k.rsa.with_alg(Algorithm::RS512),
        k.rsa.with_alg(Algorithm::PS256),
        k.rsa.with_alg(Algorithm::PS384),
        k.rsa.with_alg(Algorithm::PS512),
        k.p256.clone(),
        k.p384.clone(),
        k.ed.clone(),
        k.hmac.clone(),
        k.hmac.with_alg(Algorithm::HS384),
        k.hmac.with_alg(Algorithm::HS512),
    ];
    for signer in &signers {
        // The JWKs name RS256 / HS256: a set whose keys name no alg serves every algorithm of
        // the family.
        let mut unnamed = signer.clone();
        unnamed.jwk.as_object_mut().unwrap().remove("alg");
        let verifier_of_one = JwtVerifier::new(
            settings(&[&unnamed], &[signer.alg]),
            &["tenant", "level"],
            None,
        );
        let token = signer.sign(&claims);
        let verified = verifier_of_one.verify(&token, NOW).unwrap_or_else(|e| {
            panic!("{:?}: {e:?}", signer.alg);
        });
        assert_eq!(&*verified.consumer, "alice");
        assert_eq!(verified.plan.as_deref(), Some("pro"));
        assert_eq!(verified.claims[0].as_deref(), Some("acme"));
        assert_eq!(verified.claims[1].as_deref(), Some("3"));
    }
    assert!(verifier.verify(&k.p384.sign(&claims), NOW).is_ok());
    assert!(verifier.verify(&k.ed.sign(&claims), NOW).is_ok());
}

#[test]
fn a_jwk_that_names_its_algorithm_verifies_only_that_one() {
    let k = keys();
    let verifier = every_family();
    let ps256 = k.rsa.with_alg(Algorithm::PS256);
    assert_eq!(
        verifier.verify(&ps256.sign(&good_claims()), NOW),
        Err(JwtRejection::KeyMismatch)
    );
}

#[test]
fn unsigned_tokens_and_algorithms_not_allowed_are_refused() {
    let k = keys();
    let verifier = JwtVerifier::new(settings(&[&k.rsa, &k.hmac], &DEFAULT_ALGORITHMS), &[], None);
    for kid in [None, Some("rsa-1")] {
        let unsigned = testing::unsigned_token(&good_claims(), kid);
        assert_eq!(
            verifier.verify(&unsigned, NOW),
            Err(JwtRejection::AlgorithmNotAllowed)
        );
    }
    // HMAC is off unless named, even with an oct key in the set.
    assert_eq!(
        verifier.verify(&k.hmac.sign(&good_claims()), NOW),
        Err(JwtRejection::AlgorithmNotAllowed)
    );
}

#[test]
fn an_hs256_token_signed_with_the_rsa_public_key_is_refused() {
    let k = keys();
    let verifier = every_family();
    let forged = testing::hs256_with_public_key(&k.rsa, &good_claims());
    assert_eq!(
        verifier.verify(&forged, NOW),
        Err(JwtRejection::KeyMismatch)
    );
    // Without a kid, no HMAC key is the RSA key either.
    let only_rsa = JwtVerifier::new(
        settings(&[&k.rsa], &[Algorithm::RS256, Algorithm::HS256]),
        &[],
        None,
    );
    let mut anonymous = k.rsa.clone();
    anonymous.kid = None;
    let forged = testing::hs256_with_public_key(&anonymous, &good_claims());
    assert_eq!(only_rsa.verify(&forged, NOW), Err(JwtRejection::UnknownKey));
}

#[test]
fn a_bad_signature_an_unknown_kid_and_a_malformed_token_are_refused() {
    let k = keys();
    let verifier = every_family();
    let token = k.rsa.sign(&good_claims());
    let (head, _) = token.rsplit_once('.').unwrap();
    let other = k.p256.sign(&good_claims());
    let (_, signature) = other.rsplit_once('.').unwrap();
    let tampered = format!("{head}.{signature}");
    assert_eq!(
        verifier.verify(&tampered, NOW),
        Err(JwtRejection::BadSignature)
    );
    let mut stranger = TestKey::generate(Family::P256, Algorithm::ES256, Some("nobody"));
    assert_eq!(
        verifier.verify(&stranger.sign(&good_claims()), NOW),
        Err(JwtRejection::UnknownKey)
    );
    stranger.kid = Some("ec-256".into());
    assert_eq!(
        verifier.verify(&stranger.sign(&good_claims()), NOW),
        Err(JwtRejection::BadSignature)
    );
    for garbage in ["", "a.b", "a.b.c", "not a token", "e30.e30.", "....."] {
        assert_eq!(
            verifier.verify(garbage, NOW),
            Err(JwtRejection::Malformed),
            "{garbage}"
        );
    }
}

#[test]
fn a_token_without_kid_needs_exactly_one_key_of_its_algorithm() {
    let k = keys();
    let one_ec = JwtVerifier::new(settings(&[&k.p256, &k.rsa], &DEFAULT_ALGORITHMS), &[], None);
    assert!(one_ec
        .verify(&k.p256.sign_without_kid(&good_claims()), NOW)
        .is_ok());
    let other_ec = TestKey::generate(Family::P256, Algorithm::ES256, Some("ec-2"));
    let two_ec = JwtVerifier::new(
        settings(&[&k.p256, &other_ec], &DEFAULT_ALGORITHMS),
        &[],
        None,
    );
    assert_eq!(
        two_ec.verify(&k.p256.sign_without_kid(&good_claims()), NOW),
        Err(JwtRejection::UnknownKey)
    );
    assert!(two_ec.verify(&k.p256.sign(&good_claims()), NOW).is_ok());
}

#[test]
fn expiry_and_not_before_hold_with_the_leeway() {
    let k = keys();
    let verifier = every_family();
    let with = |changes: serde_json::Value| {
        let mut claims = good_claims();
        for (name, value) in changes.as_object().unwrap() {
            if value.is_null() {
                claims.as_object_mut().unwrap().remove(name);
            } else {
                claims[name] = value.clone();
            }
        }
        verifier.verify(&k.ed.sign(&claims), NOW)
    };
    assert!(with(json!({"exp": NOW - 59})).is_ok());
    assert_eq!(with(json!({"exp": NOW - 60})), Err(JwtRejection::Expired));
    assert_eq!(with(json!({"exp": null})), Err(JwtRejection::NoExpiry));
    assert_eq!(
        with(json!({"exp": "99999999999"})),
        Err(JwtRejection::Malformed)
    );
    assert!(with(json!({"nbf": NOW + 60})).is_ok());
    assert_eq!(
        with(json!({"nbf": NOW + 61})),
        Err(JwtRejection::NotYetValid)
    );
    // The type confusion of CVE-2026-25537: a string nbf is not an absent one.
    assert_eq!(
        with(json!({"nbf": "99999999999"})),
        Err(JwtRejection::Malformed)
    );
}

#[test]
fn a_verified_token_is_held_its_times_checked_again_until_other_keys_are_installed() {
    let k = keys();
    let verifier = every_family();
    let mut claims = good_claims();
    claims["nbf"] = json!(NOW + 30);
    claims["exp"] = json!(NOW + 100);
    let token = k.rsa.sign(&claims);
    let first = verifier.verify(&token, NOW).expect("verifies");
    assert_eq!(verifier.verified_tokens(), 1);
    assert_eq!(verifier.verify(&token, NOW + 1), Ok(first.clone()), "held");
    // The leeway is 60 s: valid from NOW - 30 to NOW + 160, held or not.
    assert_eq!(
        verifier.verify(&token, NOW - 31),
        Err(JwtRejection::NotYetValid)
    );
    assert!(verifier.verify(&token, NOW + 159).is_ok());
    assert_eq!(
        verifier.verify(&token, NOW + 160),
        Err(JwtRejection::Expired)
    );
    // Forged tokens are not held.
    let forged = format!("{}x", &token[..token.len() - 1]);
    assert!(verifier.verify(&forged, NOW).is_err());
    assert_eq!(verifier.verified_tokens(), 1);
    // A fetch that drops the token's key: the token held is refused from then on.
    verifier.install(jwks::parse(testing::jwks(&[&k.ed]).as_bytes()).unwrap().set);
    assert_eq!(verifier.verified_tokens(), 0);
    assert_eq!(verifier.verify(&token, NOW), Err(JwtRejection::UnknownKey));
}

#[test]
fn issuer_audience_and_consumer_are_checked() {
    let k = keys();
    let verifier = every_family();
    let with = |name: &str, value: serde_json::Value| {
        let mut claims = good_claims();
        if value.is_null() {
            claims.as_object_mut().unwrap().remove(name);
        } else {
            claims[name] = value;
        }
        verifier.verify(&k.p256.sign(&claims), NOW)
    };
    assert_eq!(
        with("iss", json!("https://evil.example")),
        Err(JwtRejection::WrongIssuer)
    );
    assert_eq!(
        with("iss", serde_json::Value::Null),
        Err(JwtRejection::WrongIssuer)
    );
    assert_eq!(
        with("aud", json!("elsewhere")),
        Err(JwtRejection::WrongAudience)
    );
    assert_eq!(
        with("aud", serde_json::Value::Null),
        Err(JwtRejection::WrongAudience)
    );
    assert!(with("aud", json!(["elsewhere", AUD])).is_ok());
    assert!(with("aud", json!("other")).is_ok());
    assert_eq!(
        with("sub", serde_json::Value::Null),
        Err(JwtRejection::NoConsumer)
    );
    assert_eq!(with("sub", json!("")), Err(JwtRejection::NoConsumer));
    // `sub` must be a string (RFC 7519 section 4.1.2; jsonwebtoken checks its type).
    assert_eq!(with("sub", json!({"id": 1})), Err(JwtRejection::Malformed));
    // A plan claim is a string, or a number in its JSON text; absent or null is no plan;
    // anything else is refused rather than read as no plan.
    assert_eq!(with("plan", serde_json::Value::Null).unwrap().plan, None);
    let mut null_plan = good_claims();
    null_plan["plan"] = serde_json::Value::Null;
    let verified = verifier.verify(&k.p256.sign(&null_plan), NOW);
    assert_eq!(verified.map(|v| v.plan), Ok(None));
    assert_eq!(with("plan", json!(2)).unwrap().plan.as_deref(), Some("2"));
    assert_eq!(with("plan", json!(true)), Err(JwtRejection::Malformed));
    assert_eq!(with("plan", json!(["pro"])), Err(JwtRejection::Malformed));
    assert_eq!(with("plan", json!("")), Err(JwtRejection::Malformed));
}

#[test]
fn without_keys_every_token_is_refused_as_no_keys() {
    let k = keys();
    let mut settings = settings(&[], &DEFAULT_ALGORITHMS);
    settings.source = None;
    let verifier = JwtVerifier::new(settings, &[], None);
    assert_eq!(
        verifier.verify(&k.rsa.sign(&good_claims()), NOW),
        Err(JwtRejection::NoKeys)
    );
}

#[test]
fn a_configured_hmac_secret_verifies_tokens_without_kid() {
    let mut settings = settings(&[], &[Algorithm::HS256]);
    settings.source = None;
    settings.hmac = Some(Arc::new(jwks::hmac_key(
        b"0123456789abcdef0123456789abcdef",
    )));
    let verifier = JwtVerifier::new(settings, &[], None);
    let key = TestKey::hmac(b"0123456789abcdef0123456789abcdef", Algorithm::HS256, None);
    assert!(verifier.verify(&key.sign(&good_claims()), NOW).is_ok());
    let wrong = TestKey::hmac(b"0123456789abcdef0123456789abcdeX", Algorithm::HS256, None);
    assert_eq!(
        verifier.verify(&wrong.sign(&good_claims()), NOW),
        Err(JwtRejection::BadSignature)
    );
}

#[test]
fn jwks_parsing_keeps_signature_keys_and_skips_the_rest() {
    let k = keys();
    let mut document: serde_json::Value =
        serde_json::from_str(&testing::jwks(&[&k.rsa, &k.p256, &k.ed, &k.hmac])).unwrap();
    let entries = document["keys"].as_array_mut().unwrap();
    let mut encryption = k.rsa.jwk.clone();
    encryption["use"] = json!("enc");
    encryption["kid"] = json!("enc-1");
    entries.push(encryption);
    entries.push(json!({"kty": "RSA", "kid": "oaep", "alg": "RSA-OAEP", "n": "AQAB", "e": "AQAB"}));
    entries.push(json!({"kty": "EC", "kid": "broken", "crv": "P-256"}));
    entries.push(json!({"kty": "weird"}));
    let parsed = jwks::parse(document.to_string().as_bytes()).unwrap();
    let kids: Vec<_> = parsed
        .set
        .keys
        .iter()
        .map(|key| key.kid.as_deref())
        .collect();
    assert_eq!(
        kids,
        [Some("rsa-1"), Some("ec-256"), Some("ed-1"), Some("oct-1")]
    );
    assert_eq!(parsed.skipped, 4);
    assert!(jwks::parse(b"{\"keys\": 3}").is_err());
    assert!(jwks::parse(b"<html>").is_err());
    assert!(jwks::parse(b"{\"keys\": []}").unwrap().set.is_empty());
}

#[test]
fn rejection_labels_are_distinct_and_details_fixed() {
    let labels: std::collections::HashSet<_> =
        JwtRejection::ALL.iter().map(|r| r.label()).collect();
    assert_eq!(labels.len(), JwtRejection::ALL.len());
    assert!(JwtRejection::ALL.iter().all(|r| !r.detail().is_empty()));
}

#[test]
fn the_consumer_may_come_from_another_claim_a_number_in_its_json_text() {
    let k = keys();
    let mut settings = settings(&[&k.p256], &DEFAULT_ALGORITHMS);
    settings.consumer_claim = "client_id".into();
    let verifier = JwtVerifier::new(settings, &[], None);
    let mut claims = good_claims();
    claims["client_id"] = json!(42);
    assert_eq!(
        &*verifier
            .verify(&k.p256.sign(&claims), NOW)
            .unwrap()
            .consumer,
        "42"
    );
    claims["client_id"] = json!({"id": 1});
    assert_eq!(
        verifier.verify(&k.p256.sign(&claims), NOW),
        Err(JwtRejection::NoConsumer)
    );
}

mod url_source {
    use super::*;
    use crate::caller::jwt::refresh::{refresh_once, start_refresh, FetchOutcome};
    use crate::caller::jwt::settings::UrlSource;
    use crate::caller::jwt::testing::{JwksServer, Served};
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Duration;

    fn url_settings(url: &str, max_bytes: usize) -> JwtSettings {
        let mut settings = settings(&[], &DEFAULT_ALGORITHMS);
        settings.source = Some(KeySource::Url(UrlSource {
            url: url.into(),
            refresh: Duration::from_secs(1),
            fetch_timeout: Duration::from_secs(2),
            max_bytes,
            early_refresh_gap: Duration::from_secs(1),
        }));
        settings
    }

    /// Polls `condition` every 20 ms for up to 20 s.
    async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !condition() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    type Counts = Arc<Mutex<HashMap<&'static str, usize>>>;

    fn count(counts: &Counts, label: &str) -> usize {
        counts.lock().unwrap().get(label).copied().unwrap_or(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_rotate_and_the_last_good_set_outlives_a_failing_endpoint() {
        let old = TestKey::generate(Family::P256, Algorithm::ES256, Some("old"));
        let new = TestKey::generate(Family::Ed25519, Algorithm::EdDSA, Some("new"));
        let server = JwksServer::start(testing::jwks(&[&old]));
        let verifier = Arc::new(JwtVerifier::new(
            url_settings(&server.url(), 64 * 1024),
            &[],
            None,
        ));
        let now = testing::now();
        let old_token = old.sign(&testing::claims("alice", ISS, AUD, now));
        let new_token = new.sign(&testing::claims("bob", ISS, AUD, now));
        assert_eq!(verifier.verify(&old_token, now), Err(JwtRejection::NoKeys));

        let first = refresh_once(&verifier).await.expect("a URL source");
        assert!(
            matches!(first, FetchOutcome::Updated { keys: 1, .. }),
            "{first:?}"
        );
        assert!(verifier.verify(&old_token, now).is_ok());

        let counts: Counts = Arc::default();
        let counting = Arc::clone(&counts);
        let refresh = start_refresh(&verifier, move |outcome| {
            *counting.lock().unwrap().entry(outcome.label()).or_default() += 1;
        });
        server.serve(Served::Body(testing::jwks(&[&new])));
        eventually("the new key verifies", || {
            verifier.verify(&new_token, now).is_ok()
        })
        .await;
        assert_eq!(
            verifier.verify(&old_token, now),
            Err(JwtRejection::UnknownKey)
        );

        server.serve(Served::Status(500));
        eventually("a failed fetch", || count(&counts, "http_status") >= 1).await;
        assert!(
            verifier.verify(&new_token, now).is_ok(),
            "the last good set is kept"
        );
        server.serve(Served::Body("<html>not a key set</html>".into()));
        eventually("an invalid answer", || count(&counts, "invalid") >= 1).await;
        server.serve(Served::Body("{\"keys\": []}".into()));
        let asked = server.requests();
        let invalid = count(&counts, "invalid");
        eventually("an empty set", || {
            server.requests() >= asked + 2 && count(&counts, "invalid") >= invalid + 2
        })
        .await;
        assert!(
            verifier.verify(&new_token, now).is_ok(),
            "the last good set is kept"
        );

        drop(refresh);
        eventually("the refresh task ends with its handle", || {
            Arc::strong_count(&verifier) == 1
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_oversized_answer_is_refused_and_a_reload_keeps_the_keys_of_the_same_url() {
        let key = TestKey::generate(Family::P256, Algorithm::ES256, Some("k"));
        let body = testing::jwks(&[&key]);
        let server = JwksServer::start(body.clone());
        let small = JwtVerifier::new(url_settings(&server.url(), body.len() - 1), &[], None);
        let outcome = refresh_once(&small).await.expect("a URL source");
        assert_eq!(outcome.label(), "too_large", "{outcome:?}");
        assert!(small.keys().is_empty());

        let loaded = JwtVerifier::new(url_settings(&server.url(), body.len()), &[], None);
        assert_eq!(
            refresh_once(&loaded).await.map(|o| o.label()),
            Some("updated")
        );
        let reloaded =
            JwtVerifier::new(url_settings(&server.url(), body.len()), &[], Some(&loaded));
        let now = testing::now();
        let token = key.sign(&testing::claims("alice", ISS, AUD, now));
        assert!(
            reloaded.verify(&token, now).is_ok(),
            "keys kept across the reload"
        );
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let elsewhere_url = format!("http://{closed}/jwks");
        let elsewhere = JwtVerifier::new(url_settings(&elsewhere_url, 1024), &[], Some(&loaded));
        assert_eq!(elsewhere.verify(&token, now), Err(JwtRejection::NoKeys));
        let unreachable = refresh_once(&elsewhere).await.expect("a URL source");
        assert_eq!(unreachable.label(), "unreachable", "{unreachable:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unknown_kid_asks_for_an_early_fetch_and_never_waits_for_it() {
        let old = TestKey::generate(Family::P256, Algorithm::ES256, Some("old"));
        let new = TestKey::generate(Family::P256, Algorithm::ES256, Some("new"));
        let server = JwksServer::start(testing::jwks(&[&old]));
        let mut settings = url_settings(&server.url(), 64 * 1024);
        if let Some(KeySource::Url(url)) = &mut settings.source {
            // Only an early fetch can bring the new key within the test.
            url.refresh = Duration::from_secs(3600);
            url.early_refresh_gap = Duration::from_millis(100);
        }
        let verifier = Arc::new(JwtVerifier::new(settings, &[], None));
        refresh_once(&verifier).await.expect("a URL source");
        let refresh = start_refresh(&verifier, |_| {});
        server.serve(Served::Body(testing::jwks(&[&old, &new])));
        let now = testing::now();
        let new_token = new.sign(&testing::claims("bob", ISS, AUD, now));
        assert_eq!(
            verifier.verify(&new_token, now),
            Err(JwtRejection::UnknownKey)
        );
        eventually("the early fetch brings the new key", || {
            verifier.verify(&new_token, now).is_ok()
        })
        .await;
        drop(refresh);
    }

    #[test]
    fn before_a_url_answers_its_tokens_await_keys_and_an_hmac_secret_still_verifies() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let mut settings = url_settings("http://127.0.0.1:9/jwks.json", 1024);
        settings.algorithms = [Algorithm::ES256, Algorithm::HS256].into();
        settings.hmac = Some(Arc::new(jwks::hmac_key(secret)));
        let verifier = JwtVerifier::new(settings, &[], None);
        let now = testing::now();
        let ec = TestKey::generate(Family::P256, Algorithm::ES256, Some("ec"));
        let hs = TestKey::hmac(secret, Algorithm::HS256, None);
        assert!(verifier.awaits_keys());
        assert_eq!(
            verifier.verify(&ec.sign(&testing::claims("alice", ISS, AUD, now)), now),
            Err(JwtRejection::NoKeys)
        );
        assert!(verifier
            .verify(&hs.sign(&testing::claims("bob", ISS, AUD, now)), now)
            .is_ok());
        verifier.install(jwks::parse(testing::jwks(&[&ec]).as_bytes()).unwrap().set);
        assert!(!verifier.awaits_keys());
        assert!(verifier
            .verify(&ec.sign(&testing::claims("alice", ISS, AUD, now)), now)
            .is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fetch_that_is_never_answered_ends_at_its_deadline() {
        let server = JwksServer::start(String::new());
        server.serve(Served::Stall);
        let mut settings = url_settings(&server.url(), 1024);
        if let Some(KeySource::Url(url)) = &mut settings.source {
            url.fetch_timeout = Duration::from_millis(200);
        }
        let verifier = JwtVerifier::new(settings, &[], None);
        let outcome = tokio::time::timeout(Duration::from_secs(20), refresh_once(&verifier))
            .await
            .expect("the fetch ends by its own deadline")
            .expect("a URL source");
        assert_eq!(outcome.label(), "unreachable", "{outcome:?}");
        assert_eq!(server.requests(), 1);
        server.serve(Served::Status(404));
    }
}

#[test]
fn every_fetch_outcome_label_is_listed_for_the_metric() {
    use super::fetch::FetchError;
    use super::refresh::FetchOutcome;
    let outcomes = [
        FetchOutcome::Updated {
            keys: 1,
            skipped: 0,
        },
        FetchOutcome::Failed(FetchError::Client(String::new())),
        FetchOutcome::Failed(FetchError::Request(String::new())),
        FetchOutcome::Failed(FetchError::Status(500)),
        FetchOutcome::Failed(FetchError::TooLarge(1)),
        FetchOutcome::Failed(FetchError::NotJwks(String::new())),
        FetchOutcome::Failed(FetchError::NoUsableKey),
    ];
    for outcome in &outcomes {
        assert!(
            FetchOutcome::LABELS.contains(&outcome.label()),
            "{outcome:?}"
        );
    }
}
