//! The decision path: everything between a request (or a key) and the store's answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use smallvec::SmallVec;

use super::{Limiter, Lists, PolicySet};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::{Key, RequestView};
use crate::policy::Policy;
use crate::refusal::{Refusal, RefusalKind};
use crate::route::Cost;
use crate::store::{AnswerNow, BoxFuture, Store};

/// A request's decision as far as it goes before the store answers (the layer and
/// [`Limiter::decide`]).
pub(crate) enum Prepared<F> {
    /// Exempt route, allow-listed key, or only shadow policies: go ahead, no headers.
    Pass,
    /// Refused before asking the store (missing key, deny list, a cost that never fits).
    Refuse(Refusal),
    /// The store answered at once ([`Store::check_now`]).
    Decided {
        outcome: Result<Decision, StoreError>,
        pending: Pending,
    },
    /// The store's answer to wait for.
    Check {
        future: CheckFuture<F>,
        pending: Pending,
    },
}

/// The units a request of a set with metered policies or a counting rule charged each
/// enforced policy, for its settlement or refund; `None` for a set without either.
pub(crate) type Reserved = Option<Box<ReservedUnits>>;

/// The units a request charged each enforced policy, and the limiter's reset moment
/// ([`Limiter::resets_seen`]) read before it was charged: a give-back after a reset of the
/// key would come off units charged since the reset, so there is none.
#[derive(Debug, Clone)]
pub(crate) struct ReservedUnits {
    pub(crate) units: SmallVec<[u64; 2]>,
    pub(crate) resets: u64,
}

/// What [`Limiter::finish`] needs of a request besides the store's answer: the policy set and
/// key it is decided by, and the units it reserved.
pub(crate) struct Pending {
    pub(crate) set: Arc<PolicySet>,
    pub(crate) key: Key,
    pub(crate) reserved: Reserved,
}

impl Pending {
    /// What a request of set `set` about `key`, charged `costs`, leaves for `finish`. The key
    /// goes along (moved, not copied) for the decision event, the span, the top refused keys
    /// and what the request holds; each reads it only when it is wanted.
    #[inline(always)]
    fn new(set: &Arc<PolicySet>, key: Key, costs: &[u64], resets: u64) -> Self {
        Self {
            set: Arc::clone(set),
            key,
            reserved: (!set.meters.is_empty() || set.count.is_some()).then(|| {
                Box::new(ReservedUnits {
                    units: SmallVec::from_slice(costs),
                    resets,
                })
            }),
        }
    }
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
    /// [`prepare_key`](Self::prepare_key) and the store asked. The request is decided by the
    /// plan in force now to its end, whatever a reload does meanwhile.
    pub(crate) fn prepare(&self, request: &RequestView<'_>) -> Prepared<S::CheckFuture> {
        let guard = self.plan();
        let plan = &*guard;
        let Some(set) = plan.resolve(request) else {
            return Prepared::Pass;
        };
        let set = &*set;
        // The client's address, read only when client networks are listed: they apply to it
        // whatever key the request gets (see `Lists::screen`).
        let addr = plan.lists.client_addr(set, request);
        let Some(key) = plan.lists.key_for(Some(set), request) else {
            if addr.is_some_and(|ip| plan.lists.deny.contains_addr(ip)) {
                let refusal = Refusal::of_kind(RefusalKind::Forbidden);
                refusal.log(None);
                return Prepared::Refuse(refusal);
            }
            // Allowed networks skip limiting whatever key the request gets, none included.
            if addr.is_some_and(|ip| plan.lists.allow.contains_addr(ip)) {
                return Prepared::Pass;
            }
            Refusal::warn_missing_peer(request.peer_addr().is_some());
            let refusal = Refusal::of_kind(RefusalKind::MissingKey);
            refusal.log(None);
            return Prepared::Refuse(refusal);
        };
        let screened = addr.is_some();
        if screened {
            match plan.lists.screen(&key, addr) {
                Listed::Denied => return Prepared::Refuse(forbidden(&key)),
                Listed::Allowed => return Prepared::Pass,
                Listed::No => {}
            }
        }
        // A computed cost is asked of the request once, for shadow and enforced policies alike.
        let cost = match &set.cost {
            Cost::PolicyDefault => None,
            Cost::Fixed(c) => Some(*c),
            Cost::Computed(f) => Some(f(request)),
        };
        let estimates: Option<SmallVec<[u64; 2]>> = (!set.meters.is_empty()).then(|| {
            set.meters
                .iter()
                .map(|(_, m)| m.estimate(request))
                .collect()
        });
        let mut given = SmallVec::new();
        let prepared = self.prepare_key(
            set,
            Screen {
                lists: &plan.lists,
                networks: !screened,
            },
            &key,
            cost,
            estimates.as_deref(),
            &mut given,
        );
        let costs = match prepared {
            PreparedKey::Pass => return Prepared::Pass,
            PreparedKey::Refuse(refusal) => return Prepared::Refuse(refusal),
            PreparedKey::Ask(costs) => costs,
        };
        // Read before the charge: a reset after this read makes the charge's give-back void.
        let resets = if set.meters.is_empty() && set.count.is_none() {
            0
        } else {
            self.resets_seen()
        };
        if let Some(outcome) = self.answer_now(set, &key, costs) {
            let pending = Pending::new(set, key, costs, resets);
            return Prepared::Decided { outcome, pending };
        }
        let future = self.answer_later(set, &key, costs);
        let pending = Pending::new(set, key, costs, resets);
        Prepared::Check { future, pending }
    }
}

