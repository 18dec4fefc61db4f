//! The [`Store`] implementation of [`LeasedStore`]: leasable policies from blocks, the
//! rest from the wrapped store, all or nothing.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::ledger::{Kind, LedgerMode};
use super::*;
use crate::algorithm::PolicyDecision;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::{Algorithm, Policy};
use crate::store::op::refused_misfit;
use crate::store::{
    check_applied, AnswerNow, Applied, ApplyFuture, BoxFuture, Op, OverrideStore, Store, StoreExt,
};

/// Splits a request's policies into leasable and exact ones.
pub(super) fn split(policies: &[Policy]) -> (SmallVec<[usize; 2]>, SmallVec<[usize; 2]>) {
    (0..policies.len()).partition(|&i| Kind::of(&policies[i]).is_some())
}

pub(super) fn pick<T: Clone>(all: &[T], idx: &[usize]) -> SmallVec<[T; 2]> {
    idx.iter().map(|&i| all[i].clone()).collect()
}

/// The decision of a mixed request from its two halves, in the request's policy order.
pub(super) fn merge(n: usize, li: &[usize], l: &Decision, ei: &[usize], e: &Decision) -> Decision {
    let mut out: SmallVec<[PolicyDecision; 2]> =
        SmallVec::from_elem(PolicyDecision::from_parts(true, 0, 0, 0, 0, 0), n);
    for (j, &i) in li.iter().enumerate() {
        if let Some(d) = l.policies().get(j) {
            out[i] = *d;
        }
    }
    for (j, &i) in ei.iter().enumerate() {
        if let Some(d) = e.policies().get(j) {
            out[i] = *d;
        }
    }
    Decision::from_policies(out)
        .with_slot_of(e)
        .with_decided_by(e.decided_by())
}

impl<S: LeaseBackend> LeasedStore<S> {
    async fn check_owned(
        shared: Arc<Shared<S>>,
        key: Key,
        policies: SmallVec<[Policy; 2]>,
        costs: SmallVec<[u64; 2]>,
    ) -> Result<Decision, StoreError> {
        if policies.is_empty() {
            return Ok(Decision::from_policies([]));
        }
        let (li, ei) = split(&policies);
        if ei.is_empty() {
            return shared.decide(&key, &policies, &costs).await.map(|(d, _)| d);
        }
        let (lp, lc) = (pick(&policies, &li), pick(&costs, &li));
        let (ep, ec) = (pick(&policies, &ei), pick(&costs, &ei));
        if li.is_empty() {
            return shared.inner.check(&key, &ep, &ec).await;
        }
        let (dl, taken) = shared.decide(&key, &lp, &lc).await?;
        if !dl.is_allowed() {
            let de = shared.inner.peek(&key, &ep, &ec).await?;
            return Ok(merge(policies.len(), &li, &dl, &ei, &de));
        }
        match shared.inner.check(&key, &ep, &ec).await {
            Ok(de) if de.is_allowed() => Ok(merge(policies.len(), &li, &dl, &ei, &de)),
            Ok(de) => {
                shared.untake(&key, &lp, &lc, taken).await;
                Ok(merge(policies.len(), &li, &dl, &ei, &de))
            }
            Err(e) => {
                shared.untake(&key, &lp, &lc, taken).await;
                Err(e)
            }
        }
    }
}

impl<S: LeaseBackend> Store for LeasedStore<S> {
    type CheckFuture = BoxFuture<Result<Decision, StoreError>>;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        if let Some(d) = self.check_now(key, policies, costs) {
            return Box::pin(std::future::ready(d));
        }
        Box::pin(Self::check_owned(
            self.shared.clone(),
            key.clone(),
            policies.iter().cloned().collect(),
            costs.iter().copied().collect(),
        ))
    }

    fn check_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow {
        if policies.is_empty() || policies.iter().any(|p| Kind::of(p).is_none()) {
            return None;
        }
        let entry = self.shared.existing(key, policies)?;
        let now = self.shared.now();
        self.shared
            .local(&entry, costs, now, true)
            .map(|(d, _)| Ok(d))
    }

    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if let Some(refused) = refused_misfit(&op, policies.len()) {
            return refused;
        }
        match op {
            Op::Check { costs } => check_applied(self, key, policies, &costs),
            Op::Peek { costs } => self.peek_op(key, policies, &costs),
            Op::Refund { costs } => self.refund_op(key, policies, &costs),
            Op::Settle { reserved, actual } => self.settle_op(key, policies, &reserved, &actual),
            Op::Release { slot } => self.release_op(key, policies, slot),
            Op::Refresh { slot } => self.refresh_op(key, policies, slot),
            Op::Reset => self.reset_op(key, policies),
            op @ Op::Fallback { .. } => match op.store_part() {
                Some(op) => self.apply(key, policies, op),
                None => Box::pin(std::future::ready(Ok(Applied::Done))),
            },
        }
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        Some(self)
    }

    fn now_millis(&self) -> u64 {
        self.shared.inner.now_millis()
    }

    fn name(&self) -> &'static str {
        "leased"
    }

    fn applies_failure_modes(&self) -> bool {
        false
    }

    fn generation(&self) -> u64 {
        self.shared.inner.generation()
    }
}

