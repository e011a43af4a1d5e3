//! The forwarding headers sent upstream: `X-Forwarded-For`, `X-Forwarded-Proto`, `Forwarded`.
//!
//! From a trusted proxy, the chain it sent is kept and the peer appended; from anyone else, what
//! the client claimed is dropped and the chain starts at the peer. A `Connection` header naming
//! one of these (a hop-by-hop trick to make the next hop strip them) loses that token.

use std::net::IpAddr;

use http::header::{HeaderName, HeaderValue, CONNECTION};
use pingora::http::RequestHeader;

static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

fn is_forwarding(token: &str) -> bool {
    [&FORWARDED, &X_FORWARDED_FOR, &X_FORWARDED_PROTO]
        .iter()
        .any(|name| token.trim().eq_ignore_ascii_case(name.as_str()))
}

/// The single value of `name` as text, if the request carries exactly one.
fn single(request: &RequestHeader, name: &HeaderName) -> Option<String> {
    let mut values = request.headers.get_all(name).iter();
    let value = values.next()?.to_str().ok()?.to_string();
    values.next().is_none().then_some(value)
}

fn forwarded_node(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("for={v4};proto=http"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto=http"),
    }
}

pub fn set_headers(
    request: &mut RequestHeader,
    peer: Option<IpAddr>,
    trusted: bool,
) -> pingora::Result<()> {
    if let Some(connection) = single(request, &CONNECTION) {
        let kept: Vec<&str> = connection
            .split(',')
            .filter(|t| !is_forwarding(t))
            .map(str::trim)
            .collect();
        if kept.is_empty() {
            request.remove_header(&CONNECTION);
        } else {
            request.insert_header(CONNECTION, kept.join(", "))?;
        }
    }
    let Some(peer) = peer else {
        return Ok(());
    };
    let chain =
        |name: &HeaderName, own: String| match trusted.then(|| single(request, name)).flatten() {
            Some(previous) if !previous.trim().is_empty() => format!("{previous}, {own}"),
            _ => own,
        };
    let xff = chain(&X_FORWARDED_FOR, peer.to_string());
    let forwarded = chain(&FORWARDED, forwarded_node(peer));
    let proto = trusted
        .then(|| single(request, &X_FORWARDED_PROTO))
        .flatten()
        .filter(|p| p == "http" || p == "https")
        .unwrap_or_else(|| "http".to_string());
    for (name, value) in [
        (&X_FORWARDED_FOR, xff),
        (&FORWARDED, forwarded),
        (&X_FORWARDED_PROTO, proto),
    ] {
        let value =
            HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("unknown"));
        request.insert_header(name.clone(), value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        for (name, value) in headers {
            req.append_header(name.to_string(), *value).unwrap();
        }
        req
    }

    fn get<'a>(req: &'a RequestHeader, name: &str) -> Option<&'a str> {
        req.headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn an_untrusted_peer_starts_the_chain() {
        let mut req = request(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("x-forwarded-proto", "https"),
        ]);
        set_headers(&mut req, Some("198.51.100.1".parse().unwrap()), false).unwrap();
        assert_eq!(get(&req, "x-forwarded-for"), Some("198.51.100.1"));
        assert_eq!(get(&req, "forwarded"), Some("for=198.51.100.1;proto=http"));
        assert_eq!(get(&req, "x-forwarded-proto"), Some("http"));
    }

    #[test]
    fn a_trusted_peer_is_appended() {
        let mut req = request(&[
            ("x-forwarded-for", "203.0.113.7"),
            ("x-forwarded-proto", "https"),
        ]);
        set_headers(&mut req, Some("2001:db8::1".parse().unwrap()), true).unwrap();
        assert_eq!(
            get(&req, "x-forwarded-for"),
            Some("203.0.113.7, 2001:db8::1")
        );
        assert_eq!(
            get(&req, "forwarded"),
            Some("for=\"[2001:db8::1]\";proto=http")
        );
        assert_eq!(get(&req, "x-forwarded-proto"), Some("https"));
    }

    #[test]
    fn connection_cannot_name_the_forwarding_headers() {
        let mut req = request(&[("connection", "keep-alive, X-Forwarded-For, forwarded")]);
        set_headers(&mut req, Some("10.0.0.1".parse().unwrap()), false).unwrap();
        assert_eq!(get(&req, "connection"), Some("keep-alive"));
        let mut only = request(&[("connection", "x-forwarded-for")]);
        set_headers(&mut only, Some("10.0.0.1".parse().unwrap()), false).unwrap();
        assert_eq!(get(&only, "connection"), None);
    }
}
