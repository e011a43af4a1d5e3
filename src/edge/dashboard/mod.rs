//! The dashboard at `/ui/` on the admin listener: an overview of the gateway, its routes, each
//! limit's live decisions, the most limited keys and consumers, and the explain form (`pages`),
//! served from the binary (HTML written on the server, one stylesheet and one small script
//! embedded with `include_str!`; no build step, nothing fetched from elsewhere, a
//! `Content-Security-Policy` that allows nothing else). On only when `admin.token` is set, and
//! behind it: a browser signs in once with the token (`/ui/login`) and keeps a session cookie
//! signed by this process (never the token; 12 hours); a client may send `Authorization:
//! Bearer` instead. Every view only reads: nothing on it changes the gateway (the explain form
//! is sent by `POST`, so the credentials it carries stay out of URLs and histories).

mod html;
mod pages;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderValue, Response};
use pingora::protocols::http::ServerSession;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::edge::admin_error::AdminError;
use crate::edge::admin_http::{bearer_matches, response};
use crate::edge::explain::{self, Described, Description};
use crate::edge::readiness::ReadyState;
use crate::limiter::Policy;
use crate::runtime::durability;
use crate::runtime::snapshot::InForce;

const STYLE: &str = include_str!("style.css");
const SCRIPT: &str = include_str!("app.js");
const ICON: &str = include_str!("favicon.svg");
/// The cookie a signed-in browser sends.
const COOKIE: &str = "sluice_dashboard";
/// The longest form read (the sign-in form, the explain form).
const MAX_FORM_BODY: usize = 16 * 1024;
/// Nothing but the dashboard's own files, and no framing.
const POLICY: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Whether the gateway should get traffic now (what `/readyz` tells), asked only when the
/// overview is shown.
pub type Readiness<'a> = Pin<Box<dyn Future<Output = ReadyState> + Send + 'a>>;

/// What the dashboard reads: the limiter, the configuration in force, and the gateway's
/// readiness.
pub struct Window<'a> {
    pub policy: &'a Arc<Policy>,
    /// The key this process signs sessions with.
    pub sessions: &'a Sessions,
    pub live: &'a InForce,
    pub readiness: Readiness<'a>,
}

/// Serves one request for `/ui` or below.
pub async fn serve(session: &mut ServerSession, window: Window<'_>) -> Response<Vec<u8>> {
    let path = session.req_header().uri.path().to_string();
    let method = session.req_header().method.clone();
    match path.as_str() {
        "/ui/style.css" => return asset(STYLE, "text/css; charset=utf-8"),
        "/ui/app.js" => return asset(SCRIPT, "text/javascript; charset=utf-8"),
        "/ui/favicon.svg" => return asset(ICON, "image/svg+xml"),
        "/ui" => return redirect("/ui/", None),
        _ => {}
    }
    let snapshot = window.live.load_full();
    let Some(token) = snapshot
        .config
        .admin_token
        .as_ref()
        .map(|t| t.expose().to_string())
    else {
        return respond(
            404,
            "text/plain; charset=utf-8",
            "not found: the dashboard is on when admin.token is set\n".into(),
        );
    };
    if path == "/ui/login" {
        return login(session, &token, window.sessions).await;
    }
    if !signed_in(session, &token, window.sessions) {
        return match path.ends_with(".json") {
            true => respond(
                401,
                "text/plain; charset=utf-8",
                "sign in again at /ui/login\n".into(),
            ),
            false => redirect("/ui/login", None),
        };
    }
    let sent = match sent(session, &path, &method).await {
        Ok(sent) => sent,
        Err(refused) => return refused,
    };
    view(&path, window, &snapshot, &sent).await
}

/// What a signed-in request sent (as `application/x-www-form-urlencoded`): the explain form's
/// `POST` body, or the query of a `GET`; anything else is refused (`405`): nothing here
/// changes the gateway.
async fn sent(
    session: &mut ServerSession,
    path: &str,
    method: &http::Method,
) -> Result<Vec<u8>, Response<Vec<u8>>> {
    match (path, method) {
        ("/ui/explain", &http::Method::POST) => read_form(session).await,
        (_, &http::Method::GET | &http::Method::HEAD) => {
            let query = session.req_header().uri.query().unwrap_or("");
            Ok(query.as_bytes().to_vec())
        }
        _ => {
            let only = "the dashboard only reads: use GET (the explain form sends POST)\n";
            Err(respond(405, "text/plain; charset=utf-8", only.into()))
        }
    }
}

