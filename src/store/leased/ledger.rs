//! The lease ledger: what a shared store keeps for leased policies, and the one call that
//! grants, decides, peeks, gives back or charges.
//!
//! `lua/lease.lua` is this arithmetic for Redis; [`MemoryLedger`] runs it in process (for
//! tests and simulations: one ledger shared by several [`LeasedStore`](super::LeasedStore)s
//! of one process stands for a Redis shared by several instances).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::algorithm::{
    fixed_window, sliding_window_counter, sliding_window_log, FixedWindow, FixedWindowState,
    LimitAlgorithm, SlidingWindowCounter, SlidingWindowCounterState, TokenBucket, TokenBucketState,
};
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::{Algorithm, Limits, Policy};
use crate::store::{BoxFuture, MemoryStore, Store};

/// How a leased policy is kept in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// The sliding window counter: blocks end at the window boundary.
    Counter = 1,
    /// The sliding window log: a block is an entry that counts until its period ends.
    Log = 2,
    /// The token bucket and (non-shaping) GCRA, one meter: a block also reserves the refill
    /// its period would hand out.
    Bucket = 3,
    /// The fixed window: blocks end at the window boundary.
    Fixed = 4,
}

impl Kind {
    /// The kind a policy is leased as, or `None` when it is decided exactly.
    pub(crate) fn of(policy: &Policy) -> Option<Kind> {
        match policy.algorithm() {
            Algorithm::SlidingWindowCounter => Some(Kind::Counter),
            Algorithm::SlidingWindowLog => Some(Kind::Log),
            Algorithm::TokenBucket => Some(Kind::Bucket),
            Algorithm::Gcra if policy.max_delay().is_none() => Some(Kind::Bucket),
            Algorithm::FixedWindow => Some(Kind::Fixed),
            Algorithm::Gcra | Algorithm::InFlight => None,
        }
    }
}

/// What a ledger call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Grant,
    Peek,
    Return,
    Force,
    Reset,
    /// An override was just set: keep each bucket state at least as long as the override's
    /// refill rate needs it (Redis TTLs; nothing to do in process).
    Keep,
}

impl Mode {
    #[cfg(feature = "redis")]
    pub(crate) fn code(self) -> &'static str {
        match self {
            Mode::Grant => "g",
            Mode::Peek => "p",
            Mode::Return => "r",
            Mode::Force => "f",
            Mode::Reset => "x",
            Mode::Keep => "k",
        }
    }
}

/// One policy's part of a ledger call: the policy's numbers, what the call asks of it, and
/// the block it gives back, if any.
///
/// `limit` and `capacity` are the plan's; the ledger decides with the key's override of the
/// policy instead, when one is in force (see [`Override`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub(crate) kind: Kind,
    /// Units per window (`N`; for the bucket, the refill per window).
    pub(crate) limit: u64,
    /// The window, in ms (`W`).
    pub(crate) window_ms: u64,
    /// The most units the state holds at once (`C`; the limit but for the bucket).
    pub(crate) capacity: u64,
    /// Grant and peek: the request's cost, which must fit. Force: the units charged
    /// whatever the state (a settlement above its reservation).
    pub(crate) cost: u64,
    /// Grant: the most units the block may hold (at least `cost`).
    pub(crate) wanted: u64,
    /// Return: the block given back. Grant: the block in hand, given back first, when the
    /// call names it ([`LedgerCall::previous_block`]).
    pub(crate) returned: Returned,
}

/// What a block given back held of one policy, and when and for how long it was lent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Returned {
    /// Units it was granted.
    pub(crate) granted: u64,
    /// Units it leaves unused.
    pub(crate) unused: u64,
    /// When it was granted, on the ledger's clock (ms).
    pub(crate) granted_at: u64,
    /// Its lease: how long it could be spent (ms; 0 for a request decided exactly).
    pub(crate) lease_ms: u64,
    /// The limit (refill rate) in force when it was granted; 0 when unknown (the one in
    /// force now). A bucket gives back the refill charged ahead at the lower of that rate
    /// and today's, so an override raised meanwhile cannot return more than the block was
    /// charged.
    pub(crate) rate: u64,
}

impl Part {
    pub(crate) fn new(kind: Kind, policy: &Policy) -> Self {
        Self {
            kind,
            limit: policy.limit(),
            window_ms: policy.window_millis(),
            capacity: policy.capacity(),
            cost: 0,
            wanted: 0,
            returned: Returned::default(),
        }
    }

