//! Where limiter state lives.
//!
//! A [`Store`] decides a request for one key against one or more policies, atomically and all
//! or nothing: every policy is evaluated first, and only if all allow is any of them charged.
//!
//! * [`MemoryStore`]: in-process, sharded, bounded; the embedded default. Per instance only:
//!   N replicas each allow the full limit.
//! * [`ResilientStore`]: wraps a shared store with a timeout, a circuit breaker, a local deny
//!   cache and a failure mode (fail open, fail closed, local fallback).
//! * `RedisStore` (feature `redis`): one Redis server shared by every instance; one round trip
//!   per decision.
//! * `RedisClusterStore` (feature `cluster`): the same on a Redis Cluster.
//! * [`LeasedStore`](leased::LeasedStore): wraps a shared store and decides hot keys locally
//!   from blocks of quota leased from it, never exceeding the limit across instances.

pub mod leased;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod resilient;

#[cfg(feature = "cluster")]
pub use self::redis::cluster;
#[cfg(feature = "cluster")]
pub use self::redis::RedisClusterStore;
#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder};
pub use memory::{MemoryCheck, MemoryStore, MemoryStoreBuilder};
pub use resilient::{FailureMode, ResilientStore, ResilientStoreBuilder};

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use smallvec::SmallVec;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::Policy;

