//! Sliding window log: every admitted request's time and cost, exact.
//!
//! A request of cost `x` at time `t` is allowed when the costs logged in `(t − W, t]` plus `x`
//! are at most `N`. An entry logged at `s` stops counting at `s + W`.
//!
//! * `remaining`: `N` minus the logged costs in `(t − W, t]` after this decision.
//! * `reset_after`: time until the newest entry leaves the window (0 when the log is empty).
//! * `retry_after`: the moment the oldest entries have left the window far enough for `x` to
//!   fit — exact, since nothing else changes the sum.
//!
//! **Accuracy bound**: exact. In every span shorter than `W` ms the admitted total is at most
//! `N`. Memory is O(entries in the window); the limit is capped at
//! [`MAX_LOG_LIMIT`](crate::policy::MAX_LOG_LIMIT).

use std::collections::VecDeque;

use super::PolicyDecision;
use crate::policy::Policy;

/// The log: `(time, cost)` pairs in time order. Requests in the same millisecond share an
/// entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowLogState {
    /// `(ms since the epoch, cost)`, oldest first.
    pub(crate) entries: VecDeque<(u64, u64)>,
}

impl SlidingWindowLogState {
    /// The logged entries, `(ms since the epoch, cost)`, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Whether nothing is logged.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The live entries at `now`: those logged after `now − W`.
fn live(state: &SlidingWindowLogState, now: u64, w: u64) -> impl Iterator<Item = &(u64, u64)> {
    state.entries.iter().filter(move |(t, _)| t + w > now)
}

/// What a request of `cost` at `now` would get, changing nothing.
pub fn evaluate(
    state: &SlidingWindowLogState,
    now: u64,
    policy: &Policy,
    cost: u64,
) -> PolicyDecision {
    let n = policy.limit();
    let w = policy.window_millis();
    let used: u64 = live(state, now, w).map(|(_, c)| c).sum();
    let allowed = used + cost <= n;
    let newest = state
        .entries
        .back()
        .map(|(t, _)| *t)
        .filter(|t| t + w > now);
    let (after, reset_after) = if allowed && cost > 0 {
        (used + cost, w)
    } else {
        (used, newest.map_or(0, |t| t + w - now))
    };
    let retry_after = if allowed {
        0
    } else {
        let mut freed = 0;
        let mut at = now;
        for (t, c) in live(state, now, w) {
            freed += c;
            at = t + w;
            if used - freed + cost <= n {
                break;
            }
        }
        at - now
    };
    PolicyDecision::from_parts(
        allowed,
        n,
        n.saturating_sub(after),
        reset_after,
        retry_after,
        0,
    )
}

/// Drops expired entries and logs an allowed request.
pub fn commit(state: &mut SlidingWindowLogState, now: u64, policy: &Policy, cost: u64) {
    let w = policy.window_millis();
    while state.entries.front().is_some_and(|(t, _)| t + w <= now) {
        state.entries.pop_front();
    }
    match state.entries.back_mut() {
        Some((t, c)) if *t == now => *c += cost,
        Some((t, _)) if *t > now => {
            // A clock that stepped back: keep the log sorted anyway.
            let at = state.entries.partition_point(|(t, _)| *t <= now);
            if at > 0 && state.entries[at - 1].0 == now {
                state.entries[at - 1].1 += cost;
            } else {
                state.entries.insert(at, (now, cost));
            }
        }
        _ => state.entries.push_back((now, cost)),
    }
}

/// Gives back up to `cost` units charged recently (a charge whose request turned out not to
/// count, such as a login that succeeded): they come off the newest live entries, and an
/// entry left with nothing is removed.
///
/// **Bound**: never more than `cost` units, and never units that have already left the
/// window, so the log is never better than a fresh one. It is exact when the refunded charge
/// is the newest (the usual case: a refund follows its own check). When newer requests were
/// logged since, their units are taken instead and the refunded charge stays in the log:
/// the sum in the window is the same, but those units leave the window earlier than they
/// should, by at most the time between the two requests.
///
/// ```
/// use tollgate::algorithm::{sliding_window_log as swl, SlidingWindowLogState};
/// use tollgate::{Algorithm, Policy, Rate};
///
/// let policy = Policy::builder("p", Rate::per_second(1)).algorithm(Algorithm::SlidingWindowLog).build()?;
/// let (_, mut state) = swl::decide(SlidingWindowLogState::default(), 10_000, &policy, 1);
/// assert!(!swl::evaluate(&state, 10_100, &policy, 1).is_allowed());
/// swl::refund(&mut state, 10_100, &policy, 1);
/// assert!(state.is_empty());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub fn refund(state: &mut SlidingWindowLogState, now: u64, policy: &Policy, cost: u64) {
    let w = policy.window_millis();
    let mut left = cost;
    while left > 0 {
        let Some((t, c)) = state.entries.back_mut() else {
            break;
        };
        if t.saturating_add(w) <= now {
            break; // the newest entry has left the window, and so have the others
        }
        let take = left.min(*c);
        *c -= take;
        left -= take;
        if *c == 0 {
            state.entries.pop_back();
        }
    }
}

