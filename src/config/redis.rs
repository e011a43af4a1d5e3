//! The `redis:` section: which topology (one server, a Cluster, Sentinels), who sluice is to it
//! (`username`, `password`: a secret, so it can come from a file, the environment or a systemd
//! credential), the deadline of every call, and the key prefix. Without the section, limits run
//! in-process. No URL is ever repeated in a problem: URLs may hold passwords.

use std::time::Duration;

use super::choice::{chosen, RedisMode, Spelled};
use super::pending::PendingChange;
use super::problem::{check_name, millis_within, Problems};
use super::raw::RawRedis;
use super::sources::Sources;
use crate::limiter::Secret;
use crate::limiter::{RedisAuth, RedisTls, Topology};

pub const DEFAULT_REDIS_TIMEOUT_MS: u64 = 25;
pub const DEFAULT_KEY_PREFIX: &str = "sluice";
/// Decisions one script call may carry (`limiter::redis::coalesce`).
pub const DEFAULT_MAX_BATCH: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    pub topology: Topology,
    pub auth: RedisAuth,
    pub timeout: Duration,
    pub key_prefix: String,
    /// The most decisions one script call carries when requests queue (1: one call each).
    pub max_batch: usize,
}

/// Which `redis:` settings a configuration is compiled with: its keys, their prefix and the
/// settings it reports (`Config.redis`) are those in force.
#[derive(Debug, Clone, Copy, Default)]
pub enum RedisInForce<'a> {
    /// The file's: at start (and `sluice -u`), and for `sluice -t`.
    #[default]
    File,
    /// Those the process runs with (`None`: in-process), which a reload keeps until a graceful
    /// upgrade: the file's are still compiled and checked, and what they change is pending.
    Running(Option<&'a RedisSettings>),
}

/// The settings in force of a file whose `redis:` compiles to `file`, and what of the file's
/// waits for a graceful upgrade.
pub fn in_force(
    file: Option<RedisSettings>,
    from: RedisInForce<'_>,
) -> (Option<RedisSettings>, Vec<PendingChange>) {
    match from {
        RedisInForce::File => (file, Vec::new()),
        RedisInForce::Running(running) => {
            let pending = RedisSettings::changes(running, file.as_ref());
            (running.cloned(), pending)
        }
    }
}

impl RedisSettings {
    /// What `file` changes against `running`, setting by setting (`redis` alone when the
    /// section is added or removed); URLs and secrets are named, never shown.
    pub fn changes(
        running: Option<&RedisSettings>,
        file: Option<&RedisSettings>,
    ) -> Vec<PendingChange> {
        let describe = |settings: Option<&RedisSettings>| match settings {
            Some(settings) => format!("Redis, {} mode", settings.topology.mode()),
            None => "none: limits in-process".to_string(),
        };
        match (running, file) {
            (None, None) => Vec::new(),
            (Some(running), Some(file)) => running.differences(file),
            _ => vec![PendingChange {
                path: "redis",
                values: Some((describe(running), describe(file))),
            }],
        }
    }

    /// Each setting `file` has another value of.
    fn differences(&self, file: &RedisSettings) -> Vec<PendingChange> {
        let mut changes = Vec::new();
        let mut differ = |path, changed: bool, values: Option<(String, String)>| {
            if changed {
                changes.push(PendingChange { path, values });
            }
        };
        let (a, b) = (&self.topology, &file.topology);
        let modes = (a.mode().to_string(), b.mode().to_string());
        differ("redis.mode", modes.0 != modes.1, Some(modes));
        match (a, b) {
            (Topology::Standalone { url }, Topology::Standalone { url: other }) => {
                differ("redis.url", url != other, None);
            }
            (Topology::Cluster { nodes }, Topology::Cluster { nodes: other }) => {
                differ("redis.nodes", nodes != other, None);
            }
            (
                Topology::Sentinel {
                    sentinels,
                    master_name,
                },
                Topology::Sentinel {
                    sentinels: others,
                    master_name: other,
                },
            ) => {
                differ("redis.sentinels", sentinels != others, None);
                let names = (master_name.clone(), other.clone());
                differ("redis.master_name", names.0 != names.1, Some(names));
            }
            _ => {}
        }
        differ(
            "redis.username",
            self.auth.username != file.auth.username,
            None,
        );
        differ(
            "redis.password",
            self.auth.password != file.auth.password,
            None,
        );
        differ("redis.tls", self.auth.tls != file.auth.tls, None);
        let ms = |settings: &RedisSettings| format!("{} ms", settings.timeout.as_millis());
        differ(
            "redis.timeout_ms",
            self.timeout != file.timeout,
            Some((ms(self), ms(file))),
        );
        let prefixes = (self.key_prefix.clone(), file.key_prefix.clone());
        differ("redis.key_prefix", prefixes.0 != prefixes.1, Some(prefixes));
        let batches = (self.max_batch.to_string(), file.max_batch.to_string());
        differ("redis.max_batch", batches.0 != batches.1, Some(batches));
        changes
    }
}

