//! Limiter keys: from the parts a limit names to bounded, hash-tagged Redis key bytes.
//!
//! Layout: `<prefix>:{<route>[.<tag>]}:<limit>:<digest>`.
//! * prefix, route and limit names come from the config (checked charset, no braces), so keys
//!   stay readable where that is safe;
//! * `digest` is a 128-bit xxh3 of the limit's key parts, each length-prefixed, so no client
//!   byte reaches Redis and every key has the same bounded length;
//! * the hash tag `{...}` holds the route and a 64-bit digest of the parts *every* limit of the
//!   route shares, so all keys of one call land in one Redis Cluster slot while different
//!   clients still spread across slots.

use std::net::IpAddr;

use http::header::HeaderName;
use http::HeaderMap;
use xxhash_rust::xxh3::Xxh3;

/// One ingredient of a limit's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    ClientIp,
    Path,
    Route,
    Method,
    Host,
    Header(HeaderName),
    Const(Box<str>),
}

impl KeyPart {
    pub fn parse(text: &str) -> Result<KeyPart, String> {
        let part = match text {
            "client_ip" => KeyPart::ClientIp,
            "path" => KeyPart::Path,
            "route" => KeyPart::Route,
            "method" => KeyPart::Method,
            "host" => KeyPart::Host,
            _ => {
                if let Some(name) = text.strip_prefix("header:") {
                    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                        format!("invalid header name {name:?} in key part {text:?}")
                    })?;
                    KeyPart::Header(name)
                } else if let Some(value) = text.strip_prefix("const:") {
                    KeyPart::Const(value.into())
                } else {
                    return Err(format!(
                        "unknown key part {text:?}: use client_ip, path, route, method, host, header:NAME or const:TEXT"
                    ));
                }
            }
        };
        Ok(part)
    }
}

/// What a request offers to key parts. Borrowed from the request, never copied.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    pub client_ip: IpAddr,
    pub method: &'a str,
    /// Lowercased, without port.
    pub host: &'a str,
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    pub route: &'a str,
}

fn feed(hasher: &mut Xxh3, facts: &RequestFacts<'_>, part: &KeyPart) {
    let mut field = |tag: u8, bytes: &[u8]| {
        hasher.update(&[tag]);
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    match part {
        KeyPart::ClientIp => match facts.client_ip {
            IpAddr::V4(v4) => field(1, &v4.octets()),
            IpAddr::V6(v6) => field(2, &v6.octets()),
        },
        KeyPart::Path => field(3, facts.path.as_bytes()),
        KeyPart::Route => field(4, facts.route.as_bytes()),
        KeyPart::Method => field(5, facts.method.as_bytes()),
        KeyPart::Host => field(6, facts.host.as_bytes()),
        KeyPart::Header(name) => match facts.headers.get(name) {
            Some(value) => field(7, value.as_bytes()),
            None => field(8, b""),
        },
        KeyPart::Const(text) => field(9, text.as_bytes()),
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0xf)]);
    }
}

/// The fixed pieces of one limit's key, built at config load.
#[derive(Debug, Clone)]
struct LimitKey {
    /// `:<limit>:`
    middle: Box<[u8]>,
    parts: Box<[KeyPart]>,
}

/// Builds the keys of every limit of one route.
#[derive(Debug, Clone)]
pub struct RouteKeys {
    /// `<prefix>:{<route>`
    head: Box<[u8]>,
    tag_parts: Box<[KeyPart]>,
    limits: Box<[LimitKey]>,
}

