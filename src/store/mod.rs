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
//! * `RedisSentinelStore` (feature `sentinel`): the same on the master Sentinel names,
//!   followed across failovers.
//! * [`LeasedStore`](leased::LeasedStore): wraps a shared store and decides hot keys locally
//!   from blocks of quota leased from it, never exceeding the limit across instances.
//!
//! # Operations as values
//!
//! A store does two things: the hot path's charge ([`Store::check`], with a future of its own
//! type) and every other operation as a value ([`Store::apply`] of an [`Op`]: peek, refund,
//! settle, release, refresh, reset, or a check). [`StoreExt`] gives each operation a method
//! of its own (`store.peek(..)`, `store.refund(..)`), as tower's `ServiceExt` does for
//! services. Per-key overrides live behind [`OverrideStore`].
//!
//! A wrapper forwards `check` and `apply` and adds what it is for. This one counts the
//! operations that reach the store:
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use tollgate::key::Key;
//! use tollgate::store::{ApplyFuture, MemoryStore, Op, OverrideStore, Store};
//! use tollgate::Policy;
//!
//! #[derive(Debug, Clone, Default)]
//! struct Counted {
//!     inner: MemoryStore,
//!     operations: Arc<AtomicU64>,
//! }
//!
//! impl Store for Counted {
//!     type CheckFuture = <MemoryStore as Store>::CheckFuture;
//!
//!     fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
//!         self.operations.fetch_add(1, Ordering::Relaxed);
//!         self.inner.check(key, policies, costs)
//!     }
//!
//!     fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
//!         self.operations.fetch_add(1, Ordering::Relaxed);
//!         self.inner.apply(key, policies, op)
//!     }
//!
//!     fn override_store(&self) -> Option<&dyn OverrideStore> {
//!         self.inner.override_store()
//!     }
//!
//!     fn now_millis(&self) -> u64 {
//!         self.inner.now_millis()
//!     }
//!
//!     fn name(&self) -> &'static str {
//!         "counted"
//!     }
//!
//!     // Forwarded, so that a policy's failure mode on a plain store is refused when built.
//!     fn applies_failure_modes(&self) -> bool {
//!         self.inner.applies_failure_modes()
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use tollgate::store::StoreExt;
//! use tollgate::Rate;
//!
//! let store = Counted::default();
//! let api = [Policy::new("api", Rate::per_minute(10))?];
//! let key = Key::new("user", "client-1");
//! store.check(&key, &api, &[1]).await?;
//! store.refund(&key, &api, &[1]).await?;
//! assert_eq!(store.peek(&key, &api, &[1]).await?.remaining(), 9);
//! assert_eq!(store.operations.load(Ordering::Relaxed), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

pub mod leased;
pub mod memory;
mod op;
mod override_store;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "regions")]
pub mod regions;
pub mod resilient;

#[cfg(feature = "cluster")]
pub use self::redis::cluster;
#[cfg(feature = "sentinel")]
pub use self::redis::sentinel;
#[cfg(feature = "cluster")]
pub use self::redis::RedisClusterStore;
#[cfg(feature = "sentinel")]
pub use self::redis::RedisSentinelStore;
#[cfg(feature = "redis")]
pub use self::redis::{RedisStore, RedisStoreBuilder};
pub use memory::{MemoryCheck, MemoryStore, MemoryStoreBuilder};
pub use op::{Applied, Costs, Op};
pub(crate) use override_store::no_overrides;
pub use override_store::OverrideStore;
pub use resilient::{FailureMode, ResilientStore, ResilientStoreBuilder};

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::Policy;

/// A boxed future, for the store operations that are off the hot path.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The future of [`Store::apply`].
pub type ApplyFuture = BoxFuture<Result<Applied, StoreError>>;

/// What [`Store::check_now`] answers: the decision (or the store's error) when the store
/// gives it without waiting, `None` when it must wait (nothing was charged: ask
/// [`Store::check`]).
pub type AnswerNow = Option<Result<Decision, StoreError>>;

