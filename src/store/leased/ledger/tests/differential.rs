//! Random sequences of every kind of call, alone and batched, with overrides changing
//! between them: the Lua ledger answers as the Rust ledger does.

use super::*;

#[test]
fn the_lua_ledger_matches_the_rust_ledger() {
    differential(false);
}

/// Batched calls (one script call running several in order, as the Redis stores send
/// queued calls) answer each call as if it were sent alone at the same instant.
#[test]
fn a_batch_of_ledger_calls_answers_as_the_calls_one_by_one() {
    differential(true);
}

/// A block granted and not given back yet: its id, units, grant time, lease and the limit
/// in force when it was granted.
type Held = (u64, u64, u64, u64, u64);

fn differential(batched: bool) {
    let server = Server::start();
    let mut conn = server
        .connection()
        .expect("a connection to the test's redis-server");
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D ^ u64::from(std::process::id());
    let mut rand = move |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let mut overridden_calls = 0;
    for kind in [Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed] {
        let state = format!("tg-ledger-diff-{}-{}:{{k}}", kind as u8, u8::from(batched));
        let units = format!("{state}:u");
        let over = format!("{state}:ovr");
        let keys = Keys {
            state: &state,
            units: &units,
            over: &over,
        };
        let base = Part {
            kind,
            limit: 7,
            window_ms: 1_000,
            capacity: if kind == Kind::Bucket { 9 } else { 7 },
            cost: 0,
            wanted: 0,
            returned: Returned::default(),
        };
        let mut states: [Option<LState>; 1] = [None];
        // The override in force: (limit, capacity), as its key holds it.
        let mut in_force: Option<(u64, u64)> = None;
        let mut now = 1_700_000_000_000u64;
        let mut held: Option<Held> = None;
        let mut id = 0u64;
        while id < 600 {
            now += rand(4) * rand(150);
            // Between script calls, an operator sets, changes or removes the override.
            if let Some(changed) = change_override(&mut rand, kind, &over, &mut conn) {
                in_force = changed;
            }
            if in_force.is_some() {
                overridden_calls += 1;
            }
            let effective = |p: Part| {
                p.with_override(in_force.and_then(|(l, c)| Override::usable(l, c, p.window_ms)))
            };
            let size = if batched { 1 + rand(4) } else { 1 };
            let mut calls = Vec::new();
            let mut wants = Vec::new();
            for _ in 0..size {
                id += 1;
                let c = random_call(&mut rand, base, id, &mut held, now);
                let mut rust_call = c.clone();
                for p in rust_call.parts.iter_mut() {
                    *p = effective(*p);
                }
                let want = run(&rust_call, &mut states, now);
                if c.mode == LedgerMode::Grant && want.granted && want.lease_ms > 0 {
                    let a = want.answers[0];
                    held = Some((id, a.granted, now, want.lease_ms, a.limit));
                }
                calls.push(c);
                wants.push(want);
            }
            let gots = if batched {
                lua_batch(&mut conn, &keys, &calls, now)
            } else {
                vec![lua(&mut conn, &keys, &calls[0], now)]
            };
            for ((got, want), c) in gots.iter().zip(&wants).zip(&calls) {
                assert_eq!(
                    got, want,
                    "{kind:?} call {} at {now}, override {in_force:?}: {c:?}",
                    c.block_id
                );
            }
        }
    }
    assert!(overridden_calls > 100, "overrides were in force too rarely");
}

/// Now and then sets, changes or removes the override at `over`: the override now in force
/// when it did (`None` inside: removed), `None` when it left it alone.
fn change_override(
    rand: &mut dyn FnMut(u64) -> u64,
    kind: Kind,
    over: &str,
    conn: &mut redis::Connection,
) -> Option<Option<(u64, u64)>> {
    match rand(8) {
        0 => {
            let limit = 3 + rand(10);
            let capacity = if kind == Kind::Bucket {
                limit + rand(4)
            } else {
                limit
            };
            let mut value = (limit as f64).to_le_bytes().to_vec();
            value.extend_from_slice(&(capacity as f64).to_le_bytes());
            let _: () = redis::cmd("SET").arg(over).arg(value).query(conn).unwrap();
            Some(Some((limit, capacity)))
        }
        1 => {
            let _: () = redis::cmd("DEL").arg(over).query(conn).unwrap();
            Some(None)
        }
        _ => None,
    }
}

