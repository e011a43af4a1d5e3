//! The `server:` section: how the process runs (threads, pid file, upgrade socket, user, grace
//! periods). Declared once: the YAML reads straight into [`ServerSettings`], which also knows
//! sluice's defaults; the glue hands the result to Pingora.

use serde::Deserialize;

use super::problem::Problems;

/// Threads that serve requests unless set.
pub const DEFAULT_THREADS: usize = 2;
/// Seconds a retiring instance keeps accepting before it stops, unless set.
pub const DEFAULT_GRACE_PERIOD_SECONDS: u64 = 5;
/// Seconds in-flight requests get to finish at shutdown, unless set.
pub const DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_SECONDS: u64 = 10;
const DEFAULT_PID_FILE: &str = "/tmp/sluice.pid";
const DEFAULT_UPGRADE_SOCK: &str = "/tmp/sluice_upgrade.sock";

/// The subset of Pingora's `ServerConf` an operator may set; `None` keeps sluice's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
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
}

impl ServerSettings {
    pub fn threads(&self) -> usize {
        self.threads.unwrap_or(DEFAULT_THREADS)
    }

    pub fn pid_file(&self) -> String {
        self.pid_file
            .clone()
            .unwrap_or_else(|| DEFAULT_PID_FILE.to_string())
    }

    pub fn upgrade_sock(&self) -> String {
        self.upgrade_sock
            .clone()
            .unwrap_or_else(|| DEFAULT_UPGRADE_SOCK.to_string())
    }

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

/// Checks the section; the settings are used as written.
pub fn check(settings: ServerSettings, p: &mut Problems) -> ServerSettings {
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
        assert_eq!(settings.pid_file(), DEFAULT_PID_FILE);
    }
}
