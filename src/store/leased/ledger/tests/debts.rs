//! Forced charges (costs settled above their reservation) are debts as the exact algorithms
//! keep them, at every size a caller can send, in Rust and in Lua alike.

use super::*;

/// The algorithm a ledger kind stands for, for the comparisons with the exact algorithms.
fn algorithm_of(kind: Kind) -> Algorithm {
    match kind {
        Kind::Counter => Algorithm::SlidingWindowCounter,
        Kind::Log => Algorithm::SlidingWindowLog,
        Kind::Bucket => Algorithm::TokenBucket,
        Kind::Fixed => Algorithm::FixedWindow,
    }
}

/// The extra charges the extreme tests force: small, around the limit, around the debt's
/// saturation (⌊2^52 / W⌋ units), around 2^53 (where doubles stop being exact) and `u64::MAX`.
fn extremes(n: u64, w: u64) -> Vec<u64> {
    let top = crate::algorithm::MAX_USAGE_WINDOW_PRODUCT / w;
    vec![
        1,
        n - 1,
        n,
        n + 1,
        3 * n + 2,
        top - 1,
        top,
        top + 1,
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        u64::MAX / 2,
        u64::MAX,
    ]
}

/// A forced charge is a debt as the exact algorithms keep it: after a request of `used`
/// units and a cost settled `extra` above its reservation, the ledger (in Rust) and the exact
/// algorithm admit and refuse alike at every later instant, with the same `retry_after`,
/// whatever `extra` (any `u64`) and however long after.
#[test]
fn a_forced_charge_is_the_exact_algorithms_debt() {
    for kind in [Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed] {
        for (n, w) in [(7u64, 1_000u64), (3, 86_400_000), (1_000, 10)] {
            let rate = crate::Rate::new(n, std::time::Duration::from_millis(w));
            let rate = if kind == Kind::Bucket {
                rate.with_burst(n + 2)
            } else {
                rate
            };
            let policy = Policy::builder("d", rate)
                .algorithm(algorithm_of(kind))
                .build()
                .unwrap();
            let limits = *policy.limits();
            for extra in extremes(n, w) {
                for used in [0, 1, n] {
                    let t0 = 1_700_000_000_123u64;
                    let mut exact = crate::algorithm::AnyState::fresh(policy.algorithm());
                    let mut states: [Option<LState>; 1] = [None];
                    let mut part = Part::new(kind, &policy);
                    if used > 0 {
                        assert!(exact.decide(t0, &limits, used).is_allowed());
                        part.cost = used;
                        part.wanted = used;
                        assert!(
                            run(&call(LedgerMode::Grant, 0, 1, 0, part), &mut states, t0).granted
                        );
                    }
                    let t1 = t0 + w / 3;
                    exact.overcharge(t1, &limits, extra);
                    part.cost = extra;
                    run(&call(LedgerMode::Force, 0, 2, 0, part), &mut states, t1);
                    // How long the debt takes to pay back (it saturates at ⌊2^52 / W⌋ units).
                    let units = extra.min(crate::algorithm::MAX_USAGE_WINDOW_PRODUCT / w);
                    let debt_ms = (units / n + 1) * w;
                    for later in [
                        0,
                        1,
                        w / 2,
                        w,
                        2 * w + 1,
                        5 * w,
                        debt_ms / 2,
                        debt_ms,
                        debt_ms + 3 * w,
                    ] {
                        let t = t1 + later;
                        for cost in [1, n] {
                            let want = exact.evaluate(t, &limits, cost);
                            part.cost = cost;
                            let got = run(&call(LedgerMode::Peek, 0, 3, 0, part), &mut states, t);
                            let what = format!(
                                "{kind:?} n {n} w {w}: used {used}, extra {extra}, cost {cost} at +{later}"
                            );
                            assert_eq!(got.granted, want.is_allowed(), "{what}: {got:?} {want:?}");
                            if !got.granted {
                                assert_eq!(
                                    got.answers[0].retry_after_ms,
                                    want.retry_after_millis(),
                                    "{what}"
                                );
                            }
                            assert_eq!(got.answers[0].remaining, want.remaining(), "{what}");
                        }
                    }
                }
            }
        }
    }
}

