//! The conformance matrix: a reference model of every store operation, random traces of those
//! operations, and the harness that runs one trace through one store and the model in
//! lockstep (used by `tests/conformance.rs` only).
//!
//! **The model** is written from the algorithms' pure functions
//! (`tollgate::algorithm::{SlidingWindowCounter, …, InFlight}` through `AnyState`), one state
//! per (key, policy name, algorithm), with the rules every store documents on top: a request
//! is decided all or nothing over its policies (a denied one charges nothing, and the
//! policies that would have allowed it report their state at cost 0); a refund gives back to
//! an existing state and never touches in-flight slots; a settlement refunds the difference
//! or overcharges it as a debt (each algorithm's `overcharge` saturates it at its stated
//! cap); an in-flight slot is held until released by the request that took it (and,
//! where slots are leased, until its lease ends unless refreshed); a per-key override
//! replaces a policy's limit and capacity (never its window or shaping) until it is removed
//! or expires; a reset forgets the states of the policies it names, and the slots held under
//! them, so a permit from before it releases nothing.
//!
//! The model also checks the retry contract of each rate algorithm on its own answers: a
//! request denied with `retry_after = r` passes at `now + r` and not at `now + r − 1`, if
//! nothing else arrives.
//!
//! **Traces** are random sequences of operations ([`Op`]) over two keys and a plan of one to
//! three policies, with time advancing by random steps through a manual clock shared by the
//! model and the store. Every operation that changes state without answering (refund,
//! settle, release, refresh, override, reset) is followed by a peek of every policy on its
//! key, so that a difference shows at the step that caused it.
//!
//! **Rows** ([`RowSpec`]) say how a store is compared: [`Mode::Exact`] requires the model's
//! answer; [`Mode::DenyCache`] and [`Mode::Leased`] assert the bounds their modules state.
//! Known discrepancies are skipped or tolerated through a list of [`Known`] entries kept in
//! the test file.

// Parts of the harness (accessors of the model, row and call facts) exist for the
// known-discrepancy predicates, which come and go as fixes land.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;
use tollgate::store::StoreExt;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tollgate::algorithm::{
    AnyState, InFlight, InFlightState, LimitAlgorithm, Limits, PolicyDecision,
};
use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::{BoxFuture, Store};
use tollgate::{Algorithm, DecidedBy, Decision, Policy, Rate, StoreError};

/// The keys a trace uses.
pub const KEYS: u8 = 2;

/// The most policies a plan holds.
pub const MAX_POLICIES: usize = 3;

// ---------------------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------------------

/// One policy of a plan, as plain numbers (a `Policy` is built from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// `p0`, `p1` or `p2`: the position in the plan.
    pub index: u8,
    pub algorithm: Algorithm,
    pub limit: u64,
    /// The window, or the slot lease of an in-flight policy.
    pub window_ms: u64,
    pub burst: Option<u64>,
    pub max_delay_ms: Option<u64>,
}

impl Spec {
    pub fn name(&self) -> String {
        format!("p{}", self.index)
    }

    pub fn policy(&self) -> Policy {
        let mut rate = Rate::new(self.limit, Duration::from_millis(self.window_ms));
        if let Some(b) = self.burst {
            rate = rate.with_burst(b);
        }
        let mut b = Policy::builder(self.name(), rate).algorithm(self.algorithm);
        if let Some(d) = self.max_delay_ms {
            b = b.shape(Duration::from_millis(d));
        }
        b.build()
            .unwrap_or_else(|e| panic!("invalid spec {self:?}: {e}"))
    }
}

/// The numbers a spec is drawn from, whatever its algorithm turns out to be (a reload may
/// keep the algorithm or switch to another rate algorithm).
#[derive(Debug, Clone, Copy)]
pub struct SpecGen {
    pub limit: u64,
    pub window: u8,
    pub burst: Option<u64>,
    pub max_delay_ms: Option<u64>,
    /// A policy at the 2^50 bound of capacity × window (where the algorithm allows it).
    pub huge: bool,
    /// For a reload of a rate policy: switch to this rate algorithm.
    pub switch_to: Option<Algorithm>,
}

const RATE_WINDOWS_MS: [u64; 6] = [200, 1_000, 1_000, 1_500, 3_000, 10_000];
const LEASES_MS: [u64; 4] = [300, 1_000, 2_000, 30_000];
const DAY_MS: u64 = 86_400_000;

impl SpecGen {
    pub fn spec(&self, index: u8, algorithm: Algorithm) -> Spec {
        let window = usize::from(self.window);
        let rate_window = RATE_WINDOWS_MS[window % RATE_WINDOWS_MS.len()];
        let (limit, window_ms, burst) = match algorithm {
            Algorithm::InFlight => (self.limit.min(4), LEASES_MS[window % LEASES_MS.len()], None),
            Algorithm::SlidingWindowLog => (self.limit, rate_window, None),
            Algorithm::SlidingWindowCounter | Algorithm::FixedWindow if self.huge => {
                (13_000_000, DAY_MS, None)
            }
            Algorithm::TokenBucket if self.huge => (997, DAY_MS, Some(13_000_000)),
            Algorithm::Gcra if self.huge => (12_999_991, DAY_MS, Some(13_000_000)),
            Algorithm::TokenBucket | Algorithm::Gcra => (self.limit, rate_window, self.burst),
            _ => (self.limit, rate_window, None),
        };
        let max_delay_ms = if algorithm == Algorithm::Gcra {
            self.max_delay_ms
        } else {
            None
        };
        Spec {
            index,
            algorithm,
            limit,
            window_ms,
            burst,
            max_delay_ms,
        }
    }
}

fn spec_gen() -> impl Strategy<Value = SpecGen> {
    (
        prop_oneof![4 => 1u64..=3, 4 => 1u64..=8],
        any::<u8>(),
        prop_oneof![1 => Just(None), 1 => (1u64..=10).prop_map(Some)],
        prop_oneof![3 => Just(None), 1 => (50u64..=1_000).prop_map(Some)],
        prop_oneof![9 => Just(false), 1 => Just(true)],
        prop_oneof![
            4 => Just(None),
            1 => proptest::sample::select(Algorithm::RATES.to_vec()).prop_map(Some),
        ],
    )
        .prop_map(
            |(limit, window, burst, max_delay_ms, huge, switch_to)| SpecGen {
                limit,
                window,
                burst,
                max_delay_ms,
                huge,
                switch_to,
            },
        )
}

/// A plan of one to three policies, the first of algorithm `primary`.
pub fn plan(primary: Algorithm) -> impl Strategy<Value = Vec<Spec>> {
    (
        spec_gen(),
        prop::collection::vec(
            (
                proptest::sample::select(Algorithm::ALL.to_vec()),
                spec_gen(),
            ),
            0..MAX_POLICIES,
        ),
    )
        .prop_map(move |(first, rest)| {
            let mut specs = vec![first.spec(0, primary)];
            for (i, (a, g)) in rest.into_iter().enumerate() {
                specs.push(g.spec(i as u8 + 1, a));
            }
            specs
        })
}

// ---------------------------------------------------------------------------------------
// Traces
// ---------------------------------------------------------------------------------------

/// A cost, resolved against the capacity of the policy in the plan when the step runs (the
/// limiter never sends a store more than that).
#[derive(Debug, Clone, Copy)]
pub enum Units {
    Zero,
    One,
    Few(u8),
    Half,
    Cap,
}

impl Units {
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Units::Zero => 0,
            Units::One => 1.min(capacity),
            Units::Few(n) => u64::from(n).min(capacity),
            Units::Half => (capacity / 2).clamp(1, capacity),
            Units::Cap => capacity,
        }
    }
}

fn units() -> impl Strategy<Value = Units> {
    prop_oneof![
        1 => Just(Units::Zero),
        8 => Just(Units::One),
        4 => (2u8..=4).prop_map(Units::Few),
        1 => Just(Units::Half),
        2 => Just(Units::Cap),
    ]
}

/// What a refund gives back.
#[derive(Debug, Clone, Copy)]
pub enum Back {
    Units(Units),
    Max,
}

impl Back {
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Back::Units(u) => u.of(capacity),
            Back::Max => u64::MAX,
        }
    }
}

fn back() -> impl Strategy<Value = Back> {
    prop_oneof![9 => units().prop_map(Back::Units), 1 => Just(Back::Max)]
}

