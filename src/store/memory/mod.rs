//! The in-process store: sharded, bounded, swept.
//!
//! State is kept per key in `S` shards (a power of two, four per core by default, at least 16),
//! each a `parking_lot::Mutex` over a dense `Vec` of entries and a `hashbrown::HashTable` of
//! 4-byte positions into it. The key is hashed once with a randomly seeded `foldhash` hasher —
//! key material is attacker-chosen, and a fixed hash would let an attacker aim every key at one
//! shard — and the hash picks both the shard and the bucket. All policies of one key live in
//! one entry, so a multi-policy decision takes one lock and is all or nothing.
//!
//! The table holds positions rather than entries because a hash table that doubles runs at
//! 44–88 % load: with entries inline, every empty bucket would cost a whole entry, while an
//! empty bucket of positions costs 5 bytes and the entries themselves stay packed.
//!
//! An entry is 72 bytes: the key (inline up to 24 bytes; longer keys are bounded by
//! [`Key::new`]), its expiry, and the state of its one policy, held inline with the policy's id
//! (keys with several policies keep a list in the same space). With the table's 5 to 11 bytes
//! per key (its load swings as it doubles), a live key costs 77 to 83 bytes of resident memory,
//! plus what the allocator keeps of the smaller arrays the shards grew out of. A key longer
//! than 24 bytes is kept on the heap beside its entry, its length rounded up by the allocator:
//! an API key's digest (`apikey:` and 32 hex, 39 bytes) or an IP and User-Agent key (up to
//! about 100 bytes) costs that much more per live key. The key cap bounds the number of keys
//! whatever their length.
//!
//! # Expiry
//!
//! Each entry knows when its state stops mattering (the end of its last window, or when its
//! bucket is full again). Expired entries are reclaimed
//! * on access: a shard is swept during a check at most once per sweep interval, and
//! * in the background: a thread (one per store, holding only a weak reference, so it ends
//!   when the store is dropped) sweeps every shard once per sweep interval (default 1 s).
//!
//! # The key cap
//!
//! [`max_keys`](MemoryStoreBuilder::max_keys) (default 1 000 000) bounds live keys; it is
//! enforced per shard (`max_keys / shards` each, rounded up), so memory stays bounded by the
//! cap however many distinct keys arrive. A new key at a full shard is still decided by its
//! policies, like any new key: to make room, the store evicts one entry, the one that carries
//! the least information among [`EVICTION_SAMPLE`] entries of the shard drawn at random (the
//! approximation Redis uses for its own eviction):
//!
//! 1. an entry whose state has expired, if the sample holds one (nothing is lost);
//! 2. else the entry whose client has used the smallest share of its limit right now (for
//!    each of its policies, the units charged and not yet recovered divided by the limit, or
//!    by the capacity for the token bucket and GCRA; the largest share over its policies);
//! 3. among equal shares, the entry that expires first.
//!
//! The work is the same whatever the shard's size: [`EVICTION_SAMPLE`] reads of random entries
//! and one removal, under the shard's lock (the `key_cap` bench compares it with an ordinary
//! insert below the cap). A flood of new keys therefore never refuses a new client, and the
//! entries it displaces are, with high probability, its own one-request keys rather than
//! clients that have used their limits.
//!
//! **Bound.** An evicted client starts afresh: it may be admitted again up to the units its
//! evicted entry held, which is exactly its usage share at eviction times its limit. That share
//! is the smallest of the sample's, so if a fraction `q` of the shard's entries use at most a
//! share `s`, an eviction takes an entry above `s` with probability at most
//! `(1 − q)^EVICTION_SAMPLE`. During a flood of one-request keys (each using `1/limit`), a
//! client holding more than that loses its state only if every sampled entry is at least as
//! heavy: with 99 % flood entries in the shard, less than 1 in 10^16 evictions. Each
//! eviction of a live entry is counted in `tollgate_memory_evictions_total` and the share it
//! held is recorded in `tollgate_memory_evicted_usage_ratio` (feature `metrics`), so a cap
//! that is too small for the real client population shows up as evictions of non-zero usage.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate::store::MemoryStore;
//!
//! let store = MemoryStore::builder()
//!     .max_keys(100_000)
//!     .sweep_interval(Duration::from_millis(500))
//!     .build()?;
//! assert_eq!(store.len(), 0);
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;

mod builder;
mod overrides;
mod shard;
mod states;
mod store_impl;

pub use builder::MemoryStoreBuilder;
pub use store_impl::MemoryCheck;

