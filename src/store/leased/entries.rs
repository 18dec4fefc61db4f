//! What an instance holds per key: its observed rate, its block and its last refusal, and
//! the answers it gives from them without a call; idle keys forgotten, unused blocks given
//! back.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use super::ledger::{Kind, Returned};
use super::*;
use crate::algorithm::PolicyDecision;
use crate::decision::Decision;
use crate::key::Key;
use crate::policy::Policy;

/// One key and policy set on this instance.
pub(super) struct Entry {
    /// Its hash in the [`EntryTable`](super::table::EntryTable).
    pub(super) hash: u64,
    pub(super) key: Key,
    pub(super) policies: Box<[Policy]>,
    pub(super) st: parking_lot::Mutex<EntryState>,
    pub(super) refill: tokio::sync::Mutex<()>,
}

impl Entry {
    pub(super) fn new(hash: u64, key: &Key, policies: &[Policy]) -> Self {
        Self {
            hash,
            key: key.clone(),
            policies: policies.into(),
            st: parking_lot::Mutex::new(EntryState::default()),
            refill: tokio::sync::Mutex::new(()),
        }
    }
}

#[derive(Default)]
pub(super) struct EntryState {
    pub(super) block: Option<Block>,
    pub(super) denied: Option<Denied>,
    /// When units last came back through this instance ([`Shared::now`]): a ledger refusal
    /// to a call sent before then is not kept (it may predate the give-back).
    pub(super) given_back_at: Option<u64>,
    pub(super) meter: Meter,
    pub(super) last_used: u64,
    /// Per policy, the limit and capacity the ledger last decided with (a per-key override's,
    /// or the plan's); empty until it answered. Blocks are sized from them.
    pub(super) in_force: SmallVec<[(u64, u64); 2]>,
}

/// Units of each policy in hand, spendable until `expires` (local clock, exclusive).
pub(super) struct Block {
    pub(super) id: u64,
    pub(super) generation: u64,
    pub(super) sent: u64,
    pub(super) expires: u64,
    pub(super) granted_at: u64,
    /// Its lease, on the ledger's clock: how long from `granted_at` it may be spent (ms).
    pub(super) lease_ms: u64,
    pub(super) parts: SmallVec<[BlockPart; 2]>,
}

impl Block {
    /// What a ledger call giving this block back names of `part`, one of its parts.
    pub(super) fn returned(&self, part: &BlockPart) -> Returned {
        Returned {
            granted: part.granted,
            unused: part.left,
            granted_at: self.granted_at,
            lease_ms: self.lease_ms,
            rate: part.rate,
        }
    }
}

pub(super) struct BlockPart {
    pub(super) granted: u64,
    pub(super) left: u64,
    /// The limit decisions report (the capacity for the token bucket and GCRA), as in force
    /// when the block was granted.
    pub(super) limit: u64,
    /// The limit (refill rate) in force when the block was granted, sent back with its
    /// return ([`Returned::rate`]).
    pub(super) rate: u64,
    pub(super) shared_remaining: u64,
    pub(super) reset_after: u64,
}

/// A refusal by the ledger, in force until `until` for requests costing at least `costs`:
/// the ledger's `retry_after`, but at most one lease time, so that a per-key override
/// raising the limit (set on any instance) reaches this one within a lease time.
pub(super) struct Denied {
    pub(super) generation: u64,
    pub(super) sent: u64,
    pub(super) until: u64,
    pub(super) costs: SmallVec<[u64; 2]>,
    pub(super) decisions: SmallVec<[PolicyDecision; 2]>,
}

/// Units asked per policy in the current and the previous span of one lease time.
#[derive(Default)]
pub(super) struct Meter {
    pub(super) start: u64,
    pub(super) cur: SmallVec<[u64; 2]>,
    pub(super) prev: SmallVec<[u64; 2]>,
}

impl Meter {
    pub(super) fn roll(&mut self, now: u64, span: u64, n: usize) {
        if self.cur.len() != n {
            self.cur = SmallVec::from_elem(0, n);
            self.prev = SmallVec::from_elem(0, n);
            self.start = now;
        }
        let elapsed = now.saturating_sub(self.start);
        if elapsed >= 2 * span {
            self.cur.iter_mut().for_each(|c| *c = 0);
            self.prev.iter_mut().for_each(|c| *c = 0);
            self.start = now;
        } else if elapsed >= span {
            self.prev.clone_from(&self.cur);
            self.cur.iter_mut().for_each(|c| *c = 0);
            self.start += span;
        }
    }

