//! The one place where limiter decisions and errors become HTTP responses and headers.

use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use crate::limiter::Decision;
use crate::router::Route;

pub const RATELIMIT: &str = "ratelimit";
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";

/// Why a request is answered by the gateway instead of the upstream.
pub enum Rejection<'a> {
    NoRoute,
    /// The request cannot be decided as sent (a malformed path or cost header).
    BadRequest(&'static str),
    UriTooLong,
    HeadersTooLarge,
    Limited {
        route: &'a Route,
        decision: &'a Decision,
    },
    LimiterUnavailable,
}

impl Rejection<'_> {
    pub fn status(&self) -> u16 {
        match self {
            Rejection::NoRoute => 404,
            Rejection::BadRequest(_) => 400,
            Rejection::UriTooLong => 414,
            Rejection::HeadersTooLarge => 431,
            Rejection::Limited { .. } => 429,
            Rejection::LimiterUnavailable => 503,
        }
    }
}

/// Whole seconds, rounded up: what `Retry-After` and the `t` parameter carry.
fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// `"per_client";r=0;t=1, ...`: the IETF httpapi `RateLimit` field for every limit of a route.
pub fn ratelimit_value(route: &Route, decision: &Decision) -> Option<HeaderValue> {
    let mut value = String::with_capacity(32 * route.limits.len());
    let rates = route
        .limits
        .iter()
        .zip(&decision.statuses)
        .filter(|(limit, _)| limit.policy.is_some() && !limit.shadow);
    for (i, (limit, status)) in rates.enumerate() {
        if i > 0 {
            value.push_str(", ");
        }
        let _ = write!(
            value,
            "\"{}\";r={};t={}",
            limit.name,
            status.remaining,
            ceil_seconds(status.reset_after_ms)
        );
    }
    // The String's buffer becomes the header's bytes: no second copy.
    HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
}

/// Adds `RateLimit-Policy` and `RateLimit` when the route sends them.
pub fn add_ratelimit_headers(
    header: &mut ResponseHeader,
    route: &Route,
    decision: &Decision,
) -> pingora::Result<()> {
    if let Some(policy) = &route.policy_header {
        header.insert_header(RATELIMIT_POLICY, policy.clone())?;
        if let Some(value) = ratelimit_value(route, decision) {
            header.insert_header(RATELIMIT, value)?;
        }
    }
    Ok(())
}

fn problem(status: u16, title: &str, detail: &str, extra: &str) -> Bytes {
    Bytes::from(format!(
        "{{\"type\":\"about:blank\",\"title\":\"{title}\",\"status\":{status},\"detail\":\"{detail}\"{extra}}}\n"
    ))
}

/// Writes the whole response for `rejection`.
pub async fn respond(session: &mut Session, rejection: Rejection<'_>) -> pingora::Result<()> {
    let status = rejection.status();
    let mut header = ResponseHeader::build(status, Some(6))?;
    let body = match &rejection {
        Rejection::NoRoute => problem(status, "Not Found", "No route matches this request.", ""),
        Rejection::BadRequest(detail) => problem(status, "Bad Request", detail, ""),
        Rejection::UriTooLong => problem(
            status,
            "URI Too Long",
            "The request target is too long.",
            "",
        ),
        Rejection::HeadersTooLarge => problem(
            status,
            "Request Header Fields Too Large",
            "The request headers are too large.",
            "",
        ),
        Rejection::LimiterUnavailable => {
            header.insert_header(RETRY_AFTER, "1")?;
            problem(
                status,
                "Service Unavailable",
                "The rate limiter is unavailable.",
                "",
            )
        }
        Rejection::Limited { route, decision } => {
            let denied = decision.denied_by.unwrap_or(0);
            let limit = route.limits.get(denied).map_or("", |l| &*l.name);
            let retry = decision.retry_after_ms().flatten();
            let extra = match retry {
                Some(ms) => {
                    let seconds = ceil_seconds(ms).max(1);
                    header.insert_header(RETRY_AFTER, seconds)?;
                    format!(",\"limit\":\"{limit}\",\"retry_after_seconds\":{seconds}")
                }
                // The request costs more than the limit can ever admit: retrying cannot help.
                None => format!(",\"limit\":\"{limit}\",\"retry_after_seconds\":null"),
            };
            add_ratelimit_headers(&mut header, route, decision)?;
            let detail = match retry {
                Some(_) => format!("Rate limit '{limit}' of route '{}' exceeded.", route.name),
                None => format!(
                    "The request's cost exceeds what limit '{limit}' of route '{}' can ever admit.",
                    route.name
                ),
            };
            problem(status, "Too Many Requests", &detail, &extra)
        }
    };
    header.insert_header(CONTENT_TYPE, "application/problem+json")?;
    header.insert_header(CONTENT_LENGTH, body.len())?;
    header.insert_header(CACHE_CONTROL, "no-store")?;
    // The request body (if any) is never read: do not reuse a connection that still holds it.
    if request_has_body(session) {
        session.set_keepalive(None);
    }
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await
}

fn request_has_body(session: &Session) -> bool {
    let headers = &session.req_header().headers;
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}
