//! `listen:`: where the proxy accepts connections. An entry is an address (`0.0.0.0:8080`,
//! plain HTTP/1.1) or a table: `{ addr, tls: { certificates: [{ cert, key }...], http2,
//! client_auth: { mode, ca } }, h2c }`. A TLS listener speaks HTTP/2 by ALPN unless
//! `http2: false`; `client_auth` asks clients for a certificate signed by `ca` (mTLS); `h2c:
//! true` makes a plain listener accept HTTP/2 with prior knowledge too. Certificate and CA files
//! are read by the glue (`tls.rs`), at start and at every reload.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::choice::chosen;
use super::choice::ClientAuthMode;
use super::problem::Problems;
use super::raw::{RawClientAuth, RawListener, RawListenerTable};
pub use crate::route::upstream::CertificateFiles;

/// One proxy listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub addr: SocketAddr,
    pub tls: Option<ListenerTls>,
    /// Cleartext HTTP/2 with prior knowledge (besides HTTP/1.1) on a plain listener.
    pub h2c: bool,
}

/// A TLS listener's certificates and protocols.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// Chosen by SNI from each certificate's own names; the first is the default.
    pub certificates: Vec<CertificateFiles>,
    /// Offer HTTP/2 by ALPN (with HTTP/1.1 as the fallback).
    pub http2: bool,
    /// Client certificates (mTLS): none asked for when absent.
    pub client_auth: Option<ClientAuth>,
}

/// `tls.client_auth`: clients are asked for a certificate that chains to `ca`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAuth {
    pub mode: ClientAuthMode,
    /// PEM file of the certificate authorities a client certificate must chain to.
    pub ca: PathBuf,
}

impl Listener {
    /// What a reload cannot change: the address and how it speaks (not its certificates).
    pub fn shape(&self) -> (SocketAddr, bool, bool, bool) {
        let http2 = self.tls.as_ref().is_some_and(|tls| tls.http2);
        (self.addr, self.tls.is_some(), http2, self.h2c)
    }
}

pub fn socket_addr(text: &str, at: &str, p: &mut Problems) -> Option<SocketAddr> {
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            p.add(
                at,
                format!("invalid address {text:?}: expected IP:PORT, e.g. 127.0.0.1:8080"),
            );
            None
        }
    }
}

/// `listen:`; at least one address is `required` (unless the gateway only serves Envoy's rate
/// limit service).
pub fn compile(raw: Vec<RawListener>, required: bool, p: &mut Problems) -> Vec<Listener> {
    if raw.is_empty() && required {
        p.add(
            "listen",
            "at least one listen address is required, e.g. [0.0.0.0:8080] (a gateway that only serves Envoy's rate limit service sets rls: instead)",
        );
    }
    let mut listeners: Vec<Listener> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let at = format!("listen[{i}]");
        let listener = match raw {
            RawListener::Address(text) => socket_addr(&text, &at, p).map(|addr| Listener {
                addr,
                tls: None,
                h2c: false,
            }),
            RawListener::Table(table) => compile_table(table, &at, p),
        };
        let Some(listener) = listener else { continue };
        if listeners.iter().any(|l| l.addr == listener.addr) {
            p.add(at, format!("{} is listed twice", listener.addr));
            continue;
        }
        listeners.push(listener);
    }
    listeners
}

fn compile_table(raw: RawListenerTable, at: &str, p: &mut Problems) -> Option<Listener> {
    let addr = match raw.addr {
        Some(text) => socket_addr(&text, &format!("{at}.addr"), p),
        None => {
            p.add(format!("{at}.addr"), "required, e.g. 0.0.0.0:8443");
            None
        }
    };
    let h2c = raw.h2c.unwrap_or(false);
    let tls = raw.tls.map(|tls| {
        if tls.certificates.is_empty() {
            p.add(
                format!("{at}.tls.certificates"),
                "at least one { cert: FILE, key: FILE } is required",
            );
        }
        let certificates = tls
            .certificates
            .into_iter()
            .enumerate()
            .filter_map(|(j, pair)| {
                let here = format!("{at}.tls.certificates[{j}]");
                match (pair.cert, pair.key) {
                    (Some(cert), Some(key)) => Some(CertificateFiles {
                        cert: super::paths::absolute(cert),
                        key: super::paths::absolute(key),
                    }),
                    (cert, _) => {
                        let missing = if cert.is_none() { "cert" } else { "key" };
                        p.add(format!("{here}.{missing}"), "required: a PEM file");
                        None
                    }
                }
            })
            .collect();
        ListenerTls {
            certificates,
            http2: tls.http2.unwrap_or(true),
            client_auth: tls
                .client_auth
                .and_then(|raw| client_auth(raw, &format!("{at}.tls.client_auth"), p)),
        }
    });
    if h2c && tls.is_some() {
        p.add(
            format!("{at}.h2c"),
            "applies to plain listeners only (a TLS listener negotiates HTTP/2 by ALPN: tls.http2)",
        );
    }
    Some(Listener {
        addr: addr?,
        tls,
        h2c,
    })
}

