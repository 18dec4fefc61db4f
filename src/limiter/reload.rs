//! [`Limiter::reload`]: a new plan in force while requests are in flight, no counter lost.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{CompiledPlan, Limiter, PolicySet};
#[cfg(feature = "config")]
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::store::Store;
use crate::telemetry;

impl<S: Store> Limiter<S> {
    /// Puts `next`'s plan in force on this limiter and every clone of it (the layers made
    /// from it included): its routes, policies, tiers, costs, allow and deny lists, key
    /// extractor and tier function, swapped in one step. A request already being decided
    /// finishes with the plan it started with; no request sees half of one. The store stays
    /// this limiter's: build `next` on a clone of [`store`](Self::store), or on the same
    /// settings, so that both read the same state.
    ///
    /// **Counters survive.** State is kept per key, policy name and algorithm, so a policy
    /// whose definition did not change keeps its usage exactly. A policy whose rate changed
    /// keeps its state, read under the new rate:
    ///
    /// | algorithm | a changed limit | a changed window |
    /// |---|---|---|
    /// | sliding window counter | the counts of the current and previous windows stay: 80 used of 100 is 80 used of 50 (refused until they slide out) or of 200 (120 left) | the window index changes: the counts start afresh |
    /// | sliding window log | every logged request stays and counts against the new limit | the entries still in the new window count (Redis may already have expired those older than the old window) |
    /// | token bucket | the missing tokens stay; the refill runs at the new rate from now | the stored deficit is missing tokens × window, so it is rescaled by new/old window |
    /// | fixed window | the count of the current window stays | the window index changes: the count starts afresh |
    /// | GCRA | the time until the TAT stays: the backlog in units scales with the new rate | as for a changed limit |
    /// | in flight | held slots stay; a lower maximum refuses new requests until enough end | the new lease applies from the next refresh |
    ///
    /// A policy renamed, or given another algorithm, starts afresh (its state is kept under
    /// another name); a removed policy's state expires by itself. A request admitted before
    /// the reload and ending after it (a refund by a counting rule, a reservation settled)
    /// gives nothing back to a policy the reload changed or removed: its units stay counted
    /// (given back under the old window, they would rewrite or expire the key's state under
    /// the new one), and a cost above its reservation is charged under the policy in force.
    /// Overrides are kept by policy name and algorithm: a policy given another algorithm
    /// leaves its overrides behind (set them again). On a
    /// [`LeasedStore`](crate::store::leased::LeasedStore), blocks granted under the old
    /// limits are spent until their lease ends (at most one block per instance and key, as
    /// for an override), and a GCRA policy that gains or loses shaping starts afresh (a
    /// shaping GCRA is decided exactly, its state apart from the ledger's). Limiters made earlier with
    /// [`for_route`](Self::for_route) keep the route's policies they were made with and take
    /// the new allow and deny lists, key extractor and tier function; their policy names stay
    /// taken, so a route attached later cannot define one differently (a new plan that does is
    /// logged as a warning under `tollgate::reload`: both definitions count under one name).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, store::MemoryStore, Limiter, Policy, Rate};
    ///
    /// let store = MemoryStore::new();
    /// let limiter = Limiter::builder()
    ///     .store(store.clone())
    ///     .policy(Policy::new("api", Rate::per_minute(2))?)
    ///     .build()?;
    /// let key = Key::new("user", "42");
    /// limiter.check(&key, 1).await?;
    ///
    /// // A higher limit for everyone, without a restart: the request already counted stays.
    /// let next = Limiter::builder()
    ///     .store(store.clone())
    ///     .policy(Policy::new("api", Rate::per_minute(5))?)
    ///     .build()?;
    /// limiter.reload(&next);
    /// assert_eq!(limiter.check(&key, 1).await?.remaining(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn reload(&self, next: &Limiter<S>) {
        let plan = next.plan_full();
        let mut names = next
            .inner
            .common
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // The routes attached with `for_route` keep their policies, so their names stay taken.
        for attached in self.inner.common.attached_limiters() {
            if Arc::ptr_eq(&attached, &self.inner) {
                continue;
            }
            for name in names.keep_attached(&attached.plan_in_force().sets) {
                tracing::warn!(
                    target: "tollgate::reload",
                    policy = %name,
                    "the new plan defines policy {name:?} differently from a route attached \
                     with for_route, which keeps its own definition: both count under one \
                     name; rename one"
                );
            }
        }
        // The names first: a `for_route` made meanwhile is checked against the new plan.
        *self
            .inner
            .common
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = names;
        self.set_source(next.source());
        self.inner.plan.store(Arc::clone(&plan));
        // After the store, so that the swap holds the new plan by the time the flag sends
        // readers to it.
        self.inner
            .reloaded
            .store(true, std::sync::atomic::Ordering::Release);
        // The limiters made with `for_route` keep their route's policies and take the new
        // lists, key extractor and tier function: a key denied under attack is denied on
        // every route.
        for attached in self.inner.common.attached_limiters() {
            if Arc::ptr_eq(&attached, &self.inner) {
                continue;
            }
            let made = attached.plan_in_force();
            attached.plan.store(Arc::new(CompiledPlan {
                sets: made.sets.clone(),
                routes: made.routes.clone(),
                table: None,
                lists: Arc::clone(&plan.lists),
                attached: made.attached.clone(),
            }));
            attached
                .reloaded
                .store(true, std::sync::atomic::Ordering::Release);
        }
        telemetry::plan_reload(true);
        tracing::info!(target: "tollgate::reload", "a new rate-limit plan is in force");
    }

    /// What the plan in force was described by (see `Common::source`).
    pub(crate) fn source(&self) -> Option<super::PlanSource> {
        self.inner
            .common
            .source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the response settings of the plan this limiter was built from.
    #[cfg(feature = "config")]
    pub(crate) fn set_layer_headers(&self, headers: crate::response::LayerHeaders) {
        let _ = self.inner.common.layer_headers.set(headers);
    }

    /// Records what the plan in force was described by.
    pub(crate) fn set_source(&self, source: Option<super::PlanSource>) {
        *self
            .inner
            .common
            .source
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = source;
    }

    /// Puts `next` in force with [`reload`](Self::reload), or, when the plan that would have
    /// made it was refused, keeps the plan in force: the error is logged (target
    /// `tollgate::reload`), counted (`tollgate_plan_reloads_total{result="refused"}`) and
    /// returned. For [`reload_plan`](Self::reload_plan).
    #[cfg(feature = "config")]
    pub(crate) fn reload_or_keep(
        &self,
        next: Result<Limiter<S>, ConfigError>,
    ) -> Result<(), ConfigError> {
        match next {
            Ok(next) => {
                self.reload(&next);
                Ok(())
            }
            Err(error) => {
                telemetry::plan_reload(false);
                tracing::error!(
                    target: "tollgate::reload",
                    %error,
                    "the new rate-limit plan was refused; the plan in force stays"
                );
                Err(error)
            }
        }
    }
}

