//! `MemoryLedger`: the ledger in the process, for tests and single-instance use.

use super::*;

/// A lease ledger in process memory, with a [`MemoryStore`] for the policies that are not
/// leased: the shared state of several [`LeasedStore`](crate::store::leased::LeasedStore)s of one process,
/// standing for a Redis shared by several instances (tests, simulations, the proptest of
/// the interval bounds).
///
/// Clones share the ledger.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::key::Key;
/// use tollgate::store::leased::{LeasedStore, MemoryLedger};
/// use tollgate::store::Store;
/// use tollgate::{Policy, Rate};
///
/// let ledger = MemoryLedger::new();
/// let a = LeasedStore::new(ledger.clone());
/// let b = LeasedStore::new(ledger);
/// let policy = [Policy::new("api", Rate::per_minute(2))?];
/// let key = Key::new("user", "1");
/// assert!(a.check(&key, &policy, &[1]).await?.is_allowed());
/// assert!(b.check(&key, &policy, &[1]).await?.is_allowed());
/// assert!(!a.check(&key, &policy, &[1]).await?.is_allowed()); // shared: 2 per minute in all
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct MemoryLedger {
    states: Arc<parking_lot::Mutex<HashMap<String, LState>>>,
    clock: Arc<dyn Clock>,
    exact: MemoryStore,
}

impl fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLedger")
            .field("states", &self.states.lock().len())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Default for MemoryLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLedger {
    /// A ledger on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }

    /// A ledger on `clock` (a [`ManualClock`](crate::clock::ManualClock) in tests); give the
    /// [`LeasedStore`](crate::store::leased::LeasedStore)s the same clock.
    ///
    /// ```
    /// use tollgate::clock::ManualClock;
    /// use tollgate::store::leased::MemoryLedger;
    /// use tollgate::store::Store;
    ///
    /// let ledger = MemoryLedger::with_clock(ManualClock::new(5_000));
    /// assert_eq!(ledger.now_millis(), 5_000);
    /// ```
    pub fn with_clock(clock: impl Clock + Clone) -> Self {
        let exact = MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .unwrap_or_else(|_| MemoryStore::new());
        Self {
            states: Arc::default(),
            exact,
            clock: Arc::new(clock),
        }
    }

    fn call(&self, key: &Key, policies: &[Policy], call: &LedgerCall) -> LedgerReply {
        let now = self.clock.now_millis();
        let names: SmallVec<[String; 2]> = policies
            .iter()
            .zip(&call.parts)
            .map(|(p, part)| ledger_key("", key, p.name(), part.kind))
            .collect();
        let mut map = self.states.lock();
        let mut states: SmallVec<[Option<LState>; 2]> =
            names.iter().map(|n| map.remove(n)).collect();
        let reply = run(call, &mut states, now);
        for (name, state) in names.into_iter().zip(states) {
            if let Some(s) = state {
                map.insert(name, s);
            }
        }
        reply
    }
}

impl LeaseBackend for MemoryLedger {
    fn ledger(
        &self,
        key: &Key,
        policies: &[Policy],
        call: LedgerCall,
    ) -> BoxFuture<Result<LedgerReply, StoreError>> {
        let reply = self.call(key, policies, &call);
        Box::pin(std::future::ready(Ok(reply)))
    }
}

impl Store for MemoryLedger {
    type CheckFuture = <MemoryStore as Store>::CheckFuture;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        self.exact.check(key, policies, costs)
    }

    fn check_now(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Option<Result<Decision, StoreError>> {
        self.exact.check_now(key, policies, costs)
    }

    fn peek(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>> {
        self.exact.peek(key, policies, costs)
    }

    fn refund(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<(), StoreError>> {
        self.exact.refund(key, policies, costs)
    }

    fn settle(
        &self,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> BoxFuture<Result<(), StoreError>> {
        self.exact.settle(key, policies, reserved, actual)
    }

    fn release(
        &self,
        key: &Key,
        policies: &[Policy],
        slot: u64,
    ) -> BoxFuture<Result<(), StoreError>> {
        self.exact.release(key, policies, slot)
    }

    fn reset(&self, key: &Key, policies: &[Policy]) -> BoxFuture<Result<(), StoreError>> {
        {
            let mut map = self.states.lock();
            for p in policies {
                if let Some(kind) = Kind::of(p) {
                    map.remove(&ledger_key("", key, p.name(), kind));
                }
            }
        }
        self.exact.reset(key, policies)
    }

    fn overrides(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        self.exact.overrides(key, policies)
    }

    fn now_millis(&self) -> u64 {
        self.clock.now_millis()
    }

    fn name(&self) -> &'static str {
        "memory-ledger"
    }
}