    pub(super) fn add(&mut self, now: u64, span: u64, costs: &[u64]) {
        self.roll(now, span, costs.len());
        for (c, x) in self.cur.iter_mut().zip(costs) {
            *c = c.saturating_add(*x);
        }
    }

    /// Units of policy `i` expected over the next `span`.
    pub(super) fn estimate(&self, now: u64, span: u64, i: usize) -> u64 {
        let e = now.saturating_sub(self.start).min(span);
        let prev = self.prev.get(i).copied().unwrap_or(0);
        let cur = self.cur.get(i).copied().unwrap_or(0);
        (prev.saturating_mul(span - e) / span).saturating_add(cur)
    }
}

/// What the slow path does for a request.
pub(super) enum Plan {
    /// One ledger call decides the request, which takes no block.
    Exact,
    /// Ask for a block lent for `lease_ms`, of `wants` units per policy.
    Block {
        lease_ms: u64,
        wants: SmallVec<[u64; 2]>,
    },
}

/// Where a leased request's units came from, to give them back (mixed requests).
pub(super) enum Taken {
    Block(u64),
    Ledger { id: u64, at: u64 },
    Nothing,
}

pub(super) fn spawn(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(fut);
    }
}

impl<S: LeaseBackend> Shared<S> {
    /// The entry of `key` and `policies`, made on the key's second sighting (see
    /// [`table`](super::table)); `None` for a key seen once, or new while `max_keys` keys are
    /// tracked: decided exactly and not remembered.
    pub(super) fn entry(&self, key: &Key, policies: &[Policy]) -> Option<Arc<Entry>> {
        let hash = self.entries.hash(key, policies);
        if let Some(e) = self.entries.get(hash, key, policies) {
            return Some(e);
        }
        if !self.entries.seen_before(hash) {
            bump(&self.counters.first_sightings, 1);
            return None;
        }
        let e = self
            .entries
            .get_or_insert(hash, key, policies, self.max_keys);
        if e.is_none() {
            bump(&self.counters.untracked, 1);
        }
        e
    }

    pub(super) fn existing(&self, key: &Key, policies: &[Policy]) -> Option<Arc<Entry>> {
        let hash = self.entries.hash(key, policies);
        self.entries.get(hash, key, policies)
    }

    /// The answer from what this instance holds, if it has one, and where its units came
    /// from: the block in hand (named, so that giving them back reaches that block only,
    /// never one granted after it), or nowhere (a refusal remembered).
    pub(super) fn local(
        &self,
        entry: &Entry,
        costs: &[u64],
        now: u64,
        meter: bool,
    ) -> Option<(Decision, Taken)> {
        let generation = self.inner.generation();
        let mut st = entry.st.lock();
        st.last_used = now;
        if let Some(b) = &mut st.block {
            if b.generation == generation
                && now < b.expires
                && b.parts.iter().zip(costs).all(|(p, c)| p.left >= *c)
            {
                let elapsed = now.saturating_sub(b.sent);
                let block = b.id;
                let d = Decision::from_policies(b.parts.iter_mut().zip(costs).map(|(p, c)| {
                    p.left -= c;
                    PolicyDecision::from_parts(
                        true,
                        p.limit,
                        p.left.saturating_add(p.shared_remaining).min(p.limit),
                        p.reset_after.saturating_sub(elapsed),
                        0,
                        0,
                    )
                }));
                if meter {
                    st.meter.add(now, self.lease_ms, costs);
                }
                bump(&self.counters.local_admits, 1);
                return Some((d, Taken::Block(block)));
            }
        }
        if let Some(d) = &st.denied {
            if d.generation == generation
                && now < d.until
                && costs.iter().zip(&d.costs).all(|(c, dc)| c >= dc)
                // A cost above the limit may be above the capacity, refused as such by the
                // ledger (no wait makes it fit), not as the rate-limit denial saved here.
                && costs
                    .iter()
                    .zip(&d.decisions)
                    .all(|(c, p)| *c <= p.limit())
            {
                let elapsed = now.saturating_sub(d.sent);
                let decision = Decision::from_policies(d.decisions.iter().map(|p| {
                    PolicyDecision::from_parts(
                        p.is_allowed(),
                        p.limit(),
                        p.remaining(),
                        p.reset_after_millis().saturating_sub(elapsed),
                        p.retry_after_millis().saturating_sub(elapsed),
                        0,
                    )
                }));
                if meter {
                    st.meter.add(now, self.lease_ms, costs);
                }
                bump(&self.counters.local_refusals, 1);
                return Some((decision, Taken::Nothing));
            }
        }
        None
    }

