//! The file of hashed API keys (`identity.api_keys.file`): read, checked and compiled into the
//! [`ApiKeys`] store, with every problem named by its path in that file.
//!
//! ```yaml
//! keys:
//!   - hash: "sha256:<64 hex digits>"   # what `sluice hash-key` prints
//!     consumer: acme                    # who the key belongs to
//!     plan: pro                         # optional: else the default plan
//!     disabled: true                    # optional: a revoked key, refused with 403
//! ```
//! Unknown keys are errors, like the configuration's own; plans are kept as written, for the
//! identity section to check against the configured plans ([`check_plans`]).

use std::path::Path;

use serde::Deserialize;

use super::problem::{ignored_path, Problem, Problems};
use super::sources::Sources;
use crate::caller::api_keys::{check_consumer, ApiKey, ApiKeys, KeyHash};

#[derive(Debug, Deserialize)]
struct RawKeyFile {
    keys: Vec<RawKey>,
}

#[derive(Debug, Deserialize)]
struct RawKey {
    hash: Option<String>,
    consumer: Option<String>,
    plan: Option<String>,
    #[serde(default)]
    disabled: bool,
}

/// The keys of the file at `path`, or every problem of it (each with its path in the file).
pub fn read(path: &Path, sources: &mut Sources) -> Result<ApiKeys, Vec<Problem>> {
    let text = sources
        .read_to_string(path)
        .map_err(|e| vec![Problem::new("", format!("cannot read the file: {e}"))])?;
    from_yaml(&text)
}

/// The keys of `text`, or every problem of it.
pub fn from_yaml(text: &str) -> Result<ApiKeys, Vec<Problem>> {
    let mut p = Problems::default();
    let deserializer = serde_yaml::Deserializer::from_str(text);
    let mut unknown_key = |key: serde_ignored::Path<'_>| {
        p.add(ignored_path(&key), "unknown key");
    };
    let raw: Result<RawKeyFile, _> = serde::Deserialize::deserialize(
        serde_ignored::Deserializer::new(deserializer, &mut unknown_key),
    );
    let raw = match raw {
        Ok(raw) => raw,
        Err(e) => {
            p.add("", super::wording::plain_words(&e.to_string()));
            return Err(p.0);
        }
    };
    let keys = compile_keys(raw.keys, &mut p);
    if p.is_empty() {
        Ok(keys)
    } else {
        Err(p.0)
    }
}

/// Every key that is right, stored; a problem for each that is not.
fn compile_keys(raw: Vec<RawKey>, p: &mut Problems) -> ApiKeys {
    let mut keys = ApiKeys::default();
    for (i, raw) in raw.into_iter().enumerate() {
        let at = format!("keys[{i}]");
        let Some((hash, key)) = compile_key(raw, &at, p) else {
            continue;
        };
        if let Err(earlier) = keys.insert(hash, key, i) {
            p.add(
                format!("{at}.hash"),
                format!("the same hash as keys[{earlier}]: list each key once"),
            );
        }
    }
    keys
}

/// One key of the file, or its problems.
fn compile_key(raw: RawKey, at: &str, p: &mut Problems) -> Option<(KeyHash, ApiKey)> {
    let hash = match raw.hash {
        Some(text) => KeyHash::parse(&text)
            .map_err(|e| p.add(format!("{at}.hash"), e))
            .ok(),
        None => {
            p.add(format!("{at}.hash"), "required");
            None
        }
    };
    let consumer = match raw.consumer {
        Some(id) => check_consumer(&id)
            .map(|()| id)
            .map_err(|e| p.add(format!("{at}.consumer"), e))
            .ok(),
        None => {
            p.add(format!("{at}.consumer"), "required");
            None
        }
    };
    let plan = match raw.plan {
        Some(plan) if plan.is_empty() => {
            p.add(
                format!("{at}.plan"),
                "empty: name a plan, or remove it for the default plan",
            );
            return None;
        }
        plan => plan.map(String::into_boxed_str),
    };
    let key = ApiKey {
        consumer: consumer?.into(),
        plan,
        disabled: raw.disabled,
    };
    Some((hash?, key))
}

/// Reads the file at `file` into `p`: each of its problems reported at `at` (the configuration
/// key that names the file), as `FILE: PATH: MESSAGE`.
pub fn compile(file: &Path, at: &str, p: &mut Problems, sources: &mut Sources) -> Option<ApiKeys> {
    match read(file, sources) {
        Ok(keys) => Some(keys),
        Err(problems) => {
            for problem in problems {
                p.add(at, format!("{}: {problem}", file.display()));
            }
            None
        }
    }
}

