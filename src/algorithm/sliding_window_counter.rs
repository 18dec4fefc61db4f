//! Sliding window counter (the default): two adjacent fixed windows, the previous one weighted.
//!
//! Time is cut into epoch-aligned windows of `W` ms. At time `t`, `e = t mod W` ms into window
//! `k`, with `p` units counted in window `k − 1` and `c` in window `k`, the estimate of the
//! last `W` ms is `p·(W − e)/W + c`: it assumes the previous window's traffic was spread
//! evenly. A request of cost `x` is allowed when `p·(W − e) + (c + x)·W ≤ N·W`, compared
//! exactly in integers (no rounding).
//!
//! * `remaining`: `⌊N − estimate⌋` after this decision.
//! * `reset_after`: time until the estimate falls to 0 (the end of window `k + 1` when `c > 0`,
//!   else the end of window `k` when `p > 0`, else 0).
//! * `retry_after`: the earliest millisecond at which the same request passes if nothing else
//!   arrives — later in this window as the previous window's weight fades, or in the next
//!   windows — computed exactly from the formula above.
//!
//! **Accuracy bound**: in any span of `L ≤ W` ms the admitted total is at most
//! `N + N·L/W`. (Split the span into a tail `a` of window `k − 1` holding `x` units and a head
//! `b ≤ L` of window `k`; the last admission in the head saw at least `x·(W − b)/W` of the
//! previous window, so the head holds at most `N − x·(W − b)/W`, and the span
//! `x + N − x·(W − b)/W = N + x·b/W ≤ N + N·L/W`.) So around a window flip (`L` small) the
//! counter admits about `N`, never the `2N` burst of the fixed window; the worst case over a
//! full window, reached only when the previous window's traffic was packed at its very end, is
//! just under `2N`.
//!
//! The lease ledger ([`crate::store::leased`]) decides with this module's arithmetic too
//! (`counts`, `weighted`, `clears_in` and the evaluation), and `lua/` has it once in
//! `sliding_window_counter_math.lua`, which the decision script's `sliding_window_counter.lua`
//! and the lease script share; `lua/single.lua` and the lease script's common call keep an
//! inline copy of the common case, where sharing would cost Redis more than the arithmetic.
//!
//! **Debts**: a settlement above its reservation ([`overcharge`](LimitAlgorithm::overcharge))
//! may push the current window's count `c` past `N`. When the window ends, at most `N` of it
//! becomes the previous window's count (weighted as above) and the rest, `c − N`, stays
//! counted in full in the new window, and so on: the debt is paid at `N` units per window,
//! and the estimate falls continuously from `c` to 0 over `⌈c / N⌉ + 1` windows.

use super::{ceil_div, max_units, never_fits, InPlace, LimitAlgorithm, PolicyDecision};
use crate::policy::{Algorithm, Limits};

/// The current window's index and the counts of it and the window before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounterState {
    /// `⌊t / W⌋` of the last charged request.
    pub(crate) window: u64,
    /// Units charged in that window.
    pub(crate) current: u64,
    /// Units charged in the window before it.
    pub(crate) previous: u64,
}

impl SlidingWindowCounterState {
    /// `⌊t / W⌋` of the last charged request.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Units charged in that window.
    pub fn current(&self) -> u64 {
        self.current
    }

    /// Units charged in the window before it.
    pub fn previous(&self) -> u64 {
        self.previous
    }
}

/// `(previous, current)` as seen `j ≥ 1` windows after a window that counted `c`: at most
/// `n` of what is left after `j − 1` windows' payments weighs as the previous window, the
/// rest counts in full (a debt, `n` paid per window).
#[inline]
fn carried(c: u64, j: u64, n: u64) -> (u64, u64) {
    let left = c.saturating_sub(n.saturating_mul(j - 1));
    (left.min(n), left.saturating_sub(n))
}

/// `(previous, current)` as seen from window `idx`.
#[inline]
pub(crate) fn counts(state: &SlidingWindowCounterState, idx: u64, n: u64) -> (u64, u64) {
    if state.window == idx {
        (state.previous, state.current)
    } else if state.window < idx {
        carried(state.current, idx - state.window, n)
    } else {
        (0, 0)
    }
}

