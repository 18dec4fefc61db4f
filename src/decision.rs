//! The answer for one request checked against one or more policies.

use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::PolicyDecision;

/// The answer for one request: allowed only if every policy allowed.
///
/// The accessors describe the *governing* policy: when denied, the denying policy that frees
/// up last (the largest `retry_after`); when allowed, the one with the fewest units left. The
/// per-policy answers are in [`policies`](Self::policies), in the order the policies were
/// given.
///
/// A decision may hold no policies at all: an exempt route, an allow-listed key, or a store
/// asked about none. It is then allowed, [`governing`](Self::governing) is `None`, and
/// `limit`, `remaining` and the times are 0; no accessor panics.
///
/// # Examples
///
/// ```
/// # tokio_test_block_on(async {
/// use tollgate::{Limiter, Policy, Rate, key::Key};
///
/// let limiter = Limiter::builder()
///     .policy(Policy::new("burst", Rate::per_second(2))?)
///     .policy(Policy::new("daily", Rate::per_day(1000))?)
///     .build()?;
/// let key = Key::new("user", "42");
/// let d = limiter.check(&key, 1).await?;
/// assert!(d.is_allowed());
/// assert_eq!(d.limit(), 2);          // the burst policy is the tighter one
/// assert_eq!(d.remaining(), 1);
/// assert_eq!(d.policies()[1].remaining(), 999);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Decision {
    allowed: bool,
    governing: usize,
    outcome: DecidedBy,
    decisions: SmallVec<[PolicyDecision; 2]>,
    slot: u64,
    /// Whether `slot` expires unless its holder refreshes it (a shared store's lease).
    slot_expires: bool,
}

/// Of allowed answers, the most restrictive: the fewest units left, and of policies tied on
/// that, the one whose quota comes back last (the first declared of those): a client that
/// uses up the rest is refused until that one resets.
fn most_restrictive(decisions: &[PolicyDecision]) -> Option<usize> {
    decisions
        .iter()
        .enumerate()
        .min_by_key(|(_, d)| (d.remaining, std::cmp::Reverse(d.reset_after_ms)))
        .map(|(i, _)| i)
}

/// Equal when the answers are: the [`slot`](Decision::slot) a store named is not part of
/// the answer.
impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed
            && self.governing == other.governing
            && self.outcome == other.outcome
            && self.decisions == other.decisions
    }
}

impl Eq for Decision {}

/// How a decision was reached: by the store, or by a failure mode while the store was
/// unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DecidedBy {
    /// The store decided.
    #[default]
    Decided,
    /// The store failed and the failure mode allowed the request.
    FailOpen,
    /// The store failed and the failure mode refused the request (the layer answers 503).
    FailClosed,
    /// The store failed and a local in-memory limiter decided.
    Fallback,
    /// A recent denial from the store was still in force: refused without asking it.
    CachedDeny,
}

impl DecidedBy {
    /// The name used in logs, spans and metrics (`decided`, `fail_open`, …).
    pub const fn as_str(&self) -> &'static str {
        match self {
            DecidedBy::Decided => "decided",
            DecidedBy::FailOpen => "fail_open",
            DecidedBy::FailClosed => "fail_closed",
            DecidedBy::Fallback => "fallback",
            DecidedBy::CachedDeny => "cached_deny",
        }
    }
}

impl Decision {
    /// Combines per-policy answers into one decision.
    ///
    /// The governing policy, which the classic headers describe: when allowed, the one with
    /// the fewest units left (of those tied, the one whose quota comes back last); when
    /// denied, the denying one that allows again last.
    ///
    /// An empty list gives an allowed decision with no policies: what an exempt route or an
    /// allow-listed key gets (`limit`, `remaining` and the times are then 0).
    pub fn from_policies(decisions: impl IntoIterator<Item = PolicyDecision>) -> Self {
        let decisions: SmallVec<[PolicyDecision; 2]> = decisions.into_iter().collect();
        let allowed = decisions.iter().all(PolicyDecision::is_allowed);
        let governing = if allowed {
            most_restrictive(&decisions).unwrap_or(0)
        } else {
            decisions
                .iter()
                .enumerate()
                .filter(|(_, d)| !d.allowed)
                .max_by_key(|(i, d)| (d.retry_after_ms, std::cmp::Reverse(*i)))
                .map_or(0, |(i, _)| i)
        };
        Self {
            allowed,
            governing,
            outcome: DecidedBy::Decided,
            decisions,
            slot: 0,
            slot_expires: false,
        }
    }

    /// The decision for a request that goes ahead unchecked (an exempt route, an
    /// allow-listed key): allowed, with no policies.
    pub(crate) fn pass() -> Self {
        Decision::from_policies([])
    }

    /// The decision of a single policy.
    pub fn single(decision: PolicyDecision) -> Self {
        Self {
            allowed: decision.allowed,
            governing: 0,
            outcome: DecidedBy::Decided,
            decisions: smallvec::smallvec![decision],
            slot: 0,
            slot_expires: false,
        }
    }

