//! Leased quotas: a limit shared through Redis without a round trip per request, and never
//! exceeded.
//!
//! A [`LeasedStore`] wraps a shared store (`RedisStore`, `RedisClusterStore`, or the
//! in-process [`MemoryLedger`]). For a key that is hot on this instance it takes a *block*
//! of units of every policy of the request from the store's lease ledger in one atomic call,
//! charged there at once, and then admits requests locally from the block until it is used
//! up or its period ends; what is left goes back to the ledger. Cold keys, and policies whose
//! limit is small, stay exact: one ledger call per decision, the block being the request's
//! own cost, used at once. A key refused by the ledger is refused locally until the time the
//! ledger named (`retry_after`) or for one lease time, whichever ends first: an exhausted key
//! costs at most one call per lease time, not one per refused request.
//!
//! # The invariant: zero over-admission
//!
//! Across all instances, the admitted requests satisfy the bound the exact mode satisfies, in
//! every interval. A unit admitted later than it was charged could break it (a block charged
//! at `g` and spent at `g + T`, after the state refilled or slid for `T`), so every block is
//! accounted for its whole period `[g, g + T]`:
//!
//! * **Fixed window** (at most `N` per window): a block is charged to the window `g` falls in
//!   and its period ends at that window's end, so its units are admitted in the window they
//!   were charged to. Unused units go back to that window's count while it lasts.
//! * **Sliding window counter** (`N + N·L/W` in any span `L ≤ W`): blocks end at the window
//!   boundary too. The counter's bound holds: the units admitted in the head of window `k`
//!   were charged in window `k` by grants no later than the last admission, the last such
//!   grant saw the previous window's *charged* count (at least what was admitted there), and
//!   the counter's own proof (see [`crate::algorithm::sliding_window_counter`]) goes through
//!   with charged counts in place of admitted ones. Unused units come off the window they
//!   were charged to, current or previous.
//! * **Sliding window log** (at most `N` in any window of `W`): a block is an entry that
//!   counts until `W` after its period *ends* (`g + T`), not after `g`. A window that could
//!   hold one of its units intersects `[g, g + T]`; a grant at `s` checks every entry still
//!   counting at `s`, and later windows see a subset of those, so in every window the units of
//!   the blocks that touch it sum to at most `N`. A return shortens the entry to the units
//!   used and to the time of the return.
//! * **Token bucket and GCRA** (at most `C + N·L/W` in any span `L`): a block of `k` units
//!   for `T` ms is charged `k` tokens *plus the refill the period would hand out*, `N·T/W`
//!   (exactly, in the bucket's scaled integers). Proof: take any span `[s, t]` and the
//!   earliest grant `g*` of a block that touches it; the charges granted in `[g*, t]` fit an
//!   exact bucket, so they sum to at most `C + N·(t − g*)/W`, and they include the touching
//!   blocks' units plus the reservation `N·T*/W ≥ N·(s − g*)/W` of the block at `g*`. So
//!   the touching units sum to at most `C + N·(t − s)/W`. A return gives back the unused
//!   units and the reservation for the rest of the period, never more than the block still
//!   weighs in the bucket, which leaves a state the same proof covers (as if the block had
//!   been smaller and shorter). A shaping GCRA (`max_delay`) cannot be leased: its delays are
//!   decided per request.
//! * **In flight**: slots are held, not spent; never leased.
//!
//! **Settlements above their reservation are debts, as in the exact mode.** The extra charge
//! goes to the ledger in full, through the exact algorithms' own
//! [`overcharge`](crate::algorithm::LimitAlgorithm::overcharge) arithmetic (the same in Rust
//! and in `lua/lease.lua`): the fixed window and the counter carry a count past the limit
//! into the next windows (`N` paid per window), the log dates one entry ahead, the token
//! bucket and GCRA go into deficit; a debt saturates at ⌊2^52 / W⌋ units
//! ([`MAX_USAGE_WINDOW_PRODUCT`](crate::algorithm::MAX_USAGE_WINDOW_PRODUCT)), so a
//! settlement of `u64::MAX` refuses the key for about 2^52 / N ms, as on the exact stores.
//! A grant sees a debt as units used, so no block granted while a debt stands holds units the
//! debt owes. A block granted *before* the debt was charged ahead of it: when a settlement
//! leaves a debt standing, the settling instance gives its block back in the same breath
//! (its next request asks the ledger, which refuses until the debt is paid). The bound of
//! [`Op::Settle`](crate::store::Op::Settle) then holds with one reading: a block's units
//! are reserved together when it is granted, as concurrent requests are in the exact mode.
//! So a key whose requests are settled one after another is served, over `j` whole windows
//! (fixed window, counter), over any `j·W` ms (log) or over any `L` ms (token bucket and GCRA:
//! `C + N·L/W`), at most the exact bound `j·N` (or `C + N·L/W`) plus, for each instance, the
//! overshoot of one request it served in the span: an instance whose block outlived another
//! instance's debt serves at most one request from it settled above its reservation, and then
//! gives it back too. On one instance that is the exact bound to the unit. Over the long run
//! the debts are paid back: at most `N` per window whatever a key sends. The same carry
//! applies to a count past a lower override's limit (units charged under the plan's limit are
//! paid back at the override's rate, as the exact stores do).
//!
//! A policy that cannot be leased is decided exactly by the wrapped store ([`leasable`]
//! says which); a request with both kinds is decided by the ledger first and then by the
//! store, and the ledger's units are given back if the store refuses: all or nothing, and
//! each policy always in the same place.
//!
//! The ledger keeps its own state (`<prefix>:{<key>}:<policy>:lease-<alg>`, the key's hash
//! tag): every instance sharing a leasable policy must use a `LeasedStore`, or each mode
//! counts its own quota.
//!
//! # The price: under-admission, bounded
//!
//! A block is at most [`max_block_fraction`](LeasedStoreBuilder::max_block_fraction) of the
//! limit (default 1/10; the capacity for the token bucket and GCRA), and its size follows the
//! key's observed local rate × the lease time (default 250 ms), so a quiet key takes small
//! blocks or none. Requests refused that the exact mode would have admitted are bounded by
//! the units held unused in blocks plus the conservative margin: at most
//! `instances × (largest block + margin)` at any time, where the margin is `N·T/W` for the
//! token bucket and GCRA (the reserved refill), and 0 for the windows (whose blocks only end
//! early) — the log's blocks also stay in the window up to `T` longer. Unused units return
//! when the block ends or is replaced, when the store is [shut down](LeasedStore::shutdown),
//! and within half a lease time of a block expiring unused (a background task); after a
//! crash, they return when the window rolls over (the bucket: when it refills).
//!
//! # Per-key overrides
//!
//! [`set_override`](crate::Limiter::set_override) works on leased policies as on the exact
//! stores: the override lives in the wrapped store (on Redis, the exact store's override key
//! next to the key's state, same hash tag; in a [`MemoryLedger`], its own table), and every
//! ledger call reads it and decides with its limit and capacity; its replies name them, so
//! decisions report the override's limit and blocks are sized from it. The same holds for
//! [`remove_override`](crate::Limiter::remove_override) and an override's expiry.
//!
//! **Bound: an override takes effect on every instance within one lease time.** A block
//! lives at most one lease time (its period), and a refusal kept locally is asked again
//! after at most one lease time (even when the ledger named a longer `retry_after`): so from
//! `s + lease_time`, `s` the moment the override was written, every unit any instance admits
//! comes from a ledger call made after `s`, which saw the override and every unit charged
//! before it. The instance that sets or removes an override gives its own blocks of the key
//! back at once. From then on the invariant above holds under the override's numbers: in
//! every fixed window, units admitted from `s + lease_time` on number at most the override's
//! limit (units charged before count against it, and a count past the override's limit is
//! carried into the next windows as a debt is); in any interval that starts at
//! `s + lease_time` or later, the sliding window log, counter, token bucket and GCRA admit at
//! most their exact-mode bound for the override's limit and capacity. The token bucket and
//! GCRA carry the key's deficit into the new numbers as the exact stores do (tokens taken
//! under a higher limit still have to refill, at the override's rate), and a block gives back
//! its reserved refill at the lower of the rate it was reserved under and the one in force,
//! so raising a limit never returns more than was reserved. On Redis a bucket's ledger key
//! is kept for the slower of the plan's and the override's rate (setting one extends it), so
//! it cannot expire while the override still holds tokens back. Until `s + lease_time`,
//! blocks granted under the old limit may still be spent: at most one block per instance,
//! each a [`max_block_fraction`](LeasedStoreBuilder::max_block_fraction) of the old limit.
//!
//! # Failures
//!
//! * A store outage with blocks in hand: decisions go on from the blocks (no call is made);
//!   when a call is needed, its [`StoreError`] reaches the caller, and a [`ResilientStore`]
//!   around the `LeasedStore` applies its failure mode, deny cache and local fallback as
//!   for any store.
//! * An instance killed (or dropped without [`shutdown`](LeasedStore::shutdown)) loses at
//!   most its blocks: those units stay charged until their window or refill frees them.
//! * A Redis restart or failover (a new `run_id`, see [`Store::generation`](crate::store::Store::generation)) drops every
//!   block granted before it: the ledger that charged them is gone.
//! * Redis Cluster: the ledger call touches one key per policy (two for the log), all under
//!   the key's hash tag.
//!
//! # Headers
//!
//! A decision from a block reports `remaining` as the units left in the block plus what the
//! ledger said was left for everyone when it granted it (other instances may have taken
//! some since), and `reset_after` as the ledger said then, less the time since. A local
//! refusal reports the ledger's `retry_after`, less the time since. Limits are exact.
//!
//! # Examples
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use tollgate::key::Key;
//! use tollgate::store::leased::{LeasedStore, MemoryLedger};
//! use tollgate::{Limiter, Policy, Rate};
//!
//! let shared = MemoryLedger::new(); // or a RedisStore
//! let limiter = Limiter::builder()
//!     .store(LeasedStore::new(shared))
//!     .policy(Policy::new("api", Rate::per_second(1000))?)
//!     .build()?;
//! let d = limiter.check(&Key::new("user", "1"), 1).await?;
//! assert!(d.is_allowed());
//! assert_eq!(d.limit(), 1000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! With a Redis store, a longer lease time and smaller blocks:
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # fn run() -> Result<(), tollgate::ConfigError> {
//! use std::time::Duration;
//! use tollgate::store::leased::LeasedStore;
//! use tollgate::store::RedisStore;
//!
//! let store = LeasedStore::builder(RedisStore::from_url("redis://127.0.0.1:6379")?)
//!     .lease_time(Duration::from_millis(500))
//!     .max_block_fraction(0.05)
//!     .build()?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! [`ResilientStore`]: crate::store::ResilientStore

