//! The operations of both Redis stores ([`Op`]): each a request of the decision script in
//! the op's mode, batched like any other, so one atomic script call; a reset is one
//! `UNLINK`. A charge that takes an in-flight slot names the slot itself ([`next_slot`]), so
//! a caller that gives up can give it back without the reply.

use std::future::Future;
use std::sync::Arc;

use smallvec::SmallVec;

use super::connector::{store_error, Connector};
use super::engine::Core;
use super::keys::{redis_key, KeyFor};
use super::request::{units, Amount, Mode};
use crate::decision::Decision;
use crate::error::{Cause, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::store::op::refused_misfit;
use crate::store::{Applied, ApplyFuture, BoxFuture, Op};

impl<C: Connector> Core<C> {
    /// Applies `op` (see [`Store::apply`](crate::store::Store::apply)): one request of the
    /// decision script in the op's mode, batched like any other, so one atomic script call;
    /// a reset is one `UNLINK`.
    pub(crate) fn apply(self: &Arc<Self>, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if let Some(refused) = refused_misfit(&op, policies.len()) {
            return refused;
        }
        let call = match op {
            Op::Check { costs } => {
                let call = self.charge(key, policies, &costs);
                return Box::pin(async move { call.await.map(Applied::Decision) });
            }
            Op::Peek { costs } => {
                let call = self.decide(key, policies, units(&costs), Mode::Peek);
                return Box::pin(async move { call.await.map(Applied::Decision) });
            }
            Op::Refund { costs } => self.refund(key, policies, &costs),
            Op::Settle { reserved, actual } => self.settle(key, policies, &reserved, &actual),
            Op::Release { slot } => self.slot(key, policies, slot, Mode::Refund),
            Op::Refresh { slot } => self.slot(key, policies, slot, Mode::Refresh),
            Op::Reset => return self.reset(key, policies),
            op @ Op::Fallback { .. } => match op.store_part() {
                Some(op) => return self.apply(key, policies, op),
                None => None,
            },
        };
        match call {
            Some(call) => Box::pin(async move { call.await.map(|_| Applied::Done) }),
            None => Box::pin(std::future::ready(Ok(Applied::Done))),
        }
    }

    /// A charge, taking an in-flight slot for each in-flight policy: the request names its
    /// slot (see [`next_slot`]) in place of that policy's cost, and an allowed decision
    /// carries it for the release.
    pub(crate) fn charge(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>> {
        if !policies.iter().any(Policy::is_in_flight) {
            return self.decide(key, policies, units(costs), Mode::Charge);
        }
        let slot = next_slot();
        let named = policies
            .iter()
            .zip(costs)
            .map(|(p, &c)| {
                if p.is_in_flight() {
                    Amount::Slot(slot)
                } else {
                    Amount::Units(c)
                }
            })
            .collect();
        let call = self.decide(key, policies, named, Mode::Charge);
        Box::pin(SlotCharge {
            call: Some(call),
            core: Arc::clone(self),
            key: key.clone(),
            held: policies
                .iter()
                .filter(|p| p.is_in_flight())
                .cloned()
                .collect(),
            slot,
        })
    }

    /// A settlement ([`Op::Settle`]): one request in settle mode with each policy's
    /// settlement; `None` when every policy settles at what it reserved.
    fn settle(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> Option<BoxFuture<Result<Decision, StoreError>>> {
        // A policy settled at what it reserved changes nothing (as in the memory store): it
        // is not sent, so the script neither writes its state nor logs an entry of 0. Nor is
        // an in-flight one: units are not slots, and the script's refund of an in-flight
        // state reads the amount as a slot's name (the memory store settles none either).
        let (policies, amounts): (SmallVec<[Policy; 2]>, SmallVec<[Amount; 2]>) = policies
            .iter()
            .zip(reserved.iter().zip(actual))
            .filter(|(p, (r, a))| r != a && !p.is_in_flight())
            .map(|(p, (&reserved, &actual))| (p.clone(), Amount::Settled { reserved, actual }))
            .unzip();
        (!policies.is_empty()).then(|| self.decide(key, &policies, amounts, Mode::Settle))
    }

    /// Gives back (`Mode::Refund`) or extends (`Mode::Refresh`) the in-flight slot `slot`
    /// under the in-flight policies among `policies`; `None` for slot 0, which names no slot
    /// here (a failure mode decided the request), and when none is in flight. A rate policy
    /// named beside them is left alone, as in the memory store: the script's refund of a
    /// rate state would read the slot's name as units and give them back.
    fn slot(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        slot: u64,
        mode: Mode,
    ) -> Option<BoxFuture<Result<Decision, StoreError>>> {
        if slot == 0 {
            return None;
        }
        let (policies, slots): (SmallVec<[Policy; 2]>, SmallVec<[Amount; 2]>) = policies
            .iter()
            .filter(|p| p.is_in_flight())
            .map(|p| (p.clone(), Amount::Slot(slot)))
            .unzip();
        (!policies.is_empty()).then(|| self.decide(key, &policies, slots, mode))
    }

    /// A refund ([`Op::Refund`]): units only; a slot comes back only by its release (the
    /// script's refund of an in-flight state reads the amount as the slot's name).
    fn refund(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Option<BoxFuture<Result<Decision, StoreError>>> {
        let (policies, amounts): (SmallVec<[Policy; 2]>, SmallVec<[Amount; 2]>) = policies
            .iter()
            .zip(costs)
            .filter(|(p, _)| !p.is_in_flight())
            .map(|(p, &c)| (p.clone(), Amount::Units(c)))
            .unzip();
        Some(self.decide(key, &policies, amounts, Mode::Refund))
    }

    /// One `UNLINK` of every state key of these policies (all algorithms), in one hash slot.
    fn reset(self: &Arc<Self>, key: &Key, policies: &[Policy]) -> ApplyFuture {
        if policies.is_empty() {
            // `UNLINK` with no keys is a syntax error; there is nothing to forget.
            return Box::pin(std::future::ready(Ok(Applied::Done)));
        }
        let mut cmd = redis::cmd("UNLINK");
        for p in policies {
            for a in crate::Algorithm::ALL {
                cmd.arg(redis_key(&self.prefix, key, p.name(), KeyFor::State(a)));
            }
        }
        let core = Arc::clone(self);
        Box::pin(async move {
            let mut conn = core.connector.connection().await?;
            let _: i64 = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(Applied::Done)
        })
    }
}

/// The future of a charge that takes an in-flight slot. The slot is named by the client
/// ([`next_slot`]), so a caller that gives up before the answer (a timeout, a client gone,
/// an HTTP/2 stream reset) does not need the reply to give it back: when this future is
/// dropped unfinished, the call it was waiting on is finished on the current Tokio runtime
/// and, if it took the slot, the slot is released at once. The release is sent after the
/// charge's reply, so it cannot overtake the charge on another connection. A charge that
/// ends in an error (the store's own timeout during a stall, a connection lost) may still
/// run in Redis later: its slot is released anyway ([`release_unanswered`]). Without a
/// runtime (dropped outside one), the slot comes back when it expires.
struct SlotCharge<C: Connector> {
    /// `None` once answered.
    call: Option<BoxFuture<Result<Decision, StoreError>>>,
    core: Arc<Core<C>>,
    key: Key,
    /// The in-flight policies of the charge: the ones a release names.
    held: SmallVec<[Policy; 1]>,
    slot: u64,
}

impl<C: Connector> Future for SlotCharge<C> {
    type Output = Result<Decision, StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            return std::task::Poll::Ready(Err(StoreError::Protocol(Cause::from(
                "a slot charge polled after it answered",
            ))));
        };
        let outcome = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        if outcome.is_err() {
            self.release_unanswered();
        }
        let slot = self.slot;
        std::task::Poll::Ready(outcome.map(|d| if d.is_allowed() { d.with_slot(slot) } else { d }))
    }
}

impl<C: Connector> Drop for SlotCharge<C> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                target: "tollgate::store",
                "an in-flight charge was dropped outside a Tokio runtime; its slot, if taken, comes back when it expires"
            );
            return;
        };
        let core = Arc::clone(&self.core);
        let key = self.key.clone();
        let held = std::mem::take(&mut self.held);
        let slot = self.slot;
        runtime.spawn(async move {
            let outcome = call.await;
            if outcome.is_err() {
                release_unanswered(core, key, held, slot).await;
                return;
            }
            if let Ok(decision) = outcome {
                if decision.is_allowed() {
                    if let Err(error) = core.apply(&key, &held, Op::Release { slot }).await {
                        tracing::warn!(
                            target: "tollgate::store",
                            %error,
                            "giving back the slot of a cancelled in-flight charge failed; it comes back when it expires"
                        );
                    }
                }
            }
        });
    }
}

