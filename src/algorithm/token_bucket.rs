//! Token bucket: a bucket of `C` tokens (the burst, default the limit) refilled continuously at
//! `N` tokens per `W` ms; a request of cost `x` takes `x` tokens.
//!
//! Tokens are fractional between refills; to keep the arithmetic exact the state stores the
//! bucket's *deficit* (`C` minus the tokens) multiplied by `W`, which refills by `N` per
//! millisecond. A fresh bucket is full.
//!
//! * `remaining`: whole tokens left after this decision.
//! * `reset_after`: time until the bucket is full again.
//! * `retry_after`: time until `x` tokens are there, exactly (`⌈(x − tokens)·W / N⌉` ms).
//!
//! **Accuracy bound**: exact. In any span of `L` ms the admitted total is at most
//! `C + N·L/W`. A denied request takes no tokens.
//!
//! The token bucket and [GCRA](super::gcra) are two views of one meter: with the same rate and
//! burst they admit exactly the same requests. The bucket stores a level and a time, GCRA one
//! "theoretical arrival time"; GCRA can also shape.
//!
//! **Per-key overrides** change the refill rate from the moment they are set or removed: the
//! store first brings the bucket up to date, the tokens refilled since its last charge put in
//! at the rate in force until then, so a new rate never applies to time before it (the
//! memory store and Redis alike). An override that ends by its expiry has no such moment:
//! the time from the bucket's last charge to the next one is then refilled at the plan's
//! rate, the expired override's stretch included (at most that stretch at the faster of the
//! two rates, on every store alike).

use super::{ceil_div, never_fits, LimitAlgorithm, PolicyDecision, MAX_USAGE_WINDOW_PRODUCT};
use crate::policy::{Algorithm, Limits};

/// The deficit (missing tokens × `W`) as of `updated_at`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Missing tokens × window in ms; 0 is a full bucket.
    pub(crate) deficit: u64,
    /// ms since the epoch of the last charge.
    pub(crate) updated_at: u64,
}

impl TokenBucketState {
    /// Missing tokens × window in ms; 0 is a full bucket.
    pub fn deficit(&self) -> u64 {
        self.deficit
    }

    /// ms since the epoch of the last charge.
    pub fn updated_at(&self) -> u64 {
        self.updated_at
    }
}

fn deficit_at(state: &TokenBucketState, now: u64, refill_per_ms: u64) -> u64 {
    let elapsed = now.saturating_sub(state.updated_at);
    state
        .deficit
        .saturating_sub(elapsed.saturating_mul(refill_per_ms))
}

impl TokenBucket {
    /// Brings `state` to `now` under `limits`: the tokens refilled since its last charge,
    /// at `limits`' rate, are put in. A store does this before a per-key override changes a
    /// bucket's rate (when it is set or removed), so that the time before the change refills
    /// at the rate in force then, not at the new one.
    pub(crate) fn catch_up(state: &mut TokenBucketState, now: u64, limits: &Limits) {
        if now > state.updated_at {
            *state = TokenBucketState {
                deficit: deficit_at(state, now, limits.limit()),
                updated_at: now,
            };
        }
    }
}

/// The token bucket algorithm; see the [module docs](self).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TokenBucket;

impl LimitAlgorithm for TokenBucket {
    type State = TokenBucketState;

    const ALGORITHM: Algorithm = Algorithm::TokenBucket;

    /// What a request of `cost` at `now` would get, changing nothing.
    #[inline]
    fn evaluate(state: &TokenBucketState, now: u64, limits: &Limits, cost: u64) -> PolicyDecision {
        let n = limits.limit();
        let w = limits.window_millis();
        if cost > limits.capacity() {
            return never_fits(Self::evaluate(state, now, limits, 0));
        }
        let full = limits.capacity() * w;
        let deficit = deficit_at(state, now, n);
        // Below 2^53: a deficit holds at most `MAX_USAGE_WINDOW_PRODUCT`, a cost the capacity.
        let allowed = deficit + cost * w <= full;
        let after = if allowed { deficit + cost * w } else { deficit };
        let retry_after = if allowed {
            0
        } else {
            ceil_div(deficit + cost * w - full, n)
        };
        PolicyDecision::from_parts(
            allowed,
            limits.capacity(),
            full.saturating_sub(after) / w,
            ceil_div(after, n),
            retry_after,
            0,
        )
    }

    /// Takes `cost` tokens for an allowed request (any other cost saturates at the state's
    /// cap, see [`MAX_USAGE_WINDOW_PRODUCT`]).
    #[inline]
    fn commit(state: &mut TokenBucketState, now: u64, limits: &Limits, cost: u64) {
        let deficit = deficit_at(state, now, limits.limit());
        *state = TokenBucketState {
            deficit: deficit
                .saturating_add(cost.saturating_mul(limits.window_millis()))
                .min(deficit.max(MAX_USAGE_WINDOW_PRODUCT)),
            updated_at: now.max(state.updated_at),
        };
    }