    /// This decision turned into a denial by a penalty block on policy `index` that lasts
    /// `retry_after_ms` more.
    pub(crate) fn blocked(mut self, index: usize, retry_after_ms: u64) -> Self {
        if let Some(d) = self.decisions.get_mut(index) {
            d.allowed = false;
            d.remaining = 0;
            d.delay_ms = 0;
            d.retry_after_ms = d.retry_after_ms.max(retry_after_ms).max(1);
            d.reset_after_ms = d.reset_after_ms.max(d.retry_after_ms);
            self.allowed = false;
            self.governing = index;
            // Another policy may free up even later.
            for (i, other) in self.decisions.iter().enumerate() {
                if !other.allowed
                    && other.retry_after_ms > self.decisions[self.governing].retry_after_ms
                {
                    self.governing = i;
                }
            }
        }
        self
    }

    /// The name the store gave the in-flight slot this request took (0 when it took none,
    /// or when the store counts slots without naming them).
    /// [`Op::Release`](crate::store::Op::Release) takes it back: a store releases a
    /// named slot only while the state it was taken from lives, so a slot taken before a
    /// [`reset`](crate::store::Op::Reset) and released after it frees nothing.
    pub fn slot(&self) -> u64 {
        self.slot
    }

    /// The same decision, holding the in-flight slot named `slot` in a shared store, where
    /// the slot expires unless its holder refreshes it (see
    /// [`Op::Refresh`](crate::store::Op::Refresh)).
    pub fn with_slot(mut self, slot: u64) -> Self {
        self.slot = slot;
        self.slot_expires = true;
        self
    }

    /// The same decision, holding the in-flight slot named `slot` in a store whose slots
    /// never expire (the memory store): nothing refreshes it.
    pub(crate) fn with_local_slot(mut self, slot: u64) -> Self {
        self.slot = slot;
        self.slot_expires = false;
        self
    }

    /// The same decision, holding the slot `other` holds.
    pub(crate) fn with_slot_of(mut self, other: &Decision) -> Self {
        self.slot = other.slot;
        self.slot_expires = other.slot_expires;
        self
    }

    /// Whether the slot expires unless refreshed.
    pub(crate) fn slot_expires(&self) -> bool {
        self.slot != 0 && self.slot_expires
    }

    /// Policy `index` was settled at `actual` units after `reserved` were charged: its
    /// `remaining` becomes what it would be had `actual` been charged.
    pub(crate) fn settled(&mut self, index: usize, reserved: u64, actual: u64) {
        if let Some(d) = self.decisions.get_mut(index) {
            d.remaining = d
                .remaining
                .saturating_add(reserved)
                .saturating_sub(actual)
                .min(d.limit);
            if let Some(g) = most_restrictive(&self.decisions).filter(|_| self.allowed) {
                self.governing = g;
            }
        }
    }

    /// How the decision was reached.
    pub fn decided_by(&self) -> DecidedBy {
        self.outcome
    }

    /// The same decision, marked as reached by `outcome`.
    pub fn with_decided_by(mut self, outcome: DecidedBy) -> Self {
        self.outcome = outcome;
        self
    }

    fn gov(&self) -> Option<&PolicyDecision> {
        self.decisions.get(self.governing)
    }

    /// Whether the request may pass.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Index of the governing policy in [`policies`](Self::policies) (0, and no such
    /// policy, when the decision holds none).
    pub fn governing_index(&self) -> usize {
        self.governing
    }

    /// The governing policy's answer.
    pub fn governing(&self) -> Option<&PolicyDecision> {
        self.gov()
    }

    /// Per-policy answers, in the order of the policies checked.
    pub fn policies(&self) -> &[PolicyDecision] {
        &self.decisions
    }

    /// The governing policy's quota.
    pub fn limit(&self) -> u64 {
        self.gov().map_or(0, |d| d.limit)
    }

    /// Units the governing policy has left after this decision.
    pub fn remaining(&self) -> u64 {
        self.gov().map_or(0, |d| d.remaining)
    }

    /// When the governing policy's quota is whole again.
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.gov().map_or(0, |d| d.reset_after_ms))
    }

    /// When denied, how long until the same request would be allowed by every policy that
    /// denied it; `None` when allowed.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_millis(self.retry_after_millis()))
    }

    /// [`retry_after`](Self::retry_after) in milliseconds (0 when allowed).
    pub fn retry_after_millis(&self) -> u64 {
        if self.allowed {
            0
        } else {
            self.gov().map_or(1, |d| d.retry_after_ms)
        }
    }

    /// For shaping policies: how long the allowed request must wait (the longest wait any
    /// policy asks for).
    pub fn delay(&self) -> Duration {
        Duration::from_millis(
            self.decisions
                .iter()
                .map(PolicyDecision::delay_millis)
                .max()
                .unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    /// A decision is moved by value on every request: past 128 bytes the compiler copies it
    /// with a `memcpy` call (about 30 instructions a move, four moves per `check`).
    #[test]
    fn a_decision_stays_within_128_bytes() {
        assert!(std::mem::size_of::<super::Decision>() <= 128);
    }
}
