//! The end of the one decision path: what the store's answer becomes, for every way in.
//!
//! [`Limiter::finish`] takes the store's answer about a request or key and records it
//! (metrics, the trace event, the span), turns a denial, a store failure or a failure mode
//! refusing into the [`Refusal`] (counting a rate-limited key among the top refused), and
//! keeps what an admitted request holds: in-flight slots and a settlement for the layer, the
//! slots of a [`Permit`](super::Permit) or [`Reservation`](super::Reservation), nothing for
//! [`check`](Limiter::check) and [`decide`](Limiter::decide), whose slots their callers
//! give back at once and wait for ([`Limiter::give_back_at_once`]).
//! The layer, the direct API, the login guard (through `check`) and gRPC calls (through the
//! layer) all finish here.

use std::sync::Arc;

use super::hold::{Held, Slots};
use super::{Limiter, PolicySet, Reserved};
use crate::decision::{DecidedBy, Decision};
use crate::error::{CheckError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::refusal::{Refusal, RefusalKind};
use crate::store::Store;
use crate::telemetry;

/// Who a decision is finished for: what an admitted request keeps, what is recorded, which
/// refusals are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asker {
    /// The layer: the request keeps its in-flight slots and the settlement of its metered
    /// policies until its response ends. The key goes on the trace event and the span; every
    /// refusal is logged.
    Layer,
    /// [`Limiter::decide`]: as the layer, but keeping nothing: a slot an in-flight policy
    /// took to admit the request goes back at once.
    Decide,
    /// [`Limiter::check`], and so the login guard: keeps nothing (as `decide`). A denial is
    /// an answer rather than an error, so only a cost above a capacity is logged, and
    /// neither a trace event nor a span field is recorded.
    Check,
    /// The login guard's check of one of its three limits: as `check`, but nothing is
    /// recorded: the guard records the attempt's one decision, under its own name as the
    /// route (`LoginGuard::check`).
    Guard,
    /// [`Limiter::acquire`] and [`Limiter::reserve`]: as `check`, but the request keeps its
    /// in-flight slots, in the permit or reservation.
    Acquire,
}

impl Asker {
    /// Whether this is a request's decision (the layer's or `decide`'s), recorded with its
    /// key and every refusal logged.
    #[inline(always)]
    const fn is_request(self) -> bool {
        matches!(self, Asker::Layer | Asker::Decide)
    }
}

/// A request the layer or [`Limiter::decide`] admitted: its decision, and what it keeps
/// until its response ends (nothing for `decide`).
pub(crate) struct Admitted {
    pub(crate) decision: Decision,
    pub(crate) held: Option<Box<Held>>,
}

/// What [`Limiter::finish`] hands back: each way in asks for its own terms, built in place
/// (the decision is moved once, as the store answered it).
pub(crate) trait Finished: Sized {
    /// An admitted request: its decision and what it keeps, `held`, asked for only by the
    /// terms that keep something.
    fn admitted(decision: Decision, held: impl FnOnce(&Decision) -> Option<Held>) -> Self;
    /// A request the store's answer refuses.
    fn refused(refusal: Refusal) -> Self;
}

/// The layer's and `decide`'s terms: going ahead, or the [`Refusal`].
impl Finished for Result<Admitted, Refusal> {
    #[inline(always)]
    fn admitted(decision: Decision, held: impl FnOnce(&Decision) -> Option<Held>) -> Self {
        Ok(Admitted {
            held: held(&decision).map(Box::new),
            decision,
        })
    }

    #[inline(always)]
    fn refused(refusal: Refusal) -> Self {
        Err(refusal)
    }
}

/// The direct API's terms, with the slots the request holds (`acquire`, `reserve`): a denial
/// (rate limited, or a failure mode refusing) is an answer, `Ok` with the decision that
/// denied; a store failure and a cost above a capacity are errors.
impl Finished for Result<(Decision, Option<Slots>), CheckError> {
    #[inline(always)]
    fn admitted(decision: Decision, held: impl FnOnce(&Decision) -> Option<Held>) -> Self {
        let slots = held(&decision).and_then(|held| held.slots);
        Ok((decision, slots))
    }

    #[inline(always)]
    fn refused(refusal: Refusal) -> Self {
        direct(&refusal).map(|decision| (decision, None))
    }
}

/// The direct API's terms, keeping nothing (`check`).
impl Finished for Result<Decision, CheckError> {
    #[inline(always)]
    fn admitted(decision: Decision, _: impl FnOnce(&Decision) -> Option<Held>) -> Self {
        Ok(decision)
    }

    #[inline(always)]
    fn refused(refusal: Refusal) -> Self {
        direct(&refusal)
    }
}

