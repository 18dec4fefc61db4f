//! The five rate algorithms, and the in-flight count, as pure decision functions.
//!
//! Each module holds one algorithm: a small state type and three functions over
//! `(state, now, policy, cost)`, with `now` in milliseconds since the Unix epoch:
//!
//! * `evaluate(&state, now, policy, cost) -> PolicyDecision` answers without changing anything;
//! * `commit(&mut state, now, policy, cost)` charges an allowed request;
//! * `decide(state, now, policy, cost) -> (PolicyDecision, state)` is the two together: the
//!   new state is the old one when the request is denied, because **a denied request consumes
//!   nothing**;
//! * `refund(&mut state, now, policy, cost)` gives back up to `cost` units charged earlier,
//!   for a request that turned out not to count (a login that succeeded, a cost settled
//!   after the response). A refund never leaves a state better than a fresh one; each
//!   algorithm states what a refund made after a window boundary gives back.
//!
//! Splitting evaluation from charging is what lets a request checked against several policies
//! be decided all or nothing: evaluate every policy, then commit every policy only if all
//! allowed. When one denies, the others report `evaluate` with cost 0 — their state as it
//! stands, since nothing was charged. The Redis Lua scripts implement the same arithmetic; a differential test keeps them
//! equal.
//!
//! All arithmetic is on integers (scaled where a rate is fractional), so the Rust and Lua
//! versions give the same answer to the millisecond. Times are assumed not to go backwards;
//! [`SystemClock`](crate::clock::SystemClock) and Redis `TIME` never do.
//!
//! # Examples
//!
//! ```
//! use tollgate::algorithm::{fixed_window, FixedWindowState};
//! use tollgate::{Algorithm, Policy, Rate};
//!
//! let policy = Policy::builder("p", Rate::per_second(2)).algorithm(Algorithm::FixedWindow).build()?;
//! let state = FixedWindowState::default();
//! let (d, state) = fixed_window::decide(state, 10_000, &policy, 1);
//! assert!(d.is_allowed() && d.remaining() == 1);
//! let (d, state) = fixed_window::decide(state, 10_100, &policy, 1);
//! assert!(d.is_allowed() && d.remaining() == 0);
//! let (d, _) = fixed_window::decide(state, 10_200, &policy, 1);
//! assert!(!d.is_allowed());
//! assert_eq!(d.retry_after().unwrap().as_millis(), 800); // the next window starts at 11_000
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::time::Duration;

pub mod fixed_window;
pub mod gcra;
pub mod in_flight;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

pub use fixed_window::FixedWindowState;
pub use gcra::GcraState;
pub use in_flight::InFlightState;
pub use sliding_window_counter::SlidingWindowCounterState;
pub use sliding_window_log::SlidingWindowLogState;
pub use token_bucket::TokenBucketState;

/// One policy's answer for one request.
///
/// What `remaining`, `reset_after` and `retry_after` mean exactly is documented per algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyDecision {
    pub(crate) allowed: bool,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_after_ms: u64,
    pub(crate) retry_after_ms: u64,
    pub(crate) delay_ms: u64,
}

impl PolicyDecision {
    /// A decision from raw parts (milliseconds). `retry_after_ms` is ignored when allowed and
    /// raised to at least 1 ms when denied; `delay_ms` is ignored when denied.
    pub fn from_parts(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_ms: u64,
        retry_after_ms: u64,
        delay_ms: u64,
    ) -> Self {
        Self {
            allowed,
            limit,
            remaining,
            reset_after_ms,
            retry_after_ms: if allowed { 0 } else { retry_after_ms.max(1) },
            delay_ms: if allowed { delay_ms } else { 0 },
        }
    }

