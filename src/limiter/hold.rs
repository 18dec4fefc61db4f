//! What a request holds after it is admitted, and how it is given back: in-flight [`Slots`],
//! the settlement of a reserved cost, the refund of a request its route's counting rule does
//! not count ([`Counting`]), and store calls that finish even when nobody awaits them.
//!
//! Both are given back by value, not by a call the caller must remember: [`Slots`] are given
//! back when dropped, however the request ends (its response sent, the client gone, a panic
//! unwinding through the handler, a cancelled future). The layer keeps them in the response
//! body, so a slot is held until the body has been sent or dropped; the direct API keeps them
//! in a [`Permit`](super::Permit) or [`Reservation`](super::Reservation).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use smallvec::SmallVec;

use super::reload::InForce;
use super::{Limiter, PolicySet, Reserved, ReservedUnits};
use crate::decision::{DecidedBy, Decision};
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::route::{Actual, CountWhen};
use crate::store::{BoxFuture, Op, Store, StoreExt};

/// Held slots: gives them back on drop, and stops refreshing their lease.
pub(crate) struct Slots {
    release: Option<Box<dyn FnOnce() + Send + Sync>>,
    refresher: Option<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("refreshed", &self.refresher.is_some())
            .finish()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
        }
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// What a request admitted by the layer keeps until its response ends: its in-flight slots,
/// and how to settle its metered policies. The middleware settles from the response and
/// keeps the rest in the response body.
pub(crate) struct Held {
    pub(crate) slots: Option<Slots>,
    pub(crate) settlement: Option<Settlement>,
    pub(crate) counting: Option<Counting>,
}

/// How a request of a route with a counting rule is kept or refunded once its response head
/// is known. Dropped without [`Counting::refund`] (no head came), the charge stands.
pub(crate) struct Counting {
    pub(crate) when: CountWhen,
    /// The units refunded to each enforced policy (its index in the set).
    pub(crate) charged: SmallVec<[(usize, u64); 2]>,
    /// The response head's headers and extensions, kept for a rule over the whole head
    /// ([`CountWhen::from_fn`]) while a gRPC call's status is awaited in its trailers.
    pub(crate) head: Option<Box<(http::HeaderMap, http::Extensions)>>,
    refund: Box<dyn FnOnce() + Send + Sync>,
}

impl Counting {
    /// Gives the charge back: the request does not count.
    pub(crate) fn refund(self) {
        (self.refund)();
    }
}

/// Settles the policies at these indexes (in the set) with these actual costs.
pub(crate) type SettleFn = dyn Fn(&[(usize, u64)]) + Send + Sync;

/// How to settle one request's metered policies.
pub(crate) struct Settlement {
    /// Per metered policy: where its actual cost comes from.
    pub(crate) meters: SmallVec<[Metered; 1]>,
    pub(crate) settle: Arc<SettleFn>,
}

/// One metered policy of a request: its index in the set, name, reserved units and where
/// its actual cost comes from.
pub(crate) struct Metered {
    pub(crate) index: usize,
    pub(crate) name: Arc<str>,
    pub(crate) reserved: u64,
    pub(crate) actual: Actual,
}

/// Runs a store call that nobody awaits (a release, a settlement): polled once at once —
/// the memory store is done then — and otherwise finished on the current Tokio runtime.
/// Outside any runtime (a permit or body dropped by code on a plain thread) see
/// [`finish_outside_a_runtime`].
pub(crate) fn drive(what: &'static str, mut call: BoxFuture<Result<(), StoreError>>) {
    // Polled only in a runtime's context: a store's timeout or a Redis connection's timer
    // panics without one.
    let runtime = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime,
        Err(e) if e.is_thread_local_destroyed() => {
            // A thread that is ending: no runtime can be entered here. The memory store's
            // calls were made when they were created; a Redis slot comes back with its lease.
            tracing::warn!(
                target: "tollgate::store",
                what,
                "a store call dropped while its thread ends; a held Redis slot comes back when its lease ends"
            );
            return;
        }
        Err(_) => {
            finish_outside_a_runtime(what, call);
            return;
        }
    };
    if done_at_once(what, &mut call) {
        return;
    }
    runtime.spawn(async move {
        if let Err(error) = call.await {
            report(what, &error);
        }
    });
}

