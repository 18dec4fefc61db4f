//! Building a [`ResilientStore`]: every setting checked at build time.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use super::breaker::Breaker;
use super::deny_cache::DenyCache;
use super::{Inner, ResilientStore};
use crate::clock::{Clock, SystemClock};
use crate::error::ConfigError;
use crate::policy::FailureMode;
use crate::store::{MemoryStore, Store};

/// The longest a duration setting may be: a longer one is a unit mistake, and a breaker's
/// cooldown is added to the clock.
const MAX_SETTING: Duration = Duration::from_secs(86_400);

/// How long a cached denial is answered before the store is asked whether it still stands,
/// by default: see [`ResilientStoreBuilder::deny_cache_recheck`].
pub const DEFAULT_DENY_CACHE_RECHECK: Duration = Duration::from_millis(250);

/// Builds a [`ResilientStore`].
#[must_use]
pub struct ResilientStoreBuilder<S> {
    primary: S,
    mode: FailureMode,
    timeout: Duration,
    threshold: u32,
    cooldown: Duration,
    deny_cache: Option<usize>,
    deny_cache_max_age: Duration,
    deny_cache_recheck: Duration,
    /// The first deny-cache setting made, which only a deny cache reads.
    deny_cache_tuned: Option<(&'static str, Duration)>,
    clock: Arc<dyn Clock>,
}

impl<S: fmt::Debug> fmt::Debug for ResilientStoreBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientStoreBuilder")
            .field("primary", &self.primary)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl<S: Store> ResilientStore<S> {
    /// Wraps `primary`; `mode` applies to every policy that does not choose its own.
    pub fn builder(primary: S, mode: FailureMode) -> ResilientStoreBuilder<S> {
        ResilientStoreBuilder {
            primary,
            mode,
            timeout: Duration::from_millis(50),
            threshold: 5,
            cooldown: Duration::from_secs(1),
            deny_cache: None,
            deny_cache_max_age: Duration::from_secs(1),
            deny_cache_recheck: DEFAULT_DENY_CACHE_RECHECK,
            deny_cache_tuned: None,
            clock: Arc::new(SystemClock::new()),
        }
    }
}

impl<S: Store> ResilientStoreBuilder<S> {
    /// The longest a store call may take (default 50 ms), at least 1 ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Open the breaker after `failures` consecutive failures (at least 1), for `cooldown`
    /// (at least 1 ms); defaults 5 and 1 s.
    pub fn circuit_breaker(mut self, failures: u32, cooldown: Duration) -> Self {
        self.threshold = failures;
        self.cooldown = cooldown;
        self
    }

    /// Remember up to `entries` current denials locally (default: off; 0 turns it off).
    pub fn deny_cache(mut self, entries: usize) -> Self {
        self.deny_cache = (entries > 0).then_some(entries);
        self
    }

    /// The longest a denial is served from the deny cache (default 1 s), however long the
    /// store said it lasts: after it, the next request goes to the store (see the
    /// [module docs](crate::store::resilient)).
    pub fn deny_cache_max_age(mut self, max_age: Duration) -> Self {
        self.deny_cache_max_age = max_age;
        self.deny_cache_tuned
            .get_or_insert(("deny_cache_max_age", max_age));
        self
    }

    /// How long a cached denial is answered before the store is asked, off the request path,
    /// whether it still stands (default [`DEFAULT_DENY_CACHE_RECHECK`], at least 1 ms): a
    /// peek, charging nothing, at most one per cached denial at a time. A denial the store
    /// would no longer give (it lost the key's state: a restart, a failover, `FLUSHALL`, an
    /// eviction) is dropped with its answer, so the cache refuses a request the store would
    /// allow for at most this long plus one store call (at most the
    /// [`timeout`](Self::timeout)). Each hot refused key costs the store one peek per this
    /// long per instance; a value at or above the max age asks nothing (the denial ends
    /// first).
    pub fn deny_cache_recheck(mut self, recheck: Duration) -> Self {
        self.deny_cache_recheck = recheck;
        self.deny_cache_tuned
            .get_or_insert(("deny_cache_recheck", recheck));
        self
    }

    /// The local clock for the breaker, the deny cache and the fallback limiter (default
    /// [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Builds the store.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when `timeout`, the breaker's `cooldown`,
    /// `deny_cache_max_age` or `deny_cache_recheck` is under 1 ms or over a day, the breaker's
    /// `failures` is 0, the failure mode is a local fallback of 0 replicas, or
    /// `deny_cache_max_age` or `deny_cache_recheck` is set without a deny cache.
    pub fn build(self) -> Result<ResilientStore<S>, ConfigError> {
        for (field, value) in [
            ("timeout", self.timeout),
            ("circuit_breaker.cooldown", self.cooldown),
            ("deny_cache_max_age", self.deny_cache_max_age),
            ("deny_cache_recheck", self.deny_cache_recheck),
        ] {
            if value < Duration::from_millis(1) || value > MAX_SETTING {
                return Err(ConfigError::new(
                    field,
                    format_args!("{value:?}"),
                    "from 1 ms to 1 day",
                ));
            }
        }
        if self.threshold == 0 {
            return Err(ConfigError::new(
                "circuit_breaker.failures",
                0,
                "at least 1 failure",
            ));
        }
        if let (None, Some((field, value))) = (self.deny_cache, self.deny_cache_tuned) {
            return Err(ConfigError::new(
                field,
                format_args!("{value:?}"),
                "only a deny cache reads it: turn one on with deny_cache(entries), or delete this setting",
            ));
        }
        if self.mode == (FailureMode::LocalFallback { replicas: 0 }) {
            return Err(ConfigError::new(
                "failure_mode",
                "LocalFallback { replicas: 0 }",
                "replicas is how many instances share each limit: at least 1",
            ));
        }
        let clock = self.clock;
        Ok(ResilientStore {
            inner: Arc::new(Inner {
                primary: self.primary,
                mode: self.mode,
                timeout: self.timeout,
                breaker: Breaker {
                    threshold: self.threshold,
                    cooldown_ms: self.cooldown.as_millis().try_into().unwrap_or(u64::MAX),
                    failures: AtomicU32::new(0),
                    open_until: AtomicU64::new(0),
                    probing: AtomicBool::new(false),
                    probe_started: AtomicU64::new(0),
                },
                deny_cache: self
                    .deny_cache
                    .map(|n| DenyCache::new(n, self.deny_cache_max_age, self.deny_cache_recheck)),
                followed: Default::default(),
                fallback: MemoryStore::builder()
                    .clock(ClockRef(clock.clone()))
                    .build()?,
                fallback_policies: RwLock::new(HashMap::new()),
                clock,
                warned_at: AtomicU64::new(0),
                suppressed: AtomicU64::new(0),
            }),
        })
    }
}

#[derive(Debug)]
struct ClockRef(Arc<dyn Clock>);

impl Clock for ClockRef {
    fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }
    fn is_injected(&self) -> bool {
        self.0.is_injected()
    }
}
