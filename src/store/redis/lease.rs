//! The lease ledger of both Redis stores: `lua/lease.lua`, one atomic `EVALSHA` per ledger
//! call, under the key's hash tag; calls that queue behind a busy lane leave together, as one
//! `EVALSHA` that runs each in order. See [`crate::store::leased`].

use std::sync::{Arc, OnceLock};

use redis::Script;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::batch::{queued_answer, Admission, Lanes, Queued, Runner};
use super::engine::{Connector, Core};
use super::keys::{redis_key, Holds};
use super::script_call::ScriptCall;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::leased::{Kind, LeaseBackend, LedgerCall, LedgerReply};
use crate::store::BoxFuture;

const LEASE: &str = include_str!("../../../lua/lease.lua");

/// The lease script, hashed once.
fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(LEASE))
}

/// The Lua text of the lease script, for inspection or loading ahead of time.
///
/// ```
/// assert!(tollgate::store::redis::lease_script_source().contains("redis.call('TIME')"));
/// ```
pub fn lease_script_source() -> &'static str {
    LEASE
}

/// One ledger call waiting for, or in, a script call.
pub(crate) struct LedgerRequest {
    /// Per policy its ledger state, then (sliding window log only) its entries' units, then
    /// the key's override of the policy: the exact store's override key, so one override
    /// serves both modes (and the command line's `override set`).
    keys: SmallVec<[String; 6]>,
    call: LedgerCall,
    reply: Option<oneshot::Sender<Result<LedgerReply, StoreError>>>,
}

impl Queued for LedgerRequest {
    type Output = LedgerReply;

    fn reply_to(&mut self, tx: oneshot::Sender<Result<LedgerReply, StoreError>>) {
        self.reply = Some(tx);
    }

    fn abandoned(&self) -> bool {
        self.reply.as_ref().is_some_and(oneshot::Sender::is_closed)
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
fn invocation(batch: &[LedgerRequest], now: Option<u64>) -> ScriptCall {
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
        inv.arg("B");
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

/// Runs `batch` in one script call: each call's reply, in order (the call's error for all
/// when it failed).
async fn run_batch<C: Connector>(
    core: &Core<C>,
    batch: &[LedgerRequest],
) -> Vec<Result<LedgerReply, StoreError>> {
    match core.invoke(&invocation(batch, core.injected_now())).await {
        Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
        Ok(bytes) => {
            let mut rest = bytes.as_slice();
            let mut replies: Vec<_> = batch
                .iter()
                .map(|r| LedgerReply::parse_next(&mut rest, r.call.parts.len()))
                .collect();
            if !rest.is_empty() || replies.iter().any(Result::is_err) {
                // One malformed reply puts every later one's boundary in doubt.
                let e = StoreError::Protocol(crate::error::Cause::from(format!(
                    "the lease script's reply to {} calls is malformed ({} bytes)",
                    batch.len(),
                    bytes.len()
                )));
                replies.iter_mut().for_each(|r| *r = Err(e.clone()));
            }
            replies
        }
    }
}

/// One ledger call on `core`: sent at once when its lane has room, else queued for the
/// lane's next script call, which runs every queued call in order (see `batch.rs`).
pub(crate) fn ledger<C: Connector>(
    core: &Arc<Core<C>>,
    key: &Key,
    policies: &[Policy],
    call: LedgerCall,
) -> BoxFuture<Result<LedgerReply, StoreError>> {
    let mut keys: SmallVec<[String; 6]> = SmallVec::new();
    let prefix = core.prefix();
    for (policy, part) in policies.iter().zip(&call.parts) {
        let name = policy.name();
        keys.push(redis_key(prefix, key, name, Holds::Ledger(part.kind)));
        if part.kind == Kind::Log {
            keys.push(redis_key(prefix, key, name, Holds::LedgerLogUnits));
        }
        // The exact store's override key: one override serves both modes.
        keys.push(redis_key(
            prefix,
            key,
            name,
            Holds::Override(policy.algorithm()),
        ));
    }
    let Some(first) = keys.first() else {
        return Box::pin(std::future::ready(Err(StoreError::Protocol(
            crate::error::Cause::from("a ledger call names no policy"),
        ))));
    };
    let lane = core.lane(first);
    let request = LedgerRequest {
        keys,
        call,
        reply: None,
    };
    match Lanes::admit(core, lane, request) {
        Admission::Run(place, request) => {
            let core = Arc::clone(core);
            Box::pin(async move {
                let reply = run_batch(&core, std::slice::from_ref(&request)).await.pop();
                drop(place);
                reply.unwrap_or_else(|| {
                    Err(StoreError::Protocol(crate::error::Cause::from(
                        "the lease script answered nothing",
                    )))
                })
            })
        }
        Admission::Queued(rx) => Box::pin(queued_answer(rx)),
    }
}

impl<C: Connector> Runner<C::Lane, LedgerRequest> for Core<C> {
    fn run(self: Arc<Self>, batch: Vec<LedgerRequest>) -> BoxFuture<()> {
        Box::pin(async move {
            // Calls whose callers gave up are skipped before the call is sent.
            let batch: Vec<LedgerRequest> = batch.into_iter().filter(|r| !r.abandoned()).collect();
            if batch.is_empty() {
                return;
            }
            let replies = run_batch(&self, &batch).await;
            for (request, reply) in batch.into_iter().zip(replies) {
                request.answer(reply);
            }
        })
    }

    fn lanes(&self) -> &Lanes<C::Lane, LedgerRequest> {
        self.ledger_lanes()
    }
}

impl LeaseBackend for super::RedisStore {
    fn ledger(
        &self,
        key: &Key,
        policies: &[Policy],
        call: LedgerCall,
    ) -> BoxFuture<Result<LedgerReply, StoreError>> {
        ledger(&self.core, key, policies, call)
    }
}

#[cfg(feature = "cluster")]
impl LeaseBackend for super::RedisClusterStore {
    fn ledger(
        &self,
        key: &Key,
        policies: &[Policy],
        call: LedgerCall,
    ) -> BoxFuture<Result<LedgerReply, StoreError>> {
        ledger(&self.core, key, policies, call)
    }
}
