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
use smallvec::SmallVec;

static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Every header this module owns, with the spelling it is sent upstream in. Pingora inserts a
/// `&'static str` name as it is, where a `HeaderName` is copied and re-cased on every insert.
const OWNED: [(&HeaderName, &str); 6] = [
    (&X_FORWARDED_FOR, "X-Forwarded-For"),
    (&FORWARDED, "Forwarded"),
    (&X_FORWARDED_PROTO, "X-Forwarded-Proto"),
    (&X_FORWARDED_HOST, "X-Forwarded-Host"),
    (&X_FORWARDED_PORT, "X-Forwarded-Port"),
    (&X_REAL_IP, "X-Real-IP"),
];

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
    OWNED
        .iter()
        .any(|(name, _)| token.trim().eq_ignore_ascii_case(name.as_str()))
}

/// The single value of `name` as text, if the request carries exactly one.
fn single(request: &RequestHeader, name: &HeaderName) -> Option<String> {
    let mut values = request.headers.get_all(name).iter();
    let value = values.next()?.to_str().ok()?.to_string();
    values.next().is_none().then_some(value)
}

/// What a trusted proxy said before sluice, kept when it is well formed.
#[derive(Default)]
struct Claims {
    chained_for: Option<String>,
    chained_forwarded: Option<String>,
    proto: Option<String>,
    host: Option<String>,
    port: Option<String>,
}

/// Strips `Connection` tokens naming the owned headers, reads a trusted peer's claims, then
/// removes every owned header: the slow path, for the few requests that carry any of them.
fn take_claims(request: &mut RequestHeader, trusted: bool) -> pingora::Result<Claims> {
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
    let claim = |request: &RequestHeader, name: &HeaderName| {
        trusted
            .then(|| single(request, name))
            .flatten()
            .filter(|value| !value.trim().is_empty())
    };
    let claims = Claims {
        chained_for: claim(request, &X_FORWARDED_FOR),
        chained_forwarded: claim(request, &FORWARDED),
        proto: claim(request, &X_FORWARDED_PROTO).filter(|p| p == "http" || p == "https"),
        host: claim(request, &X_FORWARDED_HOST),
        port: claim(request, &X_FORWARDED_PORT).filter(|p| p.parse::<u16>().is_ok()),
    };
    for (name, _) in OWNED {
        request.remove_header(name);
    }
    Ok(claims)
}

/// Text written on the stack: an address, a port, a `Forwarded` element.
type Text = SmallVec<[u8; 96]>;

/// `ip` as text; IPv4 without the formatting machinery (it is nearly every request).
fn write_ip(out: &mut Text, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        IpAddr::V6(v6) => {
            out.extend_from_slice(v6.to_string().as_bytes());
        }
    }
}

fn value(text: &[u8]) -> Option<HeaderValue> {
    HeaderValue::from_bytes(text).ok()
}

/// `previous, own` when a trusted proxy sent a chain, else `own`.
fn chained(previous: Option<String>, own: &[u8]) -> Option<HeaderValue> {
    match previous {
        Some(previous) => {
            let mut text = previous.into_bytes();
            text.extend_from_slice(b", ");
            text.extend_from_slice(own);
            value(&text)
        }
        None => value(own),
    }
}

/// This hop's `Forwarded` element: `for=` the peer, `proto=`, and `host=` when it is safe to
/// quote.
fn forwarded_element(peer: IpAddr, peer_text: &[u8], hop: &Hop<'_>) -> Text {
    let mut forwarded = Text::new();
    forwarded.extend_from_slice(b"for=");
    match peer {
        IpAddr::V4(_) => forwarded.extend_from_slice(peer_text),
        IpAddr::V6(_) => {
            forwarded.extend_from_slice(b"\"[");
            forwarded.extend_from_slice(peer_text);
            forwarded.extend_from_slice(b"]\"");
        }
    }
    forwarded.extend_from_slice(b";proto=");
    forwarded.extend_from_slice(hop.proto.as_bytes());
    if let Some(host) = hop
        .host
        .filter(|h| h.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
    {
        forwarded.extend_from_slice(b";host=\"");
        forwarded.extend_from_slice(host.as_bytes());
        forwarded.push(b'"');
    }
    forwarded
}

/// Sets the forwarding headers the upstream gets for this hop (what an untrusted peer claimed
/// is dropped; a trusted proxy's chains are kept and this hop appended).
pub fn set_headers(request: &mut RequestHeader, hop: Hop<'_>) -> pingora::Result<()> {
    // One pass over the names: nearly no request carries any of these.
    let carries = request
        .headers
        .keys()
        .any(|name| name == CONNECTION || OWNED.iter().any(|(owned, _)| name == *owned));
    let claims = if carries {
        take_claims(request, hop.trusted)?
    } else {
        Claims::default()
    };
    let Some(peer) = hop.peer else {
        return Ok(());
    };
    let mut peer_text = Text::new();
    write_ip(&mut peer_text, peer);
    let real_ip = match hop.client {
        Some(client) if client == peer => Some(peer_text.clone()),
        Some(client) => {
            let mut text = Text::new();
            write_ip(&mut text, client);
            Some(text)
        }
        None => None,
    };
    let forwarded = forwarded_element(peer, &peer_text, &hop);
    let proto = match claims.proto {
        Some(claimed) => value(claimed.as_bytes()),
        None => Some(HeaderValue::from_static(hop.proto)),
    };
    let host = match claims.host {
        Some(claimed) => value(claimed.as_bytes()),
        None => hop.host.and_then(|host| value(host.as_bytes())),
    };
    let port = match claims.port {
        Some(claimed) => value(claimed.as_bytes()),
        None => hop.port.map(HeaderValue::from),
    };
    let values = [
        chained(claims.chained_for, &peer_text),
        chained(claims.chained_forwarded, &forwarded),
        proto,
        host,
        port,
        real_ip.and_then(|text| value(&text)),
    ];
    for ((_, spelling), value) in OWNED.into_iter().zip(values) {
        if let Some(value) = value {
            request.append_header(spelling, value)?;
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
    fn addresses_are_written_as_std_writes_them() {
        for ip in [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.100.5",
            "1.20.3.199",
            "2001:db8::1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let mut text = Text::new();
            write_ip(&mut text, ip);
            assert_eq!(std::str::from_utf8(&text).unwrap(), ip.to_string());
        }
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