/// Forced charges at the extremes (any `u64`, around the debt's saturation and around 2^53)
/// get the same replies from the Lua ledger and its Rust twin: the charge itself, then
/// grants, peeks and a return at later instants, carried debts included.
#[test]
fn forced_charges_at_the_extremes_match_in_lua_and_rust() {
    let server = Server::start();
    let mut conn = server
        .connection()
        .expect("a connection to the test's redis-server");
    let mut calls = 0;
    for kind in [Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed] {
        for (n, w) in [(7u64, 1_000u64), (3, 86_400_000), (1_000, 10)] {
            let cap = if kind == Kind::Bucket { n + 2 } else { n };
            for extra in extremes(n, w) {
                for used in [0, 1, n] {
                    let state = format!("tg-ledger-x-{}-{n}-{extra}-{used}:{{k}}", kind as u8);
                    let units = format!("{state}:u");
                    let over = format!("{state}:ovr");
                    let keys = Keys {
                        state: &state,
                        units: &units,
                        over: &over,
                    };
                    let mut part = Part {
                        kind,
                        limit: n,
                        window_ms: w,
                        capacity: cap,
                        cost: 0,
                        wanted: 0,
                        returned: Returned::default(),
                    };
                    let mut states: [Option<LState>; 1] = [None];
                    let mut both = |c: LedgerCall, now: u64| {
                        let want = run(&c, &mut states, now);
                        let got = lua(&mut conn, &keys, &c, now);
                        assert_eq!(
                            got, want,
                            "{kind:?} n {n} w {w}: used {used}, extra {extra}: {c:?} at {now}"
                        );
                        calls += 1;
                        want
                    };
                    let t0 = 1_700_000_000_123u64;
                    if used > 0 {
                        part.cost = used;
                        part.wanted = used;
                        both(call(LedgerMode::Grant, 0, 1, 0, part), t0);
                    }
                    let t1 = t0 + w / 3;
                    part.cost = extra;
                    both(call(LedgerMode::Force, 0, 2, 0, part), t1);
                    // A second force adds to the debt, and saturates as the first did.
                    if extra % 2 == 1 {
                        both(call(LedgerMode::Force, 0, 3, 0, part), t1 + 1);
                    }
                    // How long the debt takes to pay back (it saturates at ⌊2^52 / W⌋ units).
                    let units = extra.min(crate::algorithm::MAX_USAGE_WINDOW_PRODUCT / w);
                    let debt_ms = (units / n + 1) * w;
                    let mut held = None;
                    for (i, later) in [
                        1,
                        w / 2,
                        w,
                        2 * w + 1,
                        5 * w,
                        debt_ms / 2,
                        debt_ms,
                        debt_ms + 3 * w,
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        let t = t1 + later;
                        let id = 10 + i as u64;
                        part.cost = 1;
                        part.wanted = n;
                        both(call(LedgerMode::Peek, 0, id, 0, part), t);
                        let r = both(call(LedgerMode::Grant, w / 4 + 1, id, 0, part), t);
                        if let Some((hid, k, at, lease_ms)) = held.take() {
                            let mut back = part;
                            back.returned = Returned {
                                granted: k,
                                unused: k / 2,
                                granted_at: at,
                                lease_ms,
                                rate: 0,
                            };
                            both(call(LedgerMode::Return, 0, hid, 0, back), t);
                        }
                        if r.granted && r.lease_ms > 0 {
                            held = Some((id, r.answers[0].granted, t, r.lease_ms));
                        }
                    }
                }
            }
        }
    }
    assert!(calls > 1_000, "{calls} calls compared");
}

/// No number a caller sends makes the ledger's arithmetic overflow (tests run with overflow
/// checks): two forced charges of `u64::MAX` are one saturated debt, which refuses every
/// cost for about 2^52 / N ms (not a window or two, as when debts were capped), and a return
/// of more than was ever granted gives back what is there, no more.
#[test]
fn hostile_numbers_saturate_never_wrap() {
    for kind in [Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed] {
        let policy = Policy::builder("h", crate::Rate::new(10, std::time::Duration::from_secs(1)))
            .algorithm(algorithm_of(kind))
            .build()
            .unwrap();
        let mut states: [Option<LState>; 1] = [None];
        let now = 1_700_000_000_000u64;
        let mut part = Part::new(kind, &policy);
        part.cost = u64::MAX;
        run(&call(LedgerMode::Force, 0, 1, 0, part), &mut states, now);
        run(&call(LedgerMode::Force, 0, 2, 0, part), &mut states, now);
        // ⌊2^52 / 1000⌋ units at 10 a second: about 4.5 · 10^11 ms.
        let debt_ms = crate::algorithm::MAX_USAGE_WINDOW_PRODUCT / 1_000 / 10 * 1_000;
        for a in [1, 10, 11, u64::MAX] {
            part.cost = a;
            part.wanted = u64::MAX;
            let r = run(&call(LedgerMode::Grant, 300, 3, 0, part), &mut states, now);
            assert!(!r.granted, "{kind:?} cost {a}");
            let retry = r.answers[0].retry_after_ms;
            assert!(
                (debt_ms - 2_000..=debt_ms + 2_000).contains(&retry),
                "{kind:?} cost {a}: retry after {retry}, debt {debt_ms} ms"
            );
            let r = run(
                &call(LedgerMode::Peek, 0, 3, 0, part),
                &mut states,
                now + debt_ms / 2,
            );
            assert!(!r.granted);
        }
        part.cost = 1;
        let r = run(
            &call(LedgerMode::Peek, 0, 4, 0, part),
            &mut states,
            now + debt_ms + 2_000,
        );
        assert!(r.granted, "{kind:?}: the debt is paid off: {r:?}");
        // A return of more than was ever granted gives back what is there, no more.
        part.returned = Returned {
            granted: u64::MAX,
            unused: u64::MAX,
            granted_at: now,
            lease_ms: u64::MAX,
            rate: u64::MAX,
        };
        run(
            &call(LedgerMode::Return, 0, 1, 0, part),
            &mut states,
            now + 1,
        );
        part.cost = 1;
        run(
            &call(LedgerMode::Peek, 0, 4, 0, part),
            &mut states,
            now + 2_000,
        );
    }
}