impl RouteKeys {
    /// `limits` pairs each limit name with its key parts. Names are checked by the config compiler.
    pub fn new(prefix: &str, route: &str, limits: &[(&str, Vec<KeyPart>)]) -> RouteKeys {
        let tag_parts: Vec<KeyPart> = match limits.split_first() {
            Some(((_, first), rest)) => first
                .iter()
                .filter(|part| rest.iter().all(|(_, parts)| parts.contains(part)))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        RouteKeys {
            head: format!("{prefix}:{{{route}").into_bytes().into(),
            tag_parts: tag_parts.into(),
            limits: limits
                .iter()
                .map(|(name, parts)| LimitKey {
                    middle: format!(":{name}:").into_bytes().into(),
                    parts: parts.clone().into(),
                })
                .collect(),
        }
    }

    /// One key per limit, in the route's order.
    pub fn build(&self, facts: &RequestFacts<'_>) -> Vec<Vec<u8>> {
        let mut tagged_head = Vec::with_capacity(self.head.len() + 18);
        tagged_head.extend_from_slice(&self.head);
        if !self.tag_parts.is_empty() {
            let mut hasher = Xxh3::new();
            for part in self.tag_parts.iter() {
                feed(&mut hasher, facts, part);
            }
            tagged_head.push(b'.');
            push_hex(&mut tagged_head, &hasher.digest().to_be_bytes());
        }
        tagged_head.push(b'}');
        self.limits
            .iter()
            .map(|limit| {
                let mut hasher = Xxh3::new();
                for part in limit.parts.iter() {
                    feed(&mut hasher, facts, part);
                }
                let mut key = Vec::with_capacity(tagged_head.len() + limit.middle.len() + 32);
                key.extend_from_slice(&tagged_head);
                key.extend_from_slice(&limit.middle);
                push_hex(&mut key, &hasher.digest128().to_be_bytes());
                key
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(ip: &str, path: &'a str, headers: &'a HeaderMap) -> RequestFacts<'a> {
        RequestFacts {
            client_ip: ip.parse().unwrap(),
            method: "GET",
            host: "example.com",
            path,
            headers,
            route: "api",
        }
    }

    fn parts(list: &[&str]) -> Vec<KeyPart> {
        list.iter().map(|p| KeyPart::parse(p).unwrap()).collect()
    }

    #[test]
    fn keys_are_readable_bounded_and_share_a_hash_tag() {
        let keys = RouteKeys::new(
            "sluice",
            "api",
            &[
                ("per_client", parts(&["client_ip", "path"])),
                ("per_ip", parts(&["client_ip"])),
            ],
        );
        let headers = HeaderMap::new();
        let hostile = format!("/{}\r\n{{}}", "a".repeat(8192));
        let built = keys.build(&facts("10.0.0.1", &hostile, &headers));
        let first = String::from_utf8(built[0].clone()).unwrap();
        assert!(first.starts_with("sluice:{api."), "{first}");
        assert!(first.contains("}:per_client:"), "{first}");
        assert_eq!(built[0].len(), "sluice:{api.}:per_client:".len() + 16 + 32);
        let tag = |k: &[u8]| k.split(|&b| b == b'}').next().unwrap().to_vec();
        assert_eq!(tag(&built[0]), tag(&built[1]));
    }

    #[test]
    fn different_parts_give_different_keys_and_same_parts_the_same() {
        let keys = RouteKeys::new("p", "r", &[("l", parts(&["client_ip", "path"]))]);
        let h = HeaderMap::new();
        let a = keys.build(&facts("10.0.0.1", "/a", &h));
        assert_eq!(a, keys.build(&facts("10.0.0.1", "/a", &h)));
        assert_ne!(a, keys.build(&facts("10.0.0.2", "/a", &h)));
        assert_ne!(a, keys.build(&facts("10.0.0.1", "/b", &h)));
    }

    #[test]
    fn limits_without_common_parts_share_the_route_tag() {
        let keys = RouteKeys::new(
            "p",
            "r",
            &[("a", parts(&["client_ip"])), ("b", parts(&["route"]))],
        );
        let h = HeaderMap::new();
        let built = keys.build(&facts("10.0.0.1", "/", &h));
        assert!(built.iter().all(|k| k.starts_with(b"p:{r}:")));
    }

    #[test]
    fn missing_and_empty_headers_differ() {
        let keys = RouteKeys::new("p", "r", &[("l", parts(&["header:x-api-key"]))]);
        let missing = HeaderMap::new();
        let mut empty = HeaderMap::new();
        empty.insert("x-api-key", "".parse().unwrap());
        assert_ne!(
            keys.build(&facts("10.0.0.1", "/", &missing)),
            keys.build(&facts("10.0.0.1", "/", &empty))
        );
    }

    #[test]
    fn unknown_key_parts_are_named() {
        assert!(KeyPart::parse("cookie")
            .unwrap_err()
            .contains("unknown key part \"cookie\""));
        assert!(KeyPart::parse("header:bad name").is_err());
    }
}
