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
        period_ms: period,
        lease_id: id,
        previous,
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
        .arg(c.period_ms)
        .arg(c.lease_id)
        .arg(c.previous)
        .arg(c.packed_parts())
        .query(conn)
        .expect("lease script");
    LedgerReply::parse(&reply, 1).expect("reply")
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
            .arg(c.period_ms)
            .arg(c.lease_id)
            .arg(c.previous)
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
            n: 7,
            w: 1_000,
            cap: if kind == Kind::Bucket { 9 } else { 7 },
            a: 0,
            b: 0,
            c: 0,
            d: 0,
            e: 0,
            f: 0,
            g: 0,
            h: 0,
            r: 0,
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
            let effective =
                |p: Part| p.with_override(in_force.and_then(|(l, c)| Override::usable(l, c, p.w)));
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
                        part.a = cost(&mut rand);
                        call(Mode::Peek, 0, id, 0, part)
                    }
                    1 if held.is_some() => {
                        let (hid, k, at, valid, rate) = held.take().unwrap_or_default();
                        (part.a, part.b, part.c, part.d) = (k, rand(k + 1), at, valid);
                        part.r = if rand(4) == 0 { 0 } else { rate };
                        call(Mode::Return, 0, hid, 0, part)
                    }
                    2 => {
                        part.a = [1, 3, 20, u64::from(u32::MAX)][rand(4) as usize];
                        call(Mode::Force, 0, id, 0, part)
                    }
                    3 if rand(4) == 0 => call(Mode::Keep, 0, 0, 0, part),
                    _ => {
                        part.a = cost(&mut rand);
                        part.b = part.a + rand(4);
                        let period = [0, 50, 300][rand(3) as usize];
                        let mut previous = 0;
                        if let Some((hid, k, at, valid, rate)) = held.take() {
                            previous = hid;
                            (part.e, part.f, part.g, part.h) = (k, rand(k + 1), at, valid);
                            part.r = rate;
                        }
                        call(Mode::Grant, period, id, previous, part)
                    }
                };
                let mut rust_call = c.clone();
                for p in rust_call.parts.iter_mut() {
                    *p = effective(*p);
                }
                let want = run(&rust_call, &mut states, now);
                if c.mode == Mode::Grant && want.granted && want.valid_ms > 0 {
                    let a = want.answers[0];
                    held = Some((id, a.granted, now, want.valid_ms, a.limit));
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
                    c.lease_id
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
    part.a = 500;
    part.b = 500;
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
    keep.a = 0;
    lua(&mut conn, &keys, &call(Mode::Keep, 0, 0, 0, keep), now);
    assert!(pttl(&mut conn) >= 50_000, "{}", pttl(&mut conn));
    // A grant under the override writes the slower rate's TTL too.
    part.a = 1;
    part.b = 1;
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
    assert_eq!((ok.valid_ms, ok.now_ms), (250, 1_700_000_000_000));
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

/// Settling far above a reservation charges no further than the exact algorithms'
/// overcharge, and no number a caller sends makes the ledger's arithmetic overflow.
#[test]
fn hostile_numbers_are_capped_never_wrapped() {
    for kind in [Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed] {
        let policy = Policy::builder("h", crate::Rate::new(10, std::time::Duration::from_secs(1)))
            .algorithm(match kind {
                Kind::Counter => Algorithm::SlidingWindowCounter,
                Kind::Log => Algorithm::SlidingWindowLog,
                Kind::Bucket => Algorithm::TokenBucket,
                Kind::Fixed => Algorithm::FixedWindow,
            })
            .build()
            .unwrap();
        let mut states: [Option<LState>; 1] = [None];
        let now = 1_700_000_000_000u64;
        let mut part = Part::new(kind, &policy);
        part.a = u64::MAX;
        run(&call(Mode::Force, 0, 1, 0, part), &mut states, now);
        run(&call(Mode::Force, 0, 2, 0, part), &mut states, now);
        // Refused, as if the whole limit had been used, and asked again within two windows.
        for a in [1, 10, 11, u64::MAX] {
            part.a = a;
            part.b = u64::MAX;
            let r = run(&call(Mode::Grant, 300, 3, 0, part), &mut states, now);
            assert!(!r.granted, "{kind:?} cost {a}");
            assert!(r.answers[0].retry_after_ms <= 2_000, "{kind:?}: {:?}", r);
            let r = run(&call(Mode::Peek, 0, 3, 0, part), &mut states, now);
            assert!(!r.granted);
        }
        // A return of more than was ever granted gives back what is there, no more.
        part.a = u64::MAX;
        part.b = u64::MAX;
        part.c = now;
        part.d = u64::MAX;
        part.r = u64::MAX;
        run(&call(Mode::Return, 0, 1, 0, part), &mut states, now + 1);
        part.a = 1;
        run(&call(Mode::Peek, 0, 4, 0, part), &mut states, now + 2_000);
    }
}
