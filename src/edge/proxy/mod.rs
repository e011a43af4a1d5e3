//! The Pingora adapter: each hook converts Pingora's types into the request's [`Exchange`]
//! (which routes, decides, chooses servers and settles, knowing no Pingora type) and renders
//! its answers out. Besides that, only what is HTTP-on-the-wire lives here: the front door's
//! deadlines, forwarding headers, request ids, spans, the access log line and the responses.

mod access;
mod caller;
pub(crate) mod forwarding;
pub(crate) mod front;
mod head_clock;
pub(crate) mod head_count;
pub(crate) mod preface;
pub(crate) mod request_id;
pub(crate) mod respond;
mod stream;
mod trace;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http::HeaderValue;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::protocols::ALPN;
use pingora::proxy::{FailToProxy, ProxyHttp, ProxyWarnLogContext, Session};
use pingora::{Error, ErrorSource, ErrorType};

use crate::caller::address;
use crate::edge::drain::Drain;
use crate::edge::tls;
use crate::exchange::answer::{Answer, ClientError, UpstreamError};
use crate::exchange::{Admission, Cut, Dial, Exchange, Head};
use crate::limiter::Policy;
use crate::observe::traces::TracerSlot;
use crate::route::upstream::RetryCause;
use crate::runtime::snapshot::InForce;
use crate::upstream::pool::Pool;
use crate::upstream::tls::PeerTls;
use opentelemetry_sdk::trace::SdkTracer;
use respond::{respond, RequestIdHeader};

/// Requests one HTTP/2 connection to an upstream carries at once.
const UPSTREAM_H2_STREAMS: usize = 100;

/// Per-request state: what the connection says of the request, and its exchange.
#[derive(Default)]
pub struct RequestCtx {
    /// When the request's head arrived.
    started: Option<Instant>,
    /// The peer is one of `trusted_proxies` (its forwarding headers and request id count).
    trusted_peer: bool,
    /// The request's id (`request_id:`), as sent upstream and returned.
    request_id: Option<HeaderValue>,
    /// The request's spans, when tracing is on.
    trace: Option<trace::RequestTrace>,
    /// The request's lifecycle, from `request_filter` on. Boxed: the context lives inside
    /// Pingora's per-request future, which is moved whole more than once per request, and the
    /// exchange is most of the context's size.
    exchange: Option<Box<Exchange<Pool>>>,
}

/// The request id and the header that carries it, when requests have ids.
fn id_header<'a>(
    exchange: Option<&'a Exchange<Pool>>,
    id: Option<&'a HeaderValue>,
) -> Option<RequestIdHeader<'a>> {
    let settings = exchange?.site().config.request_id.as_ref()?;
    Some(RequestIdHeader {
        name: &settings.spelling,
        value: id?,
    })
}

impl RequestCtx {
    fn request_id_header(&self) -> Option<RequestIdHeader<'_>> {
        id_header(self.exchange.as_deref(), self.request_id.as_ref())
    }
}

pub struct Gateway {
    live: InForce,
    policy: Arc<Policy>,
    /// Makes the requests' spans (`tracing:`), once the pipeline runs.
    tracing: Option<TracerSlot>,
    /// A graceful shutdown under way: connections are not kept alive.
    drain: Arc<Drain>,
}

impl Gateway {
    pub fn new(
        live: InForce,
        policy: Arc<Policy>,
        tracing: Option<TracerSlot>,
        drain: Arc<Drain>,
    ) -> Gateway {
        Gateway {
            live,
            policy,
            tracing,
            drain,
        }
    }

    fn tracer(&self) -> Option<&SdkTracer> {
        self.tracing.as_ref()?.get().map(|t| &t.tracer)
    }