    /// Whether the request may pass.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The quota: the limit per window, or the capacity for the token bucket and GCRA.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units still available right after this decision.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// How long until the quota is whole again if nothing else arrives.
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.reset_after_ms)
    }

    /// When denied: how long until the same request would be allowed if nothing else arrived.
    /// `None` when allowed.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_millis(self.retry_after_ms))
    }

    /// For shaping policies: how long an allowed request must wait for its slot.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms)
    }

    /// [`reset_after`](Self::reset_after) in milliseconds.
    pub fn reset_after_millis(&self) -> u64 {
        self.reset_after_ms
    }

    /// [`retry_after`](Self::retry_after) in milliseconds (0 when allowed).
    pub fn retry_after_millis(&self) -> u64 {
        self.retry_after_ms
    }

    /// [`delay`](Self::delay) in milliseconds.
    pub fn delay_millis(&self) -> u64 {
        self.delay_ms
    }
}

#[inline]
pub(crate) fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::PolicyDecision;

    /// Asserts the retry contract: the same request at `now + retry_after` passes and one
    /// millisecond earlier it does not.
    pub(crate) fn assert_retry_exact<S: Clone>(
        state: &S,
        now: u64,
        cost: u64,
        denied: &PolicyDecision,
        evaluate: impl Fn(&S, u64, u64) -> PolicyDecision,
    ) {
        assert!(!denied.is_allowed());
        let retry = denied.retry_after_millis();
        assert!(retry >= 1);
        assert!(
            evaluate(state, now + retry, cost).is_allowed(),
            "a retry at exactly retry_after ({retry} ms) must pass"
        );
        assert!(
            !evaluate(state, now + retry - 1, cost).is_allowed(),
            "a retry 1 ms before retry_after ({retry} ms) must fail"
        );
    }
}

/// A decision made in place, and the state's new expiry when it was charged.
pub(crate) type InPlace = (PolicyDecision, Option<u64>);

/// The state of any algorithm, for stores that keep states side by side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnyState {
    Counter(SlidingWindowCounterState),
    Log(Box<SlidingWindowLogState>),
    Bucket(TokenBucketState),
    Fixed(FixedWindowState),
    Gcra(GcraState),
    InFlight(InFlightState),
}

impl AnyState {
    pub(crate) fn fresh(algorithm: crate::Algorithm) -> Self {
        use crate::Algorithm as A;
        match algorithm {
            A::SlidingWindowCounter => AnyState::Counter(Default::default()),
            A::SlidingWindowLog => AnyState::Log(Default::default()),
            A::TokenBucket => AnyState::Bucket(Default::default()),
            A::FixedWindow => AnyState::Fixed(Default::default()),
            A::Gcra => AnyState::Gcra(Default::default()),
            A::InFlight => AnyState::InFlight(Default::default()),
        }
    }

    pub(crate) fn algorithm(&self) -> crate::Algorithm {
        use crate::Algorithm as A;
        match self {
            AnyState::Counter(_) => A::SlidingWindowCounter,
            AnyState::Log(_) => A::SlidingWindowLog,
            AnyState::Bucket(_) => A::TokenBucket,
            AnyState::Fixed(_) => A::FixedWindow,
            AnyState::Gcra(_) => A::Gcra,
            AnyState::InFlight(_) => A::InFlight,
        }
    }

    pub(crate) fn evaluate(&self, now: u64, policy: &crate::Policy, cost: u64) -> PolicyDecision {
        match self {
            AnyState::Counter(s) => sliding_window_counter::evaluate(s, now, policy, cost),
            AnyState::Log(s) => sliding_window_log::evaluate(s, now, policy, cost),
            AnyState::Bucket(s) => token_bucket::evaluate(s, now, policy, cost),
            AnyState::Fixed(s) => fixed_window::evaluate(s, now, policy, cost),
            AnyState::Gcra(s) => gcra::evaluate(s, now, policy, cost),
            AnyState::InFlight(s) => in_flight::evaluate(s, now, policy, cost),
        }
    }

