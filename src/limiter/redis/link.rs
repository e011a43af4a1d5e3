//! How the Redis backend reaches Redis: one server, a Cluster, or the master named by Sentinels.
//!
//! Every link connects lazily, inside the runtime that serves requests, and hands out a cheap
//! clone of a multiplexed connection per call. The caller bounds every call with its deadline;
//! a link only decides where a call goes:
//! * standalone: redis-rs's `ConnectionManager` (reconnects in the background);
//! * cluster: redis-rs's async `ClusterConnection`, which routes EVALSHA by the slot of its first
//!   key (all keys of one call share a hash tag) and follows MOVED/ASK after a failover;
//! * sentinel: a multiplexed connection to the master the Sentinels name. A connection error,
//!   `READONLY` (the master was demoted) or a missed deadline drops it, and the next call asks the
//!   Sentinels again: a failover is followed without a restart. The link is fenced against a
//!   stale primary (one paused through its own failover and resumed answers `ROLE` as a master
//!   until the Sentinels reconfigure it): a connection is kept only if the Sentinels still name
//!   its server once it is made, and [`Link::verify`] asks them again every second.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline,
    RedisConnectionInfo, RedisFuture, TlsCertificates, TlsMode, Value,
};

use super::topology::{RedisAuth, Topology};
use crate::limiter::error::{ErrorKind, LimiterError};

/// How long a (re)connect attempt may take in the background; requests never wait for it
/// beyond their own deadline.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Cluster redirections (MOVED, ASK, TRYAGAIN) a call may follow; the deadline bounds them too.
const CLUSTER_RETRIES: u32 = 2;

/// A connection to use for one call.
#[derive(Clone)]
pub enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(MultiplexedConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
            Connection::Sentinel(c) => c.get_db(),
        }
    }
}

/// One master's reply to a command sent to every master: its address (a Cluster's masters),
/// and the reply, or the error it answered in words.
pub type Answered = (Option<String>, Result<Value, String>);

/// The way to Redis for one topology.
pub enum Link {
    Standalone {
        /// Boxed: with its TLS settings the client is ten times the other variants.
        client: Box<redis::Client>,
        manager: OnceLock<ConnectionManager>,
        response_timeout: Duration,
    },
    Cluster(Arc<ClusterLink>),
    Sentinel(Arc<SentinelLink>),
}

impl Link {
    /// Validates addresses; connects nothing yet. `deadline` bounds each call's response.
    pub fn new(
        topology: &Topology,
        auth: &RedisAuth,
        deadline: Duration,
    ) -> Result<Link, redis::RedisError> {
        let response_timeout = CONNECT_TIMEOUT.max(deadline);
        match topology {
            Topology::Standalone { url } => Link::standalone(url, auth, response_timeout),
            Topology::Cluster { nodes } => Link::cluster(nodes, auth, response_timeout),
            Topology::Sentinel {
                sentinels,
                master_name,
            } => Link::sentinel(sentinels, master_name, auth, response_timeout),
        }
    }

    fn standalone(
        url: &str,
        auth: &RedisAuth,
        response_timeout: Duration,
    ) -> Result<Link, redis::RedisError> {
        let client = match tls_certificates(auth) {
            Some(certificates) => {
                redis::Client::build_with_tls(authenticated(url, auth)?, certificates)?
            }
            None => redis::Client::open(authenticated(url, auth)?)?,
        };
        Ok(Link::Standalone {
            client: Box::new(client),
            manager: OnceLock::new(),
            response_timeout,
        })
    }

    fn cluster(
        nodes: &[String],
        auth: &RedisAuth,
        response_timeout: Duration,
    ) -> Result<Link, redis::RedisError> {
        let mut builder = ClusterClient::builder(
            nodes
                .iter()
                .map(|node| authenticated(node, auth))
                .collect::<Result<Vec<_>, _>>()?,
        )
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(response_timeout)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(5)
        .max_retry_wait(50);
        if let Some(certificates) = tls_certificates(auth) {
            builder = builder.certs(certificates);
        }
        Ok(Link::Cluster(Arc::new(ClusterLink {
            client: builder.build()?,
            current: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
        })))
    }

    fn sentinel(
        sentinels: &[String],
        master_name: &str,
        auth: &RedisAuth,
        response_timeout: Duration,
    ) -> Result<Link, redis::RedisError> {
        let master = with_auth(RedisConnectionInfo::default(), auth);
        let mut node = SentinelNodeConnectionInfo::default().set_redis_connection_info(master);
        if auth.tls.is_some() {
            // The master over TLS, checked against the system's roots.
            node = node.set_tls_mode(TlsMode::Secure);
        }
        let client = SentinelClient::build(
            sentinels.iter().map(String::as_str).collect(),
            master_name,
            Some(node),
            SentinelServerType::Master,
        )?;
        Ok(Link::Sentinel(Arc::new(SentinelLink {
            sentinel: tokio::sync::Mutex::new(client),
            master_name: master_name.to_string(),
            current: ArcSwapOption::empty(),
            response_timeout,
        })))
    }

