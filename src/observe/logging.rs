//! The process's log: `env_logger` (level from `RUST_LOG`, `info` by default), with what the
//! libraries log as errors in normal operation demoted, since an operator reads ERROR as
//! something to act on, and what they repeat during an outage thinned:
//! * a new instance (`sluice -u`) that waits for the old one to hand its sockets over logs "No
//!   incoming socket transfer" every second until it does, on every normal graceful upgrade
//!   (`info`);
//! * an HTTP/2 client closed for not sending its preface in time (`proxy/preface.rs`, what nginx
//!   logs at `info` as a client timeout) surfaces as an "H2 handshake error" (`info`);
//! * a client that closes its connection in the middle of its request head reaches no hook of
//!   the proxy (which counts every other departure as the client's: `sluice_client_errors_total`)
//!   and Pingora logs it as "Fail to proxy: Downstream ConnectionClosed" (`info`);
//! * Pingora's connection pool logs "failed to acquire reusable stream" when an idle upstream
//!   connection it was about to reuse is still held by its idle watcher: it opens another one
//!   (`debug`);
//! * redis-rs logs a warning per node and per attempt while a Cluster heals (dozens a second
//!   during a failover): one of its lines a second passes, the rest go to `debug`. sluice's own
//!   lines say what the limiter did meanwhile (`limiter/policy.rs`, `limiter/guard.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use log::{Level, Log, Metadata, Record};

/// Why a connection was closed before its HTTP/2 preface arrived (`proxy/preface.rs` closes it
/// with this message; the log recognizes it).
pub const PREFACE_TIMEOUT: &str = "no HTTP/2 connection preface within request_head_timeout";

/// Installs the logger; the first call wins.
pub fn init() {
    let env = env_logger::Env::default().default_filter_or("info");
    let logger = env_logger::Builder::from_env(env).build();
    log::set_max_level(logger.filter());
    let _ = log::set_boxed_logger(Box::new(Demoting {
        logger,
        redis_second: AtomicU64::new(0),
    }));
}

/// Logs through `env_logger`, routine messages at a lower level.
struct Demoting {
    logger: env_logger::Logger,
    /// The Unix second of the last redis-rs warning let through at its own level.
    redis_second: AtomicU64,
}

/// Pingora's module that receives the listening sockets during a graceful upgrade.
const SOCKET_TRANSFER: &str = "pingora_core::server::transfer_fd";

/// Pingora's module that serves HTTP connections (and logs their HTTP/2 handshakes).
const HTTP_APPS: &str = "pingora_core::apps";

/// Pingora's proxy, which logs a client that left mid-head before any hook runs.
const PROXY: &str = "pingora_proxy";

/// Pingora's connectors (upstream connections and their pool).
const CONNECTORS: &str = "pingora_core::connectors";

/// redis-rs, the Redis client.
const REDIS_CLIENT: &str = "redis";

/// The level a message Pingora logs as an error in normal operation belongs at, if it is one.
fn routine(record: &Record<'_>) -> Option<Level> {
    let (target, level) = (record.target(), record.level());
    if level != Level::Error {
        return None;
    }
    let text = record.args().to_string();
    if target.starts_with(SOCKET_TRANSFER) && text.starts_with("No incoming socket transfer") {
        return Some(Level::Info);
    }
    if target == HTTP_APPS
        && text.starts_with("H2 handshake error")
        && text.contains(PREFACE_TIMEOUT)
    {
        return Some(Level::Info);
    }
    if target == CONNECTORS && text.starts_with("failed to acquire reusable stream") {
        return Some(Level::Debug);
    }
    let client_left = ["ConnectionClosed", "ReadError"]
        .iter()
        .any(|kind| text.starts_with(&format!("Fail to proxy: Downstream {kind}")));
    if target == PROXY && client_left {
        return Some(Level::Info);
    }
    None
}