    /// Puts up to `cost` tokens back (a charge whose request turned out not to count, such as a
    /// login that succeeded), never beyond a full bucket.
    ///
    /// **Bound**: exact while the bucket has not refilled the refunded tokens by itself; a
    /// refund never makes the bucket fuller than full, so the state is never better than a
    /// fresh one.
    ///
    /// ```
    /// use tollgate::algorithm::{TokenBucket, TokenBucketState, LimitAlgorithm};
    /// use tollgate::{Algorithm, Policy, Rate};
    ///
    /// let policy = Policy::builder("p", Rate::per_minute(1)).algorithm(Algorithm::TokenBucket).build()?;
    /// let (_, mut state) = TokenBucket::decide(TokenBucketState::default(), 10_000, policy.limits(), 1);
    /// assert!(!TokenBucket::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// TokenBucket::refund(&mut state, 10_100, policy.limits(), 1);
    /// assert!(TokenBucket::evaluate(&state, 10_100, policy.limits(), 1).is_allowed());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    #[inline]
    fn refund(state: &mut TokenBucketState, now: u64, limits: &Limits, cost: u64) {
        let deficit = deficit_at(state, now, limits.limit());
        if deficit == 0 || cost == 0 {
            return;
        }
        *state = TokenBucketState {
            deficit: deficit.saturating_sub(cost.saturating_mul(limits.window_millis())),
            updated_at: now.max(state.updated_at),
        };
    }

    /// Takes `extra` tokens whether or not the bucket holds them (a cost settled above its
    /// reservation), in full: the bucket goes into debt, which the refill pays back (`N`
    /// tokens per window) before a request fits again. Saturates at a deficit of
    /// [`MAX_USAGE_WINDOW_PRODUCT`] (⌊2^52 / W⌋ tokens).
    ///
    /// **Bound**: as exact as the bucket: a key whose requests are settled one after another
    /// is served, over any span of `L` ms, at most `C + N·L/W` plus the overshoot (actual cost
    /// less reservation) of its last request; requests reserved together add their
    /// overshoots, which the refill then takes that much longer to pay back. See
    /// [`Op::Settle`](crate::store::Op::Settle).
    fn overcharge(state: &mut TokenBucketState, now: u64, limits: &Limits, extra: u64) {
        let w = limits.window_millis();
        let deficit = deficit_at(state, now, limits.limit());
        *state = TokenBucketState {
            deficit: deficit
                .saturating_add(extra.saturating_mul(w))
                .min(deficit.max(MAX_USAGE_WINDOW_PRODUCT)),
            updated_at: now.max(state.updated_at),
        };
    }

    /// When the state stops mattering (ms since the epoch): when the bucket is full again.
    #[inline]
    fn expires_at(state: &TokenBucketState, limits: &Limits) -> u64 {
        state
            .updated_at
            .saturating_add(ceil_div(state.deficit, limits.limit()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::test_support::{assert_retry, policy_for};
    use crate::{Policy, Rate};

    fn policy(n: u64, burst: u64) -> Policy {
        policy_for::<TokenBucket>(Rate::per_second(n).with_burst(burst))
    }

    #[test]
    fn bursts_to_capacity_then_refills_at_the_rate() {
        let p = policy(3, 5); // a token every 333⅓ ms
        let mut s = TokenBucketState::default();
        for i in 0..5 {
            let (d, ns) = TokenBucket::decide(s, 1_000, p.limits(), 1);
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), 4 - i);
            s = ns;
        }
        let (d, s2) = TokenBucket::decide(s, 1_000, p.limits(), 1);
        assert!(!d.is_allowed());
        assert_eq!(s, s2, "a denied request takes no tokens");
        assert_eq!(d.retry_after_millis(), 334);
        assert_retry::<TokenBucket>(&s, 1_000, p.limits(), 1, &d);
        let d = TokenBucket::evaluate(&s, 1_000, p.limits(), 2);
        assert_eq!(d.retry_after_millis(), 667);
        assert_retry::<TokenBucket>(&s, 1_000, p.limits(), 2, &d);
        assert_eq!(d.reset_after_millis(), 1_667);
    }

    #[test]
    fn a_refund_puts_tokens_back_up_to_full() {
        let p = policy(1, 3);
        let mut s = TokenBucketState::default();
        for _ in 0..3 {
            s = TokenBucket::decide(s, 0, p.limits(), 1).1;
        }
        assert!(!TokenBucket::evaluate(&s, 10, p.limits(), 1).is_allowed());
        let mut r = s;
        TokenBucket::refund(&mut r, 10, p.limits(), 1);
        assert!(TokenBucket::evaluate(&r, 10, p.limits(), 1).is_allowed());
        assert!(!TokenBucket::evaluate(&r, 10, p.limits(), 2).is_allowed());
        // Charge then refund gives the decision before the charge.
        let (_, mut back) = TokenBucket::decide(r, 20, p.limits(), 1);
        TokenBucket::refund(&mut back, 20, p.limits(), 1);
        assert_eq!(
            TokenBucket::evaluate(&back, 20, p.limits(), 1),
            TokenBucket::evaluate(&r, 20, p.limits(), 1)
        );
        // Never fuller than full.
        TokenBucket::refund(&mut r, 30, p.limits(), 100);
        assert_eq!(
            TokenBucket::evaluate(&r, 30, p.limits(), 3),
            TokenBucket::evaluate(&TokenBucketState::default(), 30, p.limits(), 3)
        );
    }

    #[test]
    fn a_denied_big_request_does_not_drain_the_bucket() {
        let p = policy(1, 10);
        let (_, s) = TokenBucket::decide(TokenBucketState::default(), 0, p.limits(), 5);
        let (d, s2) = TokenBucket::decide(s, 0, p.limits(), 10);
        assert!(!d.is_allowed());
        assert_eq!(s, s2);
        assert!(TokenBucket::decide(s2, 0, p.limits(), 5).0.is_allowed());
    }
}
