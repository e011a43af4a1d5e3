//! Test support, for this crate's tests and `tests/support/tokens.rs`: keys of every family
//! (made by the `openssl` command), tokens signed with them, JWKS documents, and a tiny JWKS
//! HTTP server on a loopback port whose answer can be swapped or made to fail while it runs.
//! Not used by the gateway itself.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A key family, and the curve or size of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Rsa,
    P256,
    P384,
    Ed25519,
}

/// A signing key with its public JWK.
#[derive(Clone)]
pub struct TestKey {
    pub kid: Option<String>,
    pub alg: Algorithm,
    encoding: EncodingKey,
    /// The public key as a JWK (with `kid` and `alg` when set).
    pub jwk: Value,
    /// The public key in PEM (SubjectPublicKeyInfo); empty for HMAC.
    pub public_pem: Vec<u8>,
}

impl TestKey {
    /// A new key of `family` for `alg`, named `kid`.
    pub fn generate(family: Family, alg: Algorithm, kid: Option<&str>) -> TestKey {
        let private_pem = openssl(&genpkey_args(family), None);
        let public_der = openssl(&["pkey", "-pubout", "-outform", "DER"], Some(&private_pem));
        let public_pem = openssl(&["pkey", "-pubout"], Some(&private_pem));
        let (encoding, mut jwk) = match family {
            Family::Rsa => (
                EncodingKey::from_rsa_der(&openssl(
                    &["rsa", "-traditional", "-outform", "DER"],
                    Some(&private_pem),
                )),
                rsa_jwk(&private_pem),
            ),
            Family::P256 | Family::P384 => {
                let (crv, size) = if family == Family::P256 {
                    ("P-256", 32)
                } else {
                    ("P-384", 48)
                };
                let point = &public_der[public_der.len() - 2 * size..];
                let jwk = json!({"kty": "EC", "crv": crv,
                    "x": b64(&point[..size]), "y": b64(&point[size..])});
                (EncodingKey::from_ec_der(&pkcs8_der(&private_pem)), jwk)
            }
            Family::Ed25519 => {
                let x = &public_der[public_der.len() - 32..];
                let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": b64(x)});
                (EncodingKey::from_ed_der(&pkcs8_der(&private_pem)), jwk)
            }
        };
        name_jwk(&mut jwk, kid, alg);
        TestKey {
            kid: kid.map(str::to_string),
            alg,
            encoding,
            jwk,
            public_pem,
        }
    }

    /// An HMAC key for `alg` (HS256/384/512); its JWK is `kty: oct`.
    pub fn hmac(secret: &[u8], alg: Algorithm, kid: Option<&str>) -> TestKey {
        let mut jwk = json!({"kty": "oct", "k": b64(secret)});
        name_jwk(&mut jwk, kid, alg);
        TestKey {
            kid: kid.map(str::to_string),
            alg,
            encoding: EncodingKey::from_secret(secret),
            jwk,
            public_pem: Vec::new(),
        }
    }

    /// The same key used with another algorithm of its family (RS256 → PS256).
    pub fn with_alg(&self, alg: Algorithm) -> TestKey {
        let mut key = self.clone();
        key.alg = alg;
        name_jwk(&mut key.jwk, self.kid.as_deref(), alg);
        key
    }

    /// A token of `claims`, its header naming this key's `alg` and `kid`.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign")
    }

    /// A token of `claims` signed as this key but without a `kid` in its header.
    pub fn sign_without_kid(&self, claims: &Value) -> String {
        jsonwebtoken::encode(&Header::new(self.alg), claims, &self.encoding).expect("sign")
    }
}

fn name_jwk(jwk: &mut Value, kid: Option<&str>, alg: Algorithm) {
    jwk["alg"] = json!(super::settings::algorithm_name(alg));
    jwk["use"] = json!("sig");
    if let Some(kid) = kid {
        jwk["kid"] = json!(kid);
    }
}

/// The algorithm-confusion forgery: an HS256 token whose HMAC secret is `key`'s public PEM.
pub fn hs256_with_public_key(key: &TestKey, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = key.kid.clone();
    let forger = EncodingKey::from_secret(&key.public_pem);
    jsonwebtoken::encode(&header, claims, &forger).expect("sign")
}

