//! The forwarding headers sent upstream: `X-Forwarded-For`, `X-Forwarded-Proto`,
//! `X-Forwarded-Host`, `X-Forwarded-Port`, `Forwarded` and `X-Real-IP` — what a backend believes
//! about who asked, and how.
//!
//! From a trusted proxy, the chains it sent are kept and the peer appended, and its claims about
//! the original scheme, host and port are kept; from anyone else, every such claim is dropped
//! and replaced with what sluice saw. `X-Real-IP` is always the client sluice keyed the request
//! on (after walking trusted proxies). A `Connection` header naming one of these (a hop-by-hop
//! trick to make the next hop strip them) loses that token.

use std::net::IpAddr;

use http::header::{HeaderName, HeaderValue, CONNECTION};
use pingora::http::RequestHeader;

static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Every header this module owns.
fn owned() -> [&'static HeaderName; 6] {
    [
        &FORWARDED,
        &X_FORWARDED_FOR,
        &X_FORWARDED_PROTO,
        &X_FORWARDED_HOST,
        &X_FORWARDED_PORT,
        &X_REAL_IP,
    ]
}

/// What sluice knows of the request it forwards.
#[derive(Debug, Clone, Copy)]
pub struct Hop<'a> {
    /// The socket peer.
    pub peer: Option<IpAddr>,
    /// Whether the peer is a trusted proxy.
    pub trusted: bool,
    /// The client the request was keyed on (the peer, or the first untrusted hop).
    pub client: Option<IpAddr>,
    /// `http` or `https`, as the request reached sluice.
    pub proto: &'static str,
    /// The `Host` the request named.
    pub host: Option<&'a str>,
    /// The port of the listener that accepted the request.
    pub port: Option<u16>,
}

fn is_owned(token: &str) -> bool {
    owned()
        .iter()
        .any(|name| token.trim().eq_ignore_ascii_case(name.as_str()))
}

/// The single value of `name` as text, if the request carries exactly one.
fn single(request: &RequestHeader, name: &HeaderName) -> Option<String> {
    let mut values = request.headers.get_all(name).iter();
    let value = values.next()?.to_str().ok()?.to_string();
    values.next().is_none().then_some(value)
}

