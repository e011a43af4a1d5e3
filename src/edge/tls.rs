//! TLS on rustls: the certificates a listener serves (HTTPS upstreams: `upstream/tls.rs`).
//!
//! A TLS listener chooses its certificate by SNI among its certificates' own names (their
//! subjectAltName DNS names, else their common name; exact names first, then `*.` wildcards);
//! the first certificate answers a client that sends no name, or one none of them holds.
//! Certificates are loaded and checked (each key must match its certificate) at start, by
//! `sluice -t`, and at every reload; a reload swaps them in place, so no connection is dropped,
//! and a bad file fails the reload and keeps the running set. TLS 1.2 and 1.3 only (Pingora's
//! rustls acceptor offers nothing older).

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::TlsAccept;
use pingora::protocols::tls::TlsRef;
use pingora::tls::sign::CertifiedKey;
use pingora::tls::{
    CertificateDer, ClientCertVerified, ClientCertVerifier, ClientHello, CryptoProvider,
    DigitallySignedStruct, HandshakeSignatureValid, ResolvesServerCert, RootCertStore,
    SignatureScheme, UnixTime, WebPkiClientVerifier,
};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::DistinguishedName;

use crate::caller::client_cert::ClientCertificate;
use crate::config::choice::ClientAuthMode;
use crate::config::listeners::{CertificateFiles, ClientAuth, Listener};
use crate::config::{Config, ConfigError, Problem, Sources};
use crate::runtime::reload::ListenerCertificates;
use crate::upstream::tls::read_pem_certificates;

/// `sluice -t` warns about certificates that expire sooner than this.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// One loaded certificate: its chain and key, the names it answers, when it expires.
struct Loaded {
    key: Arc<CertifiedKey>,
    names: Vec<String>,
    not_after: i64,
    file: PathBuf,
}

/// The certificates of one listener, indexed by the names they answer.
pub struct CertificateSet {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` as `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
    loaded: Vec<Loaded>,
}

fn crypto_provider() -> Result<Arc<CryptoProvider>, String> {
    pingora::tls::install_default_crypto_provider();
    CryptoProvider::get_default()
        .cloned()
        .ok_or_else(|| "no TLS crypto provider is installed".to_string())
}

/// The DNS names a certificate answers, and when it expires (Unix seconds).
fn names_and_expiry(der: &[u8]) -> Result<(Vec<String>, i64), String> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let mut names: Vec<String> = match certificate.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    Some(dns.to_ascii_lowercase())
                }
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    if names.is_empty() {
        names.extend(
            certificate
                .subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    Ok((names, certificate.validity().not_after.timestamp()))
}

/// Why a file could not be opened, in words (no error codes).
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => {
            "permission denied (the user sluice runs as must be able to read it)".to_string()
        }
        _ => e.to_string(),
    }
}

fn load_one(files: &CertificateFiles, read: &mut Sources) -> Result<Loaded, String> {
    let (cert, key) = (files.cert.display(), files.key.display());
    // Read once, through `sources` (`watch: true` follows certificate files), and parsed from
    // those bytes: what is noted is what serves.
    let chain_pem = read
        .read(&files.cert)
        .map_err(|e| format!("cannot read the certificate file {cert}: {}", io_reason(&e)))?;
    let key_pem = read
        .read(&files.key)
        .map_err(|e| format!("cannot read the private key file {key}: {}", io_reason(&e)))?;
    let chain = rustls_pemfile::certs(&mut chain_pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| format!("{cert} is not PEM: expected a PEM certificate chain"))?;
    let private = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|_| format!("{key} is not PEM: expected a PEM private key"))?
        .ok_or_else(|| format!("no private key in {key}"))?;
    let first = chain
        .first()
        .ok_or_else(|| format!("no certificate in {cert}"))?;
    let (names, not_after) = names_and_expiry(first).map_err(|e| format!("{cert}: {e}"))?;
    let signing = crypto_provider()?
        .key_provider
        .load_private_key(private)
        .map_err(|e| format!("{key}: unusable private key: {e}"))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|_| format!("the key in {key} does not match the certificate in {cert}"))?;
    Ok(Loaded {
        key: Arc::new(certified),
        names,
        not_after,
        file: files.cert.clone(),
    })
}

