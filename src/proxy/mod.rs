//! The Pingora glue: route, key, decide, then proxy or reject. The only module that knows
//! Pingora's `ProxyHttp`; everything it calls is plain Rust.

pub mod forwarding;
pub mod respond;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use pingora::{Error, ErrorType};

use arc_swap::ArcSwap;

use crate::config::{Config, FailureMode};
use crate::identity::{self, Identity};
use crate::keys::{self, MissingPart, RequestFacts};
use crate::limiter::clock::SystemClock;
use crate::limiter::local::LocalLimiter;
use crate::limiter::{
    Cost, Costs, Decision, Keys, LimitRequest, Limiter, LimiterError, RequestId, RequestIds,
};
use crate::metrics::{self, Metrics, Outcome};
use crate::path::{self, PathPolicy};
use crate::router::{Route, RouteTable};
use respond::{respond, Rejection};

/// Longest request target (path and query) accepted; longer gets `414`.
pub const MAX_URI_LEN: usize = 8 * 1024;
/// Most header bytes (names and values) accepted; more gets `431`.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Per-request state, carried from `request_filter` to `logging`.
#[derive(Default)]
pub struct RequestCtx {
    /// The configuration this request started with.
    active: Option<Arc<Active>>,
    /// When the request reached `request_filter`, and how long its limiter call took.
    started: Option<Instant>,
    limiter_time: std::time::Duration,
    route: Option<Arc<Route>>,
    /// The normalized path when it differs from the one received: the upstream gets this one.
    normalized_path: Option<String>,
    /// The in-process fallback decided this request (`failure_mode: local`).
    decided_locally: bool,
    /// Consistent-hashing key for the upstream pool.
    balance_key: [u8; 8],
    /// Upstream servers that refused the connection: not tried again for this request.
    failed: Vec<std::net::SocketAddr>,
    decision: Option<Decision>,
    outcome: Option<Outcome>,
    /// What the limiter was asked, kept to release concurrency leases when the request ends.
    keys: Keys,
    costs: Costs,
    id: RequestId,
}

impl RequestCtx {
    fn limit_request<'a>(&'a self, route: &'a Route) -> LimitRequest<'a> {
        LimitRequest {
            limits: &route.limits,
            keys: &self.keys,
            costs: &self.costs,
            id: self.id,
            deadline: route.limiter_timeout,
        }
    }
}

/// Each limit's cost for this request; `Err` names what is wrong with a cost header.
fn request_costs(
    limits: &[crate::limiter::Limit],
    headers: &http::HeaderMap,
) -> Result<Costs, &'static str> {
    limits
        .iter()
        .map(|limit| match &limit.cost {
            Cost::Fixed(cost) => Ok(*cost),
            Cost::Header { name, max, default } => match headers.get(name) {
                None => Ok(*default),
                Some(value) => std::str::from_utf8(value.as_bytes())
                    .ok()
                    .and_then(|text| text.trim().parse::<u64>().ok())
                    .filter(|cost| (1..=*max).contains(cost))
                    .ok_or("The cost header must be a whole number within the limit's cost_max."),
            },
        })
        .collect()
}

/// What a configuration decides, swapped whole on reload. A request keeps the one it started
/// with until it ends.
pub struct Active {
    routes: RouteTable,
    identity: Identity,
    paths: PathPolicy,
    failure_mode: FailureMode,
    metrics: Metrics,
    access_log_sample: Option<u64>,
}

impl Active {
    pub fn new(config: Config) -> Active {
        Active {
            metrics: Metrics::new(&config.routes),
            routes: config.routes,
            identity: config.identity,
            paths: config.paths,
            failure_mode: config.failure_mode,
            access_log_sample: config.access_log_sample,
        }
    }
}

/// The configuration in force; `store` a new [`Active`] to reload.
pub type ActiveConfig = Arc<ArcSwap<Active>>;

pub struct Gateway {
    active: ActiveConfig,
    limiter: Arc<dyn Limiter>,
    /// `sluice_limiter_duration_seconds` of this limiter's backend, looked up once.
    limiter_duration: prometheus::Histogram,
    /// Decides `failure_mode: local` requests while Redis is unavailable.
    fallback: LocalLimiter,
    request_ids: RequestIds,
    /// Unix second of the last limiter error logged: at most one line per second.
    last_error_log: AtomicU64,
    /// Requests seen, for access log sampling.
    logged: AtomicU64,
}

impl Gateway {
    pub fn new(active: ActiveConfig, limiter: Arc<dyn Limiter>) -> Gateway {
        Gateway {
            active,
            limiter_duration: metrics::LIMITER_DURATION.with_label_values(&[limiter.backend()]),
            limiter,
            fallback: LocalLimiter::new(Arc::new(SystemClock), crate::app::LOCAL_MAX_KEYS),
            request_ids: RequestIds::new(),
            last_error_log: AtomicU64::new(0),
            logged: AtomicU64::new(0),
        }
    }

