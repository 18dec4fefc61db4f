//! Shadow policies: checked and counted beside the enforced ones, never refusing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use smallvec::SmallVec;

use super::{Limiter, PolicySet};
use crate::key::Key;
use crate::store::Store;

/// How many shadow-policy checks would have allowed and denied, as returned by
/// [`Limiter::shadow_counts`] (see there for an example).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ShadowCounts {
    /// Checks every shadow policy would have allowed.
    pub allowed: u64,
    /// Checks at least one shadow policy would have denied.
    pub denied: u64,
    /// Checks not made: 1 024 of this limiter's were already waiting for a store that does
    /// not answer at once (a stalled Redis), so the shadow policies' tasks stay bounded
    /// whatever the request rate.
    pub skipped: u64,
}

/// The most shadow checks one limiter has waiting for its store at once; past it a request's
/// shadow check is skipped and counted in [`ShadowCounts::skipped`].
pub(crate) const MAX_SHADOW_CHECKS: usize = 1024;

/// The running counts behind [`ShadowCounts`].
#[derive(Debug, Default)]
pub(crate) struct ShadowCounters {
    allowed: AtomicU64,
    denied: AtomicU64,
    skipped: AtomicU64,
    /// Shadow checks waiting for the store now.
    waiting: AtomicUsize,
}

/// One shadow check waiting for the store: counted until its task ends, however it ends.
struct Waiting<S: Store>(Limiter<S>);

impl<S: Store> Drop for Waiting<S> {
    fn drop(&mut self) {
        self.0
            .inner
            .common
            .shadow
            .waiting
            .fetch_sub(1, Ordering::AcqRel);
    }
}

impl ShadowCounters {
    pub(crate) fn get(&self) -> ShadowCounts {
        ShadowCounts {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
        }
    }
}

impl<S: Store> Limiter<S> {
    /// Checks `key` against the set's shadow policies in the background (the request does
    /// not wait for it), counting and logging what they would have done. Outside a tokio
    /// runtime the check runs to completion on the spot only when the store answers at once.
    pub(super) fn spawn_shadow_check(
        &self,
        key: &Key,
        set: &std::sync::Arc<PolicySet>,
        cost: Option<u64>,
    ) {
        // The cost as asked: a shadow policy refuses one above its capacity (counted as a
        // denial, charging nothing), as it would once enforced.
        let costs: SmallVec<[u64; 2]> = match cost {
            None => set.shadow_costs.clone(),
            Some(c) => set.shadow.iter().map(|_| c).collect(),
        };
        let common = &self.inner.common;
        if let Some(outcome) = common.store.check_now(key, &set.shadow, &costs) {
            self.record_shadow(key, set, outcome);
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                target: "tollgate::shadow",
                "shadow policies need a tokio runtime with this store; not checked"
            );
            return;
        };
        if common.shadow.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_SHADOW_CHECKS {
            common.shadow.waiting.fetch_sub(1, Ordering::AcqRel);
            common.shadow.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let waiting = Waiting(self.clone());
        let future = common.store.check(key, &set.shadow, &costs);
        let key = key.clone();
        let set = std::sync::Arc::clone(set);
        handle.spawn(async move {
            let outcome = future.await;
            waiting.0.record_shadow(&key, &set, outcome);
            drop(waiting);
        });
    }

    fn record_shadow(
        &self,
        key: &Key,
        set: &PolicySet,
        outcome: Result<crate::Decision, crate::StoreError>,
    ) {
        let counts = &self.inner.common.shadow;
        match outcome {
            Ok(d) if d.is_allowed() => {
                counts.allowed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(d) => {
                counts.denied.fetch_add(1, Ordering::Relaxed);
                let policy = set.shadow.get(d.governing_index()).map_or("", |p| p.name());
                let digest = crate::key::digest(key);
                tracing::event!(
                    target: "tollgate::shadow",
                    tracing::Level::INFO,
                    ratelimit.policy = policy,
                    ratelimit.key = digest.as_str(),
                    ratelimit.retry_after_ms = d.retry_after_millis(),
                    "shadow policy would have denied this request"
                );
            }
            Err(error) => {
                tracing::warn!(target: "tollgate::shadow", %error, "shadow check failed");
            }
        }
    }
}
