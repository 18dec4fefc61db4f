//! The decision path: everything between a request (or a key) and the store's answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use smallvec::SmallVec;

use super::{Limiter, Lists, PolicySet};
use crate::decision::{DecidedBy, Decision};
use crate::error::StoreError;
use crate::key::{Key, RequestView};
use crate::policy::Policy;
use crate::refusal::{Refusal, RefusalKind};
use crate::route::Cost;
use crate::store::{BoxFuture, Store};
use crate::telemetry;

/// A request's decision as far as it can be taken before the store answers.
pub(crate) enum Prepared<F> {
    /// Exempt route, allow-listed key, or only shadow policies: go ahead, no headers.
    Pass,
    /// Refused before asking the store (missing key, deny list, a cost that never fits).
    Refuse(Refusal),
    /// The store answered at once ([`Store::check_now`]) for policy set `set`, about `key`;
    /// `hold` only when the set holds slots or settles costs after the response.
    Decided {
        set: Arc<PolicySet>,
        outcome: Result<Decision, StoreError>,
        key: Option<Key>,
        hold: Option<Box<HoldSeed>>,
    },
    /// The store's answer to wait for, for policy set `set`, about `key`; `hold` as for
    /// `Decided`.
    Check {
        set: Arc<PolicySet>,
        future: CheckFuture<F>,
        key: Option<Key>,
        hold: Option<Box<HoldSeed>>,
    },
}

/// What a request of a set with in-flight or metered policies needs after its decision: its
/// key, and the units charged to each enforced policy (for the settlement).
pub(crate) struct HoldSeed {
    pub(crate) key: Key,
    pub(crate) reserved: SmallVec<[u64; 2]>,
}

pin_project_lite::pin_project! {
    /// The store call of one request: the store's own future, or a boxed one when penalties
    /// need more than one call.
    #[project = CheckFutureProj]
    pub(crate) enum CheckFuture<F> {
        Direct { #[pin] future: F },
        Boxed { future: BoxFuture<Result<Decision, StoreError>> },
    }
}

impl<F> Future for CheckFuture<F>
where
    F: Future<Output = Result<Decision, StoreError>>,
{
    type Output = Result<Decision, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            CheckFutureProj::Direct { future } => future.poll(cx),
            CheckFutureProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<S: Store> Limiter<S> {
    /// Everything before the store answers, for a request: route, tier, key, cost, then
    /// [`prepare_key`](Self::prepare_key). The request is decided by the plan in force now
    /// to its end, whatever a reload does meanwhile.
    pub(crate) fn prepare(&self, request: &RequestView<'_>) -> Prepared<S::CheckFuture> {
        let guard = self.plan();
        let plan = &*guard;
        let Some(set) = plan.resolve(request) else {
            return Prepared::Pass;
        };
        let set = Arc::clone(set);
        let Some(key) = plan.lists.key_for(request) else {
            Refusal::warn_missing_peer(request.peer_addr().is_some());
            let refusal = Refusal::of_kind(RefusalKind::MissingKey);
            refusal.log(None);
            return Prepared::Refuse(refusal);
        };
        // A computed cost is asked of the request once, for shadow and enforced policies alike.
        let cost = match &set.cost {
            Cost::PolicyDefault => None,
            Cost::Fixed(c) => Some(*c),
            Cost::Computed(f) => Some(f(request)),
        };
        if set.meters.is_empty() {
            return self.prepare_key(set, &plan.lists, key, cost, None);
        }
        let estimates: SmallVec<[u64; 2]> = set
            .meters
            .iter()
            .map(|(_, m)| m.estimate(request))
            .collect();
        self.prepare_key(set, &plan.lists, key, cost, Some(&estimates))
    }
}

impl PolicySet {
    /// The units a request charges each enforced policy: its own cost, or the given `cost`,
    /// or a metered policy's estimate, at least one unit; an in-flight policy always one
    /// slot.
    ///
    /// A reservation reserves at least one unit whatever its estimate, so that it is
    /// admitted only with room for one more unit: an estimate of 0 would fit a spent budget,
    /// and its settlement would then be charged to a key with nothing left. Settling at 0
    /// gives the unit back. A plain cost of 0 (`Limiter::check(key, 0)`, a computed cost)
    /// stays free: it charges nothing and is settled by nothing, so it is admitted while the
    /// key is not past its limit (a look).
    pub(crate) fn charged_costs(
        &self,
        cost: Option<u64>,
        estimates: Option<&[u64]>,
    ) -> SmallVec<[u64; 2]> {
        let set = self;
        if let (Some(c), true, true) = (cost, set.meters.is_empty(), set.in_flight.is_empty()) {
            // The common case (`Limiter::check` with a cost): that cost for every policy.
            return smallvec::smallvec![c; set.enforced.len()];
        }
        set.enforced
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if p.is_in_flight() {
                    return 1;
                }
                let metered = set.meters.iter().position(|(m, _)| *m == i);
                match (metered, estimates) {
                    (Some(j), Some(e)) => e.get(j).copied().unwrap_or(p.cost()).max(1),
                    _ => cost.unwrap_or(p.cost()),
                }
            })
            .collect()
    }
}

