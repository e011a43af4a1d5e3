//! The `server:` section: how the process runs (threads, pid file, upgrade socket, user, grace
//! periods). Declared once: the YAML reads straight into [`ServerSettings`], which also knows
//! sluice's defaults; the glue hands the result to Pingora.
//!
//! Under systemd (`RuntimeDirectory=`), the pid file and the upgrade socket default to the
//! runtime directory systemd exports as `$RUNTIME_DIRECTORY`; elsewhere to `/tmp`.
//! [`ServerSettings::check_environment`] checks what starting will need (the user, the group,
//! writable directories), for `sluice -t` and before a start.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::unistd::{access, AccessFlags, Group, User};
use serde::Deserialize;

use super::problem::{millis_within, Problem, Problems};

/// Seconds a retiring instance keeps accepting before it stops, unless set.
pub const DEFAULT_GRACE_PERIOD_SECONDS: u64 = 5;
/// Seconds in-flight requests get to finish at shutdown, unless set.
pub const DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_SECONDS: u64 = 10;
/// How long a new connection has to deliver its request head, unless set.
pub const DEFAULT_REQUEST_HEAD_TIMEOUT_MS: u64 = 10_000;
/// How long a kept-alive connection may wait for its next request, unless set.
pub const DEFAULT_KEEPALIVE_TIMEOUT_MS: u64 = 60_000;
/// The pid file: its name in the runtime directory, and where it goes without one.
const PID_FILE: (&str, &str) = ("sluice.pid", "/tmp/sluice.pid");
/// The upgrade socket: its name in the runtime directory, and where it goes without one.
const UPGRADE_SOCK: (&str, &str) = ("upgrade.sock", "/tmp/sluice_upgrade.sock");

/// The runtime directory systemd gives the unit (`RuntimeDirectory=`): the first of
/// `$RUNTIME_DIRECTORY`'s colon-separated paths.
pub fn runtime_directory() -> Option<PathBuf> {
    let value = std::env::var_os("RUNTIME_DIRECTORY")?;
    let first = value.to_str()?.split(':').next()?.to_string();
    (!first.is_empty()).then(|| PathBuf::from(first))
}

fn in_runtime_directory((name, fallback): (&str, &str)) -> String {
    runtime_directory()
        .map(|dir| dir.join(name).to_string_lossy().into_owned())
        .unwrap_or_else(|| fallback.to_string())
}

/// The subset of Pingora's `ServerConf` an operator may set; `None` keeps sluice's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    pub threads: Option<usize>,
    pub pid_file: Option<String>,
    pub upgrade_sock: Option<String>,
    pub error_log: Option<String>,
    pub user: Option<String>,
    pub group: Option<String>,
    #[serde(default)]
    pub daemon: bool,
    pub work_stealing: Option<bool>,
    pub grace_period_seconds: Option<u64>,
    pub graceful_shutdown_timeout_seconds: Option<u64>,
    pub upstream_keepalive_pool_size: Option<usize>,
    pub request_head_timeout_ms: Option<u64>,
    pub keepalive_timeout_ms: Option<u64>,
}

impl ServerSettings {
    /// Unless set, one per CPU the process may run on (nginx's `worker_processes auto`).
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        })
    }

    /// `server.pid_file`, else `$RUNTIME_DIRECTORY/sluice.pid`, else `/tmp/sluice.pid`.
    pub fn pid_file(&self) -> String {
        self.pid_file
            .clone()
            .unwrap_or_else(|| in_runtime_directory(PID_FILE))
    }

    /// `server.upgrade_sock`, else `$RUNTIME_DIRECTORY/upgrade.sock`, else
    /// `/tmp/sluice_upgrade.sock`.
    pub fn upgrade_sock(&self) -> String {
        self.upgrade_sock
            .clone()
            .unwrap_or_else(|| in_runtime_directory(UPGRADE_SOCK))
    }

    /// What starting will need of this machine: the user and group exist, and the directories
    /// of the pid file, the upgrade socket and the error log exist and are writable.
    pub fn check_environment(&self) -> Vec<Problem> {
        let mut p = Problems::default();
        if let Some(user) = &self.user {
            match User::from_name(user) {
                Ok(Some(_)) => {}
                Ok(None) => p.add("server.user", format!("no such user {user:?}")),
                Err(e) => p.add("server.user", format!("cannot look up {user:?}: {e}")),
            }
        }
        if let Some(group) = &self.group {
            match Group::from_name(group) {
                Ok(Some(_)) => {}
                Ok(None) => p.add("server.group", format!("no such group {group:?}")),
                Err(e) => p.add("server.group", format!("cannot look up {group:?}: {e}")),
            }
        }
        let files = [
            ("server.pid_file", Some(self.pid_file())),
            ("server.upgrade_sock", Some(self.upgrade_sock())),
            ("server.error_log", self.error_log.clone()),
        ];
        for (at, file) in files {
            if let Some(file) = file {
                if let Err(reason) = writable_place(Path::new(&file)) {
                    p.add(at, reason);
                }
            }
        }
        p.0
    }

    /// How long a new connection has to deliver its whole request head.
    pub fn request_head_timeout(&self) -> Duration {
        Duration::from_millis(
            self.request_head_timeout_ms
                .unwrap_or(DEFAULT_REQUEST_HEAD_TIMEOUT_MS),
        )
    }

    /// How long a kept-alive connection may wait for, and read, its next request head.
    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_millis(
            self.keepalive_timeout_ms
                .unwrap_or(DEFAULT_KEEPALIVE_TIMEOUT_MS),
        )
    }

    /// On unless set (Pingora's default): with a limit, idle threads picking up the Redis
    /// client's and the batches' tasks served more; without one, turning it off cost less CPU.
    /// The two were within this machine's noise (docs/performance.md).
    pub fn work_stealing(&self) -> bool {
        self.work_stealing.unwrap_or(true)
    }

    pub fn grace_period_seconds(&self) -> u64 {
        self.grace_period_seconds
            .unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS)
    }

    pub fn graceful_shutdown_timeout_seconds(&self) -> u64 {
        self.graceful_shutdown_timeout_seconds
            .unwrap_or(DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_SECONDS)
    }
}

