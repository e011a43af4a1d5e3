//! The one place where answers become HTTP responses, and decisions become `RateLimit`
//! headers. What each answer means (status, title, detail, gRPC status, metric label) is
//! decided in `crate::exchange::answer`; this writes it as `application/problem+json`, or, for a gRPC
//! call, as what a gRPC client understands: HTTP 200 with `grpc-status`, `grpc-message` and, for
//! a limit, the retry delay (`grpc-retry-pushback-ms`, `Retry-After`) — a trailers-only answer.

use bytes::Bytes;
use http::header::{
    HeaderValue, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use pingora::http::ResponseHeader;
use pingora::protocols::http::HttpTask;
use pingora::proxy::Session;

use crate::caller::consumers::AuthFailure;
use crate::exchange::answer::{Answer, GrpcStatus};
use crate::exchange::{Exchange, LimitsSaid};
use crate::limiter::fields::{self, push_decimal, whole_seconds};
use crate::upstream::pool::Pool;

pub const RATELIMIT: &str = "ratelimit";
pub const RATELIMIT_POLICY: &str = "ratelimit-policy";

/// `"per_client";r=0;t=1;pk=:...:, ...`: the IETF httpapi `RateLimit` field for every shown
/// limit the request met that is a rate (`limiter::fields` writes it). A limit whose key depends
/// on the request (per client, consumer, path...) names the bucket it counted in (`pk`); a
/// per-route limit has one bucket and no `pk`.
pub fn ratelimit_value(said: &LimitsSaid<'_>) -> Option<HeaderValue> {
    let mut value = Vec::with_capacity(64);
    for (tier_limit, record) in said.iter() {
        let (limit, Some(status)) = (&tier_limit.limit.exact, &record.status) else {
            continue;
        };
        if limit.advertised_policy().is_some() {
            fields::push_state_item(
                &mut value,
                &limit.name,
                status.remaining,
                status.reset_after_ms,
            );
            if !tier_limit.key.one_bucket() {
                fields::push_partition_key(&mut value, &record.ask.key);
            }
        }
    }
    // The buffer becomes the header's bytes: no second copy.
    HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
}

/// Adds `RateLimit-Policy` and `RateLimit` when the route sends them: those of the limits the
/// caller met (its plan's).
pub fn add_ratelimit_headers(
    header: &mut ResponseHeader,
    said: LimitsSaid<'_>,
) -> pingora::Result<()> {
    if let Some(policy) = said.policy_header() {
        header.insert_header(RATELIMIT_POLICY, policy)?;
        if let Some(value) = ratelimit_value(&said) {
            header.insert_header(RATELIMIT, value)?;
        }
    }
    Ok(())
}

/// The request's id, as the header that carries it: the gateway's own answers return it too.
#[derive(Clone, Copy)]
pub struct RequestIdHeader<'a> {
    /// The header's name as it is sent (`RequestIdSettings::spelling`).
    pub name: &'a Bytes,
    pub value: &'a HeaderValue,
}

/// An `application/problem+json` body; `extra` is more members, each starting with a comma.
/// The request id is a member too (ids are checked to hold no quote or backslash).
fn problem(
    status: u16,
    title: &str,
    detail: &str,
    extra: &str,
    id: Option<RequestIdHeader<'_>>,
) -> Bytes {
    let mut body = problem_start(status, "about:blank", title, detail.len() + extra.len());
    body.extend_from_slice(detail.as_bytes());
    body.push(b'"');
    body.extend_from_slice(extra.as_bytes());
    problem_end(body, id)
}

/// A problem body up to its open `detail` string, in a buffer with `room` more bytes (and
/// enough for the request id and the end): each answer is written into one allocation.
fn problem_start(status: u16, kind: &str, title: &str, room: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(160 + kind.len() + title.len() + room);
    body.extend_from_slice(b"{\"type\":\"");
    body.extend_from_slice(kind.as_bytes());
    body.extend_from_slice(b"\",\"title\":\"");
    body.extend_from_slice(title.as_bytes());
    body.extend_from_slice(b"\",\"status\":");
    push_decimal(&mut body, u64::from(status));
    body.extend_from_slice(b",\"detail\":\"");
    body
}

