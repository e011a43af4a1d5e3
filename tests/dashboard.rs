//! End to end in a real browser: the dashboard at `/ui/` on the admin listener, loaded in
//! Debian's headless Chromium (driven over the DevTools protocol, `support::browser`) from a
//! real gateway on a real Redis. Signing in with the admin token opens it; the overview tells
//! the configuration's generation and a rejected reload's problems; every view loads
//! with no console error and requests nothing from anywhere but the admin listener; the live
//! decisions move under traffic and agree with `/metrics`; the most limited consumer shows;
//! the explain form answers for a limited consumer. With `SLUICE_SCREENSHOTS=DIR` set, each
//! view is saved there as a PNG (docs/dashboard/ holds the ones docs/operations.md shows).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::api_keys::KeyFile;
use support::browser::{Browser, PageReport};
use support::config::{route, Config};
use support::limits::fixed_window;
use support::{http_call, http_get, metric, Gateway, RedisServer, Upstream};

const TOKEN: &str = "dashboard-admin-token-0123456789";
const ALICE: &str = "sk_alice_dashboard_key_000001";

fn body(keys: &KeyFile) -> String {
    Config::new()
        .redis("REDIS_URL")
        .set("identity", keys.free_and_pro())
        .set("admin", format!("{{ token: {TOKEN} }}"))
        .route(
            route("api")
                .prefix("/api/")
                .set("auth", "required")
                .limit(
                    fixed_window("per_consumer", "3/h")
                        .key(&["consumer"])
                        .set("mode", "exact")
                        .set("plans", "{ pro: { rate: 100/h } }"),
                )
                .limit(
                    fixed_window("per_address", "1000/h")
                        .key(&["client_ip"])
                        .set("mode", "exact"),
                ),
        )
        .route(
            route("open")
                .prefix("/open/")
                .limit(fixed_window("everyone", "1000/h").key(&["route"])),
        )
        .yaml()
}

/// Checks what a page load saw: the status, no console error, nothing requested elsewhere.
fn clean(report: &PageReport, origin: &str, what: &str) {
    assert_eq!(report.status, Some(200), "{what}: {report:?}");
    assert!(
        report.console_errors.is_empty(),
        "{what}: console errors {:?}",
        report.console_errors
    );
    let elsewhere: Vec<&String> = report
        .requests
        .iter()
        .filter(|url| !url.starts_with(origin))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "{what}: requests left the admin listener: {elsewhere:?}"
    );
}

/// Where screenshots go: `SLUICE_SCREENSHOTS`, else a directory dropped after the test.
fn screenshots() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os("SLUICE_SCREENSHOTS") {
        Some(dir) => (PathBuf::from(dir), None),
        None => {
            let dir = tempfile::tempdir().expect("temp dir");
            (dir.path().to_path_buf(), Some(dir))
        }
    }
}

/// The text of the live view's cell `field` of series `route/limit`, as the page shows it now.
fn cell(route_limit: &str, field: &str) -> String {
    format!("document.querySelector('tr[data-series=\"{route_limit}\"] [data-field=\"{field}\"]').textContent")
}

/// The browser on the dashboard of one gateway, and where its screenshots go.
struct Visit {
    browser: Browser,
    origin: String,
    shots: PathBuf,
    /// The hash the key file lists for alice's key: never shown.
    key_hash: String,
}

impl Visit {
    /// Opens the view at `path` (below `/ui/`), checks its load is clean, and returns its text.
    fn view(&mut self, path: &str) -> String {
        let report = self.browser.open(&format!("{}ui/{path}", self.origin));
        clean(&report, &self.origin, path);
        self.page_is_clean(path);
        self.text("document.body.innerText")
    }

    /// The page's icon comes from the admin listener (Chromium may fetch it after the load,
    /// or not at all), and no secret is anywhere in its markup.
    fn page_is_clean(&mut self, what: &str) {
        let icon = "fetch(document.querySelector('link[rel=icon]').href).then(r => r.ok \
                    && new URL(r.url).origin === location.origin \
                    && r.headers.get('content-type').startsWith('image/svg'))";
        assert_eq!(
            self.browser.eval(icon),
            serde_json::json!(true),
            "{what}: its icon"
        );
        let markup = self.text("document.documentElement.outerHTML");
        for secret in [TOKEN, ALICE, &self.key_hash] {
            assert!(!markup.contains(secret), "{what} shows a secret: {secret}");
        }
    }

    /// The string `expression` evaluates to in the page.
    fn text(&mut self, expression: &str) -> String {
        let value = self.browser.eval(expression);
        value.as_str().unwrap_or_default().to_string()
    }

    fn shot(&mut self, name: &str) {
        self.browser
            .screenshot(&self.shots.join(format!("{name}.png")));
    }