fn forwarded_node(ip: IpAddr, proto: &str, host: Option<&str>) -> String {
    let node = match ip {
        IpAddr::V4(v4) => format!("for={v4}"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
    };
    match host {
        Some(host) => format!("{node};proto={proto};host=\"{host}\""),
        None => format!("{node};proto={proto}"),
    }
}

pub fn set_headers(request: &mut RequestHeader, hop: Hop<'_>) -> pingora::Result<()> {
    if let Some(connection) = single(request, &CONNECTION) {
        let kept: Vec<&str> = connection
            .split(',')
            .filter(|t| !is_owned(t))
            .map(str::trim)
            .collect();
        if kept.is_empty() {
            request.remove_header(&CONNECTION);
        } else {
            request.insert_header(CONNECTION, kept.join(", "))?;
        }
    }
    // A trusted proxy's claims, read before anything is replaced.
    let claim = |request: &RequestHeader, name: &HeaderName| {
        hop.trusted
            .then(|| single(request, name))
            .flatten()
            .filter(|value| !value.trim().is_empty())
    };
    let chained_xff = claim(request, &X_FORWARDED_FOR);
    let chained_forwarded = claim(request, &FORWARDED);
    let proto = claim(request, &X_FORWARDED_PROTO)
        .filter(|p| p == "http" || p == "https")
        .unwrap_or_else(|| hop.proto.to_string());
    let host = claim(request, &X_FORWARDED_HOST).or_else(|| hop.host.map(str::to_string));
    let port = claim(request, &X_FORWARDED_PORT)
        .filter(|p| p.parse::<u16>().is_ok())
        .or_else(|| hop.port.map(|p| p.to_string()));
    for name in owned() {
        request.remove_header(name);
    }
    let Some(peer) = hop.peer else {
        return Ok(());
    };
    let chain = |previous: Option<String>, own: String| match previous {
        Some(previous) => format!("{previous}, {own}"),
        None => own,
    };
    let host_param = hop
        .host
        .filter(|h| h.bytes().all(|b| b.is_ascii_graphic() && b != b'"'));
    let values = [
        (&X_FORWARDED_FOR, Some(chain(chained_xff, peer.to_string()))),
        (
            &FORWARDED,
            Some(chain(
                chained_forwarded,
                forwarded_node(peer, hop.proto, host_param),
            )),
        ),
        (&X_FORWARDED_PROTO, Some(proto)),
        (&X_FORWARDED_HOST, host),
        (&X_FORWARDED_PORT, port),
        (&X_REAL_IP, hop.client.map(|ip| ip.to_string())),
    ];
    for (name, value) in values {
        let Some(value) = value else { continue };
        if let Ok(value) = HeaderValue::from_str(&value) {
            request.insert_header(name.clone(), value)?;
        }
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

    fn hop(peer: &str, trusted: bool, client: &str) -> Hop<'static> {
        Hop {
            peer: Some(peer.parse().unwrap()),
            trusted,
            client: Some(client.parse().unwrap()),
            proto: "http",
            host: Some("api.example.com"),
            port: Some(8080),
        }
    }

    const FORGED: [(&str, &str); 6] = [
        ("x-forwarded-for", "6.6.6.6"),
        ("forwarded", "for=6.6.6.6"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "admin.internal"),
        ("x-forwarded-port", "443"),
        ("x-real-ip", "6.6.6.6"),
    ];

    #[test]
    fn an_untrusted_peer_cannot_claim_anything() {
        let mut req = request(&FORGED);
        set_headers(&mut req, hop("198.51.100.1", false, "198.51.100.1")).unwrap();
        assert_eq!(get(&req, "x-forwarded-for"), Some("198.51.100.1"));
        assert_eq!(
            get(&req, "forwarded"),
            Some("for=198.51.100.1;proto=http;host=\"api.example.com\"")
        );
        assert_eq!(get(&req, "x-forwarded-proto"), Some("http"));
        assert_eq!(get(&req, "x-forwarded-host"), Some("api.example.com"));
        assert_eq!(get(&req, "x-forwarded-port"), Some("8080"));
        assert_eq!(get(&req, "x-real-ip"), Some("198.51.100.1"));
    }

    #[test]
    fn a_trusted_peer_is_appended_and_its_claims_kept() {
        let mut req = request(&FORGED);
        set_headers(&mut req, hop("2001:db8::1", true, "6.6.6.6")).unwrap();
        assert_eq!(get(&req, "x-forwarded-for"), Some("6.6.6.6, 2001:db8::1"));
        assert_eq!(
            get(&req, "forwarded"),
            Some("for=6.6.6.6, for=\"[2001:db8::1]\";proto=http;host=\"api.example.com\"")
        );
        assert_eq!(get(&req, "x-forwarded-proto"), Some("https"));
        assert_eq!(get(&req, "x-forwarded-host"), Some("admin.internal"));
        assert_eq!(get(&req, "x-forwarded-port"), Some("443"));
        assert_eq!(get(&req, "x-real-ip"), Some("6.6.6.6"));
    }

    #[test]
    fn connection_cannot_name_the_forwarding_headers() {
        let mut req = request(&[("connection", "keep-alive, X-Forwarded-For, x-real-ip")]);
        set_headers(&mut req, hop("10.0.0.1", false, "10.0.0.1")).unwrap();
        assert_eq!(get(&req, "connection"), Some("keep-alive"));
        let mut only = request(&[("connection", "x-forwarded-for")]);
        set_headers(&mut only, hop("10.0.0.1", false, "10.0.0.1")).unwrap();
        assert_eq!(get(&only, "connection"), None);
    }
}
