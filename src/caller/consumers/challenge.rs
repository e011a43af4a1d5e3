//! `WWW-Authenticate` of a `401`: one value per [`AuthFailure`], built when the configuration is
//! loaded. It holds a challenge per configured verifier that reads a header (RFC 9110 §11.6.1):
//! `ApiKey realm="sluice", header="..."` for API keys, and `Bearer realm="sluice"` for JWTs —
//! with `error="invalid_token"` (or `"invalid_request"` for a malformed header) and the
//! failure's fixed `error_description` when the failure is the token's (RFC 6750 §3); a missing
//! credential gets no error. The challenge of the scheme the failure is about comes first.

use http::header::{HeaderName, HeaderValue};

use super::{AuthFailure, Via};

/// The verifiers that read a header: the API-key header, whether bearer tokens are verified.
#[derive(Debug, Clone, Copy)]
pub struct Schemes<'a> {
    pub api_key_header: Option<&'a HeaderName>,
    pub bearer: bool,
}

/// The challenge of each failure, by `failure as usize`; `None` where the answer is no `401`
/// or no verifier reads a header.
pub fn challenges(schemes: Schemes<'_>) -> Box<[Option<HeaderValue>]> {
    AuthFailure::ALL
        .iter()
        .map(|failure| challenge(schemes, *failure))
        .collect()
}

fn challenge(schemes: Schemes<'_>, failure: AuthFailure) -> Option<HeaderValue> {
    if !failure.challenges() {
        return None;
    }
    let api_key = schemes
        .api_key_header
        .map(|header| format!("ApiKey realm=\"sluice\", header=\"{header}\""));
    let bearer = schemes.bearer.then(|| bearer(failure));
    let ordered = if failure.via() == Some(Via::Jwt) {
        [bearer, api_key]
    } else {
        [api_key, bearer]
    };
    let text = ordered.into_iter().flatten().collect::<Vec<_>>().join(", ");
    if text.is_empty() {
        return None;
    }
    // Fixed text: realm, a header name, and details checked to be error_description bytes.
    HeaderValue::from_str(&text).ok()
}

fn bearer(failure: AuthFailure) -> String {
    match failure.bearer_error() {
        None => "Bearer realm=\"sluice\"".to_string(),
        Some(error) => format!(
            "Bearer realm=\"sluice\", error=\"{error}\", error_description=\"{}\"",
            failure.detail()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(schemes: Schemes<'_>, failure: AuthFailure) -> Option<String> {
        challenges(schemes)[failure as usize]
            .as_ref()
            .map(|v| v.to_str().unwrap().to_string())
    }

    #[test]
    fn a_bearer_challenge_says_what_was_wrong_with_the_token_and_nothing_when_it_is_missing() {
        let bearer = Schemes {
            api_key_header: None,
            bearer: true,
        };
        assert_eq!(
            of(bearer, AuthFailure::Missing).as_deref(),
            Some("Bearer realm=\"sluice\"")
        );
        assert_eq!(
            of(bearer, AuthFailure::Expired).as_deref(),
            Some("Bearer realm=\"sluice\", error=\"invalid_token\", error_description=\"The token has expired.\"")
        );
        assert_eq!(
            of(bearer, AuthFailure::Malformed).as_deref(),
            Some("Bearer realm=\"sluice\", error=\"invalid_request\", error_description=\"The credential is not in its form (or sent twice).\"")
        );
        for no_challenge in [
            AuthFailure::UnknownPlan,
            AuthFailure::PlanNotAllowed,
            AuthFailure::NoKeys,
        ] {
            assert_eq!(of(bearer, no_challenge), None, "{no_challenge:?}");
        }
    }

    #[test]
    fn with_api_keys_too_the_scheme_the_failure_is_about_comes_first() {
        let header = HeaderName::from_static("x-api-key");
        let both = Schemes {
            api_key_header: Some(&header),
            bearer: true,
        };
        assert_eq!(
            of(both, AuthFailure::Missing).as_deref(),
            Some("ApiKey realm=\"sluice\", header=\"x-api-key\", Bearer realm=\"sluice\"")
        );
        assert_eq!(
            of(both, AuthFailure::UnknownKey).as_deref(),
            Some("ApiKey realm=\"sluice\", header=\"x-api-key\", Bearer realm=\"sluice\""),
            "an unknown API key says nothing about tokens"
        );
        assert_eq!(
            of(both, AuthFailure::BadSignature).as_deref(),
            Some("Bearer realm=\"sluice\", error=\"invalid_token\", error_description=\"The token's signature is not valid.\", ApiKey realm=\"sluice\", header=\"x-api-key\"")
        );
        let neither = Schemes {
            api_key_header: None,
            bearer: false,
        };
        assert_eq!(of(neither, AuthFailure::Missing), None);
    }
}
