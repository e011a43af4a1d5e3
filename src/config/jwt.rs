//! The `jwt:` settings (placed by the `identity:` section): where the verification keys come
//! from (a JWKS file read at load, a JWKS URL fetched in the background, an HMAC secret), which
//! algorithms are allowed, and which issuer, audience, leeway and claims apply. Compiled into
//! [`JwtSettings`]; a JWKS file is read and checked here (through `crate::config::sources`, so
//! `watch: true` follows it), so `sluice -t` reports a broken one.

use super::problem::Problems;
use super::raw::{OneOrMany, RawJwt, RawSecret};
use super::sources::Sources;
use crate::caller::jwt::jwks::{self, KeySet};
use crate::caller::jwt::settings::{
    early_refresh_gap, JwtSettings, KeySource, UrlSource, ALGORITHM_NAMES, DEFAULT_ALGORITHMS,
    DEFAULT_FETCH_TIMEOUT, DEFAULT_LEEWAY_SECONDS, DEFAULT_MAX_JWKS_BYTES, DEFAULT_REFRESH,
};
use jsonwebtoken::{Algorithm, AlgorithmFamily};
use std::sync::Arc;
use std::time::Duration;

/// The shortest HMAC secret accepted: RFC 7518 §3.2 wants at least the hash's size (HS256).
const MIN_HMAC_SECRET_BYTES: usize = 32;
const MAX_JWKS_BYTES_LIMIT: u64 = 16 * 1024 * 1024;
const MAX_LEEWAY_SECONDS: u64 = 3600;

