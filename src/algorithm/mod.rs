//! The five rate algorithms, and the in-flight count, as pure decision functions.
//!
//! Each module holds one algorithm: a small state type and a unit type implementing
//! [`LimitAlgorithm`], whose functions work over `(state, now, limits, cost)`, with `now` in
//! milliseconds since the Unix epoch and [`Limits`] the four numbers an algorithm reads from
//! its policy:
//!
//! * [`evaluate`](LimitAlgorithm::evaluate) answers without changing anything;
//! * [`commit`](LimitAlgorithm::commit) charges an allowed request;
//! * [`decide`](LimitAlgorithm::decide) is the two together: the new state is the old one
//!   when the request is denied, because **a denied request consumes nothing**;
//! * [`refund`](LimitAlgorithm::refund) gives back up to `cost` units charged earlier, for a
//!   request that turned out not to count (a login that succeeded, a cost settled after the
//!   response). A refund never leaves a state better than a fresh one; each algorithm states
//!   what a refund made after a window boundary gives back;
//! * [`overcharge`](LimitAlgorithm::overcharge) charges a cost settled above its
//!   reservation, within a bound each algorithm states;
//! * [`expires_at`](LimitAlgorithm::expires_at) says when a state stops mattering (a store
//!   forgets it then).
//!
//! [`AnyState`] holds the state of any of them, for code that picks the algorithm at run
//! time (the memory store keeps one per key and policy).
//!
//! # Adding an algorithm
//!
//! An algorithm is its module here (state type and [`LimitAlgorithm`] implementation), its
//! Lua twin in `lua/` (the same arithmetic, for the Redis stores), a variant of
//! [`Algorithm`] (its public name, with [`Algorithm::ALL`]),
//! and one line in this module's registry, which ties the three together: it generates
//! [`AnyState`] and the table the Redis stores read the script and key layout from. The
//! differential and property tests pick it up from `Algorithm::ALL`.
//!
//! Splitting evaluation from charging is what lets a request checked against several policies
//! be decided all or nothing: evaluate every policy, then commit every policy only if all
//! allowed. When one denies, the others report `evaluate` with cost 0 — their state as it
//! stands, since nothing was charged. The Redis Lua scripts implement the same arithmetic; a differential test keeps them
//! equal.
//!
//! All arithmetic is on integers (scaled where a rate is fractional), so the Rust and Lua
//! versions give the same answer to the millisecond. Times are assumed not to go backwards.
//! [`SystemClock`](crate::clock::SystemClock) never does, so the memory store holds to it.
//! Redis `TIME` is the server's wall clock and can: an NTP step, a leap second, a failover to
//! a master whose clock is behind. What a step back of `J` does to a key touched shortly
//! before it, stated as a bound: a fixed window or sliding window counter whose `now` falls
//! in the window before its state's reads that state as fresh, so up to one more limit (and,
//! for the fixed window, another at the next boundary) can be admitted; a token bucket stops
//! refilling, and GCRA refuses, for up to `J` (a lockout, not an over-admission); the
//! sliding window log is unaffected. Keep the Redis servers' clocks disciplined (chrony with
//! slewing, no steps) where this matters.
//!
//! # Arithmetic on caller-controlled numbers
//!
//! Costs, refunds and settlements come from callers, and limits from operators (a per-key
//! override), so every function here takes any `u64` without overflow or underflow: sums
//! and products saturate, differences stop at zero. A state never holds more than
//! ⌊[`MAX_USAGE_WINDOW_PRODUCT`] / W⌋ units, so that the Lua twins, which compute in
//! doubles, stay exact (every value they handle is below 2^53); the Redis stores send any
//! cost above 2^53 − 1 as 2^53 − 1, which every function here answers exactly as it answers
//! the larger cost.
//!
//! * A cost that no state could ever admit (above the capacity; for a shaping GCRA policy,
//!   above what the burst and the longest delay hold) is denied, charges nothing, and is
//!   answered with the state as it stands and a `retry_after` equal to its `reset_after`
//!   (when the quota is whole again); [`PolicyDecision::exceeds_capacity`] tells it apart.
//!   The [`Limiter`](crate::Limiter) refuses such a cost before asking the store, and
//!   answers one that only a per-key override's lower capacity makes too large as
//!   [`CostExceedsCapacity`](crate::CheckError::CostExceedsCapacity) too.
//! * An [`overcharge`](LimitAlgorithm::overcharge) is never forgiven: a state may go past
//!   its limit, and the excess is a debt the key pays back at the policy's rate (`N` units
//!   per window) before it is admitted again. Debts saturate at the cap above.
//!
//! # Examples
//!
//! ```
//! use tollgate::algorithm::{FixedWindow, FixedWindowState, LimitAlgorithm};
//! use tollgate::{Algorithm, Policy, Rate};
//!
//! let policy = Policy::builder("p", Rate::per_second(2)).algorithm(Algorithm::FixedWindow).build()?;
//! let state = FixedWindowState::default();
//! let (d, state) = FixedWindow::decide(state, 10_000, policy.limits(), 1);
//! assert!(d.is_allowed() && d.remaining() == 1);
//! let (d, state) = FixedWindow::decide(state, 10_100, policy.limits(), 1);
//! assert!(d.is_allowed() && d.remaining() == 0);
//! let (d, _) = FixedWindow::decide(state, 10_200, policy.limits(), 1);
//! assert!(!d.is_allowed());
//! assert_eq!(d.retry_after().unwrap().as_millis(), 800); // the next window starts at 11_000
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use crate::policy::Algorithm;
pub use crate::policy::Limits;

