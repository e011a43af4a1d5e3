//! What an HTTPS upstream needs, loaded once per configuration with its pool: the CA it is
//! verified against, the client certificate sluice presents, the SNI, and a reuse group that
//! keeps connections verified against different CAs apart.

use std::path::Path;
use std::sync::Arc;

use pingora::utils::tls::{CertKey, WrappedX509};

use crate::config::Sources;
use crate::route::upstream::UpstreamTls;

/// What an HTTPS upstream needs per connection, loaded once per configuration.
#[derive(Clone)]
pub struct PeerTls {
    pub sni: String,
    pub verify: bool,
    pub ca: Option<Arc<[WrappedX509]>>,
    pub client: Option<Arc<CertKey>>,
    /// Pingora's connection reuse key leaves the CA out: connections verified against one CA
    /// are pooled apart from those verified against another (`HttpPeer::group_key`).
    pub reuse_group: u64,
}

pub(crate) fn read_pem_certificates(
    path: &Path,
    read: &mut Sources,
) -> Result<Vec<Vec<u8>>, String> {
    let pem = read
        .read(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut reader = std::io::BufReader::new(pem.as_slice());
    let mut out = Vec::new();
    for item in rustls_pemfile::certs(&mut reader) {
        let der = item.map_err(|e| format!("{}: {e}", path.display()))?;
        // Checked here: Pingora parses it again later and panics on bad DER.
        x509_parser::parse_x509_certificate(&der)
            .map_err(|e| format!("{}: not an X.509 certificate: {e}", path.display()))?;
        out.push(der.to_vec());
    }
    if out.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(out)
}

impl PeerTls {
    pub fn load(tls: &UpstreamTls, read: &mut Sources) -> Result<PeerTls, String> {
        let mut ca_digest = xxhash_rust::xxh3::Xxh3::new();
        let ca = match &tls.ca {
            Some(path) => {
                let mut certificates = Vec::new();
                for der in read_pem_certificates(path, read)? {
                    ca_digest.update(&der);
                    certificates.push(WrappedX509::new(der, pingora::utils::tls::parse_x509));
                }
                Some(Arc::from(certificates.into_boxed_slice()))
            }
            None => None,
        };
        let client = match &tls.client {
            Some(files) => {
                let chain = read_pem_certificates(&files.cert, read)?;
                // Read through `sources`, as the certificate is: `watch` follows the key too.
                let key = read
                    .read(&files.key)
                    .map_err(|e| format!("cannot read {}: {e}", files.key.display()))?;
                let key = rustls_pemfile::private_key(&mut key.as_slice())
                    .map_err(|e| format!("{}: {e}", files.key.display()))?
                    .ok_or_else(|| format!("no private key in {}", files.key.display()))?;
                Some(Arc::new(CertKey::new(chain, key.secret_der().to_vec())))
            }
            None => None,
        };
        Ok(PeerTls {
            sni: tls.sni.clone(),
            verify: tls.verify,
            ca,
            client,
            reuse_group: if tls.ca.is_some() {
                ca_digest.digest()
            } else {
                0
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::upstream::CertificateFiles;

    #[test]
    fn what_an_upstream_is_reached_with_is_read_as_watch_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["client.test".to_string()]).unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let files = CertificateFiles {
            cert: dir.path().join("client.pem"),
            key: dir.path().join("client.key"),
        };
        std::fs::write(&files.cert, certificate.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        let tls = UpstreamTls {
            sni: "backend.test".into(),
            verify: true,
            ca: Some(files.cert.clone()),
            client: Some(files.clone()),
        };
        let mut read = Sources::default();
        let loaded = PeerTls::load(&tls, &mut read).expect("loads");
        assert!(loaded.client.is_some() && loaded.ca.is_some());
        assert!(read.contains(&files.cert), "the certificate and CA");
        assert!(read.contains(&files.key), "the client key");

        std::fs::write(&files.key, "not a key").unwrap();
        let refused = PeerTls::load(&tls, &mut read).err().expect("refused");
        assert!(refused.contains("no private key in"), "{refused}");
    }
}
