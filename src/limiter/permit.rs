//! [`Permit`] and [`Reservation`]: what the direct API's [`Limiter::acquire`] and
//! [`Limiter::reserve`] hand back, holding in-flight slots and a reserved cost to settle.
//!
//! Both are given back by value, not by a call the caller must remember: a [`Permit`] gives
//! its slots back when it is dropped, however the request ends (its response sent, the
//! client gone, a panic unwinding through the handler, a cancelled future).

use std::ops::Deref;
use std::sync::Arc;

use smallvec::SmallVec;

use super::decide::Screen;
use super::finish::Asker;
use super::hold::{Charge, Completing, Slots};
use super::{Limiter, PolicySet, PreparedKey};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::key::Key;
use crate::store::{MemoryStore, Store};

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

impl<S: Store> Limiter<S> {
    /// Decides `key` like [`check`](Self::check) with each policy's own cost (or the default
    /// route's [`cost`](crate::LimiterBuilder::cost), when it sets a fixed one), and holds the
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
        let (decision, slots) = self.acquired(&set, key, set.fixed_cost(), None).await?;
        Ok(Permit { decision, slots })
    }

    /// Reserves `estimate` units for `key` on the default route and returns the
    /// [`Reservation`] to [`settle`](Reservation::settle) once the actual cost is known. The
    /// estimate goes to the route's [metered](crate::route::Route::metered) policies (every
    /// other policy takes the route's fixed [`cost`](crate::route::Route::cost), or its own),
    /// or, when it has none, to every rate policy. In-flight
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
        // The other policies of a metered route take the route's fixed cost, as the layer
        // charges them.
        let (cost, estimates): (Option<u64>, SmallVec<[u64; 2]>) = if set.meters.is_empty() {
            (Some(estimate), SmallVec::new())
        } else {
            (
                set.fixed_cost(),
                set.meters.iter().map(|_| estimate).collect(),
            )
        };
        let reserved = set.charged_costs(cost, Some(&estimates));
        // Read before the charge: see `Reservation::settle`.
        let resets = self.resets_seen();
        let (decision, slots) = self.acquired(&set, key, cost, Some(&estimates)).await?;
        let resets = self.charge_of(&decision, resets);
        Ok(Reservation {
            limiter: self.clone(),
            key: key.clone(),
            set: Some(set),
            reserved,
            resets,
            decision,
            slots,
        })
    }

    /// The decision of [`acquire`](Self::acquire) or [`reserve`](Self::reserve), charging
    /// `cost` or the `estimates` of the metered policies, with the slots it holds.
    async fn acquired(
        &self,
        set: &Arc<PolicySet>,
        key: &Key,
        cost: Option<u64>,
        estimates: Option<&[u64]>,
    ) -> Result<(Decision, Option<Slots>), CheckError> {
        let mut given = SmallVec::new();
        let lists = self.lists();
        let costs =
            match self.prepare_key(set, Screen::keys(&lists), key, cost, estimates, &mut given) {
                PreparedKey::Pass => return Ok((Decision::pass(), None)),
                PreparedKey::Refuse(refusal) => return Err(CheckError::from_refusal(&refusal)),
                PreparedKey::Ask(costs) => costs,
            };
        let outcome = match self.answer_now(set, key, costs) {
            Some(outcome) => outcome,
            None => self.answer_later(set, key, costs).await,
        };
        self.finish(Asker::Acquire, set, key, outcome, None)
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
    /// [`Limiter::resets_seen`] before the charge; `None` when the store did not take it
    /// (a failure mode admitted the request): nothing to give back.
    resets: Charge,
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
            resets: Charge::Nowhere,
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
    /// After a [`reset`](Limiter::reset) of the key through this limiter that began after
    /// the reservation was made, nothing is refunded: the reset erased the estimate, or may
    /// have, and a refund would come off units charged since; an actual cost above the
    /// estimate still charges the difference. (Only resets of this key count. The limiter remembers the last 4 096
    /// resets; a reservation older than all of them gives nothing back either, the safe
    /// way.) A reset made
    /// through another instance is not seen: there a settlement below its estimate can give
    /// back up to the estimate out of the fresh count.
    ///
    /// Nor is anything refunded to the store for a reservation a failure mode admitted while
    /// the store was down ([`Decision::decided_by`] other than `Decided`): the store never
    /// charged it, and the refund would come off other requests' units once it is back. A
    /// reservation the local fallback admitted is settled in the fallback alone, which
    /// charged it; an actual cost above the estimate is charged.
    ///
    /// Cancel-safe: a settlement whose future is dropped before it answers still applies,
    /// once (its store call is finished on the current Tokio runtime), and the slots are
    /// given back either way.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails. The settlement may still be made: one a
    /// [`ResilientStore`](crate::store::ResilientStore)'s timeout cut short is finished in
    /// the background, as a call already sent may be by Redis. Do not make it again.
    pub fn settle(
        mut self,
        actual: u64,
    ) -> impl std::future::Future<Output = Result<(), CheckError>> + Send + 'static {
        // The store call starts here, not at the first poll: a future dropped unpolled
        // still settles.
        let slots = self.slots.take();
        let mut call = None;
        if let (Some(set), true) = (self.set.take(), self.decision.is_allowed()) {
            if !self.decision.policies().is_empty() {
                call = self
                    .limiter
                    .settle_call(&set, &self.key, &self.reserved, self.resets, |_| {
                        Some(actual)
                    })
                    .map(|call| Completing::new("settle", call));
            }
        }
        finished(call, slots)
    }

    /// Keeps the charge: the request counts. The same as dropping the reservation; it says
    /// so where the code decides. In-flight slots are given back.
    pub fn keep(self) {}

    /// Refunds the whole charge ([`Op::Refund`](crate::store::Op::Refund)): the request does
    /// not count. A refused reservation charged nothing, so refunding it does nothing; nor
    /// does a refund after a reset, as for [`settle`](Self::settle). In-flight slots are
    /// given back afterwards.
    ///
    /// This is how the direct API counts only failures (or successes) without a race:
    /// reserve before the work, so that concurrent work never exceeds the limit, then keep
    /// or refund.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, Limiter, Policy, Rate};
    ///
    /// // Three failed imports an hour; successful ones are free.
    /// let limiter = Limiter::builder().policy(Policy::new("imports", Rate::per_hour(3))?).build()?;
    /// let tenant = Key::new("tenant", "acme");
    /// for attempt in 0..10 {
    ///     let reservation = limiter.reserve(&tenant, 1).await?;
    ///     assert!(reservation.decision().is_allowed());
    ///     let failed = attempt % 5 == 4;
    ///     if failed { reservation.keep() } else { reservation.refund().await? }
    /// }
    /// assert_eq!(limiter.peek(&tenant).await?.remaining(), 0); // two failures, one left
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// Cancel-safe as [`settle`](Self::settle) is.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails. The refund may still be made: one a
    /// [`ResilientStore`](crate::store::ResilientStore)'s timeout cut short is finished in
    /// the background, as a call already sent may be by Redis. Do not make it again.
    pub fn refund(
        mut self,
    ) -> impl std::future::Future<Output = Result<(), CheckError>> + Send + 'static {
        let slots = self.slots.take();
        let mut call = None;
        if let (Some(set), true) = (self.set.take(), self.decision.is_allowed()) {
            if !self.decision.policies().is_empty() {
                call = self
                    .limiter
                    .refund_call(&set, &self.key, &self.reserved, self.resets)
                    .map(|call| Completing::new("refund", call));
            }
        }
        finished(call, slots)
    }

    /// Keeps or refunds the charge as the default route's counting rule
    /// ([`Route::count_when`](crate::route::Route::count_when)) says of the response head
    /// `head`; keeps it when the route has none. The direct API's twin of the layer.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::route::{CountWhen, Route};
    /// use tollgate::{key::Key, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .default_route(Route::new()
    ///         .policy(Policy::new("calls", Rate::per_minute(2))?)
    ///         .count_when(CountWhen::successes()))
    ///     .build()?;
    /// let key = Key::new("user", "7");
    /// let (failed, ()) = http::Response::builder().status(502).body(())?.into_parts();
    /// limiter.reserve(&key, 1).await?.count(&failed).await?; // refunded
    /// assert_eq!(limiter.peek(&key).await?.remaining(), 1); // peek asks for one unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`refund`](Self::refund).
    pub fn count(
        self,
        head: &http::response::Parts,
    ) -> impl std::future::Future<Output = Result<(), CheckError>> + Send + 'static {
        let counts = self
            .set
            .as_ref()
            .and_then(|set| set.count.as_ref())
            .is_none_or(|when| when.counts(head));
        self.counted(counts)
    }

    /// Keeps or refunds the charge as the default route's counting rule says of a gRPC call
    /// that ended with status `code` ([`CountWhen::counts_grpc`](crate::route::CountWhen::counts_grpc):
    /// `0` is `OK`); keeps it when the route has none. For a call whose status comes in the
    /// trailers; [`count`](Self::count) reads a trailers-only head's.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::route::{CountWhen, Route};
    /// use tollgate::{key::Key, Limiter, Policy, Rate};
    ///
    /// // Two failed sign-ins a minute, whatever the number of successful ones.
    /// let limiter = Limiter::builder()
    ///     .default_route(Route::new()
    ///         .policy(Policy::new("sign-ins", Rate::per_minute(2))?)
    ///         .count_when(CountWhen::failures()))
    ///     .build()?;
    /// let key = Key::new("user", "7");
    /// limiter.reserve(&key, 1).await?.count_grpc(0).await?; // OK: refunded
    /// limiter.reserve(&key, 1).await?.count_grpc(16).await?; // UNAUTHENTICATED: counts
    /// assert_eq!(limiter.peek(&key).await?.remaining(), 0); // peek asks for one unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`refund`](Self::refund).
    pub fn count_grpc(
        self,
        code: i32,
    ) -> impl std::future::Future<Output = Result<(), CheckError>> + Send + 'static {
        let counts = self
            .set
            .as_ref()
            .and_then(|set| set.count.as_ref())
            .is_none_or(|when| when.counts_grpc(code));
        self.counted(counts)
    }

    /// Keeps the charge when the request `counts`, else refunds it.
    fn counted(
        self,
        counts: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), CheckError>> + Send>> {
        if counts {
            self.keep();
            return finished(None, None);
        }
        Box::pin(self.refund())
    }
}

/// The future of a settlement or refund whose store call (if any) has started: it answers
/// the call's outcome, then gives the slots back. Dropped first, the call still finishes
/// ([`Completing`]) and the slots come back at once.
fn finished(
    call: Option<Completing>,
    slots: Option<Slots>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), CheckError>> + Send>> {
    Box::pin(async move {
        if let Some(call) = call {
            call.await?;
        }
        drop(slots);
        Ok(())
    })
}