/// Whether `file` can be created (or, if it exists, written) by this process.
fn writable_place(file: &Path) -> Result<(), String> {
    if file.exists() {
        return access(file, AccessFlags::W_OK)
            .map_err(|e| format!("{} is not writable: {e}", file.display()));
    }
    let directory = match file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if !directory.is_dir() {
        return Err(format!(
            "the directory {} does not exist",
            directory.display()
        ));
    }
    access(directory, AccessFlags::W_OK | AccessFlags::X_OK)
        .map_err(|e| format!("cannot create files in {}: {e}", directory.display()))
}

/// Checks the section; the settings are used as written, but for relative files (pid file,
/// upgrade socket, error log), taken from the start directory once (`paths.rs`).
pub fn check(mut settings: ServerSettings, p: &mut Problems) -> ServerSettings {
    for file in [
        &mut settings.pid_file,
        &mut settings.upgrade_sock,
        &mut settings.error_log,
    ] {
        *file = file.as_deref().map(super::paths::absolute_text);
    }
    for (at, ms) in [
        (
            "server.request_head_timeout_ms",
            settings.request_head_timeout_ms,
        ),
        ("server.keepalive_timeout_ms", settings.keepalive_timeout_ms),
    ] {
        if let Some(ms) = ms {
            millis_within(ms, 100..=3_600_000, at, p);
        }
    }
    if let Some(threads) = settings.threads {
        if !(1..=1024).contains(&threads) {
            p.add(
                "server.threads",
                format!("must be between 1 and 1024, got {threads}"),
            );
        }
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    #[test]
    fn threads_are_bounded_and_defaults_fill_the_rest() {
        let (settings, problems) = problems_of("threads: 0\n", check);
        assert_eq!(
            problems,
            ["server.threads: must be between 1 and 1024, got 0"]
        );
        assert_eq!(
            settings.grace_period_seconds(),
            DEFAULT_GRACE_PERIOD_SECONDS
        );
        let (settings, problems) = problems_of("threads: 4\ndaemon: true\n", check);
        assert!(problems.is_empty());
        assert_eq!((settings.threads(), settings.daemon), (4, true));
        assert!(settings.pid_file().ends_with("sluice.pid"));
    }

    #[test]
    fn what_start_needs_is_checked_before_it_fails() {
        let dir = tempfile::tempdir().unwrap();
        let settings = ServerSettings {
            user: Some("no-such-user-of-sluice".into()),
            group: Some("no-such-group-of-sluice".into()),
            error_log: Some("/nonexistent/sluice/error.log".into()),
            pid_file: Some(dir.path().join("sluice.pid").display().to_string()),
            upgrade_sock: Some(
                dir.path()
                    .join("missing/upgrade.sock")
                    .display()
                    .to_string(),
            ),
            ..ServerSettings::default()
        };
        let problems: Vec<String> = settings
            .check_environment()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            problems,
            [
                "server.user: no such user \"no-such-user-of-sluice\"".to_string(),
                "server.group: no such group \"no-such-group-of-sluice\"".to_string(),
                format!(
                    "server.upgrade_sock: the directory {} does not exist",
                    dir.path().join("missing").display()
                ),
                "server.error_log: the directory /nonexistent/sluice does not exist".to_string(),
            ]
        );
        let root = ServerSettings {
            user: Some("root".into()),
            pid_file: Some(dir.path().join("sluice.pid").display().to_string()),
            upgrade_sock: Some(dir.path().join("upgrade.sock").display().to_string()),
            ..ServerSettings::default()
        };
        assert!(root.check_environment().is_empty());
    }
}
