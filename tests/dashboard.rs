//! End to end in a real browser: the dashboard at `/ui/` on the admin listener, loaded in
//! Debian's headless Chromium (driven over the DevTools protocol, `support::browser`) from a
//! real gateway on a real Redis. Signing in with the admin token opens it; the overview tells
//! the configuration's generation and a rejected reload's problems; every view loads
//! with no console error and requests nothing from anywhere but the admin listener; the live
//! decisions move under traffic and agree with `/metrics`; the most limited consumer shows;
//! the explain form answers for a limited consumer. And an outage shown as it is: readiness
//! ready, then degraded in another colour; a calendar quota in its words and zone; adaptive
//! concurrency probing, then measured; each upstream server one state on every route ("not
//! checked" where no route checks it, avoided by every route while a check finds it dead) with
//! its errors as `/metrics` counts them; a consumer id's bidi control shown, not obeyed; with
//! Redis stopped, the failure mode's answers in columns of their own (and in `/ui/live.json`)
//! while allowed and limited stay, and the log warns of both `allow` and `deny`. With
//! `SLUICE_SCREENSHOTS=DIR` set, each view is saved there as a PNG (docs/dashboard/ holds the
//! ones docs/operations.md shows).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::api_keys::KeyFile;
use support::browser::{Browser, PageReport};
use support::config::{route, Config};
use support::limits::{calendar, fixed_window};
use support::tokens::{claims, now, Algorithm, TestKey};
use support::{free_port, http_call, http_get, metric, Gateway, Launch, RedisServer, Upstream};

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
    for shown in [
        "per_consumer",
        "path prefix /api/",
        "plan pro",
        "not checked",
    ] {
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

/// The HMAC secret of the outage test's bearer tokens.
const HMAC_SECRET: &str = "a-dashboard-hmac-secret-of-32-bytes!";
/// A consumer id that would reverse the text after it, were it rendered raw.
const EVIL: &str = "evil\u{202E}gpj.exe";

/// The outage test's gateway: `quota` (bearer tokens, a monthly calendar quota in
/// Europe/Paris and 2/h per consumer, adaptive concurrency, `failure_mode: allow`), `login`
/// (`failure_mode: deny`), `dead` (two dead servers, no check) and `checked` (the upstream and
/// one of the dead servers, checked).
fn outage_body(dead_a: &str, dead_b: &str) -> String {
    let adaptive = "{ min_limit: 2, max_limit: 50, probe_requests: 2, probe_interval: 1h }";
    Config::new()
        .redis("REDIS_URL")
        .failure_mode("allow")
        .set(
            "identity",
            format!("{{ jwt: {{ hmac_secret: \"{HMAC_SECRET}\", algorithms: [HS256] }} }}"),
        )
        .set("admin", format!("{{ token: {TOKEN} }}"))
        .route(
            route("quota")
                .prefix("/quota/")
                .set("auth", "required")
                .set("failure_mode", "allow")
                .set("adaptive_concurrency", adaptive)
                .limit(
                    calendar("monthly", "1000/month", "Europe/Paris")
                        .key(&["consumer"])
                        .set("mode", "exact"),
                )
                .limit(
                    fixed_window("per_consumer", "2/h")
                        .key(&["consumer"])
                        .set("mode", "exact"),
                ),
        )
        .route(
            route("login")
                .prefix("/login/")
                .set("failure_mode", "deny")
                .limit(
                    fixed_window("per_address", "100/h")
                        .key(&["client_ip"])
                        .set("mode", "exact"),
                ),
        )
        .route(
            route("dead")
                .prefix("/dead/")
                .upstream(format!("{{ servers: [{dead_a}, {dead_b}], retries: 0 }}")),
        )
        .route(route("checked").prefix("/checked/").upstream(format!(
            "{{ servers: [UPSTREAM, {dead_b}], health_check_interval_ms: 100 }}"
        )))
        .yaml()
}

/// A request to `path` with the bearer token of `consumer`: its status.
fn as_consumer(gateway: &Gateway, path: &str, consumer: &str) -> u16 {
    let key = TestKey::hmac(HMAC_SECRET.as_bytes(), Algorithm::HS256, None);
    let token = key.sign(&claims(consumer, "sluice-tests", "dashboard", now()));
    let bearer = format!("Bearer {token}");
    http_get(gateway.proxy, path, None, &[("authorization", &bearer)]).status
}

/// The count `/metrics` says for `decision` of `route`'s `limit`.
fn decisions(gateway: &Gateway, route: &str, limit: &str, decision: &str) -> f64 {
    let labels = [("route", route), ("limit", limit), ("decision", decision)];
    metric(&gateway.metrics(), "sluice_limit_decisions_total", &labels)
}

/// The readiness the overview draws: its state and its colours.
fn readiness(visit: &mut Visit) -> (String, String) {
    visit.view("");
    let state = visit.text("document.getElementById('readiness').dataset.state");
    let colour = visit.text(
        "(s => s.color + ' on ' + s.backgroundColor)(getComputedStyle(document.getElementById('readiness')))",
    );
    (state, colour)
}

#[test]
fn the_dashboard_shows_an_outage_as_it_is() {
    let mut redis = RedisServer::start();
    let upstream = Upstream::start();
    let (dead_a, dead_b) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let launch = Launch {
        capture_log: true,
        ..Launch::default()
    };
    let body = outage_body(&dead_a, &dead_b);
    let gateway = Gateway::launch(&body, &upstream, Some(&redis), &launch);
    gateway.wait_ready();
    let (shots, _kept) = screenshots();
    let mut visit = Visit {
        browser: Browser::start(),
        origin: format!("http://{}/", gateway.admin),
        shots,
        key_hash: HMAC_SECRET.to_string(),
    };
    let overview = visit.sign_in(TOKEN);
    clean(&overview, &visit.origin, "overview");
    let (state, ready_colour) = readiness(&mut visit);
    assert_eq!(state, "ready");
    let text = visit.text("document.body.innerText");
    assert!(
        text.contains("allow by default; deny on login"),
        "each route's failure mode: {text}"
    );

    adaptive_concurrency_shows_its_probe_then_its_baseline(&mut visit, &gateway);
    let servers = [upstream.addr.to_string(), dead_a, dead_b];
    upstream_servers_have_one_state_and_their_errors(&mut visit, &gateway, &servers);
    let text = visit.view("routes");
    assert!(text.contains("1000 per month in Europe/Paris"), "{text}");
    assert!(text.contains("2 per 3600 s"), "{text}");
    visit.shot("upstream-health");

    let text = visit.view("top");
    assert!(text.contains("evil[U+202E]gpj.exe"), "{text}");
    let markup = visit.text("document.documentElement.outerHTML");
    assert!(
        !markup.contains('\u{202E}'),
        "no bidi control reaches the page"
    );

    // Redis goes away: the overview says degraded, in another colour.
    visit.view("live");
    let before = [
        (
            "quota/monthly",
            "allowed",
            decisions(&gateway, "quota", "monthly", "allowed"),
        ),
        (
            "quota/monthly",
            "limited",
            decisions(&gateway, "quota", "monthly", "limited"),
        ),
        (
            "login/per_address",
            "allowed",
            decisions(&gateway, "login", "per_address", "allowed"),
        ),
    ];
    for (series, field, n) in before {
        let holds = format!("{} === '{n}'", cell(series, &format!("total_{field}")));
        visit.browser.wait_for(
            &holds,
            Duration::from_secs(10),
            &format!("{series} {field} before"),
        );
    }
    redis.stop();
    support::eventually(Duration::from_secs(10), "degraded", || {
        http_get(gateway.admin, "/readyz", None, &[])
            .body
            .starts_with("degraded")
    });
    let (state, degraded_colour) = readiness(&mut visit);
    assert_eq!(state, "degraded");
    assert_ne!(
        degraded_colour, ready_colour,
        "degraded is not drawn as ready"
    );
    let text = visit.text("document.getElementById('readiness').innerText");
    assert!(text.starts_with("Degraded"), "{text}");
    visit.shot("overview-degraded");

    failure_mode_answers_have_their_own_columns(&mut visit, &gateway, &before);
    let log = || gateway.log();
    support::eventually(Duration::from_secs(10), "both outage warnings", || {
        let log = log();
        log.contains("failure_mode=allow: requests admitted unchecked")
            && log.contains("failure_mode=deny: requests refused with 503")
    });
    let last = visit.browser.take_report();
    assert!(
        last.console_errors.is_empty(),
        "late: {:?}",
        last.console_errors
    );
}

/// The quota route's adaptive concurrency: probing at its minimum before any request, then,
/// once two requests answered (the probe's), its baseline, at the limit `/metrics` says. The
/// same requests make the consumer with a bidi control in its id the most limited one.
fn adaptive_concurrency_shows_its_probe_then_its_baseline(visit: &mut Visit, gateway: &Gateway) {
    let field = |name: &str| {
        format!("document.querySelector('.adaptive[data-route=\"quota\"] [data-field=\"{name}\"]').textContent")
    };
    visit.view("routes");
    assert!(
        visit.text(&field("limit")).starts_with("2 (probing"),
        "{}",
        visit.text(&field("limit"))
    );
    assert_eq!(visit.text(&field("baseline")), "not measured yet");
    let statuses: Vec<u16> = (0..3)
        .map(|_| as_consumer(gateway, "/quota/x", EVIL))
        .collect();
    assert_eq!(statuses, [200, 200, 429], "2/h per consumer");
    visit.view("routes");
    let baseline = visit.text(&field("baseline"));
    assert!(
        baseline.ends_with(" ms"),
        "measured by the two answered: {baseline}"
    );
    let limit = metric(
        &gateway.metrics(),
        "sluice_adaptive_concurrency_limit",
        &[("route", "quota")],
    );
    assert_eq!(
        visit.text(&field("limit")),
        limit.to_string(),
        "as /metrics says"
    );
    assert_eq!(visit.text(&field("in_flight")), "0");
    assert_eq!(visit.text(&field("bounds")), "2 to 50");
    assert_eq!(visit.text(&field("shed")), "none 0");
}

/// Each server has one state, on the "Upstream servers" table and on every route listing it:
/// the upstream and `dead_b` checked (healthy, unhealthy), `dead_a` not checked. Requests to
/// the `dead` route meet `dead_a` only (no route dials `dead_b` while it fails), and its errors
/// show beside it as `/metrics` counts them.
fn upstream_servers_have_one_state_and_their_errors(
    visit: &mut Visit,
    gateway: &Gateway,
    [live, dead_a, dead_b]: &[String; 3],
) {
    for _ in 0..2 {
        assert_eq!(gateway.get("/dead/x").status, 502);
    }
    let server_errors = |server: &str| {
        let labels = [("server", server), ("kind", "refused")];
        metric(
            &gateway.metrics(),
            "sluice_upstream_server_errors_total",
            &labels,
        )
    };
    assert_eq!((server_errors(dead_a), server_errors(dead_b)), (2.0, 0.0));
    let recent = |server: &str| {
        format!(
            "[...document.querySelectorAll('#upstream-servers tr')].filter(r => r.querySelector('code')?.textContent === '{server}').map(r => r.querySelector('[data-field=recent_errors]').textContent).join()"
        )
    };
    support::eventually(Duration::from_secs(10), "the errors sampled", || {
        visit.view("routes");
        visit.text(&recent(dead_a)) == "2 refused"
    });
    assert_eq!(visit.text(&recent(dead_b)), "none");
    let states = visit.text(
        "JSON.stringify([...document.querySelectorAll('#upstream-servers tr, .route-upstream tr')]\
         .filter(r => r.querySelector('code') && r.querySelector('[data-field=health]'))\
         .map(r => [r.querySelector('code').textContent, r.querySelector('[data-field=health]').dataset.state]))",
    );
    let states: Vec<(String, String)> = serde_json::from_str(&states).expect("JSON");
    let of = |server: &str| {
        let mut of: Vec<&str> = states
            .iter()
            .filter(|(s, _)| s == server)
            .map(|(_, state)| state.as_str())
            .collect();
        of.dedup();
        of
    };
    assert_eq!(of(dead_a), ["not-checked"], "{states:?}");
    assert_eq!(
        of(dead_b),
        ["unhealthy"],
        "on both routes and the table: {states:?}"
    );
    assert_eq!(of(live), ["healthy"], "{states:?}");
    assert_eq!(
        states.iter().filter(|(s, _)| s == dead_b).count(),
        3,
        "the table, the dead route, the checked route"
    );
}

/// While Redis is down, bob's requests on `quota` are admitted by `failure_mode: allow` and
/// the requests to `login` refused by `deny`: the live view's failure mode columns (and
/// `/ui/live.json`) move to what `/metrics` counts, its allowed and limited stay as `before`.
fn failure_mode_answers_have_their_own_columns(
    visit: &mut Visit,
    gateway: &Gateway,
    before: &[(&str, &str, f64)],
) {
    visit.view("live");
    for _ in 0..3 {
        assert_eq!(
            as_consumer(gateway, "/quota/x", "bob"),
            200,
            "admitted unchecked"
        );
        assert_eq!(gateway.get("/login/x").status, 503, "refused");
    }
    let admitted = decisions(gateway, "quota", "monthly", "error_allowed");
    let refused = decisions(gateway, "login", "per_address", "error_denied");
    assert_eq!((admitted, refused), (3.0, 3.0));
    let expected = [
        ("quota/monthly", "total_failure_admitted", admitted),
        ("quota/monthly", "minute_failure_admitted", admitted),
        ("login/per_address", "total_failure_refused", refused),
    ];
    for (series, field, n) in expected {
        let holds = format!("{} === '{n}'", cell(series, field));
        visit.browser.wait_for(
            &holds,
            Duration::from_secs(10),
            &format!("{series} {field}"),
        );
    }
    for (series, field, n) in before {
        let shown = visit.text(&cell(series, &format!("total_{field}")));
        assert_eq!(
            shown,
            n.to_string(),
            "{series} {field} does not move in the outage"
        );
    }
    let failure_bar =
        "document.querySelector('tr[data-series=\"login/per_address\"] rect.failure') !== null";
    visit
        .browser
        .wait_for(failure_bar, Duration::from_secs(5), "a failure mode bar");
    visit.shot("live-outage");
    let live = visit
        .browser
        .eval("fetch('/ui/live.json', { credentials: 'same-origin' }).then(r => r.json())");
    let series = |route: &str, limit: &str| {
        let all = live["series"].as_array().expect("series");
        all.iter()
            .find(|s| s["route"] == route && s["limit"] == limit)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        series("quota", "monthly")["totals"]["failure_admitted"],
        admitted as u64
    );
    assert_eq!(
        series("login", "per_address")["totals"]["failure_refused"],
        refused as u64
    );
    assert_eq!(series("login", "per_address")["totals"]["limited"], 0);
}