    pub(crate) fn refund(&mut self, now: u64, policy: &crate::Policy, cost: u64) {
        match self {
            AnyState::Counter(s) => sliding_window_counter::refund(s, now, policy, cost),
            AnyState::Log(s) => sliding_window_log::refund(s, now, policy, cost),
            AnyState::Bucket(s) => token_bucket::refund(s, now, policy, cost),
            AnyState::Fixed(s) => fixed_window::refund(s, now, policy, cost),
            AnyState::Gcra(s) => gcra::refund(s, now, policy, cost),
            AnyState::InFlight(s) => in_flight::refund(s, now, policy, cost),
        }
    }

    /// Charges `extra` units whether or not they fit, within each algorithm's bound (see its
    /// `overcharge`): a cost settled above its reservation.
    pub(crate) fn overcharge(&mut self, now: u64, policy: &crate::Policy, extra: u64) {
        match self {
            AnyState::Counter(s) => sliding_window_counter::overcharge(s, now, policy, extra),
            AnyState::Log(s) => sliding_window_log::overcharge(s, now, policy, extra),
            AnyState::Bucket(s) => token_bucket::overcharge(s, now, policy, extra),
            AnyState::Fixed(s) => fixed_window::overcharge(s, now, policy, extra),
            AnyState::Gcra(s) => gcra::overcharge(s, now, policy, extra),
            AnyState::InFlight(s) => in_flight::overcharge(s, now, policy, extra),
        }
    }

    pub(crate) fn commit(&mut self, now: u64, policy: &crate::Policy, cost: u64) {
        match self {
            AnyState::Counter(s) => sliding_window_counter::commit(s, now, policy, cost),
            AnyState::Log(s) => sliding_window_log::commit(s, now, policy, cost),
            AnyState::Bucket(s) => token_bucket::commit(s, now, policy, cost),
            AnyState::Fixed(s) => fixed_window::commit(s, now, policy, cost),
            AnyState::Gcra(s) => gcra::commit(s, now, policy, cost),
            AnyState::InFlight(s) => in_flight::commit(s, now, policy, cost),
        }
    }

    /// Evaluates and, when `charge` and allowed, commits — one dispatch, with the
    /// algorithm's evaluate and commit inlined side by side so the work they share (the window
    /// index, the backlog) is computed once. Returns the decision and, when committed, the
    /// state's new expiry.
    #[inline]
    pub(crate) fn decide_in_place(
        &mut self,
        now: u64,
        policy: &crate::Policy,
        cost: u64,
        charge: bool,
    ) -> InPlace {
        macro_rules! run {
            ($module:ident, $state:expr) => {{
                let d = $module::evaluate($state, now, policy, cost);
                if charge && d.is_allowed() {
                    $module::commit($state, now, policy, cost);
                    let expires = $module::expires_at($state, policy);
                    (d, Some(expires))
                } else {
                    (d, None)
                }
            }};
        }
        match self {
            AnyState::Counter(s) => {
                match sliding_window_counter::decide_common_case(s, now, policy, cost, charge) {
                    Some(done) => done,
                    None => run!(sliding_window_counter, s),
                }
            }
            AnyState::Log(s) => run!(sliding_window_log, s),
            AnyState::Bucket(s) => run!(token_bucket, s),
            AnyState::Fixed(s) => run!(fixed_window, s),
            AnyState::Gcra(s) => match gcra::decide_common_case(s, now, policy, cost, charge) {
                Some(done) => done,
                None => run!(gcra, s),
            },
            AnyState::InFlight(s) => run!(in_flight, s),
        }
    }

    pub(crate) fn expires_at(&self, policy: &crate::Policy) -> u64 {
        match self {
            AnyState::Counter(s) => sliding_window_counter::expires_at(s, policy),
            AnyState::Log(s) => sliding_window_log::expires_at(s, policy),
            AnyState::Bucket(s) => token_bucket::expires_at(s, policy),
            AnyState::Fixed(s) => fixed_window::expires_at(s, policy),
            AnyState::Gcra(s) => gcra::expires_at(s, policy),
            AnyState::InFlight(s) => in_flight::expires_at(s, policy),
        }
    }
}