/// The longest a thread with no runtime waits for a store call it drops a hold on.
const OUTSIDE_A_RUNTIME_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A runtime for store calls dropped on threads with none: a current-thread runtime driven
/// by a thread of its own, made the first time one is (`None` when it cannot be: the calls
/// are then left, see [`finish_outside_a_runtime`]).
fn outside_runtime() -> Option<&'static tokio::runtime::Handle> {
    static RUNTIME: std::sync::OnceLock<Option<tokio::runtime::Handle>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let made = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
                .and_then(|runtime| {
                    let handle = runtime.handle().clone();
                    std::thread::Builder::new()
                        .name("tollgate-outside-runtime".into())
                        .spawn(move || runtime.block_on(std::future::pending::<()>()))
                        .map(|_| handle)
                        .map_err(|e| e.to_string())
                });
            made.map_err(|error| {
                tracing::warn!(
                    target: "tollgate::store",
                    %error,
                    "no Tokio runtime for store calls dropped outside one"
                );
            })
            .ok()
        })
        .as_ref()
}

/// Finishes `call` on a thread that has no Tokio runtime: polled once in the context of a
/// runtime kept for this (the memory store is done then), else waited for there, at most
/// [`OUTSIDE_A_RUNTIME_WAIT`]. A Redis connection's own tasks run on the runtime that made
/// it, and answer while that one runs; when it does not (it has shut down), the call fails
/// and a Redis slot comes back when its lease ends. With no runtime to be had, the call is
/// dropped: the memory store's calls were made when they were created.
fn finish_outside_a_runtime(what: &'static str, mut call: BoxFuture<Result<(), StoreError>>) {
    let Some(runtime) = outside_runtime() else {
        return;
    };
    {
        let _context = runtime.enter();
        if done_at_once(what, &mut call) {
            return;
        }
    }
    // The timer is made inside the runtime: it needs one to be made.
    match runtime.block_on(async { tokio::time::timeout(OUTSIDE_A_RUNTIME_WAIT, call).await }) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => report(what, &error),
        Err(_) => report(what, &StoreError::Timeout),
    }
}

/// Polls `call` once, at once: whether it is done (the memory store always is), a failure
/// reported.
fn done_at_once(what: &'static str, call: &mut BoxFuture<Result<(), StoreError>>) -> bool {
    match call.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(outcome) => {
            if let Err(error) = outcome {
                report(what, &error);
            }
            true
        }
        Poll::Pending => false,
    }
}

/// The units charged to each rate policy of `set` (its index there), of `reserved`, the
/// units charged to each enforced policy: in-flight slots are not units.
fn charged_units(set: &PolicySet, reserved: &[u64]) -> SmallVec<[(usize, u64); 2]> {
    set.enforced
        .iter()
        .zip(reserved)
        .enumerate()
        .filter(|(_, (p, &c))| !p.is_in_flight() && c > 0)
        .map(|(i, (_, &c))| (i, c))
        .collect()
}

/// A store call awaited by a caller who may give up: dropped unfinished, it is finished
/// anyway (see [`drive`]), so a settlement or a refund whose caller was cancelled still
/// applies, once, rather than depending on whether its command had left.
pub(crate) struct Completing {
    what: &'static str,
    call: Option<BoxFuture<Result<(), StoreError>>>,
}

impl Completing {
    pub(crate) fn new(what: &'static str, call: BoxFuture<Result<(), StoreError>>) -> Self {
        Self {
            what,
            call: Some(call),
        }
    }

    /// `call`, polled once at once: `None` when it is done then (the memory store always
    /// is; a failure is reported), otherwise what is left to await.
    fn started(what: &'static str, mut call: BoxFuture<Result<(), StoreError>>) -> Option<Self> {
        (!done_at_once(what, &mut call)).then(|| Self::new(what, call))
    }

    /// Awaits the call, reporting a failure: for a caller whose answer does not depend on
    /// it (a decision already made).
    pub(crate) async fn reported(self) {
        let what = self.what;
        if let Err(error) = self.await {
            report(what, &error);
        }
    }
}

impl std::future::Future for Completing {
    type Output = Result<(), StoreError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let outcome = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(outcome)
    }
}

impl Drop for Completing {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            drive(self.what, call);
        }
    }
}

/// Whether a decision under set `set` took slots: an allowed one whose set has in-flight
/// policies and whose store (or local fallback) took them. A failure mode that let the
/// request through without a store took none.
fn took_slots(set: &PolicySet, decision: &Decision) -> bool {
    !set.in_flight.is_empty()
        && decision.is_allowed()
        && !decision.policies().is_empty()
        && decision.decided_by() != DecidedBy::FailOpen
}

