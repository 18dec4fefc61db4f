//! Deciding a request of leasable policies: from the block in hand, or by a ledger call that
//! grants a block (giving the one in hand back in the same call) or decides the request
//! exactly; the reply installed as the key's block or refusal.

use super::ledger::Answer;
use super::*;

impl<S: LeaseBackend> Shared<S> {
    pub(super) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn call(
        &self,
        mode: LedgerMode,
        lease_ms: u64,
        id: u64,
        policies: &[Policy],
    ) -> ledger::LedgerCall {
        ledger::LedgerCall {
            mode,
            lease_ms,
            block_id: id,
            previous_block: 0,
            parts: policies
                .iter()
                .filter_map(|p| Kind::of(p).map(|k| Part::new(k, p)))
                .collect(),
        }
    }

    /// Decides a request whose policies are all leasable.
    pub(super) async fn decide(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Result<(Decision, Taken), StoreError> {
        let Some(entry) = self.entry(key, policies) else {
            return self.exact(None, key, policies, costs).await;
        };
        let now = self.now();
        if let Some(answer) = self.local(&entry, costs, now, true) {
            return Ok(answer);
        }
        self.start_sweeper();
        let plan = {
            let mut st = entry.st.lock();
            st.meter.add(now, self.lease_ms, costs);
            self.plan(&st, policies, costs, now)
        };
        match plan {
            Plan::Exact => self.exact(Some(&entry), key, policies, costs).await,
            Plan::Block { lease_ms, wants } => {
                // A grant runs to its end even when its caller gives up: cut off after the
                // ledger charged the block, or after the block in hand was taken to be given
                // back, it would lose a whole block (up to a tenth of the limit) until the
                // window ends. Dropped once started, it is finished on the runtime; a caller
                // that goes away costs at most its own units.
                let grant = Arc::clone(self).grant(
                    entry,
                    key.clone(),
                    policies.iter().cloned().collect(),
                    costs.iter().copied().collect(),
                    lease_ms,
                    wants,
                );
                Finishing::new(grant).await
            }
        }
    }

    /// Takes a block for a request of `costs` on a tracked key (see [`decide`](Self::decide)),
    /// giving back the block in hand in the same ledger call.
    pub(super) async fn grant(
        self: Arc<Self>,
        entry: Arc<Entry>,
        key: Key,
        policies: SmallVec<[Policy; 2]>,
        costs: SmallVec<[u64; 2]>,
        lease_ms: u64,
        wants: SmallVec<[u64; 2]>,
    ) -> Result<(Decision, Taken), StoreError> {
        let (key, policies, costs) = (&key, &policies[..], &costs[..]);
        let entry = &entry;
        let _refill = entry.refill.lock().await;
        let now = self.now();
        if let Some(answer) = self.local(entry, costs, now, false) {
            return Ok(answer);
        }
        let id = self.next_id();
        let mut call = self.call(LedgerMode::Grant, lease_ms, id, policies);
        for ((part, &cost), &want) in call.parts.iter_mut().zip(costs).zip(&wants) {
            part.cost = cost;
            part.wanted = want.max(cost);
        }
        let generation = self.inner.generation();
        // The block in hand, used up or ended, goes back in the same call: its
        // unused units, and the refill charged ahead or log time it still holds.
        let old = entry.st.lock().block.take();
        let mut kept = None;
        if let Some(old) = old {
            if old.generation == generation {
                call.previous_block = old.id;
                let unused = old.parts.iter().map(|p| p.left).max().unwrap_or(0);
                for (part, bp) in call.parts.iter_mut().zip(&old.parts) {
                    part.returned = old.returned(bp);
                }
                kept = Some((old, unused));
            }
        }
        let sent = self.now();
        match self.inner.ledger(key, policies, call).await {
            Ok(reply) => {
                if let Some((_, unused)) = kept {
                    bump(&self.counters.units_returned, unused);
                    crate::telemetry::lease_units("returned", unused);
                }
                Ok(self.install(Some(entry), policies, costs, reply, id, sent, generation))
            }
            Err(e) => {
                // The call may have run (a reply lost to a timeout): the block it
                // gave back must not be spent again.
                if let Some((_, unused)) = kept {
                    bump(&self.counters.units_dropped, unused);
                    crate::telemetry::lease_units("dropped", unused);
                }
                Err(e)
            }
        }
    }

    /// One request decided by one ledger call; its refusal kept on `entry`, if the key has
    /// one.
    pub(super) async fn exact(
        self: &Arc<Self>,
        entry: Option<&Entry>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Result<(Decision, Taken), StoreError> {
        let id = self.next_id();
        let mut call = self.call(LedgerMode::Grant, 0, id, policies);
        for (part, &cost) in call.parts.iter_mut().zip(costs) {
            part.cost = cost;
            part.wanted = cost;
        }
        let generation = self.inner.generation();
        let sent = self.now();
        let reply = self.inner.ledger(key, policies, call).await?;
        if reply.granted && reply.lease_ms > 0 {
            return Err(StoreError::Protocol(crate::error::Cause::from(
                "the lease ledger granted a block to a call that asked for none",
            )));
        }
        let (decision, taken) = self.install(entry, policies, costs, reply, id, sent, generation);
        if let (true, Taken::Ledger { id, at }) = (decision.is_allowed(), &taken) {
            self.charges.record(key, policies, *id, *at, costs);
        }
        Ok((decision, taken))
    }

    /// Turns a ledger reply into the request's decision, keeping a block or a refusal on
    /// `entry` (always there for a block: only a tracked key asks for one).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn install(
        self: &Arc<Self>,
        entry: Option<&Entry>,
        policies: &[Policy],
        costs: &[u64],
        reply: LedgerReply,
        id: u64,
        sent: u64,
        generation: u64,
    ) -> (Decision, Taken) {
        let answers = &reply.answers;
        if let Some(entry) = entry {
            entry.st.lock().in_force = answers.iter().map(|a| (a.limit, a.capacity)).collect();
        }
        if !reply.granted {
            return self.install_refusal(entry, policies, costs, answers, sent, generation);
        }
        let decision = Decision::from_policies(policies.iter().zip(answers).zip(costs).map(
            |((p, a), &cost)| {
                let extra = a.granted.saturating_sub(cost);
                let limit = a.reported_limit(Kind::of(p));
                PolicyDecision::from_parts(
                    true,
                    limit,
                    a.remaining.saturating_add(extra).min(limit),
                    a.reset_after_ms,
                    0,
                    0,
                )
            },
        ));
        let entry = match entry {
            Some(entry) if reply.lease_ms > 0 => entry,
            _ => {
                bump(&self.counters.exact_calls, 1);
                if let Some(entry) = entry {
                    entry.st.lock().denied = None;
                }
                return (
                    decision,
                    Taken::Ledger {
                        id,
                        at: reply.now_ms,
                    },
                );
            }
        };
        bump(&self.counters.grants, 1);
        let granted: u64 = answers.iter().map(|a| a.granted).max().unwrap_or(0);
        bump(&self.counters.units_granted, granted);
        crate::telemetry::lease_units("granted", granted);
        let block = Block {
            id,
            generation,
            sent,
            expires: (sent + reply.lease_ms).saturating_sub(CLOCK_SLACK_MS),
            granted_at: reply.now_ms,
            lease_ms: reply.lease_ms,
            parts: policies
                .iter()
                .zip(answers)
                .zip(costs)
                .map(|((p, a), &cost)| BlockPart {
                    granted: a.granted,
                    left: a.granted.saturating_sub(cost),
                    limit: a.reported_limit(Kind::of(p)),
                    rate: a.limit,
                    shared_remaining: a.remaining,
                    reset_after: a.reset_after_ms,
                })
                .collect(),
        };
        let old = {
            let mut st = entry.st.lock();
            st.denied = None;
            st.block.replace(block)
        };
        if let Some(old) = old {
            if let Some(fut) = self.give_back(entry, old) {
                spawn(fut);
            }
        }
        (decision, Taken::Block(id))
    }

    /// A ledger's refusal as the request's decision, kept on `entry` (if the key has one)
    /// for the requests that come before the ledger's `retry_after`, or one lease time.
    fn install_refusal(
        &self,
        entry: Option<&Entry>,
        policies: &[Policy],
        costs: &[u64],
        answers: &[Answer],
        sent: u64,
        generation: u64,
    ) -> (Decision, Taken) {
        bump(&self.counters.refusals, 1);
        // Marked, as every store marks them, where the cost is above the capacity in force
        // (the ledger's, an override's when one is set): no wait makes it fit.
        let decisions: SmallVec<[PolicyDecision; 2]> = policies
            .iter()
            .zip(answers)
            .zip(costs)
            .map(|((p, a), &cost)| {
                PolicyDecision::from_parts(
                    a.retry_after_ms == 0,
                    a.reported_limit(Kind::of(p)),
                    a.remaining,
                    a.reset_after_ms,
                    a.retry_after_ms,
                    0,
                )
                .for_cost(cost, || p.limits().shaping_slack())
            })
            .collect();
        let wait = answers.iter().map(|a| a.retry_after_ms).max().unwrap_or(0);
        // A cost above the capacity is not saved: the saved refusal answers as a rate-limit
        // denial, which a penalty would punish. Asking the ledger again charges nothing.
        let Some(entry) = entry.filter(|_| !decisions.iter().any(|d| d.exceeds_capacity())) else {
            return (Decision::from_policies(decisions), Taken::Nothing);
        };
        let mut st = entry.st.lock();
        if st.given_back_at.is_some_and(|at| at >= sent) {
            // Units came back after this call was sent: the next request asks again.
            return (Decision::from_policies(decisions), Taken::Nothing);
        }
        st.denied = Some(Denied {
            generation,
            sent,
            // The ledger is asked again after a lease time at the latest: an override
            // set meanwhile (on any instance) may allow the key sooner.
            until: sent.saturating_add(wait.min(self.lease_ms)),
            costs: costs.iter().copied().collect(),
            decisions: decisions.clone(),
        });
        (Decision::from_policies(decisions), Taken::Nothing)
    }
}
