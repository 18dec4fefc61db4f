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
//!
//! **Debts**: a settlement above its reservation ([`overcharge`](LimitAlgorithm::overcharge))
//! that takes the logged units past `N` is logged as one entry dated ahead of `now`, so that
//! it keeps the key refused until the windows the units used up have passed (one entry,
//! however large the debt).

use std::collections::VecDeque;

use super::{max_units, never_fits, LimitAlgorithm, PolicyDecision};
use crate::policy::{Algorithm, Limits};

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

/// The live entries at `now`: those logged after `now − W` (a debt's entry, dated ahead of
/// `now`, included).
fn live(state: &SlidingWindowLogState, now: u64, w: u64) -> impl Iterator<Item = &(u64, u64)> {
    state
        .entries
        .iter()
        .filter(move |(t, _)| t.saturating_add(w) > now)
}

/// The units logged in the window at `now`.
fn used(state: &SlidingWindowLogState, now: u64, w: u64) -> u64 {
    live(state, now, w).fold(0, |sum, (_, c)| sum.saturating_add(*c))
}

/// The sliding window log algorithm; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowLog;

impl LimitAlgorithm for SlidingWindowLog {
    type State = SlidingWindowLogState;

    const ALGORITHM: Algorithm = Algorithm::SlidingWindowLog;