    /// This part with `over`'s limit and capacity in place of the plan's, when given.
    fn with_override(mut self, over: Option<Override>) -> Self {
        if let Some(o) = over {
            self.limit = o.limit;
            self.capacity = o.capacity;
        }
        self
    }
}

/// A per-key override of a leased policy, as the ledger reads it: the limit (refill rate per
/// window) and capacity to decide with instead of the plan's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Override {
    pub(crate) limit: u64,
    pub(crate) capacity: u64,
}

impl Override {
    /// An override the ledger can use with window `w`: both numbers at least 1 and within the
    /// bounds every policy keeps (`× w ≤ 2^50`, so the arithmetic stays exact in Lua too).
    /// Anything else is ignored: the plan's numbers apply.
    pub(crate) fn usable(limit: u64, capacity: u64, w: u64) -> Option<Self> {
        let fits = |x: u64| {
            x >= 1
                && x.checked_mul(w)
                    .is_some_and(|p| p <= crate::policy::MAX_CAPACITY_WINDOW_PRODUCT)
        };
        (fits(limit) && fits(capacity)).then_some(Self { limit, capacity })
    }
}

/// One call to a lease ledger: which policies, what to do, for how long.
///
/// Built by [`LeasedStore`](super::LeasedStore); a [`LeaseBackend`] only carries it to its
/// ledger.
#[derive(Debug, Clone)]
pub struct LedgerCall {
    pub(crate) mode: Mode,
    /// Grants: the lease asked for, in ms (how long the block may be spent); 0 asks for no
    /// block: the request is decided exactly.
    pub(crate) lease_ms: u64,
    /// The block the call grants or gives back (a sliding window log's entry for it; a
    /// force's entry of the debt).
    pub(crate) block_id: u64,
    /// Grants only: the block in hand, given back first (0: none).
    pub(crate) previous_block: u64,
    pub(crate) parts: SmallVec<[Part; 2]>,
}

impl LedgerCall {
    /// Each policy's eleven integers (kind, limit, window, capacity, cost, wanted, then the
    /// block given back: granted, unused, granted at, lease, rate) as little-endian doubles,
    /// the binary string `lua/lease.lua` reads. Exact for every whole number below 2^53
    /// (counts, milliseconds); a cost above that (only a caller's settlement can send one)
    /// arrives rounded, and is then above any limit and past the debt's saturation
    /// (⌊2^52 / W⌋ units) either way.
    #[cfg(feature = "redis")]
    pub(crate) fn packed_parts(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PART_BYTES * self.parts.len());
        for p in &self.parts {
            let back = &p.returned;
            for x in [
                p.kind as u64,
                p.limit,
                p.window_ms,
                p.capacity,
                p.cost,
                p.wanted,
                back.granted,
                back.unused,
                back.granted_at,
                back.lease_ms,
                back.rate,
            ] {
                v.extend_from_slice(&(x as f64).to_le_bytes());
            }
        }
        v
    }
}

/// The bytes of one policy's part of a call: eleven doubles.
#[cfg(feature = "redis")]
pub(crate) const PART_BYTES: usize = 11 * 8;

/// One policy's answer from the ledger: units, its view, and the limit and capacity it
/// decided with (the plan's, or the key's override's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Answer {
    pub(crate) granted: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_after_ms: u64,
    pub(crate) retry_after_ms: u64,
    pub(crate) limit: u64,
    pub(crate) capacity: u64,
}

impl Answer {
    /// The limit a decision reports: the capacity for the token bucket and GCRA, the limit
    /// otherwise.
    pub(crate) fn reported_limit(&self, kind: Option<Kind>) -> u64 {
        if kind == Some(Kind::Bucket) {
            self.capacity
        } else {
            self.limit
        }
    }
}

/// A ledger's answer: whether it granted, for how long, at what time (the ledger's clock),
/// and each policy's units and view. A forced charge answers no views, and "granted" when
/// the key is within its limits afterwards (no debt stands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerReply {
    pub(crate) granted: bool,
    /// The lease of the block granted, in ms; 0 when the request was decided exactly.
    pub(crate) lease_ms: u64,
    pub(crate) now_ms: u64,
    pub(crate) answers: SmallVec<[Answer; 2]>,
}

