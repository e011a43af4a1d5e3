//! Address lists: a client whose address is in a `deny` range is refused (`403`) before any
//! limit is asked; one in an `allow` range is exempt from the limits — still proxied, counted as
//! `exempt`. Ranges are CIDRs, IPv4 and IPv6, matched against the resolved client address (the
//! first untrusted hop behind `trusted_proxies`), gateway-wide and per route. Each list is a
//! prefix trie: a lookup costs about the same for ten prefixes as for ten thousand.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use prefix_trie::PrefixSet;

use crate::caller::address::canonical;

/// A set of address ranges.
#[derive(Debug, Default, Clone)]
pub struct Ranges {
    v4: PrefixSet<Ipv4Net>,
    v6: PrefixSet<Ipv6Net>,
}

impl Ranges {
    /// Adds `net` (host bits cleared; an IPv4-mapped IPv6 range as its IPv4 range, as
    /// clients' addresses are looked up).
    pub fn insert(&mut self, net: IpNet) {
        match net.trunc() {
            IpNet::V4(net) => self.v4.insert(net),
            IpNet::V6(net) => match (net.addr().to_ipv4_mapped(), net.prefix_len()) {
                (Some(v4), len @ 96..) => self.v4.insert(Ipv4Net::new_assert(v4, len - 96)),
                _ => self.v6.insert(net),
            },
        };
    }

    /// Whether a range holds `ip` (an IPv4-mapped IPv6 address as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match canonical(ip) {
            IpAddr::V4(ip) => !self.v4.is_empty() && self.v4.is_covered(&Ipv4Net::from(ip)),
            IpAddr::V6(ip) => !self.v6.is_empty() && self.v6.is_covered(&Ipv6Net::from(ip)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }
}

impl FromIterator<IpNet> for Ranges {
    fn from_iter<I: IntoIterator<Item = IpNet>>(nets: I) -> Ranges {
        let mut ranges = Ranges::default();
        nets.into_iter().for_each(|net| ranges.insert(net));
        ranges
    }
}

/// The `allow` and `deny` lists of the gateway, or of one route.
#[derive(Debug, Default, Clone)]
pub struct AddressLists {
    pub allow: Ranges,
    pub deny: Ranges,
}

/// Where a client stands with a route (an explanation shows it in lowercase: `denied`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Standing {
    /// In a `deny` range: refused before any limit.
    Denied,
    /// In an `allow` range (and no `deny` one): proxied without asking the limits.
    Exempt,
    /// Neither: the route's limits decide.
    Limited,
}

impl Standing {
    /// Its name, as an explanation shows it.
    pub fn label(self) -> &'static str {
        match self {
            Standing::Denied => "denied",
            Standing::Exempt => "exempt",
            Standing::Limited => "limited",
        }
    }
}

impl AddressLists {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Where `client` stands under the gateway's lists and the route's: `deny` in either wins
    /// over `allow` in either.
    pub fn standing(gateway: &AddressLists, route: &AddressLists, client: IpAddr) -> Standing {
        if gateway.deny.contains(client) || route.deny.contains(client) {
            Standing::Denied
        } else if gateway.allow.contains(client) || route.allow.contains(client) {
            Standing::Exempt
        } else {
            Standing::Limited
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(nets: &[&str]) -> Ranges {
        nets.iter().map(|n| n.parse::<IpNet>().unwrap()).collect()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ranges_hold_their_addresses_in_both_families() {
        let set = ranges(&[
            "10.0.0.0/8",
            "192.0.2.7/32",
            "2001:db8::/32",
            "198.51.100.9/24",
            "::ffff:203.0.113.0/120",
        ]);
        for inside in [
            "10.1.2.3",
            "192.0.2.7",
            "2001:db8::1",
            "::ffff:10.9.9.9",
            "198.51.100.1",
            "203.0.113.9",
        ] {
            assert!(set.contains(ip(inside)), "{inside}");
        }
        for outside in ["11.0.0.1", "192.0.2.8", "2001:db9::1", "::1"] {
            assert!(!set.contains(ip(outside)), "{outside}");
        }
        assert_eq!(set.len(), 5);
        assert!(!Ranges::default().contains(ip("10.0.0.1")));
    }

    #[test]
    fn deny_wins_over_allow_and_gateway_lists_join_the_routes() {
        let gateway = AddressLists {
            allow: ranges(&["10.0.0.0/8"]),
            deny: ranges(&["10.66.0.0/16"]),
        };
        let route = AddressLists {
            allow: ranges(&["192.0.2.0/24"]),
            deny: ranges(&["10.1.0.0/16"]),
        };
        let standing = |client| AddressLists::standing(&gateway, &route, ip(client));
        assert_eq!(standing("10.2.3.4"), Standing::Exempt);
        assert_eq!(standing("192.0.2.1"), Standing::Exempt);
        assert_eq!(standing("10.66.1.1"), Standing::Denied);
        assert_eq!(standing("10.1.1.1"), Standing::Denied);
        assert_eq!(standing("203.0.113.1"), Standing::Limited);
    }
}
