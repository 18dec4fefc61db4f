//! [`LeasedStore`] itself: the wrapped store, the blocks and refusals it holds per key, its
//! counters, and what it offers besides being a [`Store`](crate::store::Store).

use super::*;

/// A shared store that leases blocks of quota to decide hot keys locally, never exceeding
/// the limit across instances. See the [module docs](crate::store::leased).
///
/// Cheap to clone: clones share their blocks.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use tollgate::key::Key;
/// use tollgate::store::leased::{LeasedStore, MemoryLedger};
/// use tollgate::{Limiter, Policy, Rate};
///
/// // Two instances leasing from one ledger (in production: `RedisStore`, shared by every
/// // instance): together they never admit more than 10 per minute.
/// let ledger = MemoryLedger::new();
/// let instance = || -> Result<Limiter<LeasedStore<MemoryLedger>>, tollgate::ConfigError> {
///     let store = LeasedStore::builder(ledger.clone())
///         .lease_time(Duration::from_millis(200))
///         .build()?;
///     Limiter::builder()
///         .store(store)
///         .policy(Policy::new("api", Rate::per_minute(10))?)
///         .build()
/// };
/// let (a, b) = (instance()?, instance()?);
/// let key = Key::new("tenant", "acme");
/// let mut admitted = 0;
/// for i in 0..30 {
///     let limiter = if i % 2 == 0 { &a } else { &b };
///     admitted += usize::from(limiter.check(&key, 1).await?.is_allowed());
/// }
/// assert_eq!(admitted, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct LeasedStore<S> {
    pub(super) shared: Arc<Shared<S>>,
}

impl<S> Clone for LeasedStore<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LeasedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedStore")
            .field("inner", &self.shared.inner)
            .field("lease_ms", &self.shared.lease_ms)
            .field("max_block_fraction", &self.shared.fraction)
            .field("max_keys", &self.shared.max_keys)
            .finish()
    }
}

pub(super) struct Shared<S> {
    pub(super) inner: S,
    pub(super) lease_ms: u64,
    pub(super) fraction: f64,
    pub(super) max_keys: usize,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) entries: table::EntryTable,
    pub(super) next_id: AtomicU64,
    /// The units charged at the ledger outside blocks, to name their give-backs.
    pub(super) charges: super::charges::ExactCharges,
    pub(super) counters: Counters,
    pub(super) sweeper: AtomicBool,
    /// Taken by an override's set or remove for all its steps: one finishing in the
    /// background after its caller gave up cannot land between, or after, the steps of the
    /// next one.
    pub(super) overrides_in_order: Arc<tokio::sync::Mutex<()>>,
}

impl<S: LeaseBackend> LeasedStore<S> {
    /// Leases from `inner` with the default lease time and block size.
    pub fn new(inner: S) -> Self {
        match Self::builder(inner).build() {
            Ok(store) => store,
            Err(_) => unreachable!("the defaults are valid"),
        }
    }

    /// A builder for the lease time, the block size and the clock.
    pub fn builder(inner: S) -> LeasedStoreBuilder<S> {
        LeasedStoreBuilder {
            inner,
            lease_time: DEFAULT_LEASE_TIME,
            fraction: DEFAULT_MAX_BLOCK_FRACTION,
            max_keys: DEFAULT_MAX_KEYS,
            clock: None,
        }
    }

    /// The wrapped store.
    ///
    /// ```
    /// use tollgate::store::leased::{LeasedStore, MemoryLedger};
    /// use tollgate::store::Store;
    ///
    /// let store = LeasedStore::new(MemoryLedger::new());
    /// assert_eq!(store.inner().name(), "memory-ledger");
    /// ```
    pub fn inner(&self) -> &S {
        &self.shared.inner
    }

    /// The lease counters so far, and the units held now.
    ///
    /// ```
    /// use tollgate::store::leased::{LeasedStore, MemoryLedger};
    ///
    /// assert_eq!(LeasedStore::new(MemoryLedger::new()).stats().units_held, 0);
    /// ```
    pub fn stats(&self) -> LeaseStats {
        let c = &self.shared.counters;
        let (tracked_keys, held) = self.shared.entries.sum(|e| {
            e.st.lock()
                .block
                .as_ref()
                .map_or(0, |b| b.parts.iter().map(|p| p.left).max().unwrap_or(0))
        });
        let tracked_keys = tracked_keys as u64;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LeaseStats {
            grants: get(&c.grants),
            units_granted: get(&c.units_granted),
            exact_calls: get(&c.exact_calls),
            refusals: get(&c.refusals),
            local_admits: get(&c.local_admits),
            local_refusals: get(&c.local_refusals),
            units_returned: get(&c.units_returned),
            units_dropped: get(&c.units_dropped),
            units_held: held,
            tracked_keys,
            untracked: get(&c.untracked),
            first_sightings: get(&c.first_sightings),
        }
    }

    /// Gives every unused unit back to the ledger and waits for the answers: call it on
    /// graceful shutdown. A store dropped without it behaves as a crashed instance: its
    /// blocks stay charged until their window or refill frees them. The store keeps
    /// working afterwards (new blocks are leased as needed).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::store::leased::{LeasedStore, MemoryLedger};
    ///
    /// let store = LeasedStore::new(MemoryLedger::new());
    /// store.shutdown().await;
    /// assert_eq!(store.stats().units_held, 0);
    /// # });
    /// ```
    pub async fn shutdown(&self) {
        let entries = self.shared.entries.all();
        let mut returns = Vec::new();
        for e in entries {
            // A grant still running (its caller may have gone) installs its block first.
            let _refill = e.refill.lock().await;
            let block = e.st.lock().block.take();
            if let Some(b) = block {
                if let Some(fut) = self.shared.give_back(&e, b) {
                    returns.push(fut);
                }
            }
        }
        for r in returns {
            r.await;
        }
    }
}
