//! End to end: JWT bearer tokens. Real gateways verify tokens signed here with every key family
//! against a JWKS file or a JWKS URL served on loopback (rotated, failing, unreachable), give
//! each subject its plan's limits in a real Redis, key limits by a verified claim, and refuse
//! every bad token with `401` and its `WWW-Authenticate` before the upstream or Redis hears of
//! it.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use support::config::{route, Config, Route};
use support::limits::fixed_window;
use support::tokens::{
    claims, hs256_with_public_key, now, unsigned_token, write_jwks, Algorithm, Family, JwksServer,
    Served, TestKey,
};
use support::{eventually, http_get, metric, Gateway, RedisServer, Response, Upstream};

const ISS: &str = "https://idp.test/";
const AUD: &str = "orders-api";
/// The HMAC secret of `identity.jwt.hmac_secret` (HS256 tokens without a `kid`).
const HMAC_SECRET: &str = "an-hmac-secret-of-32-bytes-or-more!";
/// Generous bound for what happens in the background (a JWKS refresh): a hung test fails,
/// nothing is timed.
const WITHIN: Duration = Duration::from_secs(30);

/// A JWKS file in a directory of its own.
struct JwksFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl JwksFile {
    fn of(keys: &[&TestKey]) -> JwksFile {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("jwks.json");
        write_jwks(&path, keys);
        JwksFile { _dir: dir, path }
    }
}

/// Plans free and pro; tokens verified as `jwt` (a flow mapping's inner keys) says, with the
/// issuer, audience and plan claim of these tests.
fn identity(jwt: &str) -> Config {
    Config::new().redis("REDIS_URL").set(
        "identity",
        format!(
            "{{ plans: [free, pro], default_plan: free, jwt: {{ {jwt}, issuer: \"{ISS}\", audience: {AUD}, plan_claim: plan }} }}"
        ),
    )
}

/// `/api/`: tokens required; per consumer 3/h on free, 5/h on pro.
fn plan_route() -> Route {
    route("api").prefix("/api/").set("auth", "required").limit(
        fixed_window("per_consumer", "3/h")
            .key(&["consumer"])
            .set("plans", "{ pro: { rate: 5/h } }"),
    )
}

fn with_bearer(gateway: &Gateway, path: &str, token: &str) -> Response {
    let authorization = format!("Bearer {token}");
    http_get(
        gateway.proxy,
        path,
        None,
        &[("authorization", authorization.as_str())],
    )
}

/// Claims valid now for `sub` on `plan`.
fn on_plan(sub: &str, plan: &str) -> Value {
    let mut claims = claims(sub, ISS, AUD, now());
    claims["plan"] = json!(plan);
    claims
}

/// How many of `asks` requests with `token` were admitted; every other one must be a `429`.
fn admitted(gateway: &Gateway, token: &str, asks: usize) -> usize {
    (0..asks)
        .filter(|_| {
            let response = with_bearer(gateway, "/api/x", token);
            match response.status {
                200 => true,
                429 => false,
                other => panic!("{other}: {}", response.body),
            }
        })
        .count()
}

fn auth_failures(gateway: &Gateway, route: &str, reason: &str) -> f64 {
    metric(
        &gateway.metrics(),
        "sluice_auth_failures_total",
        &[("route", route), ("reason", reason)],
    )
}

fn jwks_fetches(gateway: &Gateway, outcome: &str) -> f64 {
    metric(
        &gateway.metrics(),
        "sluice_jwks_fetches_total",
        &[("outcome", outcome)],
    )
}

/// Another key of `key`'s material under another `kid` (an RSA key used for PS256).
fn renamed(key: &TestKey, kid: &str, alg: Algorithm) -> TestKey {
    let mut key = key.with_alg(alg);
    key.kid = Some(kid.to_string());
    key.jwk["kid"] = json!(kid);
    key
}