    fn log_limiter_error(&self, error: &LimiterError, failure_mode: FailureMode) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.last_error_log.swap(now, Ordering::Relaxed) != now {
            log::warn!(
                "rate limiter unavailable ({}): {error}; failure_mode={} applies",
                error.kind(),
                failure_mode.as_str()
            );
        }
    }
}

/// One structured line per request (`target: sluice::access`): route, decision, denying limit,
/// status, total and limiter time. Client addresses appear here, never in metrics.
fn access_log(session: &Session, ctx: &RequestCtx, outcome: Outcome) {
    let route = ctx.route.as_ref();
    let limit = match (route, &ctx.decision) {
        (Some(route), Some(decision)) => decision
            .denied_by
            .or(decision.shadow_denied_by)
            .and_then(|i| route.limits.get(i))
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
        outcome.label(),
        ctx.limiter_time.as_secs_f64() * 1000.0,
    );
}

/// `414` for an overlong request target, `431` for too many header bytes: before any Redis call.
fn oversized(req: &RequestHeader) -> Option<Rejection<'static>> {
    if req.uri.path_and_query().map_or(0, |pq| pq.as_str().len()) > MAX_URI_LEN {
        return Some(Rejection::UriTooLong);
    }
    let header_bytes: usize = req
        .headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    (header_bytes > MAX_HEADER_BYTES).then_some(Rejection::HeadersTooLarge)
}

