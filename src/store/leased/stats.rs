//! What a [`LeasedStore`] counts of its leases.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(doc)]
use super::{LeasedStore, LeasedStoreBuilder};

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
pub(super) struct Counters {
    pub(super) grants: AtomicU64,
    pub(super) units_granted: AtomicU64,
    pub(super) exact_calls: AtomicU64,
    pub(super) refusals: AtomicU64,
    pub(super) local_admits: AtomicU64,
    pub(super) local_refusals: AtomicU64,
    pub(super) units_returned: AtomicU64,
    pub(super) units_dropped: AtomicU64,
    pub(super) untracked: AtomicU64,
    pub(super) first_sightings: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}
