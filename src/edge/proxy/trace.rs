//! The spans of one request: the request itself (server), its limiter decision and its upstream
//! call (client), children of the caller's `traceparent` when it sends one (W3C trace context);
//! the upstream gets the upstream span's `traceparent`. Attributes follow OpenTelemetry's HTTP
//! conventions, with `sluice.*` for the limiter.

use std::net::SocketAddr;
use std::time::SystemTime;

use http::{HeaderMap, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, Span};
use pingora::http::RequestHeader;
use pingora::proxy::Session;

use crate::exchange::Exchange;
use crate::limiter::{Source, Verdict};
use crate::upstream::pool::Pool;

/// Reads `traceparent` / `tracestate` from request headers.
struct Extract<'a>(&'a HeaderMap);

impl Extractor for Extract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Writes `traceparent` / `tracestate` into the upstream request.
struct Inject<'a>(&'a mut RequestHeader);

impl Injector for Inject<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let Err(e) = self.0.insert_header(key.to_string(), value) {
            log::debug!("tracing: cannot set {key} upstream: {e}");
        }
    }
}

/// A request's spans while it is served.
pub struct RequestTrace {
    /// Holds the request span; children are made in it.
    cx: Context,
    upstream: Option<Span>,
}

impl RequestTrace {
    /// Opens the request span, as a child of the caller's trace context if it sent one.
    pub fn start(tracer: &SdkTracer, headers: &HeaderMap, method: &str) -> RequestTrace {
        let parent = TraceContextPropagator::new().extract(&Extract(headers));
        let span = tracer
            .span_builder(method.to_string())
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &parent);
        RequestTrace {
            cx: parent.with_span(span),
            upstream: None,
        }
    }

    fn sampled(&self) -> bool {
        self.cx.span().span_context().is_sampled()
    }

    /// Records the limiter's decision as a span that ended now and took `verdict.limiter_time`.
    pub fn limiter(&self, tracer: &SdkTracer, verdict: &Verdict, limit: Option<&str>) {
        if !self.sampled() || verdict.limiter_time.is_zero() {
            return;
        }
        let ended = SystemTime::now();
        let mut attributes = vec![KeyValue::new("sluice.decision", verdict.outcome.label())];
        if let Some(decision) = &verdict.answered {
            let source = match decision.source {
                Source::Backend => "backend",
                Source::DenyCache => "deny_cache",
                Source::Leases => "leases",
            };
            attributes.push(KeyValue::new("sluice.limiter.source", source));
            attributes.push(KeyValue::new(
                "sluice.limiter.batch_size",
                decision.batch as i64,
            ));
        }
        if let Some(limit) = limit {
            attributes.push(KeyValue::new("sluice.limit", limit.to_string()));
        }
        let mut span = tracer
            .span_builder("rate limit")
            .with_kind(SpanKind::Internal)
            .with_start_time(ended - verdict.limiter_time)
            .with_attributes(attributes)
            .start_with_context(tracer, &self.cx);
        span.end_with_timestamp(ended);
    }

    /// Opens the upstream span at the first connection attempt.
    pub fn upstream_started(&mut self, tracer: &SdkTracer, server: SocketAddr) {
        if self.upstream.is_some() {
            return;
        }
        let span = tracer
            .span_builder("upstream")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("server.address", server.ip().to_string()),
                KeyValue::new("server.port", i64::from(server.port())),
            ])
            .start_with_context(tracer, &self.cx);
        self.upstream = Some(span);
    }

    /// Sends the upstream span's trace context with the upstream request (the request span's
    /// before any upstream span exists).
    pub fn inject(&self, request: &mut RequestHeader) {
        let context = match &self.upstream {
            Some(span) => Context::new().with_remote_span_context(span.span_context().clone()),
            None => self.cx.clone(),
        };
        TraceContextPropagator::new().inject_context(&context, &mut Inject(request));
    }

    /// The upstream's response head arrived.
    pub fn upstream_answered(&mut self, status: u16) {
        if let Some(mut span) = self.upstream.take() {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            span.end();
        }
    }

    /// The upstream failed (`kind`: `sluice_upstream_errors_total`'s kinds).
    pub fn upstream_failed(&mut self, kind: &'static str) {
        if let Some(mut span) = self.upstream.take() {
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_status(Status::error(kind));
            span.end();
        }
    }

    /// Closes the request span with what became of the request.
    pub fn finish(mut self, ended: &Ended<'_>) {
        if let Some(mut span) = self.upstream.take() {
            span.end();
        }
        if !self.sampled() {
            return;
        }
        let span = self.cx.span();
        if let Some(route) = ended.route {
            span.update_name(format!("{} {route}", ended.method));
            span.set_attribute(KeyValue::new("http.route", route.to_string()));
        }
        span.set_attributes([
            KeyValue::new("http.request.method", ended.method.to_string()),
            KeyValue::new("url.path", ended.path.to_string()),
            KeyValue::new("http.response.status_code", i64::from(ended.status)),
            KeyValue::new("sluice.decision", ended.decision),
        ]);
        if let Some(client) = ended.client {
            span.set_attribute(KeyValue::new("client.address", client.to_string()));
        }
        if let Some(id) = ended.request_id {
            span.set_attribute(KeyValue::new("sluice.request_id", id.to_string()));
        }
        if let Some(limit) = ended.limit {
            span.set_attribute(KeyValue::new("sluice.limit", limit.to_string()));
        }
        if ended.status >= 500 || ended.status == 0 {
            span.set_status(Status::error(format!("status {}", ended.status)));
        }
        span.end();
    }
}

/// What the request span records when the request ends.
pub struct Ended<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub route: Option<&'a str>,
    pub status: u16,
    pub decision: &'static str,
    pub limit: Option<&'a str>,
    pub client: Option<std::net::IpAddr>,
    pub request_id: Option<&'a str>,
}

impl<'a> Ended<'a> {
    /// What the span of the request `exchange` records, once it has ended with `status`.
    pub fn of(
        session: &'a Session,
        request_id: Option<&'a HeaderValue>,
        exchange: &'a Exchange<Pool>,
        status: Option<u16>,
    ) -> Ended<'a> {
        let req = session.req_header();
        Ended {
            method: req.method.as_str(),
            path: exchange.normalized_path().unwrap_or(req.uri.path()),
            route: exchange.route().map(|r| &*r.name),
            status: status.unwrap_or(0),
            decision: exchange.decided().label(),
            limit: exchange.deciding_limit(),
            client: exchange.client(),
            request_id: request_id.and_then(|id| id.to_str().ok()),
        }
    }
}
