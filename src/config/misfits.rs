//! Reading a file whose values have the wrong types (`listen: 5`, `rate: [1]`, `retries: -1`)
//! so that every one of them is reported in one run, and everything else is still read and
//! compiled: serde stops at the first misfit, so the file is read again without the value it
//! stopped at, until it reads. Each misfit is a problem at its YAML path in an operator's words
//! (`expected a whole number ≥ 0, got -1`: `wording.rs`); compile then reads it as a key not
//! written, and what compile says at or under its path (`rate: required`) follows from the
//! misfit and is dropped ([`Read::follows`]). A misfit inside a list of tables (a route that is
//! a string) leaves an empty table in its place, so the items after it keep their positions.

use serde_yaml::Value;

use super::problem::{self, Problems};
use super::raw::RawConfig;
use super::wording;

/// Misfits reported at most before the file is given up on.
const MAX_MISFITS: usize = 200;

/// A file as read: its raw model, and the values left out as misfits.
pub struct Read {
    pub raw: RawConfig,
    pub misfits: Misfits,
}

/// The paths of the values left out as misfits.
#[derive(Debug, Default)]
pub struct Misfits(Vec<String>);

impl Misfits {
    /// A problem at `path` follows from a misfit at or above it.
    pub fn follows(&self, path: &str) -> bool {
        self.0.iter().any(|misfit| under(path, misfit))
    }
}

/// `path` is `at` or below it (`at.key`, `at[i]`).
fn under(path: &str, at: &str) -> bool {
    path.strip_prefix(at)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        || at.is_empty()
}

/// Reads `text`, reporting its unknown keys and every misfit to `p`; `None` when it is not YAML
/// (the syntax error reported) or has more misfits than are worth telling.
pub fn read(text: &str, p: &mut Problems) -> Option<Read> {
    let mut misfits = Misfits::default();
    let first = match attempt(text, p) {
        Ok(raw) => return Some(Read { raw, misfits }),
        Err(error) => error,
    };
    let mut value: Value = match serde_yaml::from_str(text) {
        Ok(value) => value,
        // Not YAML (or a number no YAML value holds): what stopped the first read is all
        // there is to tell.
        Err(_) => {
            let (path, message) = wording::misfit(&first);
            p.add(path, message);
            return None;
        }
    };
    let mut error = first;
    for _ in 0..MAX_MISFITS {
        let (path, message) = wording::misfit(&error);
        let removed = remove(&mut value, error.path());
        p.add(path.clone(), message);
        if !removed {
            return None;
        }
        misfits.0.push(path);
        let text = serde_yaml::to_string(&value).ok()?;
        match attempt(&text, p) {
            Ok(raw) => return Some(Read { raw, misfits }),
            Err(next) => error = next,
        }
    }
    p.add(
        "",
        format!("more than {MAX_MISFITS} values of the wrong type"),
    );
    None
}

/// Deserializes `text` with the path of what stops it; each unknown key is added to `p` once
/// the whole text reads.
fn attempt(
    text: &str,
    p: &mut Problems,
) -> Result<RawConfig, serde_path_to_error::Error<serde_yaml::Error>> {
    let mut unknown = Problems::default();
    let deserializer = serde_yaml::Deserializer::from_str(text);
    let mut unknown_key = |key: serde_ignored::Path<'_>| {
        unknown.add(problem::ignored_path(&key), "unknown key");
    };
    let ignored = serde_ignored::Deserializer::new(deserializer, &mut unknown_key);
    let raw = serde_path_to_error::deserialize(ignored)?;
    p.0.append(&mut unknown.0);
    Ok(raw)
}

/// Takes the value at `path` out of `value`: a key from its table, an item of a list of tables
/// replaced by an empty table (the later items keep their positions), any other item removed.
/// `false` when nothing is there to take (the misfit is the whole file, or the path is lost).
fn remove(value: &mut Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut node = value;
    for segment in parents {
        node = match (segment, node) {
            (Segment::Map { key }, Value::Mapping(map)) => match map.get_mut(key.as_str()) {
                Some(child) => child,
                None => return false,
            },
            (Segment::Seq { index }, Value::Sequence(items)) => match items.get_mut(*index) {
                Some(child) => child,
                None => return false,
            },
            (Segment::Enum { .. } | Segment::Unknown, node) => node,
            _ => return false,
        };
    }
    match (last, node) {
        (Segment::Map { key }, Value::Mapping(map)) => map.shift_remove(key.as_str()).is_some(),
        (Segment::Seq { index }, Value::Sequence(items)) if *index < items.len() => {
            if items.iter().any(Value::is_mapping) {
                items[*index] = Value::Mapping(serde_yaml::Mapping::new());
            } else {
                items.remove(*index);
            }
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> (Option<Read>, Vec<(String, String)>) {
        let mut p = Problems::default();
        let read = read(text, &mut p);
        let told = p.0.into_iter().map(|x| (x.path, x.message)).collect();
        (read, told)
    }

    #[test]
    fn every_misfit_of_one_route_is_told_in_one_read() {
        let text = "routes:\n  - name: a\n    limiter_timeout_ms: fast\n    shadow: [1]\n    upstream: { servers: [127.0.0.1:1], retries: -1 }\n    limits:\n      - { name: l, rate: 1/s, burst: 1.5 }\n      - { name: m, rate: [1] }\n  - name: b\n";
        let (read, told) = problems(text);
        let told: std::collections::BTreeMap<String, String> = told.into_iter().collect();
        let paths: Vec<&str> = told.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "routes[0].limiter_timeout_ms",
                "routes[0].limits[0].burst",
                "routes[0].limits[1].rate",
                "routes[0].shadow",
                "routes[0].upstream.retries",
            ]
        );
        assert_eq!(
            told["routes[0].upstream.retries"],
            "expected a whole number ≥ 0, got -1"
        );
        assert_eq!(
            told["routes[0].limits[0].burst"],
            "expected a whole number ≥ 0, got 1.5 (a decimal)"
        );
        let read = read.expect("the rest reads");
        assert_eq!(read.raw.routes.len(), 2, "both routes kept");
        assert_eq!(read.raw.routes[0].limits.len(), 2, "both limits kept");
        assert!(read.misfits.follows("routes[0].limits[1].rate"));
        assert!(!read.misfits.follows("routes[0].limits[1].name"));
        assert!(!read.misfits.follows("routes[0].limiter_timeout_msx"));
    }

    #[test]
    fn a_route_of_the_wrong_shape_keeps_the_others_in_place() {
        let (read, told) = problems("routes:\n  - just a string\n  - name: b\n");
        assert_eq!(
            told,
            [(
                "routes[0]".to_string(),
                "expected a table (key: value), got \"just a string\"".to_string()
            )]
        );
        let read = read.expect("the rest reads");
        assert_eq!(read.raw.routes.len(), 2);
        assert_eq!(read.raw.routes[1].name.as_deref(), Some("b"));
    }

    #[test]
    fn a_file_that_is_not_yaml_is_told_once() {
        let (read, told) = problems("routes: [\n");
        assert!(read.is_none());
        assert_eq!(told.len(), 1);
    }
}
