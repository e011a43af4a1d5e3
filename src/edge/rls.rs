//! Envoy's rate limit service v3 (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`)
//! over gRPC on a listener of its own, sharing the proxy's limiter: the same scripts, Redis
//! topology, failure modes, deny cache and metrics. Every descriptor of one request is decided
//! in one script call, consuming only if all pass (envoyproxy/ratelimit counts each descriptor
//! on its own).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::services::ServiceReadyNotifier;
use tonic::{Request, Response, Status};

use super::rls_metadata;
use crate::config::rls::RlsSettings;
use crate::exchange::rls;
use crate::limiter::{fields, Policy};
use crate::route::descriptors::{MAX_DESCRIPTORS, MAX_ENTRIES, MAX_TEXT};
use crate::runtime::snapshot::InForce;

/// Answers `ShouldRateLimit` from the live configuration's domains.
pub struct RlsHandler {
    live: InForce,
    policy: Arc<Policy>,
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(message)
}

/// Checks the request's shape before anything is looked up.
fn check(request: &RateLimitRequest) -> Result<(), Status> {
    if request.domain.is_empty() {
        return Err(invalid("domain: must not be empty".to_string()));
    }
    if request.domain.len() > MAX_TEXT {
        return Err(invalid(format!("domain: longer than {MAX_TEXT} bytes")));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors: at least one is required".to_string()));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid(format!(
            "descriptors: {} given, at most {MAX_DESCRIPTORS}",
            request.descriptors.len()
        )));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() || descriptor.entries.len() > MAX_ENTRIES {
            return Err(invalid(format!(
                "descriptors[{i}]: 1 to {MAX_ENTRIES} entries, got {}",
                descriptor.entries.len()
            )));
        }
        for entry in &descriptor.entries {
            if entry.key.is_empty() || entry.key.len() > MAX_TEXT || entry.value.len() > MAX_TEXT {
                return Err(invalid(format!(
                    "descriptors[{i}]: entry keys must be 1 to {MAX_TEXT} bytes, values at most {MAX_TEXT}"
                )));
            }
        }
    }
    Ok(())
}

fn duration_ms(ms: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// `RateLimit-Policy` and `RateLimit` (IETF httpapi fields) for the enforced matched limits.
fn headers(statuses: &[rls::Status<'_>]) -> Vec<HeaderValue> {
    let enforced: Vec<(&rls::Shown<'_>, &rls::Status<'_>)> = statuses
        .iter()
        .filter(|status| status.enforced)
        .filter_map(|status| Some((status.limit.as_ref()?, status)))
        .collect();
    if enforced.is_empty() {
        return Vec::new();
    }
    let (mut policy, mut state) = (Vec::new(), Vec::new());
    for (limit, status) in &enforced {
        let (name, quota) = (limit.name, limit.requests_per_unit);
        fields::push_policy_item(&mut policy, name, quota, limit.unit.seconds());
        let reset_after_ms = status.reset_after_ms.unwrap_or(0);
        fields::push_state_item(&mut state, name, remaining(status).into(), reset_after_ms);
    }
    [("RateLimit-Policy", policy), ("RateLimit", state)]
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_string(),
            // Limit names are a safe ASCII subset (checked at load).
            value: String::from_utf8_lossy(&value).into_owned(),
            ..HeaderValue::default()
        })
        .collect()
}

fn remaining(status: &rls::Status<'_>) -> u32 {
    u32::try_from(status.remaining).unwrap_or(u32::MAX)
}

/// A descriptor's status as protobuf.
fn descriptor_status(status: &rls::Status<'_>) -> DescriptorStatus {
    let code = if status.over {
        Code::OverLimit
    } else {
        Code::Ok
    };
    DescriptorStatus {
        code: code as i32,
        current_limit: status.limit.map(|limit| RateLimit {
            name: limit.name.to_string(),
            requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
            unit: limit.unit.proto(),
        }),
        limit_remaining: remaining(status),
        duration_until_reset: status.reset_after_ms.map(duration_ms),
        ..DescriptorStatus::default()
    }
}