    /// A connection for one call, connecting first if needed.
    pub async fn connection(&self) -> Result<Connection, LimiterError> {
        match self {
            Link::Standalone {
                client,
                manager,
                response_timeout,
            } => {
                if let Some(manager) = manager.get() {
                    return Ok(Connection::Standalone(manager.clone()));
                }
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(*response_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(500));
                let created = ConnectionManager::new_lazy_with_config((**client).clone(), config)
                    .map_err(|e| LimiterError::Connection(e.to_string()))?;
                Ok(Connection::Standalone(
                    manager.get_or_init(|| created).clone(),
                ))
            }
            Link::Cluster(link) => link.connection().await.map(Connection::Cluster),
            Link::Sentinel(link) => link.connection().await.map(Connection::Sentinel),
        }
    }

    /// `cmd`'s reply from every master: the one server, the master the Sentinels name, or
    /// each master of a Cluster (by its address; `None` for the one master of the others).
    /// A reply that is an error (a command renamed or refused) is that master's, in words;
    /// `Err` when a master cannot be reached.
    pub async fn on_every_master(&self, cmd: &Cmd) -> Result<Vec<Answered>, LimiterError> {
        let reached = |e: redis::RedisError| {
            let unreached = e.is_io_error() || e.is_connection_dropped() || e.is_timeout();
            match unreached || e.is_connection_refusal() {
                true => Err(LimiterError::Connection(e.to_string())),
                false => Ok(Err(e.to_string())),
            }
        };
        let Link::Cluster(link) = self else {
            let mut connection = self.connection().await?;
            let reply = match cmd.query_async::<Value>(&mut connection).await {
                Ok(reply) => Ok(reply),
                Err(e) => reached(e)?,
            };
            return Ok(vec![(None, reply)]);
        };
        let mut connection = link.connection().await?;
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let replies = match connection.route_command(cmd.clone(), routing).await {
            Ok(Value::Map(replies)) => replies,
            Ok(other) => vec![(Value::Nil, other)],
            Err(e) => return Ok(vec![(None, reached(e)?)]),
        };
        let answered = replies.into_iter().map(|(address, reply)| {
            let address = redis::from_redis_value::<String>(address).ok();
            let reply = match reply {
                Value::ServerError(error) => Err(error.to_string()),
                reply => Ok(reply),
            };
            (address, reply)
        });
        Ok(answered.collect())
    }

    /// The address and settings of a standalone server (the other topologies name several).
    pub fn standalone_server(&self) -> Option<&ConnectionInfo> {
        match self {
            Link::Standalone { client, .. } => Some(client.get_connection_info()),
            _ => None,
        }
    }

    /// Checks that the connection still goes where it should (the keeper calls this every
    /// second): a Sentinel link drops its master's connection once the Sentinels name another.
    pub async fn verify(&self) {
        if let Link::Sentinel(link) = self {
            link.verify().await;
        }
    }

    /// Told after a failed call: a Sentinel link forgets a master that may have moved.
    pub fn failed(&self, error: &LimiterError) {
        if let Link::Sentinel(link) = self {
            let master_may_have_moved = matches!(
                error,
                LimiterError::Connection(_)
                    | LimiterError::Timeout(_)
                    | LimiterError::Server {
                        kind: ErrorKind::Readonly,
                        ..
                    }
            );
            if master_may_have_moved {
                link.current.store(None);
            }
        }
    }
}

/// `settings` with the username and password of `auth` (when set) instead of the URL's.
fn with_auth(mut settings: RedisConnectionInfo, auth: &RedisAuth) -> RedisConnectionInfo {
    if let Some(username) = &auth.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = &auth.password {
        settings = settings.set_password(password.expose());
    }
    settings
}

/// The CA and client certificate `auth` names for `rediss://` connections.
fn tls_certificates(auth: &RedisAuth) -> Option<TlsCertificates> {
    let tls = auth.tls.as_ref()?;
    Some(TlsCertificates {
        client_tls: tls.client.as_ref().map(|(cert, key)| ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.expose().as_bytes().to_vec(),
        }),
        root_cert: tls.ca.clone(),
    })
}

/// The connection info of `url`, authenticated as `auth` says.
fn authenticated(url: &str, auth: &RedisAuth) -> Result<ConnectionInfo, redis::RedisError> {
    let info = url.into_connection_info()?;
    let settings = with_auth(info.redis_settings().clone(), auth);
    Ok(info.set_redis_settings(settings))
}

/// The connection to a Cluster, made once: it follows the cluster's changes itself.
pub struct ClusterLink {
    client: ClusterClient,
    current: ArcSwapOption<ClusterConnection>,
    /// Makes connecting single-flight: callers queue here and reuse what the first made.
    connecting: tokio::sync::Mutex<()>,
}

