//! Limits priced by the response (`cost_from_response`), end to end: real gateways, a real
//! Redis (and the in-process backend), the demo upstream reporting its cost in a header
//! (`/cost/<n>` answers `x-usage-tokens: <n>`) and an HTTP/2 upstream reporting it in a trailer.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};

use support::config::{route, Config};
use support::limits::fixed_window;
use support::{http_get, metric, Gateway, RedisServer, Response, Upstream};

/// `r=` of the `RateLimit` header: what the limit had left once this request's estimate was
/// reserved.
fn remaining(response: &Response) -> u64 {
    let value = response
        .header("ratelimit")
        .unwrap_or_else(|| panic!("no RateLimit header on {response:?}"));
    value
        .split(';')
        .find_map(|part| part.strip_prefix("r="))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no r= in {value:?}"))
}

/// One route, one limit of `rate` shared by every client, priced by `x-usage-tokens` with
/// `estimate` reserved per request.
fn priced_config(rate: &str, estimate: u64, upstream: Option<&str>) -> Config {
    let limit = fixed_window("tokens", rate).key(&["route"]).set(
        "cost_from_response",
        format!("{{ header: x-usage-tokens, estimate: {estimate} }}"),
    );
    let mut route = route("llm").limit(limit);
    if let Some(upstream) = upstream {
        route = route.upstream(upstream);
    }
    Config::new().route(route)
}

fn reports(gateway: &Gateway, report: &str) -> f64 {
    metric(
        &gateway.metrics(),
        "sluice_response_cost_reports_total",
        &[("route", "llm"), ("limit", "tokens"), ("report", report)],
    )
}

fn units(gateway: &Gateway) -> f64 {
    metric(
        &gateway.metrics(),
        "sluice_response_cost_units_total",
        &[("route", "llm"), ("limit", "tokens")],
    )
}

/// Each response settles its request's estimate: a dearer one is charged the difference, a
/// cheaper one gives it back, one without a report keeps the estimate, one above `max` is
/// charged `max`, and a charge past the limit refuses what follows. Sequential requests each
/// on their own connection: the settlement lands before the connection closes.
fn settles_each_response(gateway: &Gateway) {
    let get = |path: &str| gateway.get(path);
    let first = get("/v1/complete/cost/40");
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(remaining(&first), 90, "100/h, 10 reserved");
    assert_eq!(
        first.header("x-usage-tokens"),
        Some("40"),
        "the report reaches the client"
    );
    let second = get("/v1/complete/cost/0");
    assert_eq!(
        remaining(&second),
        50,
        "charged 30 more for the first, 10 reserved"
    );
    let third = get("/v1/complete");
    assert_eq!(
        remaining(&third),
        50,
        "the second cost nothing: its 10 came back"
    );
    let fourth = get("/v1/complete/cost/999999");
    assert_eq!(
        remaining(&fourth),
        40,
        "the third reported nothing: its 10 stand"
    );
    let refused = get("/v1/complete/cost/1");
    assert_eq!(
        refused.status, 429,
        "the fourth was charged max (100): 150 counted, refused until the window ends"
    );
    assert_eq!(
        [
            reports(gateway, "reported"),
            reports(gateway, "missing"),
            reports(gateway, "capped"),
            reports(gateway, "invalid"),
        ],
        [2.0, 1.0, 1.0, 0.0]
    );
    assert_eq!(units(gateway), 140.0, "40 + 0 + 100 (capped)");
}

#[test]
fn responses_settle_their_estimate_in_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = priced_config("100/h", 10, None).redis(redis.url());
    let gateway = Gateway::start(&config.yaml(), &upstream, Some(&redis));
    settles_each_response(&gateway);
}

#[test]
fn responses_settle_their_estimate_in_process() {
    let upstream = Upstream::start();
    let gateway = Gateway::start(&priced_config("100/h", 10, None).yaml(), &upstream, None);
    settles_each_response(&gateway);
}