pub fn compile(raw: RawRedis, p: &mut Problems, read: &mut Sources) -> RedisSettings {
    let topology = compile_topology(&raw, p);
    let auth = compile_auth(&raw, p, read);
    let timeout = millis_within(
        raw.timeout_ms.unwrap_or(DEFAULT_REDIS_TIMEOUT_MS),
        1..=10_000,
        "redis.timeout_ms",
        p,
    )
    .unwrap_or(Duration::from_millis(DEFAULT_REDIS_TIMEOUT_MS));
    let key_prefix = raw
        .key_prefix
        .unwrap_or_else(|| DEFAULT_KEY_PREFIX.to_string());
    check_name(&key_prefix, "redis.key_prefix", p);
    let max_batch = match raw.max_batch {
        None => DEFAULT_MAX_BATCH,
        Some(n @ 1..=1024) => n as usize,
        Some(n) => {
            p.add("redis.max_batch", format!("{n} is out of range 1..=1024"));
            DEFAULT_MAX_BATCH
        }
    };
    RedisSettings {
        topology,
        auth,
        timeout,
        key_prefix,
        max_batch,
    }
}

/// `username` and `password` (in sentinel mode also spelled `master_username` and
/// `master_password`): who sluice is to the servers holding the limits.
fn compile_auth(raw: &RawRedis, p: &mut Problems, read: &mut Sources) -> RedisAuth {
    let pick = |plain: &str, sentinel: &str, both: bool, p: &mut Problems| {
        if both {
            p.add(
                format!("redis.{sentinel}"),
                format!("{sentinel} is another spelling of {plain}: give only one"),
            );
        }
    };
    pick(
        "username",
        "master_username",
        raw.username.is_some() && raw.master_username.is_some(),
        p,
    );
    pick(
        "password",
        "master_password",
        raw.password.is_some() && raw.master_password.is_some(),
        p,
    );
    let password = match (&raw.password, &raw.master_password) {
        (Some(password), _) => super::secrets::compile(password.clone(), "redis.password", p, read),
        (None, Some(password)) => {
            super::secrets::compile(password.clone(), "redis.master_password", p, read)
        }
        (None, None) => None,
    };
    RedisAuth {
        username: raw.username.clone().or_else(|| raw.master_username.clone()),
        password,
        tls: compile_tls(raw, p, read),
    }
}

/// `redis.tls`: PEM files read now, for `rediss://` connections.
fn compile_tls(raw: &RawRedis, p: &mut Problems, sources: &mut Sources) -> Option<RedisTls> {
    let tls = raw.tls.as_ref()?;
    let mut read = |path: &str, at: &str, p: &mut Problems| match sources
        .read(&super::paths::absolute(path))
    {
        Ok(bytes) if !bytes.is_empty() => Some(bytes),
        Ok(_) => {
            p.add(at, format!("{path} is empty"));
            None
        }
        Err(e) => {
            p.add(at, format!("cannot read {path}: {e}"));
            None
        }
    };
    let sentinel = matches!(raw.mode, Some(Spelled::Known(RedisMode::Sentinel)));
    if sentinel && (tls.ca.is_some() || tls.cert.is_some()) {
        p.add(
            "redis.tls",
            "in sentinel mode the master is checked against the system's roots: ca, cert and key do not apply (give tls: {})",
        );
    }
    let ca = tls
        .ca
        .as_deref()
        .and_then(|path| read(path, "redis.tls.ca", p));
    let client = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let cert = read(cert, "redis.tls.cert", p);
            let key = read(key, "redis.tls.key", p)
                .map(|bytes| Secret::new(String::from_utf8_lossy(&bytes).into_owned()));
            cert.zip(key)
        }
        (None, None) => None,
        _ => {
            p.add("redis.tls", "a client certificate needs both cert and key");
            None
        }
    };
    Some(RedisTls { ca, client })
}