fn report(what: &'static str, error: &StoreError) {
    tracing::warn!(target: "tollgate::store", what, %error, "a store call after the response failed");
}

impl<S: Store> Limiter<S> {
    /// The slots a request admitted under set `set` holds, if any: an allowed decision whose
    /// set has in-flight policies and whose store (or local fallback) took them. A failure
    /// mode that let the request through without a store took none.
    pub(crate) fn hold_slots(
        &self,
        set: &PolicySet,
        key: &Key,
        decision: &Decision,
    ) -> Option<Slots> {
        let policies = &set.in_flight;
        if !took_slots(set, decision) {
            return None;
        }
        let slot = decision.slot();
        let refresher = decision
            .slot_expires()
            .then(|| self.spawn_refresher(key, policies, slot))
            .flatten();
        // A slot the local fallback gave is its to take back: the store never held it.
        let fallback = decision.decided_by() == DecidedBy::Fallback;
        let limiter = self.clone();
        let key = key.clone();
        let policies = Arc::clone(policies);
        Some(Slots {
            release: Some(Box::new(move || {
                let release = Op::Release { slot };
                drive(
                    "release",
                    limiter.give_back(&key, &policies, release, fallback),
                );
            })),
            refresher,
        })
    }

    /// Gives back the slots a decision that keeps nothing ([`check`](Self::check),
    /// [`decide`](Self::decide), the login guard) took: `None` when it took none or the
    /// store has them back already (the memory store at once), otherwise the release, for
    /// the caller to await before it answers. So a caller's next check finds the slot free
    /// on every store: a release left to run on its own can reach Redis after that check.
    /// Dropped unawaited, the release still finishes ([`Completing`]).
    pub(crate) fn give_back_at_once(
        &self,
        set: &PolicySet,
        key: &Key,
        decision: &Decision,
    ) -> Option<Completing> {
        if !took_slots(set, decision) {
            return None;
        }
        let fallback = decision.decided_by() == DecidedBy::Fallback;
        let release = Op::Release {
            slot: decision.slot(),
        };
        let call = self.give_back(key, &set.in_flight, release, fallback);
        Completing::started("release", call)
    }

    /// What a request of set `set` admitted by the layer keeps until its response ends, if
    /// anything: its slots, and the settlement of the units it `reserved` for its metered
    /// policies.
    pub(crate) fn held(
        &self,
        set: &Arc<PolicySet>,
        key: &Key,
        decision: &Decision,
        reserved: Reserved,
    ) -> Option<Held> {
        if !decision.is_allowed() || decision.policies().is_empty() {
            return None;
        }
        let counting = self.counting(set, key, decision, reserved.as_deref());
        let slots = self.hold_slots(set, key, decision);
        let settlement = reserved.filter(|_| !set.meters.is_empty()).map(|reserved| {
            let ReservedUnits {
                units: reserved,
                resets,
            } = *reserved;
            let resets = self.charge_of(decision, resets);
            let policies = &set.enforced;
            let meters = set
                .meters
                .iter()
                .map(|(i, meter)| Metered {
                    index: *i,
                    name: Arc::clone(policies[*i].shared_name()),
                    reserved: reserved.get(*i).copied().unwrap_or(0),
                    actual: meter.actual.clone(),
                })
                .collect();
            let limiter = self.clone();
            let set = Arc::clone(set);
            let key = key.clone();
            let settle: Arc<SettleFn> = Arc::new(move |actual: &[(usize, u64)]| {
                let policies = &set.enforced;
                let lookup = |p: &Policy| {
                    let i = policies.iter().position(|q| q.name() == p.name())?;
                    actual.iter().find(|(j, _)| *j == i).map(|(_, a)| *a)
                };
                if let Some(call) = limiter.settle_call(&set, &key, &reserved, resets, lookup) {
                    drive("settle", call);
                }
            });
            Settlement { meters, settle }
        });
        if slots.is_none() && settlement.is_none() && counting.is_none() {
            return None;
        }
        Some(Held {
            slots,
            settlement,
            counting,
        })
    }

