//! Redis topologies for scale-out tests: a real local Redis Cluster (3 masters, 3 replicas) and a
//! real Sentinel setup (master, replica, 3 sentinels), all on free loopback ports, in a temp dir,
//! each process reaped by PID on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, redis_args, spawn_redis, start_retrying};

/// Node timeout of the cluster and down-after of the sentinels: a failover takes a few seconds.
pub const FAILURE_DETECTION_MS: u64 = 1000;

fn base_args(port: u16, dir: &Path) -> Vec<String> {
    let mut args = redis_args(port);
    args.extend(
        [
            // Replicas sync at once (the default waits 5 s for more replicas to share the transfer).
            "--repl-diskless-sync-delay",
            "0",
            "--dir",
            &dir.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    args
}

fn connection(port: u16) -> Option<redis::Connection> {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .ok()?
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()
}

/// The server at `port` answers `PING`.
fn answers(port: u16) -> bool {
    query::<String>(port, &mut redis::cmd("PING")).is_some()
}

/// Runs `command` on the server at `port`; `None` when it cannot be reached or fails.
pub fn query<T: redis::FromRedisValue>(port: u16, command: &mut redis::Cmd) -> Option<T> {
    let mut connection = connection(port)?;
    command.query(&mut connection).ok()
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} within {timeout:?}");
}

/// One redis-server process of a topology.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
}

impl Node {
    /// A redis-server with the arguments `args` gives for a port, on a free port (another one
    /// if that port is taken before it binds it), once it answers `PING`.
    pub fn start(args: impl Fn(u16) -> Vec<String>) -> Node {
        let (child, port) = start_retrying(
            "redis-server",
            Duration::from_secs(10),
            || {
                let port = free_port();
                (spawn_redis(&args(port)), vec![port], port)
            },
            |port| answers(*port),
        );
        Node {
            port,
            child: Some(child),
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id (to pause it: SIGSTOP, SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of 3 masters, each with one replica.
pub struct RedisCluster {
    pub nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let nodes: Vec<Node> = (0..6)
            .map(|_| {
                let (child, port) = start_retrying(
                    "cluster node",
                    Duration::from_secs(10),
                    || {
                        let (port, bus) = (free_port(), free_port());
                        // The bus port is chosen too: port + 10000 may not exist or be free.
                        let mut args = base_args(port, dir.path());
                        args.extend(
                            [
                                "--cluster-enabled",
                                "yes",
                                "--cluster-port",
                                &bus.to_string(),
                                "--cluster-config-file",
                                &format!("nodes-{port}.conf"),
                                "--cluster-node-timeout",
                                &FAILURE_DETECTION_MS.to_string(),
                            ]
                            .iter()
                            .map(|s| s.to_string()),
                        );
                        (spawn_redis(&args), vec![port, bus], port)
                    },
                    |port| answers(*port),
                );
                Node {
                    port,
                    child: Some(child),
                }
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()
            .expect("run redis-cli --cluster create (redis-tools)");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes, _dir: dir };
        wait_for(
            "cluster state ok on every node, 3 masters, every replica in sync",
            Duration::from_secs(30),
            || cluster.is_ok() && cluster.masters().len() == 3 && cluster.replicas_in_sync() == 3,
        );
        cluster
    }

    /// Seed URLs for `redis.nodes`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect()
    }

    /// Every running node reports `cluster_state:ok`.
    pub fn is_ok(&self) -> bool {
        self.nodes.iter().filter(|n| n.is_running()).all(|n| {
            query::<String>(n.port, redis::cmd("CLUSTER").arg("INFO"))
                .is_some_and(|info| info.contains("cluster_state:ok"))
        })
    }

    /// Replicas whose link to their master is up (a replica that never synced cannot take over).
    pub fn replicas_in_sync(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .filter(|n| {
                query::<String>(n.port, redis::cmd("INFO").arg("replication")).is_some_and(|info| {
                    info.contains("role:slave") && info.contains("master_link_status:up")
                })
            })
            .count()
    }

    /// Ports of the running nodes that are masters now.
    pub fn masters(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.is_running())
            .filter(|n| {
                query::<redis::Value>(n.port, &mut redis::cmd("ROLE")).is_some_and(|role| {
                    matches!(role, redis::Value::Array(ref items)
                        if matches!(items.first(), Some(redis::Value::BulkString(b)) if b == b"master"))
                })
            })
            .map(|n| n.port)
            .collect()
    }

    /// The master serving the slot of `key` now.
    pub fn master_of(&self, key: &str) -> Option<u16> {
        let masters = self.masters();
        let slot: u16 = query(
            *masters.first()?,
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )?;
        masters.into_iter().find(|&port| owns_slot(port, slot))
    }

    /// Keys held by each master.
    pub fn keys_per_master(&self) -> Vec<(u16, u64)> {
        self.masters()
            .into_iter()
            .map(|port| (port, query(port, &mut redis::cmd("DBSIZE")).unwrap_or(0)))
            .collect()
    }

    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.kill();
        }
    }

