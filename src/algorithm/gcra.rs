//! GCRA, the generic cell rate algorithm: a leaky bucket used as a meter.
//!
//! Each unit has an emission interval `T = W/N`; the state is the *theoretical arrival time*
//! (TAT) at which the meter would be empty. A request of cost `x` at `t` is allowed when
//! `max(TAT, t) + x·T − t ≤ B·T`, where `B` is the burst (default the limit); it then moves the
//! TAT to `max(TAT, t) + x·T`. `T` is usually fractional, so the TAT is kept as whole
//! milliseconds plus a remainder in `1/N` ms: the arithmetic stays exact.
//!
//! * `remaining`: how many more cost-1 requests would pass right now.
//! * `reset_after`: time until the meter is empty (TAT − t).
//! * `retry_after`: time until the same request fits, exactly.
//!
//! **Accuracy bound**: exact. In any span of `L` ms the admitted total is at most `B + N·L/W`.
//! It admits exactly what the [token bucket](super::token_bucket) with the same rate and burst
//! admits.
//!
//! **Per-key overrides** keep the TAT: a debt is time, which a new rate reads as more or fewer
//! units. Its remainder, kept in `1/N` ms of the limit it was written under, reads as at most
//! `(N − 1)/N` ms under a lower limit, so `retry_after` stays exact.
//!
//! **Shaping**: with [`PolicyBuilder::shape`](crate::PolicyBuilder::shape) a request that does
//! not fit now but would within `max_delay` is allowed with a [`delay`](PolicyDecision::delay):
//! its slot is reserved at once (so concurrent callers queue in order) and the caller waits
//! for it. `retry_after` then names the moment the wait would fit within `max_delay`.

use super::{
    ceil_div, never_fits, InPlace, LimitAlgorithm, PolicyDecision, MAX_USAGE_WINDOW_PRODUCT,
};
use crate::policy::{Algorithm, Limits};

/// The theoretical arrival time: `tat + frac/N` ms since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct GcraState {
    /// Whole milliseconds of the TAT.
    pub(crate) tat: u64,
    /// The TAT's remainder in units of `1/N` ms (always below `N`).
    pub(crate) frac: u64,
}

impl GcraState {
    /// The theoretical arrival time, in whole ms.
    pub fn tat(&self) -> u64 {
        self.tat
    }
}

/// `N · max(TAT − now, 0)`: how far ahead the meter runs, in `1/N` ms.
///
/// The remainder was kept in `1/N` ms of the limit the state was written under; under a
/// lower one (a per-key override) it reads as at most `(N − 1)/N` ms, so the TAT stays in
/// the same millisecond and the backlog falls by exactly `N` per ms until it is 0 (what
/// makes `retry_after` exact). Under a much higher one a debt can read as more than
/// [`MAX_USAGE_WINDOW_PRODUCT`], where it saturates, as a debt does.
#[inline]
fn backlog(state: &GcraState, now: u64, n: u64) -> u64 {
    if state.tat >= now {
        (state.tat - now)
            .saturating_mul(n)
            .saturating_add(state.frac.min(n - 1))
            .min(MAX_USAGE_WINDOW_PRODUCT)
    } else {
        0
    }
}

/// The state whose TAT is `backlog / N` ms after `now`.
#[inline]
fn ahead(now: u64, backlog: u64, n: u64) -> GcraState {
    GcraState {
        tat: now.saturating_add(backlog / n),
        frac: backlog % n,
    }
}

/// [`evaluate`](LimitAlgorithm::evaluate) and, when `charge`, [`commit`](LimitAlgorithm::commit) for a request that fits without waiting (the
/// common case), sharing one division between the decision's `reset_after` and the new TAT;
/// returns the decision and the state's new expiry (when charged). `None` for every other
/// request (denied, or delayed by shaping): those take `evaluate` and `commit`.
#[inline(always)]
fn common_case(
    state: &mut GcraState,
    now: u64,
    limits: &Limits,
    cost: u64,
    charge: bool,
) -> Option<InPlace> {
    let n = limits.limit();
    let w = limits.window_millis();
    let capacity = limits.capacity();
    if cost > capacity {
        return None;
    }
    let tolerance = capacity * w;
    let after = backlog(state, now, n) + cost * w;
    if after > tolerance {
        return None;
    }
    let (whole, frac) = (after / n, after % n);
    let reset_after = whole + u64::from(frac > 0);
    // A clock at the end of the `u64` range takes `evaluate` and `commit`.
    let expires = now.checked_add(reset_after)?;
    let d = PolicyDecision::from_parts(true, capacity, (tolerance - after) / w, reset_after, 0, 0);
    if !charge {
        return Some((d, None));
    }
    *state = GcraState {
        tat: now + whole,
        frac,
    };
    Some((d, Some(expires)))
}

