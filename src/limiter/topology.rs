//! Where Redis is: one server, a Cluster, or the master that Sentinels name.

/// How sluice reaches Redis (`redis.mode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (or a proxy in front of many): `redis.url`.
    Standalone { url: String },
    /// A Redis Cluster, discovered from any of its `nodes`; calls go to the slot's master.
    Cluster { nodes: Vec<String> },
    /// The master that the `sentinels` name `master_name`, found again after a failover.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
        master_username: Option<String>,
        master_password: Option<String>,
    },
}

impl Topology {
    pub fn mode(&self) -> &'static str {
        match self {
            Topology::Standalone { .. } => "standalone",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel { .. } => "sentinel",
        }
    }

    /// Where Redis is, for logs (no passwords).
    pub fn describe(&self) -> String {
        let list = |urls: &[String]| {
            urls.iter()
                .map(|u| redacted_url(u))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Topology::Standalone { url } => format!("redis at {}", redacted_url(url)),
            Topology::Cluster { nodes } => format!("redis cluster seeded by {}", list(nodes)),
            Topology::Sentinel {
                sentinels,
                master_name,
                ..
            } => format!(
                "redis master {master_name:?} from sentinels {}",
                list(sentinels)
            ),
        }
    }
}

/// The URL without its password, for logs.
pub fn redacted_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_string(),
    }
}