/// A boxed future, for the store operations that are off the hot path.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A backend that keeps limiter state and decides atomically.
///
/// Implementations must give the same answers as the pure functions in
/// [`crate::algorithm`] for the same sequence of calls and times.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// The future of [`check`](Store::check).
    type CheckFuture: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Decides a request of `costs[i]` units against `policies[i]` for every `i` (the slices
    /// have equal length), charging all of them only if every one allows.
    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture;

    /// The answer of [`check`](Store::check), when this store can give it without waiting;
    /// `None`, the default, when it must be awaited.
    ///
    /// The layer asks this first: given an answer, it calls the inner service from `call`
    /// itself instead of from a future, which saves a state change and moving the request per
    /// request. `Some` must charge exactly as `check` would; `None` must charge nothing (the
    /// caller goes on to `check`). [`MemoryStore`] always answers; network stores do not.
    ///
    /// ```
    /// use tollgate::key::Key;
    /// use tollgate::store::{MemoryStore, Store};
    /// use tollgate::{Policy, Rate};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new("api", Rate::per_second(1))?;
    /// let key = Key::new("user", "client-1");
    /// let first = store.check_now(&key, std::slice::from_ref(&policy), &[1]);
    /// assert!(first.expect("the memory store never waits").expect("no error").is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    fn check_now(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Option<Result<Decision, StoreError>> {
        let _ = (key, policies, costs);
        None
    }

    /// What [`check`](Store::check) would answer now, charging nothing.
    fn peek(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>>;

    /// Gives back up to `costs[i]` units just charged to `policies[i]` for every `i` (the
    /// slices have equal length): for a request that turned out not to count after
    /// [`check`](Store::check) charged it (a login that succeeded), or whose cost is settled
    /// after the response.
    ///
    /// Each policy's state gets the refund its algorithm defines (see
    /// [`crate::algorithm`]): the units come off what is still counted, never more than
    /// `costs[i]` and never below a fresh state, so a refund cannot hand out more than a
    /// fresh client would get. A refund for a key with no state changes nothing. A refund
    /// made long after its charge (past a window boundary, or after the state refilled) may
    /// give back less, or units of other requests; each algorithm states its bound. Call it
    /// at most once per charge: a second refund gives back units other requests were charged.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::key::Key;
    /// use tollgate::store::{MemoryStore, Store};
    /// use tollgate::{Policy, Rate};
    ///
    /// let store = MemoryStore::new();
    /// let policy = [Policy::new("api", Rate::per_minute(1))?];
    /// let key = Key::new("user", "client-1");
    /// assert!(store.check(&key, &policy, &[1]).await?.is_allowed());
    /// assert!(!store.peek(&key, &policy, &[1]).await?.is_allowed());
    /// store.refund(&key, &policy, &[1]).await?;
    /// assert!(store.check(&key, &policy, &[1]).await?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    fn refund(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<(), StoreError>>;

    /// Settles costs known only after the response: `reserved[i]` units were charged to
    /// `policies[i]` by [`check`](Store::check), and the request turned out to cost
    /// `actual[i]`. The difference is refunded when the actual cost is lower (as
    /// [`refund`](Store::refund) does) or charged when it is higher, whether or not it fits,
    /// all in one atomic step. Any `u64` is taken, saturating: a difference is never wrapped
    /// or rounded into a refund, and every store answers alike.
    ///
    /// **An extra charge is never forgiven.** It is charged in full, even far past the
    /// limit: the excess is a debt the key pays back at its policy's rate (`N` units per
    /// window) before it is admitted again (each algorithm's
    /// [`overcharge`](crate::algorithm::LimitAlgorithm::overcharge) says how it keeps it). A
    /// debt saturates at ⌊2^52 / W⌋ units, W the window in ms
    /// ([`MAX_USAGE_WINDOW_PRODUCT`](crate::algorithm::MAX_USAGE_WINDOW_PRODUCT)): a
    /// settlement of `u64::MAX` keeps the key refused for about 2^52 / N ms, until it is
    /// [`reset`](Store::reset).
    ///
    /// **The bound.** A reservation is admitted only with room for it (a
    /// [`Limiter`](crate::Limiter) reserves at least one unit, so a spent budget refuses an
    /// estimate of 0 too). So for a key whose requests are each settled before the next is
    /// reserved, the units served — the actual costs of its admitted requests — over a span
    /// are at most, with `N` the limit per window of `W` ms, `C` the capacity and `o` the
    /// overshoot (actual cost less reservation) of the last request admitted in the span:
    ///
    /// | algorithm | over `j` whole windows (aligned to the epoch) | over any `j·W` ms |
    /// |---|---|---|
    /// | fixed window | `j·N + o` | `(j + 1)·N + o` |
    /// | sliding window counter | `j·N + o` | `(j + 1)·N + o` |
    /// | sliding window log | `j·N + o` | `j·N + o` |
    /// | token bucket, GCRA | `C + j·N + o` | `C + j·N + o` (any `L` ms: `C + N·L/W + o`) |
    ///
    /// Requests reserved together (concurrent ones) are each admitted against the others'
    /// reservations only, so a span can serve the overshoots of all of them; the debt they
    /// leave is then paid back over the following windows, so over the long run a key is
    /// served at most `N` per window whatever it sends.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::key::Key;
    /// use tollgate::store::{MemoryStore, Store};
    /// use tollgate::{Policy, Rate};
    ///
    /// let store = MemoryStore::new();
    /// let tokens = [Policy::new("tokens", Rate::per_minute(1000))?];
    /// let key = Key::new("user", "client-1");
    /// assert_eq!(store.check(&key, &tokens, &[500]).await?.remaining(), 500);
    /// store.settle(&key, &tokens, &[500], &[120]).await?; // 380 units back
    /// assert_eq!(store.peek(&key, &tokens, &[0]).await?.remaining(), 880);
    /// store.settle(&key, &tokens, &[0], &[5000]).await?;  // charged in full: a debt
    /// assert_eq!(store.peek(&key, &tokens, &[0]).await?.remaining(), 0);
    /// assert!(!store.peek(&key, &tokens, &[1]).await?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    fn settle(
        &self,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> BoxFuture<Result<(), StoreError>>;

    /// Gives back the slot a request held under each of `policies` (all
    /// [in-flight](crate::Algorithm::InFlight)); `slot` is the request's
    /// [`Decision::slot`]. The default gives back one unit of each, which is exact for stores
    /// that count slots rather than name them.
    fn release(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> BoxFuture<Result<(), StoreError>> {
        let _ = slot;
        let ones: SmallVec<[u64; 2]> = policies.iter().map(|_| 1).collect();
        self.refund(key, policies, &ones)
    }

    /// Extends the lease of a held slot (see [`release`](Store::release)), for stores whose
    /// slots expire unless refreshed (Redis); `None`, the default, when slots never expire.
    fn refresh(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> Option<BoxFuture<Result<(), StoreError>>> {
        let _ = (key, policies, slot);
        None
    }

    /// Forgets the key's state for these policies: its next request starts afresh.
    fn reset(&self, key: &Key, policies: &[Policy]) -> BoxFuture<Result<(), StoreError>>;

    /// Decides `key`'s requests under `policy` (by name and algorithm) with `policy`'s
    /// limit and capacity from now on — a per-key [override](crate::overrides) — until
    /// `ttl` ends (`None`: until removed). The default, for stores that keep no overrides,
    /// fails.
    fn set_override(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let _ = (key, policy, ttl);
        Box::pin(std::future::ready(Err(no_overrides(self.name()))))
    }

    /// Removes `key`'s override of `policy`, if any: the plan's limit applies again.
    fn remove_override(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        let _ = (key, policy);
        Box::pin(std::future::ready(Err(no_overrides(self.name()))))
    }

    /// `key`'s overrides in force among `policies`.
    fn overrides(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        let _ = (key, policies);
        Box::pin(std::future::ready(Err(no_overrides(self.name()))))
    }

    /// The store's time in milliseconds since the Unix epoch, used to render absolute reset
    /// times in headers.
    fn now_millis(&self) -> u64;

    /// A short name for logs and metrics (`memory`, `redis`, …).
    fn name(&self) -> &'static str;

    /// A number that changes when the store notices it may have lost the state it held (a
    /// Redis server that answers with a new `run_id` after a restart or a failover), so that
    /// anything caching the store's answers (the [`ResilientStore`] deny cache) can drop
    /// them. The default, for stores that cannot lose state behind the caller's back, is 0.
    ///
    /// ```
    /// use tollgate::store::{MemoryStore, Store};
    ///
    /// assert_eq!(MemoryStore::new().generation(), 0);
    /// ```
    fn generation(&self) -> u64 {
        0
    }
}

/// The error of a store that keeps no overrides.
fn no_overrides(store: &str) -> StoreError {
    StoreError::Backend(crate::error::Cause::from(format!(
        "the {store} store keeps no per-key overrides"
    )))
}

/// Any store behind one type, for limiters whose store is chosen at run time (a config file).
///
/// Each check allocates one boxed future; build with a concrete store type when that matters.
///
/// ```
/// use tollgate::store::{DynStore, MemoryStore, Store};
///
/// let store = DynStore::new(MemoryStore::new());
/// assert_eq!(store.name(), "memory");
/// ```
#[derive(Clone)]
pub struct DynStore {
    inner: std::sync::Arc<dyn ErasedStore>,
}

impl fmt::Debug for DynStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DynStore").field(&self.inner).finish()
    }
}

