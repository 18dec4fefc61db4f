//! The Redis store through Sentinel: the master is found by its name, and followed when
//! Sentinel fails it over to a replica.
//!
//! Everything the [Redis store](crate::store::redis) does works unchanged: the same script,
//! keys, batching, overrides and [lease ledger](crate::store::leased), on one multiplexed
//! connection to the master the sentinels name (redis-rs checks with `ROLE` that it is one).
//!
//! # Following a failover
//!
//! * **Losing the master.** A call whose connection fails (refused, dropped, timed out) or
//!   whose write meets `READONLY` (the master was demoted) drops that master, and so do calls
//!   that callers gave up on (a `ResilientStore`'s timeout) and that stayed unanswered, with
//!   no reply meanwhile, for longer than the store's [timeout](RedisStoreBuilder::timeout): a
//!   stopped or cut-off master fails no call, it only stops answering. The call fails with
//!   its [`StoreError`], so a
//!   [`ResilientStore`](crate::store::ResilientStore)'s failure mode decides it, and a
//!   [`LeasedStore`](crate::store::leased::LeasedStore) keeps deciding from the blocks in
//!   hand.
//! * **Finding the new one.** The next call asks the sentinels again (every sentinel at
//!   once, the first valid answer wins, whatever the sentinel's place in the list, so one that
//!   does not answer holds up nothing) and connects to the master
//!   they name. Resolutions are at least the
//!   [resolve interval](RedisStoreBuilder::resolve_interval) apart (default
//!   [`DEFAULT_RESOLVE_INTERVAL`], 100 ms): calls in between fail at once, so a dead sentinel
//!   list costs at most one round of sentinel queries per interval, however many requests
//!   arrive. Each resolution is bounded by the store's [timeout](RedisStoreBuilder::timeout)
//!   (default 1 s).
//! * **Resuming.** Once the sentinels name the promoted replica, decisions resume on it
//!   within one resolve interval plus one resolution (a sentinel round trip, a connect and
//!   `ROLE`), provided requests keep coming: resolution is driven by calls, never by a
//!   background task. Until the sentinels agree that the master is down
//!   (`down-after-milliseconds`) and finish the failover, they name the old master, which
//!   refuses connections: the store keeps failing fast and asking once per interval.
//! * **The server's `run_id` changes**, so [`Store::generation`](crate::store::Store::generation)
//!   moves as after a restart: a deny cache forgets its denials, and leased blocks granted
//!   by the old master are not given back to the new one (under-admission, never over).
//!
//! # What a failover costs in accuracy
//!
//! Redis replicates asynchronously. Writes the old master acknowledged but the promoted
//! replica had not received when the master died are lost: the requests they admitted are
//! admitted again by the new master. **Over-admission across one failover is at most the
//! units admitted within the replication lag before the master died** (with the replica in
//! sync, the last few milliseconds of traffic). `tests/sentinel.rs` measures it: it counts
//! the admissions the new master never recorded (admitted minus the units its state shows
//! spent) and checks all admissions against the limit plus those of the last 100 ms before
//! the kill. Nothing is lost when the replica was in sync, for instance after a manual
//! `SENTINEL FAILOVER`, which waits for it. Sentinel has a window of its own: a master that
//! is cut off but alive takes writes until it is demoted, and its demotion discards them
//! (`min-replicas-to-write` on the master narrows that window). Requests decided by a
//! failure mode while no master answered are bounded by that mode (fail-open admits them
//! all).
//!
//! With the `metrics` feature, `tollgate_sentinel_switches_total` counts the master
//! switches a store followed and `tollgate_sentinel_failover_seconds` records, for each,
//! how long it had been without a master (from the first call that found none to the first
//! call on the new master); see [`crate::observability`].
//!
//! # Examples
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::store::{FailureMode, RedisSentinelStore, ResilientStore};
//! use tollgate::{key::Key, Limiter, Policy, Rate};
//!
//! let store = RedisSentinelStore::builder()
//!     .prefix("myapp")
//!     .resolve_interval(Duration::from_millis(200))
//!     .build_with_sentinel(
//!         ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
//!         "mymaster",
//!     )?;
//! // While no master answers, the local fallback decides.
//! let store =
//!     ResilientStore::builder(store, FailureMode::LocalFallback { replicas: 4 }).build()?;
//! let limiter = Limiter::builder()
//!     .store(store)
//!     .policy(Policy::new("api", Rate::per_minute(600))?)
//!     .build()?;
//! assert!(limiter.check(&Key::new("user", "42"), 1).await?.is_allowed());
//! # Ok(()) }
//! ```
//!
//! A configuration mistake fails at build time, naming the setting:
//!
//! ```
//! use tollgate::store::RedisSentinelStore;
//!
//! let err = RedisSentinelStore::builder()
//!     .build_with_sentinel(["redis://127.0.0.1:26379"], "")
//!     .unwrap_err();
//! assert_eq!(err.field(), "master");
//! let none: [&str; 0] = [];
//! let err = RedisSentinelStore::builder().build_with_sentinel(none, "mymaster").unwrap_err();
//! assert_eq!(err.field(), "sentinels");
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;

