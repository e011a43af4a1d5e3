//! Envoy's rate limit service v3 (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`)
//! over gRPC on a listener of its own, sharing the proxy's limiter: the same scripts, Redis
//! topology, failure modes, deny cache and metrics. Every descriptor of one request is decided
//! in one script call, consuming only if all pass (envoyproxy/ratelimit counts each descriptor
//! on its own).

use std::collections::HashSet;
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

use crate::limiter::{Ask, Asks, LimitSet, Outcome, Policy};
use crate::metrics::LimitOutcome;
use crate::rls::{self, DescriptorLimit, Rule, MAX_DESCRIPTORS, MAX_ENTRIES, MAX_TEXT};
use crate::snapshot::Live;

/// Answers `ShouldRateLimit` from the live configuration's domains.
pub struct RlsHandler {
    live: Live,
    policy: Arc<Policy>,
}

/// One descriptor that matched a limit: its place in the request, the limit, its key and cost.
struct Matched<'a> {
    descriptor: usize,
    limit: &'a DescriptorLimit,
    ask: Ask,
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
fn headers(matched: &[Matched<'_>], statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let enforced: Vec<(&Matched<'_>, &DescriptorStatus)> = matched
        .iter()
        .filter(|m| !m.limit.limit.shadow)
        .map(|m| (m, &statuses[m.descriptor]))
        .collect();
    if enforced.is_empty() {
        return Vec::new();
    }
    let policy = enforced
        .iter()
        .map(|(m, _)| {
            format!(
                "\"{}\";q={};w={}",
                m.limit.name,
                m.limit.requests_per_unit,
                m.limit.unit.seconds()
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let state = enforced
        .iter()
        .map(|(m, status)| {
            let reset = status
                .duration_until_reset
                .as_ref()
                .map_or(0, |d| d.seconds + i64::from(d.nanos > 0));
            format!(
                "\"{}\";r={};t={}",
                m.limit.name, status.limit_remaining, reset
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    [("RateLimit-Policy", policy), ("RateLimit", state)]
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_string(),
            value,
            ..HeaderValue::default()
        })
        .collect()
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
        let metrics = snapshot.rls_metrics.get(&request.domain);
        let hits = u64::from(request.hits_addend.max(1));
        let mut matched: Vec<Matched<'_>> = Vec::new();
        let mut statuses = vec![DescriptorStatus::default(); request.descriptors.len()];
        let mut blocked = false;
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let entries: Vec<rls::Entry<'_>> = descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            match domain.rule(&entries) {
                Some(Rule::Limited(limit)) => {
                    let cost = descriptor.hits_addend.as_ref().map_or(hits, |h| h.value);
                    let key = rls::key(
                        &settings.key_prefix,
                        settings.secret,
                        &domain.name,
                        limit,
                        &entries,
                    );
                    matched.push(Matched {
                        descriptor: i,
                        limit,
                        ask: Ask { key, cost },
                    });
                }
                Some(Rule::Unlimited) => statuses[i].limit_remaining = u32::MAX,
                Some(Rule::Blocked { name, unit }) => {
                    blocked = true;
                    if let Some(metrics) = metrics {
                        metrics.count_limit(name, LimitOutcome::Limited);
                    }
                    statuses[i] = DescriptorStatus {
                        code: Code::OverLimit as i32,
                        current_limit: Some(RateLimit {
                            name: name.clone(),
                            requests_per_unit: 0,
                            unit: unit.proto(),
                        }),
                        ..DescriptorStatus::default()
                    };
                }
                None => {}
            }
        }
        // A blocked descriptor refuses the request: the others are only read (cost 0), so
        // nothing is consumed, as with any denied request.
        if blocked {
            for m in &mut matched {
                m.ask.cost = 0;
            }
        }
        // A limit named in another matched limit's `replaces` does not apply.
        let replaced: HashSet<&str> = matched
            .iter()
            .flat_map(|m| m.limit.replaces.iter().map(String::as_str))
            .collect();
        matched.retain(|m| !replaced.contains(m.limit.name.as_str()));

        let set = LimitSet::new(
            matched.iter().map(|m| m.limit.limit.clone()).collect(),
            settings.instances,
            settings.failure_mode,
            None,
        );
        let asks: Asks = matched.iter().map(|m| m.ask.clone()).collect();
        let verdict = self.policy.decide(&set, &asks).await;
        self.policy.finish(&set, &asks, &verdict).await;
        let outcome = if blocked {
            Outcome::Limited
        } else {
            verdict.outcome
        };
        if let Some(metrics) = metrics {
            metrics.count(outcome);
            for (index, limit_outcome) in LimitOutcome::per_limit(set.limits(), &verdict) {
                if let Some(m) = matched.get(index) {
                    metrics.count_limit(&m.limit.name, limit_outcome);
                }
            }
        }

        let denied = blocked
            || matches!(
                verdict.outcome,
                Outcome::Limited | Outcome::LocalLimited | Outcome::ErrorDenied
            );
        let ok = Code::Ok as i32;
        for status in statuses
            .iter_mut()
            .filter(|s| s.code != Code::OverLimit as i32)
        {
            status.code = ok;
        }
        for (j, m) in matched.iter().enumerate() {
            let status = verdict.decision.as_ref().and_then(|d| d.statuses.get(j));
            let over = match status {
                Some(status) => !status.allowed && !m.limit.limit.shadow,
                None => verdict.outcome == Outcome::ErrorDenied,
            };
            statuses[m.descriptor] = DescriptorStatus {
                code: if over { Code::OverLimit as i32 } else { ok },
                current_limit: Some(RateLimit {
                    name: m.limit.name.clone(),
                    requests_per_unit: u32::try_from(m.limit.requests_per_unit).unwrap_or(u32::MAX),
                    unit: m.limit.unit.proto(),
                }),
                limit_remaining: status
                    .map_or(0, |s| u32::try_from(s.remaining).unwrap_or(u32::MAX)),
                duration_until_reset: status.map(|s| duration_ms(s.reset_after_ms)),
                ..DescriptorStatus::default()
            };
        }
        let response_headers_to_add = headers(&matched, &statuses);
        Ok(Response::new(RateLimitResponse {
            overall_code: if denied { Code::OverLimit as i32 } else { ok },
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves the rate limit service on `listen` (bound once the process runs: after `sluice -d`
/// has forked) until shutdown.
pub struct RlsService {
    listen: SocketAddr,
    live: Live,
    policy: Arc<Policy>,
}

impl RlsService {
    pub fn new(listen: SocketAddr, live: Live, policy: Arc<Policy>) -> RlsService {
        RlsService {
            listen,
            live,
            policy,
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
        let listener = match tokio::net::TcpListener::bind(self.listen).await {
            Ok(listener) => listener,
            Err(e) => {
                log::error!("rate limit service: cannot listen on {}: {e}", self.listen);
                ready.notify_ready();
                return;
            }
        };
        ready.notify_ready();
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
