//! The Lua ledger and its Rust twin give the same replies to the same calls at the same
//! times, overrides set, changed and removed between calls included, against a
//! `redis-server` the test starts on a free port (it fails when there is none: it never
//! skips). This file holds the server and the calls; the tests are in `tests/`.

use super::run::run;
use super::state::LState;
use super::*;
use crate::policy::Algorithm;

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

fn call(mode: LedgerMode, period: u64, id: u64, previous: u64, part: Part) -> LedgerCall {
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
    cmd.arg(crate::store::redis::lease_script_source());
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
    cmd.arg(crate::store::redis::lease_script_source());
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

mod debts;
mod differential;