impl LedgerReply {
    #[cfg(all(test, feature = "redis"))]
    /// Parses one call's reply, which must be all of `bytes`.
    pub(crate) fn parse(bytes: &[u8], policies: usize) -> Result<Self, StoreError> {
        let mut rest = bytes;
        let reply = Self::parse_next(&mut rest, policies)?;
        if !rest.is_empty() {
            return Err(Self::malformed(bytes));
        }
        Ok(reply)
    }

    #[cfg(feature = "redis")]
    /// Parses the call's reply at the start of `bytes` and moves `bytes` past it: four
    /// little-endian doubles (allowed, lease, now, the number of answers: 0 or `policies`),
    /// then six per answer (granted, remaining, reset after, retry after, the limit and the
    /// capacity in force). Every number is a whole, non-negative double below 2^53; anything
    /// else is a protocol error.
    pub(crate) fn parse_next(bytes: &mut &[u8], policies: usize) -> Result<Self, StoreError> {
        let whole = *bytes;
        let mut read = |out: &mut [u64]| -> Result<(), StoreError> {
            for o in out.iter_mut() {
                let Some((number, tail)) = bytes.split_first_chunk::<8>() else {
                    return Err(Self::malformed(whole));
                };
                let x = f64::from_le_bytes(*number);
                if !(0.0..=9_007_199_254_740_992.0).contains(&x) || x.fract() != 0.0 {
                    return Err(Self::malformed(whole));
                }
                // Whole and in range, so the conversion is exact.
                *o = x as u64;
                *bytes = tail;
            }
            Ok(())
        };
        let mut head = [0u64; 4];
        read(&mut head)?;
        let [allowed, lease_ms, now_ms, count] = head;
        if allowed > 1 || !(count == 0 || count == policies as u64) {
            return Err(Self::malformed(whole));
        }
        let mut answers = SmallVec::new();
        for _ in 0..count {
            let mut a = [0u64; 6];
            read(&mut a)?;
            let [granted, remaining, reset_after_ms, retry_after_ms, limit, capacity] = a;
            answers.push(Answer {
                granted,
                remaining,
                reset_after_ms,
                retry_after_ms,
                limit,
                capacity,
            });
        }
        Ok(Self {
            granted: allowed == 1,
            lease_ms,
            now_ms,
            answers,
        })
    }

    #[cfg(feature = "redis")]
    fn malformed(bytes: &[u8]) -> StoreError {
        StoreError::Protocol(crate::error::Cause::from(format!(
            "lease reply of {} bytes, starting {:02x?}",
            bytes.len(),
            &bytes[..bytes.len().min(32)]
        )))
    }
}

/// A shared store that keeps a lease ledger: what [`LeasedStore`](super::LeasedStore)
/// needs from the store it wraps, besides the ordinary [`Store`] it uses for the policies
/// that cannot be leased.
///
/// Implemented by `RedisStore` and `RedisClusterStore` (feature `redis`, `cluster`: one
/// atomic script per call, all of a key's ledger entries under its hash tag) and by
/// [`MemoryLedger`].
///
/// ```
/// use tollgate::store::leased::{LeaseBackend, MemoryLedger};
///
/// fn takes_a_backend(_: &impl LeaseBackend) {}
/// takes_a_backend(&MemoryLedger::new());
/// ```
pub trait LeaseBackend: Store {
    /// Runs one ledger call for `key`'s `policies` (in the order of the call's parts),
    /// atomically.
    fn ledger(
        &self,
        key: &Key,
        policies: &[Policy],
        call: LedgerCall,
    ) -> BoxFuture<Result<LedgerReply, StoreError>>;
}

/// One policy's ledger state.
#[derive(Debug, Clone)]
enum LState {
    Counter {
        w: u64,
        c: u64,
        p: u64,
    },
    Fixed {
        w: u64,
        c: u64,
    },
    Bucket {
        d: u64,
        u: u64,
    },
    /// Entry id → (end of its period, units).
    Log(BTreeMap<u64, (u64, u64)>),
}

/// The loaded view of one policy, as `lua/lease.lua` computes it.
struct View {
    idx: u64,
    prev: u64,
    cur: u64,
    deficit: u64,
    used: u64,
}

