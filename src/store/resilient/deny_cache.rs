//! The deny cache of a [`ResilientStore`](super::ResilientStore): denials the store gave,
//! answered again locally until they end, without a round trip.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::algorithm::PolicyDecision;
use crate::decision::{DecidedBy, Decision};
use crate::key::Key;
use crate::policy::Policy;

/// Current denials from the store, keyed by (key, policies, costs), each until its moment
/// (at most `max_age_ms` after it was cached).
pub(super) struct DenyCache {
    capacity: usize,
    max_age_ms: u64,
    hasher: foldhash::fast::RandomState,
    /// slot → the denial.
    entries: Mutex<HashMap<u64, Cached>>,
    /// The store's generation the entries were cached under.
    generation: AtomicU64,
}

struct Cached {
    key: Key,
    at: u64,
    /// When the cache stops serving it: the store's moment, or the max age.
    until: u64,
    /// When the store said the request would be allowed.
    store_until: u64,
    decision: Decision,
}

impl DenyCache {
    pub(super) fn new(capacity: usize, max_age: Duration) -> Self {
        Self {
            capacity,
            max_age_ms: max_age.as_millis().try_into().unwrap_or(u64::MAX),
            hasher: foldhash::fast::RandomState::default(),
            entries: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
        }
    }

    pub(super) fn slot(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> u64 {
        let mut h = self.hasher.build_hasher();
        key.hash(&mut h);
        for (p, c) in policies.iter().zip(costs) {
            p.name().hash(&mut h);
            c.hash(&mut h);
        }
        h.finish()
    }

    /// Drops every entry when the store's generation moved: it lost the state they stand for.
    pub(super) fn sync(&self, generation: u64) {
        if self.generation.load(Ordering::Acquire) != generation
            && self.generation.swap(generation, Ordering::AcqRel) != generation
        {
            self.entries.lock().clear();
        }
    }

    pub(super) fn get(&self, slot: u64, key: &Key, now: u64) -> Option<Decision> {
        let mut entries = self.entries.lock();
        let cached = entries.get(&slot)?;
        if cached.key != *key {
            return None;
        }
        if now >= cached.until {
            entries.remove(&slot);
            return None;
        }
        Some(shift(
            &cached.decision,
            now.saturating_sub(cached.at),
            cached.store_until.saturating_sub(now),
        ))
    }

    pub(super) fn insert(
        &self,
        slot: u64,
        key: &Key,
        decision: Decision,
        now: u64,
        generation: u64,
    ) {
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        let store_until = now.saturating_add(decision.retry_after_millis());
        let until = store_until.min(now.saturating_add(self.max_age_ms));
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity {
            entries.retain(|_, c| c.until > now);
            if entries.len() >= self.capacity {
                return;
            }
        }
        entries.insert(
            slot,
            Cached {
                key: key.clone(),
                at: now,
                until,
                store_until,
                decision,
            },
        );
    }

    pub(super) fn forget(&self, key: &Key) {
        self.entries.lock().retain(|_, c| c.key != *key);
    }
}

/// A cached denial as seen `elapsed` ms after it was cached, `left` ms before it ends.
pub(super) fn shift(decision: &Decision, elapsed: u64, left: u64) -> Decision {
    let policies: SmallVec<[PolicyDecision; 2]> = decision
        .policies()
        .iter()
        .map(|d| {
            PolicyDecision::from_parts(
                d.is_allowed(),
                d.limit(),
                d.remaining(),
                d.reset_after_millis().saturating_sub(elapsed),
                if d.is_allowed() {
                    0
                } else {
                    d.retry_after_millis().saturating_sub(elapsed).min(left)
                },
                0,
            )
        })
        .collect();
    Decision::from_policies(policies).with_decided_by(DecidedBy::CachedDeny)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_denials_count_down() {
        let d = Decision::single(PolicyDecision::from_parts(false, 5, 0, 900, 700, 0));
        let later = shift(&d, 200, 500);
        assert_eq!(later.decided_by(), DecidedBy::CachedDeny);
        assert!(!later.is_allowed());
        assert_eq!(later.retry_after_millis(), 500);
        assert_eq!(later.reset_after().as_millis(), 700);
    }
}
