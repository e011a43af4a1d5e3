//! Test harness: real `redis-server`, real demo upstream and real `sluice` processes on free
//! loopback ports, each reaped by PID when its handle drops. Nothing is mocked.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod api_keys;
pub mod browser;
pub mod certs;
pub mod config;
pub mod daemons;
pub mod faults;
pub mod limits;
pub mod netns;
pub mod relay;
pub mod scripted;
pub mod tokens;
pub mod topologies;

/// A loopback port nobody listens on right now, never handed out twice by this test process.
///
/// Ports come from just below the kernel's ephemeral range, so no outgoing connection (a client,
/// sluice dialling Redis) can take one between this check and the server's own bind: a port from
/// `bind(":0")` can, and once did on a cold CI machine. The starting point is drawn per process, so
/// test binaries that run one after another do not walk the same ports. Only child processes get
/// ports from here, and their starts are retried on new ports when one was taken meanwhile
/// ([`start_retrying`]); a socket the test holds itself binds port 0 and reads it back.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let low = ephemeral_low.saturating_sub(16384).max(1024);
    let span = ephemeral_low - low;
    let seed = std::process::id().wrapping_mul(2_654_435_761).wrapping_add(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.subsec_nanos()),
    ) % span;
    let _ = NEXT.compare_exchange(u32::MAX, seed, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..span {
        let port = (low + NEXT.fetch_add(1, Ordering::Relaxed) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {low}..{ephemeral_low}");
}

fn wait_until(what: &str, child: &mut Child, timeout: Duration, ready: impl FnMut() -> bool) {
    if let Started::Exited(status) = wait_for_start(what, child, timeout, ready) {
        panic!("{what} exited during startup with {status}");
    }
}

/// How a child's start ended (a start that does not end within its timeout panics).
enum Started {
    Ready,
    Exited(std::process::ExitStatus),
}

fn wait_for_start(
    what: &str,
    child: &mut Child,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Started {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ready() {
            return Started::Ready;
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Started::Exited(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} was not ready within {timeout:?}");
}

/// Starts a server child on ports the harness chose, again on new ports when a start failed
/// because one of them was taken meanwhile (by another test's server): a port checked free and
/// bound later by a child process can be taken in between, and once was on a cold CI machine.
/// `attempt` spawns the child on fresh ports and says which ports it binds; a child that exits
/// with its ports still free failed for another reason, which panics at once.
fn start_retrying<T>(
    what: &str,
    timeout: Duration,
    mut attempt: impl FnMut() -> (Child, Vec<u16>, T),
    mut ready: impl FnMut(&T) -> bool,
) -> (Child, T) {
    const ATTEMPTS: usize = 4;
    for _ in 0..ATTEMPTS {
        let (mut child, ports, started) = attempt();
        match wait_for_start(what, &mut child, timeout, || ready(&started)) {
            Started::Ready => return (child, started),
            Started::Exited(status) => {
                let taken: Vec<u16> = ports.into_iter().filter(|&port| is_taken(port)).collect();
                assert!(
                    !taken.is_empty(),
                    "{what} exited during startup with {status}"
                );
                eprintln!(
                    "{what}: port(s) {taken:?} were taken before it bound them; again on new ports"
                );
            }
        }
    }
    panic!("{what}: {ATTEMPTS} starts each found a port taken");
}

/// Someone listens on the loopback `port` now.
fn is_taken(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_err()
}

/// Polls `done` every 20 ms until it holds; panics naming `what` when `within` passes first.
/// The deadline is generous on purpose: it bounds a hung test, it is not a timing assertion.
pub fn eventually(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A throwaway `redis-server` with no persistence.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    password: Option<String>,
    /// Its working directory, its own: a replica writes the data it receives there
    /// (`dump.rdb`), which no other server may load.
    _dir: tempfile::TempDir,
}

/// The arguments of a throwaway redis-server on loopback: no persistence.
pub fn redis_args(port: u16) -> Vec<String> {
    let port = port.to_string();
    [
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The calls of `commands` in an `INFO commandstats` reply.
pub fn command_calls(info: &str, commands: &[&str]) -> u64 {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            commands.contains(&name).then_some(stats)
        })
        .filter_map(|stats| {
            stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Starts redis-server, failing the test loudly when it is not installed.
pub fn spawn_redis(args: &[String]) -> Child {
    Command::new("redis-server")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}): it is required by this test. \
                 Run scripts/test.sh, which installs it, or: apt-get install redis-server"
            )
        })
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(None, &[])
    }

    /// A server on `port` (a restart on the port a killed one had): not retried elsewhere.
    pub fn start_on(port: u16) -> RedisServer {
        let (child, dir) = RedisServer::spawn(port, None, &[]);
        let mut server = RedisServer {
            child,
            port,
            password: None,
            _dir: dir,
        };
        let url = server.url();
        wait_until(
            "redis-server",
            &mut server.child,
            Duration::from_secs(10),
            || answers_ping(&url),
        );
        server
    }

    /// A server that requires `password` (`--requirepass`).
    pub fn start_with_password(password: &str) -> RedisServer {
        RedisServer::start_with(Some(password), &[])
    }

    /// A server started with `extra` arguments too (e.g. `--rename-command`).
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_with(None, extra)
    }

    /// A server on a free port (another one if that port is taken before it binds it).
    fn start_with(password: Option<&str>, extra: &[&str]) -> RedisServer {
        let (child, (port, dir)) = start_retrying(
            "redis-server",
            Duration::from_secs(10),
            || {
                let port = free_port();
                let (child, dir) = RedisServer::spawn(port, password, extra);
                (child, vec![port], (port, dir))
            },
            |(port, _)| answers_ping(&server_url(*port, password)),
        );
        RedisServer {
            child,
            port,
            password: password.map(str::to_string),
            _dir: dir,
        }
    }

    /// redis-server on `port`, in a working directory of its own.
    fn spawn(port: u16, password: Option<&str>, extra: &[&str]) -> (Child, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("a directory for redis-server");
        (
            spawn_redis(&server_args(port, password, extra, dir.path())),
            dir,
        )
    }

    /// Kills the server (SIGKILL: nothing is flushed) and starts it again on its port, with
    /// its arguments and its directory: what it persisted there (`--appendonly yes`) it loads.
    pub fn restart(&mut self, extra: &[&str]) {
        self.stop();
        let args = server_args(self.port, self.password.as_deref(), extra, self._dir.path());
        self.child = spawn_redis(&args);
        let url = self.url();
        wait_until(
            "redis-server",
            &mut self.child,
            Duration::from_secs(10),
            || answers_ping(&url),
        );
    }

    /// The URL with the password, if the server has one.
    pub fn url(&self) -> String {
        server_url(self.port, self.password.as_deref())
    }

    /// The URL without any password.
    pub fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to the test redis-server")
    }

    /// The decision calls the server has run since its statistics were last reset: `FCALL`
    /// (functions, Redis 7) and `EVALSHA`/`EVAL` (scripts).
    pub fn decision_calls(&self) -> u64 {
        command_calls(&self.commandstats(), &["fcall", "evalsha", "eval"])
    }

    /// `INFO commandstats`: the calls of each command since the statistics were last reset.
    pub fn commandstats(&self) -> String {
        redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.connection())
            .expect("INFO commandstats")
    }

    /// The server's process id (to SIGSTOP/SIGCONT it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} redis-server");
    }

    /// Kills the server; `start_on(self.port)` brings one back.
    pub fn stop(&mut self) {
        reap(&mut self.child);
    }
}

