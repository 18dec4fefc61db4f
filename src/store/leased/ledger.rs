//! The lease ledger: what a shared store keeps for leased policies, and the one call that
//! grants, decides, peeks, gives back or charges.
//!
//! `lua/lease.lua` is this arithmetic for Redis; [`MemoryLedger`] runs it in process (for
//! tests and simulations: one ledger shared by several [`LeasedStore`](super::LeasedStore)s
//! of one process stands for a Redis shared by several instances).

use crate::error::StoreError;
use crate::key::Key;
use crate::policy::{Algorithm, Policy};
use crate::store::{BoxFuture, Store};

mod call;
mod memory;
mod reply;
mod run;
mod state;
#[cfg(all(test, feature = "redis"))]
mod tests;

pub use call::LedgerCall;
#[cfg(feature = "redis")]
pub(crate) use call::PART_BYTES;
pub(crate) use call::{Override, Part, Returned};
pub use memory::MemoryLedger;
pub(crate) use reply::Answer;
pub use reply::LedgerReply;

/// How a leased policy is kept in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// The sliding window counter: blocks end at the window boundary.
    Counter = 1,
    /// The sliding window log: a block is an entry that counts until its lease ends.
    Log = 2,
    /// The token bucket and (non-shaping) GCRA, one meter: a block is also charged the refill
    /// its lease would hand out (the refill charged ahead).
    Bucket = 3,
    /// The fixed window: blocks end at the window boundary.
    Fixed = 4,
}

impl Kind {
    /// The kind a policy is leased as, or `None` when it is decided exactly.
    pub(crate) fn of(policy: &Policy) -> Option<Kind> {
        match policy.algorithm() {
            Algorithm::SlidingWindowCounter => Some(Kind::Counter),
            Algorithm::SlidingWindowLog => Some(Kind::Log),
            Algorithm::TokenBucket => Some(Kind::Bucket),
            Algorithm::Gcra if policy.max_delay().is_none() => Some(Kind::Bucket),
            Algorithm::FixedWindow => Some(Kind::Fixed),
            Algorithm::Gcra | Algorithm::InFlight => None,
        }
    }
}

/// What a ledger call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerMode {
    Grant,
    Peek,
    Return,
    Force,
    Reset,
    /// An override was just set: keep each bucket state at least as long as the override's
    /// refill rate needs it (Redis TTLs; nothing to do in process).
    Keep,
}

impl LedgerMode {
    #[cfg(feature = "redis")]
    pub(crate) fn code(self) -> &'static str {
        match self {
            LedgerMode::Grant => "g",
            LedgerMode::Peek => "p",
            LedgerMode::Return => "r",
            LedgerMode::Force => "f",
            LedgerMode::Reset => "x",
            LedgerMode::Keep => "k",
        }
    }
}

/// The future of [`LeaseBackend::ledger`].
pub type LedgerFuture = BoxFuture<Result<LedgerReply, StoreError>>;

/// A shared store that keeps a lease ledger: what [`LeasedStore`](super::LeasedStore)
/// needs from the store it wraps, besides the ordinary [`Store`] it uses for the policies
/// that cannot be leased.
///
/// Implemented by `RedisStore` and `RedisClusterStore` (feature `redis`, `cluster`: one
/// atomic script per call, all of a key's ledger entries under its hash tag) and by
/// [`MemoryLedger`].
///
/// ```
/// use tollgate::store::leased::{LeaseBackend, MemoryLedger};
///
/// fn takes_a_backend(_: &impl LeaseBackend) {}
/// takes_a_backend(&MemoryLedger::new());
/// ```
pub trait LeaseBackend: Store {
    /// Runs one ledger call for `key`'s `policies` (in the order of the call's parts),
    /// atomically.
    fn ledger(&self, key: &Key, policies: &[Policy], call: LedgerCall) -> LedgerFuture;
}