    /// How an admitted request of a set with a counting rule is refunded, if it was charged
    /// (a failure mode that let it through without a store charged nothing).
    fn counting(
        &self,
        set: &Arc<PolicySet>,
        key: &Key,
        decision: &Decision,
        reserved: Option<&ReservedUnits>,
    ) -> Option<Counting> {
        let when = set.count.clone()?;
        if decision.decided_by() == DecidedBy::FailOpen {
            return None;
        }
        let ReservedUnits {
            units: reserved,
            resets,
        } = reserved?.clone();
        let resets = self.charge_of(decision, resets);
        let charged = charged_units(set, &reserved);
        if charged.is_empty() {
            return None;
        }
        let limiter = self.clone();
        let set = Arc::clone(set);
        let key = key.clone();
        Some(Counting {
            when,
            charged,
            head: None,
            refund: Box::new(move || {
                if let Some(call) = limiter.refund_call(&set, &key, &reserved, resets) {
                    drive("refund", call);
                }
            }),
        })
    }

    /// Who took the charge behind `decision`, with the reset moment read before it
    /// ([`Limiter::resets_seen`]).
    pub(crate) fn charge_of(&self, decision: &Decision, resets: u64) -> Charge {
        match decision.decided_by() {
            DecidedBy::Decided => Charge::Store(resets),
            DecidedBy::Fallback => Charge::Fallback(resets),
            _ => Charge::Nowhere,
        }
    }

    /// Whether a give-back of `charge` to `key` may return units: who took it, and no reset
    /// of the key since.
    fn gives_back(&self, key: &Key, charge: Charge) -> Option<bool> {
        match charge {
            Charge::Store(seen) => self.untouched_since(key, seen).then_some(false),
            Charge::Fallback(seen) => self.untouched_since(key, seen).then_some(true),
            Charge::Nowhere => None,
        }
    }

    /// The call that refunds what an admitted request of `set` charged its rate policies,
    /// `reserved` (per enforced policy), if it charged any, something took the charge, and
    /// no reset of the key has begun or ended since it was made (see [`Charge`]).
    pub(crate) fn refund_call(
        &self,
        set: &PolicySet,
        key: &Key,
        reserved: &[u64],
        charge: Charge,
    ) -> Option<BoxFuture<Result<(), StoreError>>> {
        let charged = charged_units(set, reserved);
        let fallback = self.gives_back(key, charge)?;
        if charged.is_empty() {
            return None;
        }
        let (policies, costs): (SmallVec<[Policy; 2]>, SmallVec<[u64; 2]>) = charged
            .iter()
            .map(|&(i, c)| (set.enforced[i].clone(), c))
            .unzip();
        let (policies, costs): (SmallVec<[Policy; 2]>, SmallVec<[u64; 2]>) =
            match self.in_force(set, &policies) {
                None => (policies, costs),
                // Counted under a definition a reload replaced: left as counted.
                Some(states) => policies
                    .into_iter()
                    .zip(costs)
                    .zip(states)
                    .filter(|(_, state)| matches!(state, InForce::Same))
                    .map(|(kept, _)| kept)
                    .unzip(),
            };
        if policies.is_empty() {
            return None;
        }
        Some(self.give_back(key, &policies, Op::refund(&costs[..]), fallback))
    }

    /// `op`, a give-back; for a charge the local fallback took, as [`Op::Fallback`].
    pub(crate) fn give_back(
        &self,
        key: &Key,
        policies: &[Policy],
        op: Op,
        fallback: bool,
    ) -> BoxFuture<Result<(), StoreError>> {
        let op = if fallback {
            Op::Fallback { op: Box::new(op) }
        } else {
            op
        };
        let call = self.store().apply(key, policies, op);
        Box::pin(async move { call.await.map(|_| ()) })
    }