/// The actual cost of a settlement, from the reservation and the capacity.
#[derive(Debug, Clone, Copy)]
pub enum Actual {
    Zero,
    Less(u8),
    Same,
    More(u8),
    TwiceCap,
    Million,
    /// 2^53 + 1: the first integer a double cannot hold.
    Above53,
    /// 2^63 − 1, 2^63, 2^63 + the reservation: where a signed difference overflows.
    Below63,
    At63,
    Above63PlusReserved,
    MaxMinusOne,
    Max,
}

impl Actual {
    pub fn of(self, reserved: u64, capacity: u64) -> u64 {
        const B63: u64 = 1 << 63;
        match self {
            Actual::Zero => 0,
            Actual::Less(d) => reserved.saturating_sub(u64::from(d)),
            Actual::Same => reserved,
            Actual::More(d) => reserved + u64::from(d),
            Actual::TwiceCap => 2 * capacity,
            Actual::Million => 1_000_000,
            Actual::Above53 => (1 << 53) + 1,
            Actual::Below63 => B63 - 1,
            Actual::At63 => B63,
            Actual::Above63PlusReserved => B63 + reserved,
            Actual::MaxMinusOne => u64::MAX - 1,
            Actual::Max => u64::MAX,
        }
    }
}

fn actual() -> impl Strategy<Value = Actual> {
    prop_oneof![
        3 => Just(Actual::Zero),
        4 => (1u8..=3).prop_map(Actual::Less),
        2 => Just(Actual::Same),
        6 => (1u8..=6).prop_map(Actual::More),
        2 => Just(Actual::TwiceCap),
        1 => Just(Actual::Million),
        1 => Just(Actual::Above53),
        1 => Just(Actual::Below63),
        1 => Just(Actual::At63),
        1 => Just(Actual::Above63PlusReserved),
        1 => Just(Actual::MaxMinusOne),
        1 => Just(Actual::Max),
    ]
}

/// An override's number: small, or a multiple (in halves) of the plan's.
#[derive(Debug, Clone, Copy)]
pub enum Scale {
    Small(u8),
    Halves(u8),
}

impl Scale {
    pub fn of(self, plan: u64) -> u64 {
        match self {
            Scale::Small(n) => u64::from(n).max(1),
            Scale::Halves(h) => (plan.saturating_mul(u64::from(h)) / 2).max(1),
        }
    }
}

fn scale() -> impl Strategy<Value = Scale> {
    prop_oneof![
        3 => (1u8..=10).prop_map(Scale::Small),
        2 => (1u8..=4).prop_map(Scale::Halves),
    ]
}

/// One operation of a trace. `sel` picks a non-empty subset of the plan's policies,
/// `policy` one of them, `pick` one of the permits not yet released (modulo their number).
#[derive(Debug, Clone)]
pub enum Op {
    /// `Store::check` of the drawn costs, which an in-flight policy gets too (it takes one
    /// slot whatever the cost); an admitted request holding slots becomes a permit.
    Check {
        key: u8,
        sel: u8,
        costs: [Units; MAX_POLICIES],
    },
    /// `Store::peek` of the drawn costs: an in-flight policy asks one slot, or none for a
    /// cost of 0.
    Peek {
        key: u8,
        sel: u8,
        costs: [Units; MAX_POLICIES],
    },
    /// `Store::refund`; with `fallback`, wrapped in `store::Op::Fallback` (the give-back of
    /// a request a local fallback admitted), of which a store applies nothing.
    Refund {
        key: u8,
        sel: u8,
        costs: [Back; MAX_POLICIES],
        fallback: bool,
    },
    /// `Store::settle` of the rate policies among `sel` (in-flight ones are never settled);
    /// with `fallback`, wrapped in `store::Op::Fallback`, of which a store applies only what
    /// is charged above the reservation.
    Settle {
        key: u8,
        sel: u8,
        reserved: [Units; MAX_POLICIES],
        actual: [Actual; MAX_POLICIES],
        fallback: bool,
    },
    /// `Store::release` of a permit's slot (once per permit, as a `Permit` drop does).
    Release {
        pick: u8,
    },
    /// `Store::refresh` of a permit's slot.
    Refresh {
        pick: u8,
    },
    SetOverride {
        key: u8,
        policy: u8,
        limit: Scale,
        burst: Option<Scale>,
        /// Expires after this many ms (`None`: until removed).
        ttl: Option<u16>,
    },
    RemoveOverride {
        key: u8,
        policy: u8,
    },
    /// The plan's policy is replaced by another with the same name (a reload): the store
    /// is asked with the new `Policy` from then on.
    Reload {
        policy: u8,
        spec: SpecGen,
    },
    Reset {
        key: u8,
        sel: u8,
    },
}

/// One step: time advances by `dt` ms, then `op` runs.
#[derive(Debug, Clone)]
pub struct Step {
    pub dt: u64,
    pub op: Op,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let costs = || [units(), units(), units()];
    prop_oneof![
        30 => (key.clone(), any::<u8>(), costs())
            .prop_map(|(key, sel, costs)| Op::Check { key, sel, costs }),
        10 => (key.clone(), any::<u8>(), costs())
            .prop_map(|(key, sel, costs)| Op::Peek { key, sel, costs }),
        7 => (key.clone(), any::<u8>(), [back(), back(), back()], prop::bool::weighted(0.25))
            .prop_map(|(key, sel, costs, fallback)| Op::Refund { key, sel, costs, fallback }),
        9 => (
            key.clone(),
            any::<u8>(),
            costs(),
            [actual(), actual(), actual()],
            prop::bool::weighted(0.25),
        )
            .prop_map(|(key, sel, reserved, actual, fallback)| Op::Settle {
                key,
                sel,
                reserved,
                actual,
                fallback,
            }),
        9 => any::<u8>().prop_map(|pick| Op::Release { pick }),
        3 => any::<u8>().prop_map(|pick| Op::Refresh { pick }),
        6 => (
            key.clone(),
            any::<u8>(),
            scale(),
            prop_oneof![1 => Just(None), 1 => scale().prop_map(Some)],
            prop_oneof![3 => Just(None), 2 => (1u16..=600).prop_map(Some)],
        )
            .prop_map(|(key, policy, limit, burst, ttl)| Op::SetOverride {
                key,
                policy,
                limit,
                burst,
                ttl,
            }),
        2 => (key.clone(), any::<u8>())
            .prop_map(|(key, policy)| Op::RemoveOverride { key, policy }),
        3 => (any::<u8>(), spec_gen()).prop_map(|(policy, spec)| Op::Reload { policy, spec }),
        2 => (key, any::<u8>()).prop_map(|(key, sel)| Op::Reset { key, sel }),
    ]
}

fn dt() -> impl Strategy<Value = u64> {
    prop_oneof![
        30 => Just(0u64),
        60 => 1u64..250,
        8 => 250u64..3_000,
        2 => 3_000u64..200_000,
    ]
}

/// A random trace of `len` steps.
pub fn trace(len: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((dt(), op()).prop_map(|(dt, op)| Step { dt, op }), len)
}

/// One case: a plan, a start time and a trace.
#[derive(Debug, Clone)]
pub struct Case {
    pub plan: Vec<Spec>,
    pub start: u64,
    pub steps: Vec<Step>,
}

/// Cases whose plan starts with a policy of `primary`, with up to `max_len` steps.
pub fn cases(primary: Algorithm, max_len: usize) -> impl Strategy<Value = Case> {
    (plan(primary), 0u64..100_000, trace(1..=max_len)).prop_map(|(plan, offset, steps)| Case {
        plan,
        start: 1_700_000_000_000 + offset,
        steps,
    })
}

// ---------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct StateKey {
    key: u8,
    name: String,
    /// `Algorithm::as_str`.
    algorithm: &'static str,
}

