//! What a request holds after it is admitted: in-flight slots ([`Permit`]) and a reserved
//! cost to settle ([`Reservation`]).
//!
//! Both are given back by value, not by a call the caller must remember: a [`Permit`] gives
//! its slots back when it is dropped, however the request ends (its response sent, the
//! client gone, a panic unwinding through the handler, a cancelled future). The layer keeps
//! the permit in the response body, so the slot is held until the body has been sent or
//! dropped.

use std::ops::Deref;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use smallvec::SmallVec;

use super::{Limiter, PolicySet};
use crate::decision::{DecidedBy, Decision};
use crate::error::{CheckError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::store::{BoxFuture, MemoryStore, Store, StoreExt};

/// The in-flight slots one admitted request holds, given back when this is dropped. Derefs to
/// the request's [`Decision`]. Made by [`Limiter::acquire`] (and kept by the layer in the
/// response body).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::{key::Key, Limiter, Policy};
///
/// let limiter = Limiter::builder().policy(Policy::in_flight("exports", 1)?).build()?;
/// let tenant = Key::new("tenant", "acme");
/// let first = limiter.acquire(&tenant).await?;
/// assert!(first.is_allowed());
/// assert!(!limiter.acquire(&tenant).await?.is_allowed()); // one at a time
/// drop(first);
/// assert!(limiter.acquire(&tenant).await?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Permit {
    decision: Decision,
    slots: Option<Slots>,
}

impl Permit {
    /// The request's decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Whether the permit holds slots (an allowed request under in-flight policies).
    pub fn holds_slots(&self) -> bool {
        self.slots.is_some()
    }
}

impl Deref for Permit {
    type Target = Decision;

    fn deref(&self) -> &Decision {
        &self.decision
    }
}

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

/// Runs a store call that nobody awaits (a release, a settlement): polled once at once —
/// the memory store is done then — and otherwise finished on the current Tokio runtime. With
/// no runtime (a response body dropped outside one), a Redis slot comes back when its lease
/// ends instead.
pub(crate) fn drive(what: &'static str, mut call: BoxFuture<Result<(), StoreError>>) {
    let mut cx = Context::from_waker(Waker::noop());
    match call.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(error)) => report(what, &error),
        Poll::Pending => match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = call.await {
                        report(what, &error);
                    }
                });
            }
            Err(_) => tracing::warn!(
                target: "tollgate::store",
                what,
                "no Tokio runtime to finish the store call; a held slot comes back when its lease ends"
            ),
        },
    }
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
        if policies.is_empty()
            || !decision.is_allowed()
            || decision.policies().is_empty()
            || decision.decided_by() == DecidedBy::FailOpen
        {
            return None;
        }
        let slot = decision.slot();
        let refresher = decision
            .slot_expires()
            .then(|| self.spawn_refresher(key, policies, slot))
            .flatten();
        let limiter = self.clone();
        let key = key.clone();
        let policies = Arc::clone(policies);
        Some(Slots {
            release: Some(Box::new(move || {
                drive("release", limiter.store().release(&key, &policies, slot));
            })),
            refresher,
        })
    }

    /// Refreshes a named slot's lease every third of the shortest lease while it is held.
    fn spawn_refresher(
        &self,
        key: &Key,
        policies: &Arc<[Policy]>,
        slot: u64,
    ) -> Option<tokio::task::AbortHandle> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let lease = policies.iter().map(Policy::window_millis).min()?;
        let every = Duration::from_millis((lease / 3).max(1));
        let limiter = self.clone();
        let key = key.clone();
        let policies = Arc::clone(policies);
        let task = runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(error) = limiter.store().refresh(&key, &policies, slot).await {
                    report("refresh", &error);
                }
            }
        });
        Some(task.abort_handle())
    }

    /// Decides `key` like [`check`](Self::check) with each policy's own cost, and holds the
    /// slots of the default route's [in-flight](crate::Algorithm::InFlight) policies until the
    /// returned [`Permit`] is dropped. A refused request holds nothing (the permit's decision
    /// says why). Use it for work outside HTTP (jobs, websocket messages) that must not run
    /// more than `n` at once per key.
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    pub async fn acquire(&self, key: &Key) -> Result<Permit, CheckError> {
        let Some(set) = self.default_set() else {
            return Ok(Permit {
                decision: Decision::pass(),
                slots: None,
            });
        };
        let decision = self
            .finish_direct(self.prepare_key(
                Arc::clone(&set),
                &self.lists(),
                key.clone(),
                None,
                None,
            ))
            .await?;
        let slots = self.hold_slots(&set, key, &decision);
        Ok(Permit { decision, slots })
    }

    /// Reserves `estimate` units for `key` on the default route and returns the
    /// [`Reservation`] to [`settle`](Reservation::settle) once the actual cost is known. The
    /// estimate goes to the route's [metered](crate::route::Route::metered) policies (every
    /// other policy takes its own cost), or, when it has none, to every rate policy. In-flight
    /// slots are held until the reservation is dropped or settled.
    ///
    /// At least one unit is reserved, whatever the estimate: a reservation is admitted only
    /// with room for it, so a spent budget refuses an estimate of 0 as it refuses any other
    /// (its settlement would otherwise be charged to a key with nothing left), and settling
    /// at 0 gives the unit back. See [`Op::Settle`](crate::store::Op::Settle) for the bound on what settlements
    /// above their estimates can serve.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("tokens", Rate::per_minute(10_000))?)
    ///     .build()?;
    /// let user = Key::new("user", "42");
    /// let reservation = limiter.reserve(&user, 4_000).await?; // max_tokens
    /// assert_eq!(reservation.decision().remaining(), 6_000);
    /// reservation.settle(1_500).await?;                       // what was generated
    /// assert_eq!(limiter.peek(&user).await?.remaining(), 8_499); // peek asks for one unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check): [`CheckError::CostExceedsCapacity`] when the estimate
    /// can never fit.
    pub async fn reserve(&self, key: &Key, estimate: u64) -> Result<Reservation<S>, CheckError> {
        let Some(set) = self.default_set() else {
            return Ok(Reservation::empty(self.clone(), key.clone()));
        };
        // At least one unit, so that a spent budget refuses (see `PolicySet::charged_costs`).
        let estimate = estimate.max(1);
        let (cost, estimates): (Option<u64>, SmallVec<[u64; 2]>) = if set.meters.is_empty() {
            (Some(estimate), SmallVec::new())
        } else {
            (None, set.meters.iter().map(|_| estimate).collect())
        };
        let reserved = set.charged_costs(cost, Some(&estimates));
        let decision = self
            .finish_direct(self.prepare_key(
                Arc::clone(&set),
                &self.lists(),
                key.clone(),
                cost,
                Some(&estimates),
            ))
            .await?;
        let slots = self.hold_slots(&set, key, &decision);
        Ok(Reservation {
            limiter: self.clone(),
            key: key.clone(),
            set: Some(set),
            reserved,
            decision,
            slots,
        })
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
    /// actual cost, `None` to leave its reservation standing.
    pub(crate) fn settle_call(
        &self,
        set: &PolicySet,
        key: &Key,
        reserved: &[u64],
        actual: impl Fn(&Policy) -> Option<u64>,
    ) -> Option<BoxFuture<Result<(), StoreError>>> {
        let (policies, charged) = self.settled_policies(set, reserved);
        let mut ps: SmallVec<[Policy; 2]> = SmallVec::new();
        let mut rs: SmallVec<[u64; 2]> = SmallVec::new();
        let mut acts: SmallVec<[u64; 2]> = SmallVec::new();
        for (p, r) in policies.into_iter().zip(charged) {
            if let Some(a) = actual(&p) {
                if a != r {
                    ps.push(p);
                    rs.push(r);
                    acts.push(a);
                }
            }
        }
        if ps.is_empty() {
            return None;
        }
        Some(self.store().settle(key, &ps, &rs, &acts))
    }
}

