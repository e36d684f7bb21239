//! The connection to Redis, one server or a cluster, and how a script is sent over it.

use std::fmt;
use std::time::Duration;

use crate::decision::LimiterId;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{ScriptInvocation, Value};

use super::RedisFailure;

/// The response timeout of the connection managers this module makes (the client's default).
const MANAGER_RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// A connection to Redis shared by any number of limiters: one server (through a reconnecting
/// [`ConnectionManager`]) or a Redis Cluster.
///
/// Cloning is cheap; clones share the connection, and are one store: limiters built on it with
/// one prefix share their state and take back each other's decisions. Limiters on stores
/// connected apart never take back each other's, even on one server with one prefix (the
/// decision cannot tell which server it was made on).
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    /// The identity of the decisions made through this store and its clones.
    pub(crate) id: LimiterId,
}

#[derive(Clone)]
enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisStore {
    fn manager_config() -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(Some(MANAGER_RESPONSE_TIMEOUT))
            // Reconnection is tried every 50 to 100 ms while Redis is away: a refused connection
            // costs it nothing, and a restarted Redis is soon in use again. With a 1 s ceiling,
            // runs of `benches/hot_key_faults.sh` with a restart used less of their quota
            // (BENCHMARKS.md, "One hot key across instances: leases").
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(100))
    }

    /// Connects to the server at `url` (`redis://host:port/db`), failing if it cannot be reached
    /// now. Later, the connection reconnects by itself whenever it is lost.
    ///
    /// # Errors
    ///
    /// When `url` is not a Redis URL or the server does not answer within a second.
    pub async fn connect(url: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let manager = ConnectionManager::new_with_config(client, Self::manager_config()).await?;
        Ok(Self::from_manager(manager))
    }

    /// Prepares a connection to the server at `url` without connecting: the first decision
    /// connects. A service can start while Redis is down (its fail mode decides meanwhile).
    ///
    /// Must be called within a tokio runtime.
    ///
    /// # Errors
    ///
    /// When `url` is not a Redis URL.
    pub fn connect_lazy(url: &str) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let manager = ConnectionManager::new_lazy_with_config(client, Self::manager_config())?;
        Ok(Self::from_manager(manager))
    }

    /// Connects to a Redis Cluster through any of its nodes' URLs.
    ///
    /// # Errors
    ///
    /// When a URL is not a Redis URL or no node answers with the cluster's layout.
    pub async fn connect_cluster<I, S>(urls: I) -> Result<Self, redis::RedisError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls = urls.into_iter().map(|url| url.as_ref().to_owned());
        let client = redis::cluster::ClusterClient::builder(urls)
            .connection_timeout(Duration::from_secs(1))
            .build()?;
        Ok(Self {
            connection: Connection::Cluster(client.get_async_connection().await?),
            id: LimiterId::new(),
        })
    }

    /// Uses a connection manager configured by hand.
    ///
    /// Its response timeout is taken to be the client's default (500 ms): a decision's deadline
    /// (see [`RedisRateLimiterBuilder::timeout`](super::RedisRateLimiterBuilder::timeout)) is the
    /// shorter of that and the limiter's timeout. A manager with a shorter response timeout
    /// answers callers before the deadline that their scripts carry; give it one of at least the
    /// limiter's timeout.
    pub fn from_manager(manager: ConnectionManager) -> Self {
        Self {
            connection: Connection::Server(manager),
            id: LimiterId::new(),
        }
    }

    /// The longest a caller of a limiter with `timeout` waits for a reply: the limiter's timeout,
    /// or the connection's own response timeout if that is shorter (a decision's caller is
    /// answered by then at the latest, so its deadline is no later). The cluster client has no
    /// response timeout shorter than the limiter's.
    pub(crate) fn longest_wait(&self, timeout: Duration) -> Duration {
        match self.connection {
            Connection::Server(_) => timeout.min(MANAGER_RESPONSE_TIMEOUT),
            Connection::Cluster(_) => timeout,
        }
    }

    /// Whether this is a Redis Cluster, where one script call takes only keys of one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.connection, Connection::Cluster(_))
    }

    /// Runs the script `call`: `EVALSHA`, and when the server does not know the script (a
    /// restart or `SCRIPT FLUSH` empties its cache), `SCRIPT LOAD` and `EVALSHA` again. The
    /// client's [`ScriptInvocation`] does both; in a cluster, on the node of the script's key.
    pub(crate) async fn run(&self, call: &ScriptInvocation<'_>) -> Result<Value, RedisFailure> {
        let reply = match &self.connection {
            Connection::Server(manager) => call.invoke_async(&mut manager.clone()).await,
            Connection::Cluster(cluster) => call.invoke_async(&mut cluster.clone()).await,
        };
        reply.map_err(RedisFailure::Redis)
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection {
            Connection::Server(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore").field("kind", &kind).finish()
    }
}