    /// Signs in with `token` through the form the signed-out overview leads to.
    fn sign_in(&mut self, token: &str) -> PageReport {
        let login = self.browser.open(&format!("{}ui/", self.origin));
        clean(&login, &self.origin, "sign-in");
        assert_eq!(self.text("location.pathname"), "/ui/login");
        let submit = format!(
            "document.getElementById('token').value='{token}'; document.querySelector('form').submit()"
        );
        self.browser.navigate_by(&submit)
    }
}

#[test]
fn the_dashboard_loads_clean_in_a_browser_moves_with_traffic_and_explains() {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let gateway = Gateway::start(&body(&keys), &upstream, Some(&redis));
    gateway.wait_ready();
    let (shots, _kept) = screenshots();
    let mut visit = Visit {
        browser: Browser::start(),
        origin: format!("http://{}/", gateway.admin),
        shots,
        key_hash: sluice::caller::api_keys::KeyHash::of(ALICE.as_bytes()).to_string(),
    };

    // Signed out, every view leads to the sign-in form; the token signs in.
    assert_eq!(
        visit.sign_in("nope").status,
        Some(401),
        "a wrong token is refused"
    );
    let overview = visit.sign_in(TOKEN);
    clean(&overview, &visit.origin, "overview");
    visit.page_is_clean("overview");
    let text = visit.text("document.body.innerText");
    assert!(
        text.contains("generation 1") && text.contains("Ready: the redis limiter answers"),
        "{text}"
    );
    assert!(text.contains("breaker closed"), "{text}");

    // A rejected reload shows with its problems; the one after it takes effect.
    let good = body(&keys);
    assert!(
        !gateway.reload(&good.replace("rate: 3/h", "rate: 3/fortnight")),
        "rejected"
    );
    assert!(gateway.reload(&good), "accepted");
    let text = visit.view("");
    assert!(
        text.contains("generation 2") && text.contains("in force (SIGHUP"),
        "{text}"
    );
    assert!(
        text.contains("fortnight"),
        "the rejected reload's problem: {text}"
    );
    visit.shot("overview");

    let text = visit.view("routes");
    for shown in ["per_consumer", "path prefix /api/", "plan pro", "healthy"] {
        assert!(text.contains(shown), "routes show {shown}: {text}");
    }
    assert!(!text.contains(TOKEN), "no secret rendered");
    visit.shot("routes");

    live_decisions_move_to_what_metrics_says(&mut visit, &gateway);
    visit.shot("live");

    let text = visit.view("top");
    assert!(
        text.contains("alice") && text.contains("api/per_consumer"),
        "{text}"
    );
    visit.shot("top");

    explain_form_answers_for_the_limited_consumer(&mut visit);
    visit.shot("explain");
    let last = visit.browser.take_report();
    assert!(
        last.console_errors.is_empty(),
        "late: {:?}",
        last.console_errors
    );
}

/// On the live view, traffic (alice: 3 allowed, 2 limited; 7 on the open route) shows within
/// the script's refreshes, at the counts `/metrics` says; the refreshes stay clean.
fn live_decisions_move_to_what_metrics_says(visit: &mut Visit, gateway: &Gateway) {
    visit.view("live");
    let before = visit.text(&cell("api/per_consumer", "total_allowed"));
    assert_eq!(before, "0", "no traffic yet");
    // A mark the page keeps only while it is not loaded again: the script moves the numbers.
    visit.browser.eval("window.kept = 'this page'");
    for _ in 0..5 {
        http_get(gateway.proxy, "/api/x", None, &[("x-api-key", ALICE)]);
    }
    for _ in 0..7 {
        http_get(gateway.proxy, "/open/x", None, &[]);
    }
    let metrics = gateway.metrics();
    let counted = |route: &str, limit: &str, decision: &str| {
        let labels = [("route", route), ("limit", limit), ("decision", decision)];
        metric(&metrics, "sluice_limit_decisions_total", &labels)
    };
    let expected = [
        (
            "api/per_consumer",
            "total_allowed",
            counted("api", "per_consumer", "allowed"),
        ),
        (
            "api/per_consumer",
            "total_limited",
            counted("api", "per_consumer", "limited"),
        ),
        (
            "open/everyone",
            "total_allowed",
            counted("open", "everyone", "allowed"),
        ),
        ("api/per_consumer", "minute_limited", 2.0),
    ];
    assert_eq!(
        expected.map(|(.., n)| n),
        [3.0, 2.0, 7.0, 2.0],
        "the traffic as counted"
    );
    for (series, field, n) in expected {
        let holds = format!("{} === '{n}'", cell(series, field));
        let what = format!("{series} {field} reaches {n}");
        visit
            .browser
            .wait_for(&holds, Duration::from_secs(10), &what);
    }
    let refreshed = visit.browser.take_report();
    assert!(
        refreshed.console_errors.is_empty(),
        "{:?}",
        refreshed.console_errors
    );
    let elsewhere = refreshed
        .requests
        .iter()
        .filter(|url| !url.starts_with(&visit.origin));
    assert_eq!(elsewhere.count(), 0, "{:?}", refreshed.requests);
    let polled = refreshed
        .requests
        .iter()
        .any(|url| url.ends_with("/ui/live.json"));
    assert!(polled, "the script refreshes");
}

