//! Configuration: read one YAML file, compile it into validated types, report every problem.
//!
//! `raw.rs` describes the file; `compile.rs` turns it into a [`Config`] whose values cannot be
//! wrong, one module per section (`server`, `redis`, `routes`, `upstreams`, `limits`, `rls` and
//! the rate limit service's own files, `rls_files`, `api_keys` and its file of hashed keys,
//! `api_key_file`); `choice.rs` holds the one name table of each
//! closed choice (algorithms, modes, ...). Unknown keys, unknown names of a choice, values of
//! the wrong type and problems found while compiling are all reported together, each with the
//! file and the YAML path: when serde stops at a value of the wrong type, the file is read again
//! without it (`misfits.rs`), and what reads is compiled. A reload compiles the file with the
//! `redis:` settings in force ([`Config::reload`]); what it changes that waits for a graceful
//! upgrade is `pending.rs`'s.

pub(crate) mod adaptive;
pub(crate) mod addresses;
pub mod api_key_file;
pub(crate) mod api_keys;
pub(crate) mod choice;
pub(crate) mod common;
pub(crate) mod compile;
pub(crate) mod identity;
pub(crate) mod jwt;
pub(crate) mod limits;
pub(crate) mod listeners;
pub(crate) mod misfits;
pub(crate) mod model;
pub(crate) mod observe;
#[cfg(test)]
mod override_tiers;
pub mod paths;
pub(crate) mod pending;
pub(crate) mod problem;
pub(crate) mod rate;
pub(crate) mod raw;
pub(crate) mod redis;
pub(crate) mod regions;
pub(crate) mod rls;
pub(crate) mod rls_files;
pub(crate) mod routes;
pub(crate) mod secrets;
pub(crate) mod server;
pub(crate) mod sources;
pub(crate) mod tiers;
pub(crate) mod upstreams;
pub(crate) mod wording;

use std::path::Path;

use compile::InForce;
pub use model::Config;
pub use pending::PendingChange;
pub use problem::{ConfigError, Problem, Problems};
pub use redis::{RedisInForce, RedisSettings};
pub use regions::RegionsSettings;
pub use server::ServerSettings;
pub use sources::Sources;

impl Config {
    /// Reads and compiles `path`, noting in `sources` every file read (the file and those it
    /// names): what `watch` follows.
    pub fn load(path: &Path, sources: &mut Sources) -> Result<Config, ConfigError> {
        all_or_error(path, Config::load_all(path, sources))
    }

    /// Reads and compiles `path` for a reload of a process whose `redis:` settings are
    /// `running` (`None`: in-process), which a reload keeps until a graceful upgrade: the
    /// configuration's keys and `redis` are those in force, the file's `redis:` is still
    /// checked, and what it changes is in `pending_upgrade`.
    pub fn reload(
        path: &Path,
        sources: &mut Sources,
        running: Option<&RedisSettings>,
        running_regions: Option<&RegionsSettings>,
    ) -> Result<Config, ConfigError> {
        let from = InForce {
            redis: RedisInForce::Running(running),
            regions: Some(running_regions),
        };
        all_or_error(path, Config::read_in_force(path, sources, from))
    }

    /// Reads and compiles what of `path` compiles, with every problem found: what `sluice -t`
    /// checks further. No config when the file cannot be read or is not YAML.
    pub fn load_all(path: &Path, sources: &mut Sources) -> (Option<Config>, Vec<Problem>) {
        Config::read_in_force(path, sources, InForce::default())
    }

    /// [`Config::load_all`] with the `redis:` and `regions:` settings `from` says are in force.
    fn read_in_force(
        path: &Path,
        sources: &mut Sources,
        from: InForce<'_>,
    ) -> (Option<Config>, Vec<Problem>) {
        match sources.read_to_string(path) {
            Ok(text) => Config::compile_text(path, &text, from, sources),
            Err(e) => (
                None,
                vec![Problem::new("", format!("cannot read the file: {e}"))],
            ),
        }
    }

    /// Compiles `text`; `path` names the source in errors. What the files it names held is
    /// read, but not kept.
    pub fn from_yaml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        all_or_error(
            path,
            Config::compile_text(path, text, InForce::default(), &mut Sources::default()),
        )
    }

    /// What of `text` compiles, and every problem found.
    fn compile_text(
        path: &Path,
        text: &str,
        from: InForce<'_>,
        sources: &mut Sources,
    ) -> (Option<Config>, Vec<Problem>) {
        let mut problems = Problems::default();
        let config = misfits::read_and_compile(text, &mut problems, |raw, p| {
            compile::compile_all(path, raw, from, p, sources)
        });
        (config, problems.0)
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
