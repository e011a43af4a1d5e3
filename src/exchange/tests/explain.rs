//! `Exchange::explain`: a request taken through admission up to its limits' decision, which
//! consumes nothing, and the peek that reads what each limit has left.

use std::sync::Arc;

use serde_json::Value;

use crate::limiter::clock::Clock;
use crate::limiter::per_thread::Handle;

use super::{gateway, head, Gateway, ADMITTED};
use crate::exchange::{Exchange, Head};
use crate::upstream::servers::InOrder;

/// `path` explained on `g` (not admitted), from 192.0.2.1, with what each limit has left.
async fn explained(g: &Gateway, path: &str) -> (Exchange<InOrder>, Value) {
    let parts = head(path);
    let mut exchange = Exchange::new(Handle::of(Arc::clone(&g.snapshot)), g.clock.instant());
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let head = Head {
        parts: &parts,
        raw_target: target.as_bytes(),
        peer: Some([192, 0, 2, 1].into()),
        client_certificate: None,
        cut: Default::default(),
    };
    exchange.explain(&head, None);
    exchange.peek(&g.policy).await.expect("a peek");
    let explanation = exchange.explanation(("GET", "example.com", path));
    let shown = serde_json::to_value(explanation).expect("an explanation is JSON");
    (exchange, shown)
}

#[tokio::test]
async fn an_explained_request_consumes_nothing_and_tells_what_each_limit_has_left() {
    let g = gateway("[{ name: w, key: [route], algorithm: fixed_window, rate: 2/h }]");
    for _ in 0..3 {
        let (_, shown) = explained(&g, "/t/a").await;
        assert_eq!(shown["route"]["name"], "t", "{shown}");
        assert_eq!(shown["answer"], Value::Null, "its limits decide: {shown}");
        assert_eq!(shown["limits"][0]["name"], "w", "{shown}");
        assert_eq!(
            shown["limits"][0]["remaining"], 2,
            "nothing consumed: {shown}"
        );
    }
    assert_eq!(g.admit("/t/a").await.1, ADMITTED);
    let (_, shown) = explained(&g, "/t/a").await;
    assert_eq!(
        shown["limits"][0]["remaining"], 1,
        "the admitted one: {shown}"
    );
}

#[tokio::test]
async fn a_request_no_route_matches_is_explained_without_limits() {
    let g = gateway("[{ name: w, key: [route], algorithm: fixed_window, rate: 2/h }]");
    let (_, shown) = explained(&g, "/elsewhere").await;
    assert_eq!(shown["route"], Value::Null, "{shown}");
    assert_ne!(
        shown["answer"],
        Value::Null,
        "answered before any limit: {shown}"
    );
    assert_eq!(shown["limits"], serde_json::json!([]), "{shown}");
    assert_eq!(shown["request"]["path"], "/elsewhere", "{shown}");
}

/// The typed explanation, written as JSON, has the keys in the order it always had (each
/// object's in alphabetical order, as a `serde_json::Value` writes them): same keys, same
/// order, with or without a route, with a peek error or not.
#[tokio::test]
async fn an_explanation_is_written_with_its_keys_in_the_order_they_always_had() {
    let g = gateway("[{ name: w, key: [route], algorithm: gcra, rate: 2/s, burst: 3 }]");
    for path in ["/t/a", "/elsewhere"] {
        let (exchange, _) = explained(&g, path).await;
        let mut explanation = exchange.explanation(("GET", "example.com", path));
        for peek_error in [None, Some("the limiter cannot be read".to_string())] {
            explanation.peek_error = peek_error;
            let written = serde_json::to_string(&explanation).expect("JSON");
            let value = serde_json::to_value(&explanation).expect("JSON");
            assert_eq!(written, value.to_string(), "in the order of a JSON map");
        }
    }
}