    pub fn flush(&self) {
        for port in self.masters() {
            let _: Option<()> = query(port, &mut redis::cmd("FLUSHALL"));
        }
    }
}

fn owns_slot(port: u16, slot: u16) -> bool {
    // CLUSTER NODES line of "myself": its slot ranges follow the 8th field.
    let Some(nodes) = query::<String>(port, redis::cmd("CLUSTER").arg("NODES")) else {
        return false;
    };
    nodes
        .lines()
        .filter(|line| line.contains("myself"))
        .flat_map(|line| line.split_whitespace().skip(8).collect::<Vec<_>>())
        .any(|range| {
            let (start, end) = range.split_once('-').unwrap_or((range, range));
            match (start.parse::<u16>(), end.parse::<u16>()) {
                (Ok(start), Ok(end)) => (start..=end).contains(&slot),
                _ => false,
            }
        })
}

/// The master name the sentinels monitor.
pub const MASTER_NAME: &str = "sluice-master";

/// A master, one replica and three sentinels (quorum 2).
pub struct RedisSentinels {
    pub master: Node,
    pub replica: Node,
    pub sentinels: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl RedisSentinels {
    pub fn start() -> RedisSentinels {
        let dir = tempfile::tempdir().expect("temp dir");
        let master = Node::start(|port| base_args(port, dir.path()));
        let master_port = master.port;
        let replica = Node::start(|port| {
            let mut args = base_args(port, dir.path());
            args.extend([
                "--replicaof".to_string(),
                "127.0.0.1".to_string(),
                master_port.to_string(),
            ]);
            args
        });
        let replica_port = replica.port;
        wait_for("the replica is in sync", Duration::from_secs(15), || {
            query::<String>(replica_port, redis::cmd("INFO").arg("replication"))
                .is_some_and(|info| info.contains("master_link_status:up"))
        });
        let sentinels: Vec<Node> = (0..3)
            .map(|i| {
                Node::start(|port| {
                    let config = dir.path().join(format!("sentinel-{i}.conf"));
                    std::fs::write(
                        &config,
                        format!(
                            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                             sentinel down-after-milliseconds {MASTER_NAME} {FAILURE_DETECTION_MS}\n\
                             sentinel failover-timeout {MASTER_NAME} 3000\n\
                             sentinel parallel-syncs {MASTER_NAME} 1\n",
                            dir = dir.path().display()
                        ),
                    )
                    .expect("write sentinel config");
                    vec![config.display().to_string(), "--sentinel".to_string()]
                })
            })
            .collect();
        // A failover needs a majority of sentinels that know each other and the replica.
        for sentinel in &sentinels {
            wait_for(
                "each sentinel knows the replica and the other two sentinels",
                Duration::from_secs(30),
                || {
                    let count = |what: &str| {
                        query::<Vec<redis::Value>>(
                            sentinel.port,
                            redis::cmd("SENTINEL").arg(what).arg(MASTER_NAME),
                        )
                        .map_or(0, |v| v.len())
                    };
                    count("replicas") == 1 && count("sentinels") == 2
                },
            );
        }
        RedisSentinels {
            master,
            replica,
            sentinels,
            _dir: dir,
        }
    }

    /// URLs for `redis.sentinels`.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect()
    }

    /// The master's port as the sentinels see it now.
    pub fn current_master(&self) -> Option<u16> {
        let running = self.sentinels.iter().find(|s| s.is_running())?;
        let address: Vec<String> = query(
            running.port,
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(MASTER_NAME),
        )?;
        address.get(1)?.parse().ok()
    }
}