impl ClusterLink {
    async fn connection(self: &Arc<Self>) -> Result<ClusterConnection, LimiterError> {
        if let Some(current) = self.current.load_full() {
            return Ok((*current).clone());
        }
        // Connecting (every node, then the slot map) runs as its own task: a caller that gives
        // up at its deadline does not cancel it, so a cold start connects once, however slow
        // the first attempt is.
        let link = Arc::clone(self);
        tokio::spawn(async move { link.connect().await })
            .await
            .map_err(|e| LimiterError::Connection(format!("redis cluster connect task: {e}")))?
    }

    async fn connect(&self) -> Result<ClusterConnection, LimiterError> {
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(current) = self.current.load_full() {
            return Ok((*current).clone());
        }
        let connection = self
            .client
            .get_async_connection()
            .await
            .map_err(|e| LimiterError::Connection(format!("redis cluster: {e}")))?;
        log::info!("connected to the redis cluster");
        self.current.store(Some(Arc::new(connection.clone())));
        Ok(connection)
    }
}

/// The current master's connection, found through the Sentinels when there is none.
pub struct SentinelLink {
    /// Also makes discovery single-flight: callers queue here and reuse what the first found.
    sentinel: tokio::sync::Mutex<SentinelClient>,
    master_name: String,
    current: ArcSwapOption<Master>,
    response_timeout: Duration,
}

/// The master's connection, and the address the Sentinels named for it.
struct Master {
    connection: MultiplexedConnection,
    address: (String, u16),
}

impl SentinelLink {
    async fn connection(self: &Arc<Self>) -> Result<MultiplexedConnection, LimiterError> {
        if let Some(current) = self.current.load_full() {
            return Ok(current.connection.clone());
        }
        // Discovery runs as its own task: a caller that gives up at its deadline does not
        // cancel it, so the next caller finds the master already connected.
        let link = Arc::clone(self);
        tokio::spawn(async move { link.discover().await })
            .await
            .map_err(|e| LimiterError::Connection(format!("sentinel discovery task: {e}")))?
    }

    async fn discover(&self) -> Result<MultiplexedConnection, LimiterError> {
        let mut sentinel = self.sentinel.lock().await;
        if let Some(current) = self.current.load_full() {
            return Ok(current.connection.clone());
        }
        let discovered = async {
            // Asks the Sentinels for the master's address and checks that it says it is master.
            let client = sentinel.async_get_client().await?;
            let connection = client
                .get_multiplexed_async_connection_with_config(&self.connection_config())
                .await?;
            // A primary paused through its own failover, resumed while this was connecting,
            // still answers ROLE as a master: the Sentinels decide who the master is now.
            let address = address_of(client.get_connection_info());
            let named = self.named_master(&mut sentinel).await?;
            Ok((connection, address, named))
        };
        let (connection, address, named) = tokio::time::timeout(CONNECT_TIMEOUT * 2, discovered)
            .await
            .map_err(|_| LimiterError::Connection("sentinel discovery timed out".into()))?
            .map_err(|e: redis::RedisError| {
                LimiterError::Connection(format!("redis master via sentinel: {e}"))
            })?;
        if address != named {
            return Err(LimiterError::Connection(format!(
                "redis master via sentinel: {}:{} answered as master, but the sentinels name {}:{} now",
                address.0, address.1, named.0, named.1
            )));
        }
        log::info!(
            "connected to the redis master at {}:{}, named by the sentinels",
            address.0,
            address.1
        );
        self.current.store(Some(Arc::new(Master {
            connection: connection.clone(),
            address,
        })));
        Ok(connection)
    }

    /// How the master and the Sentinels are connected to: within the connect and call bounds.
    fn connection_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(self.response_timeout))
    }

    /// The address the Sentinels name for the master now (the first that answers).
    async fn named_master(
        &self,
        sentinel: &mut SentinelClient,
    ) -> Result<(String, u16), redis::RedisError> {
        let client = sentinel.async_get_sentinel_client().await?;
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&self.connection_config())
            .await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master_name)
            .query_async(&mut connection)
            .await
    }

    /// Drops the master's connection once the Sentinels name another server (a failover this
    /// gateway's calls did not notice: its old master still answers).
    async fn verify(&self) {
        let Some(current) = self.current.load_full() else {
            return;
        };
        // Never behind a discovery: that one checks for itself.
        let Ok(mut sentinel) = self.sentinel.try_lock() else {
            return;
        };
        let named = tokio::time::timeout(CONNECT_TIMEOUT, self.named_master(&mut sentinel)).await;
        if let Ok(Ok(named)) = named {
            if named != current.address {
                log::warn!(
                    "the sentinels name {}:{} as the redis master now: the connection to {}:{} is dropped",
                    named.0,
                    named.1,
                    current.address.0,
                    current.address.1
                );
                self.current.store(None);
            }
        }
    }
}

/// The host and port a connection info names (a Unix socket names none).
fn address_of(info: &ConnectionInfo) -> (String, u16) {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => (host.clone(), *port),
        redis::ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port),
        _ => (String::new(), 0),
    }
}