impl<C: Connector> SlotCharge<C> {
    /// Releases the slot in the background after a charge answered by an error.
    fn release_unanswered(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (core, key, held) = (
                Arc::clone(&self.core),
                self.key.clone(),
                std::mem::take(&mut self.held),
            );
            runtime.spawn(release_unanswered(core, key, held, self.slot));
        }
    }
}

/// Releases `slot` after a charge that got no answer (an error: a timeout while Redis
/// stalled, a lost connection), which Redis may run later all the same. A release of a name
/// Redis does not hold changes nothing, so it is sent whatever happened: retried while the
/// store fails (for at most the slot's lease, after which it would have expired anyway),
/// and sent once more half a second after the first that landed, in case that one overtook
/// the charge on another connection. At most [`MAX_UNANSWERED`] run at once in a process:
/// past that (a long outage under load), a slot is left to its lease rather than pile up
/// tasks and calls for when the store comes back.
async fn release_unanswered<C: Connector>(
    core: Arc<Core<C>>,
    key: Key,
    held: SmallVec<[Policy; 1]>,
    slot: u64,
) {
    use std::sync::atomic::Ordering;
    if UNANSWERED.fetch_add(1, Ordering::AcqRel) >= MAX_UNANSWERED {
        UNANSWERED.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!(target: "tollgate::store", "too many unanswered in-flight charges being released; this slot comes back when its lease ends");
        return;
    }
    struct Running;
    impl Drop for Running {
        fn drop(&mut self) {
            UNANSWERED.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
    let _running = Running;
    let lease = held
        .iter()
        .map(|p| p.rate().window())
        .max()
        .unwrap_or_default();
    let deadline = tokio::time::Instant::now() + lease;
    let mut landed = 0;
    let mut wait = std::time::Duration::from_millis(50);
    while landed < 2 && tokio::time::Instant::now() < deadline {
        match core.apply(&key, &held, Op::Release { slot }).await {
            Ok(_) => {
                landed += 1;
                if landed < 2 {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(1));
            }
        }
    }
}

/// The releases of unanswered charges under way in the process, and their cap.
static UNANSWERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const MAX_UNANSWERED: usize = 1_024;

/// A name for an in-flight slot, unique among the slots held at once, below 2^53 (exact as a
/// Lua number) and never 0: each process counts up from a random point of the 2^53 − 1
/// names, so it repeats a name only after 2^53 − 1 slots (never, in practice, however long
/// a refreshed slot is held), and two processes repeat each other's names only where their
/// runs of names meet — for processes that took `a` and `b` slots, with probability about
/// `2 (a + b) / 2^53` (below one in a million for a billion slots each), and even then a
/// name repeats only if a slot of that name is still held.
pub(crate) fn next_slot() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// 2^53 − 1: the names, 1 through this.
    const NAMES: u64 = (1 << 53) - 1;
    static START: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        h.write_u64(nanos);
        h.finish() % NAMES
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) % NAMES;
    (start + n) % NAMES + 1
}
