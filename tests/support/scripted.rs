//! An upstream that answers as a test scripts it: a status (and headers) after a delay, or a
//! connection closed without an answer; on keep-alive connections, one thread per connection,
//! reading each request's body by its `Content-Length`. It records every request it received
//! (method and path), as it arrives: how a test counts what reached the upstream, retries
//! included. Its threads end with the test process.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the upstream does with one request.
#[derive(Debug, Clone, Copy)]
pub enum Reply {
    /// Waits this long, then answers this status with these header lines (each ending `\r\n`)
    /// and an empty body.
    After(Duration, u16, &'static str),
    /// Closes the connection without an answer (a reset, to the gateway).
    Close,
    /// Answers `200` with `Content-Length: 1000`, sends 10 bytes of it, then closes: a response
    /// cut off midway.
    CutOff,
}

impl Reply {
    /// At once, this status, no other header.
    pub const fn status(status: u16) -> Reply {
        Reply::After(Duration::ZERO, status, "")
    }
}

/// A request as the upstream received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
}

type Script = dyn Fn(usize, &Seen) -> Reply + Send + Sync;

/// The scripted upstream: its address, and what it has received.
pub struct Scripted {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Scripted {
    /// Answers the `n`th request it receives (from 0, across connections), `seen`, with
    /// `script(n, seen)`.
    pub fn start(script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a scripted upstream");
        let addr = listener.local_addr().expect("its address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let recorded = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, script) = (Arc::clone(&recorded), Arc::clone(&script));
                std::thread::spawn(move || serve(stream, &seen, &*script));
            }
        });
        Scripted { addr, seen }
    }

    /// Every request received so far, in order of arrival.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("the record").clone()
    }

    /// How many requests it has received.
    pub fn count(&self) -> usize {
        self.seen.lock().expect("the record").len()
    }
}

/// Serves the requests of one connection until the peer closes it or the script closes it.
fn serve(stream: TcpStream, seen: &Mutex<Vec<Seen>>, script: &Script) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let n = {
            let mut seen = seen.lock().expect("the record");
            seen.push(request.clone());
            seen.len() - 1
        };
        match script(n, &request) {
            Reply::Close => {
                let _ = writer.shutdown(std::net::Shutdown::Both);
                return;
            }
            Reply::CutOff => {
                let head = "HTTP/1.1 200 Scripted\r\ncontent-length: 1000\r\n\r\n0123456789";
                let _ = writer.write_all(head.as_bytes());
                let _ = writer.shutdown(std::net::Shutdown::Both);
                return;
            }
            Reply::After(delay, status, headers) => {
                std::thread::sleep(delay);
                let answer =
                    format!("HTTP/1.1 {status} Scripted\r\ncontent-length: 0\r\n{headers}\r\n");
                if writer.write_all(answer.as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

/// The next request on the connection, its body read and dropped; `None` once it closes.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Seen> {
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).ok().filter(|n| *n > 0)?;
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Seen { method, path })
}
