//! The [`Store`] and [`OverrideStore`] implementations of [`MemoryStore`], the operations
//! they apply, and [`MemoryCheck`], the future of its check.

use std::future::ready;
use std::time::Duration;

use smallvec::SmallVec;

use super::MemoryStore;
use crate::algorithm::AnyState;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::{Limits, Policy};
use crate::store::op::refused_misfit;
use crate::store::{AnswerNow, Applied, ApplyFuture, BoxFuture, Op, OverrideStore, Store};

/// The future of [`MemoryStore`]'s [`check`](Store::check): the store decides when it is
/// called, so this is ready at once. An in-flight slot the decision took is given back if
/// the future is dropped unread, so a check whose caller gave up before its first poll
/// holds nothing.
///
/// ```
/// use tollgate::key::Key;
/// use tollgate::store::{MemoryStore, Store};
/// use tollgate::Policy;
///
/// let store = MemoryStore::new();
/// let one = [Policy::in_flight("running", 1)?];
/// let key = Key::new("tenant", "acme");
/// drop(store.check(&key, &one, &[1])); // never read: its slot comes back
/// let taken = store.check_now(&key, &one, &[1]).unwrap().unwrap();
/// assert!(taken.is_allowed());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug)]
#[must_use = "futures do nothing unless polled; a dropped check gives back its slot"]
pub struct MemoryCheck {
    outcome: Option<Result<Decision, StoreError>>,
    /// Set only when the decision took a slot: what to give back if nobody reads it.
    taken: Option<Box<TakenSlot>>,
}

#[derive(Debug)]
struct TakenSlot {
    store: MemoryStore,
    key: Key,
    policies: SmallVec<[Policy; 1]>,
    slot: u64,
}

impl std::future::Future for MemoryCheck {
    type Output = Result<Decision, StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.taken = None; // read: the slot is the caller's now
        std::task::Poll::Ready(self.outcome.take().unwrap_or_else(|| {
            Err(StoreError::Protocol(crate::error::Cause::from(
                "a memory store check polled after it answered",
            )))
        }))
    }
}

impl Drop for MemoryCheck {
    fn drop(&mut self) {
        if let Some(taken) = self.taken.take() {
            taken
                .store
                .release_now(&taken.key, &taken.policies, taken.slot);
        }
    }
}

impl Store for MemoryStore {
    type CheckFuture = MemoryCheck;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        let outcome = self.inner.decide(key, policies, costs, true);
        let taken = match &outcome {
            Ok(d) if d.is_allowed() && d.slot() != 0 => Some(Box::new(TakenSlot {
                store: self.clone(),
                key: key.clone(),
                policies: policies
                    .iter()
                    .filter(|p| p.is_in_flight())
                    .cloned()
                    .collect(),
                slot: d.slot(),
            })),
            _ => None,
        };
        MemoryCheck {
            outcome: Some(outcome),
            taken,
        }
    }

    #[inline]
    fn check_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> AnswerNow {
        Some(self.inner.decide(key, policies, costs, true))
    }

    /// Every operation is done by the time this returns; the future only reports it.
    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if let Some(refused) = refused_misfit(&op, policies.len()) {
            return refused;
        }
        match op {
            Op::Check { costs } => {
                // Read at once: a slot it took is the caller's from here.
                return crate::store::check_applied(self, key, policies, &costs);
            }
            Op::Peek { costs } => {
                return Box::pin(ready(
                    self.inner
                        .decide(key, policies, &costs, false)
                        .map(Applied::Decision),
                ));
            }
            Op::Refund { costs } => self.refund_now(key, policies, &costs),
            Op::Settle { reserved, actual } => self.settle_now(key, policies, &reserved, &actual),
            Op::Release { slot } => self.release_now(key, policies, slot),
            // Slots here never expire: nothing to extend.
            Op::Refresh { .. } => {}
            Op::Reset => self.remove(key, policies),
            op @ Op::Fallback { .. } => {
                if let Some(op) = op.store_part() {
                    return self.apply(key, policies, op);
                }
            }
        }
        Box::pin(ready(Ok(Applied::Done)))
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        Some(self)
    }

    fn now_millis(&self) -> u64 {
        self.inner.clock.now_millis()
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn applies_failure_modes(&self) -> bool {
        false
    }
}

