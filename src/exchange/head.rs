//! What sluice reads of a request head before deciding: its size, the form of its target, its
//! host; each refused with a `400` (or `414`/`431`) when a backend could read it otherwise.

use std::borrow::Cow;
use std::net::IpAddr;

use http::request::Parts;
use http::{Method, Version};

use crate::caller::client_cert::ClientCertificate;
use crate::exchange::answer::Answer;

/// A request head as the exchange reads it: what any adapter (HTTP/1, HTTP/2) can hand over
/// without its own types.
#[derive(Clone, Copy)]
pub struct Head<'a> {
    pub parts: &'a Parts,
    /// The request target's bytes as they came (the URI may have re-encoded them).
    pub raw_target: &'a [u8],
    /// The TCP peer.
    pub peer: Option<IpAddr>,
    /// The client certificate the TLS listener verified (mTLS), read once per connection.
    pub client_certificate: Option<&'a ClientCertificate>,
    /// What the front door cut of the head so Pingora could parse the rest (HTTP/1:
    /// `edge/proxy/head_count.rs`).
    pub cut: Cut,
}

/// What the front door cut of an HTTP/1 head: the header fields past [`MAX_HEADER_FIELDS`]
/// (Pingora parses no more) and the target's bytes past [`MAX_URI_LEN`] (Pingora's URI type
/// holds less than 64 KiB). Either is an answer of the gateway's own (`431`, `414`), and the
/// connection is not kept: what was dropped is never read as a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cut {
    pub fields: bool,
    pub target: bool,
}

impl Cut {
    /// Something was cut.
    pub fn any(self) -> bool {
        self.fields || self.target
    }
}

/// The form of a request target (RFC 9112 §3.2) sluice accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `/path?query`
    Origin,
    /// `http://host/path?query`: the authority (which Pingora requires to equal `Host`) is the
    /// host; the upstream gets the origin form.
    Absolute,
    /// `*`, for `OPTIONS` only: routed as `/`, forwarded as `*`.
    Asterisk,
}

const BAD_TARGET: &str =
    "The request target must be an absolute path (/...), an absolute URI (http://host/...), or * for OPTIONS.";
const BAD_HOST: &str =
    "The Host header must be a host name or address with at most one numeric port.";
const NO_HOST: &str = "An HTTP/1.1 request must carry a Host header.";

/// The form of the request's target; anything else is `400`.
pub fn target(head: &Head<'_>) -> Result<Target, Answer> {
    let (raw, req) = (head.raw_target, head.parts);
    let lower = |prefix: &[u8]| {
        raw.len() >= prefix.len() && raw[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    if raw.first() == Some(&b'/') {
        Ok(Target::Origin)
    } else if raw == b"*" && req.method == Method::OPTIONS {
        Ok(Target::Asterisk)
    } else if (lower(b"http://") || lower(b"https://")) && req.uri.path().starts_with('/') {
        Ok(Target::Absolute)
    } else {
        Err(Answer::BadRequest(BAD_TARGET))
    }
}

/// A `Host` that names one host and at most one numeric port; HTTP/1.1 requires one. Returns
/// the header's text, when the request carries one, for [`host_from`].
pub fn check_host(req: &Parts) -> Result<Option<&str>, Answer> {
    let mut hosts = req.headers.get_all(http::header::HOST).iter();
    let Some(host) = hosts.next() else {
        // HTTP/2 carries the authority in the URI instead.
        return match (req.version, req.uri.authority()) {
            (Version::HTTP_11, None) => Err(Answer::BadRequest(NO_HOST)),
            _ => Ok(None),
        };
    };
    if hosts.next().is_some() {
        return Err(Answer::BadRequest(BAD_HOST));
    }
    let host = host.to_str().map_err(|_| Answer::BadRequest(BAD_HOST))?;
    valid_authority(host)
        .then_some(Some(host))
        .ok_or(Answer::BadRequest(BAD_HOST))
}

/// `name[:port]`, `a.b.c.d[:port]` or `[v6][:port]`; a port is 1 to 5 digits up to 65535.
fn valid_authority(host: &str) -> bool {
    let (name, port) = if let Some(rest) = host.strip_prefix('[') {
        let Some((address, after)) = rest.split_once(']') else {
            return false;
        };
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => return true,
            after => match after.strip_prefix(':') {
                Some(port) => ("v6", Some(port)),
                None => return false,
            },
        }
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
    let port_ok = port.is_none_or(|port| {
        !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| p <= 65_535)
    });
    name_ok && port_ok
}

/// Longest request target (path and query; on HTTP/1 the whole target as sent) accepted; longer
/// gets `414`.
pub const MAX_URI_LEN: usize = 8 * 1024;
/// Most header bytes (names and values) accepted; more gets `431`.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;
/// Most header fields accepted; more get `431`. Pingora parses at most 256 in an HTTP/1 head
/// (the front door drops the rest and says so: [`Cut`]); HTTP/2 heads are counted here.
pub const MAX_HEADER_FIELDS: usize = 256;

/// `414` for an overlong request target, `431` for too many header fields or bytes (`cut`: what
/// the front door dropped past the limits): before any Redis call.
pub fn oversized(req: &Parts, cut: Cut) -> Option<Answer> {
    if cut.target || req.uri.path_and_query().map_or(0, |pq| pq.as_str().len()) > MAX_URI_LEN {
        return Some(Answer::UriTooLong);
    }
    if cut.fields || req.headers.len() > MAX_HEADER_FIELDS {
        return Some(Answer::HeadersTooLarge);
    }
    let header_bytes: usize = req
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    (header_bytes > MAX_HEADER_BYTES).then_some(Answer::HeadersTooLarge)
}

/// The body length the request declares (`Content-Length`), if any.
pub fn declared_body_length(req: &Parts) -> Option<u64> {
    req.headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The request's host, lowercased, without port or trailing dot.
pub fn host(req: &Parts) -> Cow<'_, str> {
    let header = req
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    host_from(req, header)
}

/// As [`host`], with the `Host` header's text already found (by [`check_host`]): the URI's
/// host when it names one, else `header`.
pub fn host_from<'a>(req: &'a Parts, header: Option<&'a str>) -> Cow<'a, str> {
    let raw = req.uri.host().or(header).unwrap_or("");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_have_one_name_and_at_most_one_numeric_port() {
        for good in [
            "example.com",
            "example.com:8080",
            "10.0.0.1:80",
            "[::1]",
            "[2001:db8::1]:443",
            "a_b.local",
        ] {
            assert!(valid_authority(good), "{good}");
        }
        for bad in [
            "",
            "a:b",
            "a:1:2",
            "example.com:",
            "example.com:99999",
            "[::1",
            "[zz]",
            "a b",
            "a@b",
            "[::1]x",
        ] {
            assert!(!valid_authority(bad), "{bad:?}");
        }
    }
}