mod builder;
mod entries;
mod ledger;
mod store_impl;
mod table;

pub use builder::LeasedStoreBuilder;
use entries::{spawn, Block, BlockPart, Denied, Entry, Plan, Taken};

pub use ledger::{LeaseBackend, LedgerCall, LedgerReply, MemoryLedger};

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::PolicyDecision;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::policy::{Algorithm, Policy};
pub(crate) use ledger::Kind;
#[cfg(feature = "redis")]
pub(crate) use ledger::PART_BYTES;
use ledger::{Mode, Part, Returned};

/// The default lease time: how long a block may be spent.
pub const DEFAULT_LEASE_TIME: Duration = Duration::from_millis(250);

/// The default largest block, as a fraction of the limit.
pub const DEFAULT_MAX_BLOCK_FRACTION: f64 = 0.1;

/// The default cap on the keys an instance tracks (their observed rate and blocks).
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// Blocks end this many ms before the ledger's end of their period, for the rounding of
/// both clocks to whole milliseconds.
const CLOCK_SLACK_MS: u64 = 2;

/// Whether `policy` can be leased; the error says why not.
///
/// In-flight policies hold slots rather than spend units, and a shaping GCRA (one with a
/// `max_delay`) decides each request's delay: both are decided exactly by the wrapped store.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::leased::leasable;
/// use tollgate::{Algorithm, Policy, Rate};
///
/// assert!(leasable(&Policy::new("api", Rate::per_second(100))?).is_ok());
/// assert!(leasable(&Policy::in_flight("slots", 8)?).is_err());
/// let shaping = Policy::builder("smooth", Rate::per_second(10))
///     .algorithm(Algorithm::Gcra)
///     .shape(Duration::from_millis(500))
///     .build()?;
/// assert_eq!(leasable(&shaping).unwrap_err().field(), "algorithm");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
///
/// # Errors
///
/// A [`ConfigError`] on `algorithm` naming the policy's algorithm.
pub fn leasable(policy: &Policy) -> Result<(), ConfigError> {
    match Kind::of(policy) {
        Some(_) => Ok(()),
        None if policy.algorithm() == Algorithm::InFlight => Err(ConfigError::new(
            "algorithm",
            policy.algorithm().as_str(),
            format!(
                "policy {:?} holds in-flight slots, which cannot be leased; it is decided exactly",
                policy.name()
            ),
        )),
        None => Err(ConfigError::new(
            "algorithm",
            policy.algorithm().as_str(),
            format!(
                "policy {:?} shapes (max_delay), which cannot be leased; it is decided exactly",
                policy.name()
            ),
        )),
    }
}

