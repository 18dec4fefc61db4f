//! The local fallback's copy of each key's overrides.
//!
//! A per-key override lives in the store; during an outage the local fallback decides, and
//! without a copy it would limit an overridden key at the plan's share: a tenant lowered from
//! 1 000 an hour to 5 would get 1 000 again the moment Redis went down. So the fallback keeps
//! each override at its share (`limit / replicas`, as the plan's limits are divided):
//!
//! an override shows in the store's answers, whose limit is the one in force for the key, so
//! when the limit the store answered and the fallback's differ, the store's overrides of that
//! key are read off the request path and copied: at most once a second per key while the
//! store answers the same limits. An override set or removed through this store is read at
//! its key's next answer, whatever that shows.
//!
//! **Bound**: an override set or removed anywhere (this instance, another, the admin API of
//! another process) is followed by the fallback from the first request of its key that the
//! store answers after it, plus one store call; but one set elsewhere that changes only a
//! token bucket's or GCRA policy's rate and keeps its burst leaves the answers' limit (the
//! burst) as it was, and is followed only once the key's limits differ for another reason.
//! One set or removed during the outage is not followed: the store, where it lives, cannot
//! be read.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use super::{FailureMode, Inner};
use crate::decision::Decision;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::Policy;
use crate::store::{Store, StoreExt};

/// Keys whose overrides were read lately: when, and the limits the store answered then;
/// bounded.
#[derive(Default)]
pub(super) struct Followed {
    read_at: parking_lot::Mutex<HashMap<Key, (u64, Limits)>>,
    /// Keys whose override was set or removed through this store, to read at their next
    /// answer whatever it shows (an override of a bucket's rate alone leaves its answers'
    /// limit, the burst, as it was); `any_changed` spares the lock when there are none.
    changed: parking_lot::Mutex<HashSet<Key>>,
    any_changed: AtomicBool,
}

impl Followed {
    /// Whether `key`'s override was set or removed through this store since its last read;
    /// forgets it.
    pub(super) fn take_changed(&self, key: &Key) -> bool {
        if !self.any_changed.load(Ordering::Acquire) {
            return false;
        }
        let mut changed = self.changed.lock();
        let hit = changed.remove(key);
        if changed.is_empty() {
            self.any_changed.store(false, Ordering::Release);
        }
        hit
    }
}

/// The limits a store's answer held, per policy.
type Limits = SmallVec<[u64; 2]>;

/// How often one key's overrides may be read from the store while the store answers the same
/// limits.
const RESYNC_MS: u64 = 1_000;
/// How many keys' read times are kept; past it the oldest half is forgotten.
const MAX_FOLLOWED: usize = 4_096;

/// `n` divided among `replicas` instances, rounded up, at least 1: how the fallback divides a
/// limit.
pub(super) fn share(n: u64, replicas: u32) -> u64 {
    n.div_ceil(u64::from(replicas.max(1))).max(1)
}

impl<S: Store> Inner<S> {
    /// The local-fallback replicas of `policy`, if it falls back locally.
    pub(super) fn replicas(&self, policy: &Policy) -> Option<u32> {
        match policy.failure_mode().unwrap_or(self.mode) {
            FailureMode::LocalFallback { replicas } => Some(replicas),
            _ => None,
        }
    }

    /// `policy`'s share in the fallback and the replicas it is divided among, if it falls
    /// back locally and could be divided (a failure was logged when it was tried).
    fn divided(&self, policy: &Policy) -> Option<(Policy, u32)> {
        let replicas = self.replicas(policy)?;
        let fallback = self.fallback_policy(policy, replicas);
        (fallback.name() != policy.name()).then_some((fallback, replicas))
    }

    /// Copies the store's override of `policy` for `key` (`None`: it has none) into the
    /// fallback, at its share.
    fn copy_override(&self, key: &Key, policy: &Policy, over: Option<&ActiveOverride>) {
        let Some((fallback, replicas)) = self.divided(policy) else {
            return;
        };
        match over {
            Some(over) => {
                let burst = policy
                    .algorithm()
                    .has_burst()
                    .then(|| share(over.capacity(), replicas));
                match fallback.with_limit(share(over.limit(), replicas), burst) {
                    // The memory store applies an override when called.
                    Ok(shared) => {
                        drop(self.fallback.set_override(key, &shared, over.expires_in()));
                    }
                    Err(error) => tracing::warn!(
                        target: "tollgate::store",
                        %error,
                        policy = policy.name(),
                        "the local fallback could not take this override's share; it keeps the plan's"
                    ),
                }
            }
            None => drop(self.fallback.remove_override(key, &fallback)),
        }
    }

    /// Whether the fallback's answer for a policy (`local`) holds another limit than its
    /// share of the store's (`store`): an override was set or removed that it has not copied.
    pub(super) fn limits_part(
        &self,
        policy: &Policy,
        store: &Decision,
        i: usize,
        local: u64,
    ) -> bool {
        let Some(replicas) = self.replicas(policy) else {
            return false;
        };
        store
            .policies()
            .get(i)
            .is_some_and(|s| share(s.limit, replicas) != local)
            && self.divided(policy).is_some()
    }

    /// Lets the next answer for `key` read its overrides at once, whatever it shows: one was
    /// set or removed through this store.
    pub(super) fn override_changed(&self, key: &Key) {
        self.followed.read_at.lock().remove(key);
        let mut changed = self.followed.changed.lock();
        if changed.len() < MAX_FOLLOWED {
            changed.insert(key.clone());
            self.followed.any_changed.store(true, Ordering::Release);
        }
    }

    /// Reads `key`'s overrides of `policies` from the store, off the request path, and copies
    /// them into the fallback: at once when the store answered other limits (`store`) than at
    /// the last read, else at most once every [`RESYNC_MS`] per key.
    pub(super) fn follow_overrides(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        store: &Decision,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = self.clock.now_millis();
        let limits: Limits = store.policies().iter().map(|d| d.limit).collect();
        {
            let mut read_at = self.followed.read_at.lock();
            if read_at
                .get(key)
                .is_some_and(|(at, seen)| *seen == limits && now < at.saturating_add(RESYNC_MS))
            {
                return;
            }
            if read_at.len() >= MAX_FOLLOWED {
                let mut times: Vec<u64> = read_at.values().map(|(at, _)| *at).collect();
                let (_, &mut middle, _) = times.select_nth_unstable(MAX_FOLLOWED / 2);
                read_at.retain(|_, (at, _)| *at > middle);
            }
            read_at.insert(key.clone(), (now, limits));
        }
        let policies: Vec<Policy> = policies
            .iter()
            .filter(|p| self.replicas(p).is_some())
            .cloned()
            .collect();
        let Some(listing) = self
            .primary
            .override_store()
            .map(|o| o.list(key, &policies))
        else {
            return;
        };
        let this = Arc::clone(self);
        let key = key.clone();
        let timeout = self.timeout;
        runtime.spawn(async move {
            match tokio::time::timeout(timeout, listing).await {
                Ok(Ok(active)) => {
                    for p in &policies {
                        let over = active.iter().find(|a| a.policy() == p.name());
                        this.copy_override(&key, p, over);
                    }
                }
                // Read again at a later answer.
                _ => {
                    this.followed.read_at.lock().remove(&key);
                }
            }
        });
    }
}
