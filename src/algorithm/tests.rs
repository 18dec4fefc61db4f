//! Unit tests of the algorithms' shared parts and registry.

use super::*;
use crate::policy::{Policy, Rate};
use proptest::prelude::*;
use std::time::Duration;

/// The largest cost the Redis stores send (see `store::redis::wire`).
const WIRE_MAX: u64 = (1 << 53) - 1;

/// A number spread over the whole `u64` range, with the edges the arithmetic turns on.
fn wide() -> impl Strategy<Value = u64> {
    prop_oneof![
        0..4u64,
        0..1_000u64,
        (0u32..64).prop_flat_map(|e| 0..=(1u64 << e)),
        Just(WIRE_MAX),
        Just(1 << 53),
        Just(1 << 63),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

/// `(window ms, limit, burst, max delay ms)`, most of them valid, some refused by the
/// builder (which then decides what a policy can be).
fn numbers() -> impl Strategy<Value = (u64, u64, u64, u64)> {
    (0u32..=51)
        .prop_flat_map(|e| 1..=(1u64 << e))
        .prop_flat_map(|w| {
            let most = ((1u64 << 50) / w).max(1);
            let limit = prop_oneof![4 => 1..=most.min(5), 4 => 1..=most, 1 => wide()];
            (
                Just(w),
                limit.clone(),
                limit,
                prop_oneof![Just(0u64), 1..=3_600_000u64],
            )
        })
}

/// A policy of `algorithm` built through the public builder, if it accepts the numbers.
fn build(algorithm: Algorithm, (w, limit, burst, delay): (u64, u64, u64, u64)) -> Option<Policy> {
    let mut rate = Rate::new(limit, Duration::from_millis(w));
    if algorithm.has_burst() {
        rate = rate.with_burst(burst);
    }
    let mut b = Policy::builder("p", rate).algorithm(algorithm);
    if algorithm == Algorithm::Gcra && delay > 0 {
        b = b.shape(Duration::from_millis(delay));
    }
    b.build().ok()
}

/// Time between two operations: mostly none or a little (several operations on one
/// window's state), sometimes anything.
fn step() -> impl Strategy<Value = u64> {
    prop_oneof![3 => Just(0u64), 3 => 0..100u64, 1 => wide()]
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Evaluate,
    Decide,
    Commit,
    Refund,
    Overcharge,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Evaluate),
        Just(Op::Decide),
        Just(Op::Commit),
        Just(Op::Refund),
        Just(Op::Overcharge),
    ]
}

/// `d` without the cost it was marked with (compared where only the cost differs).
fn unmarked(mut d: PolicyDecision) -> PolicyDecision {
    if d.exceeds_capacity() {
        d.delay_ms = 1;
    }
    d
}

