//! The Redis Cluster store: the same script and keys as [`RedisStore`](super::RedisStore), on
//! a cluster.
//!
//! Every key of one principal shares one hash tag (`<prefix>:{<key>}:…`), so the script that
//! decides all of a request's policies touches a single hash slot: no `CROSSSLOT` errors, and the
//! whole decision is still **one round trip** to the primary that owns the slot. redis-rs
//! follows `MOVED` and `ASK` redirections and refreshes its slot map by itself; on `NOSCRIPT`
//! the script is loaded on every primary and the call retried once. Different principals
//! spread over the cluster's hash slots. Concurrent decisions are
//! [coalesced](crate::store::redis#coalescing) per hash slot: a batch only ever holds keys of
//! one hash slot.
//!
//! Everything the [Redis store](crate::store::redis) guarantees holds here too: all or
//! nothing across policies, the arithmetic of [`crate::algorithm`], the server clock, a TTL on
//! every key, typed [`StoreError`]s.
//!
//! # Examples
//!
//! With `deadpool-redis`'s cluster pool:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::{key::Key, store::RedisClusterStore, Limiter, Policy, Rate};
//!
//! let urls = vec!["redis://10.0.0.1:6379".to_owned(), "redis://10.0.0.2:6379".to_owned()];
//! let pool = deadpool_redis::cluster::Config::from_urls(urls)
//!     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
//! let limiter = Limiter::builder()
//!     .store(RedisClusterStore::from_pool(pool))
//!     .policy(Policy::new("api", Rate::per_minute(600))?)
//!     .build()?;
//! assert!(limiter.check(&Key::new("user", "42"), 1).await?.is_allowed());
//! # Ok(()) }
//! ```
//!
//! From seed node URLs, over one cluster connection:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::store::RedisClusterStore;
//!
//! let store = RedisClusterStore::builder()
//!     .prefix("myapp")
//!     .build_cluster_with_urls(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])?;
//! store.ping().await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tokio::sync::OnceCell;

use super::builder::RedisStoreBuilder;
use super::connector::{pool_error, store_error, Connector, PooledOrShared};
use super::engine::{Core, Options};
use crate::error::{ConfigError, StoreError};

/// A store in a Redis Cluster. Cheap to clone: clones share the pool or connection. See the
/// [module docs](crate::store::cluster).
#[derive(Clone)]
pub struct RedisClusterStore {
    pub(super) core: Arc<Core<Cluster>>,
}

impl fmt::Debug for RedisClusterStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisClusterStore")
            .field(&self.core)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// A cluster store using the application's `deadpool-redis` cluster pool.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `prefix` when the prefix is invalid.
    pub fn build_cluster_with_pool(
        self,
        pool: deadpool_redis::cluster::Pool,
    ) -> Result<RedisClusterStore, ConfigError> {
        self.read_by_pool()?;
        Ok(RedisClusterStore {
            core: Arc::new(Core::new(Cluster::Pool(pool), self.options)?),
        })
    }

    /// A cluster store over one cluster connection to the nodes behind `urls` (seed nodes:
    /// the rest are discovered). The connection is opened by the first decision.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `urls` when they cannot be parsed, or on `prefix`.
    pub fn build_cluster_with_urls<I, U>(self, urls: I) -> Result<RedisClusterStore, ConfigError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        self.read_without_sentinel()?;
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        // The documented defaults (1 s to connect, 500 ms per reply), as the single-server
        // client has them: the cluster client's own is to wait for a reply forever, so a node
        // that stops answering would hold its slots' calls until TCP gives up.
        let (connect, reply) = self.options.timeout.map_or(
            (
                std::time::Duration::from_secs(1),
                std::time::Duration::from_millis(500),
            ),
            |t| (t, t),
        );
        let client = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(connect)
            .response_timeout(reply)
            .build()
            .map_err(|e| ConfigError::new("urls", format_args!("{urls:?}"), e.to_string()))?;
        let cluster = Cluster::Urls(Box::new((client, OnceCell::new())));
        Ok(RedisClusterStore {
            core: Arc::new(Core::new(cluster, self.options)?),
        })
    }
}

impl RedisClusterStore {
    /// A builder for the key prefix, clock and timeout; finish it with
    /// [`build_cluster_with_pool`](RedisStoreBuilder::build_cluster_with_pool) or
    /// [`build_cluster_with_urls`](RedisStoreBuilder::build_cluster_with_urls).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// A store on the application's `deadpool-redis` cluster pool, with the default prefix.
    /// See the [module docs](crate::store::cluster) for an example.
    pub fn from_pool(pool: deadpool_redis::cluster::Pool) -> Self {
        Self {
            core: Arc::new(Core::unchecked(Cluster::Pool(pool), Options::default())),
        }
    }

    /// A store over one cluster connection to the nodes behind `urls`, with the default
    /// prefix.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `urls` when they cannot be parsed.
    pub fn from_urls<I, U>(urls: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        Self::builder().build_cluster_with_urls(urls)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        self.core.prefix()
    }

    /// Sends `PING`, then loads tollgate's scripts (`SCRIPT LOAD`): a start-up check that
    /// Redis is reachable, after which the first decision is one round trip (without it, the
    /// first call to each script meets `NOSCRIPT` and loads it, three round trips, which a
    /// tight [`ResilientStore`](crate::store::ResilientStore) timeout may not allow).
    ///
    /// # Errors
    ///
    /// The [`StoreError`] a decision would have met.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.core.ping().await
    }
}

super::store_impl::engine_store!(RedisClusterStore, "redis-cluster");

/// How a cluster store reaches the cluster.
pub(crate) enum Cluster {
    Pool(deadpool_redis::cluster::Pool),
    Urls(Box<(ClusterClient, OnceCell<ClusterConnection>)>),
}

impl Connector for Cluster {
    type Conn = PooledOrShared<deadpool_redis::cluster::Connection, ClusterConnection>;
    type Lane = redis::cluster_routing::Slot;

    fn lane(&self, state_key: &str) -> Self::Lane {
        redis::cluster_routing::Slot::for_key(state_key)
    }

    async fn connection(&self) -> Result<Self::Conn, StoreError> {
        // Boxed for the reason given in `Single::connection`: every decision's future would
        // otherwise carry the pool's and the first connect's kilobytes.
        match self {
            Cluster::Pool(pool) => Box::pin(pool.get())
                .await
                .map(PooledOrShared::Pooled)
                .map_err(pool_error),
            Cluster::Urls(lazy) => match lazy.1.get() {
                Some(connection) => Ok(PooledOrShared::Shared(connection.clone())),
                None => Box::pin(lazy.1.get_or_try_init(|| lazy.0.get_async_connection()))
                    .await
                    .cloned()
                    .map(PooledOrShared::Shared)
                    .map_err(store_error),
            },
        }
    }

    fn one_server(&self) -> bool {
        false
    }

    fn describe(&self) -> &'static str {
        match self {
            Cluster::Pool(_) => "deadpool-redis cluster pool",
            Cluster::Urls(_) => "cluster connection",
        }
    }
}
