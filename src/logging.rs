//! The process's log: `env_logger` (level from `RUST_LOG`, `info` by default), with the routine
//! messages Pingora logs as errors demoted to `info`, since an operator reads ERROR as something
//! to act on: a new instance (`sluice -u`) that waits for the old one to hand its sockets over
//! logs "No incoming socket transfer" every second until it does, on every normal graceful
//! upgrade; and an HTTP/2 client closed for not sending its preface in time (`proxy/preface.rs`,
//! what nginx logs at `info` as a client timeout) surfaces as an "H2 handshake error".

use log::{Level, Log, Metadata, Record};

use crate::proxy::preface::PREFACE_TIMEOUT;

/// Installs the logger; the first call wins.
pub fn init() {
    let env = env_logger::Env::default().default_filter_or("info");
    let logger = env_logger::Builder::from_env(env).build();
    log::set_max_level(logger.filter());
    let _ = log::set_boxed_logger(Box::new(Demoting(logger)));
}

/// Logs through `env_logger`, routine messages at `info`.
struct Demoting(env_logger::Logger);

/// Pingora's module that receives the listening sockets during a graceful upgrade.
const SOCKET_TRANSFER: &str = "pingora_core::server::transfer_fd";

/// Pingora's module that serves HTTP connections (and logs their HTTP/2 handshakes).
const HTTP_APPS: &str = "pingora_core::apps";

/// A message Pingora logs as an error that is part of normal operation.
fn routine(record: &Record<'_>) -> bool {
    let (target, level) = (record.target(), record.level());
    if level != Level::Error || !(target.starts_with(SOCKET_TRANSFER) || target == HTTP_APPS) {
        return false;
    }
    let text = record.args().to_string();
    text.starts_with("No incoming socket transfer")
        || (text.starts_with("H2 handshake error") && text.contains(PREFACE_TIMEOUT))
}

impl Log for Demoting {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !routine(record) {
            return self.0.log(record);
        }
        let demoted = Record::builder()
            .args(*record.args())
            .level(Level::Info)
            .target(record.target())
            .module_path(record.module_path())
            .file(record.file())
            .line(record.line())
            .build();
        self.0.log(&demoted);
    }

    fn flush(&self) {
        self.0.flush();
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
        assert!(routine(&routine_wait));
        let other = format_args!("Error accepting socket transfer: EBADF");
        let real_error = Record::builder()
            .level(Level::Error)
            .target("pingora_core::server::transfer_fd")
            .args(other)
            .build();
        assert!(!routine(&real_error));
        let elsewhere = Record::builder()
            .level(Level::Error)
            .target("sluice::app")
            .args(wait)
            .build();
        assert!(!routine(&elsewhere));
        let late = format_args!(
            "H2 handshake error  HandshakeError context: while h2 handshaking with client cause: {PREFACE_TIMEOUT}"
        );
        let late_preface = Record::builder()
            .level(Level::Error)
            .target("pingora_core::apps")
            .args(late)
            .build();
        assert!(routine(&late_preface));
    }
}
