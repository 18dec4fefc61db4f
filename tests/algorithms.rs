//! Property tests of the five algorithms over random request traces.
//!
//! For every algorithm: the admitted total in every interval stays within the algorithm's
//! stated bound, a denied request leaves the state untouched, and every denial's
//! `retry_after` is exact (a retry then passes, one millisecond earlier fails).

mod support;

use std::time::Duration;

use proptest::prelude::*;
use tollgate::algorithm::{AnyState, PolicyDecision};
use tollgate::{Algorithm, Policy, Rate};

/// A request decided against any algorithm's state, in the state-passing style the
/// properties are written in: the new state is returned beside the decision.
fn decide(mut state: AnyState, now: u64, p: &Policy, cost: u64) -> (PolicyDecision, AnyState) {
    let d = state.decide(now, p.limits(), cost);
    (d, state)
}

fn policy(a: Algorithm, limit: u64, window_ms: u64, burst: Option<u64>) -> Policy {
    let mut rate = Rate::new(limit, Duration::from_millis(window_ms));
    if let (Some(b), true) = (burst, a.has_burst()) {
        rate = rate.with_burst(b);
    }
    Policy::builder("prop", rate).algorithm(a).build().unwrap()
}

/// Runs a trace; returns the admitted `(time, cost)` pairs. Checks, at every step, that a
/// denial changes nothing and that its retry_after is exact.
fn run(p: &Policy, start: u64, steps: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut state = AnyState::fresh(p.algorithm());
    let mut now = start;
    let mut admitted = vec![];
    for &(gap, cost) in steps {
        now += gap;
        let cost = cost.min(p.capacity());
        let before = state.clone();
        let (d, after) = decide(state, now, p, cost);
        if d.is_allowed() {
            admitted.push((now, cost));
        } else {
            assert_eq!(before, after, "a denial changed the state");
            let retry = d.retry_after_millis();
            assert!(retry >= 1);
            assert!(
                before.evaluate(now + retry, p.limits(), cost).is_allowed(),
                "{:?}: retry at +{retry} ms must pass",
                p.algorithm()
            );
            assert!(
                !before
                    .evaluate(now + retry - 1, p.limits(), cost)
                    .is_allowed(),
                "{:?}: retry at +{} ms must fail",
                p.algorithm(),
                retry - 1
            );
        }
        state = after;
    }
    admitted
}

/// Every `(first, last)` pair of admitted events: time span and total cost from first to last.
fn spans(admitted: &[(u64, u64)]) -> impl Iterator<Item = (u64, u64)> + '_ {
    (0..admitted.len()).flat_map(move |i| {
        let mut total = 0;
        admitted[i..].iter().map(move |&(t, c)| {
            total += c;
            (t - admitted[i].0, total)
        })
    })
}

