//! Certificates made by the tests themselves (never committed keys): a throwaway CA and the
//! leaf certificates it signs, written as PEM files into a temp dir.

use std::net::IpAddr;
use std::path::PathBuf;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
    SanType,
};

pub struct TestCa {
    certificate: Certificate,
    key: KeyPair,
    pub dir: tempfile::TempDir,
    /// The CA certificate, PEM.
    pub ca: PathBuf,
}

/// A leaf certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn named(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// The calendar date `days` from now (year, month, day), for `not_after`.
fn days_from_now(days: i64) -> (i32, u8, u8) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = now.div_euclid(86_400) + days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = named("sluice test CA");
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, certificate.pem()).unwrap();
        TestCa {
            certificate,
            key,
            dir,
            ca,
        }
    }

    /// An intermediate CA signed by this one (in the same temp dir): its `ca` file is its own
    /// certificate, which leaves it issues must be presented with.
    pub fn intermediate(&self, file: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = named(&format!("sluice test intermediate {file}"));
        let key = KeyPair::generate().unwrap();
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .unwrap();
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = dir.path().join(format!("{file}.pem"));
        std::fs::write(&ca, certificate.pem()).unwrap();
        TestCa {
            certificate,
            key,
            dir,
            ca,
        }
    }

    /// A certificate for these DNS names (and IP addresses), valid for a year; `file` names it.
    pub fn issue(&self, file: &str, names: &[&str], ips: &[IpAddr]) -> Issued {
        self.issue_for(file, names, ips, 365)
    }

    /// The same, valid for `days` from now.
    pub fn issue_for(&self, file: &str, names: &[&str], ips: &[IpAddr], days: i64) -> Issued {
        self.issue_with(file, names, |params| {
            params
                .subject_alt_names
                .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
            let (year, month, day) = days_from_now(days);
            params.not_after = rcgen::date_time_ymd(year, month, day);
        })
    }

    /// A certificate for these DNS names (the first its common name), valid for a year, with
    /// `edit` applied to its parameters before signing.
    pub fn issue_with(
        &self,
        file: &str,
        names: &[&str],
        edit: impl FnOnce(&mut CertificateParams),
    ) -> Issued {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = named(names.first().copied().unwrap_or("sluice test"));
        let (year, month, day) = days_from_now(365);
        params.not_after = rcgen::date_time_ymd(year, month, day);
        edit(&mut params);
        let key = KeyPair::generate().unwrap();
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .unwrap();
        let cert = self.dir.path().join(format!("{file}.pem"));
        let key_file = self.dir.path().join(format!("{file}.key"));
        std::fs::write(&cert, certificate.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        Issued {
            cert,
            key: key_file,
        }
    }
}