    /// What the connection says of a request before it is decided (whether its peer is
    /// trusted, its id, its span), and the request's exchange under the site in force.
    ///
    /// The snapshot is a guard, not a clone: no write to its count, which every core shares.
    /// It goes with this call, before the request's first await: arc-swap holds eight guards
    /// per thread without a write, and past eight (requests suspended in admission or shaping)
    /// every load on the thread would write the count.
    fn begin(&self, session: &Session, ctx: &mut RequestCtx) -> Box<Exchange<Pool>> {
        let snapshot = self.live.load();
        let started = *ctx.started.get_or_insert_with(Instant::now);
        let peer = peer_ip(session).map(address::canonical);
        ctx.trusted_peer = snapshot.config.trusted_proxies.is_trusted_peer(peer);
        let req = session.req_header();
        if let Some(settings) = &snapshot.config.request_id {
            let id = request_id::assign(settings, &req.headers, ctx.trusted_peer);
            ctx.request_id = Some(id);
        }
        if let Some(tracer) = self.tracer() {
            let method = req.method.as_str();
            ctx.trace = Some(trace::RequestTrace::start(tracer, &req.headers, method));
        }
        Box::new(Exchange::new(snapshot.site_for_request(), started))
    }

    /// An admitted request goes on: an upgraded connection gets the route's read timeout in
    /// both directions; a shaped one is held for its delay, and given back if its client
    /// leaves meanwhile.
    async fn proceed(
        &self,
        session: &mut Session,
        exchange: &mut Exchange<Pool>,
        delay: Duration,
    ) -> pingora::Result<bool> {
        if session.is_upgrade_req() {
            let idle = exchange.route().map(|route| route.upstream.read_timeout);
            session.set_read_timeout(idle);
        }
        if !delay.is_zero() && !hold(session, delay).await {
            exchange.abandon(&self.policy).await;
            return Err(Error::explain(
                ErrorType::ConnectionClosed,
                "the client left while its request was held for shaping",
            )
            .into_down());
        }
        Ok(false)
    }
}

/// What the front door cut of the head: header fields or target bytes past the most it accepts
/// (HTTP/1: `head_count.rs`).
fn cut(session: &Session) -> Cut {
    head_count::HeadCount::of(session.as_downstream()).map_or(Cut::default(), |c| c.cut())
}

/// The peer's IP address, for TCP connections.
fn peer_ip(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip())
}

/// The request's exchange; every hook after `request_filter` has one.
fn exchange(ctx: &mut RequestCtx) -> pingora::Result<&mut Exchange<Pool>> {
    ctx.exchange
        .as_deref_mut()
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "the request was not admitted"))
}

/// A Pingora error that stops the request with `answer` (which the exchange keeps: the
/// failure hook answers with it).
fn stop(answer: Answer) -> Box<Error> {
    Error::explain(ErrorType::HTTPStatus(answer.status()), answer.detail())
}

/// Holds an admitted request for its shaping delay (`max_delay`): its slot is reserved, it goes
/// on when the slot comes. `false` when its client leaves meanwhile (HTTP/2: the stream is
/// reset; HTTP/1: the connection is closed, seen in the kernel's TCP state without reading).
async fn hold(session: &mut Session, delay: Duration) -> bool {
    if let Some(closed) = session.as_downstream_mut().watch_h2_stream_close() {
        return tokio::select! {
            () = tokio::time::sleep(delay) => true,
            _ = closed => false,
        };
    }
    let until = tokio::time::Instant::now() + delay;
    let mut look = tokio::time::interval(Duration::from_millis(20));
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

/// Whose failure a Pingora error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Upstream(UpstreamError),
    Client(ClientError),
}

impl Fault {
    fn upstream(self) -> Option<UpstreamError> {
        match self {
            Fault::Upstream(kind) => Some(kind),
            Fault::Client(_) => None,
        }
    }
}

/// What the client's side looked like when the request failed.
#[derive(Debug, Clone, Copy, Default)]
struct ClientSide {
    /// A response (or its head) was already sent.
    answered: bool,
    /// It owes body bytes and has sent none for the attempt's whole read timeout.
    stalled: bool,
}

impl ClientSide {
    fn of(session: &mut Session, exchange: Option<&Exchange<Pool>>) -> ClientSide {
        let answered = session.response_written().is_some();
        let owes_body = !session.is_body_done();
        ClientSide {
            answered,
            stalled: !answered && owes_body && exchange.is_some_and(Exchange::client_stalled),
        }
    }
}