pub mod fixed_window;
pub mod gcra;
pub mod in_flight;
pub mod sliding_window_counter;
pub mod sliding_window_log;
pub mod token_bucket;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::{Gcra, GcraState};
pub use in_flight::{InFlight, InFlightState};
pub use sliding_window_counter::{SlidingWindowCounter, SlidingWindowCounterState};
pub use sliding_window_log::{SlidingWindowLog, SlidingWindowLogState};
pub use token_bucket::{TokenBucket, TokenBucketState};

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
    /// When allowed, the shaping delay. When denied (no request waits), the cost of a
    /// request above the capacity in force (`limit`), 0 otherwise: see
    /// [`exceeds_capacity`](Self::exceeds_capacity). One field for both keeps a
    /// [`Decision`](crate::Decision), moved on every request, within 128 bytes.
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

    /// The decision for a request of `cost`, marked when it was denied for a cost above the
    /// capacity in force ([`limit`](Self::limit)) and the `slack` a shaping policy adds to
    /// it ([`Limits::shaping_slack`](crate::policy::Limits)), which no wait would cure. The
    /// stores mark every decision they answer (the memory store and the Redis stores alike).
    /// `slack` is asked only of a denial: an admitted request pays nothing for it.
    #[inline]
    pub(crate) fn for_cost(mut self, cost: u64, slack: impl FnOnce() -> u64) -> Self {
        if !self.allowed && cost > self.limit && cost > self.limit.saturating_add(slack()) {
            self.delay_ms = cost;
        }
        self
    }

    /// Whether the request was denied because its cost is above the capacity in force (a
    /// per-key override's, when one applies): no wait makes it fit.
    pub fn exceeds_capacity(&self) -> bool {
        !self.allowed && self.delay_ms > 0
    }

    /// The cost of a request denied for [exceeding the capacity](Self::exceeds_capacity).
    pub(crate) fn excess_cost(&self) -> Option<u64> {
        self.exceeds_capacity().then_some(self.delay_ms)
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
        Duration::from_millis(self.delay_millis())
    }

    /// [`reset_after`](Self::reset_after) in milliseconds.
    pub fn reset_after_millis(&self) -> u64 {
        self.reset_after_ms
    }

    /// [`retry_after`](Self::retry_after) in milliseconds (0 when allowed).
    pub fn retry_after_millis(&self) -> u64 {
        self.retry_after_ms
    }

    /// [`delay`](Self::delay) in milliseconds (0 when denied).
    pub fn delay_millis(&self) -> u64 {
        if self.allowed {
            self.delay_ms
        } else {
            0
        }
    }
}