/// The arguments of a test server on `port` working in `dir`.
fn server_args(port: u16, password: Option<&str>, extra: &[&str], dir: &Path) -> Vec<String> {
    let mut args = redis_args(port);
    if let Some(password) = password {
        args.extend(["--requirepass".to_string(), password.to_string()]);
    }
    args.extend(extra.iter().map(|arg| arg.to_string()));
    args.extend(["--dir".to_string(), dir.display().to_string()]);
    args
}

/// The URL of a test server on `port`, with its password if it has one.
fn server_url(port: u16, password: Option<&str>) -> String {
    match password {
        Some(password) => format!("redis://:{password}@127.0.0.1:{port}/0"),
        None => format!("redis://127.0.0.1:{port}/0"),
    }
}

/// The server at `url` answers `PING`.
fn answers_ping(url: &str) -> bool {
    redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
        .is_ok()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

/// The `demo-upstream` binary: 200 for everything, `/__stats` counts what it served.
pub struct Upstream {
    child: Child,
    pub addr: SocketAddr,
}

impl Upstream {
    pub fn start() -> Upstream {
        Upstream::start_on(LOOPBACK)
    }

    /// A demo upstream listening on `ip` (a namespace's host end: reachable from both sides).
    pub fn start_on(ip: IpAddr) -> Upstream {
        let (child, addr) = start_retrying(
            "demo-upstream",
            Duration::from_secs(10),
            || {
                let addr = SocketAddr::new(ip, free_port());
                let child = Command::new(env!("CARGO_BIN_EXE_demo-upstream"))
                    .arg(addr.to_string())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start demo-upstream");
                (child, vec![addr.port()], addr)
            },
            |addr| TcpStream::connect(addr).is_ok(),
        );
        Upstream { child, addr }
    }

    /// Requests served so far (other than `/__stats`).
    pub fn served(&self) -> u64 {
        let response = http_get(self.addr, "/__stats", None, &[]);
        response.body.trim().parse().expect("numeric /__stats")
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

/// A running `sluice` with its own config, pid file and upgrade socket in a temp dir.
pub struct Gateway {
    child: Child,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub config_path: PathBuf,
    config: GatewayConfig,
}

/// How to launch a gateway beyond its configuration.
#[derive(Debug, Default, Clone)]
pub struct Launch {
    pub env: Vec<(String, String)>,
    /// `RUST_LOG`; `warn` unless set.
    pub log_level: Option<&'static str>,
    /// Standard error to a file ([`Gateway::log`]) instead of the test's.
    pub capture_log: bool,
}

/// A sluice configuration file on free loopback ports, in its own temp dir.
pub struct GatewayConfig {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    upstream: SocketAddr,
    redis_url: String,
    grace_seconds: u64,
}

impl GatewayConfig {
    /// Writes the file: `body` holds the top-level keys after `server`/`listen`/`admin` (see
    /// [`config::Config`]), with `UPSTREAM` and `REDIS_URL` replaced. Graceful shutdown waits
    /// `grace_seconds` twice.
    pub fn write(
        body: &str,
        upstream: &Upstream,
        redis: Option<&RedisServer>,
        grace_seconds: u64,
    ) -> GatewayConfig {
        GatewayConfig::write_on(LOOPBACK, body, upstream, redis, grace_seconds)
    }

    /// As [`GatewayConfig::write`], with the proxy and admin listeners on `ip`.
    pub fn write_on(
        ip: IpAddr,
        body: &str,
        upstream: &Upstream,
        redis: Option<&RedisServer>,
        grace_seconds: u64,
    ) -> GatewayConfig {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sluice.yaml");
        let config = GatewayConfig {
            proxy: SocketAddr::new(ip, free_port()),
            admin: SocketAddr::new(ip, free_port()),
            upstream: upstream.addr,
            redis_url: redis.map(|r| r.url()).unwrap_or_default(),
            grace_seconds,
            dir,
            path,
        };
        config.rewrite(body);
        config
    }

    /// Every proxy listener address the file names (`listen:`), plain or TLS.
    pub fn listeners(&self) -> Vec<SocketAddr> {
        let text = std::fs::read_to_string(&self.path).expect("read the config");
        let yaml: serde_yaml::Value = serde_yaml::from_str(&text).expect("the config is YAML");
        yaml["listen"]
            .as_sequence()
            .map(|entries| {
                entries
                    .iter()
                    .filter_map(|entry| entry.as_str().or_else(|| entry["addr"].as_str()))
                    .filter_map(|addr| addr.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Writes `body` over the file, on the same ports. A `server:` section at the top of `body`
    /// joins the one the harness writes.
    pub fn rewrite(&self, body: &str) {
        let body = body
            .replace("UPSTREAM", &self.upstream.to_string())
            .replace("REDIS_URL", &self.redis_url);
        let (server, body) = match body.strip_prefix("server:\n") {
            Some(rest) => {
                let end = rest
                    .lines()
                    .take_while(|l| l.starts_with("  "))
                    .map(|l| l.len() + 1)
                    .sum::<usize>();
                (rest[..end].to_string(), rest[end..].to_string())
            }
            None => (String::new(), body),
        };
        // A body with its own `listen:` (naming `PROXY` among its listeners) replaces the
        // harness's single plain listener.
        let body = body.replace("PROXY", &self.proxy.to_string());
        let listen = if body.lines().any(|l| l.starts_with("listen:")) {
            String::new()
        } else {
            format!("listen: [{}]\n", self.proxy)
        };
        // A body's own `admin: { ... }` line joins the admin listener the harness writes.
        let admin_extra = body
            .lines()
            .find_map(|l| l.strip_prefix("admin: {")?.strip_suffix('}'))
            .map(|inner| format!(", {}", inner.trim()))
            .unwrap_or_default();
        let body: String = body
            .lines()
            .filter(|l| !l.starts_with("admin: {"))
            .map(|l| format!("{l}\n"))
            .collect();
        // The body's own grace settings replace the harness's.
        let grace: String = ["grace_period_seconds", "graceful_shutdown_timeout_seconds"]
            .iter()
            .filter(|key| !server.contains(&format!("{key}:")))
            .map(|key| format!("  {key}: {}\n", self.grace_seconds))
            .collect();
        let text = format!(
            "server:\n  threads: 2\n  pid_file: {pid}\n  upgrade_sock: {sock}\n{grace}{server}\
             {listen}admin: {{ listen: \"{admin}\"{admin_extra} }}\n{body}",
            pid = self.dir.path().join("sluice.pid").display(),
            sock = self.dir.path().join("upgrade.sock").display(),
            admin = self.admin,
        );
        std::fs::write(&self.path, text).expect("write config");
    }

    pub fn pid_file(&self) -> PathBuf {
        self.dir.path().join("sluice.pid")
    }
}

impl Gateway {
    /// Starts sluice (in the foreground, as a child) with a config written by [`GatewayConfig::write`].
    pub fn start(body: &str, upstream: &Upstream, redis: Option<&RedisServer>) -> Gateway {
        Gateway::launch(body, upstream, redis, &Launch::default())
    }

    /// Starts sluice as [`Gateway::start`] does, with extra environment and its standard error
    /// in a file (see [`Gateway::log`]) instead of the test's.
    pub fn launch(
        body: &str,
        upstream: &Upstream,
        redis: Option<&RedisServer>,
        launch: &Launch,
    ) -> Gateway {
        let (child, config) = start_retrying(
            "sluice",
            Duration::from_secs(20),
            || {
                let config = GatewayConfig::write(body, upstream, redis, 0);
                let child = Gateway::spawn(&config, launch);
                (
                    child,
                    vec![config.proxy.port(), config.admin.port()],
                    config,
                )
            },
            |config| {
                let mut listeners = config.listeners();
                if listeners.is_empty() {
                    listeners.push(config.proxy);
                }
                TcpStream::connect(config.admin).is_ok()
                    && listeners.iter().all(|l| TcpStream::connect(l).is_ok())
            },
        );
        Gateway {
            child,
            proxy: config.proxy,
            admin: config.admin,
            config_path: config.path.clone(),
            config,
        }
    }

    /// Starts sluice inside `namespace`, listening on its inside address: `body` names Redis
    /// and the upstream by addresses the namespace reaches (the host's end of its pair).
    pub fn launch_in(
        namespace: &netns::Namespace,
        body: &str,
        upstream: &Upstream,
        launch: &Launch,
    ) -> Gateway {
        let config =
            GatewayConfig::write_on(IpAddr::V4(namespace.inside_ip), body, upstream, None, 0);
        let mut command = namespace.command(env!("CARGO_BIN_EXE_sluice"));
        let mut child = Gateway::configure(&mut command, &config, launch)
            .spawn()
            .expect("start sluice in its namespace");
        let (admin, proxy) = (config.admin, config.proxy);
        wait_until("sluice", &mut child, Duration::from_secs(20), || {
            TcpStream::connect(admin).is_ok() && TcpStream::connect(proxy).is_ok()
        });
        Gateway {
            child,
            proxy,
            admin,
            config_path: config.path.clone(),
            config,
        }
    }

    /// sluice with `config`, in the foreground.
    fn spawn(config: &GatewayConfig, launch: &Launch) -> Child {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        Gateway::configure(&mut command, config, launch)
            .spawn()
            .expect("start sluice")
    }

    /// `command` (sluice, or a wrapper that execs it) told to run with `config`.
    fn configure<'a>(
        command: &'a mut Command,
        config: &GatewayConfig,
        launch: &Launch,
    ) -> &'a mut Command {
        command
            .arg("-c")
            .arg(&config.path)
            .env("RUST_LOG", launch.log_level.unwrap_or("warn"))
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null());
        if launch.capture_log {
            let log = std::fs::File::create(config.dir.path().join("stderr.log")).expect("log");
            command.stderr(log);
        } else {
            command.stderr(Stdio::inherit());
        }
        command
    }

    /// Waits (at most 30 s) until `/readyz` answers 200: the limiter's backend answers.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = http_get(self.admin, "/readyz", None, &[]);
            if ready.status == 200 && ready.body.starts_with("ready") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready within 30 s: {}",
                ready.body
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What sluice wrote to its standard error, when launched with `capture_log`.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.config.dir.path().join("stderr.log")).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Response {
        http_get(self.proxy, path, None, &[])
    }

    /// Rewrites the configuration with `body`, sends SIGHUP, and waits until the reload is
    /// done; returns whether it was accepted.
    pub fn reload(&self, body: &str) -> bool {
        let reloads = |result: &str| {
            metric(
                &self.metrics(),
                "sluice_config_reloads_total",
                &[("result", result)],
            )
        };
        let before = (reloads("success"), reloads("error"));
        self.config.rewrite(body);
        let status = Command::new("kill")
            .args(["-HUP", &self.pid().to_string()])
            .status()
            .expect("kill -HUP");
        assert!(status.success(), "SIGHUP sent");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match (reloads("success"), reloads("error")) {
                (success, _) if success > before.0 => return true,
                (_, error) if error > before.1 => return false,
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        panic!("the reload was not done within 10 s");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn get_from(&self, source: &str, path: &str) -> Response {
        http_get(
            self.proxy,
            path,
            Some(source.parse().expect("source IP")),
            &[],
        )
    }

    pub fn metrics(&self) -> String {
        http_get(self.admin, "/metrics", None, &[]).body
    }

    /// The process has not exited (no panic, no abort).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How the process ended, if it did within `within` (polled: a bound on a hung test, not a
    /// timing assertion).
    pub fn exit_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            // Closely: a test may time what a process did until it exited.
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Sends `signal` (`TERM`, `INT`, `HUP`...) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} sluice");
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        reap(&mut self.child);
    }
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `GET path` from `source` in a thread until it is not shed (`503`): a slow request
/// (`/slow/<ms>` at the demo upstream) then holds its place at the gateway. The thread ends
/// when the response does, or when the gateway goes away (no panic: its answer is not the point).
pub fn hold_a_place(
    addr: SocketAddr,
    path: &'static str,
    source: Option<IpAddr>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || loop {
        let mut stream = connect(addr, source);
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        if stream.write_all(request.as_bytes()).is_err() {
            return;
        }
        let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
        let mut head = [0u8; 12];
        match stream.read_exact(&mut head) {
            Ok(()) if head.ends_with(b"503") => continue,
            _ => return,
        }
    })
}

/// One HTTP/1.1 request on a fresh connection, optionally from a chosen loopback source address.
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    source: Option<IpAddr>,
    headers: &[(&str, &str)],
) -> Response {
    http_call(addr, "GET", path, source, headers)
}

/// One request without a body (`Content-Length: 0` for methods other than GET).
pub fn http_call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    source: Option<IpAddr>,
    headers: &[(&str, &str)],
) -> Response {
    let mut stream = connect(addr, source);
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if method != "GET" {
        request.push_str("Content-Length: 0\r\n");
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).expect("send request");
    read_response(&mut stream)
}

pub fn connect(addr: SocketAddr, source: Option<IpAddr>) -> TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    if let Some(ip) = source {
        socket
            .bind(&SocketAddr::new(ip, 0).into())
            .expect("bind source address");
    }
    socket
        .connect(&addr.into())
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
}

