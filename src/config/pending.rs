//! What a reloaded file changes that the running process keeps until a graceful upgrade
//! (`sluice -u`): each setting by its path, with the value in force and the file's where they
//! may be shown. A reload lists them (`Config.pending_upgrade`: the `redis:` settings found by
//! `redis.rs`, the other sections by `runtime/reload.rs`); the log, `/readyz` and the dashboard
//! tell them.

use std::fmt;

/// A setting the file changes that the running process keeps until a graceful upgrade
/// (`sluice -u`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingChange {
    /// Its path in the file: `redis.key_prefix`, `listen`, ...; `redis` when the section is
    /// added or removed.
    pub path: &'static str,
    /// The value in force and the file's, where they may be shown (never a URL or a secret).
    pub values: Option<(String, String)>,
}

impl fmt::Display for PendingChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.values {
            Some((running, file)) => write!(f, "{} ({running} → {file})", self.path),
            None => f.write_str(self.path),
        }
    }
}
