//! The Pingora glue: route, key, decide, then proxy or reject. The only module that knows
//! Pingora's `ProxyHttp`; what it calls is plain Rust (the router, keys, the limiter policy).

mod access;
pub mod forwarding;
pub mod front;
pub mod request;
pub mod request_id;
pub mod respond;
mod trace;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::protocols::ALPN;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType};
use smallvec::SmallVec;

use crate::identity;
use crate::keys::{self, RequestFacts};
use crate::limiter::{
    Asks, CostReport, Policy, Rejection, RequestIds, UpstreamFailure, Verdict, LIMITS_INLINE,
};
use crate::metrics::{InFlight, UpstreamError};
use crate::path;
use crate::router::Route;
use crate::snapshot::{Live, Snapshot};
use crate::traces::TracerSlot;
use opentelemetry_sdk::trace::SdkTracer;
use respond::{respond, RequestIdHeader};

/// Requests one HTTP/2 connection to an upstream carries at once.
const UPSTREAM_H2_STREAMS: usize = 100;

/// Per-request state, carried from `request_filter` to `logging`.
#[derive(Default)]
pub struct RequestCtx {
    /// The configuration this request started with.
    snapshot: Option<Arc<Snapshot>>,
    /// When the request reached `request_filter`.
    started: Option<Instant>,
    /// When the route's `request_timeout` runs out.
    deadline: Option<Instant>,
    /// Request body bytes received so far.
    body_bytes: u64,
    route: Option<Arc<Route>>,
    /// The normalized path when it differs from the one received: the upstream gets this one.
    normalized_path: Option<String>,
    /// The form the request target came in.
    target: Option<request::Target>,
    /// The peer is one of `trusted_proxies` (its forwarding headers and request id count).
    trusted_peer: bool,
    /// The client the request is keyed on (the peer, or the first untrusted forwarding hop).
    client: Option<std::net::IpAddr>,
    /// Consistent-hashing key for the upstream pool.
    balance_key: [u8; 8],
    /// Upstream servers that refused the connection: not tried again for this request.
    failed: Vec<SocketAddr>,
    /// What the request asked of each limit of its route, kept to settle it when it ends.
    asks: Asks,
    verdict: Option<Verdict>,
    /// The front door's clock of this connection (HTTP/1).
    connection: Option<Arc<front::HeadClock>>,
    /// The request's id (`request_id:`), as sent upstream and returned.
    request_id: Option<http::HeaderValue>,
    /// Counts the routed request in flight until it ends.
    in_flight: Option<InFlight>,
    /// The upstream server last chosen.
    upstream: Option<SocketAddr>,
    /// When the first upstream connection attempt began.
    upstream_started: Option<Instant>,
    /// From the first attempt to the upstream's response head.
    upstream_time: Option<std::time::Duration>,
    /// Why the last upstream attempt failed.
    upstream_error: Option<UpstreamError>,
    /// Upstream connection attempts that failed (counted when they did).
    failed_connects: usize,
    /// The request's spans, when tracing is on.
    trace: Option<trace::RequestTrace>,
    /// What the response said it cost, per limit of the route (`cost_from_response`); empty
    /// until a response head arrives on a route with such limits.
    cost_reports: SmallVec<[CostReport; LIMITS_INLINE]>,
}

impl RequestCtx {
    /// The request id and the header that carries it.
    fn request_id_header(&self) -> Option<RequestIdHeader<'_>> {
        let settings = self.snapshot.as_ref()?.config.request_id.as_ref()?;
        Some(RequestIdHeader {
            name: &settings.header,
            value: self.request_id.as_ref()?,
        })
    }
}

pub struct Gateway {
    live: Live,
    policy: Arc<Policy>,
    /// Makes the ids of requests that come without an accepted one.
    ids: RequestIds,
    /// Makes the requests' spans (`tracing:`), once the pipeline runs.
    tracing: Option<TracerSlot>,
}

