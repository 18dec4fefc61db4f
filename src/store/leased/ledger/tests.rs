//! The Lua ledger and its Rust twin give the same replies to the same calls at the same
//! times, against a `redis-server` this test starts (it fails, never skips, without one).

use super::*;

fn call(mode: Mode, period: u64, id: u64, previous: u64, part: Part) -> LedgerCall {
    LedgerCall {
        mode,
        period_ms: period,
        lease_id: id,
        previous,
        parts: smallvec::smallvec![part],
    }
}

/// The number of keys and the keys of `calls` (all one policy on `keys`): the state, and
/// the entries' units for the sliding window log only.
fn push_keys(cmd: &mut redis::Cmd, keys: (&str, &str), calls: &[LedgerCall]) {
    let log = |c: &LedgerCall| c.parts.iter().any(|p| p.kind == Kind::Log);
    let count: usize = calls.iter().map(|c| if log(c) { 2 } else { 1 }).sum();
    cmd.arg(count);
    for c in calls {
        cmd.arg(keys.0);
        if log(c) {
            cmd.arg(keys.1);
        }
    }
}

fn lua(conn: &mut redis::Connection, keys: (&str, &str), c: &LedgerCall, now: u64) -> LedgerReply {
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
    keys: (&str, &str),
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
    let server = OwnRedis::start();
    let mut conn = server.connection();
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D ^ u64::from(std::process::id());
    let mut rand = move |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    for kind in [Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed] {
        let key = format!(
            "tg-ledger-diff-{}-{}-{}:{{k}}",
            std::process::id(),
            kind as u8,
            u8::from(batched)
        );
        let ukey = format!("{key}:u");
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .arg(&ukey)
            .query(&mut conn)
            .unwrap();
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
        };
        let mut states: [Option<LState>; 1] = [None];
        let mut now = 1_700_000_000_000u64;
        let mut held: Option<(u64, u64, u64, u64)> = None; // id, granted, at, valid
        let mut id = 0u64;
        while id < 400 {
            now += rand(4) * rand(150);
            let size = if batched { 1 + rand(4) } else { 1 };
            let mut calls = Vec::new();
            let mut wants = Vec::new();
            for _ in 0..size {
                id += 1;
                let mut part = base;
                let c = match rand(4) {
                    0 => {
                        part.a = 1 + rand(2);
                        call(Mode::Peek, 0, id, 0, part)
                    }
                    1 if held.is_some() => {
                        let (hid, k, at, valid) = held.take().unwrap_or_default();
                        (part.a, part.b, part.c, part.d) = (k, rand(k + 1), at, valid);
                        call(Mode::Return, 0, hid, 0, part)
                    }
                    _ => {
                        part.a = 1 + rand(2);
                        part.b = part.a + rand(4);
                        let period = [0, 50, 300][rand(3) as usize];
                        let mut previous = 0;
                        if let Some((hid, k, at, valid)) = held.take() {
                            previous = hid;
                            (part.e, part.f, part.g, part.h) = (k, rand(k + 1), at, valid);
                        }
                        call(Mode::Grant, period, id, previous, part)
                    }
                };
                let want = run(&c, &mut states, now);
                if c.mode == Mode::Grant && want.granted && want.valid_ms > 0 {
                    held = Some((id, want.answers[0].granted, now, want.valid_ms));
                }
                calls.push(c);
                wants.push(want);
            }
            let gots = if batched {
                lua_batch(&mut conn, (&key, &ukey), &calls, now)
            } else {
                vec![lua(&mut conn, (&key, &ukey), &calls[0], now)]
            };
            for ((got, want), c) in gots.iter().zip(&wants).zip(&calls) {
                assert_eq!(got, want, "{kind:?} call {} at {now}: {c:?}", c.lease_id);
            }
        }
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .arg(&ukey)
            .query(&mut conn)
            .unwrap();
    }
}

#[cfg(feature = "redis")]
#[test]
fn ledger_replies_of_the_wrong_shape_are_protocol_errors() {
    fn reply(numbers: &[f64]) -> Vec<u8> {
        numbers.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    let now = 1_700_000_000_000.0;
    let ok = LedgerReply::parse(&reply(&[1.0, 250.0, now, 1.0, 5.0, 40.0, 800.0, 0.0]), 1).unwrap();
    assert!(ok.granted);
    assert_eq!((ok.valid_ms, ok.now_ms), (250, 1_700_000_000_000));
    assert_eq!(ok.answers[0].remaining, 40);
    assert!(LedgerReply::parse(&reply(&[1.0, 0.0, now, 0.0]), 2)
        .unwrap()
        .answers
        .is_empty());
    let mut two = reply(&[1.0, 0.0, now, 0.0]);
    two.extend(reply(&[0.0, 0.0, now, 1.0, 0.0, 0.0, 10.0, 10.0]));
    let mut rest = two.as_slice();
    assert!(LedgerReply::parse_next(&mut rest, 1).unwrap().granted);
    assert!(!LedgerReply::parse_next(&mut rest, 1).unwrap().granted);
    assert!(rest.is_empty());
    for bad in [
        Vec::new(),
        reply(&[1.0, 0.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, 40.0, 800.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, 40.0, 800.0, 0.0, 1.0]),
        reply(&[1.0, 0.0, now, 2.0, 5.0, 40.0, 800.0, 0.0]),
        reply(&[2.0, 0.0, now, 0.0]),
        reply(&[1.0, 0.0, now, 1.0, 5.0, -1.0, 800.0, 0.0]),
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

/// A `redis-server` of this test's own on a free loopback port, killed on drop.
struct OwnRedis {
    child: std::process::Child,
    port: u16,
}

impl OwnRedis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("no free loopback port")
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): the ledger tests need it on PATH \
                     (`apt-get install redis-server`)"
                )
            });
        Self { child, port }
    }

    fn connection(&self) -> redis::Connection {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).unwrap();
        let start = std::time::Instant::now();
        loop {
            match client.get_connection() {
                Ok(conn) => return conn,
                Err(e) if start.elapsed() > std::time::Duration::from_secs(10) => {
                    panic!("redis-server on port {} never answered: {e}", self.port)
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
