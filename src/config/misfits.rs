//! Reading a file whose values have the wrong types (`listen: 5`, `rate: [1]`, `retries: -1`)
//! so that every one of them is reported in one run, and everything else is still read and
//! compiled: serde stops at the first misfit, so the file is read again without the value it
//! stopped at, until it reads. Each misfit is a problem at its YAML path in an operator's words
//! (`expected a whole number ≥ 0, got -1`: `wording.rs`); compile then reads it as a key not
//! written, and what compile says at or under its path (`rate: required`) follows from the
//! misfit and is dropped ([`Misfits::follows`]). A misfit inside a list of tables (a route that is
//! a string) leaves an empty table in its place, so the items after it keep their positions.
//! A key a table does not know is a misfit too (every table denies unknown keys), told with the
//! known key nearest to it (`wording.rs`). Any file read into serde structs is read so: the
//! configuration, and the file of API keys (`api_key_file.rs`).

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use super::problem::{self, Problems};
use super::wording;

/// Misfits reported at most before the file is given up on.
const MAX_MISFITS: usize = 200;

/// A file as read: its raw model, and the values left out as misfits.
pub struct Read<T> {
    pub raw: T,
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

/// Reads `text` into a `T` as [`read`] does, and compiles what reads with `compile`: what
/// compile says at or under a misfit's path (`rate: required` of a `rate` of the wrong type)
/// follows from the misfit, which is the problem, and is dropped. `None` when nothing reads.
pub fn read_and_compile<T: DeserializeOwned, C>(
    text: &str,
    p: &mut Problems,
    compile: impl FnOnce(T, &mut Problems) -> C,
) -> Option<C> {
    let read = read(text, p)?;
    let before = p.0.len();
    let compiled = compile(read.raw, p);
    let said = p.0.split_off(before);
    let misfits = read.misfits;
    p.0.extend(said.into_iter().filter(|x| !misfits.follows(&x.path)));
    Some(compiled)
}

/// Reads `text`, reporting its unknown keys and every misfit to `p`; `None` when it is not YAML
/// (the syntax error reported) or has more misfits than are worth telling.
pub fn read<T: DeserializeOwned>(text: &str, p: &mut Problems) -> Option<Read<T>> {
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

/// Deserializes `text` with the path of what stops it; each key a table ignores (none does:
/// they deny unknown keys, which are misfits) is added to `p` once the whole text reads.
fn attempt<T: DeserializeOwned>(
    text: &str,
    p: &mut Problems,
) -> Result<T, serde_path_to_error::Error<serde_yaml::Error>> {
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

    /// A table of one key, for what a file that does not read says.
    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Shape {
        routes: Option<Vec<String>>,
    }

    fn problems(text: &str) -> (Option<Read<Shape>>, Vec<(String, String)>) {
        let mut p = Problems::default();
        let read = read(text, &mut p);
        let told = p.0.into_iter().map(|x| (x.path, x.message)).collect();
        (read, told)
    }

    #[test]
    fn a_file_that_is_not_yaml_is_told_once() {
        let (read, told) = problems("routes: [\n");
        assert!(read.is_none());
        assert_eq!(told.len(), 1);
    }
}