/// What the lists, shadow policies and costs make of a key, before the store is asked.
pub(crate) enum Screened<'s> {
    /// Allow-listed key, or only shadow policies: go ahead, no headers.
    Pass,
    /// Deny-listed key, or a cost that never fits.
    Refuse(Refusal),
    /// Ask the store, charging these units to each enforced policy: the set's own costs
    /// (borrowed, the common case) or the given ones, kept where the caller said.
    Ask(&'s [u64]),
}

/// For which given costs a set's own costs can be charged instead: the costs validated when
/// the set was built, neither copied nor checked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnCosts {
    /// Every cost: the set has only in-flight policies, each taking one slot.
    Any,
    /// This cost: every rate policy's own, and each in-flight policy takes one slot.
    Only(u64),
    /// None: the policies' own costs differ.
    Never,
}

impl OwnCosts {
    /// What `default_costs`, the own costs of `enforced`, allow.
    pub(crate) fn of(enforced: &[Policy], default_costs: &[u64]) -> Self {
        let mut own = OwnCosts::Any;
        for (p, &d) in enforced.iter().zip(default_costs) {
            own = match (own, p.is_in_flight()) {
                (_, true) if d != 1 => return OwnCosts::Never,
                (own, true) => own,
                (OwnCosts::Any, false) => OwnCosts::Only(d),
                (OwnCosts::Only(c), false) if c == d => own,
                _ => return OwnCosts::Never,
            };
        }
        own
    }

    /// Whether a request charging `cost` to every policy (in-flight ones one slot) charges
    /// the set's own costs.
    #[inline]
    fn fits(self, cost: u64) -> bool {
        match self {
            OwnCosts::Any => true,
            OwnCosts::Only(c) => c == cost,
            OwnCosts::Never => false,
        }
    }
}

impl<S: Store> Limiter<S> {
    /// Everything before the store is asked, for a key: deny and allow lists, shadow
    /// policies, the cost (`None`: each policy's own) and its check against the capacities.
    /// Costs other than the set's own are kept in `given`.
    #[inline(always)]
    pub(crate) fn screen<'s>(
        &self,
        set: &'s Arc<PolicySet>,
        lists: &Lists,
        key: &Key,
        cost: Option<u64>,
        estimates: Option<&[u64]>,
        given: &'s mut SmallVec<[u64; 2]>,
    ) -> Screened<'s> {
        if lists.deny.contains(key) {
            let refusal = Refusal::of_kind(RefusalKind::Forbidden);
            refusal.log(Some(key));
            return Screened::Refuse(refusal);
        }
        if lists.allow.contains(key) {
            return Screened::Pass;
        }
        if !set.shadow.is_empty() {
            self.spawn_shadow_check(key, set, cost);
        }
        if set.enforced.is_empty() {
            return Screened::Pass;
        }
        // A cost equal to every policy's own charges the costs validated when the set was
        // built: borrowed, not copied, and not checked again. The common case, on every
        // request.
        if estimates.is_none() && cost.is_none_or(|c| set.own_costs.fits(c)) {
            return Screened::Ask(&set.default_costs);
        }
        // Policies' own costs were checked when they were built; a given one is checked here.
        *given = set.charged_costs(cost, estimates);
        if let Some((p, &c)) = too_costly(&set.enforced, given) {
            let refusal = Refusal::cost_exceeds_capacity(p, c);
            refusal.log(Some(key));
            return Screened::Refuse(refusal);
        }
        Screened::Ask(given)
    }

    /// Everything before the store answers, for a key: [`screen`](Self::screen), penalties,
    /// and the store call.
    #[inline]
    pub(crate) fn prepare_key(
        &self,
        set: Arc<PolicySet>,
        lists: &Lists,
        key: Key,
        cost: Option<u64>,
        estimates: Option<&[u64]>,
    ) -> Prepared<S::CheckFuture> {
        let common = &*self.inner.common;
        let mut given = SmallVec::new();
        let costs = match self.screen(&set, lists, &key, cost, estimates, &mut given) {
            Screened::Pass => return Prepared::Pass,
            Screened::Refuse(refusal) => return Prepared::Refuse(refusal),
            Screened::Ask(costs) => costs,
        };
        // The key goes along (moved, not copied) for the decision event, the span and the
        // top refused keys; each reads it only when it is wanted.
        let hold = (!set.in_flight.is_empty() || !set.meters.is_empty()).then(|| {
            Box::new(HoldSeed {
                key: key.clone(),
                reserved: SmallVec::from_slice(costs),
            })
        });
        let future = if set.penalties.is_empty() {
            if let Some(outcome) = common.store.check_now(&key, &set.enforced, costs) {
                return Prepared::Decided {
                    set,
                    outcome,
                    key: Some(key),
                    hold,
                };
            }
            CheckFuture::Direct {
                future: common.store.check(&key, &set.enforced, costs),
            }
        } else {
            CheckFuture::Boxed {
                future: Box::pin(self.clone().check_with_penalties(
                    key.clone(),
                    Arc::clone(&set),
                    SmallVec::from_slice(costs),
                )),
            }
        };
        Prepared::Check {
            set,
            future,
            key: Some(key),
            hold,
        }
    }

    /// Records the store's answer: metrics, and a trace event when `key` is kept.
    #[inline]
    pub(crate) fn record(
        &self,
        set: &PolicySet,
        key: Option<&Key>,
        outcome: &Result<Decision, StoreError>,
    ) {
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

    /// Turns the store's answer into going ahead (`Ok`, with the decision) or a refusal: a
    /// denial, a store failure, or a failure mode refusing.
    #[inline]
    pub(crate) fn conclude(
        &self,
        set: &PolicySet,
        key: Option<&Key>,
        outcome: Result<Decision, StoreError>,
    ) -> Result<Decision, Refusal> {
        self.record(set, key, &outcome);
        let refusal = match outcome {
            Err(error) => Refusal::store_unavailable(Some(error), None),
            Ok(decision) if decision.decided_by() == DecidedBy::FailClosed => {
                Refusal::store_unavailable(None, Some(decision))
            }
            Ok(decision) if decision.is_allowed() => {
                // A refusal is recorded on the span by `log`, below.
                if let Some(span) = telemetry::current_span() {
                    let policies = &set.enforced;
                    let key = key.filter(|_| telemetry::span_takes_key(&span));
                    span_decision(&span, key, &decision, policies);
                }
                return Ok(decision);
            }
            Ok(decision) => match over_capacity(set, &decision) {
                Some(refusal) => refusal,
                None => {
                    // The policies of the route's set, not the default route's: the message,
                    // headers and sensitivity must match the decision.
                    let policies = set.enforced.clone();
                    let now = self.inner.common.store.now_millis();
                    if let Some(key) = key {
                        self.note_refused(key);
                    }
                    Refusal::rate_limited(decision, policies, now)
                }
            },
        };
        refusal.log(key);
        Err(refusal)
    }
}