/// Checks each plan the file names with `known` (`Err` says why the plan is not one), reporting
/// at `at` as [`compile`] does: for the identity section, once the plans are compiled.
pub fn check_plans(
    keys: &ApiKeys,
    file: &Path,
    at: &str,
    p: &mut Problems,
    known: impl Fn(&str) -> Result<(), String>,
) {
    for (i, plan) in keys.plans() {
        if let Err(why) = known(plan) {
            p.add(at, format!("{}: keys[{i}].plan: {why}", file.display()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACME: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    const BOLT: &str = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    fn problems(yaml: &str) -> Vec<String> {
        match from_yaml(yaml) {
            Ok(keys) => panic!("{} keys read from a wrong file", keys.len()),
            Err(problems) => problems.iter().map(Problem::to_string).collect(),
        }
    }

    #[test]
    fn a_right_file_is_read_with_every_field() {
        let keys = from_yaml(&format!(
            "keys:\n\
             - {{ hash: \"{ACME}\", consumer: acme, plan: pro }}\n\
             - {{ hash: \"{BOLT}\", consumer: acme, disabled: true }}\n"
        ))
        .unwrap();
        let abc = keys.verify(b"abc").unwrap();
        assert_eq!(
            (&*abc.consumer, abc.plan.as_deref(), abc.disabled),
            ("acme", Some("pro"), false)
        );
        let hello = keys.verify(b"hello").unwrap();
        assert_eq!(
            (&*hello.consumer, hello.plan.as_deref(), hello.disabled),
            ("acme", None, true)
        );
        assert!(from_yaml("keys: []").unwrap().is_empty());
    }

    #[test]
    fn malformed_hashes_are_named_by_their_path() {
        assert_eq!(
            problems("keys:\n- { hash: abc, consumer: acme }\n- { hash: \"sha256:00\", consumer: acme }\n"),
            [
                "keys[0].hash: invalid hash \"abc\": expected sha256: and 64 hex digits, as `sluice hash-key` prints",
                "keys[1].hash: invalid hash \"sha256:00\": expected sha256: and 64 hex digits, as `sluice hash-key` prints",
            ]
        );
    }

    #[test]
    fn a_hash_listed_twice_names_the_first() {
        assert_eq!(
            problems(&format!(
                "keys:\n- {{ hash: \"{ACME}\", consumer: acme }}\n- {{ hash: \"{BOLT}\", consumer: bolt }}\n- {{ hash: \"{}\", consumer: other }}\n",
                ACME.to_uppercase().replace("SHA256", "sha256")
            )),
            ["keys[2].hash: the same hash as keys[0]: list each key once"]
        );
    }

    #[test]
    fn consumers_must_be_given_and_bounded() {
        let long = "c".repeat(129);
        assert_eq!(
            problems(&format!(
                "keys:\n- {{ hash: \"{ACME}\" }}\n- {{ hash: \"{ACME}\", consumer: \"\" }}\n\
                 - {{ hash: \"{ACME}\", consumer: {long} }}\n- {{ hash: \"{ACME}\", consumer: acme corp }}\n"
            )),
            [
                "keys[0].consumer: required",
                "keys[1].consumer: empty: name the consumer",
                "keys[2].consumer: 129 bytes: a consumer id has at most 128",
                "keys[3].consumer: invalid consumer id \"acme corp\": use visible ASCII characters, without spaces",
            ]
        );
    }

    #[test]
    fn a_key_without_hash_or_with_an_empty_plan_is_refused() {
        assert_eq!(
            problems(&format!(
                "keys:\n- {{ consumer: acme }}\n- {{ hash: \"{ACME}\", consumer: acme, plan: \"\" }}\n"
            )),
            [
                "keys[0].hash: required",
                "keys[1].plan: empty: name a plan, or remove it for the default plan",
            ]
        );
    }

    #[test]
    fn unknown_keys_are_all_reported_with_the_rules() {
        assert_eq!(
            problems(&format!(
                "key: []\nkeys:\n- {{ hash: \"{ACME}\", consumer: acme, plna: pro }}\n- {{ hash: x, consumer: acme }}\n"
            )),
            [
                "key: unknown key",
                "keys[0].plna: unknown key",
                "keys[1].hash: invalid hash \"x\": expected sha256: and 64 hex digits, as `sluice hash-key` prints",
            ]
        );
    }

    #[test]
    fn a_file_that_is_not_a_key_list_is_explained() {
        let wrong_type = problems(&format!(
            "keys:\n- {{ hash: \"{ACME}\", consumer: acme, disabled: maybe }}\n"
        ));
        assert_eq!(wrong_type.len(), 1);
        assert!(
            wrong_type[0].starts_with("keys[0].disabled: invalid type: string \"maybe\""),
            "{wrong_type:?}"
        );
        let missing = problems("{}");
        assert!(missing[0].contains("missing field `keys`"), "{missing:?}");
        let empty = problems("");
        assert_eq!(empty.len(), 1, "{empty:?}");
    }

    #[test]
    fn problems_are_reported_under_the_configuration_key_with_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.yaml");
        std::fs::write(&file, "keys:\n- { hash: abc, consumer: acme }\n").unwrap();
        let mut p = Problems::default();
        assert!(compile(
            &file,
            "identity.api_keys.file",
            &mut p,
            &mut Sources::default()
        )
        .is_none());
        assert_eq!(
            p.lines(),
            [format!(
                "identity.api_keys.file: {}: keys[0].hash: invalid hash \"abc\": expected sha256: and 64 hex digits, as `sluice hash-key` prints",
                file.display()
            )]
        );
        let missing = dir.path().join("absent.yaml");
        let mut p = Problems::default();
        assert!(compile(
            &missing,
            "identity.api_keys.file",
            &mut p,
            &mut Sources::default()
        )
        .is_none());
        assert_eq!(
            p.lines(),
            [format!(
                "identity.api_keys.file: {}: cannot read the file: No such file or directory (os error 2)",
                missing.display()
            )]
        );
    }

    #[test]
    fn plans_are_checked_with_the_callers_rule() {
        let keys = from_yaml(&format!(
            "keys:\n- {{ hash: \"{ACME}\", consumer: acme, plan: gold }}\n- {{ hash: \"{BOLT}\", consumer: bolt, plan: pro }}\n"
        ))
        .unwrap();
        let mut p = Problems::default();
        check_plans(
            &keys,
            Path::new("/k.yaml"),
            "identity.api_keys.file",
            &mut p,
            |plan| {
                if plan == "pro" {
                    Ok(())
                } else {
                    Err(format!("unknown plan {plan:?}: the plans are pro"))
                }
            },
        );
        assert_eq!(
            p.lines(),
            ["identity.api_keys.file: /k.yaml: keys[0].plan: unknown plan \"gold\": the plans are pro"]
        );
    }
}