/// The view at `path`.
async fn view(
    path: &str,
    window: Window<'_>,
    snapshot: &crate::runtime::snapshot::Snapshot,
    sent: &[u8],
) -> Response<Vec<u8>> {
    let html = |body: String| respond(200, "text/html; charset=utf-8", body);
    match path {
        "/ui/" => {
            let state = window.readiness.await;
            let at_risk = durability::warning(&snapshot.config, window.policy);
            let breaker = window.policy.breaker_state();
            html(pages::overview(
                &snapshot.site,
                &state,
                at_risk.as_ref(),
                breaker,
            ))
        }
        "/ui/routes" => html(pages::routes(&snapshot.site, snapshot.health())),
        "/ui/live" => html(pages::live(&snapshot.views)),
        "/ui/live.json" => {
            let json = pages::live_json(&snapshot.views).to_string();
            respond(200, "application/json", json)
        }
        "/ui/top" => html(pages::top(&snapshot.views)),
        "/ui/explain" => html(explain_page(window.policy, snapshot, sent).await),
        _ => respond(404, "text/plain; charset=utf-8", "not found: the dashboard's views are /ui/, /ui/routes, /ui/live, /ui/top and /ui/explain\n".into()),
    }
}

/// The explain form, and its answer once sent (a host given): `sent` the form's fields.
async fn explain_page(
    policy: &Policy,
    snapshot: &crate::runtime::snapshot::Snapshot,
    sent: &[u8],
) -> String {
    let description = crate::edge::query::read::<Description>(sent).map_err(AdminError::from);
    let answer = match &description {
        Err(refused) => Some(Err(refused.to_string())),
        Ok(description) if Description::given(&description.host).is_none() => None,
        Ok(description) => Some(match Described::from_description(description) {
            Ok(described) => explain::explain_described(policy, snapshot, &described)
                .await
                .map_err(|refused| refused.to_string()),
            Err(refused) => Err(refused.to_string()),
        }),
    };
    pages::explain(&description.unwrap_or_default(), answer)
}

/// Why a right token signs no browser in: there is no key to sign its session.
const NO_KEY: &str = "This gateway cannot sign sessions (its random number generator failed at start): send Authorization: Bearer with the admin token instead.";

/// How long a sign-in lasts.
const SESSION: Duration = Duration::from_secs(12 * 3600);

/// The key signing this process's sessions: random, drawn once when the admin listener is
/// built, so a restart signs everyone out. Never a constant: when the system's random number
/// generator fails (three tries), there is no key, sessions are refused (`503` at sign-in,
/// said once in the log) and only `Authorization: Bearer` opens the dashboard.
pub struct Sessions {
    key: Option<ring::hmac::Key>,
}

impl Sessions {
    /// A key from the system's random number generator.
    pub fn new() -> Sessions {
        let random = ring::rand::SystemRandom::new();
        Sessions::drawn(|bytes| ring::rand::SecureRandom::fill(&random, bytes).map_err(|_| ()))
    }

    /// A key from `fill`'s bytes, tried three times; none when it fails each time.
    fn drawn(mut fill: impl FnMut(&mut [u8]) -> Result<(), ()>) -> Sessions {
        let mut bytes = [0u8; 32];
        let drawn = (0..3).any(|_| fill(&mut bytes).is_ok());
        if !drawn {
            log::error!("dashboard: the system's random number generator failed, so sessions cannot be signed: sign-in is refused (send Authorization: Bearer <admin.token>)");
        }
        Sessions {
            key: drawn.then(|| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes)),
        }
    }

    /// The cookie value of a browser signed in with `token` until `until` (Unix seconds):
    /// `until.signature`, an HMAC of both under this process's key (none without a key). Not
    /// the token, nor a digest of it alone: it opens the dashboard and nothing else, until it
    /// expires, the token changes or the process restarts.
    fn value(&self, token: &str, until: u64) -> Option<String> {
        let signed = format!("{until}\n{token}");
        let tag = ring::hmac::sign(self.key.as_ref()?, signed.as_bytes());
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        Some(format!("{until}.{hex}"))
    }

    /// Whether `value` is a session of `token` that has not expired.
    fn valid(&self, value: &str, token: &str) -> bool {
        let Some((until, _)) = value.split_once('.') else {
            return false;
        };
        let Ok(until) = until.parse::<u64>() else {
            return false;
        };
        let Some(expected) = self.value(token, until) else {
            return false;
        };
        bool::from(value.as_bytes().ct_eq(expected.as_bytes())) && now() < until
    }
}

impl Default for Sessions {
    fn default() -> Sessions {
        Sessions::new()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether the request carries the admin token, or the cookie of a browser signed in with it.
fn signed_in(session: &ServerSession, token: &str, sessions: &Sessions) -> bool {
    let headers = &session.req_header().headers;
    if bearer_matches(headers, token) {
        return true;
    }
    let cookies = headers.get_all(http::header::COOKIE).iter();
    let mut values = cookies
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='));
    values.any(|value| sessions.valid(value, token))
}

/// The form a `POST` sent, at most [`MAX_FORM_BODY`] bytes.
async fn read_form(session: &mut ServerSession) -> Result<Vec<u8>, Response<Vec<u8>>> {
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => {
                let said = format!("the form could not be read: {e}\n");
                return Err(respond(400, "text/plain; charset=utf-8", said));
            }
        }
        if body.len() > MAX_FORM_BODY {
            let said = "the form is larger than the dashboard reads\n";
            return Err(respond(413, "text/plain; charset=utf-8", said.into()));
        }
    }
    Ok(body)
}