/// Counters of a [`LeasedStore`]'s leases since it was built.
///
/// ```
/// use tollgate::store::leased::{LeasedStore, MemoryLedger};
///
/// let store = LeasedStore::new(MemoryLedger::new());
/// assert_eq!(store.stats().grants, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Blocks granted by the ledger.
    pub grants: u64,
    /// Units in those blocks.
    pub units_granted: u64,
    /// Ledger calls that decided one request exactly (cold keys, small limits).
    pub exact_calls: u64,
    /// Ledger calls that refused.
    pub refusals: u64,
    /// Requests admitted from a block without a call.
    pub local_admits: u64,
    /// Requests refused locally, within a `retry_after` the ledger named.
    pub local_refusals: u64,
    /// Unused units given back to the ledger.
    pub units_returned: u64,
    /// Unused units given up without a return (the ledger restarted, or the return failed):
    /// under-admission until their window or refill frees them.
    pub units_dropped: u64,
    /// Unused units in blocks held now.
    pub units_held: u64,
    /// Keys tracked now (observed rate, block, refusal): at most
    /// [`max_keys`](LeasedStoreBuilder::max_keys).
    pub tracked_keys: u64,
    /// Decisions for keys seen before while [`max_keys`](LeasedStoreBuilder::max_keys) keys
    /// were tracked: decided exactly, one ledger call each, and not remembered. A steady
    /// count here says the cap is too small for the keys that come back.
    pub untracked: u64,
    /// Decisions for keys seen for the first time (as far as the store's short memory of
    /// recent keys tells): decided exactly, one ledger call each, and not tracked; a key is
    /// tracked from its second decision.
    pub first_sightings: u64,
}