/// The overshoot bound. A request is admitted while its estimate fits; its real cost lands only
/// when its response ends. So whatever is admitted before the charges land may overshoot the
/// limit by at most (requests admitted meanwhile) × (max − estimate): here 20 clients on two
/// gateways sharing one Redis send at once a request costing 300 against 1000/h reserving 100
/// each: exactly 10 are admitted (10 × 100 = 1000), they are charged 3000 in all, the bound
/// 1000 + 10 × (300 − 100), and the key's debt refuses what follows. One at a time, the same
/// requests stop at 4 (3 × 300 charged, then 100 left admits one more: 1200).
#[test]
fn concurrent_requests_overshoot_by_at_most_their_unreported_costs() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let config = priced_config("1000/h", 100, None).redis(redis.url());
    let gateways = [
        Gateway::start(&config.yaml(), &upstream, Some(&redis)),
        Gateway::start(&config.yaml(), &upstream, Some(&redis)),
    ];
    let proxies: Vec<SocketAddr> = gateways.iter().map(|g| g.proxy).collect();

    let clients = 20;
    let barrier = Arc::new(Barrier::new(clients));
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let (barrier, proxy) = (Arc::clone(&barrier), proxies[client % 2]);
            std::thread::spawn(move || {
                barrier.wait();
                // Held 3 s upstream, so every admission happens before any charge lands (were
                // one later, fewer would be admitted: never more).
                http_get(proxy, "/v1/complete/slow/3000/cost/300", None, &[]).status
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(admitted, 10, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 10);
    let charged: f64 = gateways.iter().map(units).sum();
    assert_eq!(charged, 3000.0, "every admitted response was charged");
    let bound = 1000 + admitted as u64 * (300 - 100);
    assert!(charged as u64 <= bound, "{charged} within {bound}");
    assert_eq!(
        gateways[0].get("/v1/complete/cost/1").status,
        429,
        "the debt refuses"
    );

    // The same requests one at a time: each charge lands before the next admission.
    let sequential = Gateway::start(&priced_config("1000/h", 100, None).yaml(), &upstream, None);
    let admitted_one_by_one = (0..10)
        .map(|_| sequential.get("/v1/complete/cost/300").status)
        .take_while(|status| *status == 200)
        .count();
    assert_eq!(admitted_one_by_one, 4);
    assert_eq!(units(&sequential), 1200.0);
}

/// An HTTP/2 upstream (a gRPC-style service) reports the cost in a trailer, after the body:
/// the settlement reads it.
#[test]
fn a_trailer_reports_the_cost_of_an_http2_response() {
    let upstream = Upstream::start();
    let h2 = TrailerUpstream::start();
    let config = priced_config(
        "100/h",
        10,
        Some(&format!("{{ servers: [{}], http2: true }}", h2.addr)),
    );
    let gateway = Gateway::start(&config.yaml(), &upstream, None);
    let first = gateway.get("/v1/stream/cost/70");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.body.contains("streamed"), "{first:?}");
    assert_eq!(remaining(&first), 90);
    let second = gateway.get("/v1/stream/cost/5");
    assert_eq!(
        remaining(&second),
        20,
        "charged 60 more from the trailer, 10 reserved"
    );
    assert_eq!(reports(&gateway, "reported"), 2.0);
    assert_eq!(units(&gateway), 75.0);
}

/// An HTTP/2 (prior knowledge) server answering every request with a body and then a trailer
/// `x-usage-tokens: <n>` taken from `/cost/<n>` in its path; it runs until the test ends.
struct TrailerUpstream {
    addr: SocketAddr,
}

impl TrailerUpstream {
    fn start() -> TrailerUpstream {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind the HTTP/2 upstream");
        let addr: SocketAddr = listener.local_addr().expect("the upstream's address");
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                while let Ok((socket, _)) = listener.accept().await {
                    tokio::spawn(serve_connection(socket));
                }
            });
        });
        TrailerUpstream { addr }
    }
}

async fn serve_connection(socket: tokio::net::TcpStream) {
    let Ok(mut connection) = h2::server::handshake(socket).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = connection.accept().await {
        let cost = request
            .uri()
            .path()
            .split_once("/cost/")
            .and_then(|(_, rest)| rest.split('/').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let head = http::Response::builder()
            .status(200)
            .header("content-type", "text/plain")
            .body(())
            .unwrap();
        let Ok(mut stream) = respond.send_response(head, false) else {
            continue;
        };
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-usage-tokens", cost.into());
        let _ = stream
            .send_data(bytes::Bytes::from_static(b"streamed\n"), false)
            .and_then(|()| stream.send_trailers(trailers));
    }
}