/// Applies `op` of `cost` at `now`; the decision, if the operation gives one.
fn apply(
    state: &mut AnyState,
    op: Op,
    now: u64,
    limits: &Limits,
    cost: u64,
) -> Option<PolicyDecision> {
    match op {
        Op::Evaluate => Some(state.evaluate(now, limits, cost)),
        Op::Decide => {
            let before = state.clone();
            let d = state.decide(now, limits, cost);
            if !d.is_allowed() {
                assert_eq!(*state, before, "a denied request consumes nothing");
                assert!(d.retry_after_millis() >= 1);
            }
            assert!(d.remaining() <= d.limit());
            Some(d)
        }
        Op::Commit => {
            state.commit(now, limits, cost);
            None
        }
        Op::Refund => {
            state.refund(now, limits, cost);
            None
        }
        Op::Overcharge => {
            state.overcharge(now, limits, cost);
            None
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

    /// Any `u64` cost, refund and settlement, under any limits the builder accepts (the
    /// plan's, and a per-key override's, in turn), at any time: no overflow (the test
    /// profile checks it), a denied request consumes nothing, and every cost from
    /// 2^53 − 1 up gets the answer 2^53 − 1 gets, which is what lets the Redis stores
    /// send it clamped.
    #[test]
    fn any_numbers_decide_without_overflow(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        plan in numbers(),
        over in numbers(),
        start in prop_oneof![0..(1u64 << 45), wide()],
        steps in prop::collection::vec((op(), step(), wide(), any::<bool>()), 1..40),
    ) {
        let Some(plan) = build(algorithm, plan) else { return Ok(()) };
        let over = build(algorithm, over).unwrap_or_else(|| plan.clone());
        let mut state = AnyState::fresh(algorithm);
        let mut now = start;
        for (op, dt, cost, overridden) in steps {
            now = now.saturating_add(dt % 3_000_000_000);
            let limits = if overridden { over.limits() } else { plan.limits() };
            let mut clamped = state.clone();
            let d = apply(&mut state, op, now, limits, cost);
            let _ = state.expires_at(limits);
            let _ = state.evaluate(now, limits, 0);
            // An in-flight policy's cost is a slot count here and a slot id in Redis.
            if cost >= WIRE_MAX && algorithm != Algorithm::InFlight {
                let c = apply(&mut clamped, op, now, limits, WIRE_MAX);
                prop_assert_eq!(&clamped, &state, "{:?} of {} vs of 2^53 - 1", op, cost);
                prop_assert_eq!(d.map(unmarked), c.map(unmarked));
            }
        }
    }
}

/// Every algorithm with a limit of 10 per second (burst 10).
fn tens() -> Vec<Policy> {
    [
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ]
    .into_iter()
    .map(|a| {
        Policy::builder("p", Rate::per_second(10))
            .algorithm(a)
            .build()
            .unwrap()
    })
    .collect()
}

#[test]
fn a_cost_above_the_capacity_is_denied_charging_nothing_and_marked() {
    for p in tens() {
        let mut s = AnyState::fresh(p.algorithm());
        assert!(s.decide(10_000, p.limits(), 4).is_allowed());
        for cost in [11, 1 << 53, u64::MAX] {
            let before = s.clone();
            let d = s.decide(10_100, p.limits(), cost);
            assert!(!d.is_allowed(), "{}: {cost}", p.algorithm());
            assert!(d.exceeds_capacity());
            assert_eq!(s, before, "{}: nothing charged", p.algorithm());
            let look = s.evaluate(10_100, p.limits(), 0);
            assert_eq!(d.remaining(), look.remaining());
            assert_eq!(d.retry_after_millis(), look.reset_after_millis().max(1));
        }
        let d = s.evaluate(10_100, p.limits(), 8);
        assert!(
            !d.is_allowed() && !d.exceeds_capacity(),
            "{}",
            p.algorithm()
        );
    }
}

#[test]
fn an_overcharge_is_a_debt_paid_at_the_limit_rate() {
    // 10 per second, 5 reserved and settled at 35: 30 units past the limit, three
    // windows' worth, before a unit fits again (the counter: three windows and the
    // fading weight of the last).
    for p in tens() {
        let a = p.algorithm();
        let mut s = AnyState::fresh(a);
        assert!(s.decide(10_000, p.limits(), 5).is_allowed());
        s.overcharge(10_000, p.limits(), 30);
        let d = s.evaluate(10_000, p.limits(), 1);
        assert!(!d.is_allowed(), "{a}");
        let retry = d.retry_after_millis();
        let (least, most) = match a {
            Algorithm::FixedWindow => (3_000, 3_000),
            Algorithm::SlidingWindowLog => (4_000, 4_000),
            Algorithm::SlidingWindowCounter => (3_100, 4_000),
            _ => (2_600, 2_600),
        };
        assert!(
            (least..=most).contains(&retry),
            "{a}: retry after {retry} ms"
        );
        assert!(
            s.evaluate(10_000 + retry, p.limits(), 1).is_allowed(),
            "{a}"
        );
        assert!(
            !s.evaluate(10_000 + retry - 1, p.limits(), 1).is_allowed(),
            "{a}"
        );
        assert!(
            s.expires_at(p.limits()) >= 10_000 + retry,
            "{a}: kept while it counts"
        );
    }
}

#[test]
fn a_debt_saturates_and_its_retry_stays_exact() {
    for p in tens() {
        let a = p.algorithm();
        let mut s = AnyState::fresh(a);
        assert!(s.decide(10_000, p.limits(), 1).is_allowed());
        s.overcharge(10_000, p.limits(), u64::MAX);
        let mut twice = s.clone();
        twice.overcharge(10_000, p.limits(), u64::MAX);
        assert_eq!(twice, s, "{a}: saturated");
        let cap = max_units(p.limits());
        // At most the cap is counted: refused for about cap / 10 seconds.
        let d = s.evaluate(10_000, p.limits(), 1);
        assert!(!d.is_allowed(), "{a}");
        let retry = d.retry_after_millis();
        assert!(retry >= (cap / 10 - 1) * 1_000, "{a}: {retry}");
        assert!(retry <= (cap / 10 + 3) * 1_000, "{a}: {retry}");
        test_support::assert_retry_exact(&s, 10_000, 1, &d, |s, t, c| s.evaluate(t, p.limits(), c));
        // A refund of everything pays the debt off.
        s.refund(10_000, p.limits(), u64::MAX);
        assert!(s.evaluate(10_000, p.limits(), 10).is_allowed(), "{a}");
    }
}

#[test]
fn retries_are_exact_in_debt_and_under_a_lower_limit() {
    for p in tens() {
        let a = p.algorithm();
        let lower = p.with_limit(3, None).unwrap();
        for extra in [0, 1, 9, 10, 11, 25, 97] {
            let mut s = AnyState::fresh(a);
            let mut t = 10_000;
            // Some traffic at the plan's rate, then a settlement past it.
            for _ in 0..7 {
                t += 37;
                s.decide(t, p.limits(), 1);
            }
            s.overcharge(t, p.limits(), extra);
            for limits in [p.limits(), lower.limits()] {
                for dt in [0, 1, 333, 999, 1_000, 1_001, 2_500] {
                    for cost in 1..=3 {
                        let d = s.evaluate(t + dt, limits, cost);
                        if !d.is_allowed() {
                            test_support::assert_retry_exact(&s, t + dt, cost, &d, |s, t, c| {
                                s.evaluate(t, limits, c)
                            });
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn gcra_retry_is_exact_after_an_override_lowers_the_rate() {
    // A remainder of the TAT kept in 1/7 ms reads as at most 2/3 ms under 3 per second.
    let p = Policy::builder("g", Rate::per_second(7))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap();
    let lower = p.with_limit(3, Some(3)).unwrap();
    // Seven units taken at once, and a TAT 6/7 ms past a whole millisecond: a remainder
    // the lower limit's unit (1/3 ms) cannot hold.
    let mut s = GcraState::default();
    s = Gcra::decide(s, 9_000, p.limits(), 7).1;
    s.frac = 6;
    let mut denied = 0;
    for now in 9_000..10_100 {
        for cost in 1..=3 {
            let d = Gcra::evaluate(&s, now, lower.limits(), cost);
            if !d.is_allowed() {
                denied += 1;
                test_support::assert_retry::<Gcra>(&s, now, lower.limits(), cost, &d);
            }
        }
    }
    assert!(denied > 1_000);
}

#[test]
fn the_counter_decides_a_cost_above_an_override_without_underflow() {
    // 10 units counted under a limit of 10; an override lowers it to 1; a cost of 3.
    let p = Policy::new("c", Rate::per_second(10)).unwrap();
    let one = p.with_limit(1, None).unwrap();
    let mut s = AnyState::fresh(Algorithm::SlidingWindowCounter);
    assert!(s.decide(10_000, p.limits(), 10).is_allowed());
    for now in [10_000, 10_500, 11_000, 11_999, 15_000] {
        let d = s.decide(now, one.limits(), 3);
        assert!(!d.is_allowed() && d.exceeds_capacity());
    }
    // A cost that fits the override waits for the ten units, paid at one per second.
    let d = s.evaluate(10_500, one.limits(), 1);
    assert!(!d.is_allowed() && !d.exceeds_capacity());
    test_support::assert_retry_exact(&s, 10_500, 1, &d, |s, t, c| s.evaluate(t, one.limits(), c));
}
