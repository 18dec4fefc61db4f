//! Penalties: a key that a penalised policy denies is blocked for the penalty's duration.
//!
//! A block is itself state in the store: a one-per-penalty GCRA policy named
//! `<policy>~penalty`, charged when the policy denies and peeked before every check.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Limiter, PolicySet};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::{Store, StoreExt};

impl<S: Store> Limiter<S> {
    /// Checks `key` against policy set `set_id`: refused while a block runs; a penalised
    /// policy that denies starts its block.
    pub(super) async fn check_with_penalties(
        self,
        key: Key,
        set: Arc<PolicySet>,
        costs: SmallVec<[u64; 2]>,
    ) -> Result<Decision, StoreError> {
        let set = &*set;
        let store = &self.inner.common.store;
        if let Some(blocked) = self.running_block(&key, set, &costs).await? {
            return Ok(blocked);
        }
        let decision = store.check(&key, &set.enforced, &costs).await?;
        if !decision.is_allowed() {
            // The penalised policies that denied: start their blocks.
            let (denied_at, start): (Vec<usize>, Vec<Policy>) = set
                .penalty_of
                .iter()
                .zip(set.penalties.iter())
                .filter(|(&i, _)| {
                    // A cost above the capacity in force is refused as such, not a
                    // rate-limit denial to penalise.
                    let d = &decision.policies()[i];
                    !d.is_allowed() && !d.exceeds_capacity()
                })
                .map(|(&i, p)| (i, p.clone()))
                .unzip();
            if !start.is_empty() {
                let ones = vec![1; start.len()];
                store.check(&key, &start, &ones).await?;
                // Every block started: the refusal lasts until the last one ends.
                let blocked = denied_at
                    .iter()
                    .zip(&start)
                    .fold(decision, |d, (&index, penalty)| {
                        d.blocked(index, penalty.window_millis())
                    });
                return Ok(blocked);
            }
        }
        Ok(decision)
    }

    /// The refusal of a running block (the enforced policies' current state, marked blocked
    /// by the penalty that ends last), or `None` when no block runs. Charges nothing.
    pub(super) async fn running_block(
        &self,
        key: &Key,
        set: &PolicySet,
        costs: &[u64],
    ) -> Result<Option<Decision>, StoreError> {
        if set.penalties.is_empty() {
            return Ok(None);
        }
        let store = &self.inner.common.store;
        let ones: SmallVec<[u64; 2]> = set.penalties.iter().map(|_| 1).collect();
        let blocks = store.peek(key, &set.penalties, &ones).await?;
        if blocks.is_allowed() {
            return Ok(None);
        }
        let current = store.peek(key, &set.enforced, costs).await?;
        let (j, block) = blocks
            .policies()
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.is_allowed())
            .max_by_key(|(_, d)| d.retry_after_millis())
            .map(|(j, d)| (j, *d))
            .unwrap_or((0, blocks.policies()[0]));
        Ok(Some(
            current.blocked(set.penalty_of[j], block.retry_after_millis()),
        ))
    }
}
