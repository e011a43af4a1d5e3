//! `sluice -d`: start in the background, and return only once serving — or exit non-zero with
//! the reason.
//!
//! The command the operator runs (the *launcher*) listens on a Unix socket in a private
//! directory and starts sluice again as a child, naming the socket in `SLUICE_READY_SOCKET`. The
//! child connects to it before Pingora daemonizes, so the daemon inherits the connection, and
//! reports on it: `READY` once its listeners are bound and its configuration is live, or
//! `ERROR <reason>` when it cannot start. The launcher exits 0 on `READY`; otherwise non-zero,
//! with the reason, when the daemon reports an error, when the child exits with an error (it has
//! printed why), when the daemon goes away without a word (its end of the socket closes), or
//! when nothing is ready within [`LAUNCH_TIMEOUT`].

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Names the launcher's socket in the environment of the process it starts.
const READY_SOCKET: &str = "SLUICE_READY_SOCKET";
/// How long the launcher waits for the daemon to serve.
pub const LAUNCH_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);

/// This process was started by a launcher and reports to it.
pub fn launched() -> bool {
    std::env::var_os(READY_SOCKET).is_some()
}

/// Starts this command again as a daemon and waits until it serves; the exit code says how
/// it went.
pub fn launch() -> ExitCode {
    match Launch::new().and_then(|launch| launch.wait()) {
        Ok(code) => code,
        Err(reason) => {
            eprintln!("sluice: {reason}");
            ExitCode::from(1)
        }
    }
}

struct Launch {
    directory: PathBuf,
    listener: UnixListener,
    child: std::process::Child,
}

impl Drop for Launch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

impl Launch {
    fn new() -> Result<Launch, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let directory =
            std::env::temp_dir().join(format!("sluice-launch-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&directory)
            .and_then(|()| {
                std::fs::set_permissions(&directory, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| format!("cannot create {}: {e}", directory.display()))?;
        let socket = directory.join("ready.sock");
        let listener = UnixListener::bind(&socket)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
        let executable =
            std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        let child = Command::new(executable)
            .args(std::env::args_os().skip(1))
            .env(READY_SOCKET, &socket)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the daemon: {e}"))?;
        Ok(Launch {
            directory,
            listener,
            child,
        })
    }

    fn wait(mut self) -> Result<ExitCode, String> {
        let deadline = Instant::now() + LAUNCH_TIMEOUT;
        let mut report: Option<BufReader<UnixStream>> = None;
        let mut child_done = false;
        loop {
            if report.is_none() {
                report = self.accept_report()?;
            }
            if let Some(reader) = &mut report {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) => return Err(self.silent_exit()),
                    Ok(_) if line.trim_end() == "READY" => return Ok(ExitCode::SUCCESS),
                    Ok(_) => {
                        let reason = line.trim_end();
                        let reason = reason.strip_prefix("ERROR ").unwrap_or(reason);
                        until_gone(reader);
                        return Err(reason.to_string());
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(e) => return Err(format!("reading the daemon's report: {e}")),
                }
            } else {
                std::thread::sleep(POLL);
            }
            if !child_done {
                match self.child.try_wait() {
                    // It said why on its standard error.
                    Ok(Some(status)) if !status.success() => {
                        return Ok(ExitCode::from(
                            status.code().unwrap_or(1).clamp(1, 255) as u8
                        ))
                    }
                    Ok(Some(_)) => child_done = true,
                    Ok(None) => {}
                    Err(e) => return Err(format!("waiting for the daemon: {e}")),
                }
            }
            if child_done && report.is_none() {
                return Err(self.silent_exit());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not serving within {} s; see the error log",
                    LAUNCH_TIMEOUT.as_secs()
                ));
            }
        }
    }

    /// The daemon's report connection, once it has connected.
    fn accept_report(&self) -> Result<Option<BufReader<UnixStream>>, String> {
        match self.listener.accept() {
            Ok((stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .and_then(|()| stream.set_read_timeout(Some(POLL)))
                    .map_err(|e| format!("the daemon's report socket: {e}"))?;
                Ok(Some(BufReader::new(stream)))
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(format!("the daemon's report socket: {e}")),
        }
    }

    fn silent_exit(&mut self) -> String {
        "the daemon exited before serving; see the error log (server.error_log, or standard error)"
            .to_string()
    }
}

/// Waits (5 s at most) until the daemon that reported an error is gone (its end of `reader`
/// closes), so whatever it held (a port, the pid file) is free when the operator reads why.
fn until_gone(reader: &mut BufReader<UnixStream>) {
    let gone_by = Instant::now() + Duration::from_secs(5);
    let mut rest = String::new();
    while Instant::now() < gone_by {
        match reader.read_line(&mut rest) {
            Ok(0) => break,
            Ok(_) => rest.clear(),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
}

/// The daemon's end of the report socket, until it has reported.
fn channel() -> &'static Mutex<Option<UnixStream>> {
    static CHANNEL: OnceLock<Mutex<Option<UnixStream>>> = OnceLock::new();
    CHANNEL.get_or_init(|| Mutex::new(None))
}

static READY: AtomicBool = AtomicBool::new(false);

/// In a process a launcher started: connects to its socket (before daemonizing, so the daemon
/// inherits the connection), and makes a panic before `READY` a reported, fatal error.
pub fn connect_to_launcher() {
    let Some(path) = std::env::var_os(READY_SOCKET) else {
        return;
    };
    match UnixStream::connect(&path) {
        Ok(stream) => {
            *channel().lock().unwrap_or_else(|p| p.into_inner()) = Some(stream);
        }
        Err(e) => eprintln!("sluice: cannot report to the launcher: {e}"),
    }
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        if !READY.load(Ordering::Acquire) {
            let _ = send(&format!("ERROR {info}"));
            std::process::exit(1);
        }
    }));
}

/// Tells the launcher `line`; `false` when there is none to tell (or it is gone).
fn send(line: &str) -> bool {
    let mut channel = channel().lock().unwrap_or_else(|p| p.into_inner());
    match channel.as_mut() {
        Some(stream) => writeln!(stream, "{}", line.replace('\n', " ")).is_ok(),
        None => false,
    }
}

/// Serving: tells the launcher, which exits 0.
pub fn report_ready() {
    READY.store(true, Ordering::Release);
    let _ = send("READY");
    channel().lock().unwrap_or_else(|p| p.into_inner()).take();
}

/// Cannot start: tells the launcher, which prints `reason` (so it is said once), or prints it
/// when there is no launcher; exits 1.
pub fn fatal(reason: &str) -> ! {
    if !send(&format!("ERROR {reason}")) {
        eprintln!("sluice: {reason}");
    }
    std::process::exit(1)
}