impl<S: Store> Limiter<S> {
    /// Finishes the decision of a request or key checked against `set` once the store has
    /// answered: see the [module docs](self). `reserved` is what
    /// [`prepare`](Self::prepare) handed along with the store's answer, for the layer.
    ///
    /// A denial, a store failure or a failure mode refusing is a [`Refusal`], handed back
    /// in the caller's terms ([`Finished`]).
    #[inline(always)]
    pub(crate) fn finish<R: Finished>(
        &self,
        asker: Asker,
        set: &Arc<PolicySet>,
        key: &Key,
        outcome: Result<Decision, StoreError>,
        reserved: Reserved,
    ) -> R {
        if asker != Asker::Guard {
            self.record(set, asker.is_request().then_some(key), &outcome);
        }
        let decision = match outcome {
            Ok(decision) => decision,
            Err(error) => return R::refused(self.refuse(asker, set, key, Err(error))),
        };
        // A failure mode refusing denies (a policy failing closed denies), so every refusal
        // is off this path.
        if !decision.is_allowed() {
            return R::refused(self.refuse(asker, set, key, Ok(decision)));
        }
        if asker.is_request() {
            // A refusal is recorded on the span by `log`.
            if let Some(span) = telemetry::current_span() {
                let key = Some(key).filter(|_| telemetry::span_takes_key(&span));
                span_decision(&span, key, &decision, &set.enforced);
            }
        }
        R::admitted(decision, |decision| match asker {
            Asker::Layer if !set.in_flight.is_empty() || reserved.is_some() => {
                self.held(set, key, decision, reserved)
            }
            Asker::Acquire => Some(Held {
                slots: self.hold_slots(set, key, decision),
                settlement: None,
                counting: None,
            }),
            _ => None,
        })
    }

    /// The refusal of a store's answer that does not admit the request: a store failure, a
    /// failure mode refusing, a cost above a capacity in force, or a denial (whose key
    /// counts among the top refused). Off the common path.
    #[cold]
    #[inline(never)]
    fn refuse(
        &self,
        asker: Asker,
        set: &PolicySet,
        key: &Key,
        outcome: Result<Decision, StoreError>,
    ) -> Refusal {
        let refusal = match outcome {
            Err(error) => Refusal::store_unavailable(Some(error), None),
            Ok(decision) if decision.decided_by() == DecidedBy::FailClosed => {
                Refusal::store_unavailable(None, Some(decision))
            }
            Ok(decision) => match over_capacity(set, &decision) {
                Some(refusal) => refusal,
                None => {
                    // The policies of the route's set, not the default route's: the message,
                    // headers and sensitivity must match the decision.
                    let policies = set.enforced.clone();
                    let now = self.inner.common.store.now_millis();
                    self.note_refused(key);
                    Refusal::rate_limited(decision, policies, now)
                }
            },
        };
        if asker.is_request() || refusal.kind() == RefusalKind::CostExceedsCapacity {
            refusal.log(Some(key));
        }
        refusal
    }

    /// Records the store's answer: metrics, and a trace event when `key` is given.
    #[inline]
    fn record(&self, set: &PolicySet, key: Option<&Key>, outcome: &Result<Decision, StoreError>) {
        // Store errors are counted by the store (or its resilience wrapper), not here.
        if let Ok(decision) = outcome {
            let store = self.inner.common.store.name();
            telemetry::decision(decision, store, &set.enforced, &set.route, &set.metric_keys);
            if let Some(key) = key {
                if tracing::enabled!(target: "tollgate::decision", tracing::Level::DEBUG) {
                    trace_decision(key, decision, &set.enforced, store);
                }
            }
        }
    }
}

/// A refusal in the direct API's terms: a denial (rate limited, or a failure mode refusing)
/// is an answer, `Ok` with the decision that denied; a store failure and a cost above a
/// capacity are errors.
#[cold]
#[inline(never)]
fn direct(refusal: &Refusal) -> Result<Decision, CheckError> {
    if let Some(error) = refusal.store_error() {
        return Err(CheckError::Store(error.clone()));
    }
    match (refusal.kind(), refusal.decision()) {
        (RefusalKind::RateLimited | RefusalKind::StoreUnavailable, Some(decision)) => {
            Ok(decision.clone())
        }
        _ => Err(CheckError::from_refusal(refusal)),
    }
}

/// The refusal of a decision the store denied for a cost above a policy's capacity in force
/// ([`PolicyDecision::exceeds_capacity`](crate::algorithm::PolicyDecision::exceeds_capacity)):
/// the plan's, or a per-key override's, higher or lower (which is why the limiter does not
/// screen costs against the plan before asking the store). Refused with
/// `CostExceedsCapacity`, no `Retry-After` (no wait makes it fit), naming the capacity in
/// force, and never counted as a rate-limit refusal.
fn over_capacity(set: &PolicySet, decision: &Decision) -> Option<Refusal> {
    if decision.is_allowed() {
        return None;
    }
    decision
        .policies()
        .iter()
        .zip(set.enforced.iter())
        .find_map(|(d, p)| {
            let cost = d.excess_cost()?;
            Some(Refusal::cost_exceeds_capacity_in_force(p, cost, d.limit()))
        })
}

/// An allowed decision on the current span.
#[inline(never)]
fn span_decision(
    span: &tracing::Span,
    key: Option<&Key>,
    decision: &Decision,
    policies: &[Policy],
) {
    let digest = key.map(crate::key::digest);
    let policy = policies.get(decision.governing_index()).map(Policy::name);
    telemetry::span_decision(span, digest.as_deref(), policy, Some(decision), None);
}

/// One debug event per decision, with the fields OpenTelemetry users expect.
fn trace_decision(key: &Key, decision: &Decision, policies: &[Policy], store: &'static str) {
    let digest = crate::key::digest(key);
    let policy = policies
        .get(decision.governing_index())
        .map_or("", Policy::name);
    tracing::event!(
        target: "tollgate::decision",
        tracing::Level::DEBUG,
        ratelimit.key = digest.as_str(),
        ratelimit.policy = policy,
        ratelimit.allowed = decision.is_allowed(),
        ratelimit.remaining = decision.remaining(),
        ratelimit.store = store,
        ratelimit.outcome = decision.decided_by().as_str(),
        "rate-limit decision"
    );
}
