//! A TCP relay between one client (a gateway) and a server (Redis) that a fault test can slow
//! down: every byte is held for the relay's delay (plus up to its jitter) before it is passed
//! on, in both directions, with the order kept and no byte lost — what a congested or distant
//! link does. Blackholed, it passes nothing and connects nothing until healed, as a partition
//! does (these machines have no `tc netem`). Its listener binds port 0 (the test holds it);
//! its threads stop when it is dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A relay to one server.
pub struct Relay {
    pub addr: SocketAddr,
    link: Arc<Link>,
}

/// What the relay does to the bytes it passes, changed while it runs.
#[derive(Default)]
struct Link {
    delay_ms: AtomicU64,
    jitter_ms: AtomicU64,
    blackholed: AtomicBool,
    stop: AtomicBool,
}

impl Link {
    /// When a chunk read now is due, never before the one read before it (`last`).
    fn due(&self, last: &mut Instant, dice: &mut u64) -> Instant {
        *dice ^= *dice << 13;
        *dice ^= *dice >> 7;
        *dice ^= *dice << 17;
        let jitter = match self.jitter_ms.load(Ordering::Relaxed) {
            0 => 0,
            max => *dice % (max + 1),
        };
        let delay = self.delay_ms.load(Ordering::Relaxed) + jitter;
        let due = (Instant::now() + Duration::from_millis(delay)).max(*last);
        *last = due;
        due
    }

    fn blackholed(&self) -> bool {
        self.blackholed.load(Ordering::Relaxed)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Waits while blackholed; false once the relay stops.
    fn wait_healed(&self) -> bool {
        while self.blackholed() && !self.stopped() {
            std::thread::sleep(Duration::from_millis(5));
        }
        !self.stopped()
    }
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
        let link = Arc::new(Link::default());
        let accepting = Arc::clone(&link);
        std::thread::spawn(move || accept(listener, server, &accepting));
        Relay { addr, link }
    }

    /// Holds every byte for `delay` from now on (zero: passes them at once).
    pub fn delay(&self, delay: Duration) {
        self.link
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Holds each chunk up to `max` more, drawn per chunk, the order kept.
    pub fn jitter(&self, max: Duration) {
        self.link
            .jitter_ms
            .store(max.as_millis() as u64, Ordering::Relaxed);
    }

    /// Passes nothing and connects nothing while `on`: bytes wait, as over a cut link whose
    /// TCP retransmits once it heals.
    pub fn blackhole(&self, on: bool) {
        self.link.blackholed.store(on, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.link.stop.store(true, Ordering::Relaxed);
    }
}

fn accept(listener: TcpListener, server: SocketAddr, link: &Arc<Link>) {
    while !link.stopped() {
        match listener.accept() {
            Ok((client, _)) => {
                let link = Arc::clone(link);
                std::thread::spawn(move || connect(client, server, link));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Connects `client` to `server` once the link is not blackholed, and relays both ways.
fn connect(client: TcpStream, server: SocketAddr, link: Arc<Link>) {
    if !link.wait_healed() {
        return;
    }
    let Ok(upstream) = TcpStream::connect(server) else {
        return; // the client sees its connection closed, as with a dead server
    };
    for (from, to) in [
        (client.try_clone(), upstream.try_clone()),
        (upstream.try_clone(), client.try_clone()),
    ] {
        if let (Ok(from), Ok(to)) = (from, to) {
            pipe(from, to, Arc::clone(&link));
        }
    }
}

/// Copies `from` into `to`, each chunk written when due (its delay and jitter), none while
/// the link is blackholed.
fn pipe(mut from: TcpStream, mut to: TcpStream, link: Arc<Link>) {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writing = Arc::clone(&link);
    std::thread::spawn(move || {
        for (at, chunk) in due {
            let wait = at.saturating_duration_since(Instant::now());
            std::thread::sleep(wait);
            if !writing.wait_healed() || to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    std::thread::spawn(move || {
        let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
        let mut buffer = [0u8; 16 * 1024];
        let mut last = Instant::now();
        let mut dice =
            0x9e37_79b9_7f4a_7c15u64 ^ u64::from(from.local_addr().map_or(1, |a| a.port()));
        while !link.stopped() {
            match from.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => {
                    let at = link.due(&mut last, &mut dice);
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