/// Ends a problem body: the request id member, when requests have ids, and the closing brace.
fn problem_end(mut body: Vec<u8>, id: Option<RequestIdHeader<'_>>) -> Bytes {
    if let Some(id) = id.and_then(|id| id.value.to_str().ok()) {
        body.extend_from_slice(b",\"request_id\":\"");
        body.extend_from_slice(id.as_bytes());
        body.push(b'"');
    }
    body.extend_from_slice(b"}\n");
    Bytes::from(body)
}

/// Writes the whole response for `answer` to the request of `exchange`: a `429` names the
/// denying limit and carries the limits' headers, a `401` the challenge of the verifiers.
pub async fn respond(
    session: &mut Session,
    answer: Answer,
    exchange: Option<&Exchange<Pool>>,
    id: Option<RequestIdHeader<'_>>,
) -> pingora::Result<()> {
    let limited = exchange.and_then(Exchange::limits_said);
    if answer.closes_connection() {
        session.set_keepalive(None);
    }
    if is_grpc(session) {
        return respond_grpc(session, answer, limited, id).await;
    }
    let status = answer.status();
    let mut header = ResponseHeader::build(status, Some(6))?;
    if let Some(challenge) = exchange.and_then(|e| e.challenge(answer)) {
        header.insert_header(WWW_AUTHENTICATE, challenge.clone())?;
    }
    let body = match (answer, limited) {
        (Answer::Limited { .. }, Some(said)) => limited_body(&mut header, said, id)?,
        (
            Answer::LimiterUnavailable | Answer::Shed | Answer::AuthFailed(AuthFailure::NoKeys),
            _,
        ) => {
            header.insert_header(RETRY_AFTER, "1")?;
            problem(status, answer.title(), answer.detail(), "", id)
        }
        _ => problem(status, answer.title(), answer.detail(), "", id),
    };
    send(session, header, body, id).await
}

/// A gRPC call: `content-type: application/grpc` (and its `+proto`, `+json`... forms).
pub fn is_grpc(session: &Session) -> bool {
    session
        .req_header()
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// What `grpc-message` percent-encodes (gRPC over HTTP/2): `%` and control bytes; bytes
/// beyond ASCII always are.
const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// `text` as a `grpc-message` value.
fn grpc_message(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, GRPC_MESSAGE).to_string()
}

/// The gRPC answer; a limit carries its retry delay and `RateLimit` headers.
async fn respond_grpc(
    session: &mut Session,
    answer: Answer,
    limited: Option<LimitsSaid<'_>>,
    id: Option<RequestIdHeader<'_>>,
) -> pingora::Result<()> {
    let mut header = ResponseHeader::build(200, Some(8))?;
    let message = match (answer, limited) {
        (Answer::Limited { .. }, Some(said)) => {
            if let Some(ms) = said.retry().after_ms() {
                header.insert_header("grpc-retry-pushback-ms", ms)?;
                header.insert_header(RETRY_AFTER, whole_seconds(ms).max(1))?;
            }
            add_ratelimit_headers(&mut header, said)?;
            let route = &said.route.name;
            match denied_name(&said) {
                Some(limit) => format!("rate limit '{limit}' of route '{route}' exceeded"),
                None => format!("rate limit of route '{route}' exceeded"),
            }
        }
        (Answer::LimiterUnavailable | Answer::Shed, _) => {
            header.insert_header("grpc-retry-pushback-ms", 1000)?;
            answer.detail().to_string()
        }
        _ => answer.detail().to_string(),
    };
    send_grpc(session, header, answer.grpc_status(), &message, id).await
}

/// Sends a trailers-only gRPC answer: one HEADERS frame that ends the stream.
async fn send_grpc(
    session: &mut Session,
    mut header: ResponseHeader,
    status: GrpcStatus,
    message: &str,
    id: Option<RequestIdHeader<'_>>,
) -> pingora::Result<()> {
    add_request_id(&mut header, id)?;
    header.insert_header(CONTENT_TYPE, "application/grpc")?;
    header.insert_header("grpc-status", u16::from(status.code()))?;
    header.insert_header("grpc-message", grpc_message(message))?;
    if !session.is_http2() {
        header.insert_header(CONTENT_LENGTH, 0)?;
    }
    if request_has_body(session) {
        session.set_keepalive(None);
    }
    session
        .write_response_tasks(vec![HttpTask::Header(Box::new(header), true)])
        .await
        .map(|_| ())
}

