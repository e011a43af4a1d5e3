//! The Pingora glue: route, key, decide, then proxy or reject. The only module that knows
//! Pingora's `ProxyHttp`; what it calls is plain Rust (the router, keys, the limiter policy).

pub mod forwarding;
pub mod request;
pub mod respond;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use pingora::{Error, ErrorType};

use crate::identity;
use crate::keys::{self, RequestFacts};
use crate::limiter::{Asks, Policy, Rejection, Verdict};
use crate::path;
use crate::router::Route;
use crate::snapshot::{Live, Snapshot};
use respond::respond;

/// Per-request state, carried from `request_filter` to `logging`.
#[derive(Default)]
pub struct RequestCtx {
    /// The configuration this request started with.
    snapshot: Option<Arc<Snapshot>>,
    /// When the request reached `request_filter`.
    started: Option<Instant>,
    route: Option<Arc<Route>>,
    /// The normalized path when it differs from the one received: the upstream gets this one.
    normalized_path: Option<String>,
    /// Consistent-hashing key for the upstream pool.
    balance_key: [u8; 8],
    /// Upstream servers that refused the connection: not tried again for this request.
    failed: Vec<SocketAddr>,
    /// What the request asked of each limit of its route, kept to settle it when it ends.
    asks: Asks,
    verdict: Option<Verdict>,
}

pub struct Gateway {
    live: Live,
    policy: Arc<Policy>,
    /// Requests seen, for access log sampling.
    logged: AtomicU64,
}

impl Gateway {
    pub fn new(live: Live, policy: Arc<Policy>) -> Gateway {
        Gateway {
            live,
            policy,
            logged: AtomicU64::new(0),
        }
    }
}

/// Finds the request's route and what it asks of each limit (`ctx.route`, `ctx.asks`,
/// `ctx.balance_key`); `Err` when the gateway answers the request itself.
fn prepare(
    req: &RequestHeader,
    peer: Option<std::net::IpAddr>,
    snapshot: &Snapshot,
    ctx: &mut RequestCtx,
) -> Result<(), Rejection> {
    if let Some(rejection) = request::oversized(req) {
        return Err(rejection);
    }
    let config = &snapshot.config;
    let host = request::host(req);
    let path = path::normalize(req.uri.path(), config.paths)
        .map_err(|error| Rejection::BadRequest(error.detail()))?;
    let route = config
        .routes
        .find(&host, &path, &req.method)
        .ok_or(Rejection::NoRoute)?;
    ctx.route = Some(Arc::clone(route));
    if let Cow::Owned(normalized) = &path {
        ctx.normalized_path = Some(normalized.clone());
    }
    let facts = RequestFacts {
        client_ip: config.identity.client(peer, &req.headers),
        method: req.method.as_str(),
        host: &host,
        path: &path,
        query: req.uri.query(),
        headers: &req.headers,
        route: &route.name,
    };
    if let Some(parts) = route.upstream.hash_parts() {
        ctx.balance_key = keys::digest_parts(&facts, parts).to_be_bytes();
    }
    if !route.limits.is_empty() {
        ctx.asks = route.asks(&facts)?;
    }
    Ok(())
}