// The arithmetic below is the Lua's, in integers. A part's `n`, `w` and `cap` come from a
// validated policy or a usable override (`n × w`, `cap × w` ≤ 2^50); the states only grow by
// grants that fit and by overcharges (debts) saturating at ⌊2^52 / W⌋ units (a deficit of
// 2^52), so every product of a count and a window stays below 2^53 (exact in Lua's doubles).
// What a caller sends (costs, wants, settlements, refunds) can be any `u64`: every term it
// enters saturates, so a hostile number is refused or capped, never wrapped.

fn load(part: &Part, state: Option<&LState>, now: u64) -> View {
    let idx = now / part.window_ms;
    let mut v = View {
        idx,
        prev: 0,
        cur: 0,
        deficit: 0,
        used: 0,
    };
    match state {
        // A count past the limit (a settlement's debt) is carried into the next windows, as
        // the algorithms carry it.
        Some(&LState::Counter { w, c, p }) => {
            let s = SlidingWindowCounterState {
                window: w,
                current: c,
                previous: p,
            };
            (v.prev, v.cur) = sliding_window_counter::counts(&s, idx, part.limit);
        }
        Some(&LState::Fixed { w, c }) => {
            let s = FixedWindowState {
                window: w,
                count: c,
            };
            v.cur = fixed_window::count_at(&s, idx, part.limit);
        }
        Some(LState::Bucket { d, u }) => {
            let elapsed = now.saturating_sub(*u);
            v.deficit = d.saturating_sub(elapsed.saturating_mul(part.limit));
        }
        Some(LState::Log(entries)) => {
            v.used = entries
                .values()
                .filter(|(end, _)| end.saturating_add(part.window_ms) > now)
                .fold(0u64, |sum, (_, u)| sum.saturating_add(*u));
        }
        None => {}
    }
    v
}

/// The algorithms' view of a part's numbers (a ledger part is never a shaping GCRA).
fn limits(part: &Part) -> Limits {
    Limits {
        limit: part.limit,
        window_ms: part.window_ms,
        capacity: part.capacity,
        max_delay_ms: 0,
    }
}

/// The counter's state as the view `v` sees it at its window.
fn counter_state(v: &View) -> SlidingWindowCounterState {
    SlidingWindowCounterState {
        window: v.idx,
        current: v.cur,
        previous: v.prev,
    }
}

/// The fixed window's state as the view `v` sees it at its window.
fn fixed_state(v: &View) -> FixedWindowState {
    FixedWindowState {
        window: v.idx,
        count: v.cur,
    }
}

/// The counter's weighted count at `now`, scaled by `w`.
fn weighted(part: &Part, v: &View, now: u64) -> u64 {
    let e = now - v.idx * part.window_ms;
    v.prev
        .saturating_mul(part.window_ms - e)
        .saturating_add(v.cur.saturating_mul(part.window_ms))
}

/// The most units a block valid `t` ms may hold now; `None` when not even one.
fn most(part: &Part, v: &View, now: u64, t: u64) -> Option<u64> {
    match part.kind {
        Kind::Counter => (part.limit * part.window_ms)
            .checked_sub(weighted(part, v, now))
            .map(|room| room / part.window_ms),
        Kind::Log => part.limit.checked_sub(v.used),
        Kind::Fixed => part.limit.checked_sub(v.cur),
        Kind::Bucket => (part.capacity * part.window_ms)
            .checked_sub(v.deficit.saturating_add(part.limit.saturating_mul(t)))
            .map(|room| room / part.window_ms),
    }
}

fn fits(part: &Part, v: &View, now: u64, t: u64, units: u64) -> bool {
    most(part, v, now, t).is_some_and(|m| m >= units)
}

