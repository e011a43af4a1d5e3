//! The access log line of a request, from what the proxy learned of it on its way. Client
//! addresses and paths appear here, never in metrics; every client-supplied string is bounded.

use http::HeaderValue;
use pingora::http::RequestHeader;
use pingora::proxy::Session;

use crate::edge::tls;
use crate::exchange::{head, Exchange};
use crate::observe::access_log::{
    bounded, millis, AccessLog, Headers, Line, MAX_FIELD_BYTES, MAX_HEADER_BYTES,
};
use crate::upstream::pool::Pool;

/// The longest method logged (Pingora bounds the request line, not the method alone).
const MAX_METHOD_BYTES: usize = 32;
/// The longest host logged.
const MAX_HOST_BYTES: usize = 256;

/// Writes the line of a request that has ended, if it is one of the sampled.
pub fn log(
    access_log: &AccessLog,
    session: &Session,
    request_id: Option<&HeaderValue>,
    exchange: &Exchange<Pool>,
) {
    let sent = session.response_written().map(|r| r.status.as_u16());
    let status = exchange.status_shown(sent).unwrap_or(0);
    if !access_log.sampled(status) {
        return;
    }
    let req = session.req_header();
    let host = head::host(req);
    let path = exchange.normalized_path().unwrap_or(req.uri.path());
    let (upstream, upstream_time, error) = exchange.upstream_summary();
    let line = Line {
        time: format!("{:.3}", jiff::Timestamp::now()),
        request_id: request_id.and_then(|id| id.to_str().ok()),
        client: exchange.client(),
        peer: session.client_addr().and_then(|a| a.as_inet()).copied(),
        method: bounded(req.method.as_str(), MAX_METHOD_BYTES),
        host: bounded(&host, MAX_HOST_BYTES),
        path: bounded(path, MAX_FIELD_BYTES),
        protocol: protocol(session),
        route: exchange.route().map(|r| &*r.name),
        consumer: exchange.consumer().map(|c| &*c.id),
        plan: exchange.plan(),
        auth_failure: exchange.auth_failure().map(|f| f.label()),
        status,
        bytes_in: exchange.body_bytes(),
        bytes_out: session.body_bytes_sent() as u64,
        duration_ms: millis(exchange.elapsed()),
        upstream,
        upstream_ms: upstream_time.map(millis),
        decision: exchange.decided().label(),
        limit: exchange.deciding_limit(),
        failure_mode: exchange.failure_mode(),
        limiter_ms: millis(exchange.limiter_time()),
        error: error.map(|kind| kind.label()),
        client_error: exchange.client_error().map(|kind| kind.label()),
        client_cert: tls::client_certificate(session.digest()).map(Into::into),
        headers: logged_headers(access_log, req),
    };
    access_log.write(&line);
}

/// The request headers the access log is configured to show, each cut to `MAX_HEADER_BYTES`.
fn logged_headers<'a>(access_log: &'a AccessLog, req: &'a RequestHeader) -> Headers<'a> {
    Headers(
        access_log
            .headers()
            .iter()
            .filter_map(|name| {
                let value = req.headers.get(name)?.as_bytes();
                let value = &value[..value.len().min(MAX_HEADER_BYTES)];
                Some((name.as_str(), String::from_utf8_lossy(value)))
            })
            .collect(),
    )
}

/// The protocol the request came over, as logged.
fn protocol(session: &Session) -> &'static str {
    if session.is_http2() {
        "HTTP/2"
    } else if session.req_header().version == http::Version::HTTP_10 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    }
}