/// [`evaluate`] then, if allowed, [`commit`].
pub fn decide(
    mut state: SlidingWindowLogState,
    now: u64,
    policy: &Policy,
    cost: u64,
) -> (PolicyDecision, SlidingWindowLogState) {
    let d = evaluate(&state, now, policy, cost);
    if d.is_allowed() {
        commit(&mut state, now, policy, cost);
    }
    (d, state)
}

/// Logs `extra` units at `now` whether or not they fit (a cost settled above its
/// reservation), at most the limit at a time. Every entry leaves the log one window after it
/// was made, so the key waits at most one window.
pub fn overcharge(state: &mut SlidingWindowLogState, now: u64, policy: &Policy, extra: u64) {
    commit(state, now, policy, extra.min(policy.limit()));
}

/// When the state stops mattering (ms since the epoch): when its newest entry leaves.
pub fn expires_at(state: &SlidingWindowLogState, policy: &Policy) -> u64 {
    state
        .entries
        .back()
        .map_or(0, |(t, _)| t + policy.window_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_support::assert_retry_exact;
    use crate::{Algorithm, Rate};
    use std::time::Duration;

    fn policy(n: u64, w_ms: u64) -> Policy {
        Policy::builder("swl", Rate::new(n, Duration::from_millis(w_ms)))
            .algorithm(Algorithm::SlidingWindowLog)
            .build()
            .unwrap()
    }

    #[test]
    fn exact_window_and_retry() {
        let p = policy(3, 1000);
        let mut s = SlidingWindowLogState::default();
        for t in [100, 400, 700] {
            let (d, ns) = decide(s, t, &p, 1);
            assert!(d.is_allowed());
            s = ns;
        }
        let (d, s2) = decide(s.clone(), 900, &p, 1);
        assert!(!d.is_allowed());
        assert_eq!(s, s2);
        assert_eq!(d.retry_after_millis(), 200); // the entry at 100 leaves at 1100
        assert_eq!(d.reset_after_millis(), 800); // the entry at 700 leaves at 1700
        assert_retry_exact(&s, 900, 1, &d, |s, t, c| evaluate(s, t, &p, c));
        let d = evaluate(&s, 900, &p, 2);
        assert_eq!(d.retry_after_millis(), 500);
        assert_retry_exact(&s, 900, 2, &d, |s, t, c| evaluate(s, t, &p, c));
        let d = evaluate(&s, 900, &p, 3);
        assert_eq!(d.retry_after_millis(), 800);
        assert_retry_exact(&s, 900, 3, &d, |s, t, c| evaluate(s, t, &p, c));
    }

    #[test]
    fn a_refund_takes_units_off_the_newest_entries() {
        let p = policy(4, 1000);
        let mut s = SlidingWindowLogState::default();
        for (t, c) in [(100, 1), (200, 2), (300, 1)] {
            s = decide(s, t, &p, c).1;
        }
        assert!(!evaluate(&s, 400, &p, 1).is_allowed());
        let mut r = s.clone();
        refund(&mut r, 400, &p, 2);
        assert_eq!(r.entries, VecDeque::from(vec![(100, 1), (200, 1)]));
        assert!(evaluate(&r, 400, &p, 2).is_allowed());
        // Charge then refund gives the decision before the charge.
        let (_, mut back) = decide(r.clone(), 500, &p, 2);
        refund(&mut back, 500, &p, 2);
        assert_eq!(back, r);
        // Never below empty; entries out of the window are never refunded.
        refund(&mut r, 450, &p, 10);
        assert!(r.entries.is_empty());
        let mut late = s.clone();
        refund(&mut late, 1_300, &p, 4);
        assert_eq!(late, s);
    }

    #[test]
    fn same_millisecond_requests_share_an_entry_and_expired_ones_go() {
        let p = policy(5, 1000);
        let mut s = SlidingWindowLogState::default();
        for _ in 0..3 {
            s = decide(s, 50, &p, 1).1;
        }
        assert_eq!(s.entries, VecDeque::from(vec![(50, 3)]));
        s = decide(s, 2_000, &p, 1).1;
        assert_eq!(s.entries, VecDeque::from(vec![(2_000, 1)]));
    }
}
