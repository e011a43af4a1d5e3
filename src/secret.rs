//! Secrets (the Redis password, the key secret): values that are used but never shown. A
//! [`Secret`] prints as `***` whatever formats it, and the configuration reads one from the file
//! itself, a file, an environment variable, or a systemd credential (`LoadCredential=`, found in
//! `$CREDENTIALS_DIRECTORY`), so the YAML can stay readable while the secret is not.

use std::fmt;
use std::path::{Path, PathBuf};

/// A value that is used, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the one place that needs it (a connection, a hash key).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// Written in the configuration file.
    Inline(Secret),
    /// The contents of a file (one trailing newline removed).
    File(PathBuf),
    /// An environment variable of the process.
    Env(String),
    /// A systemd credential: `$CREDENTIALS_DIRECTORY/<name>`.
    Credential(String),
}

impl SecretSource {
    /// Reads the secret; `Err` says why it cannot be had, never what it is.
    pub fn read(&self) -> Result<Secret, String> {
        match self {
            SecretSource::Inline(secret) => Ok(secret.clone()),
            SecretSource::File(path) => read_file(path),
            SecretSource::Env(name) => std::env::var(name)
                .map(Secret::new)
                .map_err(|e| format!("environment variable {name}: {e}")),
            SecretSource::Credential(name) => {
                if name.is_empty() || name.contains('/') {
                    return Err(format!(
                        "invalid credential name {name:?}: the name given to LoadCredential="
                    ));
                }
                let directory = std::env::var_os("CREDENTIALS_DIRECTORY").ok_or_else(|| {
                    format!("credential {name:?}: $CREDENTIALS_DIRECTORY is not set (systemd sets it with LoadCredential=)")
                })?;
                read_file(&Path::new(&directory).join(name))
            }
        }
    }
}

fn read_file(path: &Path) -> Result<Secret, String> {
    let mut text = crate::sources::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(Secret::new(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("hunter2");
        assert_eq!(format!("{secret} {secret:?}"), "*** ***");
        assert_eq!(
            format!("{:?}", SecretSource::Inline(secret.clone())),
            "Inline(***)"
        );
        assert_eq!(secret.expose(), "hunter2");
    }

    #[test]
    fn files_lose_one_trailing_newline_and_errors_name_the_place_not_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret\n").unwrap();
        let read = SecretSource::File(path.clone()).read().unwrap();
        assert_eq!(read.expose(), "s3cret");
        std::fs::write(&path, "").unwrap();
        assert!(SecretSource::File(path)
            .read()
            .unwrap_err()
            .ends_with("is empty"));
        let missing = SecretSource::Env("SLUICE_TEST_NO_SUCH_VARIABLE".into())
            .read()
            .unwrap_err();
        assert!(missing.starts_with("environment variable SLUICE_TEST_NO_SUCH_VARIABLE"));
        assert!(SecretSource::Credential("../x".into())
            .read()
            .unwrap_err()
            .starts_with("invalid credential name"));
    }
}
