//! Fixed window: one counter per window, windows aligned to the Unix epoch.
//!
//! A request of cost `c` at time `t` falls in window `k = ⌊t / W⌋`; it is allowed when the
//! window's count plus `c` is at most `N`.
//!
//! * `remaining`: `N` minus the window's count after this decision.
//! * `reset_after`: time until the count is back to 0 (the end of the current window; later
//!   while a debt is carried, see below); 0 when nothing is counted.
//! * `retry_after`: time until the window where the request fits starts, exactly (the count
//!   only drops at window starts).
//!
//! **Accuracy bound and known weakness**: at most `N` per *fixed* window, but up to `2N` in a
//! span as short as 2 ms around a window flip (`N` at the end of one window, `N` at the start of
//! the next): the boundary burst. Prefer the sliding window counter for anything
//! customer-facing.
//!
//! **Debts**: a settlement above its reservation ([`overcharge`](LimitAlgorithm::overcharge))
//! may push a window's count past `N`. What a window holds beyond `N` is carried into the
//! next one, less `N` per window (the debt is paid at the limit's rate), so a count of
//! `N + d` leaves the next windows `d`, `d − N`, … units short until it is paid.

use super::{ceil_div, max_units, never_fits, LimitAlgorithm, PolicyDecision};
use crate::policy::{Algorithm, Limits};

/// The window's index (`⌊t / W⌋`) and its count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FixedWindowState {
    /// `⌊t / W⌋` of the last charged request.
    pub(crate) window: u64,
    /// Units charged in that window.
    pub(crate) count: u64,
}

impl FixedWindowState {
    /// `⌊t / W⌋` of the last charged request.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Units charged in that window.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// The units counted in window `idx`: the state's count in its own window; in a later one,
/// what it held beyond the limit less `n` per window since (a debt paid at the limit's
/// rate); nothing in an earlier one.
pub(crate) fn count_at(state: &FixedWindowState, idx: u64, n: u64) -> u64 {
    if idx == state.window {
        state.count
    } else if idx > state.window {
        state
            .count
            .saturating_sub(n.saturating_mul(idx - state.window))
    } else {
        0
    }
}

/// Time from `now` until a count of `count` in the window ending `window_end` ms from now is
/// paid off: the rest of this window, then one more window per `n` units beyond the first
/// `n`; 0 for no count.
fn clears_in(count: u64, n: u64, w: u64, window_end: u64) -> u64 {
    if count == 0 {
        0
    } else {
        window_end.saturating_add((ceil_div(count, n) - 1).saturating_mul(w))
    }
}

/// The fixed window algorithm; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FixedWindow;

impl LimitAlgorithm for FixedWindow {
    type State = FixedWindowState;

    const ALGORITHM: Algorithm = Algorithm::FixedWindow;

    /// What a request of `cost` at `now` would get, changing nothing.
    #[inline]
    fn evaluate(state: &FixedWindowState, now: u64, limits: &Limits, cost: u64) -> PolicyDecision {
        let n = limits.limit();
        let w = limits.window_millis();
        if cost > limits.capacity() {
            return never_fits(Self::evaluate(state, now, limits, 0));
        }
        let idx = now / w;
        let count = count_at(state, idx, n);
        let window_end = w - now % w;
        let allowed = count.saturating_add(cost) <= n;
        let after = if allowed { count + cost } else { count };
        let retry_after = if allowed {
            0
        } else {
            // The first window whose carried count leaves room: `count − j·N + cost ≤ N`.
            let j = ceil_div(count.saturating_add(cost) - n, n);
            window_end.saturating_add((j - 1).saturating_mul(w))
        };
        PolicyDecision::from_parts(
            allowed,
            n,
            n.saturating_sub(after),
            clears_in(after, n, w, window_end),
            retry_after,
            0,
        )
    }

    /// Charges an allowed request (any other cost saturates at the state's cap, see
    /// [`MAX_USAGE_WINDOW_PRODUCT`](super::MAX_USAGE_WINDOW_PRODUCT)).
    #[inline]
    fn commit(state: &mut FixedWindowState, now: u64, limits: &Limits, cost: u64) {
        let idx = now / limits.window_millis();
        let count = count_at(state, idx, limits.limit());
        *state = FixedWindowState {
            window: idx,
            count: count.saturating_add(cost).min(count.max(max_units(limits))),
        };
    }

    /// Gives back up to `cost` units still counted in the window `now` falls in (a charge
    /// whose request turned out not to count, such as a login that succeeded).
    ///
    /// **Bound**: the units come off the current window's count (its carried debt
    /// included), never below zero. A refund made in a later window than its charge finds a
    /// window the charge never reached: when that window has a count already (other
    /// requests, or a debt carried), the refund takes up to `cost` units of it (never more
    /// than the window had); otherwise it gives back nothing, since the charge stopped
    /// counting when its window ended. A refund never leaves the state better than a fresh
    /// one.
    ///
    /// ```
    /// use tollgate::algorithm::{FixedWindow, FixedWindowState, LimitAlgorithm};
    /// use tollgate::{Algorithm, Policy, Rate};
    ///
    /// let policy = Policy::builder("p", Rate::per_second(1)).algorithm(Algorithm::FixedWindow).build()?;
    /// let (_, mut state) = FixedWindow::decide(FixedWindowState::default(), 10_000, policy.limits(), 1);
    /// assert!(!FixedWindow::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// FixedWindow::refund(&mut state, 10_100, policy.limits(), 1);
    /// assert!(FixedWindow::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    #[inline]
    fn refund(state: &mut FixedWindowState, now: u64, limits: &Limits, cost: u64) {
        let idx = now / limits.window_millis();
        let count = count_at(state, idx, limits.limit());
        if count == 0 || cost == 0 {
            return;
        }
        *state = FixedWindowState {
            window: idx,
            count: count - cost.min(count),
        };
    }

