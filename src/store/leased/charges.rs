//! The units this instance charged at the ledger outside blocks (a request decided exactly:
//! a cold key, a limit too small for blocks, a cost too large for one), kept per key for a
//! while so that their give-back names the charge: the ledger then takes it off that very
//! charge (the sliding window log's entry, the window it was counted in), and a region sends
//! it to the home that decided it. A give-back of more than a key's recorded charges, or of
//! a charge no longer recorded, goes to the ledger unnamed (see `give_back_units`).

use std::collections::{HashMap, VecDeque};

use smallvec::SmallVec;

use crate::key::Key;
use crate::policy::Policy;

/// How many keys' charges are kept; past it the oldest key's are forgotten.
const MAX_KEYS: usize = 4_096;
/// How many charges are kept per key; past it the oldest is forgotten.
const PER_KEY: usize = 8;

/// One request's charge at the ledger: the call that made it, when (the ledger's time), and
/// the units it left charged per policy.
struct Charge {
    policies: SmallVec<[u32; 2]>,
    id: u64,
    at: u64,
    units: SmallVec<[u64; 2]>,
    /// When the charge stops counting anywhere (the ledger's time): after its longest window.
    until: u64,
}

/// A part of a give-back that names its charge: the call's id, its time and the units per
/// policy.
pub(super) type Named = (u64, u64, SmallVec<[u64; 2]>);

#[derive(Default)]
pub(super) struct ExactCharges {
    inner: parking_lot::Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<Key, VecDeque<Charge>>,
    order: VecDeque<Key>,
}

fn ids(policies: &[Policy]) -> SmallVec<[u32; 2]> {
    policies.iter().map(Policy::id).collect()
}

impl ExactCharges {
    /// Records that the ledger call `id` charged `costs` to `key`'s `policies` at `at`.
    pub(super) fn record(&self, key: &Key, policies: &[Policy], id: u64, at: u64, costs: &[u64]) {
        if costs.iter().all(|&c| c == 0) {
            return;
        }
        let longest = policies
            .iter()
            .map(|p| u64::try_from(p.rate().window().as_millis()).unwrap_or(u64::MAX))
            .max()
            .unwrap_or(0);
        let charge = Charge {
            policies: ids(policies),
            id,
            at,
            units: costs.iter().copied().collect(),
            until: at.saturating_add(longest),
        };
        let mut inner = self.inner.lock();
        let Inner { by_key, order } = &mut *inner;
        if !by_key.contains_key(key) {
            // `order` may name keys forgotten since: it is kept within twice the cap.
            while by_key.len() >= MAX_KEYS || order.len() >= 2 * MAX_KEYS {
                let Some(oldest) = order.pop_front() else {
                    break;
                };
                by_key.remove(&oldest);
            }
            order.push_back(key.clone());
        }
        let charges = by_key.entry(key.clone()).or_default();
        if charges.len() >= PER_KEY {
            charges.pop_front();
        }
        charges.push_back(charge);
    }

    /// Takes up to `units` per policy off `key`'s recorded charges of these `policies`, the
    /// newest first (as the exact stores give back), at `now`: what each charge gives back.
    /// `units` keeps what no recorded charge covers.
    pub(super) fn take(
        &self,
        key: &Key,
        policies: &[Policy],
        units: &mut [u64],
        now: u64,
    ) -> SmallVec<[Named; 1]> {
        let mut named = SmallVec::new();
        let mut inner = self.inner.lock();
        let Some(charges) = inner.by_key.get_mut(key) else {
            return named;
        };
        charges.retain(|c| c.until > now);
        let wanted = ids(policies);
        for charge in charges.iter_mut().rev() {
            if units.iter().all(|&u| u == 0) {
                break;
            }
            if charge.policies != wanted {
                continue;
            }
            let back: SmallVec<[u64; 2]> = charge
                .units
                .iter_mut()
                .zip(units.iter_mut())
                .map(|(held, left)| {
                    let taken = (*held).min(*left);
                    *held -= taken;
                    *left -= taken;
                    taken
                })
                .collect();
            if back.iter().any(|&b| b > 0) {
                named.push((charge.id, charge.at, back));
            }
        }
        charges.retain(|c| c.units.iter().any(|&u| u > 0));
        if charges.is_empty() {
            inner.by_key.remove(key);
        }
        named
    }

    /// Forgets the charge of ledger call `id` of `key` (given back whole by other means).
    pub(super) fn forget(&self, key: &Key, id: u64) {
        if let Some(charges) = self.inner.lock().by_key.get_mut(key) {
            charges.retain(|c| c.id != id);
        }
    }

    /// Forgets `key`'s charges (its state was reset).
    pub(super) fn forget_key(&self, key: &Key) {
        self.inner.lock().by_key.remove(key);
    }
}