/// The request's host, lowercased, without port or trailing dot.
fn request_host(session: &Session) -> Cow<'_, str> {
    let req = session.req_header();
    let raw = req
        .uri
        .host()
        .or_else(|| {
            req.headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("");
    let without_port = match raw.rfind(':') {
        Some(i) if !raw.ends_with(']') && raw[i + 1..].bytes().all(|b| b.is_ascii_digit()) => {
            &raw[..i]
        }
        _ => raw,
    };
    let host = without_port.trim_end_matches('.');
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        let active = self.active.load_full();
        ctx.active = Some(Arc::clone(&active));
        ctx.started = Some(Instant::now());
        if let Some(rejection) = oversized(session.req_header()) {
            ctx.outcome = Some(Outcome::BadRequest);
            respond(session, rejection).await?;
            return Ok(true);
        }
        let route = {
            let host = request_host(session);
            let req = session.req_header();
            let path = match path::normalize(req.uri.path(), active.paths) {
                Ok(path) => path,
                Err(error) => {
                    ctx.outcome = Some(Outcome::BadRequest);
                    respond(session, Rejection::BadRequest(error.detail())).await?;
                    return Ok(true);
                }
            };
            let Some(route) = active.routes.find(&host, &path, &req.method) else {
                ctx.outcome = Some(Outcome::NoRoute);
                respond(session, Rejection::NoRoute).await?;
                return Ok(true);
            };
            let route = Arc::clone(route);
            if let Cow::Owned(normalized) = &path {
                ctx.normalized_path = Some(normalized.clone());
            }
            let peer = session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip());
            let facts = RequestFacts {
                client_ip: active.identity.client(peer, &req.headers),
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
            if route.limits.is_empty() {
                ctx.outcome = Some(Outcome::Allowed);
                ctx.route = Some(route);
                return Ok(false);
            }
            let skipped = match route.keys.build(&facts) {
                Ok(built) => {
                    ctx.keys = built.keys;
                    built.skipped
                }
                Err(MissingPart) => {
                    ctx.outcome = Some(Outcome::BadRequest);
                    ctx.route = Some(route);
                    let detail =
                        "The request lacks a header or query parameter a rate limit is keyed on.";
                    respond(session, Rejection::BadRequest(detail)).await?;
                    return Ok(true);
                }
            };
            match request_costs(&route.limits, &req.headers) {
                Ok(mut costs) => {
                    // A skipped limit is only read (cost 0): it neither counts nor denies.
                    for (i, cost) in costs.iter_mut().enumerate() {
                        if skipped & (1 << i) != 0 {
                            *cost = 0;
                        }
                    }
                    ctx.costs = costs;
                }
                Err(reason) => {
                    ctx.outcome = Some(Outcome::BadRequest);
                    ctx.route = Some(route);
                    respond(session, Rejection::BadRequest(reason)).await?;
                    return Ok(true);
                }
            }
            if route.needs_request_id {
                ctx.id = self.request_ids.next();
            }
            route
        };

        let started = Instant::now();
        let result = self.limiter.check(&ctx.limit_request(&route)).await;
        ctx.limiter_time = started.elapsed();
        self.limiter_duration
            .observe(ctx.limiter_time.as_secs_f64());

        // failure_mode: local — Redis could not decide: this gateway's share decides instead.
        let failure_mode = route.failure_mode.unwrap_or(active.failure_mode);
        let (result, local) = match result {
            Err(error) if failure_mode == FailureMode::Local && !error.always_denies() => {
                metrics::LIMITER_ERRORS
                    .with_label_values(&[error.kind()])
                    .inc();
                self.log_limiter_error(&error, failure_mode);
                let request = LimitRequest {
                    limits: &route.local_limits,
                    ..ctx.limit_request(&route)
                };
                (self.fallback.check(&request).await, true)
            }
            other => (other, false),
        };
        ctx.decided_locally = local;
        let handled = match result {
            Ok(decision) if decision.allowed() => {
                // A shadow limit said no: count it, let the request through.
                let shadowed = decision.shadow_denied_by.is_some();
                ctx.outcome = Some(match (local, shadowed) {
                    (true, _) => Outcome::LocalAllowed,
                    (false, true) => Outcome::ShadowLimited,
                    (false, false) => Outcome::Allowed,
                });
                let delay = decision.delay_ms();
                ctx.decision = Some(decision);
                if delay > 0 {
                    // Shaping (max_delay): the slot is reserved; hold the request until it comes.
                    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                }
                false
            }
            Ok(decision) => {
                ctx.outcome = Some(if local {
                    Outcome::LocalLimited
                } else {
                    Outcome::Limited
                });
                respond(
                    session,
                    Rejection::Limited {
                        route: &route,
                        decision: &decision,
                    },
                )
                .await?;
                ctx.decision = Some(decision);
                true
            }
            Err(error) => {
                metrics::LIMITER_ERRORS
                    .with_label_values(&[error.kind()])
                    .inc();
                self.log_limiter_error(&error, failure_mode);
                match failure_mode {
                    FailureMode::Allow if !error.always_denies() => {
                        ctx.outcome = Some(Outcome::ErrorAllowed);
                        false
                    }
                    _ => {
                        ctx.outcome = Some(Outcome::ErrorDenied);
                        respond(session, Rejection::LimiterUnavailable).await?;
                        true
                    }
                }
            }
        };
        ctx.route = Some(route);
        Ok(handled)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let route = ctx.route.as_ref().ok_or_else(|| {
            Error::explain(
                ErrorType::InternalError,
                "no route selected for the request",
            )
        })?;
        let upstream = &route.upstream;
        let addr = upstream
            .pick(&ctx.balance_key, &ctx.failed)
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::ConnectNoRoute,
                    "no healthy upstream server left to try",
                )
            })?;
        let mut peer = Box::new(HttpPeer::new(addr, false, String::new()));
        peer.options.connection_timeout = Some(upstream.settings.connect_timeout);
        peer.options.read_timeout = Some(upstream.settings.read_timeout);
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
        let retries = ctx
            .route
            .as_ref()
            .map_or(0, |r| r.upstream.settings.retries);
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
            if let Some(host) = &upstream.settings.host {
                upstream_request.insert_header(http::header::HOST, host.clone())?;
            }
        }
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| identity::canonical(a.ip()));
        let trusted = ctx
            .active
            .as_ref()
            .is_some_and(|a| a.identity.is_trusted_peer(peer));
        forwarding::set_headers(upstream_request, peer, trusted)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if let (Some(route), Some(decision)) = (&ctx.route, &ctx.decision) {
            respond::add_ratelimit_headers(upstream_response, route, decision)?;
        }
        Ok(())
    }

    async fn logging(&self, session: &mut Session, _error: Option<&Error>, ctx: &mut RequestCtx) {
        let Some(active) = ctx.active.clone() else {
            return; // the request failed before it was routed (e.g. a malformed request)
        };
        let route_metrics = match &ctx.route {
            Some(route) => active.metrics.route(route.index),
            None => active.metrics.unmatched(),
        };
        let Some(outcome) = ctx.outcome else {
            return; // the request failed before it was routed (e.g. a malformed request)
        };
        route_metrics.count(outcome);
        let admitted = matches!(
            outcome,
            Outcome::Allowed | Outcome::ShadowLimited | Outcome::LocalAllowed
        );
        if let (true, Some(route)) = (admitted, &ctx.route) {
            // The response is finished or the client has gone: return concurrency leases.
            if route.holds_leases {
                let released = if ctx.decided_locally {
                    let request = LimitRequest {
                        limits: &route.local_limits,
                        ..ctx.limit_request(route)
                    };
                    self.fallback.release(&request).await
                } else {
                    self.limiter.release(&ctx.limit_request(route)).await
                };
                if let Err(error) = released {
                    metrics::LIMITER_ERRORS
                        .with_label_values(&[error.kind()])
                        .inc();
                    self.log_limiter_error(&error, active.failure_mode);
                }
            }
        }
        if matches!(
            outcome,
            Outcome::Allowed | Outcome::ShadowLimited | Outcome::ErrorAllowed
        ) {
            if let Some(response) = session.response_written() {
                route_metrics.count_upstream_status(response.status.as_u16());
            }
        }
        if let Some(sample) = active.access_log_sample {
            if self.logged.fetch_add(1, Ordering::Relaxed) % sample == 0 {
                access_log(session, ctx, outcome);
            }
        }
    }
}