/// A random call of `base`'s policy with block id `id`: a peek, a return of the block
/// `held`, a give-back of units charged outside blocks (a refund of a request decided
/// exactly, named by a fresh id), a force, a keep, a reset or a grant (giving `held` back
/// first, when there is one).
fn random_call(
    rand: &mut dyn FnMut(u64) -> u64,
    base: Part,
    id: u64,
    held: &mut Option<Held>,
    now: u64,
) -> LedgerCall {
    let mut part = base;
    // Mostly costs within any limit; now and then one above the override's.
    let cost = |r: &mut dyn FnMut(u64) -> u64| {
        if r(10) == 0 {
            1 + r(12)
        } else {
            1 + r(2)
        }
    };
    match rand(6) {
        0 => {
            // A look of cost 0 now and then: it writes no entry, on either side.
            part.cost = if rand(4) == 0 { 0 } else { cost(rand) };
            call(LedgerMode::Peek, 0, id, 0, part)
        }
        1 if held.is_some() => {
            let (hid, k, at, lease_ms, rate) = held.take().unwrap_or_default();
            part.returned = Returned {
                granted: k,
                unused: rand(k + 1),
                granted_at: at,
                lease_ms,
                rate: if rand(4) == 0 { 0 } else { rate },
            };
            call(LedgerMode::Return, 0, hid, 0, part)
        }
        2 => {
            // Mostly small debts, carried over a few windows; now and then one at the
            // extremes (any `u64`), which the reset below clears.
            part.cost = if rand(8) == 0 {
                let top = crate::algorithm::MAX_USAGE_WINDOW_PRODUCT / base.window_ms;
                [top - 1, top, u64::from(u32::MAX), (1 << 53) + 1, u64::MAX][rand(5) as usize]
            } else {
                [1, 3, 7, 8, 20, 45][rand(6) as usize]
            };
            call(LedgerMode::Force, 0, id, 0, part)
        }
        3 if rand(4) == 0 => call(LedgerMode::Keep, 0, 0, 0, part),
        4 if rand(2) == 0 => {
            let units = cost(rand);
            part.returned = Returned {
                granted: units,
                unused: units,
                // Now and then stamped ahead of the ledger, as an instance whose clock runs
                // ahead stamps a give-back no charge names.
                granted_at: now + if rand(4) == 0 { rand(3_000) } else { 0 },
                lease_ms: 0,
                rate: 0,
            };
            call(LedgerMode::Return, 0, id, 0, part)
        }
        3 if rand(3) == 0 => call(LedgerMode::Reset, 0, 0, 0, part),
        _ => {
            part.cost = cost(rand);
            part.wanted = part.cost + rand(4);
            let lease = [0, 50, 300][rand(3) as usize];
            let mut previous = 0;
            if let Some((hid, k, at, lease_ms, rate)) = held.take() {
                previous = hid;
                part.returned = Returned {
                    granted: k,
                    unused: rand(k + 1),
                    granted_at: at,
                    lease_ms,
                    rate,
                };
            }
            call(LedgerMode::Grant, lease, id, previous, part)
        }
    }
}

