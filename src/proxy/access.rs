//! The access log line of a request, from what the proxy learned of it on its way. Client
//! addresses and paths appear here, never in metrics; every client-supplied string is bounded.

use pingora::proxy::Session;

use super::{request, RequestCtx};
use crate::access_log::{
    bounded, millis, AccessLog, Headers, Line, MAX_FIELD_BYTES, MAX_HEADER_BYTES,
};
use crate::limiter::{Outcome, Verdict};

/// The longest method logged (Pingora bounds the request line, not the method alone).
const MAX_METHOD_BYTES: usize = 32;
/// The longest host logged.
const MAX_HOST_BYTES: usize = 256;

/// Writes the line of a request that has ended, if it is one of the sampled.
pub fn log(access_log: &AccessLog, session: &Session, ctx: &RequestCtx, verdict: &Verdict) {
    let status = session.response_written().map_or(0, |r| r.status.as_u16());
    if !access_log.sampled(status) {
        return;
    }
    let req = session.req_header();
    let route = ctx.route.as_deref();
    let limit = super::deciding_limit(route, verdict);
    let failure_mode = match verdict.outcome {
        Outcome::ErrorAllowed
        | Outcome::ErrorDenied
        | Outcome::LocalAllowed
        | Outcome::LocalLimited => route.map(|r| r.limits.failure_mode().label()),
        _ => None,
    };
    let host = request::host(req);
    let path = ctx.normalized_path.as_deref().unwrap_or(req.uri.path());
    let headers = Headers(
        access_log
            .headers()
            .iter()
            .filter_map(|name| {
                let value = req.headers.get(name)?.as_bytes();
                let value = &value[..value.len().min(MAX_HEADER_BYTES)];
                Some((name.as_str(), String::from_utf8_lossy(value)))
            })
            .collect(),
    );
    let protocol = if session.is_http2() {
        "HTTP/2"
    } else if req.version == http::Version::HTTP_10 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    };
    let line = Line {
        time: format!("{:.3}", jiff::Timestamp::now()),
        request_id: ctx.request_id.as_ref().and_then(|id| id.to_str().ok()),
        client: ctx.client,
        peer: session.client_addr().and_then(|a| a.as_inet()).copied(),
        method: bounded(req.method.as_str(), MAX_METHOD_BYTES),
        host: bounded(&host, MAX_HOST_BYTES),
        path: bounded(path, MAX_FIELD_BYTES),
        protocol,
        route: route.map(|r| &*r.name),
        status,
        bytes_in: ctx.body_bytes,
        bytes_out: session.body_bytes_sent() as u64,
        duration_ms: ctx.started.map_or(0.0, |t| millis(t.elapsed())),
        upstream: ctx.upstream,
        upstream_ms: ctx.upstream_time.map(millis),
        decision: verdict.outcome.label(),
        limit,
        failure_mode,
        limiter_ms: millis(verdict.limiter_time),
        error: ctx.upstream_error.map(|kind| kind.label()),
        headers,
    };
    access_log.write(&line);
}