fn state_key(key: u8, p: &Policy) -> StateKey {
    StateKey {
        key,
        name: p.name().to_owned(),
        algorithm: p.algorithm().as_str(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    permit: usize,
    lease_end: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Over {
    limit: u64,
    capacity: u64,
    expires: Option<u64>,
    /// The window and longest delay of the plan's policy when the override was set (not
    /// part of the override; kept for the known-discrepancy list).
    window_ms: u64,
    max_delay_ms: u64,
}

/// The reference model; see the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// Whether a slot is held only until its lease ends unless refreshed (Redis), rather
    /// than until it is released (memory).
    leases: bool,
    states: BTreeMap<StateKey, AnyState>,
    /// The limits each state was last changed under (for the known-discrepancy list).
    written: BTreeMap<StateKey, Limits>,
    /// Per sliding window log: entries logged at or before this time may have been dropped
    /// by a store, as out of the window in force when it last read the log.
    log_horizon: BTreeMap<StateKey, u64>,
    slots: BTreeMap<(u8, String), Vec<Held>>,
    overrides: BTreeMap<StateKey, Over>,
    /// The (key, policy name) pairs an override was ever set on in this case.
    overridden: std::collections::BTreeSet<(u8, String)>,
}

/// `p` with another limit and capacity, keeping its window and shaping: what an override
/// in force makes of a plan's policy.
pub fn with_numbers(
    p: &Policy,
    limit: u64,
    capacity: u64,
) -> Result<Policy, tollgate::ConfigError> {
    let mut rate = Rate::new(limit, Duration::from_millis(p.window_millis()));
    if p.algorithm().has_burst() {
        rate = rate.with_burst(capacity);
    }
    let mut b = Policy::builder(p.name(), rate).algorithm(p.algorithm());
    if let Some(d) = p.max_delay() {
        b = b.shape(d);
    }
    b.build()
}

impl Model {
    pub fn new(leases: bool) -> Self {
        Self {
            leases,
            ..Self::default()
        }
    }

    /// The override of `p` on `key` in force at `now`, as (limit, capacity).
    /// Whether an override was ever set on `p` (by name) for `key` in this case.
    pub fn ever_overridden(&self, key: u8, p: &Policy) -> bool {
        self.overridden.contains(&(key, p.name().to_owned()))
    }

    pub fn override_of(&self, key: u8, p: &Policy, now: u64) -> Option<(u64, u64)> {
        self.overrides
            .get(&state_key(key, p))
            .filter(|o| o.expires.is_none_or(|e| e > now))
            .map(|o| (o.limit, o.capacity))
    }

    /// The window and longest delay `p` had when the override of it in force on `key` was
    /// set.
    pub fn override_set_with(&self, key: u8, p: &Policy, now: u64) -> Option<(u64, u64)> {
        self.overrides
            .get(&state_key(key, p))
            .filter(|o| o.expires.is_none_or(|e| e > now))
            .map(|o| (o.window_ms, o.max_delay_ms))
    }

    /// Whether an override of `p` on `key` has ended by `now` (by its TTL).
    pub fn override_ended(&self, key: u8, p: &Policy, now: u64) -> bool {
        self.overrides
            .get(&state_key(key, p))
            .is_some_and(|o| o.expires.is_some_and(|e| e <= now))
    }

    /// Whether `key`'s GCRA state of `p`, read at `now` under the limits in force, holds a
    /// backlog (`(tat − now) · limit`, in `1/limit` ms) past `u64::MAX / 4`.
    pub fn gcra_backlog_past_u64(&self, key: u8, p: &Policy, now: u64) -> bool {
        let Some(AnyState::Gcra(s)) = self.states.get(&state_key(key, p)) else {
            return false;
        };
        let n = u128::from(self.effective(key, p, now).limit());
        let ahead = u128::from(s.tat().saturating_sub(now));
        (ahead + 1) * n > u128::from(u64::MAX / 4)
    }

    /// When `key`'s state of `p` stops mattering under the limits in force at `now`.
    pub fn expiry(&self, key: u8, p: &Policy, now: u64) -> Option<u64> {
        let eff = self.effective(key, p, now);
        self.states
            .get(&state_key(key, p))
            .map(|s| s.expires_at(eff.limits()))
    }

    /// Notes that a store read `key`'s state of `p` at `now` under `eff`'s window (a log
    /// drops the entries that left it).
    fn touch(&mut self, key: u8, p: &Policy, eff: &Policy, now: u64) {
        if p.algorithm() == Algorithm::SlidingWindowLog {
            let h = self.log_horizon.entry(state_key(key, p)).or_insert(0);
            *h = (*h).max(now.saturating_sub(eff.window_millis()));
        }
    }

    /// Whether `key`'s log of `p` holds an entry that still counts at `now` but that a store
    /// may have dropped when it left a shorter window in force before.
    pub fn log_entry_dropped_under_a_shorter_window(&self, key: u8, p: &Policy, now: u64) -> bool {
        let k = state_key(key, p);
        let (Some(AnyState::SlidingWindowLog(log)), Some(&horizon)) =
            (self.states.get(&k), self.log_horizon.get(&k))
        else {
            return false;
        };
        let w = p.window_millis();
        log.entries()
            .any(|(t, c)| c > 0 && t <= horizon && t + w > now)
    }

    /// Whether `key` holds a state of `p`'s name under another algorithm than `p`'s.
    pub fn holds_another_algorithm(&self, key: u8, p: &Policy) -> bool {
        self.states
            .keys()
            .any(|k| k.key == key && k.name == p.name() && k.algorithm != p.algorithm().as_str())
    }

    /// The limits `key`'s state of `p` was last changed under, if it has one.
    pub fn written_under(&self, key: u8, p: &Policy) -> Option<Limits> {
        self.written.get(&state_key(key, p)).copied()
    }

    /// `p` as it decides `key` at `now`: with the override in force, if any.
    pub fn effective(&self, key: u8, p: &Policy, now: u64) -> Policy {
        match self.override_of(key, p, now) {
            Some((limit, capacity)) => with_numbers(p, limit, capacity)
                .unwrap_or_else(|e| panic!("override of {p:?} to {limit}/{capacity}: {e}")),
            None => p.clone(),
        }
    }

    /// The slots of `p` held on `key` at `now`.
    pub fn live(&self, key: u8, p: &Policy, now: u64) -> u64 {
        self.slots
            .get(&(key, p.name().to_owned()))
            .map_or(0, |held| {
                held.iter()
                    .filter(|h| !self.leases || h.lease_end > now)
                    .count() as u64
            })
    }

    /// Whether `permit`'s slot under `p` is still held at `now`.
    pub fn holds(&self, key: u8, p: &Policy, permit: usize, now: u64) -> bool {
        self.slots
            .get(&(key, p.name().to_owned()))
            .is_some_and(|held| {
                held.iter()
                    .any(|h| h.permit == permit && (!self.leases || h.lease_end > now))
            })
    }

    fn evaluate(&self, key: u8, p: &Policy, eff: &Policy, now: u64, cost: u64) -> PolicyDecision {
        if p.is_in_flight() {
            let mut s = InFlightState::default();
            InFlight::commit(&mut s, now, eff.limits(), self.live(key, p, now));
            InFlight::evaluate(&s, now, eff.limits(), cost)
        } else {
            match self.states.get(&state_key(key, p)) {
                Some(s) => s.evaluate(now, eff.limits(), cost),
                None => AnyState::fresh(p.algorithm()).evaluate(now, eff.limits(), cost),
            }
        }
    }

    /// The retry contract of a rate algorithm's denial: the same request passes at
    /// `now + retry_after` and not a millisecond before, if nothing else arrives.
    fn check_retry(
        &self,
        key: u8,
        p: &Policy,
        eff: &Policy,
        now: u64,
        cost: u64,
        d: &PolicyDecision,
    ) -> Result<(), String> {
        if d.is_allowed() || p.is_in_flight() || cost > eff.capacity() {
            return Ok(());
        }
        let r = d.retry_after_millis();
        let at = self.evaluate(key, p, eff, now + r, cost);
        let before = self.evaluate(key, p, eff, now + r - 1, cost);
        if at.is_allowed() && (r == 1 || !before.is_allowed()) {
            return Ok(());
        }
        Err(format!(
            "retry contract broken by the model's own algorithm: {} ({:?}, limit {}, capacity {}) \
             denies cost {cost} at {now} with retry_after {r} ms, but at +{r} it is {} and at +{} it is {} \
             (state {:?})",
            p.name(),
            p.algorithm(),
            eff.limit(),
            eff.capacity(),
            if at.is_allowed() { "allowed" } else { "denied" },
            r - 1,
            if before.is_allowed() { "allowed" } else { "denied" },
            self.states.get(&state_key(key, p)),
        ))
    }

    /// Decides a request at `now`, all or nothing; with `charge`, an admitted request is
    /// charged (an in-flight policy takes a slot for `permit`). `Err` when, with
    /// `contract`, the model's own algorithm breaks its retry contract.
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &mut self,
        key: u8,
        policies: &[Policy],
        costs: &[u64],
        now: u64,
        charge: bool,
        permit: usize,
        contract: bool,
    ) -> Result<Decision, String> {
        let eff: Vec<Policy> = policies
            .iter()
            .map(|p| self.effective(key, p, now))
            .collect();
        let mut ds: Vec<PolicyDecision> = Vec::with_capacity(policies.len());
        for (p, e) in policies.iter().zip(&eff) {
            self.touch(key, p, e, now);
        }
        for ((p, e), &c) in policies.iter().zip(&eff).zip(costs) {
            let d = self.evaluate(key, p, e, now, c);
            if contract {
                self.check_retry(key, p, e, now, c, &d)?;
            }
            ds.push(d);
        }
        if ds.iter().any(|d| !d.is_allowed()) {
            for ((d, (p, e)), _) in ds.iter_mut().zip(policies.iter().zip(&eff)).zip(costs) {
                if d.is_allowed() {
                    *d = self.evaluate(key, p, e, now, 0);
                }
            }
        } else if charge {
            for ((p, e), &c) in policies.iter().zip(&eff).zip(costs) {
                if p.is_in_flight() {
                    if c > 0 {
                        self.slots
                            .entry((key, p.name().to_owned()))
                            .or_default()
                            .push(Held {
                                permit,
                                lease_end: now + p.window_millis(),
                            });
                    }
                } else {
                    self.states
                        .entry(state_key(key, p))
                        .or_insert_with(|| AnyState::fresh(p.algorithm()))
                        .commit(now, e.limits(), c);
                    self.written.insert(state_key(key, p), *e.limits());
                }
            }
        }
        Ok(Decision::from_policies(ds))
    }

    /// Charges an admitted request the model would have refused (a tolerated over-admission
    /// of a bound row), so that its state counts what was admitted.
    pub fn force_commit(&mut self, key: u8, policies: &[Policy], costs: &[u64], now: u64) {
        for (p, &c) in policies.iter().zip(costs) {
            if p.is_in_flight() {
                continue;
            }
            let eff = self.effective(key, p, now);
            self.states
                .entry(state_key(key, p))
                .or_insert_with(|| AnyState::fresh(p.algorithm()))
                .commit(now, eff.limits(), c);
            self.written.insert(state_key(key, p), *eff.limits());
        }
    }

    /// Gives back up to each cost to the key's existing states; in-flight slots are never
    /// refunded (a slot comes back by its release only).
    pub fn refund(&mut self, key: u8, policies: &[Policy], costs: &[u64], now: u64) {
        for (p, &c) in policies.iter().zip(costs) {
            if p.is_in_flight() {
                continue;
            }
            let eff = self.effective(key, p, now);
            self.touch(key, p, &eff, now);
            if c > 0 {
                if let Some(s) = self.states.get_mut(&state_key(key, p)) {
                    s.refund(now, eff.limits(), c);
                    self.written.insert(state_key(key, p), *eff.limits());
                }
            }
        }
    }

    /// Settles rate policies: refunds what was reserved above the actual cost, overcharges
    /// what it exceeds it by: a debt, which each algorithm's `overcharge` saturates at its
    /// stated cap.
    pub fn settle(
        &mut self,
        key: u8,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
        now: u64,
    ) {
        for ((p, &r), &a) in policies.iter().zip(reserved).zip(actual) {
            assert!(!p.is_in_flight(), "in-flight policies are never settled");
            let eff = self.effective(key, p, now);
            self.touch(key, p, &eff, now);
            let back = r.saturating_sub(a);
            let extra = a.saturating_sub(r);
            if back > 0 {
                if let Some(s) = self.states.get_mut(&state_key(key, p)) {
                    s.refund(now, eff.limits(), back);
                    self.written.insert(state_key(key, p), *eff.limits());
                }
            }
            if extra > 0 {
                self.states
                    .entry(state_key(key, p))
                    .or_insert_with(|| AnyState::fresh(p.algorithm()))
                    .overcharge(now, eff.limits(), extra);
                self.written.insert(state_key(key, p), *eff.limits());
            }
        }
    }

    /// Gives back `permit`'s slot under each of `policies`, if it still holds one.
    pub fn release(&mut self, key: u8, policies: &[Policy], permit: usize) {
        for p in policies {
            if let Some(held) = self.slots.get_mut(&(key, p.name().to_owned())) {
                held.retain(|h| h.permit != permit);
            }
        }
    }

    /// Extends the lease of `permit`'s slots that are still held (leased slots only).
    pub fn refresh(&mut self, key: u8, policies: &[Policy], permit: usize, now: u64) {
        if !self.leases {
            return;
        }
        for p in policies {
            if let Some(held) = self.slots.get_mut(&(key, p.name().to_owned())) {
                for h in held.iter_mut() {
                    if h.permit == permit && h.lease_end > now {
                        h.lease_end = now + p.window_millis();
                    }
                }
            }
        }
    }

    /// Forgets the key's states and slots under these policies' names (any algorithm).
    pub fn reset(&mut self, key: u8, policies: &[Policy]) {
        for p in policies {
            self.states
                .retain(|k, _| !(k.key == key && k.name == p.name()));
            self.written
                .retain(|k, _| !(k.key == key && k.name == p.name()));
            self.log_horizon
                .retain(|k, _| !(k.key == key && k.name == p.name()));
            self.slots.remove(&(key, p.name().to_owned()));
        }
    }

    pub fn set_override(
        &mut self,
        key: u8,
        p: &Policy,
        limit: u64,
        capacity: u64,
        ttl: Option<u64>,
        now: u64,
    ) {
        self.catch_up(key, p, now);
        self.overridden.insert((key, p.name().to_owned()));
        self.overrides.insert(
            state_key(key, p),
            Over {
                limit,
                capacity,
                expires: ttl.map(|t| now + t),
                window_ms: p.window_millis(),
                max_delay_ms: p.limits().max_delay_millis(),
            },
        );
    }

    pub fn remove_override(&mut self, key: u8, p: &Policy, now: u64) {
        self.catch_up(key, p, now);
        self.overrides.remove(&state_key(key, p));
    }

    /// A token bucket whose rate is about to change (an override set or removed) is brought
    /// to `now` at the rate in force until then, as the stores do: the time before the
    /// change refills at the old rate. A charge of 0 is exactly that catch-up.
    fn catch_up(&mut self, key: u8, p: &Policy, now: u64) {
        if p.algorithm() != Algorithm::TokenBucket {
            return;
        }
        let eff = self.effective(key, p, now);
        if let Some(state) = self.states.get_mut(&state_key(key, p)) {
            state.commit(now, eff.limits(), 0);
        }
    }

    /// A short account of the key's states, slots and overrides, for failure messages.
    pub fn describe(&self, key: u8) -> String {
        let mut s = String::new();
        for (k, v) in self.states.iter().filter(|(k, _)| k.key == key) {
            let _ = write!(s, "\n    state {}/{}: {v:?}", k.name, k.algorithm);
        }
        for ((k, name), held) in self.slots.iter().filter(|((k, _), _)| *k == key) {
            let _ = write!(s, "\n    slots {name} (key {k}): {held:?}");
        }
        for (k, o) in self.overrides.iter().filter(|(k, _)| k.key == key) {
            let _ = write!(s, "\n    override {}/{}: {o:?}", k.name, k.algorithm);
        }
        s
    }
}

// ---------------------------------------------------------------------------------------
// Rows, calls and the list of known discrepancies
// ---------------------------------------------------------------------------------------

/// How a row's answers are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every answer equals the model's.
    Exact,
    /// A `ResilientStore` deny cache: a cached denial (`DecidedBy::CachedDeny`) is one the
    /// model also gives, with a `retry_after` no longer than the model's (the cache counts
    /// the store's own down); every other answer equals the model's.
    DenyCache,
    /// A `LeasedStore`: every request it admits is one the exact model, fed the same
    /// admissions, would admit (zero over-admission); requests of non-leasable policies only
    /// (in-flight, shaping GCRA) are decided exactly.
    Leased,
}