/// Adds the request id header, when requests have ids.
pub fn add_request_id(
    header: &mut ResponseHeader,
    id: Option<RequestIdHeader<'_>>,
) -> pingora::Result<()> {
    if let Some(id) = id {
        header.insert_header(id.name.clone(), id.value.clone())?;
    }
    Ok(())
}

/// Sends `header` and `body` as an `application/problem+json` answer of the gateway.
async fn send(
    session: &mut Session,
    mut header: ResponseHeader,
    body: Bytes,
    id: Option<RequestIdHeader<'_>>,
) -> pingora::Result<()> {
    add_request_id(&mut header, id)?;
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

/// The problem type of a `429` (draft-ietf-httpapi-ratelimit-headers-11, section 7.1).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The `429` body, `Retry-After` and rate-limit headers of a denied request, written into one
/// buffer without `format!`: the draft's `quota-exceeded` problem, its `violated-policies`
/// (every shown limit that denied the request), and the denying limit by name unless it is
/// hidden (`headers: hide`).
fn limited_body(
    header: &mut ResponseHeader,
    said: LimitsSaid<'_>,
    id: Option<RequestIdHeader<'_>>,
) -> pingora::Result<Bytes> {
    let route = said.route;
    let limit = denied_name(&said);
    let retry = said.retry().after_ms();
    let title = "Request cannot be satisfied as assigned quota has been exceeded";
    let room = 128 + 3 * limit.map_or(0, str::len) + route.name.len();
    let mut body = problem_start(429, QUOTA_EXCEEDED, title, room);
    let (opening, closing) = match retry {
        Some(_) => ("Rate limit ", " exceeded."),
        // The request costs more than the limit can ever admit: retrying cannot help.
        None => (
            "The request's cost exceeds what rate limit ",
            " can ever admit.",
        ),
    };
    body.extend_from_slice(opening.as_bytes());
    if let Some(limit) = limit {
        for part in ["'", limit, "' "] {
            body.extend_from_slice(part.as_bytes());
        }
    }
    for part in [
        "of route '",
        &route.name,
        "'",
        closing,
        "\",\"violated-policies\":[",
    ] {
        body.extend_from_slice(part.as_bytes());
    }
    for (i, violated) in said.violated().enumerate() {
        body.extend_from_slice(if i == 0 { b"\"" } else { b",\"" });
        body.extend_from_slice(violated.limit.exact.name.as_bytes());
        body.push(b'"');
    }
    body.push(b']');
    if let Some(limit) = limit {
        body.extend_from_slice(b",\"limit\":\"");
        body.extend_from_slice(limit.as_bytes());
        body.push(b'"');
    }
    body.extend_from_slice(b",\"retry_after_seconds\":");
    match retry {
        Some(ms) => {
            let seconds = whole_seconds(ms).max(1);
            header.insert_header(RETRY_AFTER, seconds)?;
            push_decimal(&mut body, seconds);
        }
        None => body.extend_from_slice(b"null"),
    }
    add_ratelimit_headers(header, said)?;
    Ok(problem_end(body, id))
}

/// The name of the limit that denied the request, unless it is hidden (`headers: hide`).
fn denied_name<'a>(said: &LimitsSaid<'a>) -> Option<&'a str> {
    let denied = &said.denied()?.limit.exact;
    (!denied.hidden).then_some(&*denied.name)
}

fn request_has_body(session: &Session) -> bool {
    let headers = &session.req_header().headers;
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_escape_percent_controls_and_non_ascii() {
        assert_eq!(
            grpc_message("rate limit 'a' of route 'b' exceeded"),
            "rate limit 'a' of route 'b' exceeded"
        );
        assert_eq!(grpc_message("50%\ndone é"), "50%25%0Adone %C3%A9");
    }

    #[test]
    fn decimals_are_written_whole() {
        let mut out = Vec::new();
        for n in [0, 7, 10, u64::MAX] {
            push_decimal(&mut out, n);
            out.push(b' ');
        }
        assert_eq!(out, b"0 7 10 18446744073709551615 ");
    }
}