    /// What a request of `cost` at `now` would get, changing nothing.
    fn evaluate(
        state: &SlidingWindowLogState,
        now: u64,
        limits: &Limits,
        cost: u64,
    ) -> PolicyDecision {
        let n = limits.limit();
        let w = limits.window_millis();
        if cost > limits.capacity() {
            return never_fits(Self::evaluate(state, now, limits, 0));
        }
        let used = used(state, now, w);
        let allowed = used.saturating_add(cost) <= n;
        // When the newest entry leaves the window (a debt's entry is dated ahead of now).
        let newest = state
            .entries
            .back()
            .map(|(t, _)| t.saturating_add(w))
            .filter(|&leaves| leaves > now)
            .map_or(0, |leaves| leaves - now);
        let (after, reset_after) = if allowed && cost > 0 {
            (used + cost, newest.max(w))
        } else {
            (used, newest)
        };
        let retry_after = if allowed {
            0
        } else {
            let mut freed: u64 = 0;
            let mut at = now;
            for (t, c) in live(state, now, w) {
                freed = freed.saturating_add(*c);
                at = t.saturating_add(w);
                if used.saturating_sub(freed).saturating_add(cost) <= n {
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

    /// Drops expired entries and logs an allowed request (any other cost saturates at the
    /// state's cap, see [`MAX_USAGE_WINDOW_PRODUCT`](super::MAX_USAGE_WINDOW_PRODUCT)).
    fn commit(state: &mut SlidingWindowLogState, now: u64, limits: &Limits, cost: u64) {
        let w = limits.window_millis();
        let used = used(state, now, w);
        let cost = used.saturating_add(cost).min(used.max(max_units(limits))) - used;
        trim(state, now, w);
        log_at(state, now, cost);
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
    /// use tollgate::algorithm::{SlidingWindowLog as Swl, SlidingWindowLogState, LimitAlgorithm};
    /// use tollgate::{Algorithm, Policy, Rate};
    ///
    /// let policy = Policy::builder("p", Rate::per_second(1)).algorithm(Algorithm::SlidingWindowLog).build()?;
    /// let (_, mut state) = Swl::decide(SlidingWindowLogState::default(), 10_000, policy.limits(), 1);
    /// assert!(!Swl::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// Swl::refund(&mut state, 10_100, policy.limits(), 1);
    /// assert!(state.is_empty());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    fn refund(state: &mut SlidingWindowLogState, now: u64, limits: &Limits, cost: u64) {
        let w = limits.window_millis();
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

    /// Logs `extra` units whether or not they fit (a cost settled above its reservation), in
    /// full. While the units logged in the window stay within the limit, at `now`; when they
    /// go past it (`N + d` units), the extra is one entry dated `⌈(N + d)/N⌉ − 1` windows
    /// ahead of `now`, which keeps the key refused until the windows those units used up
    /// have passed: a debt paid at `N` units per window, rounded up to whole windows. Saturates
    /// at ⌊[`MAX_USAGE_WINDOW_PRODUCT`](super::MAX_USAGE_WINDOW_PRODUCT) / W⌋ units.
    ///
    /// **Bound**: every request is admitted with room for its reservation, so a key whose
    /// requests are settled one after another is served, over any `j·W` ms, at most `j·N`
    /// plus the overshoot (actual cost less reservation) of its last request; requests
    /// reserved together add their overshoots, which the following windows then pay back.
    /// See [`Op::Settle`](crate::store::Op::Settle).
    fn overcharge(state: &mut SlidingWindowLogState, now: u64, limits: &Limits, extra: u64) {
        let w = limits.window_millis();
        let Some((ahead, extra)) = debt_entry(used(state, now, w), extra, limits) else {
            return;
        };
        trim(state, now, w);
        log_at(state, now.saturating_add(ahead), extra);
    }

    /// When the state stops mattering (ms since the epoch): when its newest entry leaves.
    fn expires_at(state: &SlidingWindowLogState, limits: &Limits) -> u64 {
        state
            .entries
            .back()
            .map_or(0, |(t, _)| t.saturating_add(limits.window_millis()))
    }
}

/// The entry an [`overcharge`](LimitAlgorithm::overcharge) of `extra` units logs when
/// `used` units are logged in the window: how far ahead of `now` it is dated (ms) and its
/// units (the extra, saturated at ⌊[`MAX_USAGE_WINDOW_PRODUCT`](super::MAX_USAGE_WINDOW_PRODUCT)
/// / W⌋ units in all); `None` when there is nothing to log. The lease ledger logs the same
/// entry.
pub(crate) fn debt_entry(used: u64, extra: u64, limits: &Limits) -> Option<(u64, u64)> {
    let total = used.saturating_add(extra).min(used.max(max_units(limits)));
    let extra = total - used;
    if extra == 0 {
        return None;
    }
    let ahead = total.div_ceil(limits.limit()) - 1;
    Some((ahead.saturating_mul(limits.window_millis()), extra))
}

/// Drops the entries that have left the window at `now`.
fn trim(state: &mut SlidingWindowLogState, now: u64, w: u64) {
    while state
        .entries
        .front()
        .is_some_and(|(t, _)| t.saturating_add(w) <= now)
    {
        state.entries.pop_front();
    }
}

/// Logs `cost` units at `at`, keeping the log in time order: merged into an entry of the same
/// millisecond; after a debt's entry dated ahead (or a clock that stepped back), inserted in
/// place.
fn log_at(state: &mut SlidingWindowLogState, at: u64, cost: u64) {
    match state.entries.back_mut() {
        Some((t, c)) if *t == at => *c = c.saturating_add(cost),
        Some((t, _)) if *t > at => {
            let i = state.entries.partition_point(|(t, _)| *t <= at);
            if i > 0 && state.entries[i - 1].0 == at {
                let c = &mut state.entries[i - 1].1;
                *c = c.saturating_add(cost);
            } else {
                state.entries.insert(i, (at, cost));
            }
        }
        _ => state.entries.push_back((at, cost)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_support::{assert_retry, policy_for};
    use crate::{Policy, Rate};
    use std::time::Duration;

    fn policy(n: u64, w_ms: u64) -> Policy {
        policy_for::<SlidingWindowLog>(Rate::new(n, Duration::from_millis(w_ms)))
    }

    #[test]
    fn exact_window_and_retry() {
        let p = policy(3, 1000);
        let mut s = SlidingWindowLogState::default();
        for t in [100, 400, 700] {
            let (d, ns) = SlidingWindowLog::decide(s, t, p.limits(), 1);
            assert!(d.is_allowed());
            s = ns;
        }
        let (d, s2) = SlidingWindowLog::decide(s.clone(), 900, p.limits(), 1);
        assert!(!d.is_allowed());
        assert_eq!(s, s2);
        assert_eq!(d.retry_after_millis(), 200); // the entry at 100 leaves at 1100
        assert_eq!(d.reset_after_millis(), 800); // the entry at 700 leaves at 1700
        assert_retry::<SlidingWindowLog>(&s, 900, p.limits(), 1, &d);
        let d = SlidingWindowLog::evaluate(&s, 900, p.limits(), 2);
        assert_eq!(d.retry_after_millis(), 500);
        assert_retry::<SlidingWindowLog>(&s, 900, p.limits(), 2, &d);
        let d = SlidingWindowLog::evaluate(&s, 900, p.limits(), 3);
        assert_eq!(d.retry_after_millis(), 800);
        assert_retry::<SlidingWindowLog>(&s, 900, p.limits(), 3, &d);
    }

    #[test]
    fn a_refund_takes_units_off_the_newest_entries() {
        let p = policy(4, 1000);
        let mut s = SlidingWindowLogState::default();
        for (t, c) in [(100, 1), (200, 2), (300, 1)] {
            s = SlidingWindowLog::decide(s, t, p.limits(), c).1;
        }
        assert!(!SlidingWindowLog::evaluate(&s, 400, p.limits(), 1).is_allowed());
        let mut r = s.clone();
        SlidingWindowLog::refund(&mut r, 400, p.limits(), 2);
        assert_eq!(r.entries, VecDeque::from(vec![(100, 1), (200, 1)]));
        assert!(SlidingWindowLog::evaluate(&r, 400, p.limits(), 2).is_allowed());
        // Charge then refund gives the decision before the charge.
        let (_, mut back) = SlidingWindowLog::decide(r.clone(), 500, p.limits(), 2);
        SlidingWindowLog::refund(&mut back, 500, p.limits(), 2);
        assert_eq!(back, r);
        // Never below empty; entries out of the window are never refunded.
        SlidingWindowLog::refund(&mut r, 450, p.limits(), 10);
        assert!(r.entries.is_empty());
        let mut late = s.clone();
        SlidingWindowLog::refund(&mut late, 1_300, p.limits(), 4);
        assert_eq!(late, s);
    }

    #[test]
    fn same_millisecond_requests_share_an_entry_and_expired_ones_go() {
        let p = policy(5, 1000);
        let mut s = SlidingWindowLogState::default();
        for _ in 0..3 {
            s = SlidingWindowLog::decide(s, 50, p.limits(), 1).1;
        }
        assert_eq!(s.entries, VecDeque::from(vec![(50, 3)]));
        s = SlidingWindowLog::decide(s, 2_000, p.limits(), 1).1;
        assert_eq!(s.entries, VecDeque::from(vec![(2_000, 1)]));
    }
}
