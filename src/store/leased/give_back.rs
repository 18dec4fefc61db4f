//! Giving units back to the ledger: a block's unused units (and the refill or log time it
//! still holds), and the units of a request that turned out not to count.

use super::*;

impl<S: LeaseBackend> Shared<S> {
    /// The call that gives a block's unused units back, if it has any and its ledger is the
    /// one that granted it.
    pub(super) fn give_back(
        self: &Arc<Self>,
        entry: &Entry,
        block: Block,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let unused = block.parts.iter().map(|p| p.left).max().unwrap_or(0);
        // A block used up before its lease ends still holds, in the bucket, the refill charged
        // ahead for the rest of the lease and, in the log, an entry counting until the lease's
        // end: both come back too.
        let early = self.now() < block.expires
            && entry
                .policies
                .iter()
                .any(|p| matches!(Kind::of(p), Some(Kind::Bucket | Kind::Log)));
        if unused == 0 && !early {
            return None;
        }
        if block.generation != self.inner.generation() {
            bump(&self.counters.units_dropped, unused);
            crate::telemetry::lease_units("dropped", unused);
            return None;
        }
        let mut call = self.call(LedgerMode::Return, 0, block.id, &entry.policies);
        for (part, bp) in call.parts.iter_mut().zip(&block.parts) {
            part.returned = block.returned(bp);
        }
        let fut = self.inner.ledger(&entry.key, &entry.policies, call);
        let me = self.clone();
        Some(async move {
            match fut.await {
                Ok(_) => {
                    bump(&me.counters.units_returned, unused);
                    crate::telemetry::lease_units("returned", unused);
                }
                Err(e) => {
                    bump(&me.counters.units_dropped, unused);
                    crate::telemetry::lease_units("dropped", unused);
                    tracing::debug!(target: "tollgate::store", error = %e, "block return failed");
                }
            }
        })
    }

    /// Gives back the block this instance holds for `key`'s `policies`, if any, and waits
    /// for the answer (a debt stands on the key: see [`settle`](crate::store::Op::Settle)).
    pub(super) async fn return_block(self: &Arc<Self>, key: &Key, policies: &[Policy]) {
        let Some(entry) = self.existing(key, policies) else {
            return;
        };
        let block = entry.st.lock().block.take();
        if let Some(fut) = block.and_then(|b| self.give_back(&entry, b)) {
            fut.await;
        }
    }

    /// Gives back `units` that no longer count (a refund, the part of a settlement below its
    /// reservation). With a block in hand for the key's policies, into it, up to what has
    /// been spent of it (a block never holds more than it was granted; the rest is dropped,
    /// the safe way: a give-back to the ledger could take its count below the units this
    /// block still holds, were it of more than the key was charged). With none (a cold key,
    /// or a request too large for a block, charged at the ledger), to the ledger.
    pub(super) async fn give_back_units(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        units: &[u64],
    ) {
        let held = self
            .existing(key, policies)
            .is_some_and(|e| e.st.lock().block.is_some());
        if held {
            return self.untake(key, policies, units, Taken::Nothing).await;
        }
        // The charges this instance made at the ledger, named, the newest first; what they
        // do not cover goes unnamed (the ledger takes it off the newest units it counts).
        let now = self.inner.now_millis();
        let mut rest: SmallVec<[u64; 2]> = units.iter().copied().collect();
        for (id, at, back) in self.charges.take(key, policies, &mut rest, now) {
            self.to_ledger(key, policies, &back, id, at).await;
        }
        if rest.iter().any(|&u| u > 0) {
            self.to_ledger(key, policies, &rest, self.next_id(), now)
                .await;
        }
        self.forget_refusal(key, policies);
    }

    /// Forgets the ledger's refusal this instance keeps for `key`'s `policies`: units just
    /// came back through it, and the next request asks the ledger (which may admit it, as
    /// the exact stores would) instead of being refused for up to a lease time more.
    fn forget_refusal(&self, key: &Key, policies: &[Policy]) {
        if let Some(e) = self.existing(key, policies) {
            let mut st = e.st.lock();
            st.denied = None;
            st.given_back_at = Some(self.now());
        }
    }

    /// Gives `costs` back to the ledger as charged by call `id` at `at` (a call it does not
    /// know: charged outside blocks, named afresh).
    async fn to_ledger(&self, key: &Key, policies: &[Policy], costs: &[u64], id: u64, at: u64) {
        let mut call = self.call(LedgerMode::Return, 0, id, policies);
        for (part, &c) in call.parts.iter_mut().zip(costs) {
            part.returned = Returned {
                granted: c,
                unused: c,
                granted_at: at,
                lease_ms: 0,
                rate: 0,
            };
        }
        // A caller that stops waiting (its check dropped) does not leave the refused
        // request's units charged.
        let _ = crate::store::to_the_end(self.inner.ledger(key, policies, call)).await;
    }

    /// Gives back units a request took, where `taken` says they came from (a mixed request
    /// refused by the exact store; see also [`give_back_units`](Self::give_back_units)).
    pub(super) async fn untake(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        taken: Taken,
    ) {
        match taken {
            Taken::Nothing => {
                // From a block: back into it, if it is still held.
                if let Some(e) = self.existing(key, policies) {
                    let mut st = e.st.lock();
                    if let Some(b) = &mut st.block {
                        for (p, c) in b.parts.iter_mut().zip(costs) {
                            p.left = p.left.saturating_add(*c).min(p.granted);
                        }
                    }
                }
            }
            Taken::Block(id) => {
                if let Some(e) = self.existing(key, policies) {
                    let mut st = e.st.lock();
                    if let Some(b) = st.block.as_mut().filter(|b| b.id == id) {
                        for (p, c) in b.parts.iter_mut().zip(costs) {
                            p.left = p.left.saturating_add(*c).min(p.granted);
                        }
                    }
                }
            }
            Taken::Ledger { id, at } => {
                self.charges.forget(key, id);
                self.to_ledger(key, policies, costs, id, at).await;
            }
        }
        self.forget_refusal(key, policies);
    }
}
