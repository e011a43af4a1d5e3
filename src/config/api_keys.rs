//! `identity.api_keys: { file, header }`: where the file of hashed API keys is and which
//! request header presents a key. The file is read when the configuration is compiled, so
//! `sluice -t` checks it and every reload (SIGHUP) reads it again.

use std::sync::Arc;

use http::header::HeaderName;
use serde::Deserialize;

use super::problem::Problems;
use super::sources::Sources;
use crate::caller::api_keys::{ApiKeys, DEFAULT_HEADER};

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKeys {
    /// The file of hashed keys; relative to the directory sluice was started in.
    pub file: Option<String>,
    /// The header a caller presents its key in (default `x-api-key`).
    pub header: Option<String>,
}

/// The section compiled: the keys read from the file, and where a request presents one.
#[derive(Debug, Clone)]
pub struct ApiKeySettings {
    pub header: HeaderName,
    pub keys: Arc<ApiKeys>,
}

/// Compiles `raw` found at `at` (e.g. `identity.api_keys`), reading the key file and checking
/// its plans with `known` (`Err` says why a name is not a plan); every problem is added to `p`,
/// those of the file under `AT.file`.
pub fn compile_api_keys(
    raw: RawApiKeys,
    at: &str,
    known: impl Fn(&str) -> Result<(), String>,
    p: &mut Problems,
    read: &mut Sources,
) -> Option<ApiKeySettings> {
    let header = match raw.header.as_deref().map(str::trim) {
        None => Some(HeaderName::from_static(DEFAULT_HEADER)),
        Some(text) => HeaderName::from_bytes(text.as_bytes())
            .map_err(|_| {
                p.add(
                    format!("{at}.header"),
                    format!("invalid header name {text:?}"),
                )
            })
            .ok(),
    };
    let file_at = format!("{at}.file");
    let Some(file) = raw.file else {
        p.add(file_at, "required: the file of hashed keys");
        return None;
    };
    let file = super::paths::absolute(file);
    let keys = super::api_key_file::compile(&file, &file_at, p, read, known);
    Some(ApiKeySettings {
        header: header?,
        keys: Arc::new(keys?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    const ABC: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn compiled(yaml: &str) -> (Option<ApiKeySettings>, Vec<String>) {
        problems_of(yaml, |raw: RawApiKeys, p: &mut Problems| {
            compile_api_keys(
                raw,
                "identity.api_keys",
                |_| Ok(()),
                p,
                &mut Sources::default(),
            )
        })
    }

    fn key_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.yaml");
        std::fs::write(&file, text).unwrap();
        (dir, file)
    }

    #[test]
    fn the_section_reads_the_file_and_defaults_the_header() {
        let (_dir, file) = key_file(&format!("keys:\n- {{ hash: \"{ABC}\", consumer: acme }}\n"));
        let (settings, problems) = compiled(&format!("file: {}", file.display()));
        assert!(problems.is_empty(), "{problems:?}");
        let settings = settings.unwrap();
        assert_eq!(settings.header, "x-api-key");
        assert_eq!(&**settings.keys.verify(b"abc").unwrap().consumer, "acme");
        let (settings, _) = compiled(&format!("{{ file: {}, header: X-Key }}", file.display()));
        assert_eq!(settings.unwrap().header, "x-key");
    }

    #[test]
    fn a_relative_file_is_taken_from_the_start_directory() {
        let (settings, problems) = compiled("file: no/such/keys.yaml");
        assert!(settings.is_none());
        let shown = super::super::paths::absolute("no/such/keys.yaml");
        assert_eq!(
            problems,
            [format!(
                "identity.api_keys.file: {}: cannot read the file: No such file or directory (os error 2)",
                shown.display()
            )]
        );
    }

    #[test]
    fn a_missing_file_or_a_bad_header_is_reported() {
        let (settings, problems) = compiled("header: \"x api key\"");
        assert!(settings.is_none());
        assert_eq!(
            problems,
            [
                "identity.api_keys.header: invalid header name \"x api key\"",
                "identity.api_keys.file: required: the file of hashed keys",
            ]
        );
    }

    #[test]
    fn problems_of_the_file_are_reported_with_those_of_the_section() {
        let (_dir, file) = key_file("keys:\n- { hash: abc }\n");
        let (settings, problems) =
            compiled(&format!("{{ file: {}, header: \"a b\" }}", file.display()));
        assert!(settings.is_none());
        let shown = file.display();
        assert_eq!(
            problems,
            [
                "identity.api_keys.header: invalid header name \"a b\"".to_string(),
                format!("identity.api_keys.file: {shown}: keys[0].hash: invalid hash \"abc\": expected sha256: and 64 hex digits, as `sluice hash-key` prints"),
                format!("identity.api_keys.file: {shown}: keys[0].consumer: required"),
            ]
        );
    }
}
