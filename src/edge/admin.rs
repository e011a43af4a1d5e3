//! The admin listener: `GET /metrics` (Prometheus text), `/healthz` (alive), `/readyz`
//! (`200` when the limiter backend answers, or when it does not and the failure mode still
//! serves; `503` when it does not and the failure mode refuses traffic, and while routes verify
//! callers with a JWT verifier that has no keys yet). The failure mode and the verifier are
//! those in force: a reload that changes them changes what `/readyz` says. What the file
//! changes that waits for a graceful upgrade is a line of its own (`pending upgrade (sluice
//! -u): redis.key_prefix`), whatever the status; so are quota limits on a Redis that keeps
//! nothing across a restart (`runtime::durability`). Behind `admin.token`:
//! the usage API (`/v1/quota`, `usage.rs`) and the quota admin API (`/v1/quota/reset`,
//! `/v1/quota/credit`, `/v1/quota/overrides`, `/v1/quota/plans`, `quota_admin/`) and the explain endpoint
//! (`/v1/explain`, `explain.rs`), and the dashboard (`/ui/`, `dashboard/`). The APIs refuse
//! as `application/problem+json`. Request heads are read as the proxy reads them
//! (`proxy/head_count.rs`): a target over 8 KiB gets `414`, too many or too large header
//! fields `431`, and the connection is closed.

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use pingora_prometheus::PrometheusHttpApp;

use crate::edge::admin_error::AdminError;
use crate::edge::admin_http::{bearer_matches, problem, response};
use crate::edge::dashboard::{self, Sessions, Window};
use crate::edge::drain::Drain;
use crate::edge::proxy::head_count::HeadCount;
use crate::edge::quota_admin::{self, Caller};
use crate::edge::readiness::ReadyState;
use crate::exchange::Cut;
use crate::limiter::{Policy, Readiness};
use crate::runtime::durability;
use crate::runtime::snapshot::{InForce, Snapshot};

pub struct AdminApp {
    policy: Arc<Policy>,
    /// The configuration in force: its failure mode says whether an unavailable limiter makes
    /// the gateway unready.
    live: InForce,
    /// A graceful shutdown under way makes it unready.
    drain: Arc<Drain>,
    /// The key the dashboard signs its sessions with, drawn at start.
    sessions: Sessions,
}

impl AdminApp {
    pub fn new(policy: Arc<Policy>, live: InForce, drain: Arc<Drain>) -> AdminApp {
        AdminApp {
            policy,
            live,
            drain,
            sessions: Sessions::new(),
        }
    }

    /// `/readyz`: whether this gateway should get traffic now, and what waits for an upgrade.
    async fn readiness(&self) -> Response<Vec<u8>> {
        let state = self.ready_now().await;
        let snapshot = self.live.load();
        let mut said = state.line();
        said.push_str(&pending_line(&snapshot.config.pending_upgrade));
        // A quota at risk in Redis is a line of its own: it changes nothing of the status.
        if let Some(warning) = durability::warning(&snapshot.config, &self.policy) {
            said.push_str(&format!("{warning}\n"));
        }
        text(state.status(), said)
    }

    /// Whether this gateway should get traffic now.
    async fn ready_now(&self) -> ReadyState {
        if self.drain.is_draining() {
            // SIGTERM: it still serves until grace_period_seconds ends; send new traffic elsewhere.
            return ReadyState::Draining;
        }
        if self.live.load().awaits_jwt_keys() {
            // Every token would be refused (503): send the traffic to a gateway that has keys.
            return ReadyState::AwaitingKeys;
        }
        let backend = self.policy.backend();
        let readiness = self.policy.readiness().await;
        let failure_mode = self.live.load().config.failure_mode;
        match readiness {
            Readiness::Ready => ReadyState::Ready { backend },
            // The failure mode refuses traffic: send it to a gateway that can decide.
            Readiness::Unavailable(reason) if failure_mode.refuses() => ReadyState::Refusing {
                backend,
                reason,
                failure_mode,
            },
            // The failure mode is deciding for Redis: the gateway still serves, degraded.
            Readiness::Unavailable(reason) => ReadyState::Degraded {
                backend,
                reason,
                failure_mode,
            },
        }
    }
}

/// The line `/readyz` adds for what the file changes that waits for a graceful upgrade; none
/// when nothing does.
fn pending_line(pending: &[crate::config::PendingChange]) -> String {
    if pending.is_empty() {
        return String::new();
    }
    let paths: Vec<&str> = pending.iter().map(|change| change.path).collect();
    format!("pending upgrade (sluice -u): {}\n", paths.join(", "))
}

