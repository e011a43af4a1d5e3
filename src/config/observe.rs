//! The `access_log:`, `request_id:` and `tracing:` sections: where request lines go and which of
//! them, how requests are named across the gateway, its upstreams and its clients, and where
//! their OpenTelemetry spans are sent.

use std::path::PathBuf;

use bytes::Bytes;
use http::HeaderName;
use serde::Deserialize;
use strum::{EnumString, VariantNames};

use super::choice::{chosen, impl_choice, Spelled};
use super::problem::Problems;

/// Request headers an access log may copy, at most.
const MAX_LOGGED_HEADERS: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAccessLog {
    pub enabled: Option<bool>,
    pub path: Option<String>,
    pub sample: Option<u64>,
    pub sample_errors: Option<u64>,
    pub headers: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRequestId {
    pub enabled: Option<bool>,
    pub header: Option<String>,
    pub accept: Option<Spelled<AcceptRequestId>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    pub enabled: Option<bool>,
    pub endpoint: Option<String>,
    pub sample: Option<f64>,
    pub service_name: Option<String>,
}

/// `tracing:` when enabled: spans exported over OTLP/HTTP (protobuf).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector's traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub endpoint: String,
    /// The share of traces started here that are recorded (0..=1); a caller's sampled
    /// `traceparent` is always followed.
    pub sample: f64,
    pub service_name: String,
}

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stdout,
    /// Appended to; opened again on SIGUSR1 and on reload (for logrotate).
    File(PathBuf),
}

/// `access_log:` when enabled.
#[derive(Debug, Clone)]
pub struct AccessLogSettings {
    pub target: LogTarget,
    /// Log 1 in N of the requests answered below 400.
    pub sample: u64,
    /// Log 1 in N of the others: limited, refused, failed (status 400 and above).
    pub sample_errors: u64,
    /// Request headers copied into each line (values cut at 256 bytes).
    pub headers: Vec<HeaderName>,
}

/// Whose incoming request id is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, EnumString, VariantNames)]
#[strum(serialize_all = "snake_case")]
pub enum AcceptRequestId {
    /// From peers in `trusted_proxies` (the default): a client cannot choose its own id.
    Trusted,
    Always,
    Never,
}
impl_choice!(AcceptRequestId, "value");

/// `request_id:` when enabled (the default).
#[derive(Debug, Clone)]
pub struct RequestIdSettings {
    /// The header, for reading a request's.
    pub header: HeaderName,
    /// The header's name as written (`X-Request-Id` by default), as it is sent: Pingora keeps a
    /// `Bytes` name as it is, where it would copy and re-case a `HeaderName` on every insert.
    pub spelling: Bytes,
    pub accept: AcceptRequestId,
}

fn sample_rate(value: Option<u64>, path: &str, p: &mut Problems) -> u64 {
    match value {
        Some(0) => {
            p.add(path, "must be at least 1 (log 1 request in N)");
            1
        }
        Some(n) => n,
        None => 1,
    }
}

fn header_name(text: &str, path: &str, p: &mut Problems) -> Option<HeaderName> {
    match HeaderName::from_bytes(text.trim().as_bytes()) {
        Ok(name) => Some(name),
        Err(_) => {
            p.add(path, format!("{text:?} is not a valid header name"));
            None
        }
    }
}

pub fn compile_access_log(
    raw: Option<RawAccessLog>,
    p: &mut Problems,
) -> Option<AccessLogSettings> {
    let raw = raw?;
    let target = match raw.path.as_deref().map(str::trim) {
        None | Some("stdout") => LogTarget::Stdout,
        Some("") => {
            p.add("access_log.path", "is empty: give a file path, or stdout");
            LogTarget::Stdout
        }
        Some(path) if !path.starts_with('/') => {
            p.add(
                "access_log.path",
                format!("{path:?} is not absolute (the service's directory is not the config's)"),
            );
            LogTarget::Stdout
        }
        Some(path) => LogTarget::File(PathBuf::from(path)),
    };
    let sample = sample_rate(raw.sample, "access_log.sample", p);
    let sample_errors = sample_rate(raw.sample_errors, "access_log.sample_errors", p);
    let listed = raw.headers.unwrap_or_default();
    if listed.len() > MAX_LOGGED_HEADERS {
        p.add(
            "access_log.headers",
            format!(
                "{} headers listed, at most {MAX_LOGGED_HEADERS}",
                listed.len()
            ),
        );
    }
    let headers = listed
        .iter()
        .enumerate()
        .filter_map(|(i, name)| header_name(name, &format!("access_log.headers[{i}]"), p))
        .collect();
    raw.enabled.unwrap_or(false).then_some(AccessLogSettings {
        target,
        sample,
        sample_errors,
        headers,
    })
}

