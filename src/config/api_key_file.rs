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
//! Every mistake of the file is told in one run, as the configuration's are: a value of the
//! wrong type or an unknown key (with the known key nearest to it) is left out and the file read
//! again (`misfits.rs`), each key is checked field by field, a hash listed twice is found among
//! the keys whose hash reads whatever else is wrong with them, and each plan the file names is
//! kept with its key's index ([`KeyPlan`]) for the identity section to check against the
//! configured plans ([`compile`]), even when the file has other problems.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::misfits;
use super::problem::{Problem, Problems};
use super::sources::Sources;
use crate::caller::api_keys::{check_consumer, ApiKeys, KeyHash, KeysBuilder, NewKey};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeyFile {
    keys: Vec<RawKey>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    hash: Option<String>,
    consumer: Option<String>,
    plan: Option<String>,
    #[serde(default)]
    disabled: bool,
}

/// The file as read: its keys when nothing is wrong with it, every problem (each with its path
/// in the file), and the plan of each key that names a readable one.
#[derive(Debug, Default)]
pub struct KeyFile {
    pub keys: Option<ApiKeys>,
    pub problems: Vec<Problem>,
    pub plans: Vec<KeyPlan>,
}

/// One key's plan as the file writes it (`None`: the default plan), with the key's index and
/// its consumer when that is right: what the plans are checked by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPlan {
    pub index: usize,
    pub consumer: Option<String>,
    pub plan: Option<String>,
}

/// The keys of the file at `path`, or every problem of it (each with its path in the file).
pub fn read(path: &Path, sources: &mut Sources) -> Result<ApiKeys, Vec<Problem>> {
    ok_or_problems(read_all(path, sources))
}

/// The keys of `text`, or every problem of it.
pub fn from_yaml(text: &str) -> Result<ApiKeys, Vec<Problem>> {
    ok_or_problems(from_yaml_all(text))
}

fn ok_or_problems(file: KeyFile) -> Result<ApiKeys, Vec<Problem>> {
    match file.keys {
        Some(keys) if file.problems.is_empty() => Ok(keys),
        _ => Err(file.problems),
    }
}

/// The file at `path` read as far as it reads, with every problem of it.
pub fn read_all(path: &Path, sources: &mut Sources) -> KeyFile {
    match sources.read_to_string(path) {
        Ok(text) => from_yaml_all(&text),
        Err(e) => KeyFile {
            problems: vec![Problem::new("", format!("cannot read the file: {e}"))],
            ..KeyFile::default()
        },
    }
}

/// `text` read as far as it reads, with every problem of it.
pub fn from_yaml_all(text: &str) -> KeyFile {
    let mut p = Problems::default();
    let compiled =
        misfits::read_and_compile(text, &mut p, |raw: RawKeyFile, p| compile_keys(raw.keys, p));
    let (keys, plans) = compiled.unwrap_or_default();
    KeyFile {
        keys: p.is_empty().then_some(keys),
        problems: p.0,
        plans,
    }
}

/// Every key that is right, stored; a problem for each that is not; each key's plan.
fn compile_keys(raw: Vec<RawKey>, p: &mut Problems) -> (ApiKeys, Vec<KeyPlan>) {
    let mut keys = KeysBuilder::default();
    let mut plans = Vec::new();
    let mut first_with: HashMap<KeyHash, usize> = HashMap::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let at = format!("keys[{i}]");
        let key = compile_key(raw, &at, p);
        if let Some(plan) = &key.plan {
            plans.push(KeyPlan {
                index: i,
                consumer: key.consumer.clone(),
                plan: plan.clone(),
            });
        }
        let Some(hash) = key.hash else {
            continue;
        };
        if let Some(earlier) = first_with.get(&hash) {
            p.add(
                format!("{at}.hash"),
                format!("the same hash as keys[{earlier}]: list each key once"),
            );
            continue;
        }
        first_with.insert(hash, i);
        if let (Some(consumer), Some(plan)) = (&key.consumer, &key.plan) {
            let key = NewKey {
                consumer,
                plan: plan.as_deref(),
                disabled: key.disabled,
            };
            // No hash is added twice: the first of each was found above.
            keys.add(hash, key, i);
        }
    }
    (keys.build(), plans)
}