/// The estimate of the last window at offset `e` into the current one, scaled by `W`:
/// `prev·(W − e) + cur·W` (saturating; below 2^53 for any state the algorithms keep, see
/// [`evaluate`](LimitAlgorithm::evaluate)).
#[inline]
pub(crate) fn weighted(prev: u64, cur: u64, e: u64, w: u64) -> u64 {
    prev.saturating_mul(w - e)
        .saturating_add(cur.saturating_mul(w))
}

/// The earliest offset into a window with counts `(prev, cur)` at which a request of `cost`
/// fits (`prev·(W − e) + (cur + cost)·W ≤ N·W`), if any.
#[inline]
fn fits_from(prev: u64, cur: u64, n: u64, w: u64, cost: u64) -> Option<u64> {
    let room = n.checked_sub(cur)?.checked_sub(cost)?;
    if prev == 0 {
        return Some(0);
    }
    let overlap = room * w / prev; // the largest W − e that still fits
    (overlap >= 1).then(|| w - overlap.min(w))
}

/// The earliest time (ms since the epoch) at which a request of `cost ≤ n` passes, given
/// counts `(prev, cur)` in window `idx`, searching from `now`.
fn earliest(prev: u64, cur: u64, idx: u64, now: u64, n: u64, w: u64, cost: u64) -> u64 {
    let start = idx.saturating_mul(w);
    // Later in window `idx`, as the previous window's weight fades.
    if let Some(e) = fits_from(prev, cur, n, w, cost) {
        return start.saturating_add(e).max(now);
    }
    // In a later window: none before the first where what is still counted in full leaves
    // room (`cur − j·N + cost ≤ N`); two windows after that one nothing counted so far
    // weighs any more, so the search ends there.
    let first = ceil_div(cur.saturating_add(cost).saturating_sub(n), n).max(1);
    for j in first..first + 2 {
        let (p, c) = carried(cur, j, n);
        if let Some(e) = fits_from(p, c, n, w, cost) {
            return start.saturating_add(j.saturating_mul(w)).saturating_add(e);
        }
    }
    start.saturating_add((first + 2).saturating_mul(w))
}

/// Time from `now` (in window `idx`) until the estimate is 0, after a decision leaving counts
/// `(prev, cur)`: the end of the window that pays the last of `cur` off, then one more for
/// its weight to fade; the end of this window when only `prev` is left; 0 for nothing.
#[inline]
pub(crate) fn clears_in(prev: u64, cur: u64, idx: u64, now: u64, n: u64, w: u64) -> u64 {
    let windows = if cur > 0 {
        ceil_div(cur, n).saturating_add(1)
    } else if prev > 0 {
        1
    } else {
        return 0;
    };
    idx.saturating_add(windows)
        .saturating_mul(w)
        .saturating_sub(now)
}

/// [`evaluate`](LimitAlgorithm::evaluate) and, when `charge`, [`commit`](LimitAlgorithm::commit) for an allowed request (the common case): the
/// window index comes from the state's own window when that or the next one is current, not
/// from a division, and `remaining` needs none when the previous window is empty. Returns the
/// decision and the state's new expiry (when charged); `None` for a denied request, which
/// takes `evaluate` (its `retry_after` search) instead.
#[inline(always)]
fn common_case(
    state: &mut SlidingWindowCounterState,
    now: u64,
    limits: &Limits,
    cost: u64,
    charge: bool,
) -> Option<InPlace> {
    let n = limits.limit();
    let w = limits.window_millis();
    if cost > n {
        return None;
    }
    // `window·W ≤ now < (window + 1)·W` means `⌊now / W⌋ = window`, and so on for the next.
    let (idx, e) = match state.window.checked_mul(w).and_then(|s| now.checked_sub(s)) {
        Some(e) if e < w => (state.window, e),
        Some(e) if e - w < w => (state.window + 1, e - w),
        _ => {
            let idx = now / w;
            (idx, now - idx * w)
        }
    };
    let (prev, cur) = counts(state, idx, n);
    // Allowed means `cur + cost ≤ N`, so nothing below is past the limit.
    if cur + cost > n {
        return None;
    }
    let weighted_after = prev * (w - e) + (cur + cost) * w;
    if weighted_after > n * w {
        return None;
    }
    let cur_after = cur + cost;
    let remaining = if prev == 0 {
        n - cur_after
    } else {
        (n * w - weighted_after) / w
    };
    // The end of the next window; a clock at the end of the `u64` range takes `evaluate`.
    let expires = idx.checked_add(2)?.checked_mul(w)?;
    let reset_after = if cur_after > 0 {
        expires - now
    } else if prev > 0 {
        expires - w - now
    } else {
        0
    };
    let d = PolicyDecision::from_parts(true, n, remaining, reset_after, 0, 0);
    if !charge {
        return Some((d, None));
    }
    *state = SlidingWindowCounterState {
        window: idx,
        current: cur_after,
        previous: prev,
    };
    Some((d, Some(expires)))
}