/// Compiles `raw`, found at the YAML path `at` (such as `identity.jwt`).
pub fn compile_jwt(
    raw: RawJwt,
    at: &str,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<JwtSettings> {
    let before = p.0.len();
    let algorithms = algorithms(raw.algorithms.as_deref(), at, p);
    let hmac_given = raw.hmac_secret.is_some();
    let hmac = raw
        .hmac_secret
        .and_then(|secret| hmac_key(secret, &algorithms, &format!("{at}.hmac_secret"), p, read));
    let fetch = FetchKeys {
        refresh_seconds: raw.refresh_seconds,
        fetch_timeout_ms: raw.fetch_timeout_ms,
        max_jwks_bytes: raw.max_jwks_bytes,
    };
    let source = match (raw.jwks_file, raw.jwks_url) {
        (Some(_), Some(_)) => {
            p.add(at, "give jwks_file or jwks_url, not both");
            None
        }
        (Some(file), None) => {
            fetch.only_with_a_url(at, p);
            file_source(&file, &format!("{at}.jwks_file"), p, read)
        }
        (None, Some(url)) => url_source(&url, fetch, at, p).map(KeySource::Url),
        (None, None) => {
            fetch.only_with_a_url(at, p);
            if !hmac_given {
                p.add(
                    at,
                    "give jwks_file, jwks_url or hmac_secret: where the keys come from",
                );
            }
            None
        }
    };
    let settings = JwtSettings {
        algorithms,
        source,
        hmac: hmac.map(Arc::new),
        issuers: names(raw.issuer, &format!("{at}.issuer"), p),
        audiences: names(raw.audience, &format!("{at}.audience"), p),
        leeway_seconds: leeway(raw.leeway_seconds, at, p),
        consumer_claim: claim_name(raw.consumer_claim, "consumer_claim", at, p)
            .unwrap_or_else(|| "sub".into()),
        plan_claim: claim_name(raw.plan_claim, "plan_claim", at, p),
    };
    (p.0.len() == before).then_some(settings)
}

/// The `refresh_seconds`, `fetch_timeout_ms` and `max_jwks_bytes` keys, which only a URL has.
struct FetchKeys {
    refresh_seconds: Option<u64>,
    fetch_timeout_ms: Option<u64>,
    max_jwks_bytes: Option<u64>,
}

impl FetchKeys {
    fn only_with_a_url(&self, at: &str, p: &mut Problems) {
        for (key, given) in [
            ("refresh_seconds", self.refresh_seconds.is_some()),
            ("fetch_timeout_ms", self.fetch_timeout_ms.is_some()),
            ("max_jwks_bytes", self.max_jwks_bytes.is_some()),
        ] {
            if given {
                p.add(
                    format!("{at}.{key}"),
                    "only for jwks_url: remove it, or fetch the keys from a URL",
                );
            }
        }
    }
}

/// The allowed algorithms: those named, else the asymmetric ones ([`DEFAULT_ALGORITHMS`]).
fn algorithms(named: Option<&[String]>, at: &str, p: &mut Problems) -> Box<[Algorithm]> {
    let Some(named) = named else {
        return DEFAULT_ALGORITHMS.into();
    };
    if named.is_empty() {
        p.add(
            format!("{at}.algorithms"),
            "empty: name at least one algorithm, or remove the key for the asymmetric ones",
        );
    }
    let mut allowed: Vec<Algorithm> = Vec::with_capacity(named.len());
    for (i, name) in named.iter().enumerate() {
        match ALGORITHM_NAMES.iter().find(|(known, _)| known == name) {
            Some((_, alg)) if !allowed.contains(alg) => allowed.push(*alg),
            Some(_) => p.add(
                format!("{at}.algorithms[{i}]"),
                format!("{name} is named twice"),
            ),
            None if name.eq_ignore_ascii_case("none") => p.add(
                format!("{at}.algorithms[{i}]"),
                "unsigned tokens (alg none) are never accepted",
            ),
            None => p.add(
                format!("{at}.algorithms[{i}]"),
                format!("unknown algorithm {name:?}: use {}", known_names()),
            ),
        }
    }
    allowed.into()
}

fn known_names() -> String {
    let names: Vec<&str> = ALGORITHM_NAMES.iter().map(|(name, _)| *name).collect();
    names.join(", ")
}

/// The HMAC key of `hmac_secret`, which needs an HS algorithm allowed and 32 bytes or more.
fn hmac_key(
    secret: RawSecret,
    algorithms: &[Algorithm],
    at: &str,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<jwks::VerifyKey> {
    let secret = super::secrets::compile(secret, at, p, read)?;
    if !algorithms
        .iter()
        .any(|alg| jwks::family_of(*alg) == AlgorithmFamily::Hmac)
    {
        p.add(
            at,
            "an HMAC secret needs HS256, HS384 or HS512 in algorithms (HMAC is off unless named)",
        );
        return None;
    }
    if secret.expose().len() < MIN_HMAC_SECRET_BYTES {
        p.add(at, format!("too short: an HMAC secret must be at least {MIN_HMAC_SECRET_BYTES} bytes (RFC 7518 section 3.2)"));
        return None;
    }
    Some(jwks::hmac_key(secret.expose().as_bytes()))
}

/// The keys of a JWKS file, read now (at start and at each reload).
fn file_source(file: &str, at: &str, p: &mut Problems, read: &mut Sources) -> Option<KeySource> {
    let path = super::paths::absolute(file);
    let text = read
        .read(&path)
        .map_err(|e| p.add(at, format!("cannot read {}: {e}", path.display())))
        .ok()?;
    let parsed = jwks::parse(&text)
        .map_err(|e| p.add(at, format!("{}: {e}", path.display())))
        .ok()?;
    if parsed.set.is_empty() {
        p.add(
            at,
            format!("{}: the set holds no usable signature key", path.display()),
        );
        return None;
    }
    let keys: Arc<KeySet> = Arc::new(parsed.set);
    Some(KeySource::File { path, keys })
}

/// A JWKS URL: `https`, or `http` on a loopback host only (keys fetched in clear text from
/// elsewhere could be swapped on the way).
fn url_source(url: &str, fetch: FetchKeys, at: &str, p: &mut Problems) -> Option<UrlSource> {
    let before = p.0.len();
    match reqwest::Url::parse(url) {
        Ok(parsed) if parsed.scheme() == "https" => {}
        Ok(parsed) if parsed.scheme() == "http" && is_loopback(&parsed) => {}
        Ok(_) => p.add(
            format!("{at}.jwks_url"),
            "use https (http only on a loopback address)",
        ),
        Err(e) => p.add(format!("{at}.jwks_url"), format!("not a URL: {e}")),
    }
    let refresh = positive(fetch.refresh_seconds, "refresh_seconds", at, p)
        .map_or(DEFAULT_REFRESH, Duration::from_secs);
    let fetch_timeout = positive(fetch.fetch_timeout_ms, "fetch_timeout_ms", at, p)
        .map_or(DEFAULT_FETCH_TIMEOUT, Duration::from_millis);
    let max_bytes = match positive(fetch.max_jwks_bytes, "max_jwks_bytes", at, p) {
        Some(bytes) if bytes > MAX_JWKS_BYTES_LIMIT => {
            p.add(
                format!("{at}.max_jwks_bytes"),
                format!("at most {MAX_JWKS_BYTES_LIMIT}"),
            );
            DEFAULT_MAX_JWKS_BYTES
        }
        Some(bytes) => usize::try_from(bytes).unwrap_or(DEFAULT_MAX_JWKS_BYTES),
        None => DEFAULT_MAX_JWKS_BYTES,
    };
    (p.0.len() == before).then(|| UrlSource {
        url: url.into(),
        refresh,
        fetch_timeout,
        max_bytes,
        early_refresh_gap: early_refresh_gap(refresh),
    })
}

fn is_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn positive(value: Option<u64>, key: &str, at: &str, p: &mut Problems) -> Option<u64> {
    match value {
        Some(0) => {
            p.add(format!("{at}.{key}"), "must be greater than zero");
            None
        }
        other => other,
    }
}

fn names(raw: Option<OneOrMany>, at: &str, p: &mut Problems) -> Box<[Box<str>]> {
    let names = match raw {
        None => return Box::default(),
        Some(OneOrMany::One(name)) => vec![name],
        Some(OneOrMany::Many(names)) => names,
    };
    if names.is_empty() || names.iter().any(String::is_empty) {
        p.add(
            at,
            "empty: give one value or a list of non-empty values, or remove the key",
        );
    }
    names.into_iter().map(String::into_boxed_str).collect()
}

fn leeway(seconds: Option<u64>, at: &str, p: &mut Problems) -> u64 {
    match seconds {
        Some(seconds) if seconds > MAX_LEEWAY_SECONDS => {
            p.add(
                format!("{at}.leeway_seconds"),
                format!("at most {MAX_LEEWAY_SECONDS}"),
            );
            DEFAULT_LEEWAY_SECONDS
        }
        Some(seconds) => seconds,
        None => DEFAULT_LEEWAY_SECONDS,
    }
}

fn claim_name(name: Option<String>, key: &str, at: &str, p: &mut Problems) -> Option<Box<str>> {
    match name {
        Some(name) if name.is_empty() => {
            p.add(
                format!("{at}.{key}"),
                "empty: name a claim, or remove the key",
            );
            None
        }
        other => other.map(String::into_boxed_str),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::jwt::testing::{self, TestKey};
    use crate::config::problem::problems_of;

    fn jwt(yaml: &str) -> (Option<JwtSettings>, Vec<String>) {
        problems_of(yaml, |raw: RawJwt, p: &mut Problems| {
            compile_jwt(raw, "identity.jwt", p, &mut Sources::default())
        })
    }

    fn jwks_file(dir: &tempfile::TempDir, body: &str) -> String {
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, body).unwrap();
        path.display().to_string()
    }

    #[test]
    fn a_jwks_file_is_read_at_compile_with_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let key = TestKey::hmac(&[1; 32], Algorithm::HS256, Some("k"));
        let file = jwks_file(&dir, &testing::jwks(&[&key]));
        let (settings, problems) = jwt(&format!(
            "{{ jwks_file: {file}, issuer: https://idp, audience: [a, b] }}"
        ));
        assert_eq!(problems, Vec::<String>::new());
        let settings = settings.unwrap();
        assert_eq!(&*settings.algorithms, &DEFAULT_ALGORITHMS);
        assert!(
            matches!(&settings.source, Some(KeySource::File { keys, .. }) if keys.keys.len() == 1)
        );
        assert_eq!(settings.issuers.len(), 1);
        assert_eq!(settings.audiences.len(), 2);
        assert_eq!(settings.leeway_seconds, 60);
        assert_eq!(&*settings.consumer_claim, "sub");
        assert_eq!(settings.plan_claim, None);
    }

    #[test]
    fn a_jwks_url_takes_its_fetch_settings() {
        let (settings, problems) = jwt(
            "{ jwks_url: 'https://idp.example/jwks', refresh_seconds: 60, fetch_timeout_ms: 800, \
             max_jwks_bytes: 4096, algorithms: [ES256], plan_claim: tier, leeway_seconds: 0 }",
        );
        assert_eq!(problems, Vec::<String>::new());
        let settings = settings.unwrap();
        let Some(KeySource::Url(url)) = &settings.source else {
            panic!("a URL source");
        };
        assert_eq!(url.refresh, Duration::from_secs(60));
        assert_eq!(url.fetch_timeout, Duration::from_millis(800));
        assert_eq!(url.max_bytes, 4096);
        assert_eq!(&*settings.algorithms, &[Algorithm::ES256]);
        assert_eq!(settings.plan_claim.as_deref(), Some("tier"));
        assert_eq!(settings.leeway_seconds, 0);
        assert!(jwt("{ jwks_url: 'http://127.0.0.1:8080/jwks' }")
            .1
            .is_empty());
        assert!(jwt("{ jwks_url: 'http://[::1]:8080/jwks' }").1.is_empty());
    }

    #[test]
    fn where_the_keys_come_from_must_be_said_once() {
        assert_eq!(
            jwt("{ issuer: x }").1,
            ["identity.jwt: give jwks_file, jwks_url or hmac_secret: where the keys come from"]
        );
        assert_eq!(
            jwt("{ jwks_file: a.json, jwks_url: 'https://x/jwks' }").1,
            ["identity.jwt: give jwks_file or jwks_url, not both"]
        );
        assert_eq!(
            jwt("{ jwks_url: 'http://idp.example/jwks' }").1,
            ["identity.jwt.jwks_url: use https (http only on a loopback address)"]
        );
        assert!(
            jwt("{ jwks_url: 'not a url' }").1[0].starts_with("identity.jwt.jwks_url: not a URL")
        );
    }

    #[test]
    fn fetch_settings_need_a_url_and_must_be_positive() {
        let dir = tempfile::tempdir().unwrap();
        let key = TestKey::hmac(&[1; 32], Algorithm::HS256, Some("k"));
        let file = jwks_file(&dir, &testing::jwks(&[&key]));
        assert_eq!(
            jwt(&format!("{{ jwks_file: {file}, refresh_seconds: 5 }}")).1,
            ["identity.jwt.refresh_seconds: only for jwks_url: remove it, or fetch the keys from a URL"]
        );
        assert_eq!(
            jwt("{ jwks_url: 'https://x/jwks', fetch_timeout_ms: 0, max_jwks_bytes: 99999999 }").1,
            [
                "identity.jwt.fetch_timeout_ms: must be greater than zero",
                "identity.jwt.max_jwks_bytes: at most 16777216"
            ]
        );
    }

    #[test]
    fn a_broken_jwks_file_is_reported_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = jwks_file(&dir, "<html>");
        let problems = jwt(&format!("{{ jwks_file: {file} }}")).1;
        assert!(
            problems[0].starts_with(&format!(
                "identity.jwt.jwks_file: {file}: not a JWKS document"
            )),
            "{problems:?}"
        );
        let file = jwks_file(&dir, "{\"keys\": [{\"kty\": \"weird\"}]}");
        assert_eq!(
            jwt(&format!("{{ jwks_file: {file} }}")).1,
            [format!(
                "identity.jwt.jwks_file: {file}: the set holds no usable signature key"
            )]
        );
        let problems = jwt("{ jwks_file: /nonexistent/jwks.json }").1;
        assert!(
            problems[0].starts_with("identity.jwt.jwks_file: cannot read /nonexistent/jwks.json"),
            "{problems:?}"
        );
    }

    #[test]
    fn algorithms_are_known_names_and_never_none() {
        assert_eq!(
            jwt("{ jwks_url: 'https://x/j', algorithms: [RS256, none, XS1, RS256] }").1,
            [
                "identity.jwt.algorithms[1]: unsigned tokens (alg none) are never accepted"
                    .to_string(),
                format!(
                    "identity.jwt.algorithms[2]: unknown algorithm \"XS1\": use {}",
                    known_names()
                ),
                "identity.jwt.algorithms[3]: RS256 is named twice".to_string(),
            ]
        );
        assert_eq!(
            jwt("{ jwks_url: 'https://x/j', algorithms: [] }").1,
            ["identity.jwt.algorithms: empty: name at least one algorithm, or remove the key for the asymmetric ones"]
        );
    }

    #[test]
    fn an_hmac_secret_needs_an_hs_algorithm_and_32_bytes() {
        let secret = "0123456789abcdef0123456789abcdef";
        let (settings, problems) =
            jwt(&format!("{{ hmac_secret: {secret}, algorithms: [HS256] }}"));
        assert_eq!(problems, Vec::<String>::new());
        assert!(settings.unwrap().hmac.is_some());
        assert_eq!(
            jwt(&format!("{{ hmac_secret: {secret} }}")).1,
            ["identity.jwt.hmac_secret: an HMAC secret needs HS256, HS384 or HS512 in algorithms (HMAC is off unless named)"]
        );
        assert_eq!(
            jwt("{ hmac_secret: short, algorithms: [HS256] }").1,
            ["identity.jwt.hmac_secret: too short: an HMAC secret must be at least 32 bytes (RFC 7518 section 3.2)"]
        );
        let problems =
            jwt("{ hmac_secret: { env: SLUICE_TEST_NO_SUCH_VARIABLE }, algorithms: [HS256] }").1;
        assert!(
            problems[0].starts_with("identity.jwt.hmac_secret: environment variable"),
            "{problems:?}"
        );
    }

    #[test]
    fn claims_issuers_audiences_and_leeway_are_checked() {
        assert_eq!(
            jwt("{ jwks_url: 'https://x/j', issuer: [], audience: '', leeway_seconds: 7200, consumer_claim: '', plan_claim: '' }").1,
            [
                "identity.jwt.issuer: empty: give one value or a list of non-empty values, or remove the key",
                "identity.jwt.audience: empty: give one value or a list of non-empty values, or remove the key",
                "identity.jwt.leeway_seconds: at most 3600",
                "identity.jwt.consumer_claim: empty: name a claim, or remove the key",
                "identity.jwt.plan_claim: empty: name a claim, or remove the key",
            ]
        );
    }

    #[test]
    fn unknown_keys_are_reported_with_their_path_and_the_nearest_known_key() {
        let mut p = Problems::default();
        let read = crate::config::misfits::read::<RawJwt>(
            "{ jwks_url: 'https://x/j', audiences: [a] }",
            &mut p,
        );
        assert!(read.is_some(), "the rest reads");
        assert_eq!(
            p.lines(),
            ["audiences: unknown key: did you mean `audience`?"]
        );
    }
}