/// A cost reserved by [`Limiter::reserve`], to settle once the actual cost is known. Dropping
/// it unsettled leaves the reservation standing (the estimate stays charged) and gives back
/// any in-flight slots.
pub struct Reservation<S = MemoryStore> {
    limiter: Limiter<S>,
    key: Key,
    /// `None` when nothing was charged (an exempt default route).
    set: Option<Arc<PolicySet>>,
    /// The units charged to each enforced policy of the set.
    reserved: SmallVec<[u64; 2]>,
    decision: Decision,
    slots: Option<Slots>,
}

impl<S> std::fmt::Debug for Reservation<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("key", &self.key)
            .field("reserved", &self.reserved)
            .field("decision", &self.decision)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Reservation<S> {
    fn empty(limiter: Limiter<S>, key: Key) -> Self {
        Self {
            limiter,
            key,
            set: None,
            reserved: SmallVec::new(),
            decision: Decision::pass(),
            slots: None,
        }
    }

    /// The decision the reservation got.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Settles at `actual` units: the difference from the estimate is refunded, or the extra
    /// charged whether or not it fits (see [`Op::Settle`](crate::store::Op::Settle) for the bound). A refused
    /// reservation charged nothing, so settling it does nothing. In-flight slots are given
    /// back afterwards.
    ///
    /// Cancel-safe: a settlement whose future is dropped before it answers still applies,
    /// once (its store call is finished on the current Tokio runtime), and the slots are
    /// given back either way.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails (the reservation then stands).
    pub async fn settle(mut self, actual: u64) -> Result<(), CheckError> {
        let slots = self.slots.take();
        if let (Some(set), true) = (self.set.take(), self.decision.is_allowed()) {
            if !self.decision.policies().is_empty() {
                if let Some(call) =
                    self.limiter
                        .settle_call(&set, &self.key, &self.reserved, |_| Some(actual))
                {
                    Completing::new("settle", call).await?;
                }
            }
        }
        drop(slots);
        Ok(())
    }
}