use crate::algorithm::in_flight::HELD_EXPIRY;
use crate::algorithm::{AnyState, InFlight, LimitAlgorithm};
use crate::clock::{Clock, SystemClock};
use overrides::Overrides;
use shard::{hash_key, Entry, Shard};
use states::{EntryState, EntryStates};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::{Limits, Policy};

/// How many entries of a full shard are sampled to choose the one to evict. Eight keeps an
/// eviction within a small multiple of an ordinary insert while making the eviction of a heavy
/// client in a flood vanishingly unlikely; see [The key cap](self#the-key-cap).
pub const EVICTION_SAMPLE: usize = 8;

/// The most distinct policies a shard remembers to measure usage for eviction. Entries of
/// further policies are measured by their other policies and their expiry only.
const MAX_KNOWN_POLICIES: usize = 256;

/// The in-process store. Cheap to clone: clones share state. See the
/// [module docs](crate::store::memory).
///
/// It is the default store of [`Limiter::builder`](crate::Limiter::builder); build one to set
/// its bounds, or to share one store among limiters.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::key::Key;
/// use tollgate::store::MemoryStore;
/// use tollgate::{Limiter, Policy, Rate};
///
/// // At most 100 000 keys: a flood of new keys evicts the least used, never the memory.
/// let store = MemoryStore::builder().max_keys(100_000).build()?;
/// let limiter = Limiter::builder()
///     .store(store.clone())
///     .policy(Policy::new("api", Rate::per_minute(2))?)
///     .build()?;
/// let key = Key::new("tenant", "acme");
/// assert!(limiter.check(&key, 1).await?.is_allowed());
/// assert_eq!(limiter.check(&key, 1).await?.remaining(), 0);
/// assert!(!limiter.check(&key, 1).await?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("max_keys_per_shard", &self.inner.max_keys_per_shard)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

struct Inner {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    shard_mask: u64,
    hasher: foldhash::fast::RandomState,
    clock: StoreClock,
    max_keys_per_shard: usize,
    sweep_interval_ms: u64,
    overrides: Overrides,
}

#[repr(align(128))]
struct CachePadded<T>(T);

/// The production clock held by value, so reading it (once per decision) is inlined rather
/// than a call through `dyn Clock`; any other clock behind the trait.
#[derive(Debug)]
enum StoreClock {
    System(SystemClock),
    Other(Arc<dyn Clock>),
}

impl StoreClock {
    fn new<C: Clock>(clock: C) -> Self {
        match (&clock as &dyn std::any::Any).downcast_ref::<SystemClock>() {
            Some(system) => StoreClock::System(system.clone()),
            None => StoreClock::Other(Arc::new(clock)),
        }
    }

    #[inline]
    fn now_millis(&self) -> u64 {
        match self {
            StoreClock::System(c) => c.now_millis(),
            StoreClock::Other(c) => c.now_millis(),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store with the default settings.
    pub fn new() -> Self {
        Self::builder()
            .build()
            .expect("the default memory store settings are valid")
    }

    /// A builder.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            shards: None,
            max_keys: 1_000_000,
            sweep_interval: Duration::from_secs(1),
            background_sweep: true,
            clock: StoreClock::System(SystemClock::new()),
        }
    }

    /// Live keys (including expired ones not yet reclaimed).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.0.lock().entries.len())
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reclaims every expired entry now.
    pub fn sweep(&self) {
        self.inner.sweep_all();
    }

    /// Decides synchronously; the [`Store`] methods wrap this.
    ///
    /// A new key at a full shard makes room by evicting one entry (see
    /// [The key cap](self#the-key-cap)); it is decided like any other new key.
    ///
    /// # Errors
    ///
    /// [`StoreError::Capacity`] only when a shard would hold more than `u32::MAX` entries,
    /// which the key cap prevents unless it is set above that.
    pub(crate) fn decide(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        charge: bool,
    ) -> Result<Decision, StoreError> {
        self.inner.decide(key, policies, costs, charge)
    }

    /// `policy` as `key`'s override in force now has it, if one is.
    pub(crate) fn overridden(&self, key: &Key, policy: &Policy) -> Option<Policy> {
        let now = self.inner.clock.now_millis();
        match self
            .inner
            .overrides
            .effective(key, std::slice::from_ref(policy), now)
        {
            std::borrow::Cow::Owned(mut over) => over.pop(),
            std::borrow::Cow::Borrowed(_) => None,
        }
    }

