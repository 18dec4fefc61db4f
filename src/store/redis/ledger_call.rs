//! A lease ledger call as the Redis stores send it: the request queued on a lane, and the
//! `EVALSHA` of `lua/lease.lua` for one call or a batch of them.

use std::sync::OnceLock;

use redis::Script;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::batch::Queued;
use super::lua_constants;
use super::script_call::ScriptCall;
use crate::error::StoreError;
use crate::store::leased::{LedgerCall, LedgerMode, LedgerReply};

/// The lease script: `lua/integers.lua`, `lua/sliding_window_counter_math.lua` (shared with
/// the decision script) and `lua/lease.lua`, the shared constants written in.
pub(crate) fn lease_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        lua_constants::inline(
            &[
                include_str!("../../../lua/integers.lua"),
                include_str!("../../../lua/sliding_window_counter_math.lua"),
                include_str!("../../../lua/lease.lua"),
            ]
            .join("\n"),
        )
    })
}

/// The lease script, hashed once.
pub(crate) fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(lease_source()))
}

/// The Lua text of the lease script, for inspection or loading ahead of time.
///
/// ```
/// assert!(tollgate::store::redis::lease_script_source().contains("redis.call('TIME')"));
/// ```
pub fn lease_script_source() -> &'static str {
    lease_source()
}

/// One ledger call waiting for, or in, a script call.
pub(crate) struct LedgerRequest {
    /// Per policy its ledger state, then (sliding window log only) its entries' units, then
    /// the key's override of the policy: the exact store's override key, so one override
    /// serves both modes (and the command line's `override set`).
    pub(crate) keys: SmallVec<[String; 6]>,
    pub(crate) call: LedgerCall,
    pub(crate) reply: Option<oneshot::Sender<Result<LedgerReply, StoreError>>>,
}

impl Queued for LedgerRequest {
    type Output = LedgerReply;

    fn reply_to(&mut self, tx: oneshot::Sender<Result<LedgerReply, StoreError>>) {
        self.reply = Some(tx);
    }

    fn abandoned(&self) -> bool {
        self.refusable() && self.reply.as_ref().is_some_and(oneshot::Sender::is_closed)
    }

    fn refusable(&self) -> bool {
        matches!(self.call.mode, LedgerMode::Grant | LedgerMode::Peek)
    }

    fn answer(self, result: Result<LedgerReply, StoreError>) {
        if let Some(tx) = self.reply {
            // The caller may have given up; its answer is then dropped.
            let _ = tx.send(result);
        }
    }
}

/// One call's part of the script's arguments: mode, (the clock, alone: an injected clock's
/// time, or `""` for the server's `TIME`), lease, block ids, then each policy's eleven
/// integers as little-endian doubles in one binary string (read by one `struct.unpack` per
/// policy, where eleven text arguments cost eleven `tonumber`s).
fn push_call(inv: &mut ScriptCall, call: &LedgerCall, alone: Option<Option<u64>>) {
    inv.arg(call.mode.code());
    match alone {
        Some(Some(now)) => {
            inv.arg(now);
        }
        Some(None) => {
            inv.arg("");
        }
        None => {}
    }
    inv.arg(call.lease_ms)
        .arg(call.block_id)
        .arg(call.previous_block);
    inv.arg(call.packed_parts());
}

/// The script call for `batch`: the single-call layout for one call, the batch layout
/// (`'B'`, the clock, the number of calls, then each call) for more. `now`: an injected
/// clock's time (tests), else the script reads `TIME`.
pub(crate) fn invocation(batch: &[LedgerRequest], now: Option<u64>) -> ScriptCall {
    let keys = batch.iter().map(|r| r.keys.len()).sum();
    let bytes = batch
        .iter()
        .map(|r| {
            r.keys.iter().map(String::len).sum::<usize>()
                + 64
                + crate::store::leased::PART_BYTES * r.call.parts.len()
        })
        .sum();
    let mut inv = ScriptCall::new(script(), keys, 3 + 5 * batch.len(), bytes);
    for request in batch {
        for key in &request.keys {
            inv.key(key.as_str());
        }
    }
    if let [one] = batch {
        push_call(&mut inv, &one.call, Some(now));
    } else {
        inv.arg(lua_constants::LEDGER_BATCH);
        match now {
            Some(now) => inv.arg(now),
            None => inv.arg(""),
        };
        inv.arg(batch.len());
        for request in batch {
            push_call(&mut inv, &request.call, None);
        }
    }
    inv
}
