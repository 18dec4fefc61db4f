//! In flight: how many requests of a key are in progress at once, not how many arrived.
//!
//! A request takes one slot when it is admitted and gives it back when its response has been
//! sent or dropped (the layer ties the slot to the response body; the direct API to a
//! [`Permit`](crate::limiter::Permit)). It is allowed when fewer than `N` slots are held.
//! Stripe's concurrent-requests limiter, nginx's `limit_conn` and Traefik's `inFlightReq`
//! work the same way.
//!
//! [`Limiter::check`](crate::Limiter::check) and [`Limiter::decide`](crate::Limiter::decide)
//! keep no slot: they answer once the slot they took is back in the store, so a caller's
//! next check never finds its own. The layer gives a slot back when the response body ends
//! and does not wait for the store: on Redis, a client that sends its next request the
//! moment the last byte arrives can find its previous slot still held for one store round
//! trip (in memory the slot is back before the body ends).
//!
//! * `remaining`: the slots still free after this decision.
//! * `reset_after`: 0 (there is no window: a slot comes back when a request ends).
//! * `retry_after`: [`RETRY_AFTER_MS`] when refused. When a slot frees up cannot be known
//!   in advance; one second is short enough for a client to come back soon and long
//!   enough not to turn a full key into a busy loop.
//!
//! The "window" of an in-flight policy is the **slot lease** of a shared store: a slot held in
//! Redis expires that long after it was taken or last refreshed, so slots held by an
//! instance that crashed come back by themselves. The holder refreshes its slots every third
//! of the lease while the request runs. In memory a slot is held until it is given back;
//! the lease plays no part.
//!
//! **Bound, across an outage longer than the lease.** While the store cannot be reached the
//! refreshes fail (each counted in `tollgate_store_errors_total`), so the slots of requests
//! that run through it expire: once the store is back those requests are not counted until
//! they end, and up to the policy's limit more may start meanwhile, at most one limit's worth
//! per outage (`tests/failure_modes.rs` measures it).
//!
//! A request holds one slot whatever its cost: a store charges one slot for any cost (a
//! look, [`Op::Peek`](crate::store::Op::Peek), asks for none with cost 0).
//!
//! A release of a slot held by a state that has since been forgotten (a
//! [`reset`](crate::store::Op::Reset)) changes nothing, and the count never goes below
//! zero: a slot is named by the request that took it. The Redis stores keep the names
//! themselves (a sorted set), so a release of a name they do not hold changes nothing; the
//! memory store keeps the count and the name of the request that started the state
//! ([`InFlightState::since`]): a slot named before that belongs to a forgotten state, and
//! any later name frees one slot (see [`Op::Release`](crate::store::Op::Release) for what
//! that means for a slot released twice).
//!
//! A [refund](crate::store::Op::Refund) is about rate units and never touches slots; only
//! [`Op::Release`](crate::store::Op::Release) gives a slot back.

use super::LimitAlgorithm;
use super::PolicyDecision;
use crate::policy::{Algorithm, Limits};

/// The `Retry-After` of a refusal by an in-flight policy, in milliseconds.
pub const RETRY_AFTER_MS: u64 = 1_000;

/// The expiry of a state with a slot held: never, in practice, and far below `u64::MAX` so that
/// sums with it do not overflow. A store that finds it on an entry knows a slot was held.
pub(crate) const HELD_EXPIRY: u64 = u64::MAX / 2;

/// The slots held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct InFlightState {
    held: u64,
    since: u64,
}

impl InFlightState {
    /// The slots held now.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The name of the slot whose request started this state (the first slot taken while
    /// none was held), or 0 for a state whose slots are not named. A slot named below it
    /// was taken from a state since forgotten.
    pub fn since(&self) -> u64 {
        self.since
    }

    /// Names the state after the slot `slot` just taken, when that slot started it.
    pub(crate) fn name_after(&mut self, slot: u64, taken: u64) {
        if self.held <= taken {
            self.since = slot;
        }
    }