fn retry(part: &Part, v: &View, state: Option<&LState>, now: u64, cost: u64) -> u64 {
    match part.kind {
        Kind::Counter if cost > part.limit => {
            // Never passes; asked again once the counter has forgotten everything (its debt
            // paid), and no sooner than two windows.
            let clears = sliding_window_counter::clears_in(
                v.prev,
                v.cur,
                v.idx,
                now,
                part.limit,
                part.window_ms,
            );
            clears.max(2 * part.window_ms)
        }
        Kind::Counter => {
            SlidingWindowCounter::evaluate(&counter_state(v), now, &limits(part), cost)
                .retry_after_millis()
                .max(1)
        }
        Kind::Log => {
            let mut entries: Vec<(u64, u64)> = match state {
                Some(LState::Log(e)) => e
                    .values()
                    .filter(|(end, _)| end.saturating_add(part.window_ms) > now)
                    .copied()
                    .collect(),
                _ => Vec::new(),
            };
            entries.sort_unstable();
            let (mut freed, mut at) = (0u64, now + part.window_ms);
            for (end, units) in entries {
                freed = freed.saturating_add(units);
                at = end.saturating_add(part.window_ms);
                if v.used.saturating_sub(freed).saturating_add(cost) <= part.limit {
                    break;
                }
            }
            at.saturating_sub(now).max(1)
        }
        // Never passes; asked again once the window's count (its debt) is paid off.
        Kind::Fixed if cost > part.limit => {
            let windows = v.cur.div_ceil(part.limit).max(1);
            v.idx
                .saturating_add(windows)
                .saturating_mul(part.window_ms)
                .saturating_sub(now)
        }
        Kind::Fixed => FixedWindow::evaluate(&fixed_state(v), now, &limits(part), cost)
            .retry_after_millis()
            .max(1),
        // A cost above the capacity never passes: asked again once the bucket is full.
        Kind::Bucket if cost > part.capacity => v.deficit.div_ceil(part.limit).max(1),
        Kind::Bucket => (v.deficit + cost * part.window_ms)
            .saturating_sub(part.capacity * part.window_ms)
            .div_ceil(part.limit)
            .max(1),
    }
}

fn view_of(part: &Part, v: &View, state: Option<&LState>, now: u64) -> (u64, u64) {
    match part.kind {
        Kind::Counter => {
            let d = SlidingWindowCounter::evaluate(&counter_state(v), now, &limits(part), 0);
            (d.remaining(), d.reset_after_millis())
        }
        Kind::Log => {
            let newest = match state {
                Some(LState::Log(e)) => e
                    .values()
                    .map(|(end, _)| end.saturating_add(part.window_ms).saturating_sub(now))
                    .max()
                    .unwrap_or(0),
                _ => 0,
            };
            (part.limit.saturating_sub(v.used), newest)
        }
        Kind::Fixed => {
            let d = FixedWindow::evaluate(&fixed_state(v), now, &limits(part), 0);
            (d.remaining(), d.reset_after_millis())
        }
        Kind::Bucket => (
            (part.capacity * part.window_ms).saturating_sub(v.deficit) / part.window_ms,
            v.deficit.div_ceil(part.limit),
        ),
    }
}

/// Charges `k` units used at most until `now + valid` into the state.
fn charge(
    part: &Part,
    v: &mut View,
    state: &mut Option<LState>,
    now: u64,
    k: u64,
    valid: u64,
    id: u64,
) {
    match part.kind {
        Kind::Counter => {
            v.cur = v.cur.saturating_add(k);
            *state = Some(LState::Counter {
                w: v.idx,
                c: v.cur,
                p: v.prev,
            });
        }
        Kind::Fixed => {
            v.cur = v.cur.saturating_add(k);
            *state = Some(LState::Fixed { w: v.idx, c: v.cur });
        }
        Kind::Bucket => {
            v.deficit = v
                .deficit
                .saturating_add(k.saturating_mul(part.window_ms))
                .saturating_add(part.limit.saturating_mul(valid));
            let u = match state {
                Some(LState::Bucket { u, .. }) => now.max(*u),
                _ => now,
            };
            *state = Some(LState::Bucket { d: v.deficit, u });
        }
        Kind::Log => {
            v.used = v.used.saturating_add(k);
            let log = match state {
                Some(LState::Log(log)) => log,
                other => {
                    *other = Some(LState::Log(BTreeMap::new()));
                    match other {
                        Some(LState::Log(log)) => log,
                        _ => return,
                    }
                }
            };
            log.retain(|_, (end, _)| end.saturating_add(part.window_ms) > now);
            log.insert(id, (now.saturating_add(valid), k));
        }
    }
}

