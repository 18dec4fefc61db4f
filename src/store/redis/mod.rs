//! The Redis store: limits shared by every instance of a service.
//!
//! **One round trip per decision, or fewer.** [`check`](crate::store::Store::check) and
//! [`peek`](crate::store::Op::Peek) send a single `EVALSHA` of one Lua script that decides the request
//! against *all* its policies. If Redis has forgotten the script (`NOSCRIPT`, after a restart
//! or `SCRIPT FLUSH`), it is loaded and the call retried once, so that one decision costs
//! three round trips. The first decision of a store built from a URL also opens its
//! connection. [`refund`](crate::store::Op::Refund) is a request of the same script (in refund mode),
//! so one atomic call too; [`reset`](crate::store::Op::Reset) is one `UNLINK`.
//!
//! # Coalescing
//!
//! Under load, concurrent decisions share script calls. A decision is sent at once while
//! fewer than [`max_in_flight`](RedisStoreBuilder::max_in_flight) calls are in flight (so at
//! low load nothing waits); otherwise it queues, and when a call comes back everything that
//! queued meanwhile leaves as the next call, up to [`max_batch`](RedisStoreBuilder::max_batch)
//! decisions in arrival order. That call reads each state once, decides the requests one
//! after another against the state as the earlier ones left it, and writes each state once:
//! exactly the answers the same requests would get one call at a time, but a hot key costs
//! one read and one write per batch instead of per request, and the per-call cost of Redis
//! (parsing, dispatch, the script's set-up) is paid once per batch. A key holding a value of
//! another type fails its own requests only. A caller that gives up (a timeout) before its
//! batch is sent is left out of it. `max_batch(1)` turns coalescing off.

//! # What the script guarantees
//!
//! * **Atomic, all or nothing**: every read-modify-write happens inside the script. All
//!   policies are evaluated first; only if every one allows is any of them charged, so a
//!   denied request consumes nothing anywhere.
//! * **The same answers as the memory store**: the Lua is the arithmetic of
//!   [`crate::algorithm`], in integers (exact below 2^53, which policies guarantee); a
//!   differential test runs random traces through both.
//! * **One clock**: the script reads the Redis server's `TIME`, so instances with skewed clocks
//!   agree. A store given an injected clock (a [`ManualClock`](crate::clock::ManualClock) in
//!   tests) passes that clock's time instead. ([`Store::now_millis`](crate::store::Store::now_millis), used only to render
//!   absolute reset times in headers, reads the local clock.)
//! * **Nothing left behind**: every key it writes gets a TTL that ends
//!   [`TTL_MARGIN_MS`] after its state stops mattering, rounded up to a grid of
//!   [`TTL_GRID_MS`] for the string states below: never before the state stops mattering
//!   (488 ms after it at the earliest), and at most `TTL_MARGIN_MS + TTL_GRID_MS` (1 512 ms)
//!   after it, as the state was last written (see [`TTL_MARGIN_MS`] for a token bucket
//!   whose limit an override or a reload changes).
//! * **Compact state**: a counter, bucket, fixed window or GCRA state is one string of
//!   little-endian doubles (16 or 24 bytes), read for a whole batch with one `MGET` and written
//!   with one `SET … PX`, or `SET … KEEPTTL` (Redis 6.0 or later) when its expiry stays in the
//!   same cell of the grid (for GCRA while a request's emission interval is under half a
//!   second, for the token bucket while its deficit refills in about that); the sliding
//!   window log is a sorted set.
//! * **Cluster-safe keys**: `<prefix>:{<key>}:<policy>:<algorithm>`; one principal's keys
//!   share a hash tag, so the same script runs unchanged on
//!   [`RedisClusterStore`].
//!
//! Connection failures, timeouts and script errors are [`StoreError`]s (keeping the redis-rs
//! error as their source); wrapped in a [`ResilientStore`](crate::store::ResilientStore), its
//! failure mode decides what a request gets then.
//!
//! # Examples
//!
//! With the `deadpool-redis` pool the application already has:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::{key::Key, store::RedisStore, Limiter, Policy, Rate};
//!
//! let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
//!     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
//! let limiter = Limiter::builder()
//!     .store(RedisStore::from_pool(pool))
//!     .policy(Policy::new("burst", Rate::per_second(10))?)
//!     .policy(Policy::new("daily", Rate::per_day(1000))?)
//!     .build()?;
//! let d = limiter.check(&Key::new("user", "42"), 1).await?;
//! assert!(d.is_allowed());
//! # Ok(()) }
//! ```
//!
//! From a URL, over one multiplexed connection that reconnects by itself, with a custom key
//! prefix and timeout:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::store::RedisStore;
//!
//! let store = RedisStore::builder()
//!     .prefix("myapp:rl")
//!     .timeout(Duration::from_millis(200))
//!     .build_with_url("redis://127.0.0.1:6379")?;
//! store.ping().await?;
//! # Ok(()) }
//! ```