/// `tls.client_auth`: `mode` (`require` unless `request`) and `ca` (required).
fn client_auth(raw: RawClientAuth, at: &str, p: &mut Problems) -> Option<ClientAuth> {
    let mode = chosen(
        raw.mode.as_ref(),
        ClientAuthMode::Require,
        &format!("{at}.mode"),
        p,
    );
    let ca = match raw.ca {
        Some(ca) => Some(super::paths::absolute(ca)),
        None => {
            p.add(
                format!("{at}.ca"),
                "required: a PEM file of the certificate authorities client certificates must chain to",
            );
            None
        }
    };
    Some(ClientAuth {
        mode: mode?,
        ca: ca?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn listeners(yaml: &str) -> (Vec<Listener>, Vec<String>) {
        problems_of(yaml, |raw, p: &mut Problems| compile(raw, true, p))
    }

    #[test]
    fn an_address_or_a_table_with_tls_or_h2c() {
        let (compiled, problems) = listeners(
            "- 0.0.0.0:8080\n- addr: 0.0.0.0:8443\n  tls:\n    certificates:\n      - { cert: /a.pem, key: /a.key }\n- { addr: 127.0.0.1:8081, h2c: true }\n",
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(compiled.len(), 3);
        assert_eq!(compiled[0].tls, None);
        let tls = compiled[1].tls.as_ref().unwrap();
        assert!(tls.http2, "HTTP/2 by ALPN is on by default");
        assert_eq!(tls.certificates[0].cert, std::path::PathBuf::from("/a.pem"));
        assert!(compiled[2].h2c);
        assert_eq!(
            tls.client_auth, None,
            "no client certificate is asked for by default"
        );
    }

    #[test]
    fn client_auth_takes_a_mode_and_a_ca() {
        let tls = |client_auth: &str| {
            format!("- addr: 0.0.0.0:8443\n  tls:\n    certificates: [{{ cert: /a.pem, key: /a.key }}]\n    client_auth: {client_auth}\n")
        };
        let (compiled, problems) = listeners(&tls("{ mode: request, ca: /ca.pem }"));
        assert!(problems.is_empty(), "{problems:?}");
        let auth = compiled[0].tls.as_ref().unwrap().client_auth.clone();
        assert_eq!(
            auth,
            Some(ClientAuth {
                mode: ClientAuthMode::Request,
                ca: PathBuf::from("/ca.pem"),
            })
        );
        let (compiled, _) = listeners(&tls("{ ca: /ca.pem }"));
        let auth = compiled[0].tls.as_ref().unwrap().client_auth.as_ref();
        assert_eq!(auth.map(|a| a.mode), Some(ClientAuthMode::Require));
    }

    #[test]
    fn client_auth_names_its_mistakes() {
        let (_, problems) = listeners(
            "- { addr: 0.0.0.0:1, tls: { certificates: [{ cert: /a, key: /b }], client_auth: { mode: optional } } }\n",
        );
        assert_eq!(
            problems,
            [
                "listen[0].tls.client_auth.mode: unknown mode \"optional\": use request or require",
                "listen[0].tls.client_auth.ca: required: a PEM file of the certificate authorities client certificates must chain to",
            ]
        );
    }

    #[test]
    fn tables_name_their_mistakes() {
        let (_, problems) = listeners(
            "- { tls: { certificates: [] } }\n- { addr: 0.0.0.0:1, h2c: true, tls: { certificates: [{ cert: /a }] } }\n- 0.0.0.0:2\n- 0.0.0.0:2\n",
        );
        assert_eq!(
            problems,
            [
                "listen[0].addr: required, e.g. 0.0.0.0:8443",
                "listen[0].tls.certificates: at least one { cert: FILE, key: FILE } is required",
                "listen[1].tls.certificates[0].key: required: a PEM file",
                "listen[1].h2c: applies to plain listeners only (a TLS listener negotiates HTTP/2 by ALPN: tls.http2)",
                "listen[3]: 0.0.0.0:2 is listed twice",
            ]
        );
    }
}
