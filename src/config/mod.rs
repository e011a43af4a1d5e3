//! Configuration: read one YAML file, compile it into validated types, report every problem.
//!
//! `raw.rs` describes the file; `compile.rs` turns it into a [`Config`] whose values cannot be
//! wrong. Unknown keys, and problems found while compiling, are all reported together, each
//! with the file and the YAML path; a type error stops parsing at the first one (serde cannot
//! go on), with its path, line and column.

pub mod compile;
pub mod limits;
pub mod rate;
pub mod raw;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::identity::Identity;
use crate::path::PathPolicy;
use crate::router::RouteTable;

/// What a request gets when the limiter cannot decide (Redis error or deadline missed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    Allow,
    Deny,
    /// Enforce the limits in-process at `limit / instances` while Redis is unavailable.
    Local,
}

impl FailureMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
            FailureMode::Local => "local",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub topology: Topology,
    pub timeout: Duration,
    pub key_prefix: String,
}

/// How sluice reaches Redis (`redis.mode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (or a proxy in front of many): `redis.url`.
    Standalone { url: String },
    /// A Redis Cluster, discovered from any of its `nodes`; calls go to the slot's master.
    Cluster { nodes: Vec<String> },
    /// The master that the `sentinels` name `master_name`, found again after a failover.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
        master_username: Option<String>,
        master_password: Option<String>,
    },
}

impl Topology {
    pub fn mode(&self) -> &'static str {
        match self {
            Topology::Standalone { .. } => "standalone",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel { .. } => "sentinel",
        }
    }

    /// Where Redis is, for logs (no passwords).
    pub fn describe(&self) -> String {
        match self {
            Topology::Standalone { url } => format!("redis at {}", redacted_url(url)),
            Topology::Cluster { nodes } => format!(
                "redis cluster seeded by {}",
                nodes
                    .iter()
                    .map(|u| redacted_url(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Topology::Sentinel {
                sentinels,
                master_name,
                ..
            } => format!(
                "redis master {master_name:?} from sentinels {}",
                sentinels
                    .iter()
                    .map(|u| redacted_url(u))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The `server:` section, handed to Pingora's `ServerConf` (unset fields keep sluice's defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerSettings {
    pub threads: Option<usize>,
    pub pid_file: Option<String>,
    pub upgrade_sock: Option<String>,
    pub error_log: Option<String>,
    pub user: Option<String>,
    pub group: Option<String>,
    pub daemon: bool,
    pub work_stealing: Option<bool>,
    pub grace_period_seconds: Option<u64>,
    pub graceful_shutdown_timeout_seconds: Option<u64>,
    pub upstream_keepalive_pool_size: Option<usize>,
}

/// A loaded, validated configuration.
#[derive(Debug)]
pub struct Config {
    pub source: PathBuf,
    pub server: ServerSettings,
    pub listen: Vec<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    /// `None`: limits run in-process.
    pub redis: Option<RedisSettings>,
    pub failure_mode: FailureMode,
    pub identity: Identity,
    pub paths: PathPolicy,
    /// Log one line per request, for 1 request in `n`; `None`: off.
    pub access_log_sample: Option<u64>,
    pub routes: RouteTable,
}

impl Config {
    /// Reads and compiles `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::single(path, "", format!("cannot read the file: {e}")))?;
        Config::from_yaml(path, &text)
    }

    /// Compiles `text`; `path` names the source in errors.
    pub fn from_yaml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let mut unknown_key = |unknown: serde_ignored::Path<'_>| {
            problems.push(Problem::new(
                format_ignored(&unknown),
                "unknown key".to_string(),
            ));
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
                problems,
            }),
        }
    }

    /// One line for `sluice -t`.
    pub fn summary(&self) -> String {
        let limits: usize = self
            .routes
            .in_file_order()
            .iter()
            .map(|r| r.limits.len())
            .sum();
        let backend = match &self.redis {
            Some(redis) => redis.topology.describe(),
            None => "in-process limiter".to_string(),
        };
        format!(
            "{}: ok: {} routes, {} limits, {}",
            self.source.display(),
            self.routes.len(),
            limits,
            backend
        )
    }
}

/// The URL without its password, for logs.
pub fn redacted_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_string(),
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

/// Every problem found in one file.
#[derive(Debug, Clone)]
pub struct ConfigError {
    pub file: PathBuf,
    pub problems: Vec<Problem>,
}

impl ConfigError {
    fn single(file: &Path, path: &str, message: String) -> ConfigError {
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
            if problem.path.is_empty() {
                write!(f, "{}: {}", self.file.display(), problem.message)?;
            } else {
                write!(
                    f,
                    "{}: {}: {}",
                    self.file.display(),
                    problem.path,
                    problem.message
                )?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
