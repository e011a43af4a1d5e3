//! The client certificate a TLS listener verified (mTLS), as a request sees it: its subject's
//! common name, its subjectAltName DNS names, URIs and email addresses, and its SHA-256
//! fingerprint. Read once per connection, after the handshake verified it against the listener's
//! CA; no Pingora or rustls type here.

use x509_parser::extensions::GeneralName;

/// At most this many names of each kind are kept (a CA may sign many; the request needs few).
pub const MAX_NAMES: usize = 32;
/// A longer name is left out rather than cut (a cut name would be another name).
pub const MAX_NAME_BYTES: usize = 512;

/// What sluice read of a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientCertificate {
    /// The subject's first common name, if it has one that is text.
    pub subject_cn: Option<String>,
    /// subjectAltName `dNSName`s, as written.
    pub dns_names: Vec<String>,
    /// subjectAltName `uniformResourceIdentifier`s (e.g. SPIFFE IDs).
    pub uris: Vec<String>,
    /// subjectAltName `rfc822Name`s.
    pub emails: Vec<String>,
    /// SHA-256 of the certificate's DER, 64 lowercase hex digits.
    pub sha256: String,
}

impl ClientCertificate {
    /// Reads `der` (the leaf the handshake verified) whose SHA-256 is `sha256`. A certificate the
    /// parser cannot read still has its fingerprint; its names are then empty.
    pub fn from_der(der: &[u8], sha256: &[u8]) -> ClientCertificate {
        let mut read = ClientCertificate {
            sha256: hex(sha256),
            ..ClientCertificate::default()
        };
        let Ok((_, certificate)) = x509_parser::parse_x509_certificate(der) else {
            log::debug!("a verified client certificate could not be parsed: kept its fingerprint");
            return read;
        };
        read.subject_cn = certificate
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .filter(|cn| cn.len() <= MAX_NAME_BYTES)
            .map(str::to_string);
        if let Ok(Some(san)) = certificate.subject_alternative_name() {
            for name in &san.value.general_names {
                let (list, text) = match name {
                    GeneralName::DNSName(dns) => (&mut read.dns_names, *dns),
                    GeneralName::URI(uri) => (&mut read.uris, *uri),
                    GeneralName::RFC822Name(email) => (&mut read.emails, *email),
                    _ => continue,
                };
                if list.len() < MAX_NAMES && text.len() <= MAX_NAME_BYTES {
                    list.push(text.to_string());
                }
            }
        }
        read
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0x0f)] as char);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, Ia5String, KeyPair, SanType};

    fn certificate(cn: Option<&str>, sans: Vec<SanType>) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Example");
        params.subject_alt_names = sans;
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn ia5(text: &str) -> Ia5String {
        Ia5String::try_from(text).unwrap()
    }

    #[test]
    fn reads_the_common_name_and_every_kind_of_name() {
        let der = certificate(
            Some("billing-service"),
            vec![
                SanType::DnsName(ia5("billing.internal")),
                SanType::URI(ia5("spiffe://example.org/ns/prod/sa/billing")),
                SanType::Rfc822Name(ia5("ops@example.org")),
                SanType::DnsName(ia5("billing.example.org")),
                SanType::IpAddress("10.0.0.1".parse().unwrap()),
            ],
        );
        let read = ClientCertificate::from_der(&der, &[0xab, 0x01]);
        assert_eq!(read.subject_cn.as_deref(), Some("billing-service"));
        assert_eq!(read.dns_names, ["billing.internal", "billing.example.org"]);
        assert_eq!(read.uris, ["spiffe://example.org/ns/prod/sa/billing"]);
        assert_eq!(read.emails, ["ops@example.org"]);
        assert_eq!(read.sha256, "ab01");
    }

    #[test]
    fn a_certificate_without_a_common_name_or_names_has_none() {
        let read = ClientCertificate::from_der(&certificate(None, Vec::new()), &[]);
        assert_eq!(read.subject_cn, None);
        assert!(read.dns_names.is_empty() && read.uris.is_empty() && read.emails.is_empty());
    }

    #[test]
    fn names_are_bounded_in_number_and_length() {
        let mut sans: Vec<SanType> = (0..MAX_NAMES + 5)
            .map(|i| SanType::DnsName(ia5(&format!("host{i}.example"))))
            .collect();
        sans.insert(
            0,
            SanType::URI(ia5(&format!("urn:{}", "x".repeat(MAX_NAME_BYTES)))),
        );
        let read = ClientCertificate::from_der(&certificate(Some("c"), sans), &[]);
        assert_eq!(read.dns_names.len(), MAX_NAMES);
        assert_eq!(read.dns_names[0], "host0.example");
        assert!(
            read.uris.is_empty(),
            "an overlong name is left out, not cut"
        );
    }

    #[test]
    fn unreadable_bytes_keep_the_fingerprint_and_do_not_panic() {
        for der in [&b""[..], b"\x30\x03\x02\x01", &[0xff; 64]] {
            let read = ClientCertificate::from_der(der, &[0x00, 0xff]);
            assert_eq!(read.sha256, "00ff");
            assert_eq!(read.subject_cn, None);
        }
    }
}