/// The sliding window counter algorithm; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SlidingWindowCounter;

impl LimitAlgorithm for SlidingWindowCounter {
    type State = SlidingWindowCounterState;

    const ALGORITHM: Algorithm = Algorithm::SlidingWindowCounter;

    /// What a request of `cost` at `now` would get, changing nothing.
    #[inline]
    fn evaluate(
        state: &SlidingWindowCounterState,
        now: u64,
        limits: &Limits,
        cost: u64,
    ) -> PolicyDecision {
        let n = limits.limit();
        let w = limits.window_millis();
        if cost > limits.capacity() {
            return never_fits(Self::evaluate(state, now, limits, 0));
        }
        let idx = now / w;
        let e = now - idx * w;
        let (prev, cur) = counts(state, idx, n);
        // Below 2^53: `prev·W` is at most the limit × W under which it was counted (2^50),
        // `(cur + cost)·W` at most 2^52 + 2^50 (see `MAX_USAGE_WINDOW_PRODUCT`).
        let before = weighted(prev, cur, e, w);
        let allowed = before.saturating_add(cost * w) <= n * w;
        let (weighted_after, cur_after) = if allowed {
            (before + cost * w, cur + cost)
        } else {
            (before, cur)
        };
        let remaining = (n * w).saturating_sub(weighted_after) / w;
        let reset_after = clears_in(prev, cur_after, idx, now, n, w);
        let retry_after = if allowed {
            0
        } else {
            earliest(prev, cur, idx, now, n, w, cost) - now
        };
        PolicyDecision::from_parts(allowed, n, remaining, reset_after, retry_after, 0)
    }

    /// Charges an allowed request (any other cost saturates at the state's cap, see
    /// [`MAX_USAGE_WINDOW_PRODUCT`](super::MAX_USAGE_WINDOW_PRODUCT)).
    #[inline]
    fn commit(state: &mut SlidingWindowCounterState, now: u64, limits: &Limits, cost: u64) {
        let idx = now / limits.window_millis();
        let (previous, current) = counts(state, idx, limits.limit());
        *state = SlidingWindowCounterState {
            window: idx,
            current: current
                .saturating_add(cost)
                .min(current.max(max_units(limits))),
            previous,
        };
    }

