//! `MemoryLedger`: the ledger in the process, for tests and single-instance use.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use super::run::run;
use super::state::LState;
use super::{Kind, LeaseBackend, LedgerCall, LedgerReply, Override};
use crate::clock::{Clock, SystemClock};
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::{Algorithm, Policy};
use crate::store::leased::LedgerFuture;
use crate::store::{AnswerNow, ApplyFuture, Op, OverrideStore, StoreExt};
use crate::store::{BoxFuture, MemoryStore, Store};

/// A lease ledger in process memory, with a [`MemoryStore`] for the policies that are not
/// leased: the shared state of several [`LeasedStore`](crate::store::leased::LeasedStore)s of one process,
/// standing for a Redis shared by several instances (tests, simulations, the proptest of
/// the interval bounds).
///
/// Per-key [overrides](crate::overrides) of leased policies are kept here too, and read by
/// every ledger call, as the Redis ledger reads the override key next to the key's state;
/// overrides of the other policies go to the memory store. Clones share the ledger.
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
    states: Arc<parking_lot::Mutex<HashMap<StateId, LState>>>,
    /// Overrides of leased policies: by key, policy name and algorithm (as the Redis
    /// override key names them), the limit, the capacity and when it ends (ms), if it does.
    overrides: Arc<parking_lot::Mutex<HashMap<OverrideId, Kept>>>,
    clock: Arc<dyn Clock>,
    exact: MemoryStore,
}

/// Which ledger state: the key, the policy's name and the kind it is leased as (the parts
/// of its Redis key).
type StateId = (Key, Box<str>, Kind);

fn state_id(key: &Key, policy: &Policy, kind: Kind) -> StateId {
    (key.clone(), policy.name().into(), kind)
}

/// Where an override of a leased policy is kept: the key, the policy's name and algorithm.
type OverrideId = (Key, Box<str>, Algorithm);

/// An override kept: its limit, its capacity, and when it ends (ms), if it does.
type Kept = (u64, u64, Option<u64>);

fn override_id(key: &Key, policy: &Policy) -> OverrideId {
    (key.clone(), policy.name().into(), policy.algorithm())
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
            overrides: Arc::default(),
            exact,
            clock: Arc::new(clock),
        }
    }

    /// `key`'s override of `policy` in force at `now`, usable with window `w`.
    fn override_of(&self, key: &Key, policy: &Policy, now: u64, w: u64) -> Option<Override> {
        let map = self.overrides.lock();
        let &(limit, capacity, ends) = map.get(&override_id(key, policy))?;
        if ends.is_some_and(|e| e <= now) {
            return None;
        }
        Override::usable(limit, capacity, w)
    }

    fn call(&self, key: &Key, policies: &[Policy], call: &LedgerCall) -> LedgerReply {
        let now = self.clock.now_millis();
        let mut call = call.clone();
        for (p, part) in policies.iter().zip(call.parts.iter_mut()) {
            *part = part.with_override(self.override_of(key, p, now, part.window_ms));
        }
        let names: SmallVec<[StateId; 2]> = policies
            .iter()
            .zip(&call.parts)
            .map(|(p, part)| state_id(key, p, part.kind))
            .collect();
        let mut map = self.states.lock();
        let mut states: SmallVec<[Option<LState>; 2]> =
            names.iter().map(|n| map.remove(n)).collect();
        let reply = run(&call, &mut states, now);
        for (name, state) in names.into_iter().zip(states) {
            if let Some(s) = state {
                map.insert(name, s);
            }
        }
        reply
    }
}

impl LeaseBackend for MemoryLedger {
    fn ledger(&self, key: &Key, policies: &[Policy], call: LedgerCall) -> LedgerFuture {
        let reply = self.call(key, policies, &call);
        Box::pin(std::future::ready(Ok(reply)))
    }
}

impl Store for MemoryLedger {
    type CheckFuture = <MemoryStore as Store>::CheckFuture;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        self.exact.check(key, policies, costs)
    }

    fn check_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow {
        self.exact.check_now(key, policies, costs)
    }

    /// Every operation is the exact store's; a reset also forgets the ledger's states.
    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if op == Op::Reset {
            let mut map = self.states.lock();
            for p in policies {
                if let Some(kind) = Kind::of(p) {
                    map.remove(&state_id(key, p, kind));
                }
            }
        }
        self.exact.apply(key, policies, op)
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        Some(self)
    }

    fn now_millis(&self) -> u64 {
        self.clock.now_millis()
    }

    fn name(&self) -> &'static str {
        "memory-ledger"
    }

    fn applies_failure_modes(&self) -> bool {
        false
    }
}

/// Overrides of leasable policies are the ledger's; the rest are the exact store's.
impl OverrideStore for MemoryLedger {
    fn set(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<std::time::Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        if Kind::of(policy).is_none() {
            return self.exact.set_override(key, policy, ttl);
        }
        let now = self.clock.now_millis();
        let ends = ttl.map(|t| {
            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1);
            now.saturating_add(ms)
        });
        let mut map = self.overrides.lock();
        map.retain(|_, (_, _, e)| e.is_none_or(|e| e > now));
        map.insert(
            override_id(key, policy),
            (policy.limit(), policy.capacity(), ends),
        );
        Box::pin(std::future::ready(Ok(())))
    }

    fn remove(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        if Kind::of(policy).is_none() {
            return self.exact.remove_override(key, policy);
        }
        self.overrides.lock().remove(&override_id(key, policy));
        Box::pin(std::future::ready(Ok(())))
    }

    fn list(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        let now = self.clock.now_millis();
        let exact: Vec<Policy> = policies
            .iter()
            .filter(|p| Kind::of(p).is_none())
            .cloned()
            .collect();
        let mut found: Vec<ActiveOverride> = {
            let map = self.overrides.lock();
            policies
                .iter()
                .filter(|p| Kind::of(p).is_some())
                .filter_map(|p| {
                    let &(limit, capacity, ends) = map.get(&override_id(key, p))?;
                    if ends.is_some_and(|e| e <= now) {
                        return None;
                    }
                    let left = ends.map(|e| std::time::Duration::from_millis(e - now));
                    Some(ActiveOverride::new(
                        p.name().to_owned(),
                        limit,
                        capacity,
                        left,
                    ))
                })
                .collect()
        };
        let others = self.exact.overrides(key, &exact);
        let order: Vec<String> = policies.iter().map(|p| p.name().to_owned()).collect();
        Box::pin(async move {
            found.extend(others.await?);
            // In the order of `policies`, as the other stores list them.
            found.sort_by_key(|o| order.iter().position(|n| n == o.policy()));
            Ok(found)
        })
    }
}
