//! PEM files named by the configuration: a certificate chain and its private key (a listener's
//! certificate, an upstream client certificate).

use std::path::PathBuf;

/// A certificate chain and its private key, in PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}