/// `redis.mode` and the addresses that mode needs; every problem reported.
fn compile_topology(redis: &RawRedis, p: &mut Problems) -> Topology {
    let Some(mode) = chosen(redis.mode.as_ref(), RedisMode::Standalone, "redis.mode", p) else {
        return Topology::Standalone { url: String::new() };
    };
    check_mode_keys(redis, mode, p);
    match mode {
        RedisMode::Standalone => {
            let url = redis.url.clone().unwrap_or_default();
            if url.is_empty() {
                p.add("redis.url", "required when the redis section is present (omit the section for in-process limits)");
            } else {
                check_url(&url, "redis.url", p);
            }
            Topology::Standalone { url }
        }
        RedisMode::Cluster => Topology::Cluster {
            nodes: check_urls(&redis.nodes, mode, "redis.nodes", p),
        },
        RedisMode::Sentinel => {
            let sentinels = check_urls(&redis.sentinels, mode, "redis.sentinels", p);
            let master_name = redis.master_name.clone().unwrap_or_default();
            if master_name.is_empty() {
                p.add(
                    "redis.master_name",
                    "required in sentinel mode: the name the sentinels monitor",
                );
            }
            Topology::Sentinel {
                sentinels,
                master_name,
            }
        }
    }
}

/// Every mode-specific key written is one its mode uses.
fn check_mode_keys(redis: &RawRedis, mode: RedisMode, p: &mut Problems) {
    use RedisMode::{Cluster, Sentinel, Standalone};
    let mode_keys = [
        ("url", redis.url.is_some(), Standalone),
        ("nodes", redis.nodes.is_some(), Cluster),
        ("sentinels", redis.sentinels.is_some(), Sentinel),
        ("master_name", redis.master_name.is_some(), Sentinel),
        ("master_username", redis.master_username.is_some(), Sentinel),
        ("master_password", redis.master_password.is_some(), Sentinel),
    ];
    for (key, present, used_in) in mode_keys {
        if present && used_in != mode {
            p.add(format!("redis.{key}"), format!("not used in {mode} mode"));
        }
    }
}

/// A redis URL; the URL is never repeated in the problem: it may hold a password.
fn check_url(url: &str, path: &str, p: &mut Problems) {
    if ::redis::Client::open(url).is_err() {
        p.add(
            path,
            "invalid redis URL: expected redis://[user[:password]@]host[:port][/db], rediss://..., or redis+unix:///path[?db=N]",
        );
    }
}