    /// Whether to lease, and how much, from the key's observed rate.
    pub(super) fn plan(
        &self,
        st: &EntryState,
        policies: &[Policy],
        costs: &[u64],
        now: u64,
    ) -> Plan {
        let mut lease_ms = self.lease_ms;
        let mut caps: SmallVec<[u64; 2]> = SmallVec::new();
        for (i, (p, &cost)) in policies.iter().zip(costs).enumerate() {
            // The limit in force (an override's, once the ledger named it), not the plan's:
            // a block under a lowered limit stays a fraction of that limit.
            let (limit, capacity) = st
                .in_force
                .get(i)
                .copied()
                .unwrap_or((p.limit(), p.capacity()));
            let reported = if Kind::of(p) == Some(Kind::Bucket) {
                capacity
            } else {
                limit
            };
            let cap = (reported as f64 * self.fraction) as u64;
            if cost == 0 || cap < cost.saturating_mul(2) {
                return Plan::Exact;
            }
            match Kind::of(p) {
                // The refill charged ahead, N·T/W, stays within the block cap.
                Some(Kind::Bucket) => {
                    lease_ms = lease_ms.min(cap * p.window_millis() / limit.max(1));
                }
                // A block's entry counts T longer than its units need: T stays within the
                // same fraction of the window.
                Some(Kind::Log) => {
                    lease_ms = lease_ms.min((p.window_millis() as f64 * self.fraction) as u64);
                }
                _ => {}
            }
            caps.push(cap);
        }
        if lease_ms < 10 {
            return Plan::Exact;
        }
        let mut wants = SmallVec::new();
        for (i, (&cost, &cap)) in costs.iter().zip(&caps).enumerate() {
            // The units expected over the lease, from those asked over the last lease time.
            let expected = st
                .meter
                .estimate(now, self.lease_ms, i)
                .saturating_mul(lease_ms)
                / self.lease_ms;
            if expected < cost.saturating_mul(2) {
                return Plan::Exact;
            }
            wants.push(expected.saturating_mul(2).clamp(cost, cap));
        }
        Plan::Block { lease_ms, wants }
    }

    /// Starts the task that returns the units of blocks that expired unused and forgets idle
    /// keys, once, when a runtime is there.
    pub(super) fn start_sweeper(self: &Arc<Self>) {
        if self.sweeper.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.sweeper.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<Self> = Arc::downgrade(self);
        let every = Duration::from_millis((self.lease_ms / 2).max(10));
        handle.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(me) = weak.upgrade() else { return };
                me.sweep();
            }
        });
    }

    /// Gives back this instance's blocks of `key` (every policy set) and forgets its
    /// refusals and the limits it learned: the key's next decisions ask the ledger.
    pub(super) fn forget(self: &Arc<Self>, key: &Key) {
        let mut blocks = Vec::new();
        for e in self.entries.all() {
            if e.key != *key {
                continue;
            }
            let mut st = e.st.lock();
            st.denied = None;
            st.in_force.clear();
            if let Some(b) = st.block.take() {
                blocks.push((e.clone(), b));
            }
        }
        for (e, b) in blocks {
            if let Some(fut) = self.give_back(&e, b) {
                spawn(fut);
            }
        }
    }

    pub(super) fn sweep(self: &Arc<Self>) {
        let now = self.now();
        let idle = (self.lease_ms * 8).max(5_000);
        let mut expired = Vec::new();
        {
            self.entries.retain(|e| {
                let mut st = e.st.lock();
                if st.block.as_ref().is_some_and(|b| now >= b.expires) {
                    if let Some(b) = st.block.take() {
                        expired.push((e.clone(), b));
                    }
                }
                st.block.is_some() || now.saturating_sub(st.last_used) < idle
            });
        }
        for (e, b) in expired {
            if let Some(fut) = self.give_back(&e, b) {
                spawn(fut);
            }
        }
    }
}