/// The gcra algorithm; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Gcra;

impl LimitAlgorithm for Gcra {
    type State = GcraState;

    const ALGORITHM: Algorithm = Algorithm::Gcra;

    /// What a request of `cost` at `now` would get, changing nothing.
    #[inline]
    fn evaluate(state: &GcraState, now: u64, limits: &Limits, cost: u64) -> PolicyDecision {
        let n = limits.limit();
        let w = limits.window_millis();
        let tolerance = limits.capacity() * w;
        let slack = limits.max_delay_millis() * n;
        if cost > (tolerance + slack) / w {
            // Not even a fresh meter, waiting the longest delay, takes it.
            return never_fits(Self::evaluate(state, now, limits, 0));
        }
        let backlog = backlog(state, now, n);
        let after = backlog + cost * w;
        let allowed = after <= tolerance + slack;
        let delay = if allowed {
            ceil_div(after.saturating_sub(tolerance), n)
        } else {
            0
        };
        let (left, reset_after) = if allowed {
            (tolerance.saturating_sub(after), ceil_div(after, n))
        } else {
            (tolerance.saturating_sub(backlog), ceil_div(backlog, n))
        };
        let retry_after = if allowed {
            0
        } else {
            ceil_div(after - tolerance - slack, n)
        };
        PolicyDecision::from_parts(
            allowed,
            limits.capacity(),
            left / w,
            reset_after,
            retry_after,
            delay,
        )
    }

    /// Moves the TAT for an allowed request (any other cost saturates at the state's cap,
    /// see [`MAX_USAGE_WINDOW_PRODUCT`]).
    #[inline]
    fn commit(state: &mut GcraState, now: u64, limits: &Limits, cost: u64) {
        let n = limits.limit();
        let backlog = backlog(state, now, n);
        let after = backlog
            .saturating_add(cost.saturating_mul(limits.window_millis()))
            .min(backlog.max(MAX_USAGE_WINDOW_PRODUCT));
        *state = ahead(now, after, n);
    }

    /// Moves the TAT back by up to `cost` emission intervals (a charge whose request turned out
    /// not to count, such as a login that succeeded), never before `now`.
    ///
    /// **Bound**: exact while the meter has not drained the refunded units by itself; the TAT
    /// never goes before `now`, so the state is never better than a fresh one. Like the token
    /// bucket's refund, so the two still admit the same requests.
    ///
    /// ```
    /// use tollgate::algorithm::{Gcra, GcraState, LimitAlgorithm};
    /// use tollgate::{Algorithm, Policy, Rate};
    ///
    /// let policy = Policy::builder("p", Rate::per_minute(1)).algorithm(Algorithm::Gcra).build()?;
    /// let (_, mut state) = Gcra::decide(GcraState::default(), 10_000, policy.limits(), 1);
    /// assert!(!Gcra::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// Gcra::refund(&mut state, 10_100, policy.limits(), 1);
    /// assert!(Gcra::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    #[inline]
    fn refund(state: &mut GcraState, now: u64, limits: &Limits, cost: u64) {
        let n = limits.limit();
        let backlog = backlog(state, now, n);
        if backlog == 0 || cost == 0 {
            return;
        }
        let after = backlog.saturating_sub(cost.saturating_mul(limits.window_millis()));
        *state = ahead(now, after, n);
    }

    /// Charges `extra` units whether or not they fit (a cost settled above its reservation),
    /// in full: the TAT may move past the tolerance, a debt of time the key waits out (one
    /// emission interval, `W / N`, per unit) before a request fits again. Saturates at a
    /// backlog of [`MAX_USAGE_WINDOW_PRODUCT`] (⌊2^52 / W⌋ units).
    ///
    /// **Bound**: as exact as the meter: a key whose requests are settled one after another
    /// is served, over any span of `L` ms, at most `B + N·L/W` (`B` the burst) plus the
    /// overshoot (actual cost less reservation) of its last request; requests reserved
    /// together add their overshoots, which the meter then takes that much longer to drain.
    /// See [`Op::Settle`](crate::store::Op::Settle).
    fn overcharge(state: &mut GcraState, now: u64, limits: &Limits, extra: u64) {
        let n = limits.limit();
        let w = limits.window_millis();
        let backlog = backlog(state, now, n);
        let after = backlog
            .saturating_add(extra.saturating_mul(w))
            .min(backlog.max(MAX_USAGE_WINDOW_PRODUCT));
        *state = ahead(now, after, n);
    }

