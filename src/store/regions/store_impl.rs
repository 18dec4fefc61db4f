//! [`RegionalLedger`] as a store: the lease ledger of the region's instances, and the home's
//! exact decisions for what cannot be leased.

use smallvec::SmallVec;

use super::RegionalLedger;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::leased::{LeaseBackend, LedgerCall, LedgerFuture};
use crate::store::{AnswerNow, ApplyFuture, Op, OverrideStore, Store};

impl<H: LeaseBackend> LeaseBackend for RegionalLedger<H> {
    /// Grants and give-backs go to the region's deposits (and, when they run out, to the
    /// home); peeks, debts, resets and override upkeep go to the home.
    fn ledger(&self, key: &Key, policies: &[Policy], call: LedgerCall) -> LedgerFuture {
        let region = std::sync::Arc::clone(&self.inner);
        let policies: SmallVec<[Policy; 2]> = policies.iter().cloned().collect();
        Box::pin(region.call(key.clone(), policies, call))
    }
}

/// Policies that cannot be leased, and every operation on them, are the home's: decided
/// exactly there, one home round trip each. A reset also empties the region's deposits.
impl<H: LeaseBackend> Store for RegionalLedger<H> {
    type CheckFuture = H::CheckFuture;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        self.inner.home.check(key, policies, costs)
    }

    fn check_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow {
        self.inner.home.check_now(key, policies, costs)
    }

    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        self.inner.home.apply(key, policies, op)
    }

    /// Overrides are the home's: every home call reads them.
    fn override_store(&self) -> Option<&dyn OverrideStore> {
        self.inner.home.override_store()
    }

    fn now_millis(&self) -> u64 {
        self.inner.local.now_millis()
    }

    fn name(&self) -> &'static str {
        "regional"
    }

    fn applies_failure_modes(&self) -> bool {
        false
    }

    /// Changes when the home's or the region's Redis restarts or fails over.
    fn generation(&self) -> u64 {
        self.inner
            .home
            .generation()
            .wrapping_add(self.inner.local.generation())
    }
}