/// One structured line per request (`target: sluice::access`): route, decision, denying limit,
/// status, total and limiter time. Client addresses appear here, never in metrics.
fn access_log(session: &Session, ctx: &RequestCtx, verdict: &Verdict) {
    let route = ctx.route.as_ref();
    let limit = match (route, &verdict.decision) {
        (Some(route), Some(decision)) => decision
            .denied_by
            .or(decision.shadow_denied_by)
            .and_then(|i| route.limits.limits().get(i))
            .map_or("-", |l| &*l.name),
        _ => "-",
    };
    let status = session.response_written().map_or(0, |r| r.status.as_u16());
    let peer = session
        .client_addr()
        .map_or_else(|| "-".to_string(), |a| a.to_string());
    let total_ms = ctx
        .started
        .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1000.0);
    log::info!(
        target: "sluice::access",
        "peer={peer} method={} path={:?} route={} decision={} limit={limit} status={status} total_ms={total_ms:.3} limiter_ms={:.3}",
        session.req_header().method,
        session.req_header().uri.path(),
        route.map_or("-", |r| &*r.name),
        verdict.outcome.label(),
        verdict.limiter_time.as_secs_f64() * 1000.0,
    );
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    /// Route → identity and keys → policy → respond, or go on to the upstream.
    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        let snapshot = self.live.load_full();
        ctx.started = Some(Instant::now());
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let verdict = match prepare(session.req_header(), peer, &snapshot, ctx) {
            Ok(()) => match &ctx.route {
                Some(route) => self.policy.decide(&route.limits, &ctx.asks).await,
                None => Verdict::rejected(Rejection::NoRoute),
            },
            Err(rejection) => Verdict::rejected(rejection),
        };
        ctx.snapshot = Some(snapshot);
        let (rejection, delay) = (verdict.rejection, verdict.delay);
        let verdict = ctx.verdict.insert(verdict);
        if let Some(rejection) = rejection {
            let limited = ctx.route.as_deref().zip(verdict.decision.as_ref());
            respond(session, rejection, limited).await?;
            return Ok(true);
        }
        if !delay.is_zero() {
            // Shaping (max_delay): the slot is reserved; hold the request until it comes.
            tokio::time::sleep(delay).await;
        }
        Ok(false)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let (Some(route), Some(snapshot)) = (&ctx.route, &ctx.snapshot) else {
            return Err(Error::explain(
                ErrorType::InternalError,
                "no route selected for the request",
            ));
        };
        let addr = snapshot
            .pools
            .route(route.index)
            .and_then(|pool| pool.pick(&ctx.balance_key, &ctx.failed))
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::ConnectNoRoute,
                    "no healthy upstream server left to try",
                )
            })?;
        let mut peer = Box::new(HttpPeer::new(addr, false, String::new()));
        peer.options.connection_timeout = Some(route.upstream.connect_timeout);
        peer.options.read_timeout = Some(route.upstream.read_timeout);
        Ok(peer)
    }

    /// A server that refused the connection never saw the request: try another, up to `retries`.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut error: Box<Error>,
    ) -> Box<Error> {
        let retries = ctx.route.as_ref().map_or(0, |r| r.upstream.retries);
        if let Some(addr) = peer._address.as_inet() {
            if ctx.failed.len() < retries {
                ctx.failed.push(*addr);
                error.set_retry(true);
            }
        }
        error
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if let Some(route) = &ctx.route {
            let upstream = &route.upstream;
            // Only a request whose path changes pays for building a new target.
            let target = {
                let uri = &upstream_request.uri;
                let decided = ctx.normalized_path.as_deref().unwrap_or(uri.path());
                let path = upstream.upstream_path(decided);
                (path != uri.path()).then(|| match uri.query() {
                    Some(query) => format!("{path}?{query}"),
                    None => path.into_owned(),
                })
            };
            if let Some(target) = target {
                let uri = target.parse().map_err(|e| {
                    Error::because(ErrorType::InternalError, "rewritten path is not a URI", e)
                })?;
                upstream_request.set_uri(uri);
            }
            if let Some(host) = &upstream.host {
                upstream_request.insert_header(http::header::HOST, host.clone())?;
            }
        }
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| identity::canonical(a.ip()));
        let trusted = ctx
            .snapshot
            .as_ref()
            .is_some_and(|s| s.config.identity.is_trusted_peer(peer));
        forwarding::set_headers(upstream_request, peer, trusted)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let decision = ctx.verdict.as_ref().and_then(|v| v.decision.as_ref());
        if let (Some(route), Some(decision)) = (&ctx.route, decision) {
            respond::add_ratelimit_headers(upstream_response, route, decision)?;
        }
        Ok(())
    }

    /// The request has ended: count it, give back its concurrency slots, log it.
    async fn logging(&self, session: &mut Session, _error: Option<&Error>, ctx: &mut RequestCtx) {
        // A request that failed before it was routed (e.g. malformed) has neither.
        let (Some(snapshot), Some(verdict)) = (&ctx.snapshot, &ctx.verdict) else {
            return;
        };
        let route_metrics = match &ctx.route {
            Some(route) => snapshot.metrics.route(route.index),
            None => snapshot.metrics.unmatched(),
        };
        route_metrics.count(verdict.outcome);
        if let Some(route) = &ctx.route {
            self.policy.finish(&route.limits, &ctx.asks, verdict).await;
        }
        if verdict.outcome.admitted() {
            if let Some(response) = session.response_written() {
                route_metrics.count_upstream_status(response.status.as_u16());
            }
        }
        if let Some(sample) = snapshot.config.access_log_sample {
            if self.logged.fetch_add(1, Ordering::Relaxed) % sample == 0 {
                access_log(session, ctx, verdict);
            }
        }
    }
}
