//! `addresses:`, gateway-wide and per route: the `allow` and `deny` lists of addresses and
//! CIDRs (IPv4 and IPv6), compiled into prefix tries; each malformed entry is reported with its
//! path, all at once.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use super::problem::Problems;
use crate::caller::address_lists::{AddressLists, Ranges};

/// `addresses:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAddresses {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// An address (`192.0.2.7`, a single host) or a CIDR (`10.0.0.0/8`; host bits cleared).
pub fn address_or_cidr(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .ok()
        .map(|net| net.trunc())
}

/// The lists at `at` (`addresses`, or `routes[i].addresses`).
pub fn compile(at: &str, raw: Option<RawAddresses>, p: &mut Problems) -> AddressLists {
    let raw = raw.unwrap_or_default();
    AddressLists {
        allow: ranges(&format!("{at}.allow"), &raw.allow, p),
        deny: ranges(&format!("{at}.deny"), &raw.deny, p),
    }
}

fn ranges(at: &str, entries: &[String], p: &mut Problems) -> Ranges {
    entries
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let net = address_or_cidr(text);
            if net.is_none() {
                p.add(
                    format!("{at}[{i}]"),
                    format!(
                        "{text:?} is not an address or a CIDR such as 10.0.0.0/8 or 2001:db8::/32"
                    ),
                );
            }
            net
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    #[test]
    fn lists_hold_addresses_and_cidrs_and_name_every_bad_entry() {
        let (lists, problems) = problems_of(
            "allow: [10.0.0.0/8, 192.0.2.7, \"2001:db8::/32\"]\ndeny: [10.1.0.0/16, nope, 10.0.0.0/40]\n",
            |raw: RawAddresses, p: &mut Problems| compile("addresses", Some(raw), p),
        );
        assert_eq!(
            problems,
            [
                "addresses.deny[1]: \"nope\" is not an address or a CIDR such as 10.0.0.0/8 or 2001:db8::/32",
                "addresses.deny[2]: \"10.0.0.0/40\" is not an address or a CIDR such as 10.0.0.0/8 or 2001:db8::/32",
            ]
        );
        assert_eq!((lists.allow.len(), lists.deny.len()), (3, 1));
        assert!(lists.allow.contains("192.0.2.7".parse().unwrap()));
    }
}