impl CertificateSet {
    /// Loads every certificate of a listener (`at` names it in problems).
    pub fn load(
        at: &str,
        files: &[CertificateFiles],
        read: &mut Sources,
    ) -> Result<CertificateSet, Vec<Problem>> {
        let mut problems = Vec::new();
        let mut loaded = Vec::new();
        for (i, pair) in files.iter().enumerate() {
            match load_one(pair, read) {
                Ok(one) => loaded.push(one),
                Err(reason) => {
                    problems.push(Problem::new(format!("{at}.tls.certificates[{i}]"), reason))
                }
            }
        }
        let Some(first) = loaded.first() else {
            if problems.is_empty() {
                problems.push(Problem::new(
                    format!("{at}.tls.certificates"),
                    "no certificate",
                ));
            }
            return Err(problems);
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let default = Arc::clone(&first.key);
        let (mut exact, mut wildcard) = (HashMap::new(), HashMap::new());
        for one in &loaded {
            for name in &one.names {
                // The first certificate naming a host wins.
                match name.strip_prefix("*.") {
                    Some(suffix) => wildcard
                        .entry(suffix.to_string())
                        .or_insert_with(|| Arc::clone(&one.key)),
                    None => exact
                        .entry(name.clone())
                        .or_insert_with(|| Arc::clone(&one.key)),
                };
            }
        }
        Ok(CertificateSet {
            exact,
            wildcard,
            default,
            loaded,
        })
    }

    /// The certificate for `server_name` (SNI), or the default.
    pub fn choose(&self, server_name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = server_name.map(|n| n.trim_end_matches('.').to_ascii_lowercase()) else {
            return Arc::clone(&self.default);
        };
        if let Some(key) = self.exact.get(&name) {
            return Arc::clone(key);
        }
        name.split_once('.')
            .and_then(|(_, parent)| self.wildcard.get(parent))
            .map_or_else(|| Arc::clone(&self.default), Arc::clone)
    }

    /// Warnings for certificates that expire within `window` of now (or have expired).
    pub fn expiring(&self, window: Duration) -> Vec<String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.loaded
            .iter()
            .filter(|one| one.not_after - now < window.as_secs() as i64)
            .map(|one| {
                let days = (one.not_after - now) as f64 / 86_400.0;
                if days < 0.0 {
                    format!("{} has expired ({:.0} days ago)", one.file.display(), -days)
                } else {
                    format!("{} expires in {days:.1} days", one.file.display())
                }
            })
            .collect()
    }
}

/// A listener's certificate choice, swappable while it serves.
pub struct SniResolver {
    set: ArcSwap<CertificateSet>,
}

impl fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SniResolver").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.set.load().choose(hello.server_name()))
    }
}

/// What a listener asks of client certificates.
pub enum ClientCheck {
    /// Nothing: no certificate is asked for.
    Off,
    /// A certificate is asked for and checked by `verifier`; `mandatory`: no certificate, no
    /// connection.
    Ask {
        mandatory: bool,
        verifier: Arc<dyn ClientCertVerifier>,
    },
}

/// Loads a listener's client CA (`at` names the listener in problems).
fn client_check(
    at: &str,
    auth: Option<&ClientAuth>,
    read: &mut Sources,
) -> Result<ClientCheck, Problem> {
    let Some(auth) = auth else {
        return Ok(ClientCheck::Off);
    };
    let problem = |reason: String| Problem::new(format!("{at}.tls.client_auth.ca"), reason);
    let mut roots = RootCertStore::empty();
    for der in read_pem_certificates(&auth.ca, read).map_err(problem)? {
        roots.add(CertificateDer::from(der)).map_err(|e| {
            problem(format!(
                "{}: not usable as a certificate authority: {e}",
                auth.ca.display()
            ))
        })?;
    }
    // Verified if presented; whether one must be is the policy's (`ClientVerifier`).
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        crypto_provider().map_err(problem)?,
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| problem(format!("{}: {e}", auth.ca.display())))?;
    Ok(ClientCheck::Ask {
        mandatory: auth.mode == ClientAuthMode::Require,
        verifier,
    })
}

