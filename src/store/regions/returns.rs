//! A region's returns to the home: the unused units of deposits that ended, were emptied
//! or were replaced by a renewal, given back once the last block lent from them has ended.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::deposit::CLOCK_SLACK_MS;
use super::deposit::{self, Deposit};
use super::home::{Policies, Region};
use super::stats::bump;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::leased::{Kind, LeaseBackend, LedgerCall, LedgerMode, Part, Returned};

/// How a deposit left the key's place in the region's Redis, for its way home.
#[derive(Debug, Clone, Copy)]
pub(super) enum Gone {
    /// Removed (ended or drained): what it held is what goes home.
    Ended,
    /// Set aside (replaced by a renewal, or drained for a debt): kept in the region's Redis
    /// until its last block ends, taking back the units its blocks return meanwhile (a
    /// reset drops it).
    SetAside,
}

impl<H: LeaseBackend> Region<H> {
    /// When the deposit `block` ends (in `ms`), gives its unused units home, unless it was
    /// replaced before (a renewal gives the old one back itself).
    pub(super) fn when_it_ends(
        self: &Arc<Self>,
        key: Key,
        policies: Policies,
        kinds: SmallVec<[Kind; 2]>,
        keys: Vec<String>,
        block: u64,
        ms: u64,
    ) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms + CLOCK_SLACK_MS)).await;
            if let Ok((now, old)) = deposit::end(&me.local, &keys, block).await {
                me.send_home(key, policies, kinds, old, now, Gone::Ended);
            }
        });
    }

    /// Gives replaced, emptied or ended deposits back to the home, once the last block lent
    /// from them has ended (their units may be spent until then). A deposit set aside
    /// (`Gone::SetAside`: replaced by a renewal, or emptied for a debt) is taken out of the
    /// region's Redis only then, with the units its blocks gave back meanwhile; if a reset
    /// dropped it, nothing goes home.
    pub(super) fn send_home(
        self: &Arc<Self>,
        key: Key,
        policies: Policies,
        kinds: SmallVec<[Kind; 2]>,
        old: Vec<Deposit>,
        now: u64,
        gone: Gone,
    ) {
        if !old.iter().any(Deposit::holds_block) {
            return;
        }
        let wait = old
            .iter()
            .map(|d| d.lent_until)
            .max()
            .unwrap_or(0)
            .saturating_sub(now);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait + CLOCK_SLACK_MS)).await;
            }
            let (old, now) = match gone {
                Gone::Ended => (old, now),
                Gone::SetAside => {
                    let keys = me.local.deposit_keys(&key, &policies, &kinds);
                    match deposit::retire(&me.local, &keys, &old).await {
                        Ok(found) => {
                            let lost = old
                                .iter()
                                .zip(&found.lost)
                                .filter(|(_, &lost)| lost)
                                .map(|(d, _)| d.left)
                                .max()
                                .unwrap_or(0);
                            if lost > 0 {
                                bump(&me.counters.units_dropped, lost);
                                me.units("dropped", lost);
                            }
                            (found.deposits, found.now)
                        }
                        Err(e) => {
                            let unused = old.iter().map(|d| d.left).max().unwrap_or(0);
                            me.lost(unused, &e);
                            return;
                        }
                    }
                }
            };
            me.return_home(&key, &policies, &kinds, &old, now).await;
        });
    }

    /// The home call that gives `old`'s unused units back (of the first block it holds).
    async fn return_home(
        &self,
        key: &Key,
        policies: &[Policy],
        kinds: &[Kind],
        old: &[Deposit],
        now: u64,
    ) {
        let Some(block) = old.iter().find(|d| d.holds_block()).map(|d| d.block) else {
            return;
        };
        if !self.granted_by_this_home(block) {
            // Granted before the home restarted: given back, its unused units would come
            // off what the fresh home counted since.
            let unused = old.iter().map(|d| d.left).max().unwrap_or(0);
            bump(&self.counters.units_dropped, unused);
            self.units("dropped", unused);
            return;
        }
        let worth = old.iter().zip(kinds).any(|(d, k)| {
            d.holds_block()
                && (d.left > 0 || (matches!(k, Kind::Bucket | Kind::Log) && d.ends > now))
        });
        if !worth {
            return;
        }
        let unused = old.iter().map(|d| d.left).max().unwrap_or(0);
        let parts = policies
            .iter()
            .zip(kinds)
            .zip(old)
            .map(|((p, &kind), d)| {
                let mut part = Part::new(kind, p);
                if d.holds_block() && d.block == block {
                    part.returned = Returned {
                        granted: d.granted,
                        unused: d.left,
                        granted_at: d.granted_at,
                        lease_ms: d.lease,
                        rate: d.rate,
                    };
                }
                part
            })
            .collect();
        let call = LedgerCall {
            mode: LedgerMode::Return,
            lease_ms: 0,
            block_id: block,
            previous_block: 0,
            parts,
        };
        match self.home.ledger(key, policies, call).await {
            Ok(_) => {
                bump(&self.counters.returns, 1);
                bump(&self.counters.units_returned, unused);
                self.home_call("return");
                self.units("returned", unused);
            }
            Err(e) => self.lost(unused, &e),
        }
    }

    /// Unused units that could not go home: under-admission until their window or refill
    /// frees them.
    pub(super) fn lost(&self, unused: u64, e: &StoreError) {
        bump(&self.counters.errors, 1);
        bump(&self.counters.units_dropped, unused);
        self.home_call("error");
        self.units("dropped", unused);
        tracing::debug!(target: "tollgate::store", error = %e, "a deposit's return failed");
    }
}