impl Gateway {
    pub fn new(live: Live, policy: Arc<Policy>, tracing: Option<TracerSlot>) -> Gateway {
        Gateway {
            live,
            policy,
            ids: RequestIds::new(),
            tracing,
        }
    }

    fn tracer(&self) -> Option<&SdkTracer> {
        self.tracing.as_ref()?.get().map(|t| &t.tracer)
    }
}

/// Reads what `headers` (the upstream's response head, or its trailers) say the response cost,
/// for each limit of the route priced by the response; a report found replaces one held.
fn read_cost_reports(ctx: &mut RequestCtx, headers: &http::HeaderMap) {
    let Some(route) = ctx.route.as_ref().filter(|r| r.limits.priced_by_response()) else {
        return;
    };
    let limits = route.limits.limits();
    ctx.cost_reports.resize(limits.len(), CostReport::Missing);
    for (report, limit) in ctx.cost_reports.iter_mut().zip(limits) {
        let Some(price) = &limit.priced_by_response else {
            continue;
        };
        match price.read(headers) {
            CostReport::Missing => {}
            found => *report = found,
        }
    }
}

/// The limit that decided a request: the one that denied it, or the shadow limit that would
/// have.
fn deciding_limit<'a>(route: Option<&'a Route>, verdict: &Verdict) -> Option<&'a str> {
    let decision = verdict.decision.as_ref()?;
    let index = decision.denied_by.or(decision.shadow_denied_by)?;
    route?.limits.limits().get(index).map(|l| &*l.name)
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
    let target = request::target(req)?;
    ctx.target = Some(target);
    request::check_host(req)?;
    let config = &snapshot.config;
    let host = request::host(req);
    let path = match target {
        request::Target::Asterisk => Cow::Borrowed("/"),
        _ => path::normalize(req.uri.path(), config.paths)
            .map_err(|error| Rejection::BadRequest(error.detail()))?,
    };
    let route = config
        .routes
        .find(&host, &path, &req.method)
        .ok_or(Rejection::NoRoute)?;
    ctx.route = Some(Arc::clone(route));
    if let Some(max) = route.max_body_bytes {
        if request::declared_body_length(req).is_some_and(|length| length > max) {
            return Err(Rejection::BodyTooLarge);
        }
    }
    if let Cow::Owned(normalized) = &path {
        ctx.normalized_path = Some(normalized.clone());
    }
    let client_ip = config.identity.client(peer, &req.headers);
    ctx.client = Some(client_ip);
    let facts = RequestFacts {
        client_ip,
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

/// Holds an admitted request for its shaping delay (`max_delay`): its slot is reserved, it goes
/// on when the slot comes. `false` when its client leaves meanwhile (HTTP/2: the stream is
/// reset; HTTP/1: the connection is closed, seen in the kernel's TCP state without reading).
async fn hold(session: &mut Session, delay: std::time::Duration) -> bool {
    if let Some(closed) = session.as_downstream_mut().watch_h2_stream_close() {
        return tokio::select! {
            () = tokio::time::sleep(delay) => true,
            _ = closed => false,
        };
    }
    let until = tokio::time::Instant::now() + delay;
    let mut look = tokio::time::interval(std::time::Duration::from_millis(20));
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(until) => return true,
            _ = look.tick() => if client_left(session) {
                return false;
            },
        }
    }
}

/// The client has closed its side of the connection: TCP `CLOSE_WAIT`, `LAST_ACK` or `CLOSE`.
fn client_left(session: &Session) -> bool {
    const CLOSE: u8 = 7;
    const CLOSE_WAIT: u8 = 8;
    const LAST_ACK: u8 = 9;
    session
        .digest()
        .and_then(|digest| digest.socket_digest.as_ref())
        .and_then(|socket| socket.tcp_info())
        .is_some_and(|info| matches!(info.tcpi_state, CLOSE | CLOSE_WAIT | LAST_ACK))
}