/// A token bucket's ledger key lives as long as its deficit needs at the slower of the
/// plan's rate and an override's (the override can end with nothing written), and setting
/// an override that slows the refill extends it (`k`): otherwise the key could expire while
/// the override still holds tokens back, and the bucket would start full.
#[test]
fn a_slower_override_keeps_the_bucket_state_long_enough() {
    let server = Server::start();
    let mut conn = server
        .connection()
        .expect("a connection to the test's redis-server");
    let (state, over) = ("tg-ledger-ttl:{k}", "tg-ledger-ttl:{k}:ovr");
    let keys = Keys {
        state,
        units: "unused",
        over,
    };
    let mut part = Part::new(
        Kind::Bucket,
        &Policy::builder(
            "b",
            crate::Rate::new(1_000, std::time::Duration::from_secs(1)),
        )
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap(),
    );
    let now = 1_700_000_000_000u64;
    part.cost = 500;
    part.wanted = 500;
    let reply = lua(
        &mut conn,
        &keys,
        &call(LedgerMode::Grant, 0, 1, 0, part),
        now,
    );
    assert!(reply.granted);
    let pttl = |conn: &mut redis::Connection| -> i64 {
        redis::cmd("PTTL").arg(state).query(conn).unwrap()
    };
    // 500 tokens at 1 000 a second: about half a second, plus the margin.
    assert!(pttl(&mut conn) <= 1_500 + 10, "{}", pttl(&mut conn));
    // An override to 10 a second: the same deficit takes 50 s to refill.
    let mut value = 10f64.to_le_bytes().to_vec();
    value.extend_from_slice(&1_000f64.to_le_bytes());
    let _: () = redis::cmd("SET")
        .arg(over)
        .arg(value)
        .query(&mut conn)
        .unwrap();
    let mut keep = Part::new(
        Kind::Bucket,
        &Policy::builder(
            "b",
            crate::Rate::new(10, std::time::Duration::from_secs(1)).with_burst(1_000),
        )
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap(),
    );
    keep.cost = 0;
    lua(
        &mut conn,
        &keys,
        &call(LedgerMode::Keep, 0, 0, 0, keep),
        now,
    );
    assert!(pttl(&mut conn) >= 50_000, "{}", pttl(&mut conn));
    // A grant under the override writes the slower rate's TTL too.
    part.cost = 1;
    part.wanted = 1;
    let reply = lua(
        &mut conn,
        &keys,
        &call(LedgerMode::Grant, 0, 2, 0, part),
        now + 10,
    );
    assert!(reply.granted);
    assert_eq!(reply.answers[0].limit, 10, "decided under the override");
    assert!(pttl(&mut conn) >= 50_000, "{}", pttl(&mut conn));
}

/// A bucket's deficit drains from the later of the call's clock and the last refill: when
/// the server's clock steps back, the key lives until that deficit is refilled from the
/// later moment, not from the earlier clock (the key would expire early, the bucket full).
/// Both ways of charging a bucket at the ledger: a grant with no lease (the quick path) and
/// a lease's block (the general one).
#[test]
fn a_clock_stepped_back_keeps_the_bucket_state_until_its_deficit_refills() {
    let server = Server::start();
    let mut conn = server
        .connection()
        .expect("a connection to the test's redis-server");
    let policy = Policy::builder(
        "b",
        crate::Rate::new(1_000, std::time::Duration::from_secs(1)),
    )
    .algorithm(Algorithm::TokenBucket)
    .build()
    .unwrap();
    let now = 1_700_000_000_000u64;
    let back = 20_000;
    for (case, lease) in [("quick", 0), ("block", 1_000)] {
        let state = format!("tg-ledger-step-{case}:{{k}}");
        let over = format!("tg-ledger-step-{case}:{{k}}:ovr");
        let keys = Keys {
            state: &state,
            units: "unused",
            over: &over,
        };
        let mut part = Part::new(Kind::Bucket, &policy);
        part.cost = 100;
        part.wanted = 100;
        let first = lua(
            &mut conn,
            &keys,
            &call(LedgerMode::Grant, lease, 1, 0, part),
            now,
        );
        assert!(first.granted, "{case}");
        let mut part = Part::new(Kind::Bucket, &policy);
        part.cost = 100;
        part.wanted = 100;
        let stepped = lua(
            &mut conn,
            &keys,
            &call(LedgerMode::Grant, lease, 2, 0, part),
            now - back,
        );
        assert!(stepped.granted, "{case}");
        let pttl: i64 = redis::cmd("PTTL").arg(&state).query(&mut conn).unwrap();
        // 200 tokens at 1 000 a second refill 200 ms after `now`, which is 20 s after the
        // stepped-back clock.
        assert!(
            pttl >= (back + 200) as i64,
            "{case}: the key lives {pttl} ms after a clock {back} ms behind its last refill"
        );
    }
}

