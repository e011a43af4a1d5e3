//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (alive), `/readyz`
//! (`200` when the limiter backend answers, or when it does not and the failure mode still
//! serves; `503` when it does not and the failure mode refuses traffic).

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora_prometheus::PrometheusHttpApp;

use crate::limiter::{FailureMode, Policy, Readiness};

pub struct AdminApp {
    policy: Arc<Policy>,
    failure_mode: FailureMode,
}

impl AdminApp {
    pub fn new(policy: Arc<Policy>, failure_mode: FailureMode) -> AdminApp {
        AdminApp {
            policy,
            failure_mode,
        }
    }
}

fn text(status: u16, body: String) -> Response<Vec<u8>> {
    let body = body.into_bytes();
    let length = body.len();
    let mut response = Response::new(body);
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(length),
    );
    response
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        match session.req_header().uri.path() {
            "/metrics" => PrometheusHttpApp.response(session).await,
            "/healthz" => text(200, "ok\n".to_string()),
            "/readyz" => match self.policy.readiness().await {
                Readiness::Ready => {
                    text(200, format!("ready: {} limiter\n", self.policy.backend()))
                }
                // The failure mode refuses traffic: send it to a gateway that can decide.
                Readiness::Unavailable(reason) if self.failure_mode.refuses() => text(
                    503,
                    format!(
                        "not ready: {} limiter unavailable ({reason}); failure_mode {} refuses requests\n",
                        self.policy.backend(),
                        self.failure_mode.as_str()
                    ),
                ),
                // The failure mode is deciding for Redis: the gateway still serves, degraded.
                Readiness::Unavailable(reason) => text(
                    200,
                    format!(
                        "degraded: {} limiter unavailable ({reason}); failure_mode {} applies\n",
                        self.policy.backend(),
                        self.failure_mode.as_str()
                    ),
                ),
            },
            _ => text(
                404,
                "not found: try /metrics, /healthz or /readyz\n".to_string(),
            ),
        }
    }
}