    /// Gives back up to `cost` units charged recently (a charge whose request turned out not to
    /// count, such as a login that succeeded): newest first, from the window `now` falls in,
    /// then from the window before it.
    ///
    /// **Bound**: a refund takes at most `cost` units and never makes a count negative, so the
    /// state is never better than a fresh one. It is exact while the charge is in the newest
    /// window holding units. After a window boundary (the charge was made in the previous
    /// window) it gives the charge back from the previous window when the current one is empty,
    /// and otherwise from the current window (a debt carried into it, see the
    /// [module docs](self)), which weighs fully while the charge's window weighs
    /// `(W − e)/W`: the estimate then drops by up to `cost·e/W` more than the charge still
    /// weighed. A charge two windows old no longer counts and is not refunded.
    ///
    /// ```
    /// use tollgate::algorithm::{SlidingWindowCounter as Swc, SlidingWindowCounterState, LimitAlgorithm};
    /// use tollgate::{Policy, Rate};
    ///
    /// let policy = Policy::new("p", Rate::per_second(1))?;
    /// let (_, mut state) = Swc::decide(SlidingWindowCounterState::default(), 10_000, policy.limits(), 1);
    /// assert!(!Swc::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// Swc::refund(&mut state, 10_100, policy.limits(), 1);
    /// assert!(Swc::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    #[inline]
    fn refund(state: &mut SlidingWindowCounterState, now: u64, limits: &Limits, cost: u64) {
        let n = limits.limit();
        let idx = now / limits.window_millis();
        if state.window == idx {
            let back = cost.min(state.current);
            state.current -= back;
            state.previous = state.previous.saturating_sub(cost - back);
        } else if state.window < idx {
            let (prev, cur) = counts(state, idx, n);
            if cur == 0 && state.window + 1 == idx {
                // The state's window is now the previous one, and nothing it held is counted
                // in full any more.
                state.current = state.current.saturating_sub(cost);
            } else if prev > 0 || cur > 0 {
                // A debt carried into this window: paid back from the newest units.
                let back = cost.min(cur);
                *state = SlidingWindowCounterState {
                    window: idx,
                    current: cur - back,
                    previous: prev.saturating_sub(cost - back),
                };
            }
        }
    }

    /// Charges `extra` units whether or not they fit (a cost settled above its reservation), in
    /// full: the current window's count may go past the limit, a debt the next windows pay
    /// back at `N` units per window (see the [module docs](self)). Saturates at
    /// ⌊[`MAX_USAGE_WINDOW_PRODUCT`](super::MAX_USAGE_WINDOW_PRODUCT) / W⌋ units.
    ///
    /// **Bound**: every request is admitted with room for its reservation, and the estimate
    /// it is admitted against counts the debt in full; so a key whose requests are settled one
    /// after another is served, over `j` whole windows, at most `j·N` plus the overshoot
    /// (actual cost less reservation) of its last request; over any `j·W` ms, `(j + 1)·N`
    /// plus it (the accuracy bound above). Requests reserved together add their overshoots,
    /// which the following windows then pay back. See
    /// [`Op::Settle`](crate::store::Op::Settle).
    fn overcharge(state: &mut SlidingWindowCounterState, now: u64, limits: &Limits, extra: u64) {
        let idx = now / limits.window_millis();
        let (previous, current) = counts(state, idx, limits.limit());
        *state = SlidingWindowCounterState {
            window: idx,
            current: current
                .saturating_add(extra)
                .min(current.max(max_units(limits))),
            previous,
        };
    }

    /// When the state stops mattering (ms since the epoch): the end of the window after its
    /// own, or after the window that pays off its debt.
    #[inline]
    fn expires_at(state: &SlidingWindowCounterState, limits: &Limits) -> u64 {
        let windows = ceil_div(state.current, limits.limit()).max(1) + 1;
        state
            .window
            .saturating_add(windows)
            .saturating_mul(limits.window_millis())
    }