/// One row of the matrix: a store and how it is compared.
#[derive(Debug, Clone)]
pub struct RowSpec {
    pub name: &'static str,
    pub mode: Mode,
    /// Slots are leased and expire unless refreshed (Redis); in memory they are held until
    /// released.
    pub slot_leases: bool,
    /// The store counts in-flight slots rather than naming them (the memory store).
    pub anonymous_slots: bool,
    /// Decisions are sent in coalesced batches (Redis, `max_in_flight(1)`): each group of
    /// operations at one instant goes behind a blocking call, each followed by a peek of
    /// another key, so every one of them runs in `decide.lua`.
    pub batched: bool,
    /// Overrides live in Redis, with real-time TTLs (see [`run`]).
    pub redis_overrides: bool,
    /// The row's state lives in Redis (for the known-discrepancy list).
    pub redis: bool,
}

/// A call to a store, resolved from an [`Op`] against the plan, the model and the permits.
#[derive(Debug, Clone)]
pub enum Call {
    Check {
        key: u8,
        policies: Vec<Policy>,
        costs: Vec<u64>,
    },
    Peek {
        key: u8,
        policies: Vec<Policy>,
        costs: Vec<u64>,
    },
    /// A peek of every policy of the plan at cost 1, after an operation that answers
    /// nothing.
    Observe {
        key: u8,
        policies: Vec<Policy>,
        costs: Vec<u64>,
    },
    Refund {
        key: u8,
        policies: Vec<Policy>,
        costs: Vec<u64>,
        fallback: bool,
    },
    Settle {
        key: u8,
        policies: Vec<Policy>,
        reserved: Vec<u64>,
        actual: Vec<u64>,
        fallback: bool,
    },
    Release {
        permit: usize,
    },
    Refresh {
        permit: usize,
    },
    SetOverride {
        key: u8,
        plan: Policy,
        overriding: Policy,
        ttl: Option<u64>,
    },
    RemoveOverride {
        key: u8,
        plan: Policy,
    },
    Reload {
        index: usize,
        spec: Spec,
    },
    Reset {
        key: u8,
        policies: Vec<Policy>,
    },
}

