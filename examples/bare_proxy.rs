//! The smallest Pingora proxy that forwards to one upstream: what Pingora itself costs per
//! request, the floor under sluice without limits (`scripts/bench.sh`, target 0). It picks the
//! upstream and does nothing else: no route, no limits, no metrics, no request id. Built with
//! the same profile and allocator as sluice (mimalloc), on the same Pingora settings a sluice
//! configuration without a `server:` section gets (threads: the machine's cores, work
//! stealing, Pingora's upstream keep-alive pool).
//!
//! Usage: bare_proxy LISTEN_ADDR UPSTREAM_ADDR [THREADS]   (threads: the cores by default;
//! `scripts/instructions.sh` runs it on 1, as it runs sluice)

use std::net::SocketAddr;

use async_trait::async_trait;
use mimalloc::MiMalloc;
use pingora::prelude::HttpPeer;
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Forwards every request to `upstream`, in the clear.
struct Bare {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: bare_proxy LISTEN_ADDR UPSTREAM_ADDR [THREADS]");
        std::process::exit(2);
    };
    let upstream: SocketAddr = upstream.parse().unwrap_or_else(|e| {
        eprintln!("bare_proxy: upstream {upstream:?}: {e}");
        std::process::exit(2);
    });
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = match args.next() {
        None => cores,
        Some(threads) => threads.parse().unwrap_or_else(|e| {
            eprintln!("bare_proxy: threads {threads:?}: {e}");
            std::process::exit(2);
        }),
    };
    let conf = ServerConf {
        threads,
        work_stealing: true,
        // Stops at once when the bench ends it, as the bench's sluice configurations do.
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = http_proxy_service(&server.configuration, Bare { upstream });
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever();
}