    /// Charges `extra` units whether or not they fit (a cost settled above its reservation),
    /// in full: a count past the limit is a debt carried into the next windows, `N` units
    /// paid per window, so the key waits until the windows it used up have passed. Saturates
    /// at ⌊[`MAX_USAGE_WINDOW_PRODUCT`](super::MAX_USAGE_WINDOW_PRODUCT) / W⌋ units.
    ///
    /// **Bound**: every request is admitted with room for its reservation, so a key whose
    /// requests are settled one after another is served, over `j` whole windows, at most
    /// `j·N` plus the overshoot (actual cost less reservation) of its last request; over any
    /// `j·W` ms, `(j + 1)·N` plus it (the boundary burst). Requests reserved together add
    /// their overshoots, which the following windows then pay back. See
    /// [`Op::Settle`](crate::store::Op::Settle).
    fn overcharge(state: &mut FixedWindowState, now: u64, limits: &Limits, extra: u64) {
        let idx = now / limits.window_millis();
        let count = count_at(state, idx, limits.limit());
        *state = FixedWindowState {
            window: idx,
            count: count
                .saturating_add(extra)
                .min(count.max(max_units(limits))),
        };
    }

    /// When the state stops mattering (ms since the epoch): the end of its window, or of the
    /// window that pays off its debt.
    #[inline]
    fn expires_at(state: &FixedWindowState, limits: &Limits) -> u64 {
        let windows = ceil_div(state.count, limits.limit()).max(1);
        state
            .window
            .saturating_add(windows)
            .saturating_mul(limits.window_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_support::{assert_retry, policy_for};
    use crate::{Policy, Rate};

    fn policy(n: u64, w_ms: u64) -> Policy {
        policy_for::<FixedWindow>(Rate::new(n, std::time::Duration::from_millis(w_ms)))
    }

    #[test]
    fn counts_within_a_window_and_resets_at_the_next() {
        let p = policy(3, 1000);
        let mut s = FixedWindowState::default();
        for i in 0..3 {
            let (d, ns) = FixedWindow::decide(s, 5_000 + i, p.limits(), 1);
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), 2 - i);
            assert_eq!(d.reset_after_millis(), 1000 - i);
            s = ns;
        }
        let (d, s2) = FixedWindow::decide(s, 5_500, p.limits(), 1);
        assert!(!d.is_allowed());
        assert_eq!(s2, s, "a denied request consumes nothing");
        assert_eq!(d.retry_after_millis(), 500);
        assert_retry::<FixedWindow>(&s, 5_500, p.limits(), 1, &d);
        assert!(FixedWindow::evaluate(&s, 6_000, p.limits(), 1).is_allowed());
    }

    #[test]
    fn boundary_burst_admits_two_n_across_a_flip() {
        let p = policy(10, 1000);
        let mut s = FixedWindowState::default();
        let mut admitted = 0;
        for t in [999u64, 1000] {
            for _ in 0..10 {
                let (d, ns) = FixedWindow::decide(s, t, p.limits(), 1);
                admitted += u64::from(d.is_allowed());
                s = ns;
            }
        }
        assert_eq!(admitted, 20, "the documented weakness: 2N within 2 ms");
    }

    #[test]
    fn a_refund_restores_the_decision_within_the_window_only() {
        let p = policy(3, 1000);
        let mut s = FixedWindowState::default();
        for _ in 0..3 {
            s = FixedWindow::decide(s, 5_100, p.limits(), 1).1;
        }
        let before = FixedWindow::evaluate(&s, 5_200, p.limits(), 1);
        assert!(!before.is_allowed());
        let mut refunded = s;
        FixedWindow::refund(&mut refunded, 5_200, p.limits(), 2);
        assert_eq!(refunded.count, 1);
        let after = FixedWindow::evaluate(&refunded, 5_200, p.limits(), 1);
        assert!(after.is_allowed());
        assert_eq!(after.remaining(), 1);
        // Never below a fresh state.
        FixedWindow::refund(&mut refunded, 5_300, p.limits(), 10);
        assert_eq!(
            FixedWindow::evaluate(&refunded, 5_300, p.limits(), 3),
            FixedWindow::evaluate(&FixedWindowState::default(), 5_300, p.limits(), 3)
        );
        // After the window ended the charge no longer counts: nothing to give back.
        let mut later = s;
        FixedWindow::refund(&mut later, 6_000, p.limits(), 3);
        assert_eq!(later, s);
    }

    #[test]
    fn denied_cost_leaves_the_count() {
        let p = policy(5, 1000);
        let (_, s) = FixedWindow::decide(FixedWindowState::default(), 0, p.limits(), 4);
        let (d, s2) = FixedWindow::decide(s, 1, p.limits(), 2);
        assert!(!d.is_allowed());
        assert_eq!(d.remaining(), 1);
        assert_eq!(s, s2);
        let (d, _) = FixedWindow::decide(s2, 2, p.limits(), 1);
        assert!(d.is_allowed());
    }
}