impl<S> Limiter<S> {
    /// The response settings of the plan this limiter was built from, if any.
    pub(crate) fn layer_headers(&self) -> Option<crate::response::LayerHeaders> {
        self.inner.common.layer_headers.get().copied()
    }
}

/// How a policy a request was admitted under stands in the plan in force now.
#[derive(Debug, Clone)]
pub(crate) enum InForce {
    /// The same policy: a give-back under it is what it was.
    Same,
    /// A reload changed its algorithm or limits: the plan's policy of that name now.
    Changed(Policy),
    /// A reload removed it.
    Gone,
}

impl<S: Store> Limiter<S> {
    /// How each of `policies` (of `set`, the set a request was admitted under) stands in the
    /// plan in force: `None` when `set` is still the plan's (no reload since, the common
    /// case, one pointer comparison per set). A give-back under a policy a reload changed
    /// would read the state in the old window and limits: a refund or settlement could
    /// rewrite or expire the key's state under the new ones, and a key the new limit refuses
    /// would start afresh.
    pub(crate) fn in_force(
        &self,
        set: &PolicySet,
        policies: &[Policy],
    ) -> Option<SmallVec<[InForce; 2]>> {
        let plan = self.plan();
        // A labelled copy of a set (a route attached through axum) shares its policies.
        if plan
            .sets
            .iter()
            .any(|s| Arc::ptr_eq(&s.enforced, &set.enforced))
        {
            return None;
        }
        let attached = self.inner.common.attached_sets();
        let named = |p: &Policy| -> SmallVec<[Policy; 2]> {
            let mut found: SmallVec<[Policy; 2]> = SmallVec::new();
            for q in plan
                .sets
                .iter()
                .chain(&attached)
                .flat_map(|s| s.enforced.iter())
            {
                if q.name() == p.name() && !found.iter().any(|f| same(f, q)) {
                    found.push(q.clone());
                }
            }
            found
        };
        Some(
            policies
                .iter()
                .map(|p| {
                    let found = named(p);
                    if found.iter().any(|q| same(p, q)) {
                        InForce::Same
                    } else if let [only] = &found[..] {
                        InForce::Changed(only.clone())
                    } else {
                        // Removed, or a name several tiers now define differently: which
                        // one the request would have had is not known.
                        InForce::Gone
                    }
                })
                .collect(),
        )
    }
}

/// Whether two policies of one name count the same way: algorithm, limits, window, burst
/// and delay.
fn same(p: &Policy, q: &Policy) -> bool {
    p.algorithm() == q.algorithm() && p.limits() == q.limits()
}
