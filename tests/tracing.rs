//! OpenTelemetry spans against a real OTLP/HTTP receiver started here (protobuf decoded with
//! the `opentelemetry-proto` types): a request's server span is a child of the caller's
//! `traceparent`, the limiter and upstream spans are its children, the upstream receives the
//! upstream span's `traceparent`; sampling follows the configured share and the caller's flag.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::config::{route, Config};
use support::limits::fixed_window;
use support::{http_get, Gateway, Upstream};

/// An OTLP/HTTP trace receiver on a free loopback port: keeps every span it is sent.
struct Receiver {
    port: u16,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    fn start() -> Receiver {
        // Bound on port 0 and read back: a port checked free first can be taken in between.
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the receiver");
        let port = listener
            .local_addr()
            .expect("the receiver's address")
            .port();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&spans);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = Arc::clone(&kept);
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        Receiver { port, spans }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.port)
    }

    /// The spans of `trace_id` once at least `n` have arrived (10 s at most).
    fn trace(&self, trace_id: &[u8], n: usize) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans: Vec<Span> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect();
            if spans.len() >= n || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn all(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

/// Answers OTLP export requests on one keep-alive connection.
fn serve(stream: TcpStream, spans: &Mutex<Vec<Span>>) {
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request = ExportTraceServiceRequest::decode(&body[..]).expect("an OTLP protobuf body");
        for resource in request.resource_spans {
            for scope in resource.scope_spans {
                spans.lock().unwrap().extend(scope.spans);
            }
        }
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|v| v.value)
}

fn text(span: &Span, key: &str) -> String {
    match attribute(span, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("{key} of {}: {other:?}", span.name),
    }
}

fn number(span: &Span, key: &str) -> i64 {
    match attribute(span, key) {
        Some(Value::IntValue(n)) => n,
        other => panic!("{key} of {}: {other:?}", span.name),
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans.iter().find(|s| s.name == name).unwrap_or_else(|| {
        panic!(
            "no span {name} among {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        )
    })
}

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

fn config(receiver: &Receiver, sample: f64) -> String {
    Config::new()
        .set(
            "tracing",
            format!(
                "{{ enabled: true, endpoint: \"{}\", sample: {sample} }}",
                receiver.endpoint()
            ),
        )
        .route(
            route("api")
                .prefix("/api")
                .limit(fixed_window("per_client", "1/h").key(&["client_ip"])),
        )
        .route(route("other"))
        .yaml()
}

#[test]
fn a_request_is_traced_from_the_callers_context_through_the_limiter_to_the_upstream() {
    let receiver = Receiver::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&config(&receiver, 1.0), &upstream, None);
    let traceparent = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let allowed = http_get(
        gateway.proxy,
        "/api/a",
        None,
        &[("traceparent", &traceparent)],
    );
    assert_eq!(allowed.status, 200);
    let limited = gateway.get("/api/b");
    assert_eq!(limited.status, 429);

    let spans = receiver.trace(&hex(TRACE), 3);
    assert_eq!(spans.len(), 3, "{spans:?}");
    let request = named(&spans, "GET api");
    assert_eq!(
        request.parent_span_id,
        hex(CALLER_SPAN),
        "a child of the caller's span"
    );
    assert_eq!(request.kind, 2, "server");
    assert_eq!(number(request, "http.response.status_code"), 200);
    assert_eq!(text(request, "http.route"), "api");
    assert_eq!(text(request, "url.path"), "/api/a");
    assert_eq!(text(request, "sluice.decision"), "allowed");
    assert_eq!(
        text(request, "sluice.request_id"),
        allowed.header("x-request-id").unwrap()
    );
    let limiter = named(&spans, "rate limit");
    assert_eq!(limiter.parent_span_id, request.span_id);
    assert_eq!(text(limiter, "sluice.limiter.source"), "backend");
    assert_eq!(number(limiter, "sluice.limiter.batch_size"), 1);
    assert!(limiter.start_time_unix_nano >= request.start_time_unix_nano);
    assert!(limiter.end_time_unix_nano <= request.end_time_unix_nano);
    let call = named(&spans, "upstream");
    assert_eq!(call.parent_span_id, request.span_id);
    assert_eq!(call.kind, 3, "client");
    assert_eq!(number(call, "http.response.status_code"), 200);
    assert_eq!(number(call, "server.port"), i64::from(upstream.addr.port()));
    let sent = format!("traceparent: 00-{TRACE}-{}-01", to_hex(&call.span_id));
    assert!(
        allowed.body.contains(&sent),
        "the upstream gets the upstream span's context ({sent}): {}",
        allowed.body
    );

    // The limited request: a trace of its own, with the limit that denied it and no upstream.
    let deadline = Instant::now() + Duration::from_secs(10);
    let denied = loop {
        let found = receiver
            .all()
            .into_iter()
            .find(|s| s.trace_id != hex(TRACE) && s.name == "GET api");
        match found {
            Some(span) => break span,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            None => panic!("the limited request's span never came"),
        }
    };
    assert!(denied.parent_span_id.is_empty(), "a root span");
    assert_eq!(number(&denied, "http.response.status_code"), 429);
    assert_eq!(text(&denied, "sluice.decision"), "limited");
    assert_eq!(text(&denied, "sluice.limit"), "per_client");
    let its_trace = receiver.trace(&denied.trace_id, 2);
    assert!(
        its_trace.iter().all(|s| s.name != "upstream"),
        "{its_trace:?}"
    );
}

#[test]
fn sampling_follows_the_share_and_the_callers_decision() {
    let receiver = Receiver::start();
    let upstream = Upstream::start();
    let gateway = Gateway::start(&config(&receiver, 0.0), &upstream, None);
    // Sampled out: nothing is recorded, but the upstream still learns the trace (flag 00).
    let unsampled = gateway.get("/other");
    assert!(
        unsampled.body.contains("traceparent: 00-"),
        "{}",
        unsampled.body
    );
    assert!(unsampled.body.contains("-00\n"), "{}", unsampled.body);
    // A caller that sampled its trace is followed whatever the share.
    let traceparent = format!("00-{TRACE}-{CALLER_SPAN}-01");
    let sampled = http_get(
        gateway.proxy,
        "/api/a",
        None,
        &[("traceparent", &traceparent)],
    );
    assert_eq!(sampled.status, 200);
    let spans = receiver.trace(&hex(TRACE), 3);
    assert_eq!(spans.len(), 3, "{spans:?}");
    // Spans are sent in the order they end: the unsampled request's would have come first.
    let others: Vec<_> = receiver
        .all()
        .into_iter()
        .filter(|s| s.trace_id != hex(TRACE))
        .collect();
    assert!(others.is_empty(), "sampled out, yet recorded: {others:?}");
}