fn trace() -> impl Strategy<Value = Vec<(u64, u64)>> {
    // Gaps are mostly tiny (bursts), sometimes long (window flips and refills).
    proptest::collection::vec(
        (
            prop_oneof![4 => 0u64..5, 3 => 0u64..150, 1 => 0u64..2_500],
            prop_oneof![6 => Just(1u64), 1 => 1u64..6],
        ),
        1..400,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn log_never_exceeds_n_in_any_window(
        limit in 1u64..20, window in 50u64..2_000, start in 0u64..10_000, steps in trace()
    ) {
        let p = policy(Algorithm::SlidingWindowLog, limit, window, None);
        let admitted = run(&p, start, &steps);
        for (span, total) in spans(&admitted) {
            if span < window {
                prop_assert!(total <= limit, "{total} in {span} ms > {limit} per {window} ms");
            }
        }
    }

    #[test]
    fn buckets_stay_within_capacity_plus_rate(
        a in prop_oneof![Just(Algorithm::TokenBucket), Just(Algorithm::Gcra)],
        limit in 1u64..20, window in 50u64..2_000, burst in 1u64..30, start in 0u64..10_000,
        steps in trace()
    ) {
        let p = policy(a, limit, window, Some(burst));
        let admitted = run(&p, start, &steps);
        for (span, total) in spans(&admitted) {
            // total ≤ burst + limit·span/window, in integers.
            prop_assert!(
                total.saturating_sub(burst) * window <= limit * span,
                "{a:?}: {total} in {span} ms > {burst} + {limit}·{span}/{window}"
            );
        }
    }

    #[test]
    fn counter_stays_within_its_formula(
        limit in 1u64..20, window in 50u64..2_000, start in 0u64..10_000, steps in trace()
    ) {
        let p = policy(Algorithm::SlidingWindowCounter, limit, window, None);
        let admitted = run(&p, start, &steps);
        for (span, total) in spans(&admitted) {
            if span <= window {
                // total ≤ N + N·L/W
                prop_assert!(
                    total.saturating_sub(limit) * window <= limit * span,
                    "{total} in {span} ms > {limit} + {limit}·{span}/{window}"
                );
            }
        }
    }

    #[test]
    fn fixed_window_never_exceeds_n_per_window(
        limit in 1u64..20, window in 50u64..2_000, start in 0u64..10_000, steps in trace()
    ) {
        let p = policy(Algorithm::FixedWindow, limit, window, None);
        let admitted = run(&p, start, &steps);
        let mut per_window = std::collections::BTreeMap::new();
        for (t, c) in admitted {
            *per_window.entry(t / window).or_insert(0) += c;
        }
        for (_, total) in per_window {
            prop_assert!(total <= limit);
        }
    }

    #[test]
    fn around_a_flip_only_the_fixed_window_doubles(
        limit in 2u64..50, window in 100u64..5_000, flip in 1u64..1_000
    ) {
        // limit requests 1 ms before a window flip, then limit more 1 ms after it.
        let t0 = flip * window - 1;
        let burst: Vec<(u64, u64)> = (0..limit).map(|_| (0, 1))
            .chain(std::iter::once((2, 1)))
            .chain((1..limit).map(|_| (0, 1)))
            .collect();
        for a in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog] {
            let p = policy(a, limit, window, None);
            let admitted: u64 = run(&p, t0, &burst).iter().map(|(_, c)| c).sum();
            if a == Algorithm::FixedWindow {
                prop_assert_eq!(admitted, 2 * limit);
            } else {
                prop_assert!(admitted <= limit + 1, "{a:?} admitted {admitted} of {limit} around a flip");
            }
        }
    }

    #[test]
    fn token_bucket_and_gcra_agree(
        limit in 1u64..50, window in 1u64..5_000, burst in 1u64..60, start in 0u64..100_000,
        steps in trace()
    ) {
        let g = policy(Algorithm::Gcra, limit, window, Some(burst));
        let t = policy(Algorithm::TokenBucket, limit, window, Some(burst));
        let (mut gs, mut ts) = (AnyState::fresh(Algorithm::Gcra), AnyState::fresh(Algorithm::TokenBucket));
        let mut now = start;
        for (gap, cost) in steps {
            now += gap;
            let cost = cost.min(burst);
            let (a, ngs) = decide(gs, now, &g, cost);
            let (b, nts) = decide(ts, now, &t, cost);
            prop_assert_eq!(a, b);
            gs = ngs;
            ts = nts;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    /// The memory store's single-policy path has its own arithmetic for the common cases
    /// (and sweeps expired state away); it must answer exactly as the functions do.
    #[test]
    fn the_memory_store_answers_as_the_functions_do(
        a in prop_oneof![
            Just(Algorithm::SlidingWindowCounter), Just(Algorithm::SlidingWindowLog),
            Just(Algorithm::TokenBucket), Just(Algorithm::FixedWindow), Just(Algorithm::Gcra)
        ],
        limit in prop_oneof![3 => 1u64..20, 1 => 1u64..1_000_000],
        window in prop_oneof![1 => 1u64..10, 3 => 10u64..3_000],
        burst in prop::option::of(1u64..30),
        shape in prop::option::of(1u64..500),
        start in prop_oneof![Just(0u64), 0u64..100_000, Just(1_700_000_000_000u64)],
        steps in proptest::collection::vec(
            (
                prop_oneof![4 => 0u64..5, 3 => 0u64..150, 1 => 0u64..5_000],
                prop_oneof![6 => Just(1u64), 1 => 1u64..6],
                prop::bool::weighted(0.2),
            ),
            1..300,
        )
    ) {
        let mut rate = Rate::new(limit, Duration::from_millis(window));
        if let (Some(b), true) = (burst, a.has_burst()) {
            rate = rate.with_burst(b);
        }
        let mut builder = Policy::builder("prop", rate).algorithm(a);
        if let (Some(ms), Algorithm::Gcra) = (shape, a) {
            builder = builder.shape(Duration::from_millis(ms));
        }
        // Some combinations are refused (the log's cap on its limit): nothing to compare.
        let Ok(p) = builder.build() else { return Ok(()) };
        let clock = tollgate::clock::ManualClock::new(start);
        let store = tollgate::store::MemoryStore::builder()
            .clock(clock.clone())
            .background_sweep(false)
            .build()
            .unwrap();
        let key = tollgate::key::Key::new("ip", "10.0.0.1");
        let policies = [p.clone()];
        let mut state = AnyState::fresh(a);
        for (gap, cost, peek) in steps {
            clock.advance(Duration::from_millis(gap));
            let now = tollgate::clock::Clock::now_millis(&clock);
            let cost = cost.min(p.capacity());
            let got = if peek {
                support::peek_now(&store, &key, &policies, &[cost])
            } else {
                tollgate::store::Store::check_now(&store, &key, &policies, &[cost]).expect("answers at once")
            }
            .unwrap();
            let want = if peek {
                state.evaluate(now, p.limits(), cost)
            } else {
                let (d, next) = decide(state.clone(), now, &p, cost);
                state = next;
                d
            };
            prop_assert_eq!(got.policies(), &[want][..], "{:?} at {} cost {} peek {}", a, now, cost, peek);
        }
    }
}

#[test]
fn huge_costs_are_refused_by_the_policy_not_locked_out() {
    let err = Policy::builder("p", Rate::per_day(10))
        .algorithm(Algorithm::TokenBucket)
        .cost(11)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "cost");
}
