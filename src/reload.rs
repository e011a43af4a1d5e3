//! Hot reload on SIGHUP: read and compile the file again; on success swap the routes, limits,
//! identity and path settings atomically (requests in flight finish on the configuration they
//! started with); on any error keep serving the old one and log every problem.
//!
//! What a running process cannot change in place — listeners, the admin listener, the `server:`
//! section and the `redis:` section — is logged as needing a graceful upgrade (`sluice -u`,
//! `systemctl reload`), and keeps its old value until then.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};

use crate::config::{Config, ConfigError, RedisSettings, ServerSettings};
use crate::metrics;
use crate::proxy::{Active, ActiveConfig};

/// The settings a reload cannot change, as the process started with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartOnly {
    listen: Vec<std::net::SocketAddr>,
    admin_listen: Option<std::net::SocketAddr>,
    redis: Option<RedisSettings>,
    server: ServerSettings,
}

impl RestartOnly {
    pub fn of(config: &Config) -> RestartOnly {
        RestartOnly {
            listen: config.listen.clone(),
            admin_listen: config.admin_listen,
            redis: config.redis.clone(),
            server: config.server.clone(),
        }
    }
}

/// Reloads `path` into `active` on every SIGHUP.
pub struct Reloader {
    path: PathBuf,
    started_with: RestartOnly,
    active: ActiveConfig,
}

impl Reloader {
    pub fn new(path: PathBuf, started_with: RestartOnly, active: ActiveConfig) -> Reloader {
        Reloader {
            path,
            started_with,
            active,
        }
    }

    /// One reload attempt: swaps on success, keeps the old configuration on any error.
    pub fn reload(&self) -> Result<(), ConfigError> {
        let config = Config::load(&self.path)?;
        let now = RestartOnly::of(&config);
        let fixed = [
            ("listen", now.listen != self.started_with.listen),
            ("admin", now.admin_listen != self.started_with.admin_listen),
            ("redis", now.redis != self.started_with.redis),
            ("server", now.server != self.started_with.server),
        ];
        for (section, _) in fixed.iter().filter(|(_, changed)| *changed) {
            log::warn!("reload: `{section}` changed; it takes effect with a graceful upgrade (sluice -u), not a reload");
        }
        log::info!("reload: {}", config.summary());
        self.active.store(Arc::new(Active::new(config)));
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(e) => {
                log::error!("cannot listen for SIGHUP, hot reload is off: {e}");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = hangups.recv() => match self.reload() {
                    Ok(()) => metrics::CONFIG_RELOADS.with_label_values(&["success"]).inc(),
                    Err(error) => {
                        metrics::CONFIG_RELOADS.with_label_values(&["error"]).inc();
                        for line in error.to_string().lines() {
                            log::error!("reload rejected, keeping the running configuration: {line}");
                        }
                    }
                },
                _ = shutdown.changed() => return,
            }
        }
    }
}
