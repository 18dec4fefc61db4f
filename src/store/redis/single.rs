//! The store on one Redis server (or a primary with replicas): a pool of the application's
//! or one multiplexed connection of its own.

use std::fmt;
use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use super::builder::RedisStoreBuilder;
use super::connector::{pool_error, store_error, Connector, PooledOrShared};
use super::engine::{Core, Options};
use crate::error::{ConfigError, StoreError};

/// A store in one Redis server (or a primary with replicas). Cheap to clone: clones share the
/// pool or connection. See the [module docs](crate::store::redis).
///
/// Building connects nothing: the first decision does. Wrap it in a
/// [`ResilientStore`](crate::store::ResilientStore) to say what happens when Redis is down.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::key::Key;
/// use tollgate::store::{FailureMode, RedisStore, ResilientStore};
/// use tollgate::{Limiter, Policy, Rate};
///
/// let redis = RedisStore::builder()
///     .prefix("myapp:rl")
///     .timeout(Duration::from_millis(50))
///     .build_with_url("redis://127.0.0.1:6379")?;
/// let store = ResilientStore::builder(redis, FailureMode::FailClosed).build()?;
/// let limiter = Limiter::builder()
///     .store(store)
///     .policy(Policy::new("api", Rate::per_minute(100))?)
///     .build()?;
/// // Every instance pointing at this Redis shares the 100 per minute.
/// let decision = limiter.check(&Key::new("tenant", "acme"), 1).await?;
/// println!("allowed: {}, remaining: {}", decision.is_allowed(), decision.remaining());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    pub(super) core: Arc<Core<Single>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisStore").field(&self.core).finish()
    }
}

impl RedisStoreBuilder {
    /// A store using the application's `deadpool-redis` pool: one pooled connection per
    /// decision.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `prefix` when the prefix is invalid, or on `timeout` or
    /// `resolve_interval` when set (a pool keeps its own settings).
    pub fn build_with_pool(self, pool: deadpool_redis::Pool) -> Result<RedisStore, ConfigError> {
        self.read_by_pool()?;
        Ok(RedisStore {
            core: Arc::new(Core::new(Single::Pool(pool), self.options)?),
        })
    }

    /// A store over one multiplexed connection to `url` (a [`ConnectionManager`], which
    /// reconnects by itself). The connection is opened by the first decision.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `url` when the URL cannot be parsed, or on `prefix`.
    pub fn build_with_url(self, url: &str) -> Result<RedisStore, ConfigError> {
        self.read_without_sentinel()?;
        let client = redis::Client::open(url)
            .map_err(|e| ConfigError::new("url", format_args!("{url:?}"), e.to_string()))?;
        // One attempt per reconnect: a reconnect that fails is retried by the next call
        // (see the store's handling of refused connections), never by sleeping in a back-off
        // that a decision would wait behind.
        let mut config = ConnectionManagerConfig::new().set_number_of_retries(0);
        if let Some(t) = self.options.timeout {
            config = config
                .set_connection_timeout(Some(t))
                .set_response_timeout(Some(t));
        }
        let single = Single::Url(Box::new(Lazy {
            client,
            config,
            manager: OnceCell::new(),
        }));
        Ok(RedisStore {
            core: Arc::new(Core::new(single, self.options)?),
        })
    }
}

impl RedisStore {
    /// A builder for the key prefix, clock and timeout.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// A store on the application's `deadpool-redis` pool, with the default prefix. See the
    /// [module docs](crate::store::redis) for an example.
    pub fn from_pool(pool: deadpool_redis::Pool) -> Self {
        Self {
            core: Arc::new(Core::unchecked(Single::Pool(pool), Options::default())),
        }
    }

    /// A store over one multiplexed connection to `url`, with the default prefix; see
    /// [`RedisStoreBuilder::build_with_url`].
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `url` when the URL cannot be parsed.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        Self::builder().build_with_url(url)
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

super::store_impl::engine_store!(RedisStore, "redis");

/// How a single-server store reaches Redis.
pub(crate) enum Single {
    Pool(deadpool_redis::Pool),
    Url(Box<Lazy>),
}

/// A client and the connection it opens on first use.
pub(crate) struct Lazy {
    client: redis::Client,
    config: ConnectionManagerConfig,
    manager: OnceCell<ConnectionManager>,
}

impl Connector for Single {
    type Conn = PooledOrShared<deadpool_redis::Connection, ConnectionManager>;
    type Lane = ();

    fn lane(&self, _state_key: &str) {}

    async fn connection(&self) -> Result<Self::Conn, StoreError> {
        // The pool's `get` and the first connect are futures of kilobytes (deadpool's: 6.9 KB),
        // and every decision's future would carry them and copy them into its box: boxed,
        // they cost one allocation per pooled call, and nothing on a connection already made.
        match self {
            Single::Pool(pool) => Box::pin(pool.get())
                .await
                .map(PooledOrShared::Pooled)
                .map_err(pool_error),
            Single::Url(lazy) => match lazy.manager.get() {
                Some(manager) => Ok(PooledOrShared::Shared(manager.clone())),
                None => Box::pin(lazy.manager.get_or_try_init(|| {
                    lazy.client
                        .get_connection_manager_with_config(lazy.config.clone())
                }))
                .await
                .cloned()
                .map(PooledOrShared::Shared)
                .map_err(store_error),
            },
        }
    }

    fn describe(&self) -> &'static str {
        match self {
            Single::Pool(_) => "deadpool-redis pool",
            Single::Url(_) => "multiplexed connection",
        }
    }
}