/// One key's fields, each `None` where it is wrong (its problem reported).
struct KeyFields {
    hash: Option<KeyHash>,
    consumer: Option<String>,
    /// The plan as written (`Some(None)`: the default), `None` when it is empty.
    plan: Option<Option<String>>,
    disabled: bool,
}

/// One key of the file, each of its fields checked.
fn compile_key(raw: RawKey, at: &str, p: &mut Problems) -> KeyFields {
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
            None
        }
        plan => Some(plan),
    };
    KeyFields {
        hash,
        consumer,
        plan,
        disabled: raw.disabled,
    }
}

/// Reads the file at `file` into `p`, each of its problems reported at `at` (the configuration
/// key that names the file) as `FILE: PATH: MESSAGE`, and checks the plan of every key that
/// names one it reads, whatever else is wrong with the file: each is one that `known` accepts
/// (`Err` says why not), and the keys of one consumer name one plan.
pub fn compile(
    file: &Path,
    at: &str,
    p: &mut Problems,
    sources: &mut Sources,
    known: impl Fn(&str) -> Result<(), String>,
) -> Option<ApiKeys> {
    let read = read_all(file, sources);
    for problem in read.problems {
        p.add(at, format!("{}: {problem}", file.display()));
    }
    for (i, why) in plan_problems(&read.plans, known) {
        p.add(at, format!("{}: keys[{i}].plan: {why}", file.display()));
    }
    read.keys
}

