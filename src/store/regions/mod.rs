//! Limits shared across regions, decided at each region's latency and never exceeded.
//!
//! Three levels lend one limit down, each one lease at a time:
//!
//! ```text
//!                       home ledger (a Redis the plan names as home)
//!              one block per region and key, lent for `home_lease` (default 1 s)
//!            ┌───────────────────────┼───────────────────────┐
//!      region "eu" Redis       region "us" Redis       region "ap" Redis
//!      deposits of blocks      deposits of blocks      deposits of blocks
//!         ┌────┴────┐             ┌────┴────┐             ┌────┴────┐
//!     instance  instance      instance  instance      instance  instance
//!     (a LeasedStore over this region's RegionalLedger: blocks in process)
//! ```
//!
//! A [`RegionalLedger`] is the [`LeaseBackend`] a region's instances give their
//! [`LeasedStore`]: it holds, in the region's own Redis, a *deposit* per key and policy, a
//! block the region took from the home ledger (one atomic call of `lua/lease.lua` there, as
//! any leased store's), and lends the region's instances blocks (or single requests) out of
//! it in one atomic call of `lua/region.lua` here. On the request path an instance talks to
//! its region's Redis only, and only when its own block runs out. A deposit half used, or half
//! through its lease, is renewed in the background by the instance that noticed: it takes
//! the next block from the home and swaps it in; the one it replaces goes back to the home
//! once the last block lent from it has ended.
//!
//! # The invariant: never more than the global limit
//!
//! Every unit an instance admits comes out of a deposit, within the deposit's lease, or from
//! an exact decision of the home ledger. A deposit is a home block, charged at the home for
//! its whole lease when it was granted, and a deposit ends no later than that lease: its end
//! is measured on the region's clock from *before* the home was asked, less 2 ms (clocks
//! must run at the same rate; their offset does not matter). Blocks lent to instances end
//! no later than their deposit. So the home ledger's accounting covers every unit any region
//! admits, and the bounds of [leased quotas](crate::store::leased) hold across all regions,
//! per algorithm, as they do across one region's instances: fixed window at most `N` per
//! window; sliding window counter `N + N·L/W` in any span `L ≤ W`; sliding window log at
//! most `N` in any window; token bucket and GCRA `C + N·L/W` in any span `L`. This holds
//! however regions fail or are partitioned: a region cut off from the home can spend only
//! what its deposits hold, until they end.
//!
//! Policies that cannot be leased (in-flight slots, a shaping GCRA) are decided exactly at
//! the home: one home round trip per request. A cost settled above its reservation is
//! charged at the home, as a debt; when a debt stands, the region empties its deposits of
//! the key, so no unit charged before the debt is lent after it. A [`reset`](crate::store::Op::Reset)
//! empties them too, before and after the home's reset, and drops the deposits set aside
//! that have yet to go home (a return after the reset would take their units off the count
//! that started afresh). Both leave the time of the drain with the key, for 60 s: a renewal
//! under way then (its block granted before the reset, or before the debt), or one that took
//! longer than that, is not installed when it lands, its units counted as dropped. One
//! window is left: a return already on its way to the home when a reset reaches it comes
//! off the new count — at most one deposit's unused units per region and reset, within one
//! home round trip. Other regions keep their deposits of the key until they end (at most two
//! each, within one home lease), as other instances keep their blocks (see
//! [leased quotas](crate::store::leased)): a reset holds at once where it is made, and the
//! key is admitted at most its limit plus what other regions held of it (measured in
//! `tests/regions.rs`: 1 100–1 250 of 1 000 after a reset, another region holding 250–285).
//! Per-key [overrides](crate::overrides) live at the home (the home
//! store's override keys, which every home call reads): an override takes effect in every
//! region within one home lease plus one instance lease.
//!
//! # The price: under-admission, bounded
//!
//! A region holds at most two deposits of a key at once (the one in use and, for the moment
//! of a renewal, the next), each at most
//! [`max_deposit_fraction`](RegionalLedgerBuilder::max_deposit_fraction) of the limit (of
//! the capacity for the token bucket and GCRA; default 1/4), sized from the region's
//! observed rate × two home leases. Requests refused that one exact store would have
//! admitted are bounded by what the deposits hold unused, plus, for the token bucket and
//! GCRA, the refill charged ahead (`N·T/W` per deposit, `T` the home lease), plus each
//! region's instances' own bound (see [leased quotas](crate::store::leased)):
//! at most `regions × 2 × (fraction × limit + N·T/W) + instances × (largest block + margin)`.
//! When the home has nothing left of a key, the region refuses the key's requests without
//! asking it again for the home's `retry_after` or one home lease, whichever ends first; a
//! request the home refused for its size alone (units are left for smaller ones) leaves no
//! such refusal behind.
//! Unused units go back to the home when a deposit is replaced, emptied or ends (the instance
//! that took it gives it back; if that instance is gone, its units stay charged until their
//! window rolls over or their bucket refills). A deposit a renewal replaced, or a debt
//! emptied, stays in the region's Redis until the last block lent from it ends, so the units
//! its blocks give back meanwhile go home with it. A request given up half way costs at most its own units:
//! grants and renewals run to their end without their caller. Units that could not go home
//! (a failed return, a block given back after its deposit went home, a renewal a reset
//! overtook) are counted in [`RegionStats::units_dropped`] and
//! `tollgate_region_units_total{flow="dropped"}`. A settlement or refund of a request the
//! home decided (a large estimate, a cold key: charged at the home, exactly or with the block
//! it waited for) goes home when its instance names it (see
//! [leased quotas](crate::store::leased): the instance keeps its last charges per key), up to
//! what the request was charged; one it cannot name (the charge forgotten, or a give-back of
//! more than was charged) is dropped and counted so: the request then stays charged its
//! estimate, the safe way (taking unnamed units off the home's count could free units a
//! deposit still holds). As on every store, a give-back of a charge made before a reset
//! that another process made is not told from the charges made since
//! ([`Op::Refund`](crate::store::Op::Refund)): it comes off those, at most what the
//! request was charged.
//!
//! # Latency
//!
//! A hot key is decided from the instance's block, or from the region's deposit (one call to
//! the region's Redis); the home's round trip stays off the request path while renewals keep
//! ahead. It is on the path when:
//!
//! * a key is new to the region (no deposit yet): its first request waits for the home, and
//!   requests that arrive while that renewal is under way are decided exactly by the home;
//! * a window ends (fixed window, sliding window counter): every block of a window ends at
//!   its boundary, so each region's first request of a window waits for one home call, and
//!   the requests while it runs are decided exactly by the home;
//! * a burst empties a deposit before its renewal lands.
//!
//! # Failures
//!
//! * The home unreachable: decisions go on from deposits and blocks in hand; a request that
//!   needs the home gets its [`StoreError`](crate::StoreError), and a
//!   [`ResilientStore`](crate::store::ResilientStore) around the instance's `LeasedStore`
//!   applies its failure mode. The invariant above holds with `FailClosed`; the other modes
//!   admit by their own rules (`FailOpen` admits everything; a local fallback by its local
//!   limits), as their docs state.
//! * A region's Redis unreachable: that region's instances decide from their blocks in hand,
//!   then by their failure mode; the other regions are unaffected.
//! * An instance killed: at most its blocks stay charged. A region's Redis lost: its deposits
//!   stay charged at the home until their windows roll over or their buckets refill.
//! * The home restarted (its state lost), once its store sees it (see
//!   [`Store::generation`](crate::store::Store::generation): within a second of calls):
//!   deposits granted before the restart are spent out
//!   (each at most one home lease), as blocks in hand are after a single Redis's restart,
//!   and their unused units are not given back to the fresh home (they would come off what
//!   other regions were charged since): they are dropped and counted in
//!   [`RegionStats::units_dropped`], as are refunds of requests the old home decided. A
//!   deposit installed by another instance of the region before the restart and ended by
//!   this one is not known here and still goes home (its unused units, at most one deposit
//!   per key, are the bound).
//!
//! # Observability
//!
//! [`RegionalLedger::stats`] counts the flows between the region and the home; with the
//! `metrics` feature they are `tollgate_region_home_calls_total{region, call}` and
//! `tollgate_region_units_total{region, flow}`.
//!
//! # Examples
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::key::Key;
//! use tollgate::store::leased::LeasedStore;
//! use tollgate::store::regions::RegionalLedger;
//! use tollgate::store::{FailureMode, RedisStore, ResilientStore};
//! use tollgate::{Limiter, Policy, Rate};
//!
//! // The home is far away: give its calls time.
//! let home = RedisStore::builder()
//!     .timeout(Duration::from_millis(500))
//!     .build_with_url("redis://home.example:6379")?;
//! let local = RedisStore::from_url("redis://redis.eu.internal:6379")?;
//! let region = RegionalLedger::builder("eu", local, home).build()?;
//! // A call that needs the home waits for its round trip: allow for it.
//! let store = ResilientStore::builder(LeasedStore::new(region), FailureMode::FailClosed)
//!     .timeout(Duration::from_millis(500))
//!     .build()?;
//! let limiter = Limiter::builder()
//!     .store(store)
//!     .policy(Policy::new("api", Rate::per_minute(60_000))?)
//!     .build()?;
//! // 60 000 per minute across every region, decided in this one.
//! let decision = limiter.check(&Key::new("tenant", "acme"), 1).await?;
//! # let _ = decision; Ok(()) }
//! ```
//!
//! [`LeaseBackend`]: crate::store::leased::LeaseBackend
//! [`LeasedStore`]: crate::store::leased::LeasedStore