use super::builder::RedisStoreBuilder;
use super::connector::Connector;
use super::engine::Core;
use crate::error::{ConfigError, StoreError};

mod link;

use link::{Link, Watched};

/// The default least time between two resolutions of the master.
///
/// ```
/// assert_eq!(tollgate::store::redis::DEFAULT_RESOLVE_INTERVAL.as_millis(), 100);
/// ```
pub const DEFAULT_RESOLVE_INTERVAL: Duration = Duration::from_millis(100);

/// The bound on one resolution, and on connecting to the master, when no timeout is set.
const DEFAULT_RESOLVE_TIMEOUT: Duration = Duration::from_secs(1);

/// The accepted resolve intervals: often enough to follow a failover promptly, rarely
/// enough that a dead sentinel list is not hammered.
const RESOLVE_INTERVALS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(60);

/// A store on the Redis master that Sentinel names, following its failovers. Cheap to clone:
/// clones share the connection. See the [module docs](crate::store::sentinel).
#[derive(Clone)]
pub struct RedisSentinelStore {
    pub(super) core: Arc<Core<SentinelConnector>>,
}

impl fmt::Debug for RedisSentinelStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinelStore")
            .field("core", &self.core)
            .field("link", &self.core.connector.0)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// The least time between two resolutions of the master by a store built with
    /// [`build_with_sentinel`](Self::build_with_sentinel) (default
    /// [`DEFAULT_RESOLVE_INTERVAL`]; 10 ms to 60 s, checked when the store is built). See
    /// [following a failover](crate::store::sentinel#following-a-failover).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::RedisSentinelStore;
    ///
    /// let builder = RedisSentinelStore::builder().resolve_interval(Duration::from_millis(250));
    /// assert!(builder.build_with_sentinel(["redis://127.0.0.1:26379"], "mymaster").is_ok());
    ///
    /// let too_often = RedisSentinelStore::builder().resolve_interval(Duration::from_millis(1));
    /// let err = too_often.build_with_sentinel(["redis://127.0.0.1:26379"], "mymaster").unwrap_err();
    /// assert_eq!(err.field(), "resolve_interval");
    /// ```
    pub fn resolve_interval(mut self, interval: Duration) -> Self {
        self.resolve_interval = Some(interval);
        self
    }

    /// A store on the master named `master_name` by the sentinels at `sentinels`
    /// (`redis://host:port` URLs of Sentinel processes, not of Redis servers). Nothing is
    /// connected yet: the first decision asks the sentinels.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `sentinels` when there are none or one cannot be parsed, on
    /// `master` when the name is empty, on `resolve_interval`, or on `prefix`.
    ///
    /// ```
    /// use tollgate::store::RedisSentinelStore;
    ///
    /// let store = RedisSentinelStore::builder()
    ///     .build_with_sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "mymaster")?;
    /// assert_eq!(store.master_address(), None); // not asked yet
    ///
    /// let err = RedisSentinelStore::builder()
    ///     .build_with_sentinel(["redis://10.0.0.1:26379", "http://10.0.0.2"], "mymaster")
    ///     .unwrap_err();
    /// assert_eq!((err.field(), err.value()), ("sentinels", "\"http://10.0.0.2\""));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn build_with_sentinel<I, U>(
        self,
        sentinels: I,
        master_name: &str,
    ) -> Result<RedisSentinelStore, ConfigError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        let urls: Box<[String]> = sentinels
            .into_iter()
            .map(|u| u.as_ref().to_owned())
            .collect();
        if urls.is_empty() {
            return Err(ConfigError::new(
                "sentinels",
                "[]",
                "needs at least one sentinel url (redis://host:port)",
            ));
        }
        let infos = urls
            .iter()
            .map(|url| {
                url.as_str().into_connection_info().map_err(|e| {
                    ConfigError::new("sentinels", format_args!("{url:?}"), e.to_string())
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if master_name.trim().is_empty() {
            return Err(ConfigError::new(
                "master",
                format_args!("{master_name:?}"),
                "needs the name the sentinels monitor the master by (`sentinel monitor <name> …`)",
            ));
        }
        if master_name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            // Sentinel's configuration reads the name as one word: such a name is never
            // monitored, and the store would only fail when first used.
            return Err(ConfigError::new(
                "master",
                format_args!("{master_name:?}"),
                "a master name is one word, without spaces or control characters, as `sentinel monitor <name> …` reads it",
            ));
        }
        let interval = self.resolve_interval.unwrap_or(DEFAULT_RESOLVE_INTERVAL);
        if !RESOLVE_INTERVALS.contains(&interval) {
            return Err(ConfigError::new(
                "resolve_interval",
                format_args!("{interval:?}"),
                "must be 10ms to 60s",
            ));
        }
        let each = infos
            .into_iter()
            .zip(urls.iter())
            .map(|(info, url)| {
                redis::sentinel::Sentinel::build(vec![info]).map_err(|e| {
                    ConfigError::new("sentinels", format_args!("{url:?}"), e.to_string())
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let timeout = self.options.timeout.unwrap_or(DEFAULT_RESOLVE_TIMEOUT);
        let link = Link::new(each, urls, master_name.into(), timeout, interval);
        Ok(RedisSentinelStore {
            core: Arc::new(Core::new(SentinelConnector(Arc::new(link)), self.options)?),
        })
    }
}

impl RedisSentinelStore {
    /// A builder for the key prefix, timeout and resolve interval; finish it with
    /// [`build_with_sentinel`](RedisStoreBuilder::build_with_sentinel).
    ///
    /// ```
    /// let store = tollgate::store::RedisSentinelStore::builder()
    ///     .prefix("app")
    ///     .build_with_sentinel(["redis://127.0.0.1:26379"], "mymaster")?;
    /// assert_eq!(store.master_name(), "mymaster");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The key prefix.
    ///
    /// ```
    /// let store = tollgate::store::RedisSentinelStore::builder()
    ///     .build_with_sentinel(["redis://127.0.0.1:26379"], "mymaster")?;
    /// assert_eq!(store.prefix(), tollgate::store::redis::DEFAULT_PREFIX);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn prefix(&self) -> &str {
        self.core.prefix()
    }

    /// The name the sentinels know the master by.
    ///
    /// See [`builder`](Self::builder) for an example.
    pub fn master_name(&self) -> &str {
        self.core.connector.0.master_name()
    }

    /// The address (`host:port`) of the master in use, or `None` while none is (before the
    /// first call, and after the master was lost until it is found again).
    ///
    /// ```no_run
    /// # async fn run(store: tollgate::store::RedisSentinelStore) -> Result<(), tollgate::StoreError> {
    /// store.ping().await?;
    /// println!("deciding on {:?}", store.master_address());
    /// # Ok(()) }
    /// ```
    pub fn master_address(&self) -> Option<String> {
        self.core.connector.0.master_address()
    }

    /// How many times this store found the master at another address than before: the
    /// failovers it followed.
    ///
    /// ```
    /// let store = tollgate::store::RedisSentinelStore::builder()
    ///     .build_with_sentinel(["redis://127.0.0.1:26379"], "mymaster")?;
    /// assert_eq!(store.master_switches(), 0);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn master_switches(&self) -> u64 {
        self.core.connector.0.switches()
    }

    /// Sends `PING` to the master (resolving it first): a start-up check that the sentinels
    /// and the master are reachable.
    ///
    /// # Errors
    ///
    /// The [`StoreError`] a decision would have met.
    ///
    /// See [`master_address`](Self::master_address) for an example.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.core.ping().await
    }
}

super::store_impl::engine_store!(RedisSentinelStore, "redis-sentinel");

/// How a Sentinel store reaches the master.
pub(crate) struct SentinelConnector(Arc<Link>);

impl Connector for SentinelConnector {
    type Conn = Watched;
    type Lane = ();

    fn lane(&self, _state_key: &str) {}

    async fn connection(&self) -> Result<Self::Conn, StoreError> {
        self.0.connection().await
    }

    fn describe(&self) -> &'static str {
        "sentinel-resolved multiplexed connection"
    }

    fn server_epoch(&self) -> u64 {
        self.0.epoch()
    }
}
