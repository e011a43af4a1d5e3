//! A small synchronous Chrome DevTools Protocol (CDP) driver: starts headless Chromium on a fresh
//! profile, attaches to its first page over a WebSocket and records what each page load saw
//! (console errors, uncaught exceptions, requested URLs, the document's status). Nothing is mocked.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

/// How long Chromium may take to start, and a page (or a call) to load (or answer).
const TIMEOUT: Duration = Duration::from_secs(60);
/// How long events are still collected after a load event: late script errors and fetches.
const SETTLE: Duration = Duration::from_millis(300);
/// The socket's read timeout: how often a wait for the next message checks its deadline.
const READ_POLL: Duration = Duration::from_millis(50);

/// Headless Chromium attached to its first page; killed (and reaped) when dropped.
pub struct Browser {
    socket: WebSocket<TcpStream>,
    /// Declared before `profile`: the process dies before its profile directory is removed.
    process: Chromium,
    profile: tempfile::TempDir,
    /// The page target's id, which is also its main frame's id.
    main_frame: String,
    next_id: u64,
    report: PageReport,
    loaded: bool,
}

/// What one page load saw.
#[derive(Debug, Default, Clone)]
pub struct PageReport {
    /// Console messages of level error (`console.error`, failed `console.assert`, browser log
    /// entries of level error such as failed resource loads) and uncaught exceptions
    /// (`exception: <text> <description>`), as text. A navigation Chromium could not complete
    /// (`Page.navigate`'s `errorText`) shows up here too, as `navigation failed: <error>`.
    pub console_errors: Vec<String>,
    /// Every URL the page requested, in order, including the document itself.
    pub requests: Vec<String>,
    /// HTTP status of the main document's response, if seen.
    pub status: Option<u16>,
}