/// The operations other than a check: leasable policies through the ledger and the blocks
/// in hand, the rest in the wrapped store.
impl<S: LeaseBackend> LeasedStore<S> {
    fn peek_op(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> ApplyFuture {
        let (li, ei) = split(policies);
        let shared = self.shared.clone();
        let key = key.clone();
        let (lp, lc) = (pick(policies, &li), pick(costs, &li));
        let (ep, ec) = (pick(policies, &ei), pick(costs, &ei));
        let n = policies.len();
        Box::pin(async move {
            let dl = if lp.is_empty() {
                Decision::from_policies([])
            } else {
                let mut call = shared.call(LedgerMode::Peek, 0, 0, &lp);
                for (part, &c) in call.parts.iter_mut().zip(&lc) {
                    part.cost = c;
                }
                let reply = shared.inner.ledger(&key, &lp, call).await?;
                Decision::from_policies(lp.iter().zip(&reply.answers).zip(&lc).map(
                    |((p, a), &cost)| {
                        PolicyDecision::from_parts(
                            reply.granted || a.retry_after_ms == 0,
                            a.reported_limit(Kind::of(p)),
                            a.remaining,
                            a.reset_after_ms,
                            a.retry_after_ms,
                            0,
                        )
                        .for_cost(cost, || p.limits().shaping_slack())
                    },
                ))
            };
            let de = if ep.is_empty() {
                Decision::from_policies([])
            } else {
                shared.inner.peek(&key, &ep, &ec).await?
            };
            Ok(Applied::Decision(merge(n, &li, &dl, &ei, &de)))
        })
    }

    fn refund_op(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> ApplyFuture {
        let (li, ei) = split(policies);
        let shared = self.shared.clone();
        let key = key.clone();
        let (lp, lc) = (pick(policies, &li), pick(costs, &li));
        let (ep, ec) = (pick(policies, &ei), pick(costs, &ei));
        Box::pin(async move {
            if !lp.is_empty() {
                shared.give_back_units(&key, &lp, &lc).await;
            }
            if !ep.is_empty() {
                shared.inner.refund(&key, &ep, &ec).await?;
            }
            Ok(Applied::Done)
        })
    }

    fn settle_op(
        &self,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> ApplyFuture {
        let (li, ei) = split(policies);
        let shared = self.shared.clone();
        let key = key.clone();
        let lp = pick(policies, &li);
        let (lr, la) = (pick(reserved, &li), pick(actual, &li));
        let (ep, er, ea) = (pick(policies, &ei), pick(reserved, &ei), pick(actual, &ei));
        Box::pin(async move {
            if !lp.is_empty() {
                let back: SmallVec<[u64; 2]> = lr
                    .iter()
                    .zip(&la)
                    .map(|(r, a)| r.saturating_sub(*a))
                    .collect();
                let extra: SmallVec<[u64; 2]> = lr
                    .iter()
                    .zip(&la)
                    .map(|(r, a)| a.saturating_sub(*r))
                    .collect();
                if back.iter().any(|&b| b > 0) {
                    shared.give_back_units(&key, &lp, &back).await;
                }
                if extra.iter().any(|&x| x > 0) {
                    let mut call = shared.call(LedgerMode::Force, 0, shared.next_id(), &lp);
                    for (part, &x) in call.parts.iter_mut().zip(&extra) {
                        part.cost = x;
                    }
                    let reply = shared.inner.ledger(&key, &lp, call).await?;
                    if !reply.granted {
                        // A debt stands: the units of the block in hand were charged before
                        // it, and spending them now would admit what the exact mode refuses.
                        shared.return_block(&key, &lp).await;
                    }
                }
            }
            if !ep.is_empty() {
                shared.inner.settle(&key, &ep, &er, &ea).await?;
            }
            Ok(Applied::Done)
        })
    }

    fn release_op(&self, key: &Key, policies: &[Policy], slot: u64) -> ApplyFuture {
        let (_, ei) = split(policies);
        self.shared
            .inner
            .apply(key, &pick(policies, &ei), Op::Release { slot })
    }

    fn refresh_op(&self, key: &Key, policies: &[Policy], slot: u64) -> ApplyFuture {
        let (_, ei) = split(policies);
        self.shared
            .inner
            .apply(key, &pick(policies, &ei), Op::Refresh { slot })
    }

    fn reset_op(&self, key: &Key, policies: &[Policy]) -> ApplyFuture {
        let (li, _) = split(policies);
        let lp = pick(policies, &li);
        if !lp.is_empty() {
            self.shared.entries.retain(|e| e.key != *key);
            self.shared.charges.forget_key(key);
        }
        let shared = self.shared.clone();
        let key = key.clone();
        let all: SmallVec<[Policy; 2]> = policies.iter().cloned().collect();
        Box::pin(async move {
            if !lp.is_empty() {
                let call = shared.call(LedgerMode::Reset, 0, 0, &lp);
                let reset = shared.inner.ledger(&key, &lp, call).await;
                // A block granted while the reset was under way was charged before it (the
                // ledger may have reset even if its answer is an error).
                shared.entries.retain(|e| e.key != key);
                reset?;
            }
            shared.inner.apply(&key, &all, Op::Reset).await
        })
    }
}

/// Runs an override's `steps` to their end whoever waits ([`to_the_end`]), one override
/// change at a time: once this store's turn (`in_order`) is had, holding it until the last
/// step. A caller that gives up while waiting for its turn changes nothing.
///
/// [`to_the_end`]: crate::store::to_the_end
fn in_turn(
    in_order: Arc<tokio::sync::Mutex<()>>,
    steps: impl std::future::Future<Output = Result<(), StoreError>> + Send + 'static,
) -> BoxFuture<Result<(), StoreError>> {
    Box::pin(async move {
        let turn = in_order.lock_owned().await;
        let steps = async move {
            let _turn = turn;
            steps.await
        };
        crate::store::to_the_end(steps).await.unwrap_or_else(|| {
            Err(StoreError::Backend(crate::error::Cause::from(
                "an override's steps did not finish",
            )))
        })
    })
}

impl<S: LeaseBackend> OverrideStore for LeasedStore<S> {
    /// Sets the override in the wrapped store, where the ledger reads it (the exact store's
    /// override key on Redis), and gives back this instance's blocks of the key. A token
    /// bucket's state is first brought up to date under the limits in force until now; after
    /// the override is written, the key's ledger state (a bucket's, a window's debt) is kept
    /// at least as long as the slower of the plan's rate and the override's needs it. The
    /// steps run in a task of their own where there is a runtime, so a caller that gives up
    /// half way (an admin request's timeout) does not leave an override whose slower rate
    /// outlives the state. Every instance decides under the override within one lease time:
    /// see [Per-key overrides](super#per-key-overrides).
    fn set(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let Some(kind) = Kind::of(policy) else {
            return self.shared.inner.set_override(key, policy, ttl);
        };
        // Kept as long as a slower rate needs: a bucket's refill, a window's debt.
        let keep = matches!(kind, Kind::Bucket | Kind::Counter | Kind::Fixed);
        let shared = self.shared.clone();
        let key = key.clone();
        let policy = policy.clone();
        in_turn(Arc::clone(&self.shared.overrides_in_order), async move {
            let policies = std::slice::from_ref(&policy);
            let keep_state = |policies: &[Policy]| {
                let call = shared.call(LedgerMode::Keep, 0, 0, policies);
                shared.inner.ledger(&key, policies, call)
            };
            if keep {
                // A token bucket's under the limits in force until now: the plan's (or an
                // override set before, which the ledger reads; a ledger call carries the
                // plan's limits), so that its refill until now is at the old rate, as the
                // memory store takes it. (GCRA keeps the time until its TAT instead, which
                // the new rate reads.)
                keep_state(policies).await?;
            }
            shared.inner.set_override(&key, &policy, ttl).await?;
            if keep {
                keep_state(policies).await?;
            }
            // Blocks and refusals of this instance were decided under the old limit.
            shared.forget(&key);
            Ok(())
        })
    }

    /// Removes the override from the wrapped store and gives back this instance's blocks of
    /// the key: the plan's limit applies on every instance within one lease time. A token
    /// bucket's refill until the removal is taken at the override's rate first, as the memory
    /// store takes it: the plan's rate refills from the removal on only.
    fn remove(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        let Some(kind) = Kind::of(policy) else {
            return self.shared.inner.remove_override(key, policy);
        };
        let shared = self.shared.clone();
        let key = key.clone();
        let policy = policy.clone();
        in_turn(Arc::clone(&self.shared.overrides_in_order), async move {
            let policies = std::slice::from_ref(&policy);
            if kind == Kind::Bucket && policy.algorithm() == Algorithm::TokenBucket {
                let call = shared.call(LedgerMode::Keep, 0, 0, policies);
                shared.inner.ledger(&key, policies, call).await?;
            }
            shared.inner.remove_override(&key, &policy).await?;
            shared.forget(&key);
            Ok(())
        })
    }

    fn list(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        self.shared.inner.overrides(key, policies)
    }
}