/// An unsecured token (`alg: none`, empty signature).
pub fn unsigned_token(claims: &Value, kid: Option<&str>) -> String {
    let mut header = json!({"alg": "none", "typ": "JWT"});
    if let Some(kid) = kid {
        header["kid"] = json!(kid);
    }
    format!(
        "{}.{}.",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

/// A JWKS document of `keys`' public JWKs.
pub fn jwks(keys: &[&TestKey]) -> String {
    json!({"keys": keys.iter().map(|key| key.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

/// Claims valid at `now`: `sub`, `iss`, `aud`, `exp` an hour on.
pub fn claims(sub: &str, iss: &str, aud: &str, now: u64) -> Value {
    json!({"sub": sub, "iss": iss, "aud": aud, "exp": now + 3600, "iat": now})
}

/// Seconds since the epoch now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_secs())
}

pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn genpkey_args(family: Family) -> Vec<&'static str> {
    let mut args = vec!["genpkey", "-algorithm"];
    args.extend_from_slice(match family {
        Family::Rsa => &["RSA", "-pkeyopt", "rsa_keygen_bits:2048"][..],
        Family::P256 => &["EC", "-pkeyopt", "ec_paramgen_curve:P-256"][..],
        Family::P384 => &["EC", "-pkeyopt", "ec_paramgen_curve:P-384"][..],
        Family::Ed25519 => &["ED25519"][..],
    });
    args
}

/// An RSA JWK from a private key's modulus (`openssl rsa -modulus`); the exponent is
/// `genpkey`'s 65537.
fn rsa_jwk(private_pem: &[u8]) -> Value {
    let out = openssl(&["rsa", "-noout", "-modulus"], Some(private_pem));
    let text = String::from_utf8(out).expect("modulus text");
    let hex = text.trim().trim_start_matches("Modulus=");
    let modulus: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    json!({"kty": "RSA", "n": b64(&modulus), "e": "AQAB"})
}

/// A PKCS#8 private key's DER form.
fn pkcs8_der(private_pem: &[u8]) -> Vec<u8> {
    openssl(
        &["pkcs8", "-topk8", "-nocrypt", "-outform", "DER"],
        Some(private_pem),
    )
}

/// Runs `openssl args` with `input` on stdin; its stdout.
fn openssl(args: &[&str], input: Option<&[u8]>) -> Vec<u8> {
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the openssl command runs");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(input) = input {
        stdin.write_all(input).expect("write to openssl");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("openssl output");
    assert!(out.status.success(), "openssl {args:?} failed");
    out.stdout
}

/// What the JWKS server answers.
#[derive(Debug, Clone)]
pub enum Served {
    /// 200 with this body.
    Body(String),
    /// This status, empty body.
    Status(u16),
    /// Nothing: the request is read and left unanswered until the server stops or is told
    /// to serve something else.
    Stall,
}

/// A JWKS HTTP server on a free loopback port, stopped when dropped.
pub struct JwksServer {
    pub addr: SocketAddr,
    served: Arc<Mutex<Served>>,
    requests: Arc<AtomicUsize>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl JwksServer {
    /// Serves `body` (a JWKS document) at every path until told otherwise.
    pub fn start(body: String) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let served = Arc::new(Mutex::new(Served::Body(body)));
        let requests = Arc::new(AtomicUsize::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let thread = {
            let (served, requests, stopping) = (served.clone(), requests.clone(), stopping.clone());
            std::thread::spawn(move || serve(listener, &served, &requests, &stopping))
        };
        JwksServer {
            addr,
            served,
            requests,
            stopping,
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/jwks.json", self.addr)
    }

    /// Answers `served` from the next request on.
    pub fn serve(&self, served: Served) {
        *self.served.lock().unwrap_or_else(|p| p.into_inner()) = served;
    }

    /// Requests received so far (a stalled one counts when it has been read).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listener: TcpListener, served: &Mutex<Served>, requests: &AtomicUsize, stop: &AtomicBool) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let mut request = Vec::new();
        let mut buffer = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buffer[..n]),
            }
        }
        requests.fetch_add(1, Ordering::SeqCst);
        let answer = served.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (status, body) = match answer {
            Served::Body(body) => (200, body),
            Served::Status(status) => (status, String::new()),
            Served::Stall => {
                stall(served, stop);
                continue;
            }
        };
        let head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(body.as_bytes());
    }
}

/// Holds the connection until the server stops or serves something other than a stall.
fn stall(served: &Mutex<Served>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst)
        && matches!(
            *served.lock().unwrap_or_else(|p| p.into_inner()),
            Served::Stall
        )
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