/// The explain form, filled and sent as an operator would, answers for alice, limited.
fn explain_form_answers_for_the_limited_consumer(visit: &mut Visit) {
    visit.view("explain");
    let fill = format!(
        "document.getElementById('host').value='api.example.com'; document.getElementById('path').value='/api/orders'; \
         document.getElementById('headers').value='X-API-Key: {ALICE}'; document.querySelector('form.explain').submit()"
    );
    let explained = visit.browser.navigate_by(&fill);
    clean(&explained, &visit.origin, "explain answer");
    visit.page_is_clean("explain answer");
    let text = visit.text("document.getElementById('explained').innerText");
    for shown in ["api", "alice", "free", "per_consumer", "per_address"] {
        assert!(
            text.contains(shown),
            "the explanation names {shown}: {text}"
        );
    }
    let remaining = visit
        .browser
        .eval("[...document.querySelectorAll('[data-field=remaining]')].map(e => e.textContent)");
    let expected = serde_json::json!(["0", "997"]);
    assert_eq!(
        remaining, expected,
        "alice has nothing left; her address 997 of 1000 (denials consume nothing)"
    );
}

/// `POST path` with a form body.
fn post_form(addr: std::net::SocketAddr, path: &str, form: &str) -> support::Response {
    use std::io::Write;
    let mut stream = support::connect(addr, None);
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
        form.len()
    );
    stream.write_all(request.as_bytes()).expect("send the form");
    support::read_response(&mut stream)
}

#[test]
fn the_dashboard_is_off_without_a_token_signs_in_by_cookie_and_only_reads() {
    let upstream = Upstream::start();
    let off = Gateway::start(
        &Config::new().route(route("open").prefix("/")).yaml(),
        &upstream,
        None,
    );
    off.wait_ready();
    for path in ["/ui/", "/ui/live.json", "/v1/explain?host=a"] {
        let answer = http_call(off.admin, "GET", path, None, &[]);
        assert_eq!(answer.status, 404, "{path}: off without admin.token");
    }
    // The API answers JSON even then: a problem.
    let answer = http_call(off.admin, "GET", "/v1/explain?host=a", None, &[]);
    let problem: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(problem["status"], 404, "{problem}");

    let keys = KeyFile::write(&[(ALICE, "alice", Some("free"), false)]);
    let redis = RedisServer::start();
    let on = Gateway::start(&body(&keys), &upstream, Some(&redis));
    on.wait_ready();
    let signed_out = http_call(on.admin, "GET", "/ui/routes", None, &[]);
    assert_eq!(
        (signed_out.status, signed_out.header("location")),
        (303, Some("/ui/login"))
    );
    let policy = signed_out
        .header("content-security-policy")
        .unwrap_or_default();
    assert!(policy.starts_with("default-src 'none'"), "{policy}");

    let form = format!("token={TOKEN}");
    let signed_in = post_form(on.admin, "/ui/login", &form);
    assert_eq!(signed_in.status, 303);
    let cookie = signed_in
        .header("set-cookie")
        .expect("a cookie")
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!cookie.contains(TOKEN), "the cookie is not the token");
    let session = cookie.split(';').next().expect("name=value").to_string();
    let page = http_call(on.admin, "GET", "/ui/routes", None, &[("cookie", &session)]);
    assert_eq!(page.status, 200, "the cookie opens the dashboard");
    assert!(page.body.contains("per_consumer"));
    let api = http_call(
        on.admin,
        "GET",
        "/v1/explain?host=a",
        None,
        &[("cookie", &session)],
    );
    assert_eq!(api.status, 401, "but not the admin APIs");
    let polled = http_call(on.admin, "GET", "/ui/live.json", None, &[]);
    assert_eq!(
        polled.status, 401,
        "the script's poll is told to sign in, not redirected"
    );
    let forged = http_call(
        on.admin,
        "GET",
        "/ui/routes",
        None,
        &[("cookie", "sluice_dashboard=00")],
    );
    assert_eq!(forged.status, 303);

    let bearer = format!("Bearer {TOKEN}");
    let write = http_call(
        on.admin,
        "POST",
        "/ui/live",
        None,
        &[("authorization", &bearer)],
    );
    assert_eq!(write.status, 405, "nothing on it changes the gateway");
    // The sampler starts with the proxy, which may be after the admin listener answers.
    let sampled = || {
        let headers = [("authorization", bearer.as_str())];
        let live = http_call(on.admin, "GET", "/ui/live.json", None, &headers);
        let live: serde_json::Value = serde_json::from_str(&live.body).expect("JSON");
        live["series"].as_array().is_some_and(|s| s.len() == 3)
    };
    support::eventually(Duration::from_secs(30), "every limit sampled", sampled);
}