    /// Applies `change` to the key's state for each policy (with `create`, to a fresh state
    /// for a policy it has none of; otherwise such a policy is left alone), then moves the
    /// entry's expiry to what its states now need.
    fn adjust_now(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        create: bool,
        change: impl Fn(&mut AnyState, u64, &Limits, u64),
    ) {
        let inner = &self.inner;
        let now = inner.clock.now_millis();
        let hash = hash_key(&inner.hasher, key);
        let mut guard = inner.shard(hash).lock();
        let shard = &mut *guard;
        // Read under the shard's lock, so an override set meanwhile either applies here or
        // finds this change done when it extends the entry (`change_override`).
        let effective = inner.overrides.effective(key, policies, now);
        let plan = policies;
        let policies: &[Policy] = &effective;
        let mut found = shard.find(hash, key);
        if found.is_none() && create {
            let room = if shard.entries.len() >= inner.max_keys_per_shard {
                shard.evict_one(now, &inner.hasher)
            } else {
                None
            };
            let entry = Entry {
                key: key.clone(),
                expires_at: 0,
                states: EntryStates::new(),
            };
            match room {
                Some(i) => {
                    shard.put_at(i, hash, entry, &inner.hasher);
                    found = Some(i);
                }
                None => {
                    if shard.insert(hash, entry, &inner.hasher).is_ok() {
                        found = shard.find(hash, key);
                    }
                }
            }
            shard.remember(plan);
        }
        if let Some(i) = found {
            let entry = &mut shard.entries[i];
            for (p, &c) in policies.iter().zip(costs) {
                if c == 0 {
                    continue;
                }
                let at = match entry
                    .states
                    .iter()
                    .position(|s| s.policy == p.id() && s.state.algorithm() == p.algorithm())
                {
                    Some(at) => at,
                    None if !create => continue,
                    None => {
                        entry.states.push(EntryState {
                            policy: p.id(),
                            state: AnyState::fresh(p.algorithm()),
                        });
                        entry.states.len() - 1
                    }
                };
                change(&mut entry.states[at].state, now, p.limits(), c);
            }
            // A refund can only move the expiry earlier, an overcharge later, and a slot given
            // back frees its entry: recomputed for the states this call names, under the
            // plan's limits and an override's where one is in force (see `keep_for_plan`).
            // A state the call does not name keeps the entry's expiry as it was, unless that
            // was a held slot's (a release names only its in-flight policies): the other
            // states are then measured by the limits the shard knows, overrides applied, or
            // the entry would never expire once its last slot is back.
            let shard = &mut *shard;
            let entry = &mut shard.entries[i];
            let unnamed: Vec<Policy> = if entry.expires_at >= HELD_EXPIRY {
                let named = |s: &EntryState| {
                    plan.iter()
                        .any(|p| p.id() == s.policy && p.algorithm() == s.state.algorithm())
                };
                entry
                    .states
                    .iter()
                    .filter(|s| !named(s))
                    .filter_map(|s| {
                        shard
                            .known
                            .iter()
                            .find(|k| k.id() == s.policy && k.algorithm() == s.state.algorithm())
                            .cloned()
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let unnamed_in_force = inner.overrides.effective(key, &unnamed, now);
            let in_force = |s: &EntryState, plan: &[Policy], effective: &[Policy]| {
                let same = |k: &Policy| k.id() == s.policy && k.algorithm() == s.state.algorithm();
                let p = plan.iter().position(same)?;
                Some(
                    s.state
                        .expires_at(plan[p].limits())
                        .max(s.state.expires_at(effective[p].limits())),
                )
            };
            entry.expires_at = entry
                .states
                .iter()
                .map(|s| {
                    in_force(s, plan, policies)
                        .or_else(|| in_force(s, &unnamed, &unnamed_in_force))
                        .unwrap_or(entry.expires_at)
                })
                .max()
                .unwrap_or(0);
        }
    }

    fn remove(&self, key: &Key, policies: &[Policy]) {
        let inner = &self.inner;
        let hash = hash_key(&inner.hasher, key);
        let mut shard = inner.shard(hash).lock();
        if let Some(i) = shard.find(hash, key) {
            let entry = &mut shard.entries[i];
            entry
                .states
                .retain(|s| !policies.iter().any(|p| p.id() == s.policy));
            if entry.states.is_empty() {
                shard.remove_at(i, &inner.hasher);
            }
        }
    }
}

impl Inner {
    /// Sets (`Some` expiry or none) or removes (`None`) `key`'s override `policy`, under the
    /// lock of the key's shard, so that no decision sees the new rate before the key's state
    /// is brought up to date under the rate in force until now: a token bucket's refill since
    /// its last charge is put in at the rate then in force (the override being replaced, or
    /// the plan's), not at the new one. The entry is then kept at least as long as the new
    /// limits need it: a token bucket's deficit refills more slowly under a lower limit, and
    /// no decision may come to move the entry's expiry before the sweeper would forget the
    /// usage.
    fn change_override(&self, key: &Key, policy: &Policy, set: Option<Option<u64>>, now: u64) {
        let hash = hash_key(&self.hasher, key);
        let mut shard = self.shard(hash).lock();
        let one = std::slice::from_ref(policy);
        let before = match self.overrides.effective(key, one, now) {
            std::borrow::Cow::Owned(over) => *over[0].limits(),
            std::borrow::Cow::Borrowed(_) => policy.plan_limits(),
        };
        let found = shard.find(hash, key);
        if let Some(i) = found {
            if let Some(slot) = shard.entries[i]
                .states
                .iter_mut()
                .find(|s| s.policy == policy.id() && s.state.algorithm() == policy.algorithm())
            {
                slot.state.catch_up(now, &before);
            }
        }
        let after = match set {
            Some(expires) => {
                self.overrides.set(key, policy, expires, now);
                *policy.limits()
            }
            None => {
                self.overrides.remove(key, policy);
                policy.plan_limits()
            }
        };
        if let Some(i) = found {
            let entry = &mut shard.entries[i];
            if let Some(s) = entry.state_of(policy) {
                let keep = s
                    .state
                    .expires_at(&after)
                    .max(s.state.expires_at(&policy.plan_limits()));
                entry.expires_at = entry.expires_at.max(keep);
            }
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        &self.shards[((hash >> 32) & self.shard_mask) as usize].0
    }

    fn sweep_all(&self) {
        let now = self.clock.now_millis();
        for shard in self.shards.iter() {
            let mut shard = shard.0.lock();
            shard.sweep(now, self.sweep_interval_ms, &self.hasher);
        }
    }

    fn decide(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        charge: bool,
    ) -> Result<Decision, StoreError> {
        debug_assert_eq!(policies.len(), costs.len());
        let now = self.clock.now_millis();
        let hash = hash_key(&self.hasher, key);
        let mut guard = self.shard(hash).lock();
        let shard = &mut *guard;
        // Read under the shard's lock: see `adjust_now`.
        let effective = self.overrides.effective(key, policies, now);
        // With an override in force, the plan's policies too: see `keep_for_plan`.
        let plan = matches!(effective, std::borrow::Cow::Owned(_)).then_some(policies);
        let policies: &[Policy] = &effective;
        if now >= shard.next_sweep {
            shard.sweep(now, self.sweep_interval_ms, &self.hasher);
        }
        let found = shard.find(hash, key);
        if let (Some(i), [policy], [cost]) = (found, policies, costs) {
            // The common case — one policy, a known key — without the general path's
            // collections.
            let entry = &mut shard.entries[i];
            if let Some(slot) = entry
                .states
                .iter_mut()
                .find(|s| s.policy == policy.id() && s.state.algorithm() == policy.algorithm())
            {
                let (d, expires) = slot
                    .state
                    .decide_in_place(now, policy.limits(), *cost, charge);
                if let Some(expires) = expires {
                    let named = if let AnyState::InFlight(held) = &mut slot.state {
                        let named = next_local_slot();
                        // A charged request holds one slot (`InFlight::asked`).
                        held.name_after(named, 1);
                        named
                    } else {
                        0
                    };
                    entry.expires_at = entry.expires_at.max(expires);
                    if let Some(plan) = plan {
                        keep_for_plan(entry, plan);
                    }
                    if named != 0 {
                        return Ok(Decision::single(d).with_local_slot(named));
                    }
                }
                return Ok(Decision::single(d));
            }
        }
        let asked;
        let costs = match slots_asked(policies, costs, charge) {
            Some(slots) => {
                asked = slots;
                &asked[..]
            }
            None => costs,
        };
        match found {
            Some(i) => {
                let entry = &mut shard.entries[i];
                let decision = all_or_nothing(policies, costs, |p, c| match entry.state_of(p) {
                    Some(s) => s.state.evaluate(now, p.limits(), c),
                    None => AnyState::fresh(p.algorithm()).evaluate(now, p.limits(), c),
                });
                if charge && decision.is_allowed() {
                    entry.charge(now, policies, costs);
                    if let Some(plan) = plan {
                        keep_for_plan(entry, plan);
                    }
                    let decision = name_slots(entry, policies, costs, decision);
                    shard.remember(plan.unwrap_or(policies));
                    return Ok(decision);
                }
                Ok(decision)
            }
            None => {
                let decision = all_or_nothing(policies, costs, |p, c| {
                    AnyState::fresh(p.algorithm()).evaluate(now, p.limits(), c)
                });
                if charge && decision.is_allowed() {
                    let room = if shard.entries.len() >= self.max_keys_per_shard {
                        shard.evict_one(now, &self.hasher)
                    } else {
                        None
                    };
                    let mut entry = Entry {
                        key: key.clone(),
                        expires_at: 0,
                        states: EntryStates::new(),
                    };
                    entry.charge(now, policies, costs);
                    if let Some(plan) = plan {
                        keep_for_plan(&mut entry, plan);
                    }
                    shard.remember(plan.unwrap_or(policies));
                    let decision = name_slots(&mut entry, policies, costs, decision);
                    match room {
                        Some(i) => shard.put_at(i, hash, entry, &self.hasher),
                        None => shard.insert(hash, entry, &self.hasher)?,
                    }
                    return Ok(decision);
                }
                Ok(decision)
            }
        }
    }
}

/// A name for a slot the memory store hands out: unique in the process, increasing, never 0.
/// The costs of a decision with each in-flight policy's cost replaced by the slots it asks
/// for, when that changes any (`None`, the common case, when it does not): a charged request
/// holds exactly one slot whatever its cost, and one only looked at asks for one slot, or
/// none with cost 0 — as the Redis stores count them, which send a slot's name, not a cost.
#[inline]
fn slots_asked(policies: &[Policy], costs: &[u64], charge: bool) -> Option<SmallVec<[u64; 2]>> {
    let asked = |p: &Policy, c: u64| {
        if p.is_in_flight() {
            InFlight::asked(c, charge)
        } else {
            c
        }
    };
    if policies.iter().zip(costs).all(|(p, &c)| asked(p, c) == c) {
        return None;
    }
    Some(
        policies
            .iter()
            .zip(costs)
            .map(|(p, &c)| asked(p, c))
            .collect(),
    )
}

fn next_local_slot() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Names the in-flight slots an allowed charge just took in `entry` (see
/// [`InFlightState::since`](crate::algorithm::InFlightState::since)); `decision` carries the
/// name for the release. A charge of no in-flight policy is left as it is.
fn name_slots(
    entry: &mut Entry,
    policies: &[Policy],
    costs: &[u64],
    decision: Decision,
) -> Decision {
    if !policies.iter().any(Policy::is_in_flight) {
        return decision;
    }
    let named = next_local_slot();
    for (p, &c) in policies.iter().zip(costs) {
        if !p.is_in_flight() {
            continue;
        }
        if let Some(slot) = entry
            .states
            .iter_mut()
            .find(|s| s.policy == p.id() && s.state.algorithm() == p.algorithm())
        {
            if let AnyState::InFlight(held) = &mut slot.state {
                held.name_after(named, c);
            }
        }
    }
    decision.with_local_slot(named)
}

/// Keeps `entry` at least until its states stop mattering under `plan`, the policies an
/// override replaced for this decision. A token bucket's state matters until its deficit is
/// refilled, which depends on the limit: with an override, the entry is kept for the slower
/// of the two rates, because the override can end (its TTL, or removal) with no decision to
/// move the entry's expiry, and an entry forgotten too early would start full again.
fn keep_for_plan(entry: &mut Entry, plan: &[Policy]) {
    let mut expires_at = entry.expires_at;
    for p in plan {
        if let Some(s) = entry
            .states
            .iter()
            .find(|s| s.policy == p.id() && s.state.algorithm() == p.algorithm())
        {
            expires_at = expires_at.max(s.state.expires_at(p.limits()));
        }
    }
    entry.expires_at = expires_at;
}

/// Evaluates every policy; when any denies, the ones that would have allowed report their
/// state without this request's charge (nothing is charged), so their headers do not lie.
pub(crate) fn all_or_nothing(
    policies: &[Policy],
    costs: &[u64],
    evaluate: impl Fn(&Policy, u64) -> crate::algorithm::PolicyDecision,
) -> Decision {
    if let ([p], [c]) = (policies, costs) {
        return Decision::single(evaluate(p, *c));
    }
    let mut decisions: SmallVec<[crate::algorithm::PolicyDecision; 2]> = policies
        .iter()
        .zip(costs)
        .map(|(p, &c)| evaluate(p, c))
        .collect();
    if decisions.iter().any(|d| !d.is_allowed()) {
        for (d, p) in decisions.iter_mut().zip(policies) {
            if d.is_allowed() {
                *d = evaluate(p, 0);
            }
        }
    }
    Decision::from_policies(decisions)
}
