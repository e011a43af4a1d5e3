//! Fetching a JWKS over HTTP(S): one GET with a deadline, a size cap on the body, and the
//! answer parsed into a key set. TLS is rustls with the ring provider (already in the tree)
//! and the platform's trust store.

use super::jwks::{self, ParsedJwks};
use super::settings::UrlSource;
use std::sync::Arc;

/// Why a fetch gave no key set (the last good set stays in force).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("request failed: {0}")]
    Request(String),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    NotJwks(String),
    #[error("the set holds no usable signature key")]
    NoUsableKey,
}

impl FetchError {
    /// The metric label of a failed fetch.
    pub fn label(&self) -> &'static str {
        match self {
            FetchError::Client(_) | FetchError::Request(_) => "unreachable",
            FetchError::Status(_) => "http_status",
            FetchError::TooLarge(_) => "too_large",
            FetchError::NotJwks(_) | FetchError::NoUsableKey => "invalid",
        }
    }
}

/// The HTTP client for JWKS fetches: `source`'s timeout, at most 3 redirects.
pub fn client(source: &UrlSource) -> Result<reqwest::Client, FetchError> {
    let tls = tls_config().map_err(FetchError::Client)?;
    reqwest::Client::builder()
        .timeout(source.fetch_timeout)
        .connect_timeout(source.fetch_timeout)
        .redirect(reqwest::redirect::Policy::limited(3))
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| FetchError::Client(e.to_string()))
}

fn tls_config() -> Result<rustls::ClientConfig, String> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_platform_verifier()
        .map_err(|e| e.to_string())
        .map(|builder| builder.with_no_client_auth())
}

/// GETs `source.url` once and parses the answer.
pub async fn fetch(client: &reqwest::Client, source: &UrlSource) -> Result<ParsedJwks, FetchError> {
    let mut response = client
        .get(&*source.url)
        .header("accept", "application/jwk-set+json, application/json")
        .send()
        .await
        .map_err(|e| FetchError::Request(without_url(e)))?;
    if !response.status().is_success() {
        return Err(FetchError::Status(response.status().as_u16()));
    }
    if response
        .content_length()
        .is_some_and(|length| length > source.max_bytes as u64)
    {
        return Err(FetchError::TooLarge(source.max_bytes));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| FetchError::Request(without_url(e)))?
    {
        if body.len() + chunk.len() > source.max_bytes {
            return Err(FetchError::TooLarge(source.max_bytes));
        }
        body.extend_from_slice(&chunk);
    }
    let parsed = jwks::parse(&body).map_err(FetchError::NotJwks)?;
    if parsed.set.is_empty() {
        return Err(FetchError::NoUsableKey);
    }
    Ok(parsed)
}

/// reqwest's error text without the URL (logged once, by the caller, already).
fn without_url(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