    /// When the state stops mattering (ms since the epoch): when the TAT is reached.
    #[inline]
    fn expires_at(state: &GcraState, _limits: &Limits) -> u64 {
        state.tat.saturating_add(u64::from(state.frac > 0))
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
    use crate::algorithm::test_support::{assert_retry, policy_for};
    use crate::algorithm::{TokenBucket, TokenBucketState};
    use crate::{Algorithm, Policy, Rate};
    use std::time::Duration;

    fn policy(n: u64, burst: u64) -> Policy {
        policy_for::<Gcra>(Rate::per_second(n).with_burst(burst))
    }

    #[test]
    fn burst_then_one_per_interval() {
        let p = policy(3, 2);
        let mut s = GcraState::default();
        for _ in 0..2 {
            let (d, ns) = Gcra::decide(s, 10_000, p.limits(), 1);
            assert!(d.is_allowed());
            s = ns;
        }
        let (d, s2) = Gcra::decide(s, 10_000, p.limits(), 1);
        assert!(!d.is_allowed());
        assert_eq!(s, s2);
        assert_eq!(d.retry_after_millis(), 334);
        assert_retry::<Gcra>(&s, 10_000, p.limits(), 1, &d);
        assert_eq!(d.reset_after_millis(), 667);
        let d = Gcra::evaluate(&s, 10_000, p.limits(), 2);
        assert_retry::<Gcra>(&s, 10_000, p.limits(), 2, &d);
    }

    #[test]
    fn shaping_delays_within_the_bound() {
        let p = Policy::builder("shape", Rate::per_second(10).with_burst(1))
            .algorithm(Algorithm::Gcra)
            .shape(Duration::from_millis(250))
            .build()
            .unwrap();
        let mut s = GcraState::default();
        let mut delays = vec![];
        loop {
            let (d, ns) = Gcra::decide(s, 0, p.limits(), 1);
            if !d.is_allowed() {
                assert_eq!(s, ns);
                // At 50 ms the backlog has drained to where a 250 ms wait fits.
                assert_eq!(d.retry_after_millis(), 50);
                assert_retry::<Gcra>(&s, 0, p.limits(), 1, &d);
                break;
            }
            delays.push(d.delay_millis());
            s = ns;
        }
        assert_eq!(delays, vec![0, 100, 200]);
    }

    #[test]
    fn a_refund_moves_the_tat_back_but_never_before_now() {
        let p = policy(3, 2);
        let mut s = GcraState::default();
        for _ in 0..2 {
            s = Gcra::decide(s, 10_000, p.limits(), 1).1;
        }
        assert!(!Gcra::evaluate(&s, 10_000, p.limits(), 1).is_allowed());
        let mut r = s;
        Gcra::refund(&mut r, 10_000, p.limits(), 1);
        assert!(Gcra::evaluate(&r, 10_000, p.limits(), 1).is_allowed());
        // Charge then refund gives the decision before the charge.
        let (_, mut back) = Gcra::decide(r, 10_050, p.limits(), 1);
        Gcra::refund(&mut back, 10_050, p.limits(), 1);
        assert_eq!(
            Gcra::evaluate(&back, 10_050, p.limits(), 1),
            Gcra::evaluate(&r, 10_050, p.limits(), 1)
        );
        Gcra::refund(&mut r, 10_100, p.limits(), 50);
        assert_eq!(
            r,
            GcraState {
                tat: 10_100,
                frac: 0
            }
        );
        assert_eq!(
            Gcra::evaluate(&r, 10_100, p.limits(), 2),
            Gcra::evaluate(&GcraState::default(), 10_100, p.limits(), 2)
        );
    }

    #[test]
    fn agrees_with_the_token_bucket() {
        let g = policy(7, 4);
        let t = Policy::builder("tb", Rate::per_second(7).with_burst(4))
            .algorithm(Algorithm::TokenBucket)
            .build()
            .unwrap();
        let (mut gs, mut ts) = (GcraState::default(), TokenBucketState::default());
        let mut now = 1_000;
        for i in 0..2_000u64 {
            now += (i * 7919) % 97;
            let cost = 1 + i % 3;
            let (a, ngs) = Gcra::decide(gs, now, g.limits(), cost);
            let (b, nts) = TokenBucket::decide(ts, now, t.limits(), cost);
            assert_eq!(a, b, "step {i} at {now}");
            gs = ngs;
            ts = nts;
            if i % 5 == 0 {
                Gcra::refund(&mut gs, now, g.limits(), cost);
                TokenBucket::refund(&mut ts, now, t.limits(), cost);
            }
        }
    }
}