#[derive(Debug, Default)]
struct Counters {
    grants: AtomicU64,
    units_granted: AtomicU64,
    exact_calls: AtomicU64,
    refusals: AtomicU64,
    local_admits: AtomicU64,
    local_refusals: AtomicU64,
    units_returned: AtomicU64,
    units_dropped: AtomicU64,
    untracked: AtomicU64,
    first_sightings: AtomicU64,
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

/// A shared store that leases blocks of quota to decide hot keys locally, never exceeding
/// the limit across instances. See the [module docs](self).
///
/// Cheap to clone: clones share their blocks.
pub struct LeasedStore<S> {
    shared: Arc<Shared<S>>,
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

struct Shared<S> {
    inner: S,
    lease_ms: u64,
    fraction: f64,
    max_keys: usize,
    clock: Arc<dyn Clock>,
    entries: table::EntryTable,
    next_id: AtomicU64,
    counters: Counters,
    sweeper: AtomicBool,
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

impl<S: LeaseBackend> Shared<S> {
    fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn call(&self, mode: Mode, period: u64, id: u64, policies: &[Policy]) -> ledger::LedgerCall {
        ledger::LedgerCall {
            mode,
            lease_ms: period,
            block_id: id,
            previous_block: 0,
            parts: policies
                .iter()
                .filter_map(|p| Kind::of(p).map(|k| Part::new(k, p)))
                .collect(),
        }
    }

