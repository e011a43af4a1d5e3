//! What is wrong with a configuration file: every problem with its YAML path, collected while
//! compiling so that all of them are reported at once.

use std::fmt;
use std::path::{Path, PathBuf};

/// One thing wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// YAML path such as `routes[0].limits[1].rate`; empty for the whole file.
    pub path: String,
    pub message: String,
}

impl Problem {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// The problems found so far; compile steps add to it and go on.
#[derive(Debug, Default)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem::new(path, message));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every problem as `path: message`, for tests.
    pub fn lines(&self) -> Vec<String> {
        self.0.iter().map(Problem::to_string).collect()
    }
}

/// Every problem found in one file.
#[derive(Debug, Clone)]
pub struct ConfigError {
    pub file: PathBuf,
    pub problems: Vec<Problem>,
}

impl ConfigError {
    pub fn single(file: &Path, path: &str, message: String) -> ConfigError {
        ConfigError {
            file: file.to_path_buf(),
            problems: vec![Problem::new(path, message)],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {problem}", self.file.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// The YAML path of a key `serde_ignored` reports, as problems name paths.
pub fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        P::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() {
                key.to_string()
            } else {
                format!("{parent}.{key}")
            }
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            ignored_path(parent)
        }
    }
}

/// Most characters of a name; names end up in Redis keys and response headers.
const MAX_NAME_LEN: usize = 64;

/// Names end up in Redis keys and response headers: a short, safe alphabet, no braces.
pub fn check_name(name: &str, at: &str, p: &mut Problems) -> bool {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !ok {
        p.add(
            at,
            format!("invalid name {name:?}: use 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 _ . -"),
        );
    }
    ok
}

/// A name that must be given (`required`) and valid ([`check_name`]).
pub fn required_name(name: Option<String>, at: &str, p: &mut Problems) -> Option<String> {
    match name {
        Some(name) => check_name(&name, at, p).then_some(name),
        None => {
            p.add(at, "required");
            None
        }
    }
}

/// A number within `range`, or a problem at `at`.
pub fn within(
    value: u64,
    range: std::ops::RangeInclusive<u64>,
    at: &str,
    p: &mut Problems,
) -> Option<u64> {
    bounded(value, range, "", at, p)
}

/// A duration in milliseconds within `range`, or a problem at `at`.
pub fn millis_within(
    ms: u64,
    range: std::ops::RangeInclusive<u64>,
    at: &str,
    p: &mut Problems,
) -> Option<std::time::Duration> {
    bounded(ms, range, " ms", at, p).map(std::time::Duration::from_millis)
}

/// `value` within `range`, or a problem at `at` that gives the range in `unit`.
fn bounded(
    value: u64,
    range: std::ops::RangeInclusive<u64>,
    unit: &str,
    at: &str,
    p: &mut Problems,
) -> Option<u64> {
    if range.contains(&value) {
        return Some(value);
    }
    p.add(
        at,
        format!(
            "must be between {} and {}{unit}, got {value}",
            range.start(),
            range.end()
        ),
    );
    None
}

/// Compiles one section from YAML and returns its problems as `path: message` lines: the
/// fixture style of the section tests.
#[cfg(test)]
pub fn problems_of<R: serde::de::DeserializeOwned, T>(
    yaml: &str,
    compile: impl FnOnce(R, &mut Problems) -> T,
) -> (T, Vec<String>) {
    let raw: R = serde_yaml::from_str(yaml).expect("the fixture parses");
    let mut problems = Problems::default();
    let compiled = compile(raw, &mut problems);
    (compiled, problems.lines())
}