/// What a Pingora error means: whose failure it is (the upstream's or the client's), and what
/// the client is answered (`None`: it is gone, nothing to answer). The one classifier over
/// Pingora's error types.
fn classify(error: &Error, side: ClientSide) -> (Option<Fault>, Option<Answer>) {
    use ErrorType::*;
    let downstream = error.esource() == &ErrorSource::Downstream;
    let upstream = error.esource() == &ErrorSource::Upstream;
    let fault = match error.etype() {
        // The upstream was waiting for a body the client stopped sending.
        ReadTimedout if upstream && side.stalled => Some(Fault::Client(ClientError::BodyTimeout)),
        // Pingora's own read of the body timed out.
        ReadTimedout if downstream && !side.answered => {
            Some(Fault::Client(ClientError::BodyTimeout))
        }
        ConnectionClosed | ReadError | WriteError | H2Error if downstream => {
            Some(Fault::Client(ClientError::Closed))
        }
        etype => upstream_failure(etype, upstream).map(Fault::Upstream),
    };
    let answer = match (fault, error.etype(), error.esource()) {
        (Some(Fault::Upstream(kind)), _, _) => Some(kind.answer()),
        (Some(Fault::Client(kind)), _, _) => kind.answer(),
        (None, HTTPStatus(413), _) => Some(Answer::BodyTooLarge),
        (None, HTTPStatus(504), _) => Some(Answer::UpstreamTimedOut),
        (None, HTTPStatus(400..=499), _) => Some(Answer::Unreadable),
        (None, _, ErrorSource::Downstream) => Some(Answer::Unreadable),
        (None, _, _) => Some(Answer::Internal),
    };
    (fault, answer)
}

/// Whether the request can be sent again whole to another server: an idempotent method, its
/// body (if any) still whole in Pingora's retry buffer, and neither a gRPC call nor an upgrade
/// (a WebSocket): those are streams, never retried once begun.
fn replayable(session: &Session) -> bool {
    session.req_header().method.is_idempotent()
        && !session.as_ref().retry_buffer_truncated()
        && !respond::is_grpc(session)
        && !session.is_upgrade_req()
}

/// The upstream failure an error type is, if it is one.
fn upstream_failure(etype: &ErrorType, upstream: bool) -> Option<UpstreamError> {
    use ErrorType::*;
    match etype {
        ConnectRefused => Some(UpstreamError::Refused),
        ConnectTimedout | TLSHandshakeTimedout => Some(UpstreamError::Timeout),
        ReadTimedout | WriteTimedout if upstream => Some(UpstreamError::Timeout),
        TLSHandshakeFailure | TLSWantX509Lookup | InvalidCert | HandshakeError => {
            Some(UpstreamError::Tls)
        }
        ConnectionClosed | ReadError | WriteError | H2Error | InvalidHTTPHeader if upstream => {
            Some(UpstreamError::Reset)
        }
        ConnectNoRoute | ConnectError | ConnectProxyFailure | SocketError | BindError => {
            Some(UpstreamError::Unreachable)
        }
        _ if upstream => Some(UpstreamError::Unreachable),
        _ => None,
    }
}

/// How Pingora reaches the server `dial` chose.
fn peer(dial: &Dial<'_, PeerTls>) -> Box<HttpPeer> {
    let tls = dial.tls;
    let sni = tls.map_or_else(String::new, |tls| tls.sni.clone());
    let mut peer = Box::new(HttpPeer::new(dial.server, tls.is_some(), sni));
    if let Some(tls) = tls {
        peer.options.verify_cert = tls.verify;
        peer.options.verify_hostname = tls.verify;
        peer.options.ca = tls.ca.clone();
        peer.client_cert_key = tls.client.clone();
        peer.group_key = tls.reuse_group;
    }
    if dial.http2 {
        // Over TLS by ALPN; in the clear with prior knowledge (gRPC upstreams).
        peer.options.alpn = ALPN::H2;
        peer.options.max_h2_streams = UPSTREAM_H2_STREAMS;
    }
    peer.options.connection_timeout = Some(dial.connect_timeout);
    peer.options.read_timeout = Some(dial.read_timeout);
    peer.options.write_timeout = dial.write_timeout;
    peer
}