/// `504` once the route's `request_timeout` has run out.
fn past_deadline(ctx: &RequestCtx) -> pingora::Result<()> {
    match ctx.deadline {
        Some(deadline) if Instant::now() >= deadline => Err(Error::explain(
            ErrorType::HTTPStatus(UpstreamFailure::TimedOut.status()),
            "the route's request_timeout ran out",
        )),
        _ => Ok(()),
    }
}

/// What the gateway answers for a request it could not proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// The client is gone: nothing to answer.
    Nothing,
    Rejection(Rejection),
    Upstream(UpstreamFailure),
    Status(u16),
}

fn failure_answer(error: &Error) -> Answer {
    use ErrorType::*;
    match (error.etype(), error.esource()) {
        (HTTPStatus(413), _) => Answer::Rejection(Rejection::BodyTooLarge),
        (HTTPStatus(504), _) => Answer::Upstream(UpstreamFailure::TimedOut),
        (HTTPStatus(code), _) => Answer::Status(*code),
        (ConnectTimedout, _) | (ReadTimedout | WriteTimedout, ErrorSource::Upstream) => {
            Answer::Upstream(UpstreamFailure::TimedOut)
        }
        (ReadError | WriteError | ConnectionClosed, ErrorSource::Downstream) => Answer::Nothing,
        (_, ErrorSource::Downstream) => Answer::Status(400),
        (ConnectNoRoute | ConnectRefused | ConnectError | ConnectProxyFailure, _)
        | (_, ErrorSource::Upstream) => Answer::Upstream(UpstreamFailure::Unreachable),
        _ => Answer::Status(500),
    }
}

/// What kind of upstream failure `error` is, if it is one.
fn upstream_error(error: &Error) -> Option<UpstreamError> {
    use ErrorType::*;
    Some(match (error.etype(), error.esource()) {
        (ConnectRefused, _) => UpstreamError::Refused,
        (ConnectTimedout | TLSHandshakeTimedout, _) => UpstreamError::Timeout,
        (HTTPStatus(504), _) => UpstreamError::Timeout,
        (ReadTimedout | WriteTimedout, ErrorSource::Upstream) => UpstreamError::Timeout,
        (TLSHandshakeFailure | TLSWantX509Lookup | InvalidCert | HandshakeError, _) => {
            UpstreamError::Tls
        }
        (
            ConnectionClosed | ReadError | WriteError | H2Error | InvalidHTTPHeader,
            ErrorSource::Upstream,
        ) => UpstreamError::Reset,
        (ConnectNoRoute | ConnectError | ConnectProxyFailure | SocketError | BindError, _) => {
            UpstreamError::Unreachable
        }
        (_, ErrorSource::Upstream) => UpstreamError::Unreachable,
        _ => return None,
    })
}