#[inline]
pub(crate) fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// The most usage a state holds, debt included, times the window in milliseconds: 2^52.
///
/// An [`overcharge`](LimitAlgorithm::overcharge) is charged in full, even far past the
/// limit: the excess is a debt the key pays back at the policy's rate before it is admitted
/// again. It saturates so that every number the Redis scripts handle stays below 2^53, where
/// doubles are exact: a state holds at most ⌊2^52 / W⌋ units (W the window in ms), at least
/// four times the limit since limit × W ≤
/// [`MAX_CAPACITY_WINDOW_PRODUCT`](crate::policy::MAX_CAPACITY_WINDOW_PRODUCT) (2^50). A
/// settlement of `u64::MAX` therefore leaves the key refused for about 2^52 / N ms (N the
/// limit per window), until [`reset`](crate::Limiter::reset).
pub const MAX_USAGE_WINDOW_PRODUCT: u64 = 1 << 52;

/// The most units a state of `limits` holds: ⌊[`MAX_USAGE_WINDOW_PRODUCT`] / W⌋.
#[inline]
pub(crate) fn max_units(limits: &Limits) -> u64 {
    MAX_USAGE_WINDOW_PRODUCT / limits.window_millis().max(1)
}

/// The answer to a request no state could ever admit, from `look`, the state's answer to a
/// request of cost 0: denied, charging nothing, `retry_after` its `reset_after` (when the
/// quota is whole again; the request does not fit then either).
#[inline]
pub(crate) fn never_fits(look: PolicyDecision) -> PolicyDecision {
    PolicyDecision::from_parts(
        false,
        look.limit,
        look.remaining,
        look.reset_after_ms,
        look.reset_after_ms,
        0,
    )
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::{LimitAlgorithm, PolicyDecision};
    use crate::policy::Limits;
    use crate::{Policy, Rate};

    /// A policy of algorithm `A` at `rate`, named after the algorithm.
    pub(crate) fn policy_for<A: LimitAlgorithm>(rate: Rate) -> Policy {
        Policy::builder(A::ALGORITHM.as_str(), rate)
            .algorithm(A::ALGORITHM)
            .build()
            .expect("a valid test policy")
    }

    /// [`assert_retry_exact`] for algorithm `A`'s own evaluation under `limits`.
    pub(crate) fn assert_retry<A: LimitAlgorithm>(
        state: &A::State,
        now: u64,
        limits: &Limits,
        cost: u64,
        denied: &PolicyDecision,
    ) {
        assert_retry_exact(state, now, cost, denied, |s, t, c| {
            A::evaluate(s, t, limits, c)
        });
    }

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

/// A decision made in place, and the state's new expiry (ms since the epoch) when it was
/// charged.
pub type InPlace = (PolicyDecision, Option<u64>);

mod sealed {
    pub trait Sealed {}
}

/// One algorithm: how a request of some cost is decided against a state, given the policy's
/// [`Limits`].
///
/// Implemented by the unit types [`SlidingWindowCounter`], [`SlidingWindowLog`],
/// [`TokenBucket`], [`FixedWindow`], [`Gcra`] and [`InFlight`]. The trait is sealed: every
/// algorithm has a Lua twin that the Redis stores run, so a new one belongs in this crate
/// (see [Adding an algorithm](self#adding-an-algorithm)).
///
/// ```
/// use tollgate::algorithm::{LimitAlgorithm, TokenBucket, TokenBucketState};
/// use tollgate::{Algorithm, Policy, Rate};
///
/// let policy = Policy::builder("p", Rate::per_second(10).with_burst(2))
///     .algorithm(Algorithm::TokenBucket)
///     .build()?;
/// let limits = policy.limits();
/// let (first, state) = TokenBucket::decide(TokenBucketState::default(), 1_000, limits, 2);
/// assert!(first.is_allowed() && first.remaining() == 0);
/// let (second, _) = TokenBucket::decide(state, 1_000, limits, 1);
/// assert_eq!(second.retry_after_millis(), 100); // one token every 100 ms
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub trait LimitAlgorithm: sealed::Sealed {
    /// What the algorithm keeps per key and policy.
    type State: Debug + Clone + Default + PartialEq + Eq + Hash + Send + Sync + 'static;

    /// The algorithm's public name.
    const ALGORITHM: Algorithm;

    /// What a request of `cost` at `now` would get, changing nothing.
    fn evaluate(state: &Self::State, now: u64, limits: &Limits, cost: u64) -> PolicyDecision;

    /// Charges an allowed request of `cost` at `now`.
    fn commit(state: &mut Self::State, now: u64, limits: &Limits, cost: u64);

    /// Gives back up to `cost` units charged earlier; never leaves the state better than a
    /// fresh one.
    fn refund(state: &mut Self::State, now: u64, limits: &Limits, cost: u64);

    /// Charges `extra` units whether or not they fit (a cost settled above its
    /// reservation), within the bound the algorithm states.
    fn overcharge(state: &mut Self::State, now: u64, limits: &Limits, extra: u64);

    /// When the state stops mattering (ms since the epoch): a store may forget it then.
    fn expires_at(state: &Self::State, limits: &Limits) -> u64;

    /// What a request of `cost` asks of a state, charged or only looked at (`charge`
    /// false): its cost, for every algorithm but [`InFlight`], where a request holds one
    /// slot whatever its cost (a look of cost 0 asks for none).
    ///
    /// ```
    /// use tollgate::algorithm::{InFlight, LimitAlgorithm, TokenBucket};
    ///
    /// assert_eq!(TokenBucket::asked(5, true), 5);
    /// assert_eq!(InFlight::asked(5, true), 1);
    /// assert_eq!(InFlight::asked(0, true), 1);
    /// assert_eq!(InFlight::asked(0, false), 0);
    /// ```
    #[inline(always)]
    fn asked(cost: u64, charge: bool) -> u64 {
        let _ = charge;
        cost
    }

    /// [`evaluate`](Self::evaluate) then, if allowed, [`commit`](Self::commit): the new
    /// state is the old one when the request is denied.
    #[inline]
    fn decide(
        mut state: Self::State,
        now: u64,
        limits: &Limits,
        cost: u64,
    ) -> (PolicyDecision, Self::State) {
        let d = Self::evaluate(&state, now, limits, cost);
        if d.is_allowed() {
            Self::commit(&mut state, now, limits, cost);
        }
        (d, state)
    }

    /// The answer of [`decide_in_place`](Self::decide_in_place) in one pass, for the
    /// requests an algorithm can decide more cheaply than by evaluating and then committing
    /// (a window index or backlog computed once); `None`, the default, for every other
    /// request.
    #[inline(always)]
    fn decide_common_case(
        state: &mut Self::State,
        now: u64,
        limits: &Limits,
        cost: u64,
        charge: bool,
    ) -> Option<InPlace> {
        let _ = (state, now, limits, cost, charge);
        None
    }

    /// Evaluates and, when `charge` and allowed, commits, in place: the decision and, when
    /// charged, the state's new [expiry](Self::expires_at). Takes the
    /// [common case](Self::decide_common_case) when the algorithm has one.
    #[inline]
    fn decide_in_place(
        state: &mut Self::State,
        now: u64,
        limits: &Limits,
        cost: u64,
        charge: bool,
    ) -> InPlace {
        match Self::decide_common_case(state, now, limits, cost, charge) {
            Some(done) => done,
            None => in_place_by_parts::<Self>(state, now, limits, cost, charge),
        }
    }
}

/// [`LimitAlgorithm::decide_in_place`] from the algorithm's evaluate, commit and expiry.
#[inline(always)]
fn in_place_by_parts<A: LimitAlgorithm + ?Sized>(
    state: &mut A::State,
    now: u64,
    limits: &Limits,
    cost: u64,
    charge: bool,
) -> InPlace {
    let d = A::evaluate(state, now, limits, cost);
    if charge && d.is_allowed() {
        A::commit(state, now, limits, cost);
        (d, Some(A::expires_at(state, limits)))
    } else {
        (d, None)
    }
}

/// What the stores need to know of one algorithm besides its arithmetic.
#[derive(Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Registration {
    /// The algorithm's number in the Redis script's `ALG` table.
    pub(crate) script_id: u8,
    /// The last part of its Redis state keys.
    pub(crate) key_part: &'static str,
    /// Its Lua twin, `lua/<file>`.
    pub(crate) lua: &'static str,
}

