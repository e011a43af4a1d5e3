//! Who the client is: the address limits are keyed on.
//!
//! With no trusted proxies the client is the socket peer, and `X-Forwarded-For`, `Forwarded`
//! and `X-Real-IP` are ignored. When the peer is a trusted proxy, the client is found by walking
//! `X-Forwarded-For` (or, without it, the RFC 7239 `Forwarded: for=` list) from the right,
//! skipping trusted addresses: the first untrusted one is the client. A header that is repeated,
//! too long or malformed anywhere in the walk makes the peer the client: deterministic, never a
//! panic, never a guess. IPv4-mapped IPv6 counts as IPv4, and IPv6 clients are grouped by a
//! prefix (default /64) so one host cannot rotate through its subnet.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{HeaderMap, HeaderName};
use ipnet::IpNet;
use smallvec::SmallVec;

/// Longest forwarding header sluice will walk; longer ones are ignored (the peer is the client).
pub const MAX_FORWARDED_LEN: usize = 2048;
/// Most hops sluice will walk.
pub const MAX_HOPS: usize = 32;

pub const DEFAULT_IPV6_PREFIX: u8 = 64;

static FORWARDED: HeaderName = HeaderName::from_static("forwarded");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// How client addresses are derived, compiled from the config.
#[derive(Debug, Clone)]
pub struct TrustedProxies {
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
}

impl Default for TrustedProxies {
    fn default() -> Self {
        TrustedProxies {
            trusted: Vec::new(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

/// IPv4-mapped IPv6 as IPv4; everything else as is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// One `for=` node of RFC 7239 (`"[2001:db8::1]:4711"`, `192.0.2.60:80`, `unknown`, `_hidden`).
fn parse_forwarded_node(node: &str) -> Option<IpAddr> {
    let node = node.trim().trim_matches('"');
    if let Some(rest) = node.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    let host = match node.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => node,
    };
    host.parse().ok()
}

/// The `for=` nodes of every element of a `Forwarded` value, in order; `None` if any is malformed.
/// The hops of one forwarding header; ordinary chains fit inline (no heap allocation).
type Hops = SmallVec<[IpAddr; 8]>;

fn forwarded_for(value: &str) -> Option<Hops> {
    let mut nodes = Hops::new();
    for element in value.split(',') {
        let mut found = None;
        for pair in element.split(';') {
            let (name, node) = pair.split_once('=')?;
            if name.trim().eq_ignore_ascii_case("for") {
                found = Some(parse_forwarded_node(node)?);
            }
        }
        nodes.push(found?);
    }
    Some(nodes)
}

fn x_forwarded_for(value: &str) -> Option<Hops> {
    value
        .split(',')
        .map(|hop| hop.trim().parse().ok())
        .collect()
}

impl TrustedProxies {
    pub fn new(trusted: Vec<IpNet>, ipv6_prefix: u8) -> TrustedProxies {
        TrustedProxies {
            trusted,
            ipv6_prefix,
        }
    }

    /// Whether the socket peer (if known) is a trusted proxy.
    pub fn is_trusted_peer(&self, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|ip| self.is_trusted(ip))
    }

    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The address limits are keyed on: the client, grouped by the IPv6 prefix.
    pub fn client(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> IpAddr {
        let peer = peer.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), canonical);
        self.group(self.walk(peer, headers).unwrap_or(peer))
    }

    /// The address a client at `ip` is keyed on: canonical (an IPv4-mapped address is its
    /// IPv4), an IPv6 address grouped to `ipv6_prefix` (the quota admin API's `client_ip=`).
    pub fn key_address(&self, ip: IpAddr) -> IpAddr {
        self.group(canonical(ip))
    }

    /// The first untrusted hop from the right, when the peer is trusted and the chain is sound.
    fn walk(&self, peer: IpAddr, headers: &HeaderMap) -> Option<IpAddr> {
        if !self.is_trusted(peer) {
            return None;
        }
        let mut hops = match single(headers, &X_FORWARDED_FOR) {
            Some(value) => x_forwarded_for(value)?,
            None if headers.contains_key(&X_FORWARDED_FOR) => return None, // repeated or unreadable
            None => forwarded_for(single(headers, &FORWARDED)?)?,
        };
        if hops.is_empty() || hops.len() > MAX_HOPS {
            return None;
        }
        for hop in hops.iter_mut() {
            *hop = canonical(*hop);
        }
        // Every hop trusted: the leftmost is as far as the chain goes.
        Some(
            hops.iter()
                .rev()
                .copied()
                .find(|&hop| !self.is_trusted(hop))
                .unwrap_or(hops[0]),
        )
    }

    fn group(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.ipv6_prefix))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
            other => other,
        }
    }
}

