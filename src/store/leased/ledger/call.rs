//! A ledger call: what it asks of each policy, and the block it gives back.

use smallvec::SmallVec;

use super::{Kind, LedgerMode};
use crate::policy::Policy;

/// One policy's part of a ledger call: the policy's numbers, what the call asks of it, and
/// the block it gives back, if any.
///
/// `limit` and `capacity` are the plan's; the ledger decides with the key's override of the
/// policy instead, when one is in force (see [`Override`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) kind: Kind,
    /// Units per window (`N`; for the bucket, the refill per window).
    pub(crate) limit: u64,
    /// The window, in ms (`W`).
    pub(crate) window_ms: u64,
    /// The most units the state holds at once (`C`; the limit but for the bucket).
    pub(crate) capacity: u64,
    /// Grant and peek: the request's cost, which must fit. Force: the units charged
    /// whatever the state (a cost settled above its reservation).
    pub(crate) cost: u64,
    /// Grant: the most units the block may hold (at least `cost`).
    pub(crate) wanted: u64,
    /// Return: the block given back. Grant: the block in hand, given back first, when the
    /// call names it ([`LedgerCall::previous_block`]).
    pub(crate) returned: Returned,
}

/// What a block given back held of one policy, and when and for how long it was lent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Returned {
    /// Units it was granted.
    pub(crate) granted: u64,
    /// Units it leaves unused.
    pub(crate) unused: u64,
    /// When it was granted, on the ledger's clock (ms).
    pub(crate) granted_at: u64,
    /// Its lease: how long it could be spent (ms; 0 for a request decided exactly).
    pub(crate) lease_ms: u64,
    /// The limit (refill rate) in force when it was granted; 0 when unknown (the one in
    /// force now). A bucket gives back the refill charged ahead at the lower of that rate
    /// and today's, so an override raised meanwhile cannot return more than the block was
    /// charged.
    pub(crate) rate: u64,
}

impl Part {
    /// The part of `policy` with the plan's limit and capacity, also for an override's policy
    /// (as setting one hands it): the ledger reads the override in force itself, and keeps
    /// its states for the slower of the plan's rate and that one.
    pub(crate) fn new(kind: Kind, policy: &Policy) -> Self {
        let plan = policy.plan_limits();
        Self {
            kind,
            limit: plan.limit(),
            window_ms: policy.window_millis(),
            capacity: plan.capacity(),
            cost: 0,
            wanted: 0,
            returned: Returned::default(),
        }
    }

    /// This part with `over`'s limit and capacity in place of the plan's, when given.
    pub(super) fn with_override(mut self, over: Option<Override>) -> Self {
        if let Some(o) = over {
            self.limit = o.limit;
            self.capacity = o.capacity;
        }
        self
    }
}

/// A per-key override of a leased policy, as the ledger reads it: the limit (refill rate per
/// window) and capacity to decide with instead of the plan's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Override {
    pub(crate) limit: u64,
    pub(crate) capacity: u64,
}

impl Override {
    /// An override the ledger can use with window `w`: both numbers at least 1 and within the
    /// bounds every policy keeps (`× w ≤ 2^50`, so the arithmetic stays exact in Lua too).
    /// Anything else is ignored: the plan's numbers apply.
    pub(crate) fn usable(limit: u64, capacity: u64, w: u64) -> Option<Self> {
        let fits = |x: u64| {
            x >= 1
                && x.checked_mul(w)
                    .is_some_and(|p| p <= crate::policy::MAX_CAPACITY_WINDOW_PRODUCT)
        };
        (fits(limit) && fits(capacity)).then_some(Self { limit, capacity })
    }
}

/// One call to a lease ledger: which policies, what to do, for how long.
///
/// Built by [`LeasedStore`](crate::store::leased::LeasedStore); a
/// [`LeaseBackend`](crate::store::leased::LeaseBackend) only carries it to its
/// ledger.
#[derive(Debug, Clone)]
pub struct LedgerCall {
    pub(crate) mode: LedgerMode,
    /// Grants: the lease asked for, in ms (how long the block may be spent); 0 asks for no
    /// block: the request is decided exactly.
    pub(crate) lease_ms: u64,
    /// The block the call grants or gives back (a sliding window log's entry for it; a
    /// force's entry of the debt).
    pub(crate) block_id: u64,
    /// Grants only: the block in hand, given back first (0: none).
    pub(crate) previous_block: u64,
    pub(crate) parts: SmallVec<[Part; 2]>,
}

impl LedgerCall {
    /// Each policy's eleven integers (kind, limit, window, capacity, cost, wanted, then the
    /// block given back: granted, unused, granted at, lease, rate) as little-endian doubles,
    /// the binary string `lua/lease.lua` reads. Exact for every whole number below 2^53
    /// (counts, milliseconds); a cost above that (only a caller's settlement can send one)
    /// arrives rounded, and is then above any limit and past the debt's saturation
    /// (⌊2^52 / W⌋ units) either way.
    #[cfg(feature = "redis")]
    pub(crate) fn packed_parts(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PART_BYTES * self.parts.len());
        for p in &self.parts {
            let back = &p.returned;
            for x in [
                p.kind as u64,
                p.limit,
                p.window_ms,
                p.capacity,
                p.cost,
                p.wanted,
                back.granted,
                back.unused,
                back.granted_at,
                back.lease_ms,
                back.rate,
            ] {
                v.extend_from_slice(&(x as f64).to_le_bytes());
            }
        }
        v
    }
}

/// The bytes of one policy's part of a call: eleven doubles.
#[cfg(feature = "redis")]
pub(crate) const PART_BYTES: usize = 11 * 8;