/// The list of redis URLs `mode` needs at `path`: at least one, each valid.
fn check_urls(
    list: &Option<Vec<String>>,
    mode: RedisMode,
    path: &str,
    p: &mut Problems,
) -> Vec<String> {
    let list = list.clone().unwrap_or_default();
    if list.is_empty() {
        p.add(
            path,
            format!("required in {mode} mode: a list of redis:// URLs"),
        );
    }
    for (i, url) in list.iter().enumerate() {
        check_url(url, &format!("{path}[{i}]"), p);
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::problem::problems_of;

    fn compile(raw: RawRedis, p: &mut Problems) -> RedisSettings {
        super::compile(raw, p, &mut Sources::default())
    }

    #[test]
    fn each_mode_takes_its_own_keys() {
        let (_, problems) = problems_of(
            "mode: cluster\nurl: redis://127.0.0.1/\ntimeout_ms: 0\n",
            compile,
        );
        assert_eq!(
            problems,
            [
                "redis.url: not used in cluster mode",
                "redis.nodes: required in cluster mode: a list of redis:// URLs",
                "redis.timeout_ms: must be between 1 and 10000 ms, got 0",
            ]
        );
        let (settings, problems) = problems_of(
            "mode: sentinel\nsentinels: [redis://127.0.0.1:26379/]\nmaster_name: m\nkey_prefix: t\n",
            compile,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            (settings.topology.mode(), settings.key_prefix.as_str()),
            ("sentinel", "t")
        );
    }

    #[test]
    fn a_password_comes_from_a_secret_and_no_problem_repeats_a_url() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "file-pw\n").unwrap();
        let (settings, problems) = problems_of(
            &format!(
                "url: redis://10.0.0.5/0\nusername: sluice\npassword: {{ file: {} }}\n",
                file.display()
            ),
            compile,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings.auth.username.as_deref(), Some("sluice"));
        assert_eq!(settings.auth.password.unwrap().expose(), "file-pw");
        let (_, problems) = problems_of("url: \"redis://:leaked-pw@host:notaport/0\"\n", compile);
        assert_eq!(problems.len(), 1);
        assert!(!problems[0].contains("leaked-pw"), "{problems:?}");
        let (_, problems) = problems_of(
            "mode: sentinel\nsentinels: [redis://s:26379/]\nmaster_name: m\npassword: a\nmaster_password: b\n",
            compile,
        );
        assert_eq!(
            problems,
            ["redis.master_password: master_password is another spelling of password: give only one"]
        );
    }

    fn settings(yaml: &str) -> RedisSettings {
        let (settings, problems) = problems_of(yaml, compile);
        assert!(problems.is_empty(), "{problems:?}");
        settings
    }

    #[test]
    fn changes_are_named_setting_by_setting_without_urls_or_secrets() {
        let running = settings("url: redis://:pw-one@127.0.0.1/0\nkey_prefix: a\n");
        let file = settings(
            "url: redis://:pw-two@127.0.0.1/0\nkey_prefix: b\ntimeout_ms: 50\npassword: x\n",
        );
        let changes = RedisSettings::changes(Some(&running), Some(&file));
        let told: Vec<String> = changes.iter().map(ToString::to_string).collect();
        assert_eq!(
            told,
            [
                "redis.url",
                "redis.password",
                "redis.timeout_ms (25 ms → 50 ms)",
                "redis.key_prefix (a → b)",
            ]
        );
        assert!(RedisSettings::changes(Some(&running), Some(&running)).is_empty());
        assert!(RedisSettings::changes(None, None).is_empty());
        let added = RedisSettings::changes(None, Some(&file));
        assert_eq!(
            added.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["redis (none: limits in-process → Redis, standalone mode)"]
        );
        let cluster = settings("mode: cluster\nnodes: [redis://127.0.0.1:7000/]\n");
        let told = RedisSettings::changes(Some(&running), Some(&cluster));
        assert_eq!(told[0].to_string(), "redis.mode (standalone → cluster)");
    }

    #[test]
    fn a_reload_keeps_the_settings_in_force_and_says_what_waits() {
        let running = settings("url: redis://127.0.0.1/0\nkey_prefix: a\n");
        let file = settings("url: redis://127.0.0.1/0\nkey_prefix: b\n");
        let (kept, pending) = in_force(Some(file.clone()), RedisInForce::Running(Some(&running)));
        assert_eq!(kept, Some(running.clone()));
        assert_eq!(pending[0].path, "redis.key_prefix");
        let (start, pending) = in_force(Some(file.clone()), RedisInForce::File);
        assert_eq!((start, pending.len()), (Some(file), 0));
        let (kept, pending) = in_force(None, RedisInForce::Running(Some(&running)));
        assert_eq!((kept, pending[0].path), (Some(running), "redis"));
    }

    #[test]
    fn urls_modes_and_prefixes_are_checked() {
        let (_, problems) = problems_of("url: http://x\nkey_prefix: \"a{b}\"\n", compile);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("redis.url: invalid redis URL"));
        assert!(problems[1].starts_with("redis.key_prefix: invalid name"));
        let (_, problems) = problems_of("mode: ring\n", compile);
        assert_eq!(
            problems,
            ["redis.mode: unknown mode \"ring\": use standalone, cluster or sentinel"]
        );
    }
}