impl Call {
    /// The key the call is about, if any.
    pub fn key(&self) -> Option<u8> {
        match self {
            Call::Check { key, .. }
            | Call::Peek { key, .. }
            | Call::Observe { key, .. }
            | Call::Refund { key, .. }
            | Call::Settle { key, .. }
            | Call::SetOverride { key, .. }
            | Call::RemoveOverride { key, .. }
            | Call::Reset { key, .. } => Some(*key),
            _ => None,
        }
    }

    /// Its policies, with their costs (or reserved and actual), if it names some.
    pub fn policies(&self) -> &[Policy] {
        match self {
            Call::Check { policies, .. }
            | Call::Peek { policies, .. }
            | Call::Observe { policies, .. }
            | Call::Refund { policies, .. }
            | Call::Settle { policies, .. }
            | Call::Reset { policies, .. } => policies,
            _ => &[],
        }
    }

    /// Whether a Redis store sends it through its batched script calls.
    fn decides(&self) -> bool {
        matches!(
            self,
            Call::Check { .. }
                | Call::Peek { .. }
                | Call::Observe { .. }
                | Call::Refund { .. }
                | Call::Settle { .. }
                | Call::Release { .. }
                | Call::Refresh { .. }
        )
    }
}

/// `op` as the give-back of a request a local fallback admitted.
fn fallback_op(op: tollgate::store::Op) -> tollgate::store::Op {
    tollgate::store::Op::Fallback { op: Box::new(op) }
}

/// A give-back's outcome, whatever the store answered.
fn given_back_by_fallback(call: tollgate::store::ApplyFuture) -> BoxFuture<Result<(), StoreError>> {
    Box::pin(async move { call.await.map(|_| ()) })
}

/// The costs the model decides for a store's: an in-flight policy asks one slot of a check
/// whatever its cost, and of a look one slot if it costs anything (none at cost 0).
fn slots_asked(policies: &[Policy], costs: &[u64], check: bool) -> Vec<u64> {
    policies
        .iter()
        .zip(costs)
        .map(|(p, &c)| {
            if p.is_in_flight() {
                u64::from(check || c > 0)
            } else {
                c
            }
        })
        .collect()
}

/// A request admitted while holding in-flight slots, until released.
#[derive(Debug, Clone)]
pub struct Permit {
    pub key: u8,
    /// The in-flight policies of the request, as they were when it was admitted (a permit
    /// releases with those).
    pub policies: Vec<Policy>,
    /// The slot the store named (0 for stores that count slots).
    pub slot: u64,
    /// The store has answered (in a batch, the slot is known only then).
    pub known: bool,
    pub released: bool,
}

/// What a known-discrepancy entry sees of a call before (or after) it runs.
pub struct Ctx<'a> {
    pub row: &'a RowSpec,
    pub call: &'a Call,
    pub model: &'a Model,
    pub now: u64,
    pub permits: &'a [Permit],
    /// The policies a reload replaced so far in the case: (name, when).
    pub reloaded: &'a [(String, u64)],
    /// Settlements that charged extra units: (key, policy name, when, and when the state
    /// they left stops mattering).
    pub overcharged: &'a [(u8, String, u64, u64)],
}