    /// Refreshes a named slot's lease every third of the shortest lease while it is held.
    /// Each refresh takes the leases in force: after a reload that changed a policy's lease,
    /// the slot is refreshed with the new one, and as often as it needs.
    fn spawn_refresher(
        &self,
        key: &Key,
        policies: &Arc<[Policy]>,
        slot: u64,
    ) -> Option<tokio::task::AbortHandle> {
        fn period(policies: &[Policy]) -> Option<Duration> {
            let lease = policies.iter().map(Policy::window_millis).min()?;
            Some(Duration::from_millis((lease / 3).max(1)))
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut every = period(policies)?;
        let limiter = self.clone();
        let key = key.clone();
        let mut policies: SmallVec<[Policy; 2]> = policies.iter().cloned().collect();
        let task = runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                limiter.leases_in_force(&mut policies);
                every = period(&policies).unwrap_or(every);
                if let Err(error) = limiter.store().refresh(&key, &policies, slot).await {
                    report("refresh", &error);
                }
            }
        });
        Some(task.abort_handle())
    }

    /// Each of `policies` as the plan in force has it, when it still has an in-flight policy
    /// of that name (a reload may have changed its lease); the others as they were.
    fn leases_in_force(&self, policies: &mut [Policy]) {
        let plan = self.plan();
        let attached = self.inner.common.attached_sets();
        for policy in policies.iter_mut() {
            let current = plan
                .sets
                .iter()
                .chain(&attached)
                .flat_map(|set| set.in_flight.iter())
                .find(|p| p.name() == policy.name());
            if let Some(current) = current {
                if current.window_millis() != policy.window_millis() {
                    *policy = current.clone();
                }
            }
        }
    }

    /// The policies a reservation under `set` settles, with the units each was charged:
    /// the metered ones, or every rate policy when the set has none.
    pub(crate) fn settled_policies(
        &self,
        set: &PolicySet,
        reserved: &[u64],
    ) -> (SmallVec<[Policy; 2]>, SmallVec<[u64; 2]>) {
        let mut policies = SmallVec::new();
        let mut costs = SmallVec::new();
        for (i, p) in set.enforced.iter().enumerate() {
            let settled = if set.meters.is_empty() {
                !p.is_in_flight()
            } else {
                set.meters.iter().any(|(m, _)| *m == i)
            };
            if settled {
                policies.push(p.clone());
                costs.push(reserved.get(i).copied().unwrap_or(0));
            }
        }
        (policies, costs)
    }

    /// Settles a reservation made under `set`: `actual(policy)` is each settled policy's
    /// actual cost, `None` to leave its reservation standing. When a reset of the key has
    /// begun or ended since the charge, or nothing took it (a failure mode let the request
    /// through: see [`Charge`]), nothing is given back (a give-back would come off units
    /// charged since, or that nothing took); a cost above the reservation is still
    /// charged. A charge the local fallback took is settled there ([`Op::Fallback`]).
    pub(crate) fn settle_call(
        &self,
        set: &PolicySet,
        key: &Key,
        reserved: &[u64],
        charge: Charge,
        actual: impl Fn(&Policy) -> Option<u64>,
    ) -> Option<BoxFuture<Result<(), StoreError>>> {
        let gives_back = self.gives_back(key, charge);
        let reset_since = gives_back.is_none();
        let (policies, charged) = self.settled_policies(set, reserved);
        let mut ps: SmallVec<[Policy; 2]> = SmallVec::new();
        let mut rs: SmallVec<[u64; 2]> = SmallVec::new();
        let mut acts: SmallVec<[u64; 2]> = SmallVec::new();
        for (p, r) in policies.into_iter().zip(charged) {
            if let Some(a) = actual(&p) {
                let a = if reset_since { a.max(r) } else { a };
                if a != r {
                    ps.push(p);
                    rs.push(r);
                    acts.push(a);
                }
            }
        }
        if let Some(states) = self.in_force(set, &ps) {
            // A policy a reload changed: what was reserved stays counted, and a cost above
            // the reservation is charged under the policy in force; one it removed, nothing.
            let (mut ps2, mut rs2, mut acts2) = (SmallVec::new(), SmallVec::new(), SmallVec::new());
            for (((p, r), a), state) in ps.into_iter().zip(rs).zip(acts).zip(states) {
                match state {
                    InForce::Same => (ps2.push(p), rs2.push(r), acts2.push(a)),
                    InForce::Changed(now) if a > r => {
                        (ps2.push(now), rs2.push(0), acts2.push(a - r))
                    }
                    InForce::Changed(_) | InForce::Gone => continue,
                };
            }
            (ps, rs, acts) = (ps2, rs2, acts2);
        }
        if ps.is_empty() {
            return None;
        }
        let op = Op::settle(&rs[..], &acts[..]);
        Some(self.give_back(key, &ps, op, gives_back == Some(true)))
    }
}

/// Who took a request's charge, and the limiter's reset moment read before it: what its
/// give-back (a refund, a settlement below the reservation) may return, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charge {
    /// The store.
    Store(u64),
    /// A `ResilientStore`'s local fallback, the store being down: given back there alone.
    Fallback(u64),
    /// Nothing (a failure mode let the request through): nothing to give back.
    Nowhere,
}