/// A backend that keeps limiter state and decides atomically.
///
/// A small core: the hot path's charge ([`check`](Store::check), and
/// [`check_now`](Store::check_now) for stores that answer without waiting), one method that
/// applies any [`Op`] to a key's policies ([`apply`](Store::apply)), and per-key overrides
/// behind a trait of their own ([`override_store`](Store::override_store)). A wrapper
/// forwards these; the named operations users call (`peek`, `refund`, `settle`, `reset`, …)
/// are [`StoreExt`]'s, built on `apply`.
///
/// Implementations must give the same answers as the pure functions in
/// [`crate::algorithm`] for the same sequence of operations and times.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// The future of [`check`](Store::check).
    type CheckFuture: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Decides a request of `costs[i]` units against `policies[i]` for every `i` (the slices
    /// have equal length), charging all of them only if every one allows: [`Op::Check`] on
    /// the hot path, with a future of its own type.
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
    fn check_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow {
        let _ = (key, policies, costs);
        None
    }

    /// Applies `op` to `key`'s state under `policies`, in one atomic step; see [`Op`] for
    /// what each operation does, and [`StoreExt`] for each by name.
    ///
    /// An operation whose costs do not number one per policy is answered with
    /// [`StoreError::Protocol`], touching nothing.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::key::Key;
    /// use tollgate::store::{MemoryStore, Op, Store};
    /// use tollgate::{Policy, Rate};
    ///
    /// let store = MemoryStore::new();
    /// let api = [Policy::new("api", Rate::per_minute(1))?];
    /// let key = Key::new("user", "client-1");
    /// assert!(store.check(&key, &api, &[1]).await?.is_allowed());
    /// store.apply(&key, &api, Op::refund([1])).await?;
    /// let seen = store.apply(&key, &api, Op::peek([1])).await?.into_decision();
    /// assert!(seen.expect("a peek decides").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture;

    /// Where this store keeps per-key [overrides](crate::overrides); `None`, the default,
    /// for a store that keeps none.
    fn override_store(&self) -> Option<&dyn OverrideStore> {
        None
    }

    /// The store's time in milliseconds since the Unix epoch, used to render absolute reset
    /// times in headers.
    fn now_millis(&self) -> u64;

    /// A short name for logs and metrics (`memory`, `redis`, …).
    fn name(&self) -> &'static str;

    /// A number that changes when the store notices it may have lost the state it held (a
    /// Redis server that answers with a new `run_id` after a restart or a failover), so that
    /// anything caching the store's answers (the [`ResilientStore`] deny cache, a
    /// [`LeasedStore`](crate::store::leased::LeasedStore)'s blocks) can drop them. The
    /// default, for stores that cannot lose state behind the caller's back, is 0.
    ///
    /// A Redis store on one server (a URL, a pool, Sentinel's master) reads the server's
    /// `run_id` on the first call after a connection failure, after a `NOSCRIPT`, after
    /// Sentinel names another master, and in any case once a second while calls go through:
    /// a restart no call failed on (a pool that replaced a dead connection while recycling
    /// it, a RESP3 connection that reconnected on the server's notice) is seen within a
    /// second of calls. A Redis Cluster store's generation stays 0 (its nodes answer `INFO`
    /// for themselves only).
    ///
    /// ```
    /// use tollgate::store::{MemoryStore, Store};
    ///
    /// assert_eq!(MemoryStore::new().generation(), 0);
    /// ```
    fn generation(&self) -> u64 {
        0
    }

    /// Whether this store may answer by a [failure mode](FailureMode) when its backend fails,
    /// and so read a policy's own ([`PolicyBuilder::failure_mode`](crate::PolicyBuilder::failure_mode)).
    /// A limiter whose policies set a failure mode on a store that says `false` is refused
    /// when built (nothing would read the setting). tollgate's own stores say `false`, but
    /// [`ResilientStore`] and [`DynStore`] (which asks the store it holds); the default is
    /// `true`, so that a wrapper of your own around a `ResilientStore` keeps its policies'
    /// modes without saying so (a wrapper around another store may forward this to be
    /// checked too).
    ///
    /// ```
    /// use tollgate::store::{FailureMode, MemoryStore, ResilientStore, Store};
    ///
    /// assert!(!MemoryStore::new().applies_failure_modes());
    /// let resilient = ResilientStore::builder(MemoryStore::new(), FailureMode::FailOpen).build()?;
    /// assert!(resilient.applies_failure_modes());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    fn applies_failure_modes(&self) -> bool {
        true
    }

    /// The failure mode this store decides by when its backend fails, for policies that set
    /// none: [`ResilientStore`]'s, [`DynStore`]'s store's; `None` for a store that does not
    /// say (the default) or never answers by one. The login guard reads it: its limits fail
    /// closed where the store would fail open.
    ///
    /// ```
    /// use tollgate::store::{FailureMode, MemoryStore, ResilientStore, Store};
    ///
    /// assert_eq!(MemoryStore::new().failure_mode(), None);
    /// let resilient = ResilientStore::builder(MemoryStore::new(), FailureMode::FailOpen).build()?;
    /// assert_eq!(resilient.failure_mode(), Some(FailureMode::FailOpen));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    fn failure_mode(&self) -> Option<FailureMode> {
        None
    }
}