/// A discrepancy known and owned elsewhere: calls it matches are skipped in this row (in
/// the model and the store alike), or, for `tolerate`, a difference it explains is accepted.
#[derive(Clone, Copy)]
pub struct Known {
    /// What it is in the issue (`item 10`) or `NEW-n`.
    pub id: &'static str,
    pub about: &'static str,
    /// The rows it applies to.
    pub rows: fn(&RowSpec) -> bool,
    /// Calls to skip, decided before they run.
    pub skip: Option<fn(&Ctx<'_>) -> bool>,
    /// Differences to accept, decided after: (model, store).
    pub tolerate: Option<fn(&Ctx<'_>, &Decision, &Decision) -> bool>,
    /// Calls for which the model's retry contract is not asserted (a known defect of the
    /// algorithm itself, which the stores share).
    pub unchecked: Option<fn(&Ctx<'_>) -> bool>,
}

/// Counts per row and per name (operations run, entries that skipped or tolerated), over
/// every case of a test.
#[derive(Debug, Default)]
pub struct Tally {
    counts: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    pub fn bump(&self, what: impl Into<String>) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(what.into())
            .or_default() += 1;
    }

    pub fn get(&self, what: &str) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(what)
            .copied()
            .unwrap_or(0)
    }

    pub fn report(&self) -> String {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

// ---------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------

/// The subset of `0..n` that `sel` names (never empty).
fn subset(sel: u8, n: usize) -> Vec<usize> {
    let m = usize::from(sel) % ((1 << n) - 1) + 1;
    (0..n).filter(|i| m & (1 << i) != 0).collect()
}

/// Polls a future, turning a panic into an error message.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match catch_unwind(AssertUnwindSafe(|| Pin::new(&mut self.0).poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(&panic))),
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic".to_owned())
}

enum Pending {
    Decision(BoxFuture<Result<Decision, StoreError>>),
    Unit(BoxFuture<Result<(), StoreError>>),
    /// Nothing was sent (a store with no slots to refresh, a reload).
    Nothing,
}

/// What came back from a store.
#[derive(Debug)]
enum Answer {
    Decision(Decision),
    Unit,
}

/// A call sent, waiting for its answer, and what the model said.
struct Sent {
    step: usize,
    now: u64,
    call: Call,
    model: Option<Decision>,
    /// The permit the call created (an admitted request holding slots).
    permit: Option<usize>,
}

/// The group of calls of one instant sent behind one blocking call (batched rows).
struct Group {
    calls: Vec<Sent>,
    /// Every future of the group in the order created: the blocker, then each call and
    /// its companion; `Some(i)` for the call at `calls[i]`.
    futures: Vec<(Option<usize>, Pending)>,
}

struct Harness<'a, S> {
    row: &'a RowSpec,
    store: &'a S,
    clock: &'a ManualClock,
    known: &'a [Known],
    tally: &'a Tally,
    keys: Vec<Key>,
    plan: Vec<Spec>,
    policies: Vec<Policy>,
    model: Model,
    permits: Vec<Permit>,
    /// Overrides with a TTL on rows whose overrides live in Redis: (key, plan policy, the
    /// overriding policy, when the model sees it end).
    timed: Vec<(u8, Policy, Policy, u64)>,
    group: Option<Group>,
    /// The policies a reload replaced so far: (name, when).
    reloaded: Vec<(String, u64)>,
    /// Settlements that charged extra units: (key, policy name, when, and when the state
    /// they left stops mattering).
    overcharged: Vec<(u8, String, u64, u64)>,
    /// For batched rows: the blocking call's key and policy (a sliding window log, which
    /// `decide.lua` decides).
    blocker: (Key, Policy),
}

/// Runs `case` through `store` (on `clock`) and the model in lockstep; `Err` at the first
/// answer the row's mode does not accept.
///
/// **Overrides on Redis.** A Redis override's TTL runs on the server's real clock, not on
/// the test's manual clock. On rows whose overrides live in Redis an override with a TTL is
/// therefore set with that TTL plus a minute, and when the next step's time reaches the
/// moment the model sees it end, it is set again with a TTL of 1 ms, and the harness waits
/// 3 ms: Redis then expires it by itself, between the two steps, as the model does.
///
/// `salt` tells the keys of one run of the case from another's on the same store.
pub async fn run<S: Store>(
    row: &RowSpec,
    store: &S,
    clock: &ManualClock,
    case: &Case,
    known: &[Known],
    tally: &Tally,
    salt: &str,
) -> Result<(), TestCaseError> {
    clock.set_millis(case.start);
    let mut h = Harness {
        row,
        store,
        clock,
        known,
        tally,
        keys: (0..KEYS)
            .map(|i| Key::new("user", format!("k{i}{salt}")))
            .collect(),
        plan: case.plan.clone(),
        policies: case.plan.iter().map(Spec::policy).collect(),
        model: Model::new(row.slot_leases),
        permits: Vec::new(),
        timed: Vec::new(),
        group: None,
        reloaded: Vec::new(),
        overcharged: Vec::new(),
        blocker: (
            Key::new("user", format!("blocker{salt}")),
            Policy::builder("blocker", Rate::per_second(1))
                .algorithm(Algorithm::SlidingWindowLog)
                .build()
                .unwrap(),
        ),
    };
    for (i, step) in case.steps.iter().enumerate() {
        if step.dt > 0 {
            h.flush().await?;
            h.expire_timed(step.dt).await?;
            clock.advance(Duration::from_millis(step.dt));
        }
        for call in h.resolve(&step.op) {
            h.execute(i, call).await?;
        }
    }
    h.flush().await
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

impl<S: Store> Harness<'_, S> {
    fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The calls an operation makes now: the call itself, then (for one that answers
    /// nothing) a peek of every policy on its key.
    fn resolve(&mut self, op: &Op) -> Vec<Call> {
        let n = self.policies.len();
        let pick_policies = |sel: u8| -> Vec<Policy> {
            subset(sel, n)
                .into_iter()
                .map(|i| self.policies[i].clone())
                .collect()
        };
        let call = match *op {
            Op::Check { key, sel, costs } => {
                let policies = pick_policies(sel);
                // Any cost: an in-flight policy takes one slot whatever a request costs.
                let costs = policies
                    .iter()
                    .zip(costs)
                    .map(|(p, u)| u.of(p.capacity()))
                    .collect();
                Call::Check {
                    key,
                    policies,
                    costs,
                }
            }
            Op::Peek { key, sel, costs } => {
                let policies = pick_policies(sel);
                let costs = policies
                    .iter()
                    .zip(costs)
                    .map(|(p, u)| u.of(p.capacity()))
                    .collect();
                Call::Peek {
                    key,
                    policies,
                    costs,
                }
            }
            Op::Refund {
                key,
                sel,
                costs,
                fallback,
            } => {
                let policies = pick_policies(sel);
                let costs = policies
                    .iter()
                    .zip(costs)
                    .map(|(p, b)| b.of(p.capacity()))
                    .collect();
                Call::Refund {
                    key,
                    policies,
                    costs,
                    fallback,
                }
            }
            Op::Settle {
                key,
                sel,
                reserved,
                actual,
                fallback,
            } => {
                let chosen: Vec<(Policy, Units, Actual)> = subset(sel, n)
                    .into_iter()
                    .map(|i| (self.policies[i].clone(), reserved[i], actual[i]))
                    .filter(|(p, _, _)| !p.is_in_flight())
                    .collect();
                if chosen.is_empty() {
                    return vec![];
                }
                let mut policies = Vec::new();
                let mut rs = Vec::new();
                let mut acts = Vec::new();
                for (p, r, a) in chosen {
                    let r = r.of(p.capacity());
                    acts.push(a.of(r, p.capacity()));
                    rs.push(r);
                    policies.push(p);
                }
                Call::Settle {
                    key,
                    policies,
                    reserved: rs,
                    actual: acts,
                    fallback,
                }
            }
            Op::Release { pick } | Op::Refresh { pick } => {
                let open: Vec<usize> = (0..self.permits.len())
                    .filter(|&i| !self.permits[i].released)
                    .collect();
                if open.is_empty() {
                    return vec![];
                }
                let permit = open[usize::from(pick) % open.len()];
                if matches!(op, Op::Release { .. }) {
                    Call::Release { permit }
                } else {
                    Call::Refresh { permit }
                }
            }
            Op::SetOverride {
                key,
                policy,
                limit,
                burst,
                ttl,
            } => {
                let plan = self.policies[usize::from(policy) % n].clone();
                let limit = limit.of(plan.limit());
                let capacity = match burst {
                    Some(b) if plan.algorithm().has_burst() => b.of(plan.capacity()),
                    _ => limit,
                };
                // An override the plan's window cannot take (past 2^50) becomes the smallest.
                let overriding = with_numbers(&plan, limit, capacity)
                    .or_else(|_| with_numbers(&plan, 1, 1))
                    .expect("a limit of 1 fits every window");
                Call::SetOverride {
                    key,
                    plan,
                    overriding,
                    ttl: ttl.map(u64::from),
                }
            }
            Op::RemoveOverride { key, policy } => Call::RemoveOverride {
                key,
                plan: self.policies[usize::from(policy) % n].clone(),
            },
            Op::Reload { policy, spec } => {
                let index = usize::from(policy) % n;
                let old = &self.plan[index];
                let algorithm = match spec.switch_to {
                    Some(a) if old.algorithm != Algorithm::InFlight => a,
                    _ => old.algorithm,
                };
                Call::Reload {
                    index,
                    spec: spec.spec(old.index, algorithm),
                }
            }
            Op::Reset { key, sel } => Call::Reset {
                key,
                policies: pick_policies(sel),
            },
        };
        let observe = match &call {
            Call::Check { .. } | Call::Peek { .. } | Call::Reload { .. } => None,
            Call::Release { permit } | Call::Refresh { permit } => Some(self.permits[*permit].key),
            other => other.key(),
        };
        let mut calls = vec![call];
        if let Some(key) = observe {
            let policies = self.policies.clone();
            let costs = policies.iter().map(|_| 1).collect();
            calls.push(Call::Observe {
                key,
                policies,
                costs,
            });
        }
        calls
    }

    fn ctx<'c>(&'c self, call: &'c Call) -> Ctx<'c> {
        Ctx {
            row: self.row,
            call,
            model: &self.model,
            now: self.now(),
            permits: &self.permits,
            reloaded: &self.reloaded,
            overcharged: &self.overcharged,
        }
    }

    /// The known entry that skips `call` in this row, if any.
    fn skipped(&self, call: &Call) -> Option<&'static str> {
        let ctx = self.ctx(call);
        self.known
            .iter()
            .filter(|k| (k.rows)(self.row))
            .find(|k| k.skip.is_some_and(|f| f(&ctx)))
            .map(|k| k.id)
    }

    /// The known entry that exempts `call` from the model's retry contract, if any.
    fn unchecked(&self, call: &Call) -> Option<&'static str> {
        let ctx = self.ctx(call);
        self.known
            .iter()
            .filter(|k| (k.rows)(self.row))
            .find(|k| k.unchecked.is_some_and(|f| f(&ctx)))
            .map(|k| k.id)
    }