#[async_trait]
impl RateLimitService for RlsHandler {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        check(&request)?;
        let snapshot = self.live.load_full();
        let Some(settings) = &snapshot.config.rls else {
            return Err(Status::unavailable(
                "the rate limit service is not configured",
            ));
        };
        let Some(domain) = settings.domains.get(&request.domain) else {
            return Err(Status::not_found(format!(
                "unknown domain {:?}: no configuration file declares it",
                request.domain
            )));
        };
        let descriptors: rls::PerDescriptor<rls::Descriptor<'_>> = request
            .descriptors
            .iter()
            .map(|descriptor| rls::Descriptor {
                entries: descriptor
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str()))
                    .collect(),
                hits: descriptor.hits_addend.as_ref().map(|h| h.value),
            })
            .collect();
        let hits = u64::from(request.hits_addend.max(1));
        let meters = snapshot.rls_metrics.get(&request.domain);
        let deciders = (&*self.policy, meters);
        let decided =
            rls::decide(domain, service_wide(settings), deciders, &descriptors, hits).await;
        let code = if decided.over {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let dynamic_metadata = settings
            .response_dynamic_metadata
            .then(|| rls_metadata::of(&request, &decided.statuses));
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            statuses: decided.statuses.iter().map(descriptor_status).collect(),
            response_headers_to_add: headers(&decided.statuses),
            dynamic_metadata,
            ..RateLimitResponse::default()
        }))
    }
}

/// What the `rls:` section says of every domain's counters.
fn service_wide(settings: &RlsSettings) -> rls::ServiceWide<'_> {
    rls::ServiceWide {
        key_prefix: &settings.key_prefix,
        secret: settings.secret,
        failure_mode: settings.failure_mode,
    }
}

/// Serves the rate limit service on `listen` (bound once the process runs: after `sluice -d`
/// has forked) until shutdown.
pub struct RlsService {
    listen: SocketAddr,
    live: InForce,
    policy: Arc<Policy>,
    upgrade: bool,
}

impl RlsService {
    /// `upgrade`: this process takes over from an old instance (`sluice -u`), which holds the
    /// port until it has handed the proxy's sockets over and stopped.
    pub fn new(
        listen: SocketAddr,
        live: InForce,
        policy: Arc<Policy>,
        upgrade: bool,
    ) -> RlsService {
        RlsService {
            listen,
            live,
            policy,
            upgrade,
        }
    }
}

/// How long a new instance (`-u`) waits for the old one to free the rate limit service's port.
const UPGRADE_BIND_WAIT: Duration = Duration::from_secs(120);

/// Binds the rate limit service's listener. A fresh start fails at once when the port is taken;
/// an upgrade waits (the gRPC listener is not among the sockets Pingora hands over) until the
/// old instance, told to stop once the new one serves, lets the port go.
async fn listen(addr: SocketAddr, upgrade: bool) -> std::io::Result<tokio::net::TcpListener> {
    let until = tokio::time::Instant::now() + UPGRADE_BIND_WAIT;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Err(e) if upgrade && e.kind() == std::io::ErrorKind::AddrInUse => {
                if tokio::time::Instant::now() >= until {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            bound => return bound,
        }
    }
}

#[async_trait]
impl BackgroundService for RlsService {
    async fn start_with_ready_notifier(
        &self,
        mut shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let listener = match listen(self.listen, self.upgrade).await {
            Ok(listener) => listener,
            // As the proxy's listeners do: a taken port fails the start, with why.
            Err(e) => crate::edge::listening::cannot_listen(&self.listen.to_string(), &e),
        };
        ready.notify_ready();
        // The service may be the only one deciding (no proxy listener): it keeps the limiter's
        // connections too (one keeper per backend, whoever starts first).
        let policy = Arc::clone(&self.policy);
        tokio::spawn(async move { policy.keep_connections().await });
        let handler = RlsHandler {
            live: Arc::clone(&self.live),
            policy: Arc::clone(&self.policy),
        };
        // No Nagle: an answer that spans two writes must not wait for the client's delayed ACK
        // (40 ms per call was measured without this).
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let served = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(RateLimitServiceServer::new(handler))
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = shutdown.changed().await;
            })
            .await;
        if let Err(e) = served {
            log::error!("rate limit service stopped: {e}");
        }
    }
}