#[cfg(feature = "redis")]
#[test]
fn ledger_replies_of_the_wrong_shape_are_protocol_errors() {
    fn reply(numbers: &[f64]) -> Vec<u8> {
        numbers.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    let now = 1_700_000_000_000.0;
    let ok = LedgerReply::parse(
        &reply(&[1.0, 250.0, now, 1.0, 5.0, 40.0, 800.0, 0.0, 100.0, 120.0]),
        1,
    )
    .unwrap();
    assert!(ok.granted);
    assert_eq!((ok.lease_ms, ok.now_ms), (250, 1_700_000_000_000));
    assert_eq!(ok.answers[0].remaining, 40);
    assert_eq!((ok.answers[0].limit, ok.answers[0].capacity), (100, 120));
    assert!(LedgerReply::parse(&reply(&[1.0, 0.0, now, 0.0]), 2)
        .unwrap()
        .answers
        .is_empty());
    let mut two = reply(&[1.0, 0.0, now, 0.0]);
    two.extend(reply(&[0.0, 0.0, now, 1.0, 0.0, 0.0, 10.0, 10.0, 5.0, 5.0]));
    let mut rest = two.as_slice();
    assert!(LedgerReply::parse_next(&mut rest, 1).unwrap().granted);
    assert!(!LedgerReply::parse_next(&mut rest, 1).unwrap().granted);
    assert!(rest.is_empty());
    for bad in [
        Vec::new(),
        reply(&[1.0, 0.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, 40.0, 800.0, 0.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, 40.0, 800.0, 0.0, 1.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, 40.0, 800.0, 0.0, 1.0, 1.0, 1.0]),
        reply(&[1.0, 0.0, now, 2.0, 5.0, 40.0, 800.0, 0.0, 1.0, 1.0]),
        reply(&[2.0, 0.0, now, 0.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, -1.0, 800.0, 0.0, 1.0, 1.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, 1.0, 800.0, 0.0, 1.5, 1.0]),
        reply(&[1.0, 0.5, now, 0.0]),
        reply(&[1.0, 0.0, f64::NAN, 0.0]),
        reply(&[1.0, 0.0, f64::INFINITY, 0.0]),
        reply(&[1.0, 0.0, 1e300, 0.0]),
        b"1 0 1700000000000".to_vec(),
    ] {
        assert!(
            matches!(LedgerReply::parse(&bad, 1), Err(StoreError::Protocol(_))),
            "{bad:02x?}"
        );
    }
}

/// A give-back naming a charge whose log entry left its window (pruned by a peek in Redis,
/// still in the Rust map) gives nothing back in either ledger: those units count no more.
#[test]
fn a_give_back_naming_an_entry_gone_from_its_window_gives_nothing() {
    let server = Server::start();
    let mut conn = server.connection().unwrap();
    let (state, units, over) = (
        "tg-named-gone:{k}",
        "tg-named-gone:{k}:u",
        "tg-named-gone:{k}:ovr",
    );
    let keys = Keys { state, units, over };
    let base = Part {
        kind: Kind::Log,
        limit: 7,
        window_ms: 1_000,
        capacity: 7,
        cost: 0,
        wanted: 0,
        returned: Returned::default(),
    };
    let grant = |id: u64, cost: u64| {
        let mut p = base;
        p.cost = cost;
        p.wanted = cost;
        call(LedgerMode::Grant, 0, id, 0, p)
    };
    let peek = || {
        let mut p = base;
        p.cost = 1;
        call(LedgerMode::Peek, 0, 0, 0, p)
    };
    let t0 = 1_700_000_000_000u64;
    let named = {
        let mut p = base;
        p.returned = Returned {
            granted: 3,
            unused: 3,
            granted_at: t0,
            lease_ms: 0,
            rate: 0,
        };
        call(LedgerMode::Return, 0, 1, 0, p)
    };
    let steps = [
        (grant(1, 3), t0),
        (grant(2, 3), t0 + 500),
        (peek(), t0 + 1_100),
        (named, t0 + 1_100),
        (peek(), t0 + 1_100),
    ];
    let mut states: [Option<LState>; 1] = [None];
    for (c, now) in steps {
        let want = run(&c, &mut states, now);
        let got = lua(&mut conn, &keys, &c, now);
        assert_eq!(got, want, "{:?} at {}", c.mode, now - t0);
    }
}