impl OverrideStore for MemoryStore {
    fn set(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let now = self.inner.clock.now_millis();
        let expires =
            ttl.map(|t| now.saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX)));
        self.inner.change_override(key, policy, Some(expires), now);
        Box::pin(ready(Ok(())))
    }

    fn remove(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        let now = self.inner.clock.now_millis();
        self.inner.change_override(key, policy, None, now);
        Box::pin(ready(Ok(())))
    }

    fn list(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        let now = self.inner.clock.now_millis();
        Box::pin(ready(Ok(self.inner.overrides.list(key, policies, now))))
    }
}

/// The operations that change a key's states after its check: give-backs, releases,
/// settlements and charges that need not fit.
impl MemoryStore {
    /// Gives back up to `costs[i]` units to the key's state for `policies[i]`; a key or policy
    /// with no state is left alone (nothing is inserted). See [`Op::Refund`](crate::store::Op::Refund).
    fn refund_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) {
        self.adjust_now(key, policies, costs, false, |state, now, limits, cost| {
            // A refund is about units; a slot comes back only by its release.
            if !matches!(state, AnyState::InFlight(_)) {
                state.refund(now, limits, cost);
            }
        });
    }

    /// Gives back the slot named `slot` to each in-flight policy's state it was taken from
    /// (see [`Op::Release`](crate::store::Op::Release)).
    fn release_now(&self, key: &Key, policies: &[Policy], slot: u64) {
        let ones: SmallVec<[u64; 2]> = policies.iter().map(|_| 1).collect();
        self.adjust_now(key, policies, &ones, false, |state, _, _, _| {
            if let AnyState::InFlight(held) = state {
                held.release_named(slot);
            }
        });
    }

    /// Settles each policy: refunds what was reserved above the actual cost, overcharges
    /// what the actual cost exceeds it by. See [`Op::Settle`](crate::store::Op::Settle).
    fn settle_now(&self, key: &Key, policies: &[Policy], reserved: &[u64], actual: &[u64]) {
        let (mut back, mut extra): (SmallVec<[u64; 2]>, SmallVec<[u64; 2]>) =
            (SmallVec::new(), SmallVec::new());
        for (&r, &a) in reserved.iter().zip(actual) {
            back.push(r.saturating_sub(a));
            extra.push(a.saturating_sub(r));
        }
        if back.iter().any(|&b| b > 0) {
            self.adjust_now(key, policies, &back, false, |state, now, limits, cost| {
                // As for a refund: a slot comes back only by its release.
                if !matches!(state, AnyState::InFlight(_)) {
                    state.refund(now, limits, cost);
                }
            });
        }
        if extra.iter().any(|&e| e > 0) {
            self.overcharge_now(key, policies, &extra);
        }
    }

    /// Takes one slot of each in-flight policy among `policies` whether or not it fits:
    /// for a local fallback that learns of a request running that its store admitted (the
    /// count must follow what runs, or the releases that follow take it below that).
    pub(crate) fn take_slots(&self, key: &Key, policies: &[Policy]) {
        let ones: SmallVec<[u64; 2]> = policies.iter().map(|_| 1).collect();
        self.charge_now(key, policies, &ones, |state, now, limits, c| {
            if let AnyState::InFlight(_) = state {
                state.commit(now, limits, c);
            }
        });
    }

    /// Charges `costs` whether or not they fit (within each algorithm's overcharge bound),
    /// creating the key's state when it has none.
    fn overcharge_now(&self, key: &Key, policies: &[Policy], costs: &[u64]) {
        self.charge_now(key, policies, costs, |state, now, p, c| {
            if c > 0 {
                state.overcharge(now, p, c);
            }
        });
    }

    /// Applies `charge` to the key's state for each policy, creating the key's entry and
    /// states when it has none (under the same lock: an entry created and left for a
    /// second lock could be swept or evicted in between, and the charge lost).
    fn charge_now(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        charge: impl Fn(&mut AnyState, u64, &Limits, u64),
    ) {
        self.adjust_now(key, policies, costs, true, charge);
    }
}