/// What the sign-in form sends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    token: Option<String>,
}

/// `/ui/login`: the sign-in form (GET), or the token it sent checked (POST).
async fn login(session: &mut ServerSession, token: &str, sessions: &Sessions) -> Response<Vec<u8>> {
    if session.req_header().method != http::Method::POST {
        return respond(200, "text/html; charset=utf-8", login_form(None));
    }
    let form = match read_form(session).await {
        Ok(form) => crate::edge::query::read::<SignIn>(&form),
        Err(refused) => return refused,
    };
    let sent = form.ok().and_then(|form| form.token).unwrap_or_default();
    if !bool::from(sent.as_bytes().ct_eq(token.as_bytes())) {
        let refused = login_form(Some("That is not the admin token."));
        return respond(401, "text/html; charset=utf-8", refused);
    }
    let until = now() + SESSION.as_secs();
    let Some(value) = sessions.value(token, until) else {
        let refused = login_form(Some(NO_KEY));
        return respond(503, "text/html; charset=utf-8", refused);
    };
    let max_age = SESSION.as_secs();
    let cookie =
        format!("{COOKIE}={value}; Path=/ui; Max-Age={max_age}; HttpOnly; SameSite=Strict");
    redirect("/ui/", Some(cookie))
}

fn login_form(error: Option<&str>) -> String {
    let error = error.map_or(String::new(), |e| {
        format!("<p class=\"bad\">{}</p>", html::esc(e))
    });
    let body = format!(
        "{error}<form class=\"explain\" method=\"post\" action=\"/ui/login\">\
         <label for=\"token\">Admin token</label><input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\">\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"muted\">The token is <code>admin.token</code> of the configuration. The browser keeps a signed cookie for 12 hours (not the token).</p>"
    );
    html::page("Sign in", "", &body)
}

fn asset(body: &str, content_type: &'static str) -> Response<Vec<u8>> {
    let mut response = respond(200, content_type, body.to_string());
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("max-age=300"),
    );
    response
}

fn redirect(to: &'static str, cookie: Option<String>) -> Response<Vec<u8>> {
    let mut response = respond(303, "text/plain; charset=utf-8", format!("see {to}\n"));
    let headers = response.headers_mut();
    headers.insert(http::header::LOCATION, HeaderValue::from_static(to));
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(http::header::SET_COOKIE, cookie);
    }
    response
}

/// The headers of every dashboard answer: its policy, no sniffing, no caching, no referrer,
/// no framing.
const HEADERS: [(http::header::HeaderName, &str); 5] = [
    (http::header::CONTENT_SECURITY_POLICY, POLICY),
    (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (http::header::CACHE_CONTROL, "no-store"),
    (http::header::REFERRER_POLICY, "no-referrer"),
    (http::header::X_FRAME_OPTIONS, "DENY"),
];

/// A response with the dashboard's headers.
fn respond(status: u16, content_type: &'static str, body: String) -> Response<Vec<u8>> {
    let mut response = response(status, content_type, body);
    for (name, value) in HEADERS {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_holds_until_it_expires_or_the_token_changes() {
        let sessions = Sessions::new();
        let token = "a-token-of-sixteen-plus";
        let later = now() + 60;
        let value = sessions.value(token, later).unwrap();
        assert!(sessions.valid(&value, token));
        assert!(!value.contains(token), "not the token");
        assert!(
            !sessions.valid(&value, "another-token-entirely"),
            "a new token signs out"
        );
        let expired = sessions.value(token, now() - 1).unwrap();
        assert!(!sessions.valid(&expired, token), "expired");
        let forged = format!(
            "{}.{}",
            later + 3600,
            value.split_once('.').map_or("", |(_, t)| t)
        );
        assert!(!sessions.valid(&forged, token), "the expiry is signed");
        assert!(!sessions.valid("garbage", token));
        assert!(!Sessions::new().valid(&value, token), "a restart signs out");
    }

    #[test]
    fn without_random_bytes_there_is_no_key_and_no_session() {
        let mut tries = 0;
        let none = Sessions::drawn(|_| {
            tries += 1;
            Err(())
        });
        assert_eq!(tries, 3, "tried three times");
        let token = "a-token-of-sixteen-plus";
        assert_eq!(none.value(token, now() + 60), None, "never a constant key");
        let signed = Sessions::new().value(token, now() + 60).unwrap();
        assert!(!none.valid(&signed, token));
        let mut second = 0;
        let retried = Sessions::drawn(|bytes| {
            second += 1;
            bytes.fill(7);
            if second < 2 {
                return Err(());
            }
            Ok(())
        });
        assert!(
            retried.value(token, now() + 60).is_some(),
            "a retry draws one"
        );
    }
}
