//! The lease ledger of both Redis stores: `lua/lease.lua`, one atomic `EVALSHA` per ledger
//! call, under the key's hash tag; calls that queue behind a busy lane leave together, as one
//! `EVALSHA` that runs each in order. See [`crate::store::leased`].

use std::sync::Arc;

use smallvec::SmallVec;

use super::batch::{queued_answer, Admission, Lanes, Queued, Runner};
#[cfg(feature = "cluster")]
use super::cluster::RedisClusterStore;
use super::connector::Connector;
use super::engine::Core;
use super::keys::{redis_key, KeyFor};
use super::ledger_call::{invocation, LedgerRequest};
use super::single::RedisStore;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::leased::{Kind, LeaseBackend, LedgerCall, LedgerFuture, LedgerReply};
use crate::store::BoxFuture;

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
) -> LedgerFuture {
    let mut keys: SmallVec<[String; 6]> = SmallVec::new();
    let prefix = core.prefix();
    for (policy, part) in policies.iter().zip(&call.parts) {
        let name = policy.name();
        keys.push(redis_key(prefix, key, name, KeyFor::Ledger(part.kind)));
        if part.kind == Kind::Log {
            keys.push(redis_key(prefix, key, name, KeyFor::LedgerLogUnits));
        }
        // The exact store's override key: one override serves both modes.
        keys.push(redis_key(
            prefix,
            key,
            name,
            KeyFor::Override(policy.algorithm()),
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
        Admission::Run(permit, request) => {
            let core = Arc::clone(core);
            Box::pin(async move {
                let reply = run_batch(&core, std::slice::from_ref(&request)).await.pop();
                drop(permit);
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

/// Implements `LeaseBackend` for a Redis store type holding `core: Arc<Core<_>>`.
macro_rules! lease_backend {
    ($store:ty) => {
        impl LeaseBackend for $store {
            fn ledger(&self, key: &Key, policies: &[Policy], call: LedgerCall) -> LedgerFuture {
                ledger(&self.core, key, policies, call)
            }
        }
    };
}

lease_backend!(RedisStore);
#[cfg(feature = "cluster")]
lease_backend!(RedisClusterStore);
#[cfg(feature = "sentinel")]
lease_backend!(super::sentinel::RedisSentinelStore);
