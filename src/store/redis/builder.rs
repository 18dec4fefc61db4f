//! The builder of the Redis stores: the settings they share. The builds on one server are
//! in `single.rs`, those on a cluster in `cluster.rs`, through Sentinel in `sentinel.rs`.

use std::sync::Arc;
use std::time::Duration;

use super::engine::Options;
use crate::clock::Clock;
use crate::error::ConfigError;

/// Builds a [`RedisStore`](super::RedisStore) or a
/// [`RedisClusterStore`](crate::store::RedisClusterStore).
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
    /// Read by the Sentinel build only.
    #[cfg(feature = "sentinel")]
    pub(crate) resolve_interval: Option<Duration>,
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
    /// (default: 1 s to connect, 500 ms per reply), at least 1 ms. A pool passed in keeps
    /// its own settings: a build with a pool refuses this one, which it would not read.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }

    /// The most concurrent decisions one script call may carry (default
    /// [`DEFAULT_MAX_BATCH`](super::DEFAULT_MAX_BATCH), at most 1 024). `1` sends every decision in a call of its own,
    /// as soon as it is made. See [Coalescing](crate::store::redis#coalescing).
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.options.max_batch = max_batch;
        self
    }

    /// How many script calls may be in flight at once (per hash slot on a cluster) before
    /// new decisions queue for the next call (default [`DEFAULT_MAX_IN_FLIGHT`](super::DEFAULT_MAX_IN_FLIGHT)). See
    /// [Coalescing](crate::store::redis#coalescing).
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.options.max_in_flight = max_in_flight;
        self
    }

    /// Refuses the settings a build over a pool passed in would not read: the timeout
    /// (the pool keeps its own) and the Sentinel resolve interval.
    pub(crate) fn read_by_pool(&self) -> Result<(), ConfigError> {
        if let Some(t) = self.options.timeout {
            return Err(ConfigError::new(
                "timeout",
                format_args!("{t:?}"),
                "a pool passed in keeps its own timeouts: set them on the pool",
            ));
        }
        self.read_without_sentinel()
    }

    /// Refuses the Sentinel resolve interval on a build that is not through Sentinel.
    pub(crate) fn read_without_sentinel(&self) -> Result<(), ConfigError> {
        #[cfg(feature = "sentinel")]
        if let Some(i) = self.resolve_interval {
            return Err(ConfigError::new(
                "resolve_interval",
                format_args!("{i:?}"),
                "only a store built through Sentinel (build_with_sentinel) resolves its master",
            ));
        }
        Ok(())
    }
}
