//! What a [`RegionalLedger`](super::RegionalLedger) counts of the flows between its region
//! and the home.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one process's [`RegionalLedger`](super::RegionalLedger) since it was built:
/// the calls it made to the home and the units that flowed.
///
/// ```
/// use tollgate::store::regions::RegionStats;
///
/// let s = RegionStats::default();
/// assert_eq!(s.home_calls(), 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegionStats {
    /// Deposits taken from the home (renewals that were granted a block).
    pub deposits: u64,
    /// Units in those deposits (the largest part, for several policies).
    pub units_deposited: u64,
    /// Requests the home decided exactly (no deposit in the region, or one being renewed).
    pub exact_at_home: u64,
    /// Home calls that refused (the global limit reached).
    pub refusals: u64,
    /// Replaced or emptied deposits given back to the home.
    pub returns: u64,
    /// Unused units given back to the home.
    pub units_returned: u64,
    /// Unused units given up (a failed return or install, a renewal a reset overtook, a
    /// block given back to a deposit that has ended or been reset, a refund the region no
    /// longer traces): under-admission until their window or refill frees them.
    pub units_dropped: u64,
    /// Home calls that failed.
    pub errors: u64,
    /// Other calls forwarded to the home (peeks, debts, resets, overrides, policies that are
    /// not leased).
    pub forwarded: u64,
}

impl RegionStats {
    /// Every call made to the home: what crosses regions.
    ///
    /// ```
    /// use tollgate::store::regions::RegionStats;
    ///
    /// assert_eq!(RegionStats::default().home_calls(), 0);
    /// ```
    pub fn home_calls(&self) -> u64 {
        self.deposits
            + self.exact_at_home
            + self.refusals
            + self.returns
            + self.errors
            + self.forwarded
    }
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) deposits: AtomicU64,
    pub(super) units_deposited: AtomicU64,
    pub(super) exact_at_home: AtomicU64,
    pub(super) refusals: AtomicU64,
    pub(super) returns: AtomicU64,
    pub(super) units_returned: AtomicU64,
    pub(super) units_dropped: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) forwarded: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> RegionStats {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RegionStats {
            deposits: r(&self.deposits),
            units_deposited: r(&self.units_deposited),
            exact_at_home: r(&self.exact_at_home),
            refusals: r(&self.refusals),
            returns: r(&self.returns),
            units_returned: r(&self.units_returned),
            units_dropped: r(&self.units_dropped),
            errors: r(&self.errors),
            forwarded: r(&self.forwarded),
        }
    }
}

pub(super) fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}
