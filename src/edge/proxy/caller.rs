//! What the upstream learns of a verified caller: `X-Consumer-Id` and `X-Consumer-Plan` on
//! routes that verify callers — set by sluice, never passed on from the client (a client's own
//! are removed, so an upstream can trust them) — and not the API key itself, which stays at the
//! gateway. A bearer token is passed on: upstreams may read its claims.

use http::header::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;

use crate::caller::consumers::AuthMode;
use crate::exchange::Exchange;
use crate::upstream::pool::Pool;

static X_CONSUMER_ID: HeaderName = HeaderName::from_static("x-consumer-id");
static X_CONSUMER_PLAN: HeaderName = HeaderName::from_static("x-consumer-plan");

/// Sets the caller headers of `request` for the request of `exchange`.
pub fn set_headers(request: &mut RequestHeader, exchange: &Exchange<Pool>) -> pingora::Result<()> {
    let Some(route) = exchange.route() else {
        return Ok(());
    };
    if route.auth.mode == AuthMode::Off {
        return Ok(());
    }
    request.remove_header(&X_CONSUMER_ID);
    request.remove_header(&X_CONSUMER_PLAN);
    let config = &exchange.site().config;
    if let Some(header) = config.consumers.api_key_header() {
        request.remove_header(header);
    }
    let Some(consumer) = exchange.consumer() else {
        return Ok(());
    };
    // An id that is not a header value (a token's subject with control bytes) is left out.
    if let Ok(id) = HeaderValue::from_str(&consumer.id) {
        request.insert_header("X-Consumer-Id", id)?;
    }
    if let Some(plan) = consumer
        .plan
        .and_then(|plan| exchange.site().plan_header(plan))
    {
        request.insert_header("X-Consumer-Plan", plan)?;
    }
    Ok(())
}