pub fn compile_request_id(
    raw: Option<RawRequestId>,
    p: &mut Problems,
) -> Option<RequestIdSettings> {
    let (enabled, header, accept) = match raw {
        Some(raw) => (raw.enabled, raw.header, raw.accept),
        None => (None, None, None),
    };
    let (header, spelling) = match header {
        Some(text) => (
            header_name(&text, "request_id.header", p)?,
            Bytes::from(text.trim().to_string()),
        ),
        None => (
            HeaderName::from_static("x-request-id"),
            Bytes::from_static(b"X-Request-Id"),
        ),
    };
    let accept = chosen(
        accept.as_ref(),
        AcceptRequestId::Trusted,
        "request_id.accept",
        p,
    )
    .unwrap_or(AcceptRequestId::Trusted);
    enabled.unwrap_or(true).then_some(RequestIdSettings {
        header,
        spelling,
        accept,
    })
}

pub fn compile_tracing(raw: Option<RawTracing>, p: &mut Problems) -> Option<TracingSettings> {
    let raw = raw?;
    let endpoint = raw
        .endpoint
        .unwrap_or_else(|| "http://127.0.0.1:4318/v1/traces".to_string());
    match endpoint.parse::<http::Uri>() {
        Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
        Ok(uri) if uri.scheme_str() == Some("https") => p.add(
            "tracing.endpoint",
            "https collectors are not supported: send to a local collector or agent over http",
        ),
        _ => p.add(
            "tracing.endpoint",
            format!("{endpoint:?} is not an http:// URL (e.g. http://127.0.0.1:4318/v1/traces)"),
        ),
    }
    let sample = raw.sample.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample) {
        p.add(
            "tracing.sample",
            format!("{sample} is not a share between 0 and 1"),
        );
    }
    let service_name = raw.service_name.unwrap_or_else(|| "sluice".to_string());
    if service_name.trim().is_empty() {
        p.add("tracing.service_name", "is empty");
    }
    raw.enabled.unwrap_or(false).then_some(TracingSettings {
        endpoint,
        sample: sample.clamp(0.0, 1.0),
        service_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access_log(yaml: &str) -> (Option<AccessLogSettings>, Vec<String>) {
        let raw: RawAccessLog = serde_yaml::from_str(yaml).expect("yaml");
        let mut p = Problems::default();
        let settings = compile_access_log(Some(raw), &mut p);
        (settings, p.0.iter().map(|x| x.to_string()).collect())
    }

    #[test]
    fn an_enabled_log_defaults_to_stdout_every_request() {
        let (settings, problems) = access_log("enabled: true");
        assert!(problems.is_empty(), "{problems:?}");
        let settings = settings.expect("enabled");
        assert_eq!(settings.target, LogTarget::Stdout);
        assert_eq!((settings.sample, settings.sample_errors), (1, 1));
    }

    #[test]
    fn every_bad_access_log_setting_is_reported() {
        let (_, problems) = access_log(
            "{ enabled: true, path: logs/a.log, sample: 0, sample_errors: 0, headers: [ok, 'bad name'] }",
        );
        let text = problems.join("\n");
        for expected in [
            "access_log.path",
            "access_log.sample:",
            "access_log.sample_errors",
            "access_log.headers[1]",
        ] {
            assert!(text.contains(expected), "{expected} missing from {text}");
        }
    }

    #[test]
    fn request_ids_are_on_by_default_and_trust_only_proxies() {
        let mut p = Problems::default();
        let settings = compile_request_id(None, &mut p).expect("on by default");
        assert_eq!(settings.header.as_str(), "x-request-id");
        assert_eq!(settings.accept, AcceptRequestId::Trusted);
        let raw: RawRequestId = serde_yaml::from_str("{ accept: sometimes }").unwrap();
        compile_request_id(Some(raw), &mut p);
        assert_eq!(
            p.lines(),
            ["request_id.accept: unknown value \"sometimes\": use trusted, always or never"]
        );
        let raw: RawRequestId = serde_yaml::from_str("{ enabled: false }").unwrap();
        assert!(compile_request_id(Some(raw), &mut p).is_none());
    }

    #[test]
    fn tracing_endpoints_must_be_http_and_samples_shares() {
        let raw: RawTracing = serde_yaml::from_str(
            "{ enabled: true, endpoint: 'https://c:4318/v1/traces', sample: 2 }",
        )
        .unwrap();
        let mut p = Problems::default();
        compile_tracing(Some(raw), &mut p);
        let text: Vec<String> = p.0.iter().map(|x| x.to_string()).collect();
        assert!(text[0].contains("tracing.endpoint"), "{text:?}");
        assert!(text[1].contains("tracing.sample"), "{text:?}");
        let raw: RawTracing = serde_yaml::from_str("{ enabled: true }").unwrap();
        let settings = compile_tracing(Some(raw), &mut Problems::default()).unwrap();
        assert_eq!(settings.endpoint, "http://127.0.0.1:4318/v1/traces");
        assert_eq!((settings.sample, &*settings.service_name), (1.0, "sluice"));
    }
}