mod deposit;
mod home;
mod returns;
mod stats;
mod store_impl;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::store::leased::LeaseBackend;
use crate::store::RedisStore;

pub use stats::RegionStats;

/// The default home lease: how long a region may lend a block it took from the home.
pub const DEFAULT_HOME_LEASE: Duration = Duration::from_secs(1);

/// The default largest deposit, as a fraction of the limit (the capacity for the token bucket
/// and GCRA).
pub const DEFAULT_MAX_DEPOSIT_FRACTION: f64 = 0.25;

/// A region's share of limits kept at a home ledger: the [`LeaseBackend`] of the region's
/// instances' [`LeasedStore`](crate::store::leased::LeasedStore)s. See the
/// [module docs](self) for the levels, the invariant and its price.
///
/// `H` is the home's ledger: a [`RedisStore`] (or any [`LeaseBackend`]). Clones share
/// the region's state.
///
/// ```
/// use tollgate::store::regions::RegionalLedger;
/// use tollgate::store::RedisStore;
///
/// let local = RedisStore::from_url("redis://127.0.0.1:6380")?;
/// let home = RedisStore::from_url("redis://127.0.0.1:6390")?;
/// let region = RegionalLedger::builder("eu", local, home).build()?;
/// assert_eq!(region.name(), "eu");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct RegionalLedger<H = RedisStore> {
    inner: Arc<home::Region<H>>,
}

