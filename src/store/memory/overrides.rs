//! Per-key overrides kept by the memory store (see [`crate::overrides`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::Policy;

/// Per-key overrides (see [`crate::overrides`]): by key, the policies to decide it with
/// instead of the plan's (matched by policy id and algorithm), each with its expiry. Decisions
/// read `active` (the number of keys with overrides) first, so a store with none pays one
/// atomic load per decision, and a store with some one lookup of the key (not one per policy).
#[derive(Default)]
pub(super) struct Overrides {
    active: AtomicUsize,
    map: RwLock<HashMap<Key, SmallVec<[Override; 1]>>>,
}

/// The overriding policy and when it ends (ms), if it does.
type Override = (Policy, Option<u64>);

/// Whether `over` overrides `policy`.
fn overrides(over: &Override, policy: &Policy) -> bool {
    over.0.id() == policy.id() && over.0.algorithm() == policy.algorithm()
}

/// `policy` (the plan's, as it is now) under the limit and capacity of `over`: an override
/// replaces those two numbers only, as the Redis stores keep them. The overriding policy as
/// it was set serves while the plan's window and shaping are unchanged; after a reload that
/// changed them, the override's numbers are applied to the new policy.
fn applied(over: &Policy, policy: &Policy) -> Policy {
    if over.window_millis() == policy.window_millis()
        && over.max_delay() == policy.max_delay()
        && over.cost() == policy.cost()
    {
        return over.clone();
    }
    let burst = (over.capacity() != over.limit()).then_some(over.capacity());
    policy
        .with_limit(over.limit(), burst)
        .unwrap_or_else(|_| over.clone())
}

/// Whether `over` is still in force at `now`.
fn in_force(over: &Override, now: u64) -> bool {
    over.1.is_none_or(|e| e > now)
}

impl Overrides {
    /// `policies`, each replaced by `key`'s override of it where one is in force at `now`.
    #[inline]
    pub(super) fn effective<'p>(
        &self,
        key: &Key,
        policies: &'p [Policy],
        now: u64,
    ) -> Cow<'p, [Policy]> {
        if self.active.load(Ordering::Relaxed) == 0 {
            return Cow::Borrowed(policies);
        }
        self.lookup(key, policies, now)
    }

    #[inline(never)]
    fn lookup<'p>(&self, key: &Key, policies: &'p [Policy], now: u64) -> Cow<'p, [Policy]> {
        let map = self.map.read();
        let Some(held) = map.get(key) else {
            return Cow::Borrowed(policies);
        };
        let mut out: Option<Vec<Policy>> = None;
        for (i, p) in policies.iter().enumerate() {
            if let Some(over) = held.iter().find(|o| overrides(o, p) && in_force(o, now)) {
                out.get_or_insert_with(|| policies.to_vec())[i] = applied(&over.0, p);
            }
        }
        out.map_or(Cow::Borrowed(policies), Cow::Owned)
    }

    pub(super) fn set(&self, key: &Key, policy: &Policy, expires: Option<u64>, now: u64) {
        let mut map = self.map.write();
        map.retain(|_, held| {
            held.retain(|o| in_force(o, now));
            !held.is_empty()
        });
        let held = map.entry(key.clone()).or_default();
        held.retain(|o| !overrides(o, policy));
        held.push((policy.clone(), expires));
        self.active.store(map.len(), Ordering::Relaxed);
    }

    pub(super) fn remove(&self, key: &Key, policy: &Policy) {
        let mut map = self.map.write();
        if let Some(held) = map.get_mut(key) {
            held.retain(|o| !overrides(o, policy));
            if held.is_empty() {
                map.remove(key);
            }
        }
        self.active.store(map.len(), Ordering::Relaxed);
    }

    pub(super) fn list(&self, key: &Key, policies: &[Policy], now: u64) -> Vec<ActiveOverride> {
        let map = self.map.read();
        let Some(held) = map.get(key) else {
            return vec![];
        };
        policies
            .iter()
            .filter_map(|p| {
                let over = held.iter().find(|o| overrides(o, p) && in_force(o, now))?;
                Some(ActiveOverride::new(
                    p.name().to_owned(),
                    over.0.limit(),
                    over.0.capacity(),
                    over.1.map(|e| Duration::from_millis(e - now)),
                ))
            })
            .collect()
    }
}