impl AdminApp {
    /// The configuration in force, when the caller has the admin token; else the answer.
    fn authorized(&self, session: &ServerSession) -> Result<Arc<Snapshot>, Box<Response<Vec<u8>>>> {
        let snapshot = self.live.load_full();
        let Some(token) = &snapshot.config.admin_token else {
            return Err(Box::new(problem(
                404,
                "The usage, quota admin and explain APIs are on when admin.token is set.",
            )));
        };
        if !bearer_matches(&session.req_header().headers, token.expose()) {
            let mut refused = problem(401, "Send Authorization: Bearer <admin.token>.");
            refused.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"sluice admin\""),
            );
            return Err(Box::new(refused));
        }
        Ok(snapshot)
    }

    /// [`AdminApp::authorized`] for a read: `405` for any method but `GET`.
    fn authorized_read(
        &self,
        session: &ServerSession,
    ) -> Result<Arc<Snapshot>, Box<Response<Vec<u8>>>> {
        let snapshot = self.authorized(session)?;
        match session.req_header().method == http::Method::GET {
            true => Ok(snapshot),
            false => Err(Box::new(problem(405, "Use GET."))),
        }
    }

    /// `/v1/quota`: a consumer's usage, for a caller with the admin token.
    async fn quota(&self, session: &ServerSession) -> Response<Vec<u8>> {
        let snapshot = match self.authorized_read(session) {
            Ok(snapshot) => snapshot,
            Err(answer) => return *answer,
        };
        let req = session.req_header();
        let usage = crate::edge::usage::quota(&self.policy, &snapshot, req.uri.query()).await;
        answer_json(usage)
    }

    /// `/v1/explain`: what the gateway would do with the request the query describes, for a
    /// caller with the admin token.
    async fn explain(&self, session: &ServerSession) -> Response<Vec<u8>> {
        let snapshot = match self.authorized_read(session) {
            Ok(snapshot) => snapshot,
            Err(answer) => return *answer,
        };
        let req = session.req_header();
        let explained = crate::edge::explain::explain(&self.policy, &snapshot, req.uri.query());
        let json = explained.await.and_then(|answer| {
            serde_json::to_string(&answer).map_err(|e| AdminError::Internal(e.to_string().into()))
        });
        answer_json(json)
    }

    /// `/v1/quota/reset`, `/v1/quota/credit`, `/v1/quota/overrides`, `/v1/quota/plans`: the
    /// quota admin API, for
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

/// `200` with the JSON answer, or the refusal's status and reason as a problem.
fn answer_json(answer: Result<String, AdminError>) -> Response<Vec<u8>> {
    match answer {
        Ok(json) => response(200, "application/json", json + "\n"),
        Err(refusal) => problem(refusal.status(), &refusal.to_string()),
    }
}

/// `414` or `431` for a head over the proxy's bounds (`exchange::head::oversized`: what the
/// count cut of it, or what Pingora read), as a problem; the connection is then closed.
fn oversized_head(session: &mut ServerSession) -> Option<Response<Vec<u8>>> {
    let cut = HeadCount::of(session).map_or(Cut::default(), HeadCount::cut);
    let answer = crate::exchange::head::oversized(session.req_header(), cut)?;
    session.set_keepalive(None);
    Some(problem(answer.status(), answer.detail()))
}

fn text(status: u16, body: String) -> Response<Vec<u8>> {
    response(status, "text/plain; charset=utf-8", body)
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if let Some(refused) = oversized_head(session) {
            return refused;
        }
        match session.req_header().uri.path() {
            "/metrics" => PrometheusHttpApp.response(session).await,
            "/healthz" => text(200, "ok\n".to_string()),
            "/readyz" => self.readiness().await,
            "/v1/quota" => self.quota(session).await,
            "/v1/explain" => self.explain(session).await,
            path if path == "/ui" || path.starts_with("/ui/") => {
                let window = Window {
                    policy: &self.policy,
                    sessions: &self.sessions,
                    live: &self.live,
                    readiness: Box::pin(self.ready_now()),
                };
                dashboard::serve(session, window).await
            }
            path @ ("/v1/quota/reset"
            | "/v1/quota/credit"
            | "/v1/quota/overrides"
            | "/v1/quota/plans") => {
                let path = path.to_string();
                self.quota_admin(session, &path).await
            }
            _ => text(
                404,
                "not found: try /metrics, /healthz, /readyz, /v1/quota, /v1/quota/overrides or /v1/explain\n"
                    .to_string(),
            ),
        }
    }
}