/// The operations of a [`Store`] by name, each one [`Op`] given to
/// [`apply`](Store::apply) — as tower's `ServiceExt` is to `Service`. Every store has them.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use tollgate::key::Key;
/// use tollgate::store::{MemoryStore, Store, StoreExt};
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
pub trait StoreExt: Store {
    /// What [`check`](Store::check) would answer now, charging nothing ([`Op::Peek`]).
    fn peek(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>> {
        let call = self.apply(key, policies, Op::peek(costs));
        Box::pin(async move {
            call.await?.into_decision().ok_or_else(|| {
                StoreError::Protocol(crate::error::Cause::from("a peek answered no decision"))
            })
        })
    }

    /// Gives back up to `costs[i]` units just charged to `policies[i]` ([`Op::Refund`]).
    fn refund(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<(), StoreError>> {
        done(self.apply(key, policies, Op::refund(costs)))
    }

    /// Settles costs known only after the response ([`Op::Settle`], which states the bound
    /// on what a key is served).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::key::Key;
    /// use tollgate::store::{MemoryStore, Store, StoreExt};
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
    ) -> BoxFuture<Result<(), StoreError>> {
        done(self.apply(key, policies, Op::settle(reserved, actual)))
    }

    /// Gives back the slot `slot` a request held under each of `policies` ([`Op::Release`]).
    fn release(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> BoxFuture<Result<(), StoreError>> {
        done(self.apply(key, policies, Op::Release { slot }))
    }

    /// Extends the lease of a held slot ([`Op::Refresh`]).
    fn refresh(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> BoxFuture<Result<(), StoreError>> {
        done(self.apply(key, policies, Op::Refresh { slot }))
    }

    /// Forgets the key's state for these policies ([`Op::Reset`]).
    fn reset(&self, key: &Key, policies: &[Policy]) -> BoxFuture<Result<(), StoreError>> {
        done(self.apply(key, policies, Op::Reset))
    }

    /// Sets a per-key override ([`OverrideStore::set`]); fails on a store that keeps none.
    fn set_override(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        match self.override_store() {
            Some(o) => o.set(key, policy, ttl),
            None => Box::pin(std::future::ready(Err(no_overrides(self.name())))),
        }
    }

    /// Removes a per-key override ([`OverrideStore::remove`]); fails on a store that keeps
    /// none.
    fn remove_override(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        match self.override_store() {
            Some(o) => o.remove(key, policy),
            None => Box::pin(std::future::ready(Err(no_overrides(self.name())))),
        }
    }

    /// `key`'s overrides in force among `policies` ([`OverrideStore::list`]); fails on a
    /// store that keeps none.
    fn overrides(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        match self.override_store() {
            Some(o) => o.list(key, policies),
            None => Box::pin(std::future::ready(Err(no_overrides(self.name())))),
        }
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// Runs `work` to its end whoever waits for it: in a task of its own where there is a
/// runtime, so that a caller who stops waiting (a timeout, a client that hangs up) does not
/// cut it short; otherwise here. `None` when the task did not finish (it panicked, or its
/// runtime shut down).
pub(crate) async fn to_the_end<F>(work: F) -> Option<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime.spawn(work).await.ok(),
        Err(_) => Some(work.await),
    }
}

/// An operation's answer, its decision (if any) dropped.
fn done(call: ApplyFuture) -> BoxFuture<Result<(), StoreError>> {
    Box::pin(async move { call.await.map(drop) })
}

/// [`Store::check`] as an [`Op::Check`]'s answer: how a store's `apply` charges.
pub(crate) fn check_applied<S: Store + ?Sized>(
    store: &S,
    key: &Key,
    policies: &[Policy],
    costs: &[u64],
) -> ApplyFuture {
    let call = store.check(key, policies, costs);
    Box::pin(async move { call.await.map(Applied::Decision) })
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
    fn check_now_erased(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow;
    fn apply_erased(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture;
    fn override_store_erased(&self) -> Option<&dyn OverrideStore>;
    fn now(&self) -> u64;
    fn store_name(&self) -> &'static str;
    fn store_generation(&self) -> u64;
    fn store_applies_failure_modes(&self) -> bool;
    fn store_failure_mode(&self) -> Option<FailureMode>;
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
    fn check_now_erased(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow {
        self.check_now(key, policies, costs)
    }
    fn apply_erased(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        self.apply(key, policies, op)
    }
    fn override_store_erased(&self) -> Option<&dyn OverrideStore> {
        self.override_store()
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
    fn store_applies_failure_modes(&self) -> bool {
        self.applies_failure_modes()
    }
    fn store_failure_mode(&self) -> Option<FailureMode> {
        self.failure_mode()
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

    fn check_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow {
        self.inner.check_now_erased(key, policies, costs)
    }

    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        self.inner.apply_erased(key, policies, op)
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        self.inner.override_store_erased()
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

    fn applies_failure_modes(&self) -> bool {
        self.inner.store_applies_failure_modes()
    }

    fn failure_mode(&self) -> Option<FailureMode> {
        self.inner.store_failure_mode()
    }
}
