//! A network namespace the test makes and removes: joined to this host by a veth pair, so a
//! process started inside it ([`Namespace::command`]) reaches servers that listen on the host's
//! end of the pair, and the test reaches it on the inside end. [`Namespace::cut`] drops every
//! packet the namespace sends to one host port (iptables in the namespace, never the host's):
//! a real partition of one process — its connects hang, its writes are never acknowledged —
//! while every other process still reaches the same server. Removed (namespace, pair, rules) when
//! dropped. Needs root, `ip` (iproute2) and `iptables`, which `scripts/test.sh` installs; without
//! them the test fails and says so.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// One namespace with a veth pair to the host.
pub struct Namespace {
    pub name: String,
    host_link: String,
    /// The host's end of the pair: servers the namespace must reach listen here too.
    pub host_ip: Ipv4Addr,
    /// The namespace's end: what the test connects to.
    pub inside_ip: Ipv4Addr,
}

fn run(what: &str, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{what}: cannot run {program} ({e}): network fault tests need root, iproute2 and \
                 iptables (scripts/test.sh installs them)"
            )
        });
    assert!(
        out.status.success(),
        "{what}: {program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

impl Namespace {
    /// A new namespace with a /30 of its own on the pair (10.201.0.0/16, drawn per process and
    /// per namespace so parallel tests never share one).
    pub fn new() -> Namespace {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let serial = NEXT.fetch_add(1, Ordering::Relaxed);
        let index = (std::process::id().wrapping_mul(7).wrapping_add(serial)) % 16_384;
        let base = u32::from(Ipv4Addr::new(10, 201, 0, 0)) + index * 4;
        let tag = format!("{}x{serial}", std::process::id() % 100_000);
        let namespace = Namespace {
            name: format!("sluice-{tag}"),
            host_link: format!("slh{tag}"),
            host_ip: Ipv4Addr::from(base + 1),
            inside_ip: Ipv4Addr::from(base + 2),
        };
        namespace.make(&format!("sli{tag}"));
        namespace
    }

    fn make(&self, inside_link: &str) {
        let ns = self.name.as_str();
        let (host, inside) = (
            format!("{}/30", self.host_ip),
            format!("{}/30", self.inside_ip),
        );
        run("make the namespace", "ip", &["netns", "add", ns]);
        run(
            "make the veth pair",
            "ip",
            &[
                "link",
                "add",
                &self.host_link,
                "type",
                "veth",
                "peer",
                "name",
                inside_link,
                "netns",
                ns,
            ],
        );
        run(
            "address the host end",
            "ip",
            &["addr", "add", &host, "dev", &self.host_link],
        );
        run(
            "raise the host end",
            "ip",
            &["link", "set", &self.host_link, "up"],
        );
        for args in [
            vec!["addr", "add", &inside, "dev", inside_link],
            vec!["link", "set", inside_link, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut full = vec!["-n", ns];
            full.extend(args);
            run("set the namespace's links up", "ip", &full);
        }
    }

    /// `program` to be run inside the namespace (its pid is the program's: `ip netns exec`
    /// execs it).
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    fn iptables(&self, action: &str, port: u16) {
        let port = port.to_string();
        let host = self.host_ip.to_string();
        run(
            "iptables in the namespace",
            "ip",
            &[
                "netns", "exec", &self.name, "iptables", action, "OUTPUT", "-p", "tcp", "-d",
                &host, "--dport", &port, "-j", "DROP",
            ],
        );
    }

    /// Drops every packet from the namespace to the host's `port`.
    pub fn cut(&self, port: u16) {
        self.iptables("-A", port);
    }

    /// Lets them through again (connections in flight resume: TCP retransmits).
    pub fn heal(&self, port: u16) {
        self.iptables("-D", port);
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it the host's end.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .stderr(std::process::Stdio::null())
            .status();
    }
}