impl PolicySet {
    /// The cost every request of the set is charged when it does not depend on the request
    /// ([`Route::cost`](crate::route::Route::cost)): what the direct calls that have no
    /// request to ask ([`Limiter::acquire`], [`Limiter::peek`]) charge, as the layer would.
    pub(crate) fn fixed_cost(&self) -> Option<u64> {
        match self.cost {
            Cost::Fixed(c) => Some(c),
            _ => None,
        }
    }

    /// What a look at a key asks of each enforced policy: the route's cost when it is fixed
    /// (or, given a `request`, computed from it), each policy's own otherwise.
    pub(crate) fn look_costs(&self, request: Option<&RequestView<'_>>) -> SmallVec<[u64; 2]> {
        let cost = match (&self.cost, request) {
            (Cost::Fixed(c), _) => Some(*c),
            (Cost::Computed(f), Some(request)) => Some(f(request)),
            _ => None,
        };
        match cost {
            Some(c) => self.charged_costs(Some(c), None),
            None => self.default_costs.clone(),
        }
    }

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
pub(crate) enum PreparedKey<'s> {
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
    /// Costs other than the set's own are kept in `given`. The one preparation of every way
    /// in: [`prepare`](Self::prepare) for a request, and the direct API
    /// ([`check`](Self::check), [`acquire`](Self::acquire), [`reserve`](Self::reserve)) for
    /// a key; the store is then asked with [`answer_now`](Self::answer_now) or
    /// [`answer_later`](Self::answer_later).
    #[inline(always)]
    pub(crate) fn prepare_key<'s>(
        &self,
        set: &'s Arc<PolicySet>,
        screen: Screen<'_>,
        key: &Key,
        cost: Option<u64>,
        estimates: Option<&[u64]>,
        given: &'s mut SmallVec<[u64; 2]>,
    ) -> PreparedKey<'s> {
        let listed = if screen.networks {
            screen_lists(screen.lists, key)
        } else {
            screen_listed_keys(screen.lists, key)
        };
        match listed {
            Listed::Denied => return PreparedKey::Refuse(forbidden(key)),
            Listed::Allowed => return PreparedKey::Pass,
            Listed::No => {}
        }
        if !set.shadow.is_empty() {
            self.spawn_shadow_check(key, set, cost);
        }
        charged(set, cost, estimates, given)
    }

    /// The store's answer about a prepared key, when it gives one at once: a store that
    /// answers at once (the memory store) and no penalties. Handed back as the store gives
    /// it, so that the decision is moved once, into what the caller makes of it.
    #[inline(always)]
    pub(crate) fn answer_now(&self, set: &PolicySet, key: &Key, costs: &[u64]) -> AnswerNow {
        if !set.penalties.is_empty() {
            return None;
        }
        self.inner.common.store.check_now(key, &set.enforced, costs)
    }

    /// The store's answer to wait for, about a prepared key: the store's own call, or, with
    /// penalties, the block peeked before it and started after a denial.
    pub(crate) fn answer_later(
        &self,
        set: &Arc<PolicySet>,
        key: &Key,
        costs: &[u64],
    ) -> CheckFuture<S::CheckFuture> {
        let store = &self.inner.common.store;
        if set.penalties.is_empty() {
            return CheckFuture::Direct {
                future: store.check(key, &set.enforced, costs),
            };
        }
        CheckFuture::Boxed {
            future: Box::pin(self.clone().check_with_penalties(
                key.clone(),
                Arc::clone(set),
                SmallVec::from_slice(costs),
            )),
        }
    }
}