/// Charges `extra` units whatever the state (a settlement above its reservation), as the
/// exact algorithms' `overcharge` does, through their own arithmetic: in full, a debt the key
/// pays back at its limit's rate (the windows carry a count past the limit into the next
/// windows, the log dates an entry ahead, the bucket goes into deficit), saturating at
/// ⌊2^52 / W⌋ units ([`MAX_USAGE_WINDOW_PRODUCT`](crate::algorithm::MAX_USAGE_WINDOW_PRODUCT)).
/// A debt is never forgiven: grants see it as used (no block hands out units it owes).
fn force(part: &Part, state: &mut Option<LState>, now: u64, extra: u64, id: u64) {
    let limits = limits(part);
    match (part.kind, state.as_ref()) {
        (Kind::Bucket, s) => {
            let mut b = match s {
                Some(&LState::Bucket { d, u }) => TokenBucketState {
                    deficit: d,
                    updated_at: u,
                },
                _ => TokenBucketState::default(),
            };
            TokenBucket::overcharge(&mut b, now, &limits, extra);
            *state = Some(LState::Bucket {
                d: b.deficit,
                u: b.updated_at,
            });
        }
        (Kind::Counter, s) => {
            let mut c = match s {
                Some(&LState::Counter { w, c, p }) => SlidingWindowCounterState {
                    window: w,
                    current: c,
                    previous: p,
                },
                _ => SlidingWindowCounterState::default(),
            };
            SlidingWindowCounter::overcharge(&mut c, now, &limits, extra);
            *state = Some(LState::Counter {
                w: c.window,
                c: c.current,
                p: c.previous,
            });
        }
        (Kind::Fixed, s) => {
            let mut f = match s {
                Some(&LState::Fixed { w, c }) => FixedWindowState {
                    window: w,
                    count: c,
                },
                _ => FixedWindowState::default(),
            };
            FixedWindow::overcharge(&mut f, now, &limits, extra);
            *state = Some(LState::Fixed {
                w: f.window,
                c: f.count,
            });
        }
        (Kind::Log, s) => {
            let mut v = load(part, s, now);
            // The entry the exact log would write, dated as far ahead: it counts until `W`
            // after that, as a block's entry counts until `W` after its period ends.
            if let Some((ahead, units)) = sliding_window_log::debt_entry(v.used, extra, &limits) {
                charge(part, &mut v, state, now, units, ahead, id);
            }
        }
    }
}

/// Runs one ledger call over `states` (one per part, in order) at `now`: the Rust twin of
/// `lua/lease.lua`. The call's parts already carry the overrides in force.
fn run(call: &LedgerCall, states: &mut [Option<LState>], now: u64) -> LedgerReply {
    let done = |granted| LedgerReply {
        granted,
        lease_ms: 0,
        now_ms: now,
        answers: SmallVec::new(),
    };
    match call.mode {
        Mode::Return => {
            for (part, state) in call.parts.iter().zip(states.iter_mut()) {
                give_back(part, &part.returned, state, now, call.block_id);
            }
            return done(true);
        }
        Mode::Force => {
            // Answers whether the key is within its limits afterwards: when a debt stands,
            // the caller gives back the block it holds, charged before the debt.
            let mut clear = true;
            for (part, state) in call.parts.iter().zip(states.iter_mut()) {
                if part.cost > 0 {
                    force(part, state, now, part.cost, call.block_id);
                }
                let v = load(part, state.as_ref(), now);
                clear &= most(part, &v, now, 0).is_some();
            }
            return done(clear);
        }
        Mode::Reset => {
            for state in states.iter_mut() {
                *state = None;
            }
            return done(true);
        }
        // Nothing expires in process memory.
        Mode::Keep => return done(true),
        Mode::Grant | Mode::Peek => {}
    }
    if call.mode == Mode::Grant && call.previous_block != 0 {
        for (part, state) in call.parts.iter().zip(states.iter_mut()) {
            give_back(part, &part.returned, state, now, call.previous_block);
        }
    }
    let mut views: SmallVec<[View; 2]> = call
        .parts
        .iter()
        .zip(states.iter())
        .map(|(p, s)| load(p, s.as_ref(), now))
        .collect();
    let mut valid: Option<u64> = None;
    let mut granted: SmallVec<[u64; 2]> = SmallVec::new();
    if call.mode == Mode::Grant
        && call.lease_ms > 0
        && call
            .parts
            .iter()
            .zip(&views)
            .all(|(p, v)| fits(p, v, now, call.lease_ms, p.cost))
    {
        let mut t = call.lease_ms;
        for (p, v) in call.parts.iter().zip(&views) {
            let m = most(p, v, now, call.lease_ms).unwrap_or(0);
            granted.push(p.wanted.min(m).max(p.cost));
            if matches!(p.kind, Kind::Counter | Kind::Fixed) {
                t = t.min((v.idx + 1) * p.window_ms - now);
            }
        }
        valid = Some(t);
    }
    if valid.is_none()
        && call
            .parts
            .iter()
            .zip(&views)
            .all(|(p, v)| fits(p, v, now, 0, p.cost))
    {
        granted = call.parts.iter().map(|p| p.cost).collect();
        valid = Some(0);
    }
    let Some(valid) = valid else {
        let answers = call
            .parts
            .iter()
            .zip(&views)
            .zip(states.iter())
            .map(|((p, v), s)| {
                let (remaining, reset_after_ms) = view_of(p, v, s.as_ref(), now);
                let retry_after_ms = if fits(p, v, now, 0, p.cost) {
                    0
                } else {
                    retry(p, v, s.as_ref(), now, p.cost)
                };
                Answer {
                    granted: 0,
                    remaining,
                    reset_after_ms,
                    retry_after_ms,
                    limit: p.limit,
                    capacity: p.capacity,
                }
            })
            .collect();
        return LedgerReply {
            granted: false,
            lease_ms: 0,
            now_ms: now,
            answers,
        };
    };
    let mut answers = SmallVec::new();
    for (i, part) in call.parts.iter().enumerate() {
        let v = &mut views[i];
        if call.mode == Mode::Grant {
            charge(
                part,
                v,
                &mut states[i],
                now,
                granted[i],
                valid,
                call.block_id,
            );
        } else {
            match part.kind {
                Kind::Log => v.used += granted[i],
                Kind::Bucket => v.deficit += granted[i] * part.window_ms,
                _ => v.cur += granted[i],
            }
        }
        let (remaining, mut reset_after_ms) = view_of(part, v, states[i].as_ref(), now);
        if call.mode == Mode::Peek && part.kind == Kind::Log && granted[i] > 0 {
            // The entry a peek does not write would count for a whole window.
            reset_after_ms = reset_after_ms.max(part.window_ms);
        }
        answers.push(Answer {
            granted: granted[i],
            remaining,
            reset_after_ms,
            retry_after_ms: 0,
            limit: part.limit,
            capacity: part.capacity,
        });
    }
    LedgerReply {
        granted: true,
        lease_ms: valid,
        now_ms: now,
        answers,
    }
}

