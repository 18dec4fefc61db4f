//! Per-key overrides kept by the memory store (see [`crate::overrides`]).

use std::borrow::Cow;
use std::time::Duration;

use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::{Algorithm, Policy};

/// Per-key overrides (see [`crate::overrides`]): the policy to decide a key with instead of
/// the plan's, by (key, policy, algorithm), with its expiry. Decisions read `active` first, so
/// a store with no override pays one atomic load per decision.
#[derive(Default)]
pub(super) struct Overrides {
    active: std::sync::atomic::AtomicUsize,
    map: parking_lot::RwLock<OverrideMap>,
}

type OverrideMap = std::collections::HashMap<(Key, u32, Algorithm), (Policy, Option<u64>)>;

impl Overrides {
    /// `policies`, each replaced by `key`'s override of it where one is in force at `now`.
    #[inline]
    pub(super) fn effective<'p>(
        &self,
        key: &Key,
        policies: &'p [Policy],
        now: u64,
    ) -> Cow<'p, [Policy]> {
        if self.active.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return Cow::Borrowed(policies);
        }
        self.lookup(key, policies, now)
    }

    #[inline(never)]
    pub(super) fn lookup<'p>(
        &self,
        key: &Key,
        policies: &'p [Policy],
        now: u64,
    ) -> Cow<'p, [Policy]> {
        let map = self.map.read();
        let mut out: Option<Vec<Policy>> = None;
        for (i, p) in policies.iter().enumerate() {
            let found = map
                .get(&(key.clone(), p.id(), p.algorithm()))
                .filter(|(_, expires)| expires.is_none_or(|e| e > now));
            if let Some((over, _)) = found {
                out.get_or_insert_with(|| policies.to_vec())[i] = over.clone();
            }
        }
        out.map_or(Cow::Borrowed(policies), Cow::Owned)
    }

    pub(super) fn set(&self, key: &Key, policy: &Policy, expires: Option<u64>, now: u64) {
        let mut map = self.map.write();
        map.retain(|_, (_, e)| e.is_none_or(|e| e > now));
        map.insert(
            (key.clone(), policy.id(), policy.algorithm()),
            (policy.clone(), expires),
        );
        self.active
            .store(map.len(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn remove(&self, key: &Key, policy: &Policy) {
        let mut map = self.map.write();
        map.remove(&(key.clone(), policy.id(), policy.algorithm()));
        self.active
            .store(map.len(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn list(&self, key: &Key, policies: &[Policy], now: u64) -> Vec<ActiveOverride> {
        let map = self.map.read();
        policies
            .iter()
            .filter_map(|p| {
                let (over, expires) = map.get(&(key.clone(), p.id(), p.algorithm()))?;
                if expires.is_some_and(|e| e <= now) {
                    return None;
                }
                Some(ActiveOverride::new(
                    p.name().to_owned(),
                    over.limit(),
                    over.capacity(),
                    expires.map(|e| Duration::from_millis(e - now)),
                ))
            })
            .collect()
    }
}
