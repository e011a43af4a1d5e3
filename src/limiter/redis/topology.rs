//! Where Redis is — one server, a Cluster, or the master that Sentinels name — and who sluice is
//! to it. URLs are shown only redacted: no password, whatever form the URL takes.

use std::fmt;

use crate::limiter::secret::Secret;

/// How sluice reaches Redis (`redis.mode`).
#[derive(Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (or a proxy in front of many): `redis.url`.
    Standalone { url: String },
    /// A Redis Cluster, discovered from any of its `nodes`; calls go to the slot's master.
    Cluster { nodes: Vec<String> },
    /// The master that the `sentinels` name `master_name`, found again after a failover.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
}

/// Who sluice is to the servers that hold the limits (the server, the cluster's nodes, the
/// sentinels' master), beyond what their URLs say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisAuth {
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// For `rediss://` URLs: the CA to trust instead of the system's, a client certificate.
    pub tls: Option<RedisTls>,
}

/// TLS material for `rediss://` connections, read at load (PEM).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    pub ca: Option<Vec<u8>>,
    /// A client certificate chain and its key.
    pub client: Option<(Vec<u8>, Secret)>,
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
            } => format!(
                "redis master {master_name:?} from sentinels {}",
                list(sentinels)
            ),
        }
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Query parameters that carry a password in redis-rs URLs (`redis+unix:///s?pass=...`).
const PASSWORD_PARAMETERS: [&str; 2] = ["pass", "password"];

/// The URL without its password, for logs and messages: the user information before the last
/// `@` of the authority (`redis://user:pw@host`) and any `pass=` query value become `***`.
pub fn redacted_url(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = match (head.find("://"), head.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &head[..scheme_end], &head[at..])
        }
        _ => head.to_string(),
    };
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _))
                    if PASSWORD_PARAMETERS.contains(&key.to_ascii_lowercase().as_str()) =>
                {
                    format!("{key}=***")
                }
                _ => pair.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_url_form_loses_its_password() {
        for (url, shown) in [
            (
                "redis://:pw@127.0.0.1:6379/0",
                "redis://***@127.0.0.1:6379/0",
            ),
            ("redis://user:pw@host/0", "redis://***@host/0"),
            ("rediss://user:p@w/x@host:6380", "rediss://***@host:6380"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=pw",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "unix:///run/redis.sock?user=u&PASS=pw",
                "unix:///run/redis.sock?user=u&PASS=***",
            ),
            ("redis://host:6379", "redis://host:6379"),
        ] {
            assert_eq!(redacted_url(url), shown);
        }
        let sentinel = Topology::Sentinel {
            sentinels: vec!["redis://:pw@s1:26379".into()],
            master_name: "m".into(),
        };
        assert!(!format!("{sentinel:?}").contains("pw"));
    }
}