/// The header's only value, if it occurs exactly once, is text and is not absurdly long.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() || value.len() > MAX_FORWARDED_LEN {
        return None;
    }
    value.to_str().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn trusting(nets: &[&str]) -> TrustedProxies {
        TrustedProxies::new(nets.iter().map(|n| n.parse().unwrap()).collect(), 64)
    }

    #[test]
    fn a_named_address_is_keyed_as_a_request_from_it_would_be() {
        let proxies = trusting(&[]);
        assert_eq!(proxies.key_address(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        assert_eq!(proxies.key_address(ip("2001:db8::1:2")), ip("2001:db8::"));
        let peer = Some(ip("2001:db8::1:2"));
        let from_request = proxies.client(peer, &HeaderMap::new());
        assert_eq!(proxies.key_address(ip("2001:db8::1:2")), from_request);
    }

    #[test]
    fn without_trusted_proxies_forwarding_headers_are_ignored() {
        let identity = TrustedProxies::default();
        let spoofed = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-real-ip", "7.7.7.7"),
            ("forwarded", "for=8.8.8.8"),
        ]);
        assert_eq!(
            identity.client(Some(ip("198.51.100.1")), &spoofed),
            ip("198.51.100.1")
        );
    }

    #[test]
    fn a_trusted_chain_is_walked_from_the_right() {
        let identity = trusting(&["10.0.0.0/8"]);
        let chain = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.1.1")]);
        assert_eq!(
            identity.client(Some(ip("10.0.0.2")), &chain),
            ip("203.0.113.7")
        );
        // An untrusted peer's claims are ignored.
        assert_eq!(
            identity.client(Some(ip("198.51.100.1")), &chain),
            ip("198.51.100.1")
        );
        // All hops trusted: the leftmost.
        let inside = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
        assert_eq!(
            identity.client(Some(ip("10.0.0.2")), &inside),
            ip("10.9.9.9")
        );
    }

    #[test]
    fn rfc_7239_forwarded_is_used_without_x_forwarded_for() {
        let identity = trusting(&["10.0.0.0/8"]);
        let forwarded = headers(&[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8::7]:4711\";proto=https, for=10.1.1.1:80",
        )]);
        assert_eq!(
            identity.client(Some(ip("10.0.0.2")), &forwarded),
            ip("2001:db8::")
        );
    }

    #[test]
    fn malformed_repeated_or_long_headers_fall_back_to_the_peer() {
        let identity = trusting(&["10.0.0.0/8"]);
        let peer = Some(ip("10.0.0.2"));
        for bad in [
            headers(&[("x-forwarded-for", "6.6.6.6, not-an-ip")]),
            headers(&[
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-for", "7.7.7.7"),
            ]),
            headers(&[("x-forwarded-for", &"1.2.3.4,".repeat(600))]),
            headers(&[("x-forwarded-for", "")]),
            headers(&[("forwarded", "for=unknown")]),
            headers(&[("forwarded", "proto=https")]),
        ] {
            assert_eq!(identity.client(peer, &bad), ip("10.0.0.2"), "{bad:?}");
        }
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix_and_mapped_ipv4_is_ipv4() {
        let identity = TrustedProxies::default();
        let none = HeaderMap::new();
        assert_eq!(
            identity.client(Some(ip("2001:db8:1:2:aaaa::1")), &none),
            ip("2001:db8:1:2::")
        );
        assert_eq!(
            identity.client(Some(ip("::ffff:203.0.113.7")), &none),
            ip("203.0.113.7")
        );
        let exact = TrustedProxies::new(Vec::new(), 128);
        assert_eq!(
            exact.client(Some(ip("2001:db8::1")), &none),
            ip("2001:db8::1")
        );
        assert!(trusting(&["::ffff:0:0/96"]).trusted.len() == 1);
    }
}
