//! Who is calling, on the exchange's manual clock: a bearer token admits until it expires and
//! not before its `nbf` by that clock alone; a route that requires a caller refuses one without
//! a credential, and a plan it does not admit.

use std::path::Path;
use std::time::Duration;

use http::request::Parts;
use http::Request;
use serde_json::{json, Value};

use super::{gateway_of, Gateway, ADMITTED};
use crate::caller::consumers::AuthFailure;
use crate::caller::jwt::testing::TestKey;
use crate::caller::jwt::Algorithm;
use crate::config::Config;
use crate::exchange::answer::{Answer, Decided, Unasked};
use crate::exchange::Admission;
use crate::limiter::clock::Clock;

/// The gateway's clock reads this many seconds since the epoch when a test starts.
const START: u64 = 1_000;

pub(super) const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// One route, `/t`, verifying HS256 tokens signed with `SECRET`, with `auth` as written.
fn config(auth: &str) -> Config {
    let yaml = format!(
        "listen: [127.0.0.1:1]\n\
         identity: {{ plans: [free, pro], jwt: {{ hmac_secret: {SECRET}, algorithms: [HS256], plan_claim: plan }} }}\n\
         routes:\n  - name: t\n    match: {{ path_prefix: /t }}\n    \
         upstream: {{ servers: [127.0.0.1:1] }}\n    auth: {auth}\n"
    );
    Config::from_yaml(Path::new("auth.yaml"), &yaml).expect("a valid config")
}

/// `claims` signed with the route's secret.
pub(super) fn token(claims: &Value) -> String {
    TestKey::hmac(SECRET.as_bytes(), Algorithm::HS256, None).sign(claims)
}

/// A request for `/t`, with `Authorization: Bearer <token>` when given one.
pub(super) fn request(token: Option<&str>) -> Parts {
    let mut request = Request::get("/t").header("host", "example.com");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(()).expect("a request").into_parts().0
}

fn gateway(auth: &str) -> Gateway {
    let g = gateway_of(config(auth));
    assert_eq!(
        g.clock.now_us(),
        START as i64 * 1_000_000,
        "the tests' epoch"
    );
    g
}

#[tokio::test]
async fn a_token_admits_until_it_expires_by_the_exchanges_clock() {
    let g = gateway("required");
    let alice = token(&json!({ "sub": "alice", "exp": START + 60 }));
    let (exchange, admission) = g.admit_parts(&request(Some(&alice))).await;
    assert_eq!(admission, ADMITTED);
    assert_eq!(exchange.consumer().map(|c| &*c.id), Some("alice"));
    assert_eq!(exchange.plan(), None, "no plan claim: the default plan");

    // Within the leeway (60 s) past `exp`, then past it.
    g.clock.advance_by(Duration::from_secs(119));
    assert_eq!(g.admit_parts(&request(Some(&alice))).await.1, ADMITTED);
    g.clock.advance_by(Duration::from_secs(2));
    let (exchange, admission) = g.admit_parts(&request(Some(&alice))).await;
    assert_eq!(
        admission,
        Admission::Answered(Answer::AuthFailed(AuthFailure::Expired))
    );
    assert_eq!(
        exchange.decided(),
        Decided::Unasked(Unasked::Unauthenticated)
    );
}

#[tokio::test]
async fn a_token_before_its_nbf_is_refused_until_the_clock_reaches_it() {
    let g = gateway("required");
    let early = token(&json!({ "sub": "bob", "nbf": START + 100, "exp": START + 3600 }));
    assert_eq!(
        g.admit_parts(&request(Some(&early))).await.1,
        Admission::Answered(Answer::AuthFailed(AuthFailure::NotYetValid))
    );
    // The leeway (60 s) admits it from `nbf - 60` on.
    g.clock.advance_by(Duration::from_secs(40));
    assert_eq!(g.admit_parts(&request(Some(&early))).await.1, ADMITTED);
}

#[tokio::test]
async fn a_required_caller_without_a_credential_is_refused_and_an_optional_one_is_anonymous() {
    let required = gateway("required");
    let (exchange, admission) = required.admit_parts(&request(None)).await;
    assert_eq!(
        admission,
        Admission::Answered(Answer::AuthFailed(AuthFailure::Missing))
    );
    assert_eq!(exchange.consumer().map(|c| &*c.id), None);

    let optional = gateway("optional");
    let (exchange, admission) = optional.admit_parts(&request(None)).await;
    assert_eq!(admission, ADMITTED);
    assert_eq!(exchange.consumer().map(|c| &*c.id), None);
    let forged = token(&json!({ "sub": "mallory", "exp": START + 60 })).replace('.', ".x");
    assert!(
        matches!(
            optional.admit_parts(&request(Some(&forged))).await.1,
            Admission::Answered(Answer::AuthFailed(_))
        ),
        "a credential that does not verify is refused, never read as anonymous"
    );
}

#[tokio::test]
async fn a_plan_the_route_does_not_admit_is_forbidden() {
    let g = gateway("{ mode: required, plans: [pro] }");
    let free = token(&json!({ "sub": "carol", "plan": "free", "exp": START + 60 }));
    let (exchange, admission) = g.admit_parts(&request(Some(&free))).await;
    assert_eq!(
        admission,
        Admission::Answered(Answer::AuthFailed(AuthFailure::PlanNotAllowed))
    );
    assert_eq!(exchange.decided(), Decided::Unasked(Unasked::Forbidden));
    let pro = token(&json!({ "sub": "dave", "plan": "pro", "exp": START + 60 }));
    let (exchange, admission) = g.admit_parts(&request(Some(&pro))).await;
    assert_eq!(admission, ADMITTED);
    assert_eq!(exchange.plan(), Some("pro"));
}
