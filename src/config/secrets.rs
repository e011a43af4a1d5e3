//! Secret values of the file (`redis.password`, `key_secret`...): written inline, or read from a
//! file, an environment variable or a systemd credential at load (and again at every reload).
//! A problem names where the secret was to come from, never what it is.

use super::problem::Problems;
use super::raw::{RawSecret, RawSecretFrom};
use std::path::{Path, PathBuf};

use super::sources::Sources;
use crate::limiter::Secret;

/// The secret at `at`, read now.
pub fn compile(raw: RawSecret, at: &str, p: &mut Problems, read: &mut Sources) -> Option<Secret> {
    let source = match raw {
        RawSecret::Plain(value) if value.is_empty() => {
            p.add(at, "empty: remove it, or give a value");
            return None;
        }
        RawSecret::Plain(value) => SecretSource::Inline(Secret::new(value)),
        RawSecret::From(RawSecretFrom {
            file,
            env,
            credential,
        }) => match (file, env, credential) {
            (Some(file), None, None) => SecretSource::File(super::paths::absolute(file)),
            (None, Some(env), None) => SecretSource::Env(env),
            (None, None, Some(credential)) => SecretSource::Credential(credential),
            _ => {
                p.add(
                    at,
                    "give exactly one of { file: PATH }, { env: NAME } or { credential: NAME }",
                );
                return None;
            }
        },
    };
    source.read(read).map_err(|reason| p.add(at, reason)).ok()
}

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
    pub fn read(&self, read: &mut Sources) -> Result<Secret, String> {
        match self {
            SecretSource::Inline(secret) => Ok(secret.clone()),
            SecretSource::File(path) => read_file(path, read),
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
                read_file(&Path::new(&directory).join(name), read)
            }
        }
    }
}

fn read_file(path: &Path, read: &mut Sources) -> Result<Secret, String> {
    let mut text = read
        .read_to_string(path)
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
    use crate::config::problem::problems_of;

    fn secret(yaml: &str) -> (Option<Secret>, Vec<String>) {
        problems_of(yaml, |raw: RawSecret, p: &mut Problems| {
            compile(raw, "redis.password", p, &mut Sources::default())
        })
    }

    #[test]
    fn a_secret_source_never_prints_its_secret() {
        let secret = Secret::new("hunter2");
        assert_eq!(
            format!("{:?}", SecretSource::Inline(secret.clone())),
            "Inline(***)"
        );
    }

    #[test]
    fn files_lose_one_trailing_newline_and_errors_name_the_place_not_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret\n").unwrap();
        let read = SecretSource::File(path.clone())
            .read(&mut Sources::default())
            .unwrap();
        assert_eq!(read.expose(), "s3cret");
        std::fs::write(&path, "").unwrap();
        assert!(SecretSource::File(path)
            .read(&mut Sources::default())
            .unwrap_err()
            .ends_with("is empty"));
        let missing = SecretSource::Env("SLUICE_TEST_NO_SUCH_VARIABLE".into())
            .read(&mut Sources::default())
            .unwrap_err();
        assert!(missing.starts_with("environment variable SLUICE_TEST_NO_SUCH_VARIABLE"));
        assert!(SecretSource::Credential("../x".into())
            .read(&mut Sources::default())
            .unwrap_err()
            .starts_with("invalid credential name"));
    }

    #[test]
    fn a_secret_comes_inline_or_from_a_file_or_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "from-a-file\n").unwrap();
        assert_eq!(
            secret(&format!("{{ file: {} }}", path.display()))
                .0
                .unwrap()
                .expose(),
            "from-a-file"
        );
        assert_eq!(secret("inline").0.unwrap().expose(), "inline");
        std::env::set_var("SLUICE_TEST_SECRET", "from-the-env");
        assert_eq!(
            secret("{ env: SLUICE_TEST_SECRET }").0.unwrap().expose(),
            "from-the-env"
        );
    }

    #[test]
    fn a_secret_that_cannot_be_had_is_named_by_where_it_was_to_come_from() {
        let (_, problems) = secret("{ file: /nonexistent/pw }");
        assert!(
            problems[0].starts_with("redis.password: cannot read /nonexistent/pw"),
            "{problems:?}"
        );
        let (_, problems) = secret("{ file: a, env: B }");
        assert_eq!(
            problems,
            ["redis.password: give exactly one of { file: PATH }, { env: NAME } or { credential: NAME }"]
        );
        let unknown = serde_yaml::from_str::<RawSecret>("{ flie: a }").unwrap_err();
        assert!(
            unknown.to_string().contains("unknown field `flie`"),
            "{unknown}"
        );
    }
}