/// Gives back what `back` leaves unused of block `id` (for the bucket, also the refill
/// charged ahead for the rest of its lease; for the log, the time its entry still counts).
fn give_back(part: &Part, back: &Returned, state: &mut Option<LState>, now: u64, id: u64) {
    let Returned {
        granted: k,
        unused,
        granted_at: g,
        lease_ms: valid,
        rate,
    } = *back;
    if unused == 0 && !matches!(part.kind, Kind::Bucket | Kind::Log) {
        return;
    }
    let gidx = g / part.window_ms;
    match state {
        Some(LState::Counter { w, c, p }) => {
            if *w == gidx {
                *c = c.saturating_sub(unused);
            } else if *w == gidx.saturating_add(1) {
                *p = p.saturating_sub(unused);
            }
        }
        Some(LState::Fixed { w, c }) if *w == gidx => *c = c.saturating_sub(unused),
        Some(LState::Log(log)) => {
            if let Some((end, units)) = log.get(&id).copied() {
                if units <= unused {
                    log.remove(&id);
                } else if unused == 0 {
                    log.insert(id, (end.min(now), units));
                } else {
                    log.insert(id, (end.min(now), units - unused));
                }
            }
        }
        Some(LState::Bucket { .. }) => {
            let v = load(part, state.as_ref(), now);
            if v.deficit == 0 {
                return;
            }
            // The rate the block reserved its refill at, and the one in force now: the
            // reservation comes back at the lower, the block's weight decays at the higher.
            let at_grant = if rate > 0 { rate } else { part.limit };
            let (slow, fast) = (part.limit.min(at_grant), part.limit.max(at_grant));
            let end = g.saturating_add(valid);
            let back = unused
                .saturating_mul(part.window_ms)
                .min(
                    k.saturating_mul(part.window_ms)
                        .saturating_sub(fast.saturating_mul(now.saturating_sub(end))),
                )
                .saturating_add(slow.saturating_mul(end.saturating_sub(now)));
            let u = match state {
                Some(LState::Bucket { u, .. }) => now.max(*u),
                _ => now,
            };
            *state = Some(LState::Bucket {
                d: v.deficit.saturating_sub(back),
                u,
            });
        }
        _ => {}
    }
}

mod memory;
#[cfg(all(test, feature = "redis"))]
mod tests;

pub use memory::MemoryLedger;