/// A listener's client certificate verifier, swappable while it serves: every TLS listener has
/// one (`Off` asks for nothing), so a reload may add, change or remove `client_auth`.
pub struct ClientVerifier {
    policy: ArcSwap<ClientCheck>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientVerifier").finish_non_exhaustive()
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        matches!(**self.policy.load(), ClientCheck::Ask { .. })
    }

    fn client_auth_mandatory(&self) -> bool {
        matches!(
            **self.policy.load(),
            ClientCheck::Ask {
                mandatory: true,
                ..
            }
        )
    }

    /// No CA names are hinted: the policy is swapped on reload, and rustls borrows the hints
    /// from the verifier for the handshake. Clients send the certificate they are given.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match &**self.policy.load() {
            ClientCheck::Ask { verifier, .. } => {
                verifier.verify_client_cert(end_entity, intermediates, now)
            }
            ClientCheck::Off => Err(rustls::Error::General(
                "this listener asks for no client certificate".to_string(),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Reads the verified client certificate once, when the handshake completes; Pingora keeps
/// it in the connection's `SslDigest` extension, where every request of the connection finds it
/// (`client_certificate`).
struct KeepClientCertificate;

#[async_trait]
impl TlsAccept for KeepClientCertificate {
    async fn handshake_complete_callback(
        &self,
        tls: &TlsRef,
    ) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        // rustls keeps a client's certificates only once the verifier has accepted them.
        let der = tls.peer_certificate_der()?;
        let sha256 = pingora::tls::hash_certificate(&CertificateDer::from(der));
        Some(Arc::new(ClientCertificate::from_der(der, &sha256)))
    }
}

/// The verified client certificate of the connection whose TLS digest is `digest`.
pub fn client_certificate(
    digest: Option<&pingora::protocols::Digest>,
) -> Option<&ClientCertificate> {
    digest?.ssl_digest.as_ref()?.extension.get()
}

/// What a TLS listener serves and asks, loaded from the configuration.
pub struct ListenerTlsState {
    certificates: CertificateSet,
    clients: ClientCheck,
}

/// One TLS listener of this process: its resolver and verifier outlive reloads.
struct Served {
    addr: SocketAddr,
    resolver: Arc<SniResolver>,
    clients: Arc<ClientVerifier>,
}

/// The TLS listeners of this process, by address.
pub struct TlsListeners {
    served: Vec<Served>,
}

/// Loads the certificates and client CAs of every TLS listener of `config`.
fn load_all(
    config: &Config,
    read: &mut Sources,
) -> Result<Vec<(SocketAddr, ListenerTlsState)>, ConfigError> {
    let mut problems = Vec::new();
    let mut loaded = Vec::new();
    for (i, listener) in config.listen.iter().enumerate() {
        let Some(tls) = &listener.tls else { continue };
        let at = format!("listen[{i}]");
        let certificates = CertificateSet::load(&at, &tls.certificates, read);
        let clients = client_check(&at, tls.client_auth.as_ref(), read);
        match (certificates, clients) {
            (Ok(certificates), Ok(clients)) => loaded.push((
                listener.addr,
                ListenerTlsState {
                    certificates,
                    clients,
                },
            )),
            (certificates, clients) => {
                problems.extend(certificates.err().into_iter().flatten());
                problems.extend(clients.err());
            }
        }
    }
    if problems.is_empty() {
        Ok(loaded)
    } else {
        Err(ConfigError {
            file: config.source.clone(),
            problems,
        })
    }
}

/// What `sluice -t` says of the certificates: problems, and warnings about expiry.
pub fn check(config: &Config, read: &mut Sources) -> Result<Vec<String>, ConfigError> {
    Ok(load_all(config, read)?
        .iter()
        .flat_map(|(_, state)| state.certificates.expiring(EXPIRY_WARNING))
        .collect())
}

impl TlsListeners {
    /// Loads the certificates and client CAs of `config`'s TLS listeners.
    pub fn load(config: &Config, read: &mut Sources) -> Result<TlsListeners, ConfigError> {
        let algorithms = crypto_provider()
            .map_err(|reason| ConfigError {
                file: config.source.clone(),
                problems: vec![Problem::new("listen", reason)],
            })?
            .signature_verification_algorithms;
        let served = load_all(config, read)?
            .into_iter()
            .map(|(addr, state)| Served {
                addr,
                resolver: Arc::new(SniResolver {
                    set: ArcSwap::from_pointee(state.certificates),
                }),
                clients: Arc::new(ClientVerifier {
                    policy: ArcSwap::from_pointee(state.clients),
                    algorithms,
                }),
            })
            .collect();
        Ok(TlsListeners { served })
    }

    /// The TLS settings of `listener` (one of those loaded).
    pub fn settings(&self, listener: &Listener) -> Option<TlsSettings> {
        let tls = listener.tls.as_ref()?;
        let served = self.served.iter().find(|s| s.addr == listener.addr)?;
        let mut settings = TlsSettings::with_callbacks(Box::new(KeepClientCertificate)).ok()?;
        settings.set_cert_resolver(Arc::clone(&served.resolver) as Arc<dyn ResolvesServerCert>);
        settings
            .set_client_cert_verifier(Arc::clone(&served.clients) as Arc<dyn ClientCertVerifier>);
        if tls.http2 {
            settings.enable_h2();
        }
        Some(settings)
    }

    /// Loads the certificates and client CAs `config` names for the listeners this process
    /// serves, without using them yet: a reload fails on any problem and keeps what is served.
    pub fn prepare(
        &self,
        config: &Config,
        read: &mut Sources,
    ) -> Result<Vec<(SocketAddr, ListenerTlsState)>, ConfigError> {
        load_all(config, read)
    }

    /// Serves the prepared certificates and client policies from now on; listeners not served
    /// (a reload cannot add one) are ignored.
    pub fn swap(&self, prepared: Vec<(SocketAddr, ListenerTlsState)>) {
        for (addr, state) in prepared {
            if let Some(served) = self.served.iter().find(|s| s.addr == addr) {
                served.resolver.set.store(Arc::new(state.certificates));
                served.clients.policy.store(Arc::new(state.clients));
            }
        }
    }
}

impl ListenerCertificates for TlsListeners {
    fn prepare(
        &self,
        config: &Config,
        read: &mut Sources,
    ) -> Result<Box<dyn FnOnce() + Send + '_>, ConfigError> {
        let prepared = TlsListeners::prepare(self, config, read)?;
        Ok(Box::new(move || self.swap(prepared)))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A self-signed certificate for `names`, expiring on `not_after` (year, month, day),
    /// written into `dir` as `<file>.pem` and `<file>.key`.
    fn issue(dir: &Path, file: &str, names: &[&str], not_after: (i32, u8, u8)) -> CertificateFiles {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("names");
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = rcgen::KeyPair::generate().expect("key");
        let certificate = params.self_signed(&key).expect("certificate");
        let files = CertificateFiles {
            cert: dir.join(format!("{file}.pem")),
            key: dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, certificate.pem()).expect("write the certificate");
        std::fs::write(&files.key, key.serialize_pem()).expect("write the key");
        files
    }

    const VALID: (i32, u8, u8) = (2100, 1, 1);

    /// The leaf certificate of a chosen key, to tell certificates apart.
    fn leaf(key: &CertifiedKey) -> Vec<u8> {
        key.cert[0].to_vec()
    }

    fn leaf_of(files: &CertificateFiles) -> Vec<u8> {
        let set = CertificateSet::load("t", std::slice::from_ref(files), &mut Sources::default())
            .expect("loads");
        leaf(&set.choose(None))
    }

    #[test]
    fn sni_picks_the_exact_name_then_one_wildcard_level_then_the_first_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let a = issue(dir.path(), "a", &["a.test", "*.wild.test"], VALID);
        let b = issue(dir.path(), "b", &["b.test", "a.test"], VALID);
        let set = CertificateSet::load(
            "listen[0]",
            &[a.clone(), b.clone()],
            &mut Sources::default(),
        )
        .expect("loads");
        let (a, b) = (leaf_of(&a), leaf_of(&b));
        let chosen = |name: Option<&str>| leaf(&set.choose(name));
        assert_eq!(chosen(Some("b.test")), b);
        assert_eq!(
            chosen(Some("a.test")),
            a,
            "the first certificate naming a host wins"
        );
        assert_eq!(
            chosen(Some("B.Test.")),
            b,
            "case and a trailing dot do not matter"
        );
        assert_eq!(
            chosen(Some("x.wild.test")),
            a,
            "a wildcard covers one level"
        );
        assert_eq!(chosen(Some("y.x.wild.test")), a, "deeper: the default");
        assert_eq!(
            chosen(Some("unknown.test")),
            a,
            "unknown: the default, the first"
        );
        assert_eq!(chosen(None), a, "no SNI: the default");
    }

    #[test]
    fn a_listener_that_cannot_load_names_each_certificate_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let good = issue(dir.path(), "good", &["a.test"], VALID);
        let missing = CertificateFiles {
            cert: dir.path().join("missing.pem"),
            key: good.key.clone(),
        };
        let mismatched = CertificateFiles {
            cert: good.cert.clone(),
            key: issue(dir.path(), "other", &["b.test"], VALID).key,
        };
        let problems = CertificateSet::load(
            "listen[1]",
            &[good, missing, mismatched],
            &mut Sources::default(),
        )
        .err()
        .expect("refused");
        let shown: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(
            shown[0].contains("listen[1].tls.certificates[1]"),
            "{shown:?}"
        );
        assert!(
            shown[0].contains("cannot read the certificate file"),
            "{shown:?}"
        );
        assert!(
            shown[1].contains("listen[1].tls.certificates[2]"),
            "{shown:?}"
        );
        assert!(shown[1].contains("does not match"), "{shown:?}");
    }

    #[test]
    fn an_expired_certificate_is_warned_of_and_a_distant_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let expired = issue(dir.path(), "expired", &["old.test"], (2020, 1, 1));
        let fine = issue(dir.path(), "fine", &["new.test"], VALID);
        let set = CertificateSet::load("t", &[expired, fine], &mut Sources::default())
            .expect("an expired one loads");
        let warnings = set.expiring(EXPIRY_WARNING);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("expired.pem has expired"),
            "{warnings:?}"
        );
    }

    /// A configuration with one TLS listener serving `files`.
    fn config(dir: &Path, files: &CertificateFiles) -> Config {
        let yaml = format!(
            "listen: [{{ addr: 127.0.0.1:8443, tls: {{ certificates: [{{ cert: {}, key: {} }}] }} }}]\n\
             routes: [{{ name: r, match: {{ path_prefix: / }}, upstream: {{ servers: [127.0.0.1:1] }} }}]\n",
            files.cert.display(),
            files.key.display()
        );
        Config::from_yaml(&dir.join("sluice.yaml"), &yaml).expect("the fixture compiles")
    }

    #[test]
    fn a_reload_swaps_the_certificates_in_place_and_a_failed_one_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let first = issue(dir.path(), "first", &["a.test"], VALID);
        let second = issue(dir.path(), "second", &["a.test"], VALID);
        let listeners = TlsListeners::load(&config(dir.path(), &first), &mut Sources::default())
            .expect("loads");
        let served = |name| leaf(&listeners.served[0].resolver.set.load().choose(Some(name)));
        assert_eq!(served("a.test"), leaf_of(&first));

        let swap = ListenerCertificates::prepare(
            &listeners,
            &config(dir.path(), &second),
            &mut Sources::default(),
        )
        .expect("the next certificates load");
        assert_eq!(
            served("a.test"),
            leaf_of(&first),
            "nothing changes until the swap"
        );
        swap();
        assert_eq!(served("a.test"), leaf_of(&second));

        let broken = config(dir.path(), &first);
        std::fs::remove_file(&first.cert).unwrap();
        assert!(
            ListenerCertificates::prepare(&listeners, &broken, &mut Sources::default()).is_err()
        );
        assert_eq!(
            served("a.test"),
            leaf_of(&second),
            "a failed reload keeps what serves"
        );
    }
}