    /// The known entry that explains a difference, if any.
    fn tolerated(&self, call: &Call, model: &Decision, store: &Decision) -> Option<&'static str> {
        let ctx = self.ctx(call);
        self.known
            .iter()
            .filter(|k| (k.rows)(self.row))
            .find(|k| k.tolerate.is_some_and(|f| f(&ctx, model, store)))
            .map(|k| k.id)
    }

    /// Sends `call` to the store (the future is created now: a Redis store admits it to
    /// its lane at once).
    fn send(&self, call: &Call) -> Result<Pending, String> {
        let s = self.store;
        let k = |key: &u8| &self.keys[usize::from(*key)];
        catch_unwind(AssertUnwindSafe(|| match call {
            Call::Check {
                key,
                policies,
                costs,
            } => Pending::Decision(Box::pin(s.check(k(key), policies, costs))),
            Call::Peek {
                key,
                policies,
                costs,
            }
            | Call::Observe {
                key,
                policies,
                costs,
            } => Pending::Decision(s.peek(k(key), policies, costs)),
            Call::Refund {
                key,
                policies,
                costs,
                fallback: false,
            } => Pending::Unit(s.refund(k(key), policies, costs)),
            Call::Settle {
                key,
                policies,
                reserved,
                actual,
                fallback: false,
            } => Pending::Unit(s.settle(k(key), policies, reserved, actual)),
            Call::Refund {
                key,
                policies,
                costs,
                fallback: true,
            } => Pending::Unit(given_back_by_fallback(s.apply(
                k(key),
                policies,
                fallback_op(tollgate::store::Op::refund(costs.as_slice())),
            ))),
            Call::Settle {
                key,
                policies,
                reserved,
                actual,
                fallback: true,
            } => Pending::Unit(given_back_by_fallback(s.apply(
                k(key),
                policies,
                fallback_op(tollgate::store::Op::settle(
                    reserved.as_slice(),
                    actual.as_slice(),
                )),
            ))),
            Call::Release { permit } => {
                let p = &self.permits[*permit];
                Pending::Unit(s.release(k(&p.key), &p.policies, p.slot))
            }
            Call::Refresh { permit } => {
                let p = &self.permits[*permit];
                Pending::Unit(s.refresh(k(&p.key), &p.policies, p.slot))
            }
            Call::SetOverride {
                key,
                overriding,
                ttl,
                ..
            } => {
                // On Redis an override that ends is set for a minute more; see `run`.
                let ttl = ttl.map(|t| {
                    Duration::from_millis(if self.row.redis_overrides {
                        t + 60_000
                    } else {
                        t
                    })
                });
                Pending::Unit(s.set_override(k(key), overriding, ttl))
            }
            Call::RemoveOverride { key, plan } => Pending::Unit(s.remove_override(k(key), plan)),
            Call::Reload { .. } => Pending::Nothing,
            Call::Reset { key, policies } => Pending::Unit(s.reset(k(key), policies)),
        }))
        .map_err(|p| panic_message(&p))
    }

    /// Applies `call` to the model: for a decision, what the model answers, and the permit
    /// an admitted request holding slots creates (its index). With `admitted`, a check is
    /// charged only if the store admitted it (bound modes).
    fn apply(
        &mut self,
        step: usize,
        call: &Call,
        admitted: Option<bool>,
    ) -> Result<(Option<Decision>, Option<usize>), String> {
        let now = self.now();
        let permit = self.permits.len();
        let contract = match self.unchecked(call) {
            Some(id) => {
                self.tally.bump(format!("unchecked[{id}]"));
                false
            }
            None => true,
        };
        let result = catch_unwind(AssertUnwindSafe(|| match call {
            Call::Check {
                key,
                policies,
                costs,
            } => self
                .model
                .decide(
                    *key,
                    policies,
                    &slots_asked(policies, costs, true),
                    now,
                    admitted.unwrap_or(true),
                    permit,
                    contract,
                )
                .map(Some),
            Call::Peek {
                key,
                policies,
                costs,
            }
            | Call::Observe {
                key,
                policies,
                costs,
            } => self
                .model
                .decide(
                    *key,
                    policies,
                    &slots_asked(policies, costs, false),
                    now,
                    false,
                    permit,
                    contract,
                )
                .map(Some),
            Call::Refund {
                key,
                policies,
                costs,
                fallback,
            } => {
                // A store never charged a fallback's admission: it takes nothing back.
                if !fallback {
                    self.model.refund(*key, policies, costs, now);
                }
                Ok(None)
            }
            Call::Settle {
                key,
                policies,
                reserved,
                actual,
                fallback,
            } => {
                // Of a fallback's give-back a store keeps only the debt above the reservation.
                let raised: Vec<u64>;
                let actual = if *fallback {
                    raised = actual
                        .iter()
                        .zip(reserved)
                        .map(|(&a, &r)| a.max(r))
                        .collect();
                    &raised
                } else {
                    actual
                };
                self.model.settle(*key, policies, reserved, actual, now);
                for ((p, r), a) in policies.iter().zip(reserved).zip(actual) {
                    if a > r {
                        let until = self.model.expiry(*key, p, now).unwrap_or(now);
                        self.overcharged
                            .push((*key, p.name().to_owned(), now, until));
                    }
                }
                Ok(None)
            }
            Call::Release { permit } => {
                let p = &self.permits[*permit];
                self.model.release(p.key, &p.policies, *permit);
                Ok(None)
            }
            Call::Refresh { permit } => {
                let p = &self.permits[*permit];
                self.model.refresh(p.key, &p.policies, *permit, now);
                Ok(None)
            }
            Call::SetOverride {
                key,
                plan,
                overriding,
                ttl,
            } => {
                self.model.set_override(
                    *key,
                    plan,
                    overriding.limit(),
                    overriding.capacity(),
                    *ttl,
                    now,
                );
                Ok(None)
            }
            Call::RemoveOverride { key, plan } => {
                self.model.remove_override(*key, plan, now);
                Ok(None)
            }
            Call::Reload { index, spec } => {
                self.plan[*index] = spec.clone();
                self.policies[*index] = spec.policy();
                self.reloaded.push((spec.name(), now));
                Ok(None)
            }
            Call::Reset { key, policies } => {
                self.model.reset(*key, policies);
                Ok(None)
            }
        }))
        .map_err(|p| format!("the model panicked at step {step}: {}", panic_message(&p)))??;
        // Bookkeeping of permits and timed overrides, as the model now stands.
        let mut created = None;
        match call {
            Call::Release { permit } => self.permits[*permit].released = true,
            Call::Check { key, policies, .. }
                if result.as_ref().is_some_and(Decision::is_allowed)
                    && admitted != Some(false)
                    && policies.iter().any(Policy::is_in_flight) =>
            {
                created = Some(self.permits.len());
                self.permits.push(Permit {
                    key: *key,
                    policies: policies
                        .iter()
                        .filter(|p| p.is_in_flight())
                        .cloned()
                        .collect(),
                    slot: 0,
                    known: false,
                    released: false,
                });
            }
            Call::SetOverride {
                key,
                plan,
                overriding,
                ttl,
            } if self.row.redis_overrides => {
                self.timed
                    .retain(|(k, p, _, _)| !(*k == *key && same_state(p, plan)));
                if let Some(t) = ttl {
                    self.timed
                        .push((*key, plan.clone(), overriding.clone(), now + t));
                }
            }
            Call::RemoveOverride { key, plan } => {
                self.timed
                    .retain(|(k, p, _, _)| !(*k == *key && same_state(p, plan)));
            }
            _ => {}
        }
        Ok((result, created))
    }

    /// Makes the Redis overrides that the model sees end within the next `dt` ms end now
    /// (see [`run`]).
    async fn expire_timed(&mut self, dt: u64) -> Result<(), TestCaseError> {
        let now = self.now();
        let due: Vec<_> = self
            .timed
            .iter()
            .filter(|(_, _, _, end)| *end <= now + dt)
            .cloned()
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        self.timed.retain(|(_, _, _, end)| *end > now + dt);
        for (key, _, overriding, _) in due {
            let k = &self.keys[usize::from(key)];
            self.store
                .set_override(k, &overriding, Some(Duration::from_millis(1)))
                .await
                .map_err(|e| fail(format!("re-setting an override to end: {e}")))?;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
        Ok(())
    }

    async fn execute(&mut self, step: usize, call: Call) -> Result<(), TestCaseError> {
        if let Some(id) = self.skipped(&call) {
            self.tally.bump(format!("skipped[{id}]"));
            return Ok(());
        }
        self.tally.bump(format!("calls[{}]", kind(&call)));
        // A release or refresh of a slot named in a group not yet answered waits for it.
        if let Call::Release { permit } | Call::Refresh { permit } = &call {
            if !self.permits[*permit].known {
                self.flush().await?;
            }
        }
        let now = self.now();
        match self.row.mode {
            Mode::Exact => {
                let (model, permit) = self.apply(step, &call, None).map_err(fail)?;
                let batched = self.row.batched && call.decides();
                if batched {
                    if self.group.as_ref().is_some_and(|g| g.calls.len() >= 16) {
                        self.flush().await?;
                    }
                    // The blocker first: it takes the lane's only place, so that every
                    // call after it queues for one batch.
                    self.open_group();
                } else {
                    self.flush().await?;
                }
                let pending = self.send(&call).map_err(|e| {
                    fail(format!(
                        "the store panicked on {call:?} at step {step}: {e}"
                    ))
                })?;
                let sent = Sent {
                    step,
                    now,
                    call,
                    model,
                    permit,
                };
                if batched {
                    self.enqueue(sent, pending);
                    Ok(())
                } else {
                    let answer = wait(pending).await;
                    self.judge_exact(sent, answer)
                }
            }
            Mode::DenyCache | Mode::Leased => {
                self.flush().await?;
                let pending = self.send(&call).map_err(|e| {
                    fail(format!(
                        "the store panicked on {call:?} at step {step}: {e}"
                    ))
                })?;
                let answer = wait(pending).await;
                self.judge_bound(step, now, call, answer)
            }
        }
    }

    /// Starts a group with its blocking call, unless one is open.
    fn open_group(&mut self) {
        if self.group.is_none() {
            let (key, policy) = &self.blocker;
            let blocker = self.store.peek(key, std::slice::from_ref(policy), &[1]);
            self.group = Some(Group {
                calls: Vec::new(),
                futures: vec![(None, Pending::Decision(blocker))],
            });
        }
    }

    /// Adds a sent call to the open group, followed by a peek of the blocker's key: a batch
    /// split before a call (a state named with two parameter sets) still leaves it with a
    /// companion, so no call of the group is ever alone in a script call.
    fn enqueue(&mut self, sent: Sent, pending: Pending) {
        let companion = {
            let (key, policy) = &self.blocker;
            self.store.peek(key, std::slice::from_ref(policy), &[1])
        };
        let group = self.group.as_mut().expect("an open group");
        group.calls.push(sent);
        let i = group.calls.len() - 1;
        group.futures.push((Some(i), pending));
        group.futures.push((None, Pending::Decision(companion)));
    }

    /// Sends the group behind its blocker and judges every answer, in order.
    async fn flush(&mut self) -> Result<(), TestCaseError> {
        let Some(group) = self.group.take() else {
            return Ok(());
        };
        let mut handles = Vec::new();
        for (i, pending) in group.futures {
            let handle = match pending {
                Pending::Decision(f) => tokio::spawn(async move { f.await.map(Answer::Decision) }),
                Pending::Unit(f) => tokio::spawn(async move { f.await.map(|()| Answer::Unit) }),
                Pending::Nothing => tokio::spawn(async { Ok(Answer::Unit) }),
            };
            handles.push((i, handle));
        }
        let mut answers: Vec<Option<Result<Result<Answer, StoreError>, String>>> =
            (0..group.calls.len()).map(|_| None).collect();
        for (i, handle) in handles {
            let result = handle.await.map_err(|e| format!("{e}"));
            match i {
                Some(i) => answers[i] = Some(result),
                None => {
                    if let Err(e) = result {
                        return Err(fail(format!("a blocking call panicked: {e}")));
                    }
                }
            }
        }
        for (sent, answer) in group.calls.into_iter().zip(answers) {
            let answer = answer.expect("every call of a group is answered");
            self.judge_exact(sent, answer)?;
        }
        Ok(())
    }

    fn judge_exact(
        &mut self,
        sent: Sent,
        answer: Result<Result<Answer, StoreError>, String>,
    ) -> Result<(), TestCaseError> {
        let Sent {
            step,
            now,
            call,
            model,
            permit,
        } = sent;
        let answer = answer.map_err(|e| {
            fail(format!(
                "[{}] step {step} at {now}: the store panicked on {call:?}: {e}",
                self.row.name
            ))
        })?;
        let answer = answer.map_err(|e| {
            fail(format!(
                "[{}] step {step} at {now}: the store failed on {call:?}: {e}",
                self.row.name
            ))
        })?;
        match (model, answer) {
            (Some(m), Answer::Decision(d)) => {
                if let Some(p) = permit {
                    self.permits[p].slot = d.slot();
                    self.permits[p].known = true;
                }
                if m != d {
                    if let Some(id) = self.tolerated(&call, &m, &d) {
                        self.tally.bump(format!("tolerated[{id}]"));
                        return Ok(());
                    }
                    return Err(fail(self.difference(step, now, &call, &m, &d)));
                }
                Ok(())
            }
            (None, Answer::Unit) => Ok(()),
            (m, a) => Err(fail(format!(
                "[{}] step {step}: {call:?} answered {a:?}, the model {m:?}",
                self.row.name
            ))),
        }
    }

    fn difference(
        &self,
        step: usize,
        now: u64,
        call: &Call,
        model: &Decision,
        store: &Decision,
    ) -> String {
        let key = call.key().unwrap_or(0);
        let overrides: Vec<String> = call
            .policies()
            .iter()
            .filter_map(|p| {
                self.model
                    .override_of(key, p, now)
                    .map(|(l, c)| format!("{} overridden to {l}/{c}", p.name()))
            })
            .collect();
        format!(
            "[{}] step {step} at {now} ms: {call:?}\n  overrides in force: {overrides:?}\n  \
             model: {model:?}\n  store: {store:?}\n  model state of key {key}:{}",
            self.row.name,
            self.model.describe(key)
        )
    }

    /// Judges a deny-cache or leased row's answer, and applies the call to the model as
    /// the store decided it.
    fn judge_bound(
        &mut self,
        step: usize,
        now: u64,
        call: Call,
        answer: Result<Result<Answer, StoreError>, String>,
    ) -> Result<(), TestCaseError> {
        let name = self.row.name;
        let answer = answer
            .map_err(|e| {
                fail(format!(
                    "[{name}] step {step} at {now}: panicked on {call:?}: {e}"
                ))
            })?
            .map_err(|e| {
                fail(format!(
                    "[{name}] step {step} at {now}: failed on {call:?}: {e}"
                ))
            })?;
        let exact_only = self.row.mode == Mode::Leased
            && call
                .policies()
                .iter()
                .all(|p| tollgate::store::leased::leasable(p).is_err());
        match (&call, answer) {
            (Call::Check { .. }, Answer::Decision(d)) => {
                let before = self.model.clone();
                let (model, permit) = self
                    .apply(step, &call, Some(d.is_allowed()))
                    .map_err(fail)?;
                let model = model.expect("a check answers");
                let violation = match self.row.mode {
                    Mode::DenyCache if d.decided_by() == DecidedBy::CachedDeny => {
                        model.is_allowed() || d.retry_after_millis() > model.retry_after_millis()
                    }
                    Mode::Leased if !exact_only => d.is_allowed() && !model.is_allowed(),
                    _ => d != model,
                };
                if let Some(p) = permit {
                    self.permits[p].slot = d.slot();
                    self.permits[p].known = true;
                }
                if violation {
                    let saved = std::mem::replace(&mut self.model, before);
                    let msg = self.difference(step, now, &call, &model, &d);
                    self.model = saved;
                    if let Some(id) = self.tolerated(&call, &model, &d) {
                        self.tally.bump(format!("tolerated[{id}]"));
                        if let (
                            Call::Check {
                                key,
                                policies,
                                costs,
                            },
                            true,
                        ) = (&call, d.is_allowed())
                        {
                            // The bound is about what was admitted: the model counts it.
                            self.model.force_commit(*key, policies, costs, now);
                        }
                        return Ok(());
                    }
                    return Err(fail(format!("bound broken: {msg}")));
                }
                if d.decided_by() == DecidedBy::CachedDeny {
                    self.tally.bump("cached_denials");
                }
                Ok(())
            }
            (Call::Peek { .. } | Call::Observe { .. }, Answer::Decision(d)) => {
                let model = self
                    .apply(step, &call, None)
                    .map_err(fail)?
                    .0
                    .expect("a peek answers");
                let judged = self.row.mode == Mode::DenyCache || exact_only;
                if judged && d != model {
                    if let Some(id) = self.tolerated(&call, &model, &d) {
                        self.tally.bump(format!("tolerated[{id}]"));
                        return Ok(());
                    }
                    return Err(fail(self.difference(step, now, &call, &model, &d)));
                }
                Ok(())
            }
            (_, Answer::Unit) => {
                self.apply(step, &call, None).map_err(fail)?;
                Ok(())
            }
            (_, a) => Err(fail(format!(
                "[{name}] step {step}: {call:?} answered {a:?}"
            ))),
        }
    }
}