/// The registry: one line per algorithm — its [`Algorithm`] variant, the [`AnyState`]
/// variant and what it stores, its [`LimitAlgorithm`] type, its Redis script id, key part
/// and Lua file. Generates [`AnyState`] and [`registration`].
macro_rules! algorithms {
    ($(
        $(#[$doc:meta])*
        $variant:ident($stored:ty) => $alg:ty, id $id:literal, key $part:literal, lua $lua:literal;
    )*) => {
        $(impl sealed::Sealed for $alg {})*

        /// The state of any algorithm, for code that picks the algorithm at run time.
        ///
        /// ```
        /// use tollgate::algorithm::AnyState;
        /// use tollgate::{Algorithm, Policy, Rate};
        ///
        /// let policy = Policy::builder("p", Rate::per_second(1))
        ///     .algorithm(Algorithm::SlidingWindowLog)
        ///     .build()?;
        /// let mut state = AnyState::fresh(policy.algorithm());
        /// assert!(state.decide(5_000, policy.limits(), 1).is_allowed());
        /// assert!(!state.decide(5_500, policy.limits(), 1).is_allowed());
        /// assert_eq!(state.algorithm(), Algorithm::SlidingWindowLog);
        /// # Ok::<(), tollgate::ConfigError>(())
        /// ```
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum AnyState {
            $($(#[$doc])* $variant($stored),)*
        }

        impl AnyState {
            /// A fresh state for `algorithm`: nothing charged yet.
            pub fn fresh(algorithm: Algorithm) -> Self {
                match algorithm {
                    $(Algorithm::$variant => AnyState::$variant(Default::default()),)*
                }
            }

            /// The algorithm the state belongs to.
            pub fn algorithm(&self) -> Algorithm {
                match self {
                    $(AnyState::$variant(_) => Algorithm::$variant,)*
                }
            }

            /// See [`LimitAlgorithm::evaluate`].
            #[inline]
            ///
            /// The decision is marked when its cost
            /// [exceeds the capacity](PolicyDecision::exceeds_capacity).
            pub fn evaluate(&self, now: u64, limits: &Limits, cost: u64) -> PolicyDecision {
                match self {
                    $(AnyState::$variant(s) => <$alg>::evaluate(s, now, limits, cost),)*
                }
                .for_cost(cost, || limits.shaping_slack())
            }

            /// See [`LimitAlgorithm::commit`].
            #[inline]
            pub fn commit(&mut self, now: u64, limits: &Limits, cost: u64) {
                match self {
                    $(AnyState::$variant(s) => <$alg>::commit(s, now, limits, cost),)*
                }
            }

            /// [`evaluate`](Self::evaluate) then, if allowed, [`commit`](Self::commit); a
            /// denied request leaves the state as it was.
            #[inline]
            pub fn decide(&mut self, now: u64, limits: &Limits, cost: u64) -> PolicyDecision {
                self.decide_in_place(now, limits, cost, true).0
            }

            /// See [`LimitAlgorithm::refund`].
            #[inline]
            pub fn refund(&mut self, now: u64, limits: &Limits, cost: u64) {
                match self {
                    $(AnyState::$variant(s) => <$alg>::refund(s, now, limits, cost),)*
                }
            }

            /// See [`LimitAlgorithm::overcharge`].
            #[inline]
            pub fn overcharge(&mut self, now: u64, limits: &Limits, extra: u64) {
                match self {
                    $(AnyState::$variant(s) => <$alg>::overcharge(s, now, limits, extra),)*
                }
            }

            /// See [`LimitAlgorithm::decide_in_place`]: one dispatch for the evaluation and
            /// the commit.
            #[inline]
            pub fn decide_in_place(
                &mut self,
                now: u64,
                limits: &Limits,
                cost: u64,
                charge: bool,
            ) -> InPlace {
                let (d, expires, asked) = match self {
                    $(AnyState::$variant(s) => {
                        let asked = <$alg>::asked(cost, charge);
                        let (d, expires) = <$alg>::decide_in_place(s, now, limits, asked, charge);
                        (d, expires, asked)
                    })*
                };
                (d.for_cost(asked, || limits.shaping_slack()), expires)
            }

            /// See [`LimitAlgorithm::expires_at`].
            #[inline]
            pub fn expires_at(&self, limits: &Limits) -> u64 {
                match self {
                    $(AnyState::$variant(s) => <$alg>::expires_at(s, limits),)*
                }
            }
        }

        /// The store-side facts of `algorithm`.
        #[cfg_attr(not(feature = "redis"), allow(dead_code))]
        pub(crate) const fn registration(algorithm: Algorithm) -> &'static Registration {
            match algorithm {
                $(Algorithm::$variant => {
                    const R: Registration = Registration {
                        script_id: $id,
                        key_part: $part,
                        lua: include_str!(concat!("../../lua/", $lua)),
                    };
                    &R
                })*
            }
        }
    };
}

impl AnyState {
    /// Brings a token bucket's state to `now` under `limits` (the refill since its last
    /// charge put in at `limits`' rate), before a per-key override changes the rate it is
    /// read under; any other state is left as it is (their usage does not depend on a rate
    /// over time: GCRA keeps its debt as time, the windows count units).
    pub(crate) fn catch_up(&mut self, now: u64, limits: &Limits) {
        if let AnyState::TokenBucket(s) = self {
            TokenBucket::catch_up(s, now, limits);
        }
    }
}

algorithms! {
    /// A [sliding window counter](sliding_window_counter) state.
    SlidingWindowCounter(SlidingWindowCounterState) => SlidingWindowCounter,
        id 1, key "swc", lua "sliding_window_counter.lua";
    /// A [sliding window log](sliding_window_log) state (boxed: it holds a list).
    SlidingWindowLog(Box<SlidingWindowLogState>) => SlidingWindowLog,
        id 2, key "swl", lua "sliding_window_log.lua";
    /// A [token bucket](token_bucket) state.
    TokenBucket(TokenBucketState) => TokenBucket,
        id 3, key "tb", lua "token_bucket.lua";
    /// A [fixed window](fixed_window) state.
    FixedWindow(FixedWindowState) => FixedWindow,
        id 4, key "fw", lua "fixed_window.lua";
    /// A [GCRA](gcra) state.
    Gcra(GcraState) => Gcra,
        id 5, key "gcra", lua "gcra.lua";
    /// An [in-flight](in_flight) state.
    InFlight(InFlightState) => InFlight,
        id 6, key "inf", lua "in_flight.lua";
}

#[cfg(test)]
mod tests;
