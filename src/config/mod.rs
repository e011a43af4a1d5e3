//! Configuration: read one YAML file, compile it into validated types, report every problem.
//!
//! `raw.rs` describes the file; `compile.rs` turns it into a [`Config`] whose values cannot be
//! wrong, one module per section (`server`, `redis`, `routes`, `upstreams`, `limits`, `rls` and
//! the rate limit service's own files, `rls_files`); `choice.rs` holds the one name table of each
//! closed choice (algorithms, modes, ...). Unknown keys, unknown names of a choice, and problems
//! found while compiling are all reported together, each with the file and the YAML path; a type
//! error stops parsing at the first one (serde cannot go on), with its path, line and column.

pub mod addresses;
pub mod choice;
pub mod compile;
pub mod limits;
pub mod listeners;
pub mod model;
pub mod observe;
pub mod problem;
pub mod rate;
pub mod raw;
pub mod redis;
pub mod rls;
pub mod rls_files;
pub mod routes;
pub mod secrets;
pub mod server;
pub mod upstreams;

use std::path::Path;

pub use model::Config;
pub use problem::{ConfigError, Problem, Problems};
pub use redis::RedisSettings;
pub use server::ServerSettings;

impl Config {
    /// Reads and compiles `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::single(path, "", format!("cannot read the file: {e}")))?;
        Config::from_yaml(path, &text)
    }

    /// Compiles `text`; `path` names the source in errors.
    pub fn from_yaml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut problems = Problems::default();
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let mut unknown_key = |unknown: serde_ignored::Path<'_>| {
            problems.add(format_ignored(&unknown), "unknown key");
        };
        let ignored = serde_ignored::Deserializer::new(deserializer, &mut unknown_key);
        let raw: raw::RawConfig = match serde::Deserialize::deserialize(ignored) {
            Ok(raw) => raw,
            // serde_yaml's message already starts with the YAML path and ends with the line.
            Err(e) => return Err(ConfigError::single(path, "", e.to_string())),
        };
        let compiled = compile::compile(path, raw, &mut problems);
        match compiled {
            Some(config) if problems.is_empty() => Ok(config),
            _ => Err(ConfigError {
                file: path.to_path_buf(),
                problems: problems.0,
            }),
        }
    }
}

fn format_ignored(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", format_ignored(parent)),
        P::Map { parent, key } => {
            let parent = format_ignored(parent);
            if parent.is_empty() {
                key.to_string()
            } else {
                format!("{parent}.{key}")
            }
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            format_ignored(parent)
        }
    }
}