/// An error of the connection phase: `fail_to_connect` has counted it already.
fn connect_phase(error: &Error) -> bool {
    use ErrorType::*;
    matches!(
        error.etype(),
        ConnectRefused
            | ConnectTimedout
            | ConnectError
            | ConnectProxyFailure
            | SocketError
            | BindError
            | TLSHandshakeFailure
            | TLSHandshakeTimedout
            | TLSWantX509Lookup
            | InvalidCert
            | HandshakeError
    )
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    /// The front door's clock for this connection (`front.rs`).
    fn on_connection_reuse(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
        previous: Box<dyn std::any::Any + Send + Sync>,
    ) {
        if let Ok(connection) = previous.downcast::<front::Connection>() {
            ctx.connection = Some(connection.0);
        }
    }

    /// The head has arrived: the request's clock starts, and the front door's head deadline
    /// no longer applies.
    async fn early_request_filter(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        ctx.started = Some(Instant::now());
        if let Some(clock) = &ctx.connection {
            clock.head_received();
        }
        Ok(())
    }

    /// The connection has served a request: its next one gets the keep-alive deadline.
    fn persist_connection_context(
        &self,
        _session: &Session,
        ctx: &RequestCtx,
    ) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        let clock = ctx.connection.clone().unwrap_or_default();
        Some(Box::new(front::Connection(clock)))
    }

    /// Route → identity and keys → policy → respond, or go on to the upstream.
    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        let snapshot = self.live.load_full();
        let started = *ctx.started.get_or_insert_with(Instant::now);
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        ctx.trusted_peer = snapshot
            .config
            .identity
            .is_trusted_peer(peer.map(identity::canonical));
        if let Some(settings) = &snapshot.config.request_id {
            let headers = &session.req_header().headers;
            ctx.request_id = Some(request_id::assign(
                settings,
                headers,
                ctx.trusted_peer,
                &self.ids,
            ));
        }
        if let Some(tracer) = self.tracer() {
            let req = session.req_header();
            ctx.trace = Some(trace::RequestTrace::start(
                tracer,
                &req.headers,
                req.method.as_str(),
            ));
        }
        let prepared = prepare(session.req_header(), peer, &snapshot, ctx);
        if let Some(route) = &ctx.route {
            ctx.in_flight = Some(snapshot.metrics.route(route.index).in_flight());
        }
        let verdict = match prepared {
            Ok(()) => match &ctx.route {
                Some(route) => self.policy.decide(&route.limits, &ctx.asks).await,
                None => Verdict::rejected(Rejection::NoRoute),
            },
            Err(rejection) => Verdict::rejected(rejection),
        };
        if let (Some(tracer), Some(trace)) = (self.tracer(), &ctx.trace) {
            trace.limiter(
                tracer,
                &verdict,
                deciding_limit(ctx.route.as_deref(), &verdict),
            );
        }
        ctx.snapshot = Some(snapshot);
        ctx.deadline = ctx
            .route
            .as_ref()
            .and_then(|route| route.request_timeout)
            .map(|timeout| started + timeout);
        let (rejection, delay) = (verdict.rejection, verdict.delay);
        ctx.verdict = Some(verdict);
        if let Some(rejection) = rejection {
            let decision = ctx.verdict.as_ref().and_then(|v| v.decision.as_ref());
            let limited = ctx.route.as_deref().zip(decision);
            respond(session, rejection, limited, ctx.request_id_header()).await?;
            return Ok(true);
        }
        if session.is_upgrade_req() {
            // A WebSocket (or other upgraded) connection may idle as long as its upstream may:
            // the route's read timeout bounds both directions of the tunnel.
            let idle = ctx.route.as_ref().map(|route| route.upstream.read_timeout);
            session.set_read_timeout(idle);
        }
        if !delay.is_zero() && !hold(session, delay).await {
            // Its client left while it waited: it does not go upstream, and the units it
            // reserved go back.
            if let (Some(route), Some(verdict)) = (&ctx.route, &ctx.verdict) {
                self.policy
                    .give_back(&route.limits, &ctx.asks, verdict)
                    .await;
            }
            return Err(Error::explain(
                ErrorType::ConnectionClosed,
                "the client left while its request was held for shaping",
            )
            .into_down());
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
        let pool = snapshot.pools.route(route.index);
        let addr = pool
            .and_then(|pool| pool.pick(&ctx.balance_key, &ctx.failed))
            .ok_or_else(|| {
                Error::explain(
                    ErrorType::ConnectNoRoute,
                    "no healthy upstream server left to try",
                )
            })?;
        ctx.upstream = Some(addr);
        ctx.upstream_started.get_or_insert_with(Instant::now);
        if let (Some(tracer), Some(trace)) = (self.tracer(), &mut ctx.trace) {
            trace.upstream_started(tracer, addr);
        }
        let tls = pool.and_then(|pool| pool.tls.as_ref());
        let sni = tls.map_or_else(String::new, |tls| tls.sni.clone());
        let mut peer = Box::new(HttpPeer::new(addr, tls.is_some(), sni));
        if let Some(tls) = tls {
            peer.options.verify_cert = tls.verify;
            peer.options.verify_hostname = tls.verify;
            peer.options.ca = tls.ca.clone();
            peer.client_cert_key = tls.client.clone();
            peer.group_key = tls.reuse_group;
        }
        let upstream = &route.upstream;
        if upstream.http2 {
            // Over TLS by ALPN; in the clear with prior knowledge (gRPC upstreams).
            peer.options.alpn = ALPN::H2;
            peer.options.max_h2_streams = UPSTREAM_H2_STREAMS;
        }
        // Every wait on the upstream ends by the route's deadline, when it has one.
        let bounded = |timeout: std::time::Duration| match ctx.deadline {
            Some(deadline) => timeout.min(deadline.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        if ctx
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return Err(Error::explain(
                ErrorType::HTTPStatus(504),
                "the route's request_timeout ran out",
            ));
        }
        peer.options.connection_timeout = Some(bounded(upstream.connect_timeout));
        peer.options.read_timeout = Some(bounded(upstream.read_timeout));
        if let Some(deadline) = ctx.deadline {
            peer.options.write_timeout = Some(deadline.saturating_duration_since(Instant::now()));
        }
        Ok(peer)
    }

    /// Counts the body against the route's `max_body_bytes` (`413` once it is exceeded).
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let received = body.as_ref().map_or(0, |b| b.len() as u64);
        ctx.body_bytes += received;
        let max = ctx.route.as_ref().and_then(|route| route.max_body_bytes);
        if max.is_some_and(|max| ctx.body_bytes > max) {
            return Err(Error::explain(
                ErrorType::HTTPStatus(Rejection::BodyTooLarge.status()),
                "the request body exceeds the route's max_body_bytes",
            ));
        }
        past_deadline(ctx)
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Option<std::time::Duration>> {
        past_deadline(ctx).map(|()| None)
    }

    /// The request could not be proxied: answer with what went wrong, in the problem style of
    /// the gateway's other answers (`502` unreachable, `504` too slow, `413` too large).
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        error: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if let Some(kind) = upstream_error(error) {
            ctx.upstream_error = Some(kind);
            if let Some(trace) = &mut ctx.trace {
                trace.upstream_failed(kind.label());
            }
            // A failed connection was counted by fail_to_connect.
            if ctx.failed_connects == 0 || !connect_phase(error) {
                if let (Some(snapshot), Some(route)) = (&ctx.snapshot, &ctx.route) {
                    snapshot
                        .metrics
                        .route(route.index)
                        .count_upstream_error(kind);
                }
            }
        }
        let answer = failure_answer(error);
        let code = match answer {
            Answer::Nothing => 0,
            Answer::Rejection(rejection) => rejection.status(),
            Answer::Upstream(failure) => failure.status(),
            Answer::Status(code) => code,
        };
        if session.response_written().is_none() {
            let id = ctx.request_id_header();
            let written = match answer {
                Answer::Nothing => Ok(()),
                Answer::Rejection(rejection) => respond(session, rejection, None, id).await,
                Answer::Upstream(failure) => {
                    respond::respond_upstream_failure(session, failure, id).await
                }
                Answer::Status(code) => session.respond_error(code).await,
            };
            if let Err(e) = written {
                log::debug!("could not answer a failed request: {e}");
            }
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// A server that refused the connection never saw the request: try another, up to `retries`.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut error: Box<Error>,
    ) -> Box<Error> {
        ctx.failed_connects += 1;
        if let (Some(kind), Some(snapshot), Some(route)) =
            (upstream_error(&error), &ctx.snapshot, &ctx.route)
        {
            ctx.upstream_error = Some(kind);
            snapshot
                .metrics
                .route(route.index)
                .count_upstream_error(kind);
            if let Some(trace) = &mut ctx.trace {
                trace.upstream_failed(kind.label());
            }
        }
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
            // Only a request whose target changes pays for building a new one: a changed path,
            // or an absolute-form target (the upstream gets the origin form). `OPTIONS *` goes
            // as it came.
            let target = match ctx.target {
                Some(request::Target::Asterisk) => None,
                form => {
                    let uri = &upstream_request.uri;
                    let decided = ctx.normalized_path.as_deref().unwrap_or(uri.path());
                    let path = upstream.upstream_path(decided);
                    let rewrite = path != uri.path() || form == Some(request::Target::Absolute);
                    rewrite.then(|| match uri.query() {
                        Some(query) => format!("{path}?{query}"),
                        None => path.into_owned(),
                    })
                }
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
        let host = session
            .req_header()
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok());
        let tls = session
            .digest()
            .is_some_and(|digest| digest.ssl_digest.is_some());
        let hop = forwarding::Hop {
            peer,
            trusted: ctx.trusted_peer,
            client: ctx.client,
            proto: if tls { "https" } else { "http" },
            host,
            port: session
                .server_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.port()),
        };
        forwarding::set_headers(upstream_request, hop)?;
        if let Some(id) = ctx.request_id_header() {
            upstream_request.insert_header(id.name.clone(), id.value.clone())?;
        }
        if let Some(trace) = &ctx.trace {
            trace.inject(upstream_request);
        }
        Ok(())
    }

    /// The upstream's response head has arrived: the upstream time ends here.
    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if ctx.upstream_time.is_none() {
            ctx.upstream_time = ctx.upstream_started.map(|started| started.elapsed());
        }
        if let Some(trace) = &mut ctx.trace {
            trace.upstream_answered(upstream_response.status.as_u16());
        }
        read_cost_reports(ctx, &upstream_response.headers);
        Ok(())
    }

    /// Trailers (HTTP/2 and gRPC upstreams) may report what the response cost: a trailer
    /// overrides the header of the same name.
    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        upstream_trailers: &mut http::HeaderMap,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        read_cost_reports(ctx, upstream_trailers);
        Ok(())
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
        respond::add_request_id(upstream_response, ctx.request_id_header())
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
        let status = session.response_written().map(|r| r.status.as_u16());
        if let (Some(status), Some(started)) = (status, ctx.started) {
            route_metrics.observe_duration(status, started.elapsed());
        }
        if let Some(upstream_time) = ctx.upstream_time {
            route_metrics.observe_upstream(upstream_time);
        }
        if let Some(route) = &ctx.route {
            route_metrics.count_limits(route.limits.limits(), verdict);
            self.policy.finish(&route.limits, &ctx.asks, verdict).await;
            if route.limits.priced_by_response() && verdict.admitted() {
                route_metrics.count_response_costs(&ctx.cost_reports);
                self.policy
                    .settle_response(&route.limits, &ctx.asks, verdict, &ctx.cost_reports)
                    .await;
            }
        }
        if let (true, Some(status)) = (verdict.outcome.admitted(), status) {
            route_metrics.count_upstream_status(status);
        }
        if let Some(access_log) = &snapshot.access_log {
            access::log(access_log, session, ctx, verdict);
        }
        if let Some(trace) = ctx.trace.take() {
            let req = session.req_header();
            trace.finish(&trace::Ended {
                method: req.method.as_str(),
                path: ctx.normalized_path.as_deref().unwrap_or(req.uri.path()),
                route: ctx.route.as_deref().map(|r| &*r.name),
                status: status.unwrap_or(0),
                decision: verdict.outcome.label(),
                limit: deciding_limit(ctx.route.as_deref(), verdict),
                client: ctx.client,
                request_id: ctx.request_id.as_ref().and_then(|id| id.to_str().ok()),
            });
        }
        ctx.in_flight = None;
    }
}
