//! A TCP relay between one client (a gateway) and a server (Redis) that a fault test can slow
//! down: every byte is held for the relay's delay before it is passed on, in both directions,
//! with the order kept and no byte lost — what a congested or distant link does. Its listener
//! binds port 0 (the test holds it); its threads stop when it is dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A relay to one server.
pub struct Relay {
    pub addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Relays every connection made to it to `server`, at once until [`Relay::delay`] says
    /// otherwise.
    pub fn to(server: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the relay's address");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (delay, stopping) = (Arc::clone(&delay_ms), Arc::clone(&stop));
        std::thread::spawn(move || accept(listener, server, &delay, &stopping));
        Relay {
            addr,
            delay_ms,
            stop,
        }
    }

    /// Holds every byte for `delay` from now on (zero: passes them at once).
    pub fn delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn accept(
    listener: TcpListener,
    server: SocketAddr,
    delay: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((client, _)) => {
                let Ok(upstream) = TcpStream::connect(server) else {
                    continue; // the client sees its connection closed, as with a dead server
                };
                for (from, to) in [
                    (client.try_clone(), upstream.try_clone()),
                    (upstream.try_clone(), client.try_clone()),
                ] {
                    if let (Ok(from), Ok(to)) = (from, to) {
                        pipe(from, to, Arc::clone(delay), Arc::clone(stop));
                    }
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Copies `from` into `to`, each chunk written `delay` after it was read.
fn pipe(mut from: TcpStream, mut to: TcpStream, delay: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        for (at, chunk) in due {
            let wait = at.saturating_duration_since(Instant::now());
            std::thread::sleep(wait);
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
        let mut buffer = [0u8; 16 * 1024];
        while !stop.load(Ordering::Relaxed) {
            match from.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    let at = Instant::now() + Duration::from_millis(delay.load(Ordering::Relaxed));
                    if chunks.send((at, buffer[..n].to_vec())).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    });
}