impl<H> Clone for RegionalLedger<H> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<H: fmt::Debug> fmt::Debug for RegionalLedger<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionalLedger")
            .field("name", &self.inner.name)
            .field("local", &self.inner.local)
            .field("home", &self.inner.home)
            .field("home_lease_ms", &self.inner.home_lease_ms)
            .finish()
    }
}

impl RegionalLedger {
    /// A builder for the region `name` (a metrics label: 1 to 64 letters, digits, `-`, `_`
    /// or `.`), whose deposits live in `local` and whose blocks come from `home`.
    pub fn builder<H: LeaseBackend>(
        name: impl Into<String>,
        local: RedisStore,
        home: H,
    ) -> RegionalLedgerBuilder<H> {
        RegionalLedgerBuilder {
            name: name.into(),
            local,
            home,
            home_lease: DEFAULT_HOME_LEASE,
            fraction: DEFAULT_MAX_DEPOSIT_FRACTION,
        }
    }
}

impl<H> RegionalLedger<H> {
    /// The region's name.
    ///
    /// ```
    /// # use tollgate::store::{regions::RegionalLedger, RedisStore};
    /// let region = RegionalLedger::builder(
    ///     "us-east",
    ///     RedisStore::from_url("redis://127.0.0.1:6380")?,
    ///     RedisStore::from_url("redis://127.0.0.1:6390")?,
    /// )
    /// .build()?;
    /// assert_eq!(region.name(), "us-east");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// What flowed between this region (as this process sees it) and the home since it was
    /// built.
    ///
    /// ```
    /// # use tollgate::store::{regions::RegionalLedger, RedisStore};
    /// let region = RegionalLedger::builder(
    ///     "eu",
    ///     RedisStore::from_url("redis://127.0.0.1:6380")?,
    ///     RedisStore::from_url("redis://127.0.0.1:6390")?,
    /// )
    /// .build()?;
    /// assert_eq!(region.stats().deposits, 0);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn stats(&self) -> RegionStats {
        self.inner.counters.snapshot()
    }
}

