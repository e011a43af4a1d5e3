//! Listening services that bind their own sockets before they say they are ready, so a start
//! fails at once — with the address and the reason — when a port is taken (Pingora would retry
//! for 30 s and then only lose the service), and readiness means serving. A start hook runs in
//! the service's own runtime (the proxy's: where the Redis connection should live).

use std::os::fd::IntoRawFd;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::RuntimeOpts;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::background::BackgroundService;
use pingora::services::{ServiceReadyNotifier, ServiceWithDependents};
use tokio::sync::watch;

use crate::runtime::daemon;

/// Work to start inside the service's runtime once it runs.
pub type StartHook = Box<dyn FnOnce() + Send + Sync>;

/// A listening service whose addresses are bound before it reports ready.
pub struct BoundFirst<S> {
    inner: S,
    addresses: Vec<String>,
    on_start: Option<StartHook>,
    /// What stops it (the drain's signal, `drain.rs`), instead of Pingora's.
    stop: Option<ShutdownWatch>,
}

impl<S> BoundFirst<S> {
    /// `addresses` exactly as given to `add_tcp`.
    pub fn new(inner: S, addresses: Vec<String>) -> BoundFirst<S> {
        BoundFirst {
            inner,
            addresses,
            on_start: None,
            stop: None,
        }
    }

    /// Stops when `stop` says so, not when Pingora does.
    pub fn stopped_by(mut self, stop: ShutdownWatch) -> BoundFirst<S> {
        self.stop = Some(stop);
        self
    }

    /// Runs `hook` in the service's runtime when it starts.
    pub fn on_start(mut self, hook: impl FnOnce() + Send + Sync + 'static) -> BoundFirst<S> {
        self.on_start = Some(Box::new(hook));
        self
    }
}

/// Binds `address` (non-blocking, as Pingora's accept loop expects of a socket it is handed),
/// or ends the process with why it cannot.
fn bind(address: &str) -> std::net::TcpListener {
    std::net::TcpListener::bind(address)
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .unwrap_or_else(|e| cannot_listen(address, &e))
}

/// Ends the process: `address` cannot be listened on, and why (with what to do about it).
pub fn cannot_listen(address: &str, e: &std::io::Error) -> ! {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            " (another process holds it: stop it, or take its sockets over with sluice -u)"
        }
        std::io::ErrorKind::PermissionDenied => " (ports below 1024 need CAP_NET_BIND_SERVICE)",
        _ => "",
    };
    daemon::fatal(&format!("cannot listen on {address}: {e}{hint}"))
}

#[async_trait]
impl<S: ServiceWithDependents> ServiceWithDependents for BoundFirst<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
        ready: ServiceReadyNotifier,
    ) {
        match &fds {
            // Sockets taken over from an old instance (`-u`) are already there.
            Some(fds) => {
                for address in &self.addresses {
                    let taken_over = fds.lock().get(address).is_some();
                    if !taken_over {
                        let listener = bind(address);
                        fds.lock().add(address.clone(), listener.into_raw_fd());
                    }
                }
            }
            None => {
                for address in &self.addresses {
                    drop(bind(address));
                }
            }
        }
        if let Some(hook) = self.on_start.take() {
            hook();
        }
        ready.notify_ready();
        // The inner service would report ready before binding: nobody listens to it.
        let (unheard, _) = watch::channel(false);
        let stop = self.stop.clone().unwrap_or(shutdown);
        self.inner
            .start_service(
                fds,
                stop,
                listeners_per_fd,
                ServiceReadyNotifier::new(unheard),
            )
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn runtime_opts_override(&self, global: &RuntimeOpts) -> Option<RuntimeOpts> {
        self.inner.runtime_opts_override(global)
    }

    fn on_startup_delay(&self, time_waited: Duration) {
        self.inner.on_startup_delay(time_waited)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}

/// Tells the launcher of `sluice -d` the daemon serves, once the services it depends on are
/// ready (listeners bound, configuration live; or, when taking over from an old instance, once
/// it waits for the sockets).
pub struct ReadyReport;

impl ReadyReport {
    pub fn service() -> pingora::services::background::GenBackgroundService<ReadyReport> {
        pingora::services::background::GenBackgroundService::new(
            "sluice ready report".to_string(),
            Arc::new(ReadyReport),
        )
    }
}

#[async_trait]
impl BackgroundService for ReadyReport {
    async fn start(&self, _shutdown: ShutdownWatch) {
        log::info!("serving");
        daemon::report_ready();
    }
}