    /// Gives back the slot named `slot` (0: an unnamed slot), if it was taken from this
    /// state.
    pub(crate) fn release_named(&mut self, slot: u64) {
        if slot == 0 || slot >= self.since {
            self.held = self.held.saturating_sub(1);
        }
    }
}

/// The in flight algorithm; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct InFlight;

impl LimitAlgorithm for InFlight {
    type State = InFlightState;

    const ALGORITHM: Algorithm = Algorithm::InFlight;

    /// What a request asking for `slots` slots (1, or 0 to only look) would get, changing
    /// nothing.
    #[inline]
    fn evaluate(state: &InFlightState, _now: u64, limits: &Limits, slots: u64) -> PolicyDecision {
        let n = limits.limit();
        let allowed = state
            .held
            .checked_add(slots)
            .is_some_and(|after| after <= n);
        let after = if allowed {
            state.held.saturating_add(slots)
        } else {
            state.held
        };
        PolicyDecision::from_parts(allowed, n, n.saturating_sub(after), 0, RETRY_AFTER_MS, 0)
    }

    /// Takes the slots of an allowed request.
    #[inline]
    fn commit(state: &mut InFlightState, _now: u64, _limits: &Limits, slots: u64) {
        state.held = state.held.saturating_add(slots);
    }

    /// Gives `slots` slots back (a request ended), never below zero.
    fn refund(state: &mut InFlightState, _now: u64, _limits: &Limits, slots: u64) {
        state.held = state.held.saturating_sub(slots);
    }

    /// Nothing to settle: a request holds one slot whatever it costs.
    fn overcharge(_state: &mut InFlightState, _now: u64, _limits: &Limits, _extra: u64) {}

    /// One slot whatever the cost; a look of cost 0 asks for none.
    #[inline(always)]
    fn asked(cost: u64, charge: bool) -> u64 {
        u64::from(charge || cost > 0)
    }

    /// [`evaluate`](LimitAlgorithm::evaluate) and, when allowed, [`commit`](LimitAlgorithm::commit).
    fn decide(
        mut state: InFlightState,
        now: u64,
        limits: &Limits,
        slots: u64,
    ) -> (PolicyDecision, InFlightState) {
        let d = Self::evaluate(&state, now, limits, slots);
        if d.is_allowed() {
            Self::commit(&mut state, now, limits, slots);
        }
        (d, state)
    }

    /// While slots are held, never: forgetting the state would free them. Once every slot is
    /// back, at once.
    fn expires_at(state: &InFlightState, _limits: &Limits) -> u64 {
        if state.held > 0 {
            HELD_EXPIRY
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use crate::{Algorithm, Rate};

    fn two() -> Policy {
        Policy::in_flight("uploads", 2).unwrap()
    }

    #[test]
    fn holds_at_most_n_and_frees_on_release() {
        let p = two();
        let s = InFlightState::default();
        let (d, s) = InFlight::decide(s, 0, p.limits(), 1);
        assert!(d.is_allowed() && d.remaining() == 1);
        let (d, s) = InFlight::decide(s, 0, p.limits(), 1);
        assert!(d.is_allowed() && d.remaining() == 0);
        let (d, mut s) = InFlight::decide(s, 0, p.limits(), 1);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after_millis(), RETRY_AFTER_MS);
        assert_eq!(InFlight::expires_at(&s, p.limits()), HELD_EXPIRY);
        InFlight::refund(&mut s, 5, p.limits(), 1);
        let (d, mut s) = InFlight::decide(s, 5, p.limits(), 1);
        assert!(d.is_allowed());
        InFlight::refund(&mut s, 5, p.limits(), 5);
        assert_eq!(s.held(), 0);
        assert_eq!(InFlight::expires_at(&s, p.limits()), 0);
        assert_eq!(p.algorithm(), Algorithm::InFlight);
        assert_eq!(p.rate(), Rate::new(2, crate::policy::DEFAULT_SLOT_LEASE));
    }
}
