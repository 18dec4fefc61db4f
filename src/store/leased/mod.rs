//! Leased quotas: a limit shared through Redis without a round trip per request, and never
//! exceeded.
//!
//! A [`LeasedStore`] wraps a shared store (`RedisStore`, `RedisClusterStore`, or the
//! in-process [`MemoryLedger`]). For a key that is hot on this instance it takes a *block*
//! of units of every policy of the request from the store's lease ledger in one atomic call,
//! charged there at once, and then admits requests locally from the block until it is used
//! up or its lease ends; what is left goes back to the ledger. Cold keys, and policies whose
//! limit is small, stay exact: one ledger call per decision, the block being the request's
//! own cost, used at once. A key refused by the ledger is refused locally until the time the
//! ledger named (`retry_after`) or for one lease time, whichever ends first: an exhausted key
//! costs at most one call per lease time, not one per refused request. Units given back
//! through the same instance (a refund, a settlement below its reservation) end that refusal
//! at once; given back through another instance, or freed by another instance's reset, they
//! are seen within that time (a [`peek`](crate::store::Op::Peek) asks the ledger, and sees
//! them at once).
//!
//! The words (block, lease, reservation, settlement, debt, slot) are the
//! [glossary](crate::guide::glossary)'s. One more here: a token bucket's block is also
//! charged the refill its lease would hand out, *the refill charged ahead* (it is not a
//! reservation).
//!
//! # The invariant: zero over-admission
//!
//! Across all instances, the admitted requests satisfy the bound the exact mode satisfies, in
//! every interval. A unit admitted later than it was charged could break it (a block charged
//! at `g` and spent at `g + T`, after the state refilled or slid for `T`), so every block is
//! accounted for its whole lease `[g, g + T]`:
//!
//! * **Fixed window** (at most `N` per window): a block is charged to the window `g` falls in
//!   and its lease ends at that window's end, so its units are admitted in the window they
//!   were charged to. Unused units go back to that window's count while it lasts.
//! * **Sliding window counter** (`N + N·L/W` in any span `L ≤ W`): blocks end at the window
//!   boundary too. The counter's bound holds: the units admitted in the head of window `k`
//!   were charged in window `k` by grants no later than the last admission, the last such
//!   grant saw the previous window's *charged* count (at least what was admitted there), and
//!   the counter's own proof (see [`crate::algorithm::sliding_window_counter`]) goes through
//!   with charged counts in place of admitted ones. Unused units come off the window they
//!   were charged to, current or previous.
//! * **Sliding window log** (at most `N` in any window of `W`): a block is an entry that
//!   counts until `W` after its lease *ends* (`g + T`), not after `g`. A window that could
//!   hold one of its units intersects `[g, g + T]`; a grant at `s` checks every entry still
//!   counting at `s`, and later windows see a subset of those, so in every window the units of
//!   the blocks that touch it sum to at most `N`. A return shortens the entry to the units
//!   used and to the time of the return.
//! * **Token bucket and GCRA** (at most `C + N·L/W` in any span `L`): a block of `k` units
//!   for `T` ms is charged `k` tokens *plus the refill its lease would hand out*, `N·T/W`
//!   (the refill charged ahead; exactly, in the bucket's scaled integers). Proof: take any span `[s, t]` and the
//!   earliest grant `g*` of a block that touches it; the charges granted in `[g*, t]` fit an
//!   exact bucket, so they sum to at most `C + N·(t − g*)/W`, and they include the touching
//!   blocks' units plus the refill charged ahead `N·T*/W ≥ N·(s − g*)/W` of the block at `g*`. So
//!   the touching units sum to at most `C + N·(t − s)/W`. A return gives back the unused
//!   units and the refill charged ahead for the rest of the lease, never more than the block still
//!   weighs in the bucket, which leaves a state the same proof covers (as if the block had
//!   been smaller and shorter). A shaping GCRA (`max_delay`) cannot be leased: its delays are
//!   decided per request.
//! * **In flight**: slots are held, not spent; never leased.
//!
//! **Costs settled above their reservation are debts, as in the exact mode.** The extra charge
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
//! are charged together when it is granted, as the reservations of concurrent requests are
//! in the exact mode.
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
//! **Costs settled below their reservation, and refunds, come back**, as far as that is
//! safe. With no block in hand for the key's policies (a cold key, or a request too large
//! for a block, charged at the ledger), they go to the ledger: a metered request with a
//! large estimate is charged what it used, as on the exact stores. The instance keeps its
//! last charges at the ledger per key (8 a key, 4 096 keys, each until its longest window
//! ends), and a give-back names them, the newest first, up to what each charged: the ledger
//! takes it off that very charge, and a [region](crate::store::regions) sends it to the home
//! that decided it. With a block in hand,
//! they go into it, up to what has been spent of it (a block never holds more than it was
//! granted), and what does not fit is dropped: the key is charged it, as if it had been
//! used. Giving it to the ledger instead could free units the block still holds, were the
//! give-back of more than the key was charged (the ledger cannot tell). In the ledger's
//! sliding window log, a give-back the instance cannot name comes off the log's newest
//! entries whose lease has ended (as the exact log takes a refund off its newest entries); a
//! block still leased, and a debt (both dated ahead), keep their units. Bound, for a give-back to the ledger of more than
//! the key was charged (a refund applied twice, or of a request never charged): the ledger's
//! count goes down to a fresh state, as on the exact stores, and so may free units of blocks
//! other instances (or this one, for another set of policies on the key) hold: at most one
//! block each, as after a reset.
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
//! the units left unused in blocks plus the conservative margin: at most
//! `instances × (largest block + margin)` at any time, where the margin is `N·T/W` for the
//! token bucket and GCRA (the refill charged ahead), and 0 for the windows (whose blocks only end
//! early) — the log's blocks also stay in the window up to `T` longer. Unused units return
//! when the block ends or is replaced, when the store is [shut down](LeasedStore::shutdown),
//! and within half a lease time of a block expiring unused (a background task); after a
//! crash, they return when the window rolls over (the bucket: when it refills).
//!
//! **Bound: a reset holds on the instance that makes it; another instance spends at most the
//! block it holds.** [`Op::Reset`](crate::store::Op::Reset) (and
//! [`Limiter::reset`](crate::Limiter::reset)) drops the resetting instance's blocks of the
//! key, resets the ledger, and drops any block granted while that ran. Another instance
//! keeps the block it already holds and admits from it until it ends (at most one lease
//! time); what it gives back unused comes off the new count. So after a reset the key is
//! admitted at most its limit plus the units other instances held
//! ([`LeaseStats::units_held`]) — measured in `tests/leased_reset.rs` (1 000 + 54 of a
//! block, exactly).
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
//! lives at most one lease time, and a refusal kept locally is asked again
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
//! GCRA carry the key's deficit into the new numbers (tokens taken under a higher limit
//! still have to refill, at the override's rate; the token bucket's refill until the
//! override is set or removed is taken at the rate in force until then, as the memory store
//! takes it; the ledger's GCRA carries it as units where the exact stores carry a theoretical
//! arrival time, so the time before the change refills at the new rate and the wait before
//! the next admission can differ from theirs — a raised override can admit up to one
//! capacity sooner than the memory store would, a lowered one later — both within the bound
//! above from `s + lease_time`), and a block gives back
//! the refill charged ahead at the lower of the rate it was charged at and the one in force,
//! so raising a limit never returns more than was charged. On Redis a bucket's ledger key
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
//!   block granted before it: the ledger that charged them is gone. The store sees it at the
//!   first call after a failed one or a `NOSCRIPT`, and within a second of calls in any
//!   case; a block given back before that gives its unused units to the fresh ledger, so
//!   the fresh window can admit up to one block per instance more than its limit.
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
mod charges;
mod entries;
mod finishing;
mod give_back;
mod grant;
mod ledger;
mod stats;
mod store;
mod store_impl;
mod table;

pub use builder::LeasedStoreBuilder;
use entries::{spawn, Block, BlockPart, Denied, Entry, Plan, Taken};
use finishing::Finishing;
pub use stats::LeaseStats;
use stats::{bump, Counters};
pub use store::LeasedStore;
use store::Shared;

pub use ledger::{LeaseBackend, LedgerCall, LedgerFuture, LedgerReply, MemoryLedger};

use std::fmt;
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
#[cfg(feature = "regions")]
pub(crate) use ledger::Answer;
pub(crate) use ledger::Kind;
pub(crate) use ledger::LedgerMode;
#[cfg(feature = "redis")]
pub(crate) use ledger::PART_BYTES;
pub(crate) use ledger::{Part, Returned};

/// The default lease time: how long a block may be spent.
pub const DEFAULT_LEASE_TIME: Duration = Duration::from_millis(250);

/// The default largest block, as a fraction of the limit.
pub const DEFAULT_MAX_BLOCK_FRACTION: f64 = 0.1;

/// The default cap on the keys an instance tracks (their observed rate and blocks).
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// Blocks end this many ms before the ledger's end of their lease, for the rounding of
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