/// What the deny and allow lists make of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listed {
    /// On the deny list: refused (see [`forbidden`]).
    Denied,
    /// On the allow list: passes uncharged.
    Allowed,
    /// On neither: ask on.
    No,
}

/// Where `key` stands on the deny and allow lists.
#[inline(always)]
pub(crate) fn screen_lists(lists: &Lists, key: &Key) -> Listed {
    if lists.deny.contains(key) {
        Listed::Denied
    } else if lists.allow.contains(key) {
        Listed::Allowed
    } else {
        Listed::No
    }
}

/// Where `key` itself stands on the lists, networks aside (the request's client address was
/// screened against them).
fn screen_listed_keys(lists: &Lists, key: &Key) -> Listed {
    if lists.deny.lists_key(key) {
        Listed::Denied
    } else if lists.allow.lists_key(key) {
        Listed::Allowed
    } else {
        Listed::No
    }
}

/// The lists a key is screened against, and whether their networks are matched against
/// the key too (`false` once the request's client address was matched against them).
#[derive(Clone, Copy)]
pub(crate) struct Screen<'l> {
    pub(crate) lists: &'l Lists,
    pub(crate) networks: bool,
}

impl<'l> Screen<'l> {
    /// The lists with networks matched against IP keys: the direct API, which has no
    /// request to read an address from.
    #[inline(always)]
    pub(crate) fn keys(lists: &'l Lists) -> Self {
        Self {
            lists,
            networks: true,
        }
    }
}

/// The refusal of a deny-listed key, logged.
#[cold]
#[inline(never)]
pub(crate) fn forbidden(key: &Key) -> Refusal {
    let refusal = Refusal::of_kind(RefusalKind::Forbidden);
    refusal.log(Some(key));
    refusal
}

/// The units a screened key charges each enforced policy (see [`Limiter::prepare_key`]),
/// or its pass (no enforced policy).
#[inline(always)]
pub(crate) fn charged<'s>(
    set: &'s PolicySet,
    cost: Option<u64>,
    estimates: Option<&[u64]>,
    given: &'s mut SmallVec<[u64; 2]>,
) -> PreparedKey<'s> {
    if set.enforced.is_empty() {
        return PreparedKey::Pass;
    }
    // A cost equal to every policy's own charges the costs validated when the set was
    // built: borrowed, not copied, and not checked again. The common case, on every
    // request.
    if estimates.is_none() && cost.is_none_or(|c| set.own_costs.fits(c)) {
        return PreparedKey::Ask(&set.default_costs);
    }
    // A given cost above a policy's capacity is not refused here: a per-key override in the
    // store may raise the capacity in force for this key. The store refuses a cost above the
    // capacity in force, charging nothing, and `finish` turns that into the same refusal.
    *given = set.charged_costs(cost, estimates);
    PreparedKey::Ask(given)
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