trait ErasedStore: Send + Sync + fmt::Debug + 'static {
    fn check_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>>;
    fn check_now_erased(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Option<Result<Decision, StoreError>>;
    fn peek_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>>;
    fn refund_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<(), StoreError>>;
    fn reset_boxed(&self, key: &Key, policies: &[Policy]) -> BoxFuture<Result<(), StoreError>>;
    fn settle_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> BoxFuture<Result<(), StoreError>>;
    fn release_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> BoxFuture<Result<(), StoreError>>;
    fn refresh_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> Option<BoxFuture<Result<(), StoreError>>>;
    fn set_override_boxed(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<Result<(), StoreError>>;
    fn remove_override_boxed(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> BoxFuture<Result<(), StoreError>>;
    fn overrides_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>>;
    fn now(&self) -> u64;
    fn store_name(&self) -> &'static str;
    fn store_generation(&self) -> u64;
}

impl<S: Store> ErasedStore for S {
    fn check_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>> {
        Box::pin(self.check(key, policies, costs))
    }
    fn check_now_erased(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Option<Result<Decision, StoreError>> {
        self.check_now(key, policies, costs)
    }
    fn peek_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>> {
        self.peek(key, policies, costs)
    }
    fn refund_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<(), StoreError>> {
        self.refund(key, policies, costs)
    }
    fn reset_boxed(&self, key: &Key, policies: &[Policy]) -> BoxFuture<Result<(), StoreError>> {
        self.reset(key, policies)
    }
    fn settle_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> BoxFuture<Result<(), StoreError>> {
        self.settle(key, policies, reserved, actual)
    }
    fn release_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> BoxFuture<Result<(), StoreError>> {
        self.release(key, policies, slot)
    }
    fn refresh_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> Option<BoxFuture<Result<(), StoreError>>> {
        self.refresh(key, policies, slot)
    }
    fn set_override_boxed(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        self.set_override(key, policy, ttl)
    }
    fn remove_override_boxed(
        &self,
        key: &Key,
        policy: &Policy,
    ) -> BoxFuture<Result<(), StoreError>> {
        self.remove_override(key, policy)
    }
    fn overrides_boxed(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        self.overrides(key, policies)
    }
    fn now(&self) -> u64 {
        self.now_millis()
    }
    fn store_name(&self) -> &'static str {
        self.name()
    }
    fn store_generation(&self) -> u64 {
        self.generation()
    }
}

impl DynStore {
    /// Erases `store`'s type.
    pub fn new(store: impl Store) -> Self {
        Self {
            inner: std::sync::Arc::new(store),
        }
    }
}

impl Store for DynStore {
    type CheckFuture = BoxFuture<Result<Decision, StoreError>>;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        self.inner.check_boxed(key, policies, costs)
    }

    fn check_now(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Option<Result<Decision, StoreError>> {
        self.inner.check_now_erased(key, policies, costs)
    }

    fn peek(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>> {
        self.inner.peek_boxed(key, policies, costs)
    }

    fn refund(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<(), StoreError>> {
        self.inner.refund_boxed(key, policies, costs)
    }

    fn reset(&self, key: &Key, policies: &[Policy]) -> BoxFuture<Result<(), StoreError>> {
        self.inner.reset_boxed(key, policies)
    }

    fn settle(
        &self,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> BoxFuture<Result<(), StoreError>> {
        self.inner.settle_boxed(key, policies, reserved, actual)
    }

    fn release(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> BoxFuture<Result<(), StoreError>> {
        self.inner.release_boxed(key, policies, slot)
    }

    fn refresh(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> Option<BoxFuture<Result<(), StoreError>>> {
        self.inner.refresh_boxed(key, policies, slot)
    }

    fn set_override(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        self.inner.set_override_boxed(key, policy, ttl)
    }

    fn remove_override(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        self.inner.remove_override_boxed(key, policy)
    }

    fn overrides(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        self.inner.overrides_boxed(key, policies)
    }

    fn now_millis(&self) -> u64 {
        self.inner.now()
    }

    fn name(&self) -> &'static str {
        self.inner.store_name()
    }

    fn generation(&self) -> u64 {
        self.inner.store_generation()
    }
}
