//! A plain Pingora gateway written by hand: the visible work sluice does by default on a route
//! with no limits, and nothing else, so that sluice's own cost per request can be told from the
//! work any gateway with these features would do (`scripts/per-core.sh`,
//! `scripts/instructions.sh`). Per request: the six forwarding headers (`X-Forwarded-For`,
//! `X-Real-IP`, `X-Forwarded-Proto`, `-Host`, `-Port`, `Forwarded`), a random request id sent
//! upstream and returned, one request counter and one latency histogram (the `prometheus`
//! crate, as sluice uses). Same profile, allocator (mimalloc) and Pingora settings as
//! `bare_proxy.rs`.
//!
//! Usage: plain_gateway LISTEN_ADDR UPSTREAM_ADDR [THREADS]   (threads: the cores by default)

use std::net::SocketAddr;
use std::time::Instant;

use async_trait::async_trait;
use mimalloc::MiMalloc;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use prometheus::{Histogram, HistogramOpts, IntCounter};
use sluice::limiter::RequestId;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Forwards every request to `upstream`, in the clear, with the headers and meters above.
struct Plain {
    upstream: SocketAddr,
    listen_port: u16,
    requests: IntCounter,
    duration: Histogram,
}

/// What one request carries between hooks.
struct Request {
    started: Instant,
    id: [u8; 32],
}

#[async_trait]
impl ProxyHttp for Plain {
    type CTX = Request;

    fn new_ctx(&self) -> Request {
        Request {
            started: Instant::now(),
            id: RequestId::random().hex(),
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Request,
    ) -> pingora::Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Request,
    ) -> pingora::Result<()> {
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map_or_else(|| "unknown".to_owned(), |a| a.ip().to_string());
        let host = session
            .req_header()
            .headers
            .get(http::header::HOST)
            .cloned()
            .unwrap_or_else(|| http::HeaderValue::from_static(""));
        let forwarded = format!(
            "for={peer};proto=http;host={}",
            String::from_utf8_lossy(host.as_bytes())
        );
        upstream.insert_header("X-Forwarded-For", peer.as_str())?;
        upstream.insert_header("X-Real-IP", peer.as_str())?;
        upstream.insert_header("X-Forwarded-Proto", "http")?;
        upstream.insert_header("X-Forwarded-Host", host)?;
        upstream.insert_header("X-Forwarded-Port", self.listen_port)?;
        upstream.insert_header("Forwarded", forwarded)?;
        upstream.insert_header("X-Request-Id", &ctx.id[..])?;
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut Request,
    ) -> pingora::Result<()> {
        response.insert_header("X-Request-Id", &ctx.id[..])
    }

    async fn logging(
        &self,
        _session: &mut Session,
        _error: Option<&pingora::Error>,
        ctx: &mut Request,
    ) {
        self.requests.inc();
        self.duration.observe(ctx.started.elapsed().as_secs_f64());
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: plain_gateway LISTEN_ADDR UPSTREAM_ADDR [THREADS]");
        std::process::exit(2);
    };
    let parse = |what: &str, text: &str| -> SocketAddr {
        text.parse().unwrap_or_else(|e| {
            eprintln!("plain_gateway: {what} {text:?}: {e}");
            std::process::exit(2);
        })
    };
    let listen_port = parse("listen", &listen).port();
    let upstream = parse("upstream", &upstream);
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = match args.next() {
        None => cores,
        Some(threads) => threads.parse().unwrap_or_else(|e| {
            eprintln!("plain_gateway: threads {threads:?}: {e}");
            std::process::exit(2);
        }),
    };
    let meters = (
        IntCounter::new("requests_total", "requests served"),
        Histogram::with_opts(HistogramOpts::new(
            "request_duration_seconds",
            "request time",
        )),
    );
    let (Ok(requests), Ok(duration)) = meters else {
        eprintln!("plain_gateway: the meters could not be made");
        std::process::exit(2);
    };
    let conf = ServerConf {
        threads,
        work_stealing: true,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let plain = Plain {
        upstream,
        listen_port,
        requests,
        duration,
    };
    let mut proxy = http_proxy_service(&server.configuration, plain);
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run_forever();
}
