//! Refunds: units a check charged given back for a request that turned out not to count.

use smallvec::SmallVec;

use super::{hold, Limiter, PolicySet};
use crate::error::CheckError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::Store;

/// The policies a refund of `cost` gives back to, with their costs: the enforced ones when
/// `charged` says the cost fitted them (a cost above a capacity in force was refused), and
/// the shadow ones when the cost fits them all (a shadow policy refuses a cost above its
/// capacity, and the shadow check charges all or none). Slots are not
/// units: an in-flight policy's slot comes back when its permit or response body is dropped,
/// never by a refund.
fn refund_parts(
    set: &PolicySet,
    cost: u64,
    charged: impl FnOnce(&[Policy]) -> bool,
) -> (SmallVec<[Policy; 2]>, SmallVec<[u64; 2]>) {
    let mut policies: SmallVec<[Policy; 2]> = SmallVec::new();
    let mut costs: SmallVec<[u64; 2]> = SmallVec::new();
    let units = |p: &&Policy| !p.is_in_flight();
    if charged(&set.enforced) {
        policies.extend(set.enforced.iter().filter(units).cloned());
        costs.extend(set.enforced.iter().filter(units).map(|_| cost));
    }
    // The shadow policies are checked together, all or nothing: charged only when the cost
    // fitted every one of them (shaping's slack beyond the capacity included).
    let fits = |p: &Policy| cost <= p.capacity().saturating_add(p.limits().shaping_slack());
    if set.shadow.iter().all(fits) {
        policies.extend(set.shadow.iter().filter(units).cloned());
        costs.extend(set.shadow.iter().filter(units).map(|_| cost));
    }
    (policies, costs)
}

impl<S: Store> Limiter<S> {
    /// Gives back up to `cost` units that [`check`](Self::check) charged `key` on the default
    /// route's policies (and its shadow policies), for a request that turned out not to
    /// count: the login guard refunds successful logins this way, and costs settled after
    /// the response can too. The same lists apply as for `check`: a deny-listed or
    /// allow-listed key, an exempt default route, or a cost above a policy's capacity was
    /// never charged, so nothing is refunded. Penalties are not refunded (they start on
    /// denials, which charge nothing). Each algorithm's bound is stated with its `refund` in
    /// [`crate::algorithm`]; see also [`Op::Refund`](crate::store::Op::Refund).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("exports", Rate::per_hour(10))?)
    ///     .build()?;
    /// let tenant = Key::new("tenant", "acme");
    /// assert_eq!(limiter.check(&tenant, 4).await?.remaining(), 6);
    /// // The export turned out smaller than reserved: give 3 units back.
    /// limiter.refund(&tenant, 3).await?;
    /// // One unit used: nine fit again.
    /// assert_eq!(limiter.check(&tenant, 9).await?.remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// In-flight policies are not refunded: a slot comes back when its
    /// [`Permit`](crate::Permit) or response body is dropped, never by a refund.
    /// Cancel-safe: a refund whose future is dropped before it answers still applies, once.
    ///
    /// Refund only a charge the store took: not one whose decision a failure mode made
    /// ([`Decision::decided_by`](crate::Decision::decided_by) other than [`DecidedBy::Decided`](crate::DecidedBy)) — the
    /// store never charged it, and the refund, applied once the store is back, comes off
    /// other requests' units — nor one made before a [`reset`](Self::reset) of the key.
    /// [`Reservation`](crate::Reservation)s, the layer and the login guard keep to this by
    /// themselves for resets made through this limiter (or one made from it with
    /// [`for_route`](Self::for_route)) in this process. A reset made elsewhere (another
    /// instance, `tollgate reset`) while a request is under way here is not known here: that
    /// request's give-back can come off what was counted since the reset, at most what it
    /// reserved.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails. The refund may still be made: one a
    /// [`ResilientStore`](crate::store::ResilientStore)'s timeout cut short is finished in
    /// the background, as a call already sent may be by Redis. Do not make it again.
    pub fn refund(
        &self,
        key: &Key,
        cost: u64,
    ) -> impl std::future::Future<Output = Result<(), CheckError>> + Send + 'static {
        self.refund_to(key, cost, false)
    }

    /// [`refund`](Self::refund) of a charge the store took, or (`fallback`) one its local
    /// fallback took while it was down ([`Op::Fallback`](crate::store::Op::Fallback)).
    pub(crate) fn refund_to(
        &self,
        key: &Key,
        cost: u64,
        fallback: bool,
    ) -> impl std::future::Future<Output = Result<(), CheckError>> + Send + 'static {
        // The store call is made here and driven even if the future is dropped unpolled: a
        // refund asked for applies, once.
        let call = self.refund_call_now(key, cost, fallback);
        async move {
            if let Some(call) = call {
                call.await?;
            }
            Ok(())
        }
    }

    /// [`refund`](Self::refund)'s store call, started.
    fn refund_call_now(&self, key: &Key, cost: u64, fallback: bool) -> Option<hold::Completing> {
        let set = self.default_set()?;
        let lists = self.lists();
        if lists.deny.contains(key) || lists.allow.contains(key) {
            return None;
        }
        // A cost above a policy's capacity in force was refused, and charged nothing to
        // refund. An override may have raised or lowered that capacity, so the key's
        // overrides are read first where the store keeps them. A refund of a charge the
        // local fallback took (its store is down) goes by the plan's capacities.
        let above_plan = set
            .enforced
            .iter()
            .any(|p| !p.is_in_flight() && cost > p.capacity());
        let overrides = !fallback && self.inner.common.store.override_store().is_some();
        if !overrides {
            let (policies, costs) = refund_parts(&set, cost, |_| !above_plan);
            if policies.is_empty() {
                return None;
            }
            let op = crate::store::Op::refund(&costs[..]);
            let call = self.give_back(key, &policies, op, fallback);
            return Some(hold::Completing::new("refund", call));
        }
        let limiter = self.clone();
        let key = key.clone();
        let call: crate::store::BoxFuture<Result<(), crate::error::StoreError>> =
            Box::pin(async move {
                let store = &limiter.inner.common.store;
                let active = match store.override_store() {
                    Some(overrides) => overrides.list(&key, &set.enforced).await?,
                    None => Vec::new(),
                };
                let in_force = |p: &Policy| {
                    active
                        .iter()
                        .find(|o| o.policy() == p.name())
                        .map_or(p.capacity(), |o| o.capacity())
                };
                let (policies, costs) = refund_parts(&set, cost, |enforced| {
                    enforced
                        .iter()
                        .all(|p| p.is_in_flight() || cost <= in_force(p))
                });
                if policies.is_empty() {
                    return Ok(());
                }
                let op = crate::store::Op::refund(&costs[..]);
                limiter.give_back(&key, &policies, op, fallback).await
            });
        Some(hold::Completing::new("refund", call))
    }
}