/// A window's ledger key lives until the debt it carries is paid (Redis TTLs): a count of
/// four windows' worth is kept about four windows (five for the counter, whose last window
/// still weighs), not one, or the key would expire with the debt unpaid.
#[test]
fn a_windows_debt_keeps_its_key() {
    let server = Server::start();
    let mut conn = server
        .connection()
        .expect("a connection to the test's redis-server");
    for (kind, windows) in [(Kind::Fixed, 4), (Kind::Counter, 5)] {
        let state = format!("tg-ledger-debt-ttl-{}:{{k}}", kind as u8);
        let over = format!("{state}:ovr");
        let keys = Keys {
            state: &state,
            units: "unused",
            over: &over,
        };
        let mut part = Part::new(
            kind,
            &Policy::builder("w", crate::Rate::new(10, std::time::Duration::from_secs(1)))
                .algorithm(algorithm_of(kind))
                .build()
                .unwrap(),
        );
        let now = 1_700_000_000_000u64;
        part.cost = 1;
        part.wanted = 1;
        assert!(
            lua(
                &mut conn,
                &keys,
                &call(LedgerMode::Grant, 0, 1, 0, part),
                now
            )
            .granted
        );
        part.cost = 39;
        let r = lua(
            &mut conn,
            &keys,
            &call(LedgerMode::Force, 0, 2, 0, part),
            now,
        );
        assert!(!r.granted, "{kind:?}: a debt stands");
        let pttl: i64 = redis::cmd("PTTL").arg(&state).query(&mut conn).unwrap();
        let want = windows * 1_000;
        assert!(
            (want..=want + 1_100).contains(&pttl),
            "{kind:?}: the key lives {pttl} ms, its debt {want} ms"
        );
    }
}

/// A give-back no charge names is stamped with the instance's clock, which may run ahead of
/// the ledger's: read as a grant made later than now, it would bring back the bucket's refill
/// for the difference. It gives back its units and no more.
#[test]
fn a_give_back_stamped_ahead_of_the_ledger_gives_back_its_units_only() {
    let policy = Policy::builder(
        "skew",
        crate::Rate::new(10, std::time::Duration::from_secs(1)),
    )
    .algorithm(Algorithm::TokenBucket)
    .build()
    .unwrap();
    let mut states: [Option<LState>; 1] = [None];
    let now = 1_700_000_000_000u64;
    let mut part = Part::new(Kind::Bucket, &policy);
    part.cost = 10;
    part.wanted = 10;
    let r = run(&call(LedgerMode::Grant, 0, 1, 0, part), &mut states, now);
    assert!(r.granted);
    part.returned = Returned {
        granted: 1,
        unused: 1,
        granted_at: now + 2_000,
        lease_ms: 0,
        rate: 0,
    };
    run(&call(LedgerMode::Return, 0, 2, 0, part), &mut states, now);
    part.cost = 2;
    part.wanted = 2;
    let r = run(&call(LedgerMode::Peek, 0, 3, 0, part), &mut states, now);
    assert!(
        !r.granted,
        "one unit came back, not the refill of 2 s: {r:?}"
    );
    part.cost = 1;
    part.wanted = 1;
    let r = run(&call(LedgerMode::Peek, 0, 4, 0, part), &mut states, now);
    assert!(r.granted, "the unit given back: {r:?}");
}
