//! The Lua ledger and its Rust twin give the same replies to the same calls at the same
//! times, overrides set, changed and removed between calls included, against a
//! `redis-server` the test starts on a free port (it fails when there is none: it never
//! skips).

use super::*;

/// A `redis-server` on a free loopback port, killed on drop.
struct Server {
    child: std::process::Child,
    port: u16,
}

impl Server {
    fn start() -> Self {
        use std::process::{Command, Stdio};
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("no free loopback port");
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be on PATH for the ledger's differential tests");
            let mut server = Server { child, port };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while std::time::Instant::now() < deadline {
                if matches!(server.child.try_wait(), Ok(Some(_))) {
                    break; // the port was taken: try another
                }
                if server.connection().is_some() {
                    return server;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        panic!("redis-server did not start");
    }

    fn connection(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).ok()?;
        let mut conn = client.get_connection().ok()?;
        let pong: String = redis::cmd("PING").query(&mut conn).ok()?;
        (pong == "PONG").then_some(conn)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call(mode: Mode, period: u64, id: u64, previous: u64, part: Part) -> LedgerCall {
    LedgerCall {
        mode,
        lease_ms: period,
        block_id: id,
        previous_block: previous,
        parts: smallvec::smallvec![part],
    }
}

/// The keys of one policy: its state, its log entries' units, its override.
struct Keys<'a> {
    state: &'a str,
    units: &'a str,
    over: &'a str,
}

/// The number of keys and the keys of `calls` (all one policy on `keys`): the state, the
/// entries' units for the sliding window log only, and the override.
fn push_keys(cmd: &mut redis::Cmd, keys: &Keys<'_>, calls: &[LedgerCall]) {
    let log = |c: &LedgerCall| c.parts.iter().any(|p| p.kind == Kind::Log);
    let count: usize = calls.iter().map(|c| if log(c) { 3 } else { 2 }).sum();
    cmd.arg(count);
    for c in calls {
        cmd.arg(keys.state);
        if log(c) {
            cmd.arg(keys.units);
        }
        cmd.arg(keys.over);
    }
}

fn lua(conn: &mut redis::Connection, keys: &Keys<'_>, c: &LedgerCall, now: u64) -> LedgerReply {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(include_str!("../../../../lua/lease.lua"));
    push_keys(&mut cmd, keys, std::slice::from_ref(c));
    let reply: Vec<u8> = cmd
        .arg(c.mode.code())
        .arg(now)
        .arg(c.lease_ms)
        .arg(c.block_id)
        .arg(c.previous_block)
        .arg(c.packed_parts())
        .query(conn)
        .expect("lease script");
    LedgerReply::parse(&reply, 1).unwrap_or_else(|e| {
        let numbers: Vec<f64> = reply
            .chunks(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect();
        panic!("{e}: {numbers:?} for {c:?}")
    })
}

/// Sends `calls` (all on `keys`) as one batched script call at `now`.
fn lua_batch(
    conn: &mut redis::Connection,
    keys: &Keys<'_>,
    calls: &[LedgerCall],
    now: u64,
) -> Vec<LedgerReply> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(include_str!("../../../../lua/lease.lua"));
    push_keys(&mut cmd, keys, calls);
    cmd.arg("B").arg(now).arg(calls.len());
    for c in calls {
        cmd.arg(c.mode.code())
            .arg(c.lease_ms)
            .arg(c.block_id)
            .arg(c.previous_block)
            .arg(c.packed_parts());
    }
    let reply: Vec<u8> = cmd.query(conn).expect("lease script, batched");
    let mut rest = reply.as_slice();
    let replies: Vec<LedgerReply> = calls
        .iter()
        .map(|_| LedgerReply::parse_next(&mut rest, 1).expect("reply"))
        .collect();
    assert!(rest.is_empty(), "one reply per call, nothing after them");
    replies
}

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
        // id, granted, at, valid, limit in force at the grant
        let mut held: Option<(u64, u64, u64, u64, u64)> = None;
        let mut id = 0u64;
        while id < 600 {
            now += rand(4) * rand(150);
            // Between script calls, an operator sets, changes or removes the override.
            match rand(8) {
                0 => {
                    let limit = 3 + rand(10);
                    let capacity = if kind == Kind::Bucket {
                        limit + rand(4)
                    } else {
                        limit
                    };
                    in_force = Some((limit, capacity));
                    let mut value = (limit as f64).to_le_bytes().to_vec();
                    value.extend_from_slice(&(capacity as f64).to_le_bytes());
                    let _: () = redis::cmd("SET")
                        .arg(&over)
                        .arg(value)
                        .query(&mut conn)
                        .unwrap();
                }
                1 => {
                    in_force = None;
                    let _: () = redis::cmd("DEL").arg(&over).query(&mut conn).unwrap();
                }
                _ => {}
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
                let mut part = base;
                // Mostly costs within any limit; now and then one above the override's.
                let cost = |r: &mut dyn FnMut(u64) -> u64| {
                    if r(10) == 0 {
                        1 + r(12)
                    } else {
                        1 + r(2)
                    }
                };
                let c = match rand(6) {
                    0 => {
                        part.cost = cost(&mut rand);
                        call(Mode::Peek, 0, id, 0, part)
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
                        call(Mode::Return, 0, hid, 0, part)
                    }
                    2 => {
                        // Mostly small debts, carried over a few windows; now and then one
                        // at the extremes (any `u64`), which the reset below clears.
                        part.cost = if rand(8) == 0 {
                            let top = crate::algorithm::MAX_USAGE_WINDOW_PRODUCT / base.window_ms;
                            [top - 1, top, u64::from(u32::MAX), (1 << 53) + 1, u64::MAX]
                                [rand(5) as usize]
                        } else {
                            [1, 3, 7, 8, 20, 45][rand(6) as usize]
                        };
                        call(Mode::Force, 0, id, 0, part)
                    }
                    3 if rand(4) == 0 => call(Mode::Keep, 0, 0, 0, part),
                    3 if rand(3) == 0 => call(Mode::Reset, 0, 0, 0, part),
                    _ => {
                        part.cost = cost(&mut rand);
                        part.wanted = part.cost + rand(4);
                        let period = [0, 50, 300][rand(3) as usize];
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
                        call(Mode::Grant, period, id, previous, part)
                    }
                };
                let mut rust_call = c.clone();
                for p in rust_call.parts.iter_mut() {
                    *p = effective(*p);
                }
                let want = run(&rust_call, &mut states, now);
                if c.mode == Mode::Grant && want.granted && want.lease_ms > 0 {
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
    let reply = lua(&mut conn, &keys, &call(Mode::Grant, 0, 1, 0, part), now);
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
    lua(&mut conn, &keys, &call(Mode::Keep, 0, 0, 0, keep), now);
    assert!(pttl(&mut conn) >= 50_000, "{}", pttl(&mut conn));
    // A grant under the override writes the slower rate's TTL too.
    part.cost = 1;
    part.wanted = 1;
    let reply = lua(
        &mut conn,
        &keys,
        &call(Mode::Grant, 0, 2, 0, part),
        now + 10,
    );
    assert!(reply.granted);
    assert_eq!(reply.answers[0].limit, 10, "decided under the override");
    assert!(pttl(&mut conn) >= 50_000, "{}", pttl(&mut conn));
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
/// units and a settlement `extra` above its reservation, the ledger (in Rust) and the exact
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
                        assert!(run(&call(Mode::Grant, 0, 1, 0, part), &mut states, t0).granted);
                    }
                    let t1 = t0 + w / 3;
                    exact.overcharge(t1, &limits, extra);
                    part.cost = extra;
                    run(&call(Mode::Force, 0, 2, 0, part), &mut states, t1);
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
                            let got = run(&call(Mode::Peek, 0, 3, 0, part), &mut states, t);
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
                        both(call(Mode::Grant, 0, 1, 0, part), t0);
                    }
                    let t1 = t0 + w / 3;
                    part.cost = extra;
                    both(call(Mode::Force, 0, 2, 0, part), t1);
                    // A second force adds to the debt, and saturates as the first did.
                    if extra % 2 == 1 {
                        both(call(Mode::Force, 0, 3, 0, part), t1 + 1);
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
                        both(call(Mode::Peek, 0, id, 0, part), t);
                        let r = both(call(Mode::Grant, w / 4 + 1, id, 0, part), t);
                        if let Some((hid, k, at, lease_ms)) = held.take() {
                            let mut back = part;
                            back.returned = Returned {
                                granted: k,
                                unused: k / 2,
                                granted_at: at,
                                lease_ms,
                                rate: 0,
                            };
                            both(call(Mode::Return, 0, hid, 0, back), t);
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
        run(&call(Mode::Force, 0, 1, 0, part), &mut states, now);
        run(&call(Mode::Force, 0, 2, 0, part), &mut states, now);
        // ⌊2^52 / 1000⌋ units at 10 a second: about 4.5 · 10^11 ms.
        let debt_ms = crate::algorithm::MAX_USAGE_WINDOW_PRODUCT / 1_000 / 10 * 1_000;
        for a in [1, 10, 11, u64::MAX] {
            part.cost = a;
            part.wanted = u64::MAX;
            let r = run(&call(Mode::Grant, 300, 3, 0, part), &mut states, now);
            assert!(!r.granted, "{kind:?} cost {a}");
            let retry = r.answers[0].retry_after_ms;
            assert!(
                (debt_ms - 2_000..=debt_ms + 2_000).contains(&retry),
                "{kind:?} cost {a}: retry after {retry}, debt {debt_ms} ms"
            );
            let r = run(
                &call(Mode::Peek, 0, 3, 0, part),
                &mut states,
                now + debt_ms / 2,
            );
            assert!(!r.granted);
        }
        part.cost = 1;
        let r = run(
            &call(Mode::Peek, 0, 4, 0, part),
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
        run(&call(Mode::Return, 0, 1, 0, part), &mut states, now + 1);
        part.cost = 1;
        run(&call(Mode::Peek, 0, 4, 0, part), &mut states, now + 2_000);
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
        assert!(lua(&mut conn, &keys, &call(Mode::Grant, 0, 1, 0, part), now).granted);
        part.cost = 39;
        let r = lua(&mut conn, &keys, &call(Mode::Force, 0, 2, 0, part), now);
        assert!(!r.granted, "{kind:?}: a debt stands");
        let pttl: i64 = redis::cmd("PTTL").arg(&state).query(&mut conn).unwrap();
        let want = windows * 1_000;
        assert!(
            (want..=want + 1_100).contains(&pttl),
            "{kind:?}: the key lives {pttl} ms, its debt {want} ms"
        );
    }
}