    /// Decides a request whose policies are all leasable.
    async fn decide(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Result<(Decision, Taken), StoreError> {
        let Some(entry) = self.entry(key, policies) else {
            return self.exact(None, key, policies, costs).await;
        };
        let now = self.now();
        if let Some(d) = self.local(&entry, costs, now, true) {
            return Ok((d, Taken::Nothing));
        }
        self.start_sweeper();
        let plan = {
            let mut st = entry.st.lock();
            st.meter.add(now, self.lease_ms, costs);
            self.plan(&st, policies, costs, now)
        };
        match plan {
            Plan::Exact => self.exact(Some(&entry), key, policies, costs).await,
            Plan::Lease { period, wants } => {
                // A grant runs to its end even when its caller gives up: cut off after the
                // ledger charged the block, or after the block in hand was taken to be given
                // back, it would lose a whole block (up to a tenth of the limit) until the
                // window ends. Dropped once started, it is finished on the runtime; a caller
                // that goes away costs at most its own units.
                let grant = Arc::clone(self).grant(
                    entry,
                    key.clone(),
                    policies.iter().cloned().collect(),
                    costs.iter().copied().collect(),
                    period,
                    wants,
                );
                Finishing::new(grant).await
            }
        }
    }

    /// Takes a block for a request of `costs` on a tracked key (see [`decide`](Self::decide)),
    /// giving back the block in hand in the same ledger call.
    async fn grant(
        self: Arc<Self>,
        entry: Arc<Entry>,
        key: Key,
        policies: SmallVec<[Policy; 2]>,
        costs: SmallVec<[u64; 2]>,
        period: u64,
        wants: SmallVec<[u64; 2]>,
    ) -> Result<(Decision, Taken), StoreError> {
        let (key, policies, costs) = (&key, &policies[..], &costs[..]);
        let entry = &entry;
        let _refill = entry.refill.lock().await;
        let now = self.now();
        if let Some(d) = self.local(entry, costs, now, false) {
            return Ok((d, Taken::Nothing));
        }
        let id = self.next_id();
        let mut call = self.call(Mode::Grant, period, id, policies);
        for ((part, &cost), &want) in call.parts.iter_mut().zip(costs).zip(&wants) {
            part.cost = cost;
            part.wanted = want.max(cost);
        }
        let generation = self.inner.generation();
        // The block in hand, used up or ended, goes back in the same call: its
        // unused units, and the reserved refill or log time it still holds.
        let old = entry.st.lock().block.take();
        let mut kept = None;
        if let Some(old) = old {
            if old.generation == generation {
                call.previous_block = old.id;
                let unused = old.parts.iter().map(|p| p.left).max().unwrap_or(0);
                for (part, bp) in call.parts.iter_mut().zip(&old.parts) {
                    part.returned = old.returned(bp);
                }
                kept = Some((old, unused));
            }
        }
        let sent = self.now();
        match self.inner.ledger(key, policies, call).await {
            Ok(reply) => {
                if let Some((_, unused)) = kept {
                    bump(&self.counters.units_returned, unused);
                    crate::telemetry::lease_units("returned", unused);
                }
                Ok(self.install(Some(entry), policies, costs, reply, id, sent, generation))
            }
            Err(e) => {
                // The call may have run (a reply lost to a timeout): the block it
                // gave back must not be spent again.
                if let Some((_, unused)) = kept {
                    bump(&self.counters.units_dropped, unused);
                    crate::telemetry::lease_units("dropped", unused);
                }
                Err(e)
            }
        }
    }

    /// One request decided by one ledger call; its refusal kept on `entry`, if the key has
    /// one.
    async fn exact(
        self: &Arc<Self>,
        entry: Option<&Entry>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Result<(Decision, Taken), StoreError> {
        let id = self.next_id();
        let mut call = self.call(Mode::Grant, 0, id, policies);
        for (part, &cost) in call.parts.iter_mut().zip(costs) {
            part.cost = cost;
            part.wanted = cost;
        }
        let generation = self.inner.generation();
        let sent = self.now();
        let reply = self.inner.ledger(key, policies, call).await?;
        if reply.granted && reply.lease_ms > 0 {
            return Err(StoreError::Protocol(crate::error::Cause::from(
                "the lease ledger granted a block to a call that asked for none",
            )));
        }
        Ok(self.install(entry, policies, costs, reply, id, sent, generation))
    }

    /// Turns a ledger reply into the request's decision, keeping a block or a refusal on
    /// `entry` (always there for a block: only a tracked key asks for one).
    #[allow(clippy::too_many_arguments)]
    fn install(
        self: &Arc<Self>,
        entry: Option<&Entry>,
        policies: &[Policy],
        costs: &[u64],
        reply: LedgerReply,
        id: u64,
        sent: u64,
        generation: u64,
    ) -> (Decision, Taken) {
        let answers = &reply.answers;
        if let Some(entry) = entry {
            entry.st.lock().in_force = answers.iter().map(|a| (a.limit, a.capacity)).collect();
        }
        if !reply.granted {
            bump(&self.counters.refusals, 1);
            let decisions: SmallVec<[PolicyDecision; 2]> = policies
                .iter()
                .zip(answers)
                .map(|(p, a)| {
                    PolicyDecision::from_parts(
                        a.retry_after_ms == 0,
                        a.reported_limit(Kind::of(p)),
                        a.remaining,
                        a.reset_after_ms,
                        a.retry_after_ms,
                        0,
                    )
                })
                .collect();
            let wait = answers.iter().map(|a| a.retry_after_ms).max().unwrap_or(0);
            let Some(entry) = entry else {
                return (Decision::from_policies(decisions), Taken::Nothing);
            };
            let mut st = entry.st.lock();
            st.denied = Some(Denied {
                generation,
                sent,
                // The ledger is asked again after a lease time at the latest: an override
                // set meanwhile (on any instance) may allow the key sooner.
                until: sent.saturating_add(wait.min(self.lease_ms)),
                costs: costs.iter().copied().collect(),
                decisions: decisions.clone(),
            });
            return (Decision::from_policies(decisions), Taken::Nothing);
        }
        let decision = Decision::from_policies(policies.iter().zip(answers).zip(costs).map(
            |((p, a), &cost)| {
                let extra = a.granted.saturating_sub(cost);
                let limit = a.reported_limit(Kind::of(p));
                PolicyDecision::from_parts(
                    true,
                    limit,
                    a.remaining.saturating_add(extra).min(limit),
                    a.reset_after_ms,
                    0,
                    0,
                )
            },
        ));
        let entry = match entry {
            Some(entry) if reply.lease_ms > 0 => entry,
            _ => {
                bump(&self.counters.exact_calls, 1);
                if let Some(entry) = entry {
                    entry.st.lock().denied = None;
                }
                return (
                    decision,
                    Taken::Ledger {
                        id,
                        at: reply.now_ms,
                    },
                );
            }
        };
        bump(&self.counters.grants, 1);
        let granted: u64 = answers.iter().map(|a| a.granted).max().unwrap_or(0);
        bump(&self.counters.units_granted, granted);
        crate::telemetry::lease_units("granted", granted);
        let block = Block {
            id,
            generation,
            sent,
            expires: (sent + reply.lease_ms).saturating_sub(CLOCK_SLACK_MS),
            granted_at: reply.now_ms,
            lease_ms: reply.lease_ms,
            parts: policies
                .iter()
                .zip(answers)
                .zip(costs)
                .map(|((p, a), &cost)| BlockPart {
                    granted: a.granted,
                    left: a.granted.saturating_sub(cost),
                    limit: a.reported_limit(Kind::of(p)),
                    rate: a.limit,
                    shared_remaining: a.remaining,
                    reset_after: a.reset_after_ms,
                })
                .collect(),
        };
        let old = {
            let mut st = entry.st.lock();
            st.denied = None;
            st.block.replace(block)
        };
        if let Some(old) = old {
            if let Some(fut) = self.give_back(entry, old) {
                spawn(fut);
            }
        }
        (decision, Taken::Block(id))
    }

    /// The call that gives a block's unused units back, if it has any and its ledger is the
    /// one that granted it.
    fn give_back(
        self: &Arc<Self>,
        entry: &Entry,
        block: Block,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let unused = block.parts.iter().map(|p| p.left).max().unwrap_or(0);
        // A block used up before its period ends still holds, in the bucket, the refill
        // reserved for the rest of the period and, in the log, an entry counting until the
        // period's end: both come back too.
        let early = self.now() < block.expires
            && entry
                .policies
                .iter()
                .any(|p| matches!(Kind::of(p), Some(Kind::Bucket | Kind::Log)));
        if unused == 0 && !early {
            return None;
        }
        if block.generation != self.inner.generation() {
            bump(&self.counters.units_dropped, unused);
            crate::telemetry::lease_units("dropped", unused);
            return None;
        }
        let mut call = self.call(Mode::Return, 0, block.id, &entry.policies);
        for (part, bp) in call.parts.iter_mut().zip(&block.parts) {
            part.returned = block.returned(bp);
        }
        let fut = self.inner.ledger(&entry.key, &entry.policies, call);
        let me = self.clone();
        Some(async move {
            match fut.await {
                Ok(_) => {
                    bump(&me.counters.units_returned, unused);
                    crate::telemetry::lease_units("returned", unused);
                }
                Err(e) => {
                    bump(&me.counters.units_dropped, unused);
                    crate::telemetry::lease_units("dropped", unused);
                    tracing::debug!(target: "tollgate::store", error = %e, "lease return failed");
                }
            }
        })
    }

    /// Gives back the block this instance holds for `key`'s `policies`, if any, and waits
    /// for the answer (a debt stands on the key: see [`settle`](crate::store::Op::Settle)).
    async fn return_block(self: &Arc<Self>, key: &Key, policies: &[Policy]) {
        let Some(entry) = self.existing(key, policies) else {
            return;
        };
        let block = entry.st.lock().block.take();
        if let Some(fut) = block.and_then(|b| self.give_back(&entry, b)) {
            fut.await;
        }
    }

    /// Gives back units a request took (a mixed request refused by the exact store, a
    /// refund).
    async fn untake(self: &Arc<Self>, key: &Key, policies: &[Policy], costs: &[u64], taken: Taken) {
        match taken {
            Taken::Nothing => {
                // From a block: back into it, if it is still held.
                if let Some(e) = self.existing(key, policies) {
                    let mut st = e.st.lock();
                    if let Some(b) = &mut st.block {
                        for (p, c) in b.parts.iter_mut().zip(costs) {
                            p.left = p.left.saturating_add(*c).min(p.granted);
                        }
                    }
                }
            }
            Taken::Block(id) => {
                if let Some(e) = self.existing(key, policies) {
                    let mut st = e.st.lock();
                    if let Some(b) = st.block.as_mut().filter(|b| b.id == id) {
                        for (p, c) in b.parts.iter_mut().zip(costs) {
                            p.left = p.left.saturating_add(*c).min(p.granted);
                        }
                    }
                }
            }
            Taken::Ledger { id, at } => {
                let mut call = self.call(Mode::Return, 0, id, policies);
                for (part, &c) in call.parts.iter_mut().zip(costs) {
                    part.returned = Returned {
                        granted: c,
                        unused: c,
                        granted_at: at,
                        lease_ms: 0,
                        rate: 0,
                    };
                }
                let _ = self.inner.ledger(key, policies, call).await;
            }
        }
    }
}

/// A future that, once polled, runs to its end even if its caller drops it: the rest is
/// finished on the current Tokio runtime (without one, it is dropped where it stands).
struct Finishing<F: Future + Send + 'static> {
    future: Option<std::pin::Pin<Box<F>>>,
    started: bool,
}

impl<F: Future + Send + 'static> Finishing<F> {
    fn new(future: F) -> Self {
        Self {
            future: Some(Box::pin(future)),
            started: false,
        }
    }
}

impl<F: Future + Send + 'static> Future for Finishing<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.started = true;
        let Some(future) = self.future.as_mut() else {
            return std::task::Poll::Pending; // answered already; never polled again
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        std::task::Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for Finishing<F> {
    fn drop(&mut self) {
        if let (Some(future), true) = (self.future.take(), self.started) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = future.await;
                });
            }
        }
    }
}