#[test]
fn a_token_of_every_family_is_admitted_within_its_plan() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let rsa = TestKey::generate(Family::Rsa, Algorithm::RS256, Some("rsa"));
    let signers = [
        rsa.clone(),
        renamed(&rsa, "rsa-pss", Algorithm::PS256),
        TestKey::generate(Family::P256, Algorithm::ES256, Some("ec")),
        TestKey::generate(Family::Ed25519, Algorithm::EdDSA, Some("ed")),
    ];
    let file = JwksFile::of(&signers.iter().collect::<Vec<_>>());
    let hmac = TestKey::hmac(HMAC_SECRET.as_bytes(), Algorithm::HS256, None);
    let config = identity(&format!(
        "jwks_file: {}, hmac_secret: \"{HMAC_SECRET}\", algorithms: [RS256, PS256, ES256, EdDSA, HS256]",
        file.path.display()
    ))
    .route(plan_route());
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    for signer in signers.iter().chain([&hmac]) {
        let alg = format!("{:?}", signer.alg);
        let free = signer.sign(&on_plan(&format!("free-{alg}"), "free"));
        let pro = signer.sign(&on_plan(&format!("pro-{alg}"), "pro"));
        assert_eq!(admitted(&gateway, &free, 5), 3, "{alg}: free is 3/h");
        assert_eq!(admitted(&gateway, &pro, 7), 5, "{alg}: pro is 5/h");
    }
    let token = signers[0].sign(&on_plan("carol", "pro"));
    let passed = with_bearer(&gateway, "/api/x", &token);
    assert_eq!(passed.status, 200, "{}", passed.body);
    assert!(
        passed.body.contains("x-consumer-id: carol\n")
            && passed.body.contains("x-consumer-plan: pro\n")
            && passed
                .body
                .contains(&format!("authorization: Bearer {token}\n")),
        "the upstream learns the verified caller and gets the token to verify again: {}",
        passed.body
    );
    let plan_count = |plan| {
        metric(
            &gateway.metrics(),
            "sluice_plan_requests_total",
            &[("route", "api"), ("plan", plan), ("decision", "limited")],
        )
    };
    assert_eq!((plan_count("free"), plan_count("pro")), (10.0, 10.0));
}

#[test]
fn keys_from_a_url_rotate_and_the_last_good_set_outlives_a_failing_endpoint() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let old = TestKey::generate(Family::P256, Algorithm::ES256, Some("old"));
    let new = TestKey::generate(Family::Ed25519, Algorithm::EdDSA, Some("new"));
    let server = JwksServer::start(String::new());
    server.serve(Served::Status(500));
    let jwt = format!("jwks_url: \"{}\", refresh_seconds: 1", server.url());
    let config = identity(&jwt).route(plan_route());
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    let old_token = old.sign(&on_plan("alice", "pro"));
    let new_token = new.sign(&on_plan("bob", "pro"));

    // No key yet: not ready, and a token is answered 503 (the gateway cannot verify), not 401.
    let ready = http_get(gateway.admin, "/readyz", None, &[]);
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert!(
        ready.body.contains("no JWT verification keys"),
        "{}",
        ready.body
    );
    let unverifiable = with_bearer(&gateway, "/api/x", &old_token);
    assert_eq!(unverifiable.status, 503, "{}", unverifiable.body);
    assert_eq!(unverifiable.header("retry-after"), Some("1"));
    assert_eq!(unverifiable.header("www-authenticate"), None);

    server.serve(Served::Body(support::tokens::jwks(&[&old])));
    gateway.wait_ready();
    assert_eq!(with_bearer(&gateway, "/api/x", &old_token).status, 200);

    // Rotation: the new key is published beside the old one, then the old one is withdrawn.
    server.serve(Served::Body(support::tokens::jwks(&[&old, &new])));
    eventually(WITHIN, "the new key verifies", || {
        with_bearer(&gateway, "/api/x", &new_token).status == 200
    });
    server.serve(Served::Body(support::tokens::jwks(&[&new])));
    eventually(WITHIN, "the withdrawn key is refused", || {
        with_bearer(&gateway, "/api/x", &old_token).status == 401
    });
    let refused = with_bearer(&gateway, "/api/x", &old_token);
    assert_eq!(
        refused.header("www-authenticate"),
        Some("Bearer realm=\"sluice\", error=\"invalid_token\", error_description=\"The token is signed with an unknown key.\"")
    );

    // A failing endpoint changes nothing: the last good set stays.
    let failed = jwks_fetches(&gateway, "http_status");
    server.serve(Served::Status(500));
    eventually(WITHIN, "a failed fetch", || {
        jwks_fetches(&gateway, "http_status") > failed
    });
    assert_eq!(with_bearer(&gateway, "/api/x", &new_token).status, 200);

    // A reload keeping the URL keeps the keys, although the endpoint still fails.
    let reloaded = identity(&jwt)
        .route(plan_route().limit(fixed_window("per_ip", "50/h").key(&["client_ip"])));
    assert!(gateway.reload(&reloaded.yaml()), "the reload is taken");
    assert_eq!(with_bearer(&gateway, "/api/x", &new_token).status, 200);
    assert_eq!(http_get(gateway.admin, "/readyz", None, &[]).status, 200);

    // An unreachable endpoint neither.
    let unreachable = jwks_fetches(&gateway, "unreachable");
    drop(server);
    eventually(WITHIN, "an unreachable endpoint", || {
        jwks_fetches(&gateway, "unreachable") > unreachable
    });
    assert_eq!(with_bearer(&gateway, "/api/x", &new_token).status, 200);
    assert!(jwks_fetches(&gateway, "updated") >= 3.0);
}