/// What is wrong with the plans of `keys`, by the index of the key: a plan `known` refuses, or
/// a consumer's key on another plan than the consumer's first key.
fn plan_problems(
    keys: &[KeyPlan],
    known: impl Fn(&str) -> Result<(), String>,
) -> Vec<(usize, String)> {
    let mut problems = Vec::new();
    let mut first: HashMap<&str, (usize, Option<&str>)> = HashMap::new();
    for key in keys {
        let plan = key.plan.as_deref();
        if let Some(Err(why)) = plan.map(&known) {
            problems.push((key.index, why));
            continue;
        }
        let Some(consumer) = key.consumer.as_deref() else {
            continue;
        };
        match first.get(consumer) {
            Some(&(earlier, named)) if named != plan => problems.push((
                key.index,
                format!(
                    "consumer {consumer:?} is on plan {} by keys[{earlier}]: one consumer has one plan",
                    named.unwrap_or("(the default)"),
                ),
            )),
            Some(_) => {}
            None => {
                first.insert(consumer, (key.index, plan));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACME: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    const BOLT: &str = "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    const CARL: &str = "sha256:69bfe1e6e44821df7f8a0927bd7e61ef208fdb25deaa4353450bc3fb904abd52";
    const DORA: &str = "sha256:69db31976ead37b85cc42a49c95fd06eec99cfd9b7ff219a25c0f59cb4049343";

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
            (&**abc.consumer, abc.plan, abc.disabled),
            ("acme", Some("pro"), false)
        );
        let hello = keys.verify(b"hello").unwrap();
        assert_eq!(
            (&**hello.consumer, hello.plan, hello.disabled),
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
                "keys:\n- {{ hash: \"{ACME}\" }}\n- {{ hash: \"{BOLT}\", consumer: \"\" }}\n\
                 - {{ hash: \"{CARL}\", consumer: {long} }}\n- {{ hash: \"{DORA}\", consumer: acme corp }}\n"
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
    fn unknown_keys_are_all_reported_with_the_rules_and_the_nearest_known_key() {
        assert_eq!(
            problems(&format!(
                "key: []\nkeys:\n- {{ hash: \"{ACME}\", consumer: acme, plna: pro }}\n- {{ hash: x, consumer: acme, colour: red }}\n"
            )),
            [
                "key: unknown key: did you mean `keys`?",
                "keys[0].plna: unknown key: did you mean `plan`?",
                "keys[1].colour: unknown key",
                "keys[1].hash: invalid hash \"x\": expected sha256: and 64 hex digits, as `sluice hash-key` prints",
            ]
        );
    }

    #[test]
    fn a_file_that_is_not_a_key_list_is_explained() {
        assert_eq!(
            problems(&format!(
                "keys:\n- {{ hash: \"{ACME}\", consumer: acme, disabled: maybe }}\n- just a string\n- {{ hash: \"{BOLT}\", consumer: bolt }}\n"
            )),
            [
                "keys[0].disabled: expected true or false, got \"maybe\"",
                "keys[1]: expected a table (key: value), got \"just a string\"",
            ]
        );
        assert_eq!(problems("{}"), ["keys: required"]);
        let empty = problems("");
        assert_eq!(empty.len(), 1, "{empty:?}");
        assert_eq!(problems("keys: [").len(), 1, "not YAML");
    }

    #[test]
    fn every_mistake_of_a_file_is_told_in_one_read() {
        let file = from_yaml_all(&format!(
            "keys:\n\
             - {{ hash: \"{ACME}\", consumer: acme, plan: pro, disabled: maybe }}\n\
             - {{ hash: \"{BOLT}\", consumer: acme corp, plan: gold }}\n\
             - {{ hash: \"{ACME}\", consumer: bolt, plan: gold }}\n\
             - {{ hash: abc, consumer: carl, plan: silver }}\n"
        ));
        assert!(file.keys.is_none());
        let told: Vec<String> = file.problems.iter().map(Problem::to_string).collect();
        assert_eq!(
            told,
            [
                "keys[0].disabled: expected true or false, got \"maybe\"",
                "keys[1].consumer: invalid consumer id \"acme corp\": use visible ASCII characters, without spaces",
                "keys[2].hash: the same hash as keys[0]: list each key once",
                "keys[3].hash: invalid hash \"abc\": expected sha256: and 64 hex digits, as `sluice hash-key` prints",
            ]
        );
        let plans: Vec<(usize, Option<&str>, Option<&str>)> = file
            .plans
            .iter()
            .map(|k| (k.index, k.consumer.as_deref(), k.plan.as_deref()))
            .collect();
        assert_eq!(
            plans,
            [
                (0, Some("acme"), Some("pro")),
                (1, None, Some("gold")),
                (2, Some("bolt"), Some("gold")),
                (3, Some("carl"), Some("silver")),
            ],
            "every key's plan is kept for the plans' check, whatever else is wrong with it"
        );
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
            &mut Sources::default(),
            |_| Ok(())
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
            &mut Sources::default(),
            |_| Ok(())
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
    fn plans_are_checked_with_the_callers_rule_even_in_a_file_with_other_problems() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.yaml");
        std::fs::write(
            &file,
            format!(
                "keys:\n\
                 - {{ hash: \"{ACME}\", consumer: acme, plan: gold }}\n\
                 - {{ hash: \"{BOLT}\", consumer: bolt, plan: pro }}\n\
                 - {{ hash: abc, consumer: bolt }}\n\
                 - {{ hash: \"{ACME}\", consumer: acme, plan: silver }}\n"
            ),
        )
        .unwrap();
        let mut p = Problems::default();
        let known = |plan: &str| {
            if plan == "pro" {
                Ok(())
            } else {
                Err(format!("unknown plan {plan:?}: the plans are pro"))
            }
        };
        let keys = compile(
            &file,
            "identity.api_keys.file",
            &mut p,
            &mut Sources::default(),
            known,
        );
        assert!(keys.is_none());
        let shown = file.display();
        assert_eq!(
            p.lines(),
            [
                format!("identity.api_keys.file: {shown}: keys[2].hash: invalid hash \"abc\": expected sha256: and 64 hex digits, as `sluice hash-key` prints"),
                format!("identity.api_keys.file: {shown}: keys[3].hash: the same hash as keys[0]: list each key once"),
                format!("identity.api_keys.file: {shown}: keys[0].plan: unknown plan \"gold\": the plans are pro"),
                format!("identity.api_keys.file: {shown}: keys[2].plan: consumer \"bolt\" is on plan pro by keys[1]: one consumer has one plan"),
                format!("identity.api_keys.file: {shown}: keys[3].plan: unknown plan \"silver\": the plans are pro"),
            ]
        );
    }
}