/// Whether two policies name the same state (name and algorithm).
fn same_state(a: &Policy, b: &Policy) -> bool {
    a.name() == b.name() && a.algorithm() == b.algorithm()
}

async fn wait(pending: Pending) -> Result<Result<Answer, StoreError>, String> {
    match pending {
        Pending::Decision(f) => CatchUnwind(f).await.map(|r| r.map(Answer::Decision)),
        Pending::Unit(f) => CatchUnwind(f).await.map(|r| r.map(|()| Answer::Unit)),
        Pending::Nothing => Ok(Ok(Answer::Unit)),
    }
}

/// A short name of a call's kind, for the tally.
pub fn kind(call: &Call) -> &'static str {
    match call {
        Call::Check { .. } => "check",
        Call::Peek { .. } => "peek",
        Call::Observe { .. } => "observe",
        Call::Refund {
            fallback: false, ..
        } => "refund",
        Call::Refund { .. } => "fallback_refund",
        Call::Settle {
            fallback: false, ..
        } => "settle",
        Call::Settle { .. } => "fallback_settle",
        Call::Release { .. } => "release",
        Call::Refresh { .. } => "refresh",
        Call::SetOverride { .. } => "set_override",
        Call::RemoveOverride { .. } => "remove_override",
        Call::Reload { .. } => "reload",
        Call::Reset { .. } => "reset",
    }
}