mod batch;
#[cfg(feature = "cluster")]
pub mod cluster;
mod engine;
mod keys;
mod lease;
mod script;
mod script_call;
mod store_impl;
mod wire;

#[cfg(feature = "cluster")]
pub use cluster::RedisClusterStore;
pub use engine::{DEFAULT_MAX_BATCH, DEFAULT_MAX_IN_FLIGHT};
pub use keys::DEFAULT_PREFIX;
pub use lease::lease_script_source;
pub use script::{TTL_GRID_MS, TTL_MARGIN_MS};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use crate::clock::Clock;
use crate::error::{ConfigError, StoreError};
use engine::{store_error, Connector, Core, Options, PooledOrShared};

/// The Lua text of the decision script both Redis stores run, for inspection, auditing or
/// loading ahead of time with `SCRIPT LOAD` (the stores load it themselves on `NOSCRIPT`).
///
/// ```
/// let lua = tollgate::store::redis::script_source();
/// assert!(lua.contains("redis.call('TIME')"));
/// ```
pub fn script_source() -> &'static str {
    script::source()
}

/// A store in one Redis server (or a primary with replicas). Cheap to clone: clones share the
/// pool or connection. See the [module docs](crate::store::redis).
#[derive(Clone)]
pub struct RedisStore {
    core: Arc<Core<Single>>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisStore").field(&self.core).finish()
    }
}

/// Builds a [`RedisStore`] or a [`RedisClusterStore`].
///
/// # Examples
///
/// ```
/// use tollgate::store::RedisStore;
///
/// // Building from a URL does not connect yet: the first decision does.
/// let store = RedisStore::builder().prefix("app").build_with_url("redis://127.0.0.1:6379")?;
/// assert_eq!(store.prefix(), "app");
///
/// let err = RedisStore::builder().prefix("a{b}").build_with_url("redis://127.0.0.1").unwrap_err();
/// assert_eq!(err.field(), "prefix");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Default)]
#[must_use]
pub struct RedisStoreBuilder {
    pub(crate) options: Options,
}

impl RedisStoreBuilder {
    /// The first part of every key (default `tollgate`). It must not contain `{`, `}`,
    /// whitespace or control characters; that is checked when the store is built.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.options.prefix = prefix.into().into_boxed_str();
        self
    }

    /// Passes this clock's time to the script instead of reading the server's `TIME`. For
    /// tests: production stores should keep the default server clock, which every instance
    /// shares.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.options.clock = Some(Arc::new(clock));
        self
    }

    /// For stores built from a URL: how long to wait for a connection and for each reply
    /// (default: 1 s to connect, 500 ms per reply). A pool passed in keeps its own settings.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }

    /// The most concurrent decisions one script call may carry (default
    /// [`DEFAULT_MAX_BATCH`], at most 1 024). `1` sends every decision in a call of its own,
    /// as soon as it is made. See [Coalescing](crate::store::redis#coalescing).
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.options.max_batch = max_batch;
        self
    }

    /// How many script calls may be in flight at once (per hash slot on a cluster) before
    /// new decisions queue for the next call (default [`DEFAULT_MAX_IN_FLIGHT`]). See
    /// [Coalescing](crate::store::redis#coalescing).
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.options.max_in_flight = max_in_flight;
        self
    }

    /// A store using the application's `deadpool-redis` pool: one pooled connection per
    /// decision.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `prefix` when the prefix is invalid.
    pub fn build_with_pool(self, pool: deadpool_redis::Pool) -> Result<RedisStore, ConfigError> {
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

    /// Sends `PING`: a start-up check that Redis is reachable.
    ///
    /// # Errors
    ///
    /// The [`StoreError`] a decision would have met.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.core.ping().await
    }
}

store_impl::engine_store!(RedisStore, "redis");

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

/// A pool that could not hand out a connection.
pub(crate) fn pool_error(e: deadpool_redis::PoolError) -> StoreError {
    match e {
        deadpool_redis::PoolError::Timeout(_) => StoreError::Timeout,
        deadpool_redis::PoolError::Backend(e) => store_error(e),
        other => StoreError::Connection(crate::error::Cause::from(other.to_string())),
    }
}