/// A token the gateway must refuse: the auth-failure reason, the token (`None`: no credential
/// at all), the status, and the `WWW-Authenticate` of a `401`.
struct BadToken {
    reason: &'static str,
    token: Option<String>,
    status: u16,
    challenge: Option<String>,
}

/// `token`, refused with `401` as `reason`, its challenge's `error_description` `detail`.
fn invalid(reason: &'static str, token: String, detail: &str) -> BadToken {
    BadToken {
        reason,
        token: Some(token),
        status: 401,
        challenge: Some(format!(
            "Bearer realm=\"sluice\", error=\"invalid_token\", error_description=\"{detail}\""
        )),
    }
}

/// Every way a bearer token is refused.
fn bad_tokens(rsa: &TestKey) -> Vec<BadToken> {
    let now = now();
    let good = || on_plan("mallory", "free");
    let with = |name: &str, value: Value| {
        let mut claims = good();
        claims[name] = value;
        rsa.sign(&claims)
    };
    let impostor = TestKey::generate(Family::Rsa, Algorithm::RS256, Some("rsa"));
    let mut no_exp = good();
    no_exp.as_object_mut().unwrap().remove("exp");
    let iss = "The token is from an issuer this gateway does not trust.";
    vec![
        BadToken {
            reason: "missing",
            token: None,
            status: 401,
            challenge: Some("Bearer realm=\"sluice\"".into()),
        },
        invalid(
            "expired",
            with("exp", json!(now - 3600)),
            "The token has expired.",
        ),
        invalid(
            "not_yet_valid",
            with("nbf", json!(now + 3600)),
            "The token is not valid yet.",
        ),
        invalid(
            "wrong_issuer",
            with("iss", json!("https://evil.test/")),
            iss,
        ),
        invalid(
            "wrong_audience",
            with("aud", json!("billing-api")),
            "The token is not meant for this gateway.",
        ),
        invalid(
            "algorithm_not_allowed",
            unsigned_token(&good(), Some("rsa")),
            "The token's algorithm is not accepted.",
        ),
        // Algorithm confusion: HS256 "signed" with the RSA public key's PEM as the secret.
        invalid(
            "key_mismatch",
            hs256_with_public_key(rsa, &good()),
            "The token's algorithm does not fit its key.",
        ),
        invalid(
            "bad_signature",
            impostor.sign(&good()),
            "The token's signature is not valid.",
        ),
        invalid(
            "no_expiry",
            rsa.sign(&no_exp),
            "The token has no expiry time.",
        ),
        invalid(
            "malformed_token",
            "not.a.jwt".into(),
            "The bearer token is not a well-formed JWT.",
        ),
        BadToken {
            reason: "unknown_plan",
            token: Some(with("plan", json!("gold"))),
            status: 403,
            challenge: None,
        },
    ]
}