/// Builds a [`RegionalLedger`]: the home lease and the largest deposit.
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::regions::RegionalLedger;
/// use tollgate::store::RedisStore;
///
/// let region = RegionalLedger::builder(
///     "ap",
///     RedisStore::from_url("redis://127.0.0.1:6380")?,
///     RedisStore::from_url("redis://127.0.0.1:6390")?,
/// )
/// .home_lease(Duration::from_secs(2))
/// .max_deposit_fraction(0.1)
/// .build()?;
/// # let _ = region;
/// let err = RegionalLedger::builder(
///     "ap",
///     RedisStore::from_url("redis://127.0.0.1:6380")?,
///     RedisStore::from_url("redis://127.0.0.1:6390")?,
/// )
/// .max_deposit_fraction(1.5)
/// .build()
/// .unwrap_err();
/// assert_eq!(err.field(), "max_deposit_fraction");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct RegionalLedgerBuilder<H> {
    name: String,
    local: RedisStore,
    home: H,
    home_lease: Duration,
    fraction: f64,
}

impl<H: LeaseBackend> RegionalLedgerBuilder<H> {
    /// How long a region may lend a block it took from the home (50 ms to 60 s; default
    /// [`DEFAULT_HOME_LEASE`]). Longer leases mean fewer calls to the home and more units
    /// unused in deposits (for the token bucket and GCRA, a larger refill charged ahead);
    /// give it several home round trips, so a renewal lands before its deposit ends.
    pub fn home_lease(mut self, lease: Duration) -> Self {
        self.home_lease = lease;
        self
    }

    /// The largest deposit, as a fraction of the limit (of the capacity for the token bucket
    /// and GCRA): more than 0, at most 1; default [`DEFAULT_MAX_DEPOSIT_FRACTION`].
    pub fn max_deposit_fraction(mut self, fraction: f64) -> Self {
        self.fraction = fraction;
        self
    }

    /// The regional ledger.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `name`, `home_lease` or `max_deposit_fraction` and the value
    /// out of range.
    pub fn build(self) -> Result<RegionalLedger<H>, ConfigError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            return Err(ConfigError::new(
                "name",
                format_args!("{:?}", self.name),
                "a region's name is 1 to 64 letters, digits, '-', '_' or '.'",
            ));
        }
        let ms = u64::try_from(self.home_lease.as_millis()).unwrap_or(u64::MAX);
        if !(50..=60_000).contains(&ms) || !self.home_lease.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(ConfigError::new(
                "home_lease",
                format_args!("{:?}", self.home_lease),
                "must be 50 ms to 60 s, in whole milliseconds",
            ));
        }
        if !(self.fraction > 0.0 && self.fraction <= 1.0) {
            return Err(ConfigError::new(
                "max_deposit_fraction",
                self.fraction,
                "must be more than 0 and at most 1",
            ));
        }
        Ok(RegionalLedger {
            inner: Arc::new(home::Region::new(
                self.name.into(),
                self.local,
                self.home,
                ms,
                self.fraction,
            )),
        })
    }
}