/// Where the request came from and how, for the forwarding headers the upstream gets.
fn hop<'a>(session: &'a Session, ctx: &RequestCtx) -> forwarding::Hop<'a> {
    let host = session.req_header().headers.get(http::header::HOST);
    let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
    forwarding::Hop {
        peer: peer_ip(session).map(address::canonical),
        trusted: ctx.trusted_peer,
        client: ctx.exchange.as_deref().and_then(Exchange::client),
        proto: if tls { "https" } else { "http" },
        host: host.and_then(|h| h.to_str().ok()),
        port: session
            .server_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.port()),
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    /// The head has arrived: the request's clock starts, and the front door's head deadline
    /// no longer applies.
    async fn early_request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        ctx.started = Some(Instant::now());
        if let Some(count) = head_count::HeadCount::of(session.as_downstream()) {
            count.clock().head_received();
        }
        if self.drain.is_draining() {
            // Shutting down: the client's next request goes over a new connection, which the
            // load balancer sends elsewhere (`Connection: close` on HTTP/1).
            session.set_keepalive(None);
        }
        Ok(())
    }

    /// Admits the request (route, client, keys, limits) or answers it.
    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<bool> {
        let mut exchange = self.begin(session, ctx);
        let cut = cut(session);
        if cut.any() {
            // What was dropped (a field may have declared a body) is never read as a request.
            session.set_keepalive(None);
        }
        let req = session.req_header();
        let head = Head {
            parts: req,
            raw_target: req.raw_path(),
            peer: peer_ip(session),
            client_certificate: tls::client_certificate(session.digest()),
            cut,
        };
        let admission = exchange.admit(&self.policy, &head).await;
        if let (Some(tracer), Some(trace)) = (self.tracer(), &ctx.trace) {
            if let Some(verdict) = exchange.verdict() {
                trace.limiter(tracer, verdict, exchange.deciding_limit());
            }
        }
        let exchange = ctx.exchange.insert(exchange);
        match admission {
            Admission::Answered(answer) => {
                let id = id_header(Some(&*exchange), ctx.request_id.as_ref());
                respond(session, answer, Some(&*exchange), id).await?;
                Ok(true)
            }
            Admission::Admitted { delay } => self.proceed(session, exchange, delay).await,
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Box<HttpPeer>> {
        let dial = ctx
            .exchange
            .as_deref_mut()
            .ok_or(Answer::Internal)
            .and_then(Exchange::dial);
        let (server, peer) = match dial {
            Ok(dial) => (dial.server, peer(&dial)),
            Err(Answer::UpstreamUnreachable) => {
                return Err(Error::explain(
                    ErrorType::ConnectNoRoute,
                    "no healthy upstream server left to try",
                ))
            }
            Err(answer) => return Err(stop(answer)),
        };
        if let (Some(tracer), Some(trace)) = (self.tracer(), &mut ctx.trace) {
            trace.upstream_started(tracer, server);
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
        let received = body.as_ref().map_or(0, Bytes::len);
        exchange(ctx)?.body_received(received).map_err(stop)
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        _body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<Option<Duration>> {
        exchange(ctx)?.refuse_if_late().map_err(stop)?;
        Ok(None)
    }

    /// The request could not be proxied: answer with what went wrong, in the problem style of
    /// the gateway's other answers (`502` unreachable, `504` too slow, `413` too large).
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        error: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let (fault, classified) = classify(error, ClientSide::of(session, ctx.exchange.as_deref()));
        if let (Some(Fault::Upstream(kind)), Some(trace)) = (fault, &mut ctx.trace) {
            trace.upstream_failed(kind.label());
        }
        let answer = match (ctx.exchange.as_deref_mut(), fault, classified) {
            (Some(exchange), Some(Fault::Client(kind)), _) => exchange.fail_client(kind),
            (Some(exchange), fault, Some(fallback)) => {
                Some(exchange.fail_upstream(fault.and_then(Fault::upstream), fallback))
            }
            (_, _, answer) => answer,
        };
        // Pingora closes the connection after a failure (`can_reuse_downstream` below): the
        // answer says so (`Connection: close`), as Pingora's own error pages do.
        session.set_keepalive(None);
        if let (Some(answer), None) = (answer, session.response_written()) {
            let exchange = ctx.exchange.as_deref();
            let id = id_header(exchange, ctx.request_id.as_ref());
            if let Err(e) = respond(session, answer, exchange, id).await {
                log::debug!("could not answer a failed request: {e}");
            }
        }
        FailToProxy {
            error_code: answer.map_or(0, Answer::status),
            can_reuse_downstream: false,
        }
    }

    /// An answer retried on another server is the retry policy at work, not a failure of the
    /// gateway: logged at `debug` in sluice's words, counted by
    /// `sluice_upstream_retries_total`, instead of Pingora's warning per retry. Other retried
    /// failures keep Pingora's warning.
    fn suppress_proxy_warn_log(
        &self,
        session: &Session,
        ctx: &RequestCtx,
        error: &Error,
        context: ProxyWarnLogContext,
    ) -> bool {
        let ErrorType::HTTPStatus(status) = error.etype() else {
            return false;
        };
        if !matches!(context, ProxyWarnLogContext::UpstreamRetry) {
            return false;
        }
        let exchange = ctx.exchange.as_deref();
        let route = exchange.and_then(Exchange::route).map_or("-", |r| &*r.name);
        let id = ctx.request_id.as_ref().and_then(|v| v.to_str().ok());
        log::debug!(
            "upstream answered {status}: retried on another server; route {route}, request {}, \
             peer {:?}",
            id.unwrap_or("-"),
            peer_ip(session)
        );
        true
    }

    /// A failure the client caused is not the gateway's error: it is counted
    /// (`sluice_client_errors_total`) and logged here below ERROR, in sluice's words, instead
    /// of Pingora's "Fail to proxy" (nginx logs these at `info`).
    fn suppress_error_log(&self, session: &Session, ctx: &RequestCtx, error: &Error) -> bool {
        let Some(exchange) = ctx.exchange.as_deref() else {
            return false;
        };
        let Some(kind) = exchange.client_error() else {
            return false;
        };
        let route = exchange.route().map_or("-", |route| &*route.name);
        let id = ctx.request_id.as_ref().and_then(|v| v.to_str().ok());
        let (id, peer) = (id.unwrap_or("-"), peer_ip(session));
        match kind {
            ClientError::BodyTimeout => log::info!(
                "client stalled its request body ({} bytes received, then none for the read \
                 timeout): answered 408; route {route}, request {id}, peer {peer:?}",
                exchange.body_bytes()
            ),
            ClientError::Closed => log::debug!(
                "client closed its connection before the response was complete; route {route}, \
                 request {id}, peer {peer:?}: {error}"
            ),
        }
        true
    }

    /// A server that refused the connection never saw the request: another is tried, as the
    /// route's retry policy allows.
    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut error: Box<Error>,
    ) -> Box<Error> {
        let kind = classify(&error, ClientSide::default())
            .0
            .and_then(Fault::upstream);
        if let (Some(kind), Some(trace)) = (kind, &mut ctx.trace) {
            trace.upstream_failed(kind.label());
        }
        if let Some(exchange) = ctx.exchange.as_deref_mut() {
            let server = peer._address.as_inet().copied();
            let cause = Some(RetryCause::ConnectFailure);
            if exchange.try_failed(server, kind, cause, true, error.retry()) {
                error.set_retry(true);
            }
        }
        error
    }

    /// A try failed after its connection was made: another server is tried when the route's
    /// retry policy allows it for this request (a reset or a timeout it names, a request that
    /// can be sent again whole), or by Pingora's own rule (a reused connection that closed,
    /// for a request that can be sent again). A retry decided on the response head
    /// ([`Self::upstream_response_filter`]) stays decided.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        error: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        if matches!(error.etype(), ErrorType::HTTPStatus(_)) && error.retry() {
            return error;
        }
        // As Pingora's own hook: the final error's log line names the server.
        let mut error = error.more_context(format!("Peer: {peer}"));
        let side = ClientSide::of(session, ctx.exchange.as_deref());
        // Once a response head reached the client, another server's would be dropped and its
        // body mixed into this one's: nothing is tried again.
        let replayable = replayable(session) && !side.answered;
        let mut pingora = error.retry;
        pingora.decide_reuse(client_reused);
        let fallback = replayable && pingora.retry();
        let kind = classify(&error, side).0.and_then(Fault::upstream);
        let cause = match kind {
            Some(UpstreamError::Timeout) => Some(RetryCause::Timeout),
            Some(UpstreamError::Reset) => Some(RetryCause::Reset),
            _ => None,
        };
        let server = peer._address.as_inet().copied();
        let retry = match ctx.exchange.as_deref_mut() {
            Some(exchange) => exchange.try_failed(server, kind, cause, replayable, fallback),
            None => fallback,
        };
        if retry {
            if let (Some(kind), Some(trace)) = (kind, &mut ctx.trace) {
                trace.upstream_failed(kind.label());
            }
        }
        error.set_retry(retry || fallback);
        error
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let exchange = exchange(ctx)?;
        if let Some(target) = exchange.upstream_target(&upstream_request.uri) {
            let uri = target.parse().map_err(|e| {
                Error::because(ErrorType::InternalError, "rewritten path is not a URI", e)
            })?;
            upstream_request.set_uri(uri);
        }
        if let Some(host) = exchange.upstream_host() {
            upstream_request.insert_header(http::header::HOST, host)?;
        }
        caller::set_headers(upstream_request, exchange)?;
        forwarding::set_headers(upstream_request, hop(session, ctx))?;
        if let Some(id) = ctx.request_id_header() {
            upstream_request.insert_header(id.name.clone(), id.value.clone())?;
        }
        if let Some(trace) = &ctx.trace {
            trace.inject(upstream_request);
        }
        Ok(())
    }

    /// The upstream's final response head has arrived: tried on another server when the
    /// retry policy says so (before anything reached the client), else the upstream time ends
    /// here.
    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        let status = upstream_response.status.as_u16();
        // An interim answer (`100 Continue`) ends nothing: the final head follows. `101` is
        // final (an upgrade).
        if upstream_response.status.is_informational() && status != 101 {
            return Ok(());
        }
        if let Some(trace) = &mut ctx.trace {
            trace.upstream_answered(status);
        }
        let exchange = exchange(ctx)?;
        if RetryCause::of_status(status).is_some() {
            let retry_after = upstream_response
                .headers
                .contains_key(http::header::RETRY_AFTER);
            // Nothing of a response (not even a `100 Continue`) has reached the client yet.
            let replayable = replayable(session) && session.response_written().is_none();
            if exchange.try_answered(status, retry_after, replayable) {
                let mut retried = Error::explain(
                    ErrorType::HTTPStatus(status),
                    "the upstream's answer is retried on another server",
                );
                retried.set_retry(true);
                return Err(retried.into_up());
            }
        }
        exchange.response_head(status, &upstream_response.headers);
        Ok(())
    }

    /// Trailers (HTTP/2 and gRPC upstreams) may report what the response cost.
    fn upstream_response_trailer_filter(
        &self,
        _session: &mut Session,
        upstream_trailers: &mut http::HeaderMap,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        exchange(ctx)?.response_trailers(upstream_trailers);
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> pingora::Result<()> {
        if let Some(said) = ctx.exchange.as_deref().and_then(Exchange::limits_said) {
            respond::add_ratelimit_headers(upstream_response, said)?;
        }
        respond::add_request_id(upstream_response, ctx.request_id_header())
    }

    /// The request has ended: the exchange counts it and gives back what it took; then its
    /// access log line and its span.
    async fn logging(&self, session: &mut Session, _error: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session.response_written().map(|r| r.status.as_u16());
        // A request that failed before it was admitted (e.g. malformed) has none.
        let Some(exchange) = ctx.exchange.as_deref_mut() else {
            return;
        };
        exchange.end(&self.policy, status).await;
        let Some(exchange) = ctx.exchange.as_deref() else {
            return;
        };
        let id = ctx.request_id.as_ref();
        if let Some(access_log) = &exchange.site().access_log {
            access::log(access_log, session, id, exchange);
        }
        if let Some(trace) = ctx.trace.take() {
            trace.finish(&trace::Ended::of(session, id, exchange, status));
        }
    }
}