/// The Chromium child process, killed and waited for when dropped (also when a start panics).
struct Chromium(Child);

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Browser {
    /// Asks Chromium to close (its helper processes exit with it); the process is killed
    /// after, whatever it did.
    fn drop(&mut self) {
        let close = json!({ "id": self.next_id, "method": "Browser.close" });
        let _ = self.socket.send(Message::text(close.to_string()));
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.process.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Browser {
    /// Starts headless Chromium and attaches to its first page (enables Page, Runtime, Log,
    /// Network domains).
    pub fn start() -> Browser {
        let profile = tempfile::tempdir().expect("temporary Chromium profile directory");
        let mut process = Chromium(launch(profile.path()));
        let port = devtools_port(&mut process.0, profile.path());
        let (target_id, url) = page_target(port);
        let socket = connect(port, &url);
        let mut browser = Browser {
            socket,
            process,
            profile,
            main_frame: target_id,
            next_id: 1,
            report: PageReport::default(),
            loaded: false,
        };
        for domain in ["Page", "Runtime", "Log", "Network"] {
            browser.call(&format!("{domain}.enable"), json!({}));
        }
        browser
    }

    /// Sets headers sent with every request of the page (`Network.setExtraHTTPHeaders`).
    pub fn set_headers(&mut self, headers: &[(&str, &str)]) {
        let headers: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(name, value)| ((*name).to_string(), Value::from(*value)))
            .collect();
        self.call("Network.setExtraHTTPHeaders", json!({ "headers": headers }));
    }

    /// Navigates to `url` and waits (60 s at most, then panics naming the URL) for the load
    /// event, then a further settle period (300 ms) collecting events; returns what the load saw.
    pub fn open(&mut self, url: &str) -> PageReport {
        self.report = PageReport::default();
        self.loaded = false;
        let result = self.call("Page.navigate", json!({ "url": url }));
        if let Some(error) = result.get("errorText").and_then(Value::as_str) {
            self.report
                .console_errors
                .push(format!("navigation failed: {error}"));
        }
        // A navigation within the document (only the fragment changes) fires no load event.
        if result.get("loaderId").is_some() {
            self.wait_for_load(&format!("opening {url}"));
        }
        self.pump(Instant::now() + SETTLE);
        std::mem::take(&mut self.report)
    }

    /// Evaluates a JavaScript expression in the page (awaiting a promise it returns) and returns
    /// its value (`null` for `undefined`); panics with the exception text if it threw.
    pub fn eval(&mut self, expression: &str) -> Value {
        self.evaluate(expression)
            .unwrap_or_else(|error| panic!("evaluating `{expression}`: {error}"))
    }

    /// Polls `expression` (a JavaScript boolean expression) every 100 ms until it is `true`,
    /// bounded by `within`; panics naming `what` when it never held. An evaluation that throws
    /// (say, while the page navigates) counts as "not yet"; the last error is in the panic.
    pub fn wait_for(&mut self, expression: &str, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        loop {
            let last = match self.evaluate(expression) {
                Ok(Value::Bool(true)) => return,
                Ok(value) => format!("it was {value}"),
                Err(error) => error,
            };
            if Instant::now() >= deadline {
                panic!("{what}: `{expression}` did not hold within {within:?} ({last})");
            }
            self.pump(Instant::now() + Duration::from_millis(100));
        }
    }

    /// Events since the last `open()`/`take_report()` (after collecting for a further settle
    /// period): console errors and requests seen meanwhile, e.g. fetches made after the load.
    pub fn take_report(&mut self) -> PageReport {
        self.pump(Instant::now() + SETTLE);
        std::mem::take(&mut self.report)
    }

    /// Runs `expression` (which makes the page navigate, e.g. submitting a form) and waits
    /// (60 s at most) for the next load event plus the settle period (300 ms); returns the report of
    /// the events since the call.
    pub fn navigate_by(&mut self, expression: &str) -> PageReport {
        self.report = PageReport::default();
        self.loaded = false;
        let params = json!({ "expression": expression, "returnByValue": true });
        match self.request("Runtime.evaluate", params) {
            Ok(result) => {
                if let Some(details) = result.get("exceptionDetails") {
                    panic!("`{expression}` threw: {}", exception_text(details));
                }
            }
            // The navigation may tear the page's context down before the evaluation answers.
            Err(error) if error.contains("destroyed") => {}
            Err(error) => panic!("evaluating `{expression}`: {error}"),
        }
        self.wait_for_load(&format!("navigating by `{expression}`"));
        self.pump(Instant::now() + SETTLE);
        std::mem::take(&mut self.report)
    }

    /// Saves a PNG screenshot of the whole page (beyond the viewport) to `path`, creating its
    /// directory when missing.
    pub fn screenshot(&mut self, path: &Path) {
        let metrics = self.call("Page.getLayoutMetrics", json!({}));
        let size = metrics
            .get("cssContentSize")
            .or_else(|| metrics.get("contentSize"))
            .cloned()
            .unwrap_or(Value::Null);
        let mut params = json!({ "format": "png", "captureBeyondViewport": true });
        if let (Some(width), Some(height)) = (size["width"].as_f64(), size["height"].as_f64()) {
            let (width, height) = (width.ceil().max(1.0), height.ceil().max(1.0));
            params["clip"] =
                json!({ "x": 0, "y": 0, "width": width, "height": height, "scale": 1 });
        }
        let result = self.call("Page.captureScreenshot", params);
        let data = result["data"]
            .as_str()
            .expect("Page.captureScreenshot answered without data");
        if let Some(directory) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(directory)
                .unwrap_or_else(|e| panic!("creating {}: {e}", directory.display()));
        }
        std::fs::write(path, decode_base64(data))
            .unwrap_or_else(|e| panic!("writing screenshot {}: {e}", path.display()));
    }

    /// `Runtime.evaluate`: the expression's value, or the exception (or CDP error) as text.
    fn evaluate(&mut self, expression: &str) -> Result<Value, String> {
        let params =
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
        let result = self.request("Runtime.evaluate", params)?;
        if let Some(details) = result.get("exceptionDetails") {
            return Err(format!("threw {}", exception_text(details)));
        }
        Ok(result["result"]
            .get("value")
            .cloned()
            .unwrap_or(Value::Null))
    }

    /// Sends one CDP command and returns its result; panics on a CDP error.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.request(method, params)
            .unwrap_or_else(|error| panic!("CDP {method} failed: {error}"))
    }

    /// Sends one CDP command and reads messages (recording events) until its answer arrives
    /// (60 s at most): the result, or the CDP error's message.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let command = json!({ "id": id, "method": method, "params": params });
        self.socket
            .send(Message::text(command.to_string()))
            .unwrap_or_else(|e| panic!("sending {method} to Chromium: {e}"));
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let Some(message) = self.next_message(deadline) else {
                panic!("Chromium did not answer {method} within {TIMEOUT:?}");
            };
            if message.get("id").and_then(Value::as_u64) != Some(id) {
                self.route(&message);
            } else if let Some(error) = message.get("error") {
                return Err(error["message"]
                    .as_str()
                    .unwrap_or("unknown error")
                    .to_string());
            } else {
                return Ok(message.get("result").cloned().unwrap_or(Value::Null));
            }
        }
    }

    /// Reads the next message, or `None` once `deadline` passed without one.
    fn next_message(&mut self, deadline: Instant) -> Option<Value> {
        loop {
            if Instant::now() >= deadline {
                return None;
            }
            match self.socket.read() {
                Ok(Message::Text(text)) => {
                    let message = serde_json::from_str(text.as_str())
                        .unwrap_or_else(|e| panic!("CDP message is not JSON ({e}): {text}"));
                    return Some(message);
                }
                Ok(Message::Close(frame)) => {
                    panic!("Chromium closed the DevTools socket: {frame:?}")
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading Chromium's DevTools socket: {e}"),
            }
        }
    }

    /// Reads and records events until `until`.
    fn pump(&mut self, until: Instant) {
        while let Some(message) = self.next_message(until) {
            self.route(&message);
        }
    }

    /// Waits (60 s at most) for the load event; panics naming `what` without one.
    fn wait_for_load(&mut self, what: &str) {
        let deadline = Instant::now() + TIMEOUT;
        while !self.loaded {
            let Some(message) = self.next_message(deadline) else {
                panic!("{what}: no load event within {TIMEOUT:?}");
            };
            self.route(&message);
        }
    }

    /// Records an event; answers to commands nobody waits for any more are dropped.
    fn route(&mut self, message: &Value) {
        if message.get("id").is_none() && message.get("method").is_some() {
            self.record(message);
        }
    }

    /// Appends what an event tells to the current report, and notes the load event.
    fn record(&mut self, event: &Value) {
        let params = &event["params"];
        let report = &mut self.report;
        match event["method"].as_str().unwrap_or_default() {
            "Page.loadEventFired" => self.loaded = true,
            "Network.requestWillBeSent" => {
                if let Some(url) = params["request"]["url"].as_str() {
                    report.requests.push(url.to_string());
                }
            }
            // The main frame's document wins; another frame's only when none was seen.
            "Network.responseReceived"
                if params["type"] == "Document"
                    && (report.status.is_none()
                        || params["frameId"] == self.main_frame.as_str()) =>
            {
                let status = params["response"]["status"].as_f64();
                report.status = status.map(|s| s as u16).or(report.status);
            }
            "Runtime.consoleAPICalled"
                if matches!(params["type"].as_str(), Some("error" | "assert")) =>
            {
                let args = params["args"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                let texts: Vec<String> = args.iter().map(remote_object_text).collect();
                report.console_errors.push(texts.join(" "));
            }
            "Log.entryAdded" if params["entry"]["level"] == "error" => {
                let entry = &params["entry"];
                let text = entry["text"].as_str().unwrap_or_default();
                match entry["url"].as_str().filter(|url| !url.is_empty()) {
                    Some(url) => report.console_errors.push(format!("{text} ({url})")),
                    None => report.console_errors.push(text.to_string()),
                }
            }
            "Runtime.exceptionThrown" => {
                let text = exception_text(&params["exceptionDetails"]);
                report.console_errors.push(format!("exception: {text}"));
            }
            _ => {}
        }
    }
}

/// Starts Chromium (headless, on `profile`, the DevTools port left to the kernel).
fn launch(profile: &Path) -> Child {
    let mut command = Command::new("chromium");
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            // /dev/shm may be small (containers): shared memory goes to /tmp instead.
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--metrics-recording-only",
            "--disable-default-apps",
            "--mute-audio",
            "--hide-scrollbars",
            "--window-size=1280,900",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr_file(profile));
    match command.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            panic!("chromium not found: scripts/test.sh installs it (apt-get install chromium)")
        }
        Err(e) => panic!("starting chromium: {e}"),
    }
}