#[test]
fn bad_tokens_are_refused_before_the_upstream_and_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let rsa = TestKey::generate(Family::Rsa, Algorithm::RS256, Some("rsa"));
    let file = JwksFile::of(&[&rsa]);
    let config = identity(&format!(
        "jwks_file: {}, hmac_secret: \"{HMAC_SECRET}\", algorithms: [RS256, HS256]",
        file.path.display()
    ))
    .route(plan_route());
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    let cases = bad_tokens(&rsa);
    for case in &cases {
        let what = case.reason;
        let response = match &case.token {
            Some(token) => with_bearer(&gateway, "/api/x", token),
            None => gateway.get("/api/x"),
        };
        assert_eq!(response.status, case.status, "{what}: {}", response.body);
        assert_eq!(
            response.header("www-authenticate"),
            case.challenge.as_deref(),
            "{what}"
        );
        assert_eq!(
            response.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
    }
    let basic = http_get(
        gateway.proxy,
        "/api/x",
        None,
        &[("authorization", "Basic dXNlcjpwdw==")],
    );
    assert_eq!(
        (basic.status, basic.header("www-authenticate")),
        (401, Some("Bearer realm=\"sluice\"")),
        "another scheme is no bearer token: missing"
    );
    let bare = http_get(
        gateway.proxy,
        "/api/x",
        None,
        &[("authorization", "Bearer")],
    );
    assert_eq!(bare.status, 401);
    assert_eq!(
        bare.header("www-authenticate"),
        Some("Bearer realm=\"sluice\", error=\"invalid_request\", error_description=\"The credential is not in its form (or sent twice).\"")
    );

    assert_eq!(upstream.served(), 0, "nothing refused reached the upstream");
    let mut connection = redis.connection();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut connection)
        .expect("INFO commandstats");
    assert_eq!(
        support::command_calls(&stats, &["fcall", "evalsha", "eval"]),
        0,
        "no limit was asked of Redis: {stats}"
    );
    let size: u64 = redis::cmd("DBSIZE").query(&mut connection).unwrap();
    assert_eq!(size, 0, "nothing was written to Redis");

    for case in &cases {
        // The Basic credential counts as missing too.
        let expected = if case.reason == "missing" { 2.0 } else { 1.0 };
        let counted = auth_failures(&gateway, "api", case.reason);
        assert_eq!(counted, expected, "{}", case.reason);
    }
    assert_eq!(auth_failures(&gateway, "api", "malformed"), 1.0);
    let good = with_bearer(&gateway, "/api/x", &rsa.sign(&on_plan("alice", "free")));
    assert_eq!(good.status, 200, "{}", good.body);
}

#[test]
fn a_limit_keyed_by_a_verified_claim_is_shared_by_the_subjects_of_one_org() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let key = TestKey::generate(Family::P256, Algorithm::ES256, Some("ec"));
    let file = JwksFile::of(&[&key]);
    let config = identity(&format!("jwks_file: {}", file.path.display())).route(
        route("orgs").prefix("/api/").set("auth", "required").limit(
            fixed_window("per_org", "4/h")
                .key(&["claim:org"])
                .set("on_missing", "deny"),
        ),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    gateway.wait_ready();
    let member = |sub: &str, org: Value| {
        let mut claims = claims(sub, ISS, AUD, now());
        if !org.is_null() {
            claims["org"] = org;
        }
        key.sign(&claims)
    };
    let (alice, bob) = (member("alice", json!("acme")), member("bob", json!("acme")));
    let statuses: Vec<u16> = (0..6)
        .map(|i| with_bearer(&gateway, "/api/x", if i % 2 == 0 { &alice } else { &bob }).status)
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 429, 429],
        "alice and bob of acme share one bucket"
    );
    let carol = member("carol", json!("globex"));
    assert_eq!(
        admitted(&gateway, &carol, 5),
        4,
        "another org, its own bucket"
    );
    let numeric = member("dave", json!(7));
    assert_eq!(
        admitted(&gateway, &numeric, 5),
        4,
        "a number is its JSON text"
    );
    let without = member("erin", Value::Null);
    assert_eq!(
        with_bearer(&gateway, "/api/x", &without).status,
        400,
        "a token without the claim: on_missing deny"
    );
}
