//! `demo-upstream`: a tiny HTTP backend for the quick start and the end-to-end tests.
//!
//! Answers every request with 200 and a line naming the method, path, `X-Forwarded-For` and Host it
//! saw, then the request target byte for byte (`target: ...`) and every forwarding header it
//! received (`x-real-ip: ...`), its `x-request-id` and `traceparent`, the caller headers sluice
//! sets (`x-consumer-*`) and the credentials it passed on (`x-api-key`, `authorization`: the
//! caller's own, shown back to it); a path containing `/slow/<ms>` is answered after that many
//! milliseconds (for concurrency tests); a path containing `/cost/<n>` answers with
//! `x-usage-tokens: <n>`, the cost a response-priced limit charges (`cost_from_response`);
//! `GET /__stats` returns how many other requests it has served. Usage: `demo-upstream [ADDR]` (default 127.0.0.1:3000).

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::{HttpServer, ServeHttp};
use pingora::http::RequestHeader;
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;

/// What the demo answers: the request line, the forwarding headers sluice set, the raw target.
fn echo(req: &RequestHeader) -> Vec<u8> {
    let xff = req
        .headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let host = req
        .headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let mut body = format!(
        "demo upstream: {} {} (x-forwarded-for: {xff}) (host: {host})\ntarget: ",
        req.method, req.uri
    )
    .into_bytes();
    body.extend_from_slice(req.raw_path());
    body.push(b'\n');
    for (name, value) in req.headers.iter() {
        let forwarding = name.as_str().starts_with("x-forwarded-")
            || name == "forwarded"
            || name == "x-real-ip"
            || name == "x-request-id"
            || name == "traceparent"
            || name.as_str().starts_with("x-consumer-")
            || name == "x-api-key"
            || name == "authorization";
        if forwarding {
            body.extend_from_slice(name.as_str().as_bytes());
            body.extend_from_slice(b": ");
            body.extend_from_slice(value.as_bytes());
            body.push(b'\n');
        }
    }
    body
}

struct Demo {
    served: AtomicU64,
}

#[async_trait]
impl ServeHttp for Demo {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // Drain any request body so the connection can be reused.
        while let Ok(Some(_)) = session.read_request_body().await {}
        let number_after = |marker: &str| {
            session
                .req_header()
                .uri
                .path()
                .split_once(marker)
                .and_then(|(_, rest)| rest.split('/').next()?.parse::<u64>().ok())
        };
        let slow_ms = number_after("/slow/");
        let cost = number_after("/cost/");
        if let Some(ms) = slow_ms {
            tokio::time::sleep(std::time::Duration::from_millis(ms.min(60_000))).await;
        }
        let req = session.req_header();
        let body = if req.uri.path() == "/__stats" {
            format!("{}\n", self.served.load(Ordering::Relaxed)).into_bytes()
        } else {
            self.served.fetch_add(1, Ordering::Relaxed);
            echo(req)
        };
        let length = body.len();
        let mut response = Response::new(body);
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain"),
        );
        response.headers_mut().insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from(length),
        );
        if let Some(cost) = cost {
            response
                .headers_mut()
                .insert("x-usage-tokens", http::HeaderValue::from(cost));
        }
        response
    }
}

const USAGE: &str = "usage: demo-upstream [ADDR]   (default 127.0.0.1:3000)";

/// The address to listen on, from the command line; exits with the usage when asked for it or
/// when the argument is not an address.
fn address() -> std::net::SocketAddr {
    let mut args = std::env::args().skip(1);
    let (arg, extra) = (args.next(), args.next());
    match (arg.as_deref(), extra) {
        (Some("-h" | "--help"), _) => {
            println!("{USAGE}");
            std::process::exit(0)
        }
        (_, Some(extra)) => {
            eprintln!("demo-upstream: unexpected argument {extra:?}\n{USAGE}");
            std::process::exit(2)
        }
        (arg, None) => {
            let text = arg.unwrap_or("127.0.0.1:3000");
            text.parse().unwrap_or_else(|_| {
                eprintln!(
                    "demo-upstream: {text:?} is not an address such as 127.0.0.1:3000\n{USAGE}"
                );
                std::process::exit(2)
            })
        }
    }
}

fn main() {
    let addr = address();
    // Pingora retries a taken port for a long time: say so now instead.
    if let Err(e) = std::net::TcpListener::bind(addr) {
        eprintln!("demo-upstream: cannot listen on {addr}: {e}");
        std::process::exit(1);
    }
    let conf = ServerConf {
        threads: 1,
        pid_file: format!("/tmp/sluice-demo-upstream-{}.pid", std::process::id()),
        upgrade_sock: format!("/tmp/sluice-demo-upstream-{}.sock", std::process::id()),
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = Service::new(
        "demo upstream".to_string(),
        HttpServer::new_app(Demo {
            served: AtomicU64::new(0),
        }),
    );
    service.add_tcp(&addr.to_string());
    server.add_service(service);
    eprintln!("demo upstream listening on {addr}");
    server.run_forever()
}
