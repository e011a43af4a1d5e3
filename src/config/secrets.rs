//! Secret values of the file (`redis.password`, `key_secret`...): written inline, or read from a
//! file, an environment variable or a systemd credential at load (and again at every reload).
//! A problem names where the secret was to come from, never what it is.

use super::problem::Problems;
use super::raw::{RawSecret, RawSecretFrom};
use crate::secret::{Secret, SecretSource};

/// The secret at `at`, read now.
pub fn compile(raw: RawSecret, at: &str, p: &mut Problems) -> Option<Secret> {
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
    source.read().map_err(|reason| p.add(at, reason)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn secret(yaml: &str) -> (Option<Secret>, Vec<String>) {
        problems_of(yaml, |raw: RawSecret, p: &mut Problems| {
            compile(raw, "redis.password", p)
        })
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
