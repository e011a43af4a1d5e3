//! The OpenTelemetry pipeline (`tracing:`): spans batched by a thread of their own and sent to a
//! collector over OTLP/HTTP (protobuf), sampled at the configured share unless the caller's
//! `traceparent` already decided. What goes into the spans is the proxy's business
//! (`proxy/trace.rs`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;

use crate::config::observe::TracingSettings;

/// How often finished spans are sent.
const EXPORT_EVERY: Duration = Duration::from_secs(1);
/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Finished spans waiting to be sent, at most; beyond, new spans are dropped.
const MAX_QUEUED_SPANS: usize = 16_384;

/// The tracer, and its provider (which owns the export thread: keep it alive).
pub struct Tracing {
    pub tracer: SdkTracer,
    pub provider: SdkTracerProvider,
}

/// Where the proxy finds the tracer once the pipeline runs.
pub type TracerSlot = Arc<OnceLock<Tracing>>;

/// Builds the exporter and its batching thread. Call it outside any async runtime: the
/// blocking HTTP client makes a runtime of its own.
pub fn start(settings: &TracingSettings) -> Result<Tracing, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("tracing: cannot build the OTLP exporter: {e}"))?;
    let batches = BatchConfigBuilder::default()
        .with_scheduled_delay(EXPORT_EVERY)
        .with_max_queue_size(MAX_QUEUED_SPANS)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batches)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            settings.sample,
        ))))
        .with_resource(
            Resource::builder()
                .with_service_name(settings.service_name.clone())
                .build(),
        )
        .build();
    Ok(Tracing {
        tracer: provider.tracer("sluice"),
        provider,
    })
}

/// Starts the pipeline once the process runs (after `sluice -d` has forked: threads made before
/// would not exist in the daemon), and sends what is left at shutdown.
pub struct TracingService {
    settings: TracingSettings,
    slot: TracerSlot,
}

impl TracingService {
    pub fn new(settings: TracingSettings, slot: TracerSlot) -> TracingService {
        TracingService { settings, slot }
    }
}

#[async_trait]
impl BackgroundService for TracingService {
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let (built, started) = tokio::sync::oneshot::channel();
        let settings = self.settings.clone();
        // A thread of its own, outside the runtime, for the blocking HTTP client's sake.
        std::thread::spawn(move || {
            let _ = built.send(start(&settings));
        });
        match started.await {
            Ok(Ok(tracing)) => {
                let _ = self.slot.set(tracing);
            }
            Ok(Err(e)) => log::error!("{e}; requests are not traced"),
            Err(_) => log::error!("tracing: the pipeline did not start; requests are not traced"),
        }
        ready.notify_ready();
        let _ = shutdown.changed().await;
        if let Some(tracing) = self.slot.get() {
            let provider = tracing.provider.clone();
            let (flushed, done) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = flushed.send(provider.shutdown());
            });
            if let Ok(Err(e)) = done.await {
                log::warn!("tracing: spans not sent at shutdown: {e}");
            }
        }
    }
}
