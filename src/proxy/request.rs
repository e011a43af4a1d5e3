//! What sluice reads of a request head before deciding: its size, its host, and the facts its
//! route's keys are built from.

use std::borrow::Cow;

use pingora::http::RequestHeader;

use crate::limiter::Rejection;

/// Longest request target (path and query) accepted; longer gets `414`.
pub const MAX_URI_LEN: usize = 8 * 1024;
/// Most header bytes (names and values) accepted; more gets `431`.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// `414` for an overlong request target, `431` for too many header bytes: before any Redis call.
pub fn oversized(req: &RequestHeader) -> Option<Rejection> {
    if req.uri.path_and_query().map_or(0, |pq| pq.as_str().len()) > MAX_URI_LEN {
        return Some(Rejection::UriTooLong);
    }
    let header_bytes: usize = req
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    (header_bytes > MAX_HEADER_BYTES).then_some(Rejection::HeadersTooLarge)
}

/// The request's host, lowercased, without port or trailing dot.
pub fn host(req: &RequestHeader) -> Cow<'_, str> {
    let raw = req
        .uri
        .host()
        .or_else(|| {
            req.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("");
    let without_port = match raw.rfind(':') {
        Some(i) if !raw.ends_with(']') && raw[i + 1..].bytes().all(|b| b.is_ascii_digit()) => {
            &raw[..i]
        }
        _ => raw,
    };
    let host = without_port.trim_end_matches('.');
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}