pub fn read_response(stream: &mut TcpStream) -> Response {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("complete response head");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// What a client that keeps its connection alive reads of one response: the status and the
/// head (lowercased, status line included), body after; `None` when the connection ended first.
pub fn read_one(stream: &mut TcpStream) -> Option<(u16, String)> {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => raw.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map_or(0, |value| value.trim().parse().unwrap_or(0));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    Some((status, head + &String::from_utf8_lossy(&body)))
}

/// The value of one sample in Prometheus text, by metric name and exact label set.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("metrics parse as Prometheus text");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Sends `total` requests from `clients` threads spread over `gateways`; returns the statuses.
pub fn hammer(gateways: &[SocketAddr], clients: usize, total: usize, path: &str) -> Vec<u16> {
    let gateways = std::sync::Arc::new(gateways.to_vec());
    let per_client = total / clients;
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let gateways = std::sync::Arc::clone(&gateways);
            let path = path.to_string();
            std::thread::spawn(move || {
                (0..per_client)
                    .map(|i| http_get(gateways[(c + i) % gateways.len()], &path, None, &[]).status)
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("client thread"))
        .collect()
}

/// One answered request of a timed load.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub status: u16,
    pub latency: Duration,
    /// Since the load started.
    pub at: Duration,
    pub client: usize,
}

/// `clients` threads send requests for `duration`, each as its own client (`X-Forwarded-For:
/// 198.51.100.x`, so a gateway trusting 127.0.0.1 keys them apart), round robin over `gateways`.
pub fn load_for(
    gateways: &[SocketAddr],
    clients: usize,
    duration: Duration,
    path: &str,
) -> Vec<Sample> {
    let gateways = std::sync::Arc::new(gateways.to_vec());
    let start = Instant::now();
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let gateways = std::sync::Arc::clone(&gateways);
            let path = path.to_string();
            std::thread::spawn(move || {
                let forwarded = format!("198.51.100.{}", client % 250 + 1);
                let mut samples = Vec::new();
                let mut i = 0;
                while start.elapsed() < duration {
                    let sent = Instant::now();
                    let status = http_get(
                        gateways[(client + i) % gateways.len()],
                        &path,
                        None,
                        &[("X-Forwarded-For", &forwarded)],
                    )
                    .status;
                    samples.push(Sample {
                        status,
                        latency: sent.elapsed(),
                        at: sent - start,
                        client,
                    });
                    i += 1;
                }
                samples
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("load thread"))
        .collect()
}

/// The JSON lines of the file at `path` (an access log), once at least `n` are there (10 s at
/// most: a bound on a hung test).
pub fn json_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n || Instant::now() > deadline {
            return text
                .lines()
                .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
                .collect();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `sluice -t` on `yaml`, written as `check.yaml` in `dir` (beside the files it names): success
/// and stderr.
pub fn check_config(dir: &Path, yaml: &str) -> (bool, String) {
    let path = dir.join("check.yaml");
    std::fs::write(&path, yaml).expect("write check.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["-t", "-c"])
        .arg(&path)
        .output()
        .expect("run sluice -t");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
