//! Configuration: read one YAML file, compile it into validated types, report every problem.
//!
//! `raw.rs` describes the file; `compile.rs` turns it into a [`Config`] whose values cannot be
//! wrong, one module per section (`server`, `redis`, `routes`, `upstreams`, `limits`, `rls` and
//! the rate limit service's own files, `rls_files`, `api_keys` and its file of hashed keys,
//! `api_key_file`); `choice.rs` holds the one name table of each
//! closed choice (algorithms, modes, ...). Unknown keys, unknown names of a choice, and problems
//! found while compiling are all reported together, each with the file and the YAML path; type
//! errors too, with their line and column: when serde stops at one, each section (and each
//! route) is read alone (`sections.rs`), and what reads is compiled.

pub mod addresses;
pub mod api_key_file;
pub mod api_keys;
pub mod choice;
pub mod compile;
pub mod identity;
pub mod jwt;
pub mod limits;
pub mod listeners;
pub mod model;
pub mod observe;
pub mod paths;
pub mod problem;
pub mod rate;
pub mod raw;
pub mod redis;
pub mod rls;
pub mod rls_files;
pub mod routes;
pub mod secrets;
pub mod sections;
pub mod server;
pub mod tiers;
pub mod upstreams;
pub mod wording;

use std::path::Path;

pub use model::Config;
pub use problem::{ConfigError, Problem, Problems};
pub use redis::RedisSettings;
pub use server::ServerSettings;

impl Config {
    /// Reads and compiles `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        all_or_error(path, Config::load_all(path))
    }

    /// Reads and compiles what of `path` compiles, with every problem found: what `sluice -t`
    /// checks further. No config when the file cannot be read or is not YAML.
    pub fn load_all(path: &Path) -> (Option<Config>, Vec<Problem>) {
        match crate::sources::read_to_string(path) {
            Ok(text) => Config::compile_text(path, &text),
            Err(e) => (
                None,
                vec![Problem::new("", format!("cannot read the file: {e}"))],
            ),
        }
    }

    /// Compiles `text`; `path` names the source in errors.
    pub fn from_yaml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        all_or_error(path, Config::compile_text(path, text))
    }

    /// What of `text` compiles, and every problem found.
    fn compile_text(path: &Path, text: &str) -> (Option<Config>, Vec<Problem>) {
        let mut problems = Problems::default();
        let Some(raw) = read(text, &mut problems) else {
            return (None, problems.0);
        };
        let config = compile::compile_all(path, raw, &mut problems);
        (Some(config), problems.0)
    }
}

/// The config when nothing is wrong with it, else every problem of `file`.
pub fn all_or_error(
    file: &Path,
    (config, problems): (Option<Config>, Vec<Problem>),
) -> Result<Config, ConfigError> {
    match config {
        Some(config) if problems.is_empty() => Ok(config),
        _ => Err(ConfigError {
            file: file.to_path_buf(),
            problems,
        }),
    }
}

/// The file's YAML as written; unknown keys and type errors added to `p`. A type error stops
/// serde: then each section is read alone (`sections.rs`) so that all of them are reported.
fn read(text: &str, p: &mut Problems) -> Option<raw::RawConfig> {
    let first_error = match read_noting_unknown(text, p) {
        Ok(raw) => return Some(raw),
        Err(e) => e,
    };
    let Some((readable, positions)) = sections::read_by_section(text, p) else {
        // serde_yaml's message already starts with the YAML path and ends with the line.
        p.add("", wording::plain_words(&first_error.to_string()));
        return None;
    };
    let mut raw = match read_noting_unknown(&readable, p) {
        Ok(raw) => raw,
        Err(e) => {
            p.add("", wording::plain_words(&e.to_string()));
            return None;
        }
    };
    raw.route_positions = positions.unwrap_or_default();
    Some(raw)
}

/// Deserializes `text`, adding each unknown key to `p` (only when the whole text reads).
fn read_noting_unknown(text: &str, p: &mut Problems) -> Result<raw::RawConfig, serde_yaml::Error> {
    let mut unknown = Problems::default();
    let deserializer = serde_yaml::Deserializer::from_str(text);
    let mut unknown_key = |key: serde_ignored::Path<'_>| {
        unknown.add(problem::ignored_path(&key), "unknown key");
    };
    let ignored = serde_ignored::Deserializer::new(deserializer, &mut unknown_key);
    let raw = serde::Deserialize::deserialize(ignored)?;
    p.0.append(&mut unknown.0);
    Ok(raw)
}