/// The refusal of a decision the store denied for a cost above a policy's capacity in force
/// ([`PolicyDecision::exceeds_capacity`](crate::algorithm::PolicyDecision::exceeds_capacity)):
/// a per-key override with a lower capacity than the plan's, which the screen before the
/// store checks against. Refused as the screen refuses a cost above the plan's capacity
/// (`CostExceedsCapacity`, no `Retry-After`: no wait makes it fit), and never counted as a
/// rate-limit refusal.
pub(crate) fn over_capacity(set: &PolicySet, decision: &Decision) -> Option<Refusal> {
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

/// The first policy whose capacity a cost exceeds.
fn too_costly<'a>(policies: &'a [Policy], costs: &'a [u64]) -> Option<(&'a Policy, &'a u64)> {
    policies.iter().zip(costs).find(|(p, &c)| c > p.capacity())
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

#[cfg(test)]
mod tests {
    use super::OwnCosts;
    use crate::policy::{Algorithm, Policy, Rate};

    fn rate(cost: u64) -> Policy {
        Policy::builder("rate", Rate::per_minute(100))
            .cost(cost)
            .build()
            .unwrap()
    }

    fn in_flight() -> Policy {
        Policy::builder("slots", Rate::per_minute(10))
            .algorithm(Algorithm::InFlight)
            .build()
            .unwrap()
    }

    /// The rule `OwnCosts` stands for: every rate policy's own cost is `cost`, and every
    /// in-flight policy's is one slot.
    fn own_by_rule(policies: &[Policy], cost: u64) -> bool {
        policies.iter().all(|p| {
            if p.is_in_flight() {
                p.cost() == 1
            } else {
                p.cost() == cost
            }
        })
    }

    #[test]
    fn own_costs_agree_with_the_rule_they_stand_for() {
        let sets = [
            vec![rate(1)],
            vec![rate(3)],
            vec![rate(1), rate(1)],
            vec![rate(1), rate(2)],
            vec![in_flight()],
            vec![in_flight(), rate(2)],
            vec![rate(2), in_flight(), rate(2)],
            vec![rate(2), in_flight(), rate(1)],
        ];
        for policies in &sets {
            let costs: Vec<u64> = policies.iter().map(Policy::cost).collect();
            let own = OwnCosts::of(policies, &costs);
            for cost in 0..5 {
                assert_eq!(
                    own.fits(cost),
                    own_by_rule(policies, cost),
                    "{own:?}, cost {cost}"
                );
            }
        }
        assert_eq!(OwnCosts::of(&[in_flight()], &[1]), OwnCosts::Any);
        assert_eq!(OwnCosts::of(&[rate(1), rate(2)], &[1, 2]), OwnCosts::Never);
    }
}
