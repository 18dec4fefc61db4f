//! One decision as the engine sends it: its state keys, each policy's parameters, what it
//! asks of each (an [`Amount`]) and its [`Mode`]. The wire format ([`wire`](super::wire))
//! writes requests into script calls; the lanes ([`batch`](super::batch)) queue them.

use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::decision::Decision;
use crate::error::StoreError;

/// One decision waiting for, or in, a script call.
pub(crate) struct Request {
    /// The state key of each policy.
    pub(crate) keys: SmallVec<[String; 2]>,
    pub(crate) params: SmallVec<[Params; 2]>,
    /// What the request sends for each policy.
    pub(crate) amounts: SmallVec<[Amount; 2]>,
    pub(crate) mode: Mode,
    /// Where a queued request's answer goes; `None` for the caller that runs its own call.
    pub(crate) reply: Option<oneshot::Sender<Result<Decision, StoreError>>>,
}

/// A policy's parameters as the script takes them: algorithm id, limit, window ms,
/// capacity, max delay ms.
pub(crate) type Params = [u64; 5];

/// What a request asks of its states: the mode byte of `lua/decide.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Evaluate only.
    Peek = 0,
    /// Evaluate, and charge when every policy allows.
    Charge = 1,
    /// Give back up to each cost (see [`Op::Refund`](crate::store::Op::Refund)), or
    /// the slot named by the cost of an in-flight policy.
    Refund = 2,
    /// Charge each cost whether or not it fits, or refund it when negative (see
    /// [`Op::Settle`](crate::store::Op::Settle)); costs are sent as signed.
    Settle = 3,
    /// Push back the expiry of the in-flight slot named by each cost.
    Refresh = 4,
}

/// The largest magnitude a cost travels with: 2^53 − 1, the largest integer a Lua number
/// (a double) holds exactly. Every algorithm answers a larger cost as it answers this one
/// (it is above any capacity, any state's usage and any refund's reach; see
/// [`crate::algorithm`]), so the clamp changes no answer, where a double rounding it, or an
/// `i64` wrapping it, would.
pub(crate) const MAX_WIRE_COST: u64 = (1 << 53) - 1;

/// What a request sends for one policy, typed by what it is; the script reads it as the
/// request's [`Mode`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Amount {
    /// Units to charge, look at or give back.
    Units(u64),
    /// The name of an in-flight slot to take, give back or extend (below 2^53, see
    /// [`next_slot`](super::ops::next_slot)).
    Slot(u64),
    /// A settlement: `reserved` units were charged up front (the reservation) and the request
    /// cost `actual`; the difference is charged or given back.
    Settled {
        /// Units charged when the request was admitted.
        reserved: u64,
        /// Units the request turned out to cost.
        actual: u64,
    },
}

/// Units per policy, as the script takes them.
pub(crate) fn units(costs: &[u64]) -> SmallVec<[Amount; 2]> {
    costs.iter().map(|&c| Amount::Units(c)).collect()
}

impl Amount {
    /// The number the script takes: units clamped to [`MAX_WIRE_COST`]; a settlement's
    /// difference `actual − reserved`, its magnitude clamped and its sign kept (never a
    /// wrapped difference, which would turn a charge of 2^63 or more into a refund).
    pub(crate) fn wire(self) -> f64 {
        match self {
            Self::Units(units) => units.min(MAX_WIRE_COST) as f64,
            Self::Slot(slot) => slot.min(MAX_WIRE_COST) as f64,
            Self::Settled { reserved, actual } if actual >= reserved => {
                (actual - reserved).min(MAX_WIRE_COST) as f64
            }
            Self::Settled { reserved, actual } => -((reserved - actual).min(MAX_WIRE_COST) as f64),
        }
    }

    /// The units asked, for a charge or a look; `None` for a slot or a settlement.
    pub(crate) fn units(self) -> Option<u64> {
        match self {
            Self::Units(units) => Some(units),
            Self::Slot(_) | Self::Settled { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_travel_clamped_and_settlements_keep_their_sign() {
        let max = MAX_WIRE_COST as f64;
        for (cost, sent) in [
            (0, 0.0),
            (1, 1.0),
            (MAX_WIRE_COST, max),
            (1 << 53, max),
            (1 << 63, max),
            (u64::MAX, max),
        ] {
            assert_eq!(Amount::Units(cost).wire(), sent, "{cost}");
        }
        for (reserved, actual, sent) in [
            (10, 10, 0.0),
            (10, 11, 1.0),
            (11, 10, -1.0),
            (10, u64::MAX, max),
            (10, 1 << 63, max),
            (10, (1 << 63) + 10, max),
            (0, (1 << 53) + 7, max),
            (u64::MAX, 0, -max),
            (1 << 63, 0, -max),
            (u64::MAX, u64::MAX - 3, -3.0),
        ] {
            assert_eq!(
                Amount::Settled { reserved, actual }.wire(),
                sent,
                "settle({reserved}, {actual})"
            );
        }
    }
}
