//! Building a [`LeasedStore`]: every setting checked at build time.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::{Clock, SystemClock};
use crate::error::ConfigError;

/// Builds a [`LeasedStore`]. See the [module docs](crate::store::leased) for an example.
#[must_use]
pub struct LeasedStoreBuilder<S> {
    pub(super) inner: S,
    pub(super) lease_time: Duration,
    pub(super) fraction: f64,
    pub(super) max_keys: usize,
    pub(super) clock: Option<Arc<dyn Clock>>,
}

impl<S: fmt::Debug> fmt::Debug for LeasedStoreBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedStoreBuilder")
            .field("inner", &self.inner)
            .field("lease_time", &self.lease_time)
            .field("max_block_fraction", &self.fraction)
            .finish()
    }
}

impl<S: LeaseBackend> LeasedStoreBuilder<S> {
    /// How long a block may be spent (default [`DEFAULT_LEASE_TIME`]; 10 ms to 60 s). Longer
    /// leases cost fewer calls and, for the token bucket and GCRA, charge more refill ahead.
    pub fn lease_time(mut self, lease_time: Duration) -> Self {
        self.lease_time = lease_time;
        self
    }

    /// The largest block, as a fraction of the limit (the capacity for the token bucket and
    /// GCRA); default [`DEFAULT_MAX_BLOCK_FRACTION`], more than 0 and at most 0.5. A policy
    /// whose fraction is under two requests' cost is never leased.
    pub fn max_block_fraction(mut self, fraction: f64) -> Self {
        self.fraction = fraction;
        self
    }

    /// The most keys this instance tracks at once (default [`DEFAULT_MAX_KEYS`], at least
    /// 1). A key is tracked from its second decision (the first is decided exactly and
    /// leaves only its hash in a short memory of recent keys: one 8-byte cell per key of the
    /// cap, 1 024 to 65 536 cells); a tracked key keeps its observed rate, its block and its
    /// last refusal, and is forgotten after eight idle lease times (at least 5 s). While the cap is reached, a
    /// request for an untracked key is decided exactly (one ledger call) and not remembered,
    /// so a flood of distinct keys costs calls, never memory ([`LeaseStats::first_sightings`]
    /// and [`LeaseStats::untracked`] count them).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The local clock that times blocks (default: the system clock). For tests with a
    /// [`ManualClock`](crate::clock::ManualClock) shared with a [`MemoryLedger`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The store.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::store::leased::{LeasedStore, MemoryLedger};
    ///
    /// let err = LeasedStore::builder(MemoryLedger::new())
    ///     .max_block_fraction(0.9)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!((err.field(), err.value()), ("max_block_fraction", "0.9"));
    /// let err = LeasedStore::builder(MemoryLedger::new())
    ///     .lease_time(Duration::from_millis(1))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "lease_time");
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `lease_time`, `max_block_fraction` or `max_keys` out of range.
    pub fn build(self) -> Result<LeasedStore<S>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::new("max_keys", 0, "at least 1"));
        }
        let ms = u64::try_from(self.lease_time.as_millis()).unwrap_or(u64::MAX);
        if !(10..=60_000).contains(&ms) || !self.lease_time.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(ConfigError::new(
                "lease_time",
                format_args!("{:?}", self.lease_time),
                "must be 10 ms to 60 s, in whole milliseconds",
            ));
        }
        if !(self.fraction > 0.0 && self.fraction <= 0.5) {
            return Err(ConfigError::new(
                "max_block_fraction",
                self.fraction,
                "must be more than 0 and at most 0.5",
            ));
        }
        // Lease ids name log entries in the shared ledger: unique across instances.
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(SystemClock::new().now_millis());
            h.write_u32(std::process::id());
            h.finish()
        };
        Ok(LeasedStore {
            shared: Arc::new(Shared {
                inner: self.inner,
                lease_ms: ms,
                fraction: self.fraction,
                max_keys: self.max_keys,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock::new())),
                entries: super::table::EntryTable::new(self.max_keys),
                next_id: AtomicU64::new(seed >> 1),
                charges: Default::default(),
                counters: Counters::default(),
                sweeper: AtomicBool::new(false),
                overrides_in_order: Arc::default(),
            }),
        })
    }
}
