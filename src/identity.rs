//! Who the client is: the address limits are keyed on.
//!
//! Today the client is the socket peer; IPv4-mapped IPv6 addresses count as IPv4 so one client
//! never has two identities. Forwarded headers are not trusted (no trusted proxies are configured).

use std::net::{IpAddr, Ipv4Addr};

/// The canonical form of a peer address.
pub fn client_ip(peer: Option<IpAddr>) -> IpAddr {
    match peer {
        Some(IpAddr::V6(v6)) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        Some(v4) => v4,
        None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ipv6_counts_as_ipv4() {
        let mapped: IpAddr = "::ffff:203.0.113.7".parse().unwrap();
        assert_eq!(
            client_ip(Some(mapped)),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(client_ip(Some(v6)), v6);
    }
}