    #[inline(always)]
    fn decide_common_case(
        state: &mut Self::State,
        now: u64,
        limits: &Limits,
        cost: u64,
        charge: bool,
    ) -> Option<InPlace> {
        common_case(state, now, limits, cost, charge)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_support::assert_retry;
    use crate::Policy;
    use crate::Rate;
    use std::time::Duration;

    fn policy(n: u64, w_ms: u64) -> Policy {
        Policy::new("swc", Rate::new(n, Duration::from_millis(w_ms))).unwrap()
    }

    #[test]
    fn weights_the_previous_window() {
        let p = policy(10, 1000);
        let mut s = SlidingWindowCounterState::default();
        for _ in 0..10 {
            let (d, ns) = SlidingWindowCounter::decide(s, 10_000, p.limits(), 1);
            assert!(d.is_allowed());
            s = ns;
        }
        // 250 ms into the next window the previous 10 weigh 7.5: two more fit.
        let (d, ns) = SlidingWindowCounter::decide(s, 11_250, p.limits(), 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
        let (d, ns) = SlidingWindowCounter::decide(ns, 11_250, p.limits(), 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        let (d, ns2) = SlidingWindowCounter::decide(ns, 11_250, p.limits(), 1);
        assert!(!d.is_allowed());
        assert_eq!(ns, ns2);
        // 7.5 + 2 + 1 > 10 until the weight drops to 7: at 11_300.
        assert_eq!(d.retry_after_millis(), 50);
        assert_retry::<SlidingWindowCounter>(&ns, 11_250, p.limits(), 1, &d);
    }

    #[test]
    fn retry_is_exact_in_every_branch() {
        let p = policy(10, 1000);
        // Full current window: must wait for the next window and its fading weight.
        let s = SlidingWindowCounterState {
            window: 5,
            current: 10,
            previous: 0,
        };
        let d = SlidingWindowCounter::evaluate(&s, 5_100, p.limits(), 1);
        assert_eq!(d.retry_after_millis(), 1_000);
        assert_retry::<SlidingWindowCounter>(&s, 5_100, p.limits(), 1, &d);
        // A cost equal to the limit needs the previous window gone entirely.
        let d = SlidingWindowCounter::evaluate(&s, 5_100, p.limits(), 10);
        assert_eq!(d.retry_after_millis(), 1_900);
        assert_retry::<SlidingWindowCounter>(&s, 5_100, p.limits(), 10, &d);
        // Both windows partly full.
        let s = SlidingWindowCounterState {
            window: 5,
            current: 4,
            previous: 9,
        };
        for now in [5_000, 5_001, 5_333, 5_999] {
            for cost in 1..=10 {
                let d = SlidingWindowCounter::evaluate(&s, now, p.limits(), cost);
                if !d.is_allowed() {
                    assert_retry::<SlidingWindowCounter>(&s, now, p.limits(), cost, &d);
                }
            }
        }
    }

    #[test]
    fn a_refund_restores_the_decision_and_never_goes_below_fresh() {
        let p = policy(4, 1000);
        let mut s = SlidingWindowCounterState::default();
        for _ in 0..4 {
            s = SlidingWindowCounter::decide(s, 10_100, p.limits(), 1).1;
        }
        let full = SlidingWindowCounter::evaluate(&s, 10_200, p.limits(), 1);
        assert!(!full.is_allowed());
        let mut r = s;
        SlidingWindowCounter::refund(&mut r, 10_200, p.limits(), 1);
        let d = SlidingWindowCounter::evaluate(&r, 10_200, p.limits(), 1);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        // Charge then refund gives the decision before the charge.
        let (_, charged) = SlidingWindowCounter::decide(r, 10_300, p.limits(), 1);
        let mut back = charged;
        SlidingWindowCounter::refund(&mut back, 10_300, p.limits(), 1);
        assert_eq!(
            SlidingWindowCounter::evaluate(&back, 10_300, p.limits(), 2),
            SlidingWindowCounter::evaluate(&r, 10_300, p.limits(), 2)
        );
        // In the next window the charge sits in the previous window: refunded from there.
        let mut next = s;
        SlidingWindowCounter::refund(&mut next, 11_250, p.limits(), 4);
        assert_eq!(
            SlidingWindowCounter::evaluate(&next, 11_250, p.limits(), 4),
            SlidingWindowCounter::evaluate(
                &SlidingWindowCounterState::default(),
                11_250,
                p.limits(),
                4
            )
        );
        // Never negative, and two windows later nothing is left to refund.
        let mut over = s;
        SlidingWindowCounter::refund(&mut over, 10_500, p.limits(), 100);
        assert_eq!((over.current, over.previous), (0, 0));
        let mut old = s;
        SlidingWindowCounter::refund(&mut old, 12_000, p.limits(), 4);
        assert_eq!(old, s);
    }

    #[test]
    fn no_double_burst_at_a_flip() {
        let p = policy(10, 1000);
        let mut s = SlidingWindowCounterState::default();
        let mut admitted = 0;
        for t in [999u64, 1000, 1001] {
            for _ in 0..10 {
                let (d, ns) = SlidingWindowCounter::decide(s, t, p.limits(), 1);
                admitted += u64::from(d.is_allowed());
                s = ns;
            }
        }
        assert_eq!(admitted, 10);
    }
}
