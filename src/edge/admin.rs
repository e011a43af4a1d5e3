//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (alive), `/readyz`
//! (`200` when the limiter backend answers, or when it does not and the failure mode still
//! serves; `503` when it does not and the failure mode refuses traffic, and while routes verify
//! callers with a JWT verifier that has no keys yet). The failure mode and the verifier are
//! those in force: a reload that changes them changes what `/readyz` says. Behind `admin.token`:
//! the usage API (`/v1/quota`, `usage.rs`) and the quota admin API (`/v1/quota/reset`,
//! `/v1/quota/credit`, `/v1/quota/overrides`, `quota_admin.rs`).

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora_prometheus::PrometheusHttpApp;

use crate::edge::drain::Drain;
use crate::edge::quota_admin::{self, Caller};
use crate::edge::usage::UsageError;
use crate::limiter::{Policy, Readiness};
use crate::runtime::snapshot::{Live, Snapshot};

pub struct AdminApp {
    policy: Arc<Policy>,
    /// The configuration in force: its failure mode says whether an unavailable limiter makes
    /// the gateway unready.
    live: Live,
    /// A graceful shutdown under way makes it unready.
    drain: Arc<Drain>,
}

impl AdminApp {
    pub fn new(policy: Arc<Policy>, live: Live, drain: Arc<Drain>) -> AdminApp {
        AdminApp {
            policy,
            live,
            drain,
        }
    }

    /// `/readyz`: whether this gateway should get traffic now.
    async fn readiness(&self) -> Response<Vec<u8>> {
        if self.drain.is_draining() {
            // SIGTERM: it still serves until grace_period_seconds ends; send new traffic elsewhere.
            return text(503, "not ready: shutting down (SIGTERM), draining\n".into());
        }
        if self.live.load().awaits_jwt_keys() {
            // Every token would be refused (503): send the traffic to a gateway that has keys.
            return text(
                503,
                "not ready: no JWT verification keys yet (identity.jwt.jwks_url has not answered)\n"
                    .into(),
            );
        }
        let backend = self.policy.backend();
        let readiness = self.policy.readiness().await;
        let failure_mode = self.live.load().config.failure_mode;
        match readiness {
            Readiness::Ready => text(200, format!("ready: {backend} limiter\n")),
            // The failure mode refuses traffic: send it to a gateway that can decide.
            Readiness::Unavailable(reason) if failure_mode.refuses() => text(
                503,
                format!(
                    "not ready: {backend} limiter unavailable ({reason}); failure_mode {} refuses requests\n",
                    failure_mode.label()
                ),
            ),
            // The failure mode is deciding for Redis: the gateway still serves, degraded.
            Readiness::Unavailable(reason) => text(
                200,
                format!(
                    "degraded: {backend} limiter unavailable ({reason}); failure_mode {} applies\n",
                    failure_mode.label()
                ),
            ),
        }
    }
}

impl AdminApp {
    /// The configuration in force, when the caller has the admin token; else the answer.
    fn authorized(&self, session: &ServerSession) -> Result<Arc<Snapshot>, Box<Response<Vec<u8>>>> {
        let snapshot = self.live.load_full();
        let Some(token) = &snapshot.config.admin_token else {
            return Err(Box::new(text(
                404,
                "not found: the usage and quota admin APIs are on when admin.token is set\n".into(),
            )));
        };
        if !bearer_matches(&session.req_header().headers, token.expose()) {
            let mut refused = text(
                401,
                "unauthorized: send Authorization: Bearer <admin.token>\n".into(),
            );
            refused.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"sluice admin\""),
            );
            return Err(Box::new(refused));
        }
        Ok(snapshot)
    }

    /// `/v1/quota`: a consumer's usage, for a caller with the admin token.
    async fn quota(&self, session: &ServerSession) -> Response<Vec<u8>> {
        let snapshot = match self.authorized(session) {
            Ok(snapshot) => snapshot,
            Err(answer) => return *answer,
        };
        let req = session.req_header();
        if req.method != http::Method::GET {
            return text(405, "use GET\n".into());
        }
        let usage = crate::edge::usage::quota(&self.policy, &snapshot, req.uri.query()).await;
        answer_json(usage)
    }

    /// `/v1/quota/reset`, `/v1/quota/credit`, `/v1/quota/overrides`: the quota admin API, for
    /// a caller with the admin token.
    async fn quota_admin(&self, session: &ServerSession, path: &str) -> Response<Vec<u8>> {
        if let Err(answer) = self.authorized(session) {
            return *answer;
        }
        let req = session.req_header();
        let peer = session.client_addr().map(|addr| addr.to_string());
        let answer = match Caller::of(peer, &req.headers) {
            Ok(caller) => {
                let call = (path, &req.method);
                quota_admin::serve(&self.policy, &self.live, call, req.uri.query(), &caller).await
            }
            Err(refusal) => Err(refusal),
        };
        answer_json(answer)
    }
}

/// `200` with the JSON answer, or the refusal's status and reason.
fn answer_json(answer: Result<String, UsageError>) -> Response<Vec<u8>> {
    match answer {
        Ok(json) => {
            let mut response = text(200, json + "\n");
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(refusal) => text(refusal.status, format!("{}\n", refusal.reason)),
    }
}

/// Whether `headers` carry `Authorization: Bearer <token>`, compared in constant time.
fn bearer_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let bytes = value.as_bytes();
    let Some(presented) = bytes
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|_| &bytes[7..])
    else {
        return false;
    };
    subtle::ConstantTimeEq::ct_eq(presented, token.as_bytes()).into()
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
            "/readyz" => self.readiness().await,
            "/v1/quota" => self.quota(session).await,
            path @ ("/v1/quota/reset" | "/v1/quota/credit" | "/v1/quota/overrides") => {
                let path = path.to_string();
                self.quota_admin(session, &path).await
            }
            _ => text(
                404,
                "not found: try /metrics, /healthz, /readyz, /v1/quota or /v1/quota/overrides\n"
                    .to_string(),
            ),
        }
    }
}