/// Whether `target` is redis-rs's (its modules, not another crate named alike).
fn from_redis_client(target: &str) -> bool {
    target == REDIS_CLIENT || target.starts_with("redis::")
}

impl Demoting {
    /// The level `record` is logged at.
    fn level(&self, record: &Record<'_>) -> Level {
        if let Some(level) = routine(record) {
            return level;
        }
        if record.level() <= Level::Warn && from_redis_client(record.target()) {
            let second = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |t| t.as_secs());
            if self.redis_second.swap(second, Ordering::Relaxed) == second {
                return Level::Debug;
            }
        }
        record.level()
    }
}

impl Log for Demoting {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.logger.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        let level = self.level(record);
        if level == record.level() {
            return self.logger.log(record);
        }
        let demoted = Record::builder()
            .args(*record.args())
            .level(level)
            .target(record.target())
            .module_path(record.module_path())
            .file(record.file())
            .line(record.line())
            .build();
        if self.logger.enabled(demoted.metadata()) {
            self.logger.log(&demoted);
        }
    }

    fn flush(&self) {
        self.logger.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_socket_transfer_wait_is_routine() {
        let wait = format_args!("No incoming socket transfer, sleep 1s and try again");
        let routine_wait = Record::builder()
            .level(Level::Error)
            .target("pingora_core::server::transfer_fd")
            .args(wait)
            .build();
        assert_eq!(routine(&routine_wait), Some(Level::Info));
        let other = format_args!("Error accepting socket transfer: EBADF");
        let real_error = Record::builder()
            .level(Level::Error)
            .target("pingora_core::server::transfer_fd")
            .args(other)
            .build();
        assert_eq!(routine(&real_error), None);
        let elsewhere = Record::builder()
            .level(Level::Error)
            .target("sluice::edge::server")
            .args(wait)
            .build();
        assert_eq!(routine(&elsewhere), None);
        let late = format_args!(
            "H2 handshake error  HandshakeError context: while h2 handshaking with client cause: {PREFACE_TIMEOUT}"
        );
        let late_preface = Record::builder()
            .level(Level::Error)
            .target("pingora_core::apps")
            .args(late)
            .build();
        assert_eq!(routine(&late_preface), Some(Level::Info));
        let pool_race = Record::builder()
            .level(Level::Error)
            .target("pingora_core::connectors")
            .args(format_args!("failed to acquire reusable stream"))
            .build();
        assert_eq!(routine(&pool_race), Some(Level::Debug));
        let left = Record::builder()
            .level(Level::Error)
            .target("pingora_proxy")
            .args(format_args!("Fail to proxy: Downstream ConnectionClosed context: while reading request headers, bytes already read: 20, downstream session type: HTTP/1.1"))
            .build();
        assert_eq!(routine(&left), Some(Level::Info));
        let upstream = Record::builder()
            .level(Level::Error)
            .target("pingora_proxy")
            .args(format_args!("Fail to proxy: Upstream ConnectRefused"))
            .build();
        assert_eq!(routine(&upstream), None);
    }

    #[test]
    fn the_redis_clients_warnings_pass_one_a_second() {
        let demoting = Demoting {
            logger: env_logger::Builder::new().build(),
            redis_second: AtomicU64::new(0),
        };
        let record = |target: &'static str| {
            Record::builder()
                .level(Level::Warn)
                .target(target)
                .args(format_args!("Failed to connect to node"))
                .build()
        };
        let cluster = "redis::cluster_handling::async_connection";
        assert_eq!(
            demoting.level(&record(cluster)),
            Level::Warn,
            "the first passes"
        );
        for _ in 0..10 {
            assert_eq!(
                demoting.level(&record(cluster)),
                Level::Debug,
                "the rest wait"
            );
        }
        assert_eq!(
            demoting.level(&record("redis_helper")),
            Level::Warn,
            "another crate's name only begins alike"
        );
        assert_eq!(
            demoting.level(&record("sluice::limiter::policy")),
            Level::Warn
        );
    }
}