/// Where Chromium's standard error goes: a file in its profile, quoted when it fails to start.
fn stderr_file(profile: &Path) -> Stdio {
    match std::fs::File::create(profile.join("chromium-stderr.log")) {
        Ok(file) => Stdio::from(file),
        Err(_) => Stdio::null(),
    }
}

/// The last lines Chromium wrote to its standard error.
fn stderr_tail(profile: &Path) -> String {
    let text = std::fs::read_to_string(profile.join("chromium-stderr.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The DevTools port, from the first line of `<profile>/DevToolsActivePort` (60 s at most).
fn devtools_port(child: &mut Child, profile: &Path) -> u16 {
    let file = profile.join("DevToolsActivePort");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let contents = std::fs::read_to_string(&file).unwrap_or_default();
        // A complete first line: the file may be read while Chromium still writes it.
        if let Some((first, _)) = contents.split_once('\n') {
            if let Ok(port @ 1..) = first.trim().parse::<u16>() {
                return port;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "chromium exited during startup with {status}; its stderr:\n{}",
                stderr_tail(profile)
            );
        }
        if Instant::now() >= deadline {
            panic!(
                "chromium wrote no port to {} within {TIMEOUT:?}; its stderr:\n{}",
                file.display(),
                stderr_tail(profile)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The first page target's id and WebSocket URL, from `/json/list` (60 s at most).
fn page_target(port: u16) -> (String, String) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let targets = http_get_json(port, "/json/list").unwrap_or(Value::Null);
        let page = targets
            .as_array()
            .and_then(|list| list.iter().find(|target| target["type"] == "page"));
        if let Some(page) = page {
            if let (Some(id), Some(url)) =
                (page["id"].as_str(), page["webSocketDebuggerUrl"].as_str())
            {
                return (id.to_string(), url.to_string());
            }
        }
        if Instant::now() >= deadline {
            panic!("chromium listed no page target on port {port} within {TIMEOUT:?}: {targets}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A GET to Chromium's DevTools server: the body as JSON, if all went well. HTTP/1.1, since the
/// server answers HTTP/1.0 with an empty reply; it keeps the connection open, so the body is
/// read to its Content-Length.
fn http_get_json(port: u16, path: &str) -> Option<Value> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(body) = complete_body(&response) {
            return serde_json::from_slice(body).ok();
        }
        match stream.read(&mut chunk).ok()? {
            0 => break,
            n => response.extend_from_slice(&chunk[..n]),
        }
    }
    let text = std::str::from_utf8(&response).ok()?;
    serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
}

/// The body of `response`, once its headers and all `Content-Length` bytes have arrived.
fn complete_body(response: &[u8]) -> Option<&[u8]> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let headers = std::str::from_utf8(&response[..end]).ok()?;
    let length: usize = headers.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })?;
    response.get(end..end + length)
}

/// Opens the page's DevTools WebSocket, reads then polling every 50 ms.
fn connect(port: u16, url: &str) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connecting to Chromium's DevTools port {port}: {e}"));
    stream
        .set_read_timeout(Some(TIMEOUT))
        .expect("read timeout for the DevTools handshake");
    // Full-page screenshots arrive as one large message.
    let config = tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(512 << 20))
        .max_frame_size(Some(512 << 20));
    let (socket, _) = tungstenite::client::client_with_config(url, stream, Some(config))
        .unwrap_or_else(|e| panic!("DevTools WebSocket handshake with {url}: {e}"));
    socket
        .get_ref()
        .set_read_timeout(Some(READ_POLL))
        .expect("read timeout for the DevTools socket");
    socket
}

/// An exception as `<text> <description>` (e.g. `Uncaught TypeError: x is not a function ...`).
fn exception_text(details: &Value) -> String {
    let text = details["text"].as_str().unwrap_or_default();
    let description = details["exception"]["description"]
        .as_str()
        .or_else(|| details["exception"]["value"].as_str())
        .unwrap_or_default();
    format!("{text} {description}").trim().to_string()
}

/// A console argument as text: its value (strings unquoted), else its description.
fn remote_object_text(object: &Value) -> String {
    match object.get("value") {
        Some(Value::String(text)) => text.clone(),
        Some(value) => value.to_string(),
        None => object["description"]
            .as_str()
            .or_else(|| object["unserializableValue"].as_str())
            .or_else(|| object["type"].as_str())
            .unwrap_or_default()
            .to_string(),
    }
}

/// Decodes standard base64 (padding and line breaks allowed).
fn decode_base64(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len() / 4 * 3);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in text.bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b'\r' | b'\n' | b' ' => continue,
            other => panic!("screenshot data is not base64: byte {other:#04x}"),
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            bytes.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    bytes
}
