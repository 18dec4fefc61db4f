//! The lease ledger of both Redis stores: `lua/lease.lua`, one atomic `EVALSHA` per ledger
//! call, under the key's hash tag. See [`crate::store::leased`].

use std::sync::{Arc, OnceLock};

use redis::Script;

use super::engine::{Connector, Core};
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::leased::{LeaseBackend, LedgerCall, LedgerReply};
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

/// One ledger call on `core`.
pub(crate) fn ledger<C: Connector>(
    core: &Arc<Core<C>>,
    key: &Key,
    policies: &[Policy],
    call: LedgerCall,
) -> BoxFuture<Result<LedgerReply, StoreError>> {
    let mut inv = script().prepare_invoke();
    for (policy, part) in policies.iter().zip(&call.parts) {
        let k = crate::store::leased::ledger_key(core.prefix(), key, policy.name(), part.kind);
        let u = format!("{k}:u");
        inv.key(k).key(u);
    }
    inv.arg(call.mode.code())
        .arg("")
        .arg(call.period_ms)
        .arg(call.lease_id)
        .arg(call.previous);
    for part in &call.parts {
        inv.arg(part.kind as u8)
            .arg(part.n)
            .arg(part.w)
            .arg(part.cap)
            .arg(part.a)
            .arg(part.b)
            .arg(part.c)
            .arg(part.d)
            .arg(part.e)
            .arg(part.f)
            .arg(part.g)
            .arg(part.h);
    }
    let core = core.clone();
    let count = call.parts.len();
    Box::pin(async move {
        let bytes = core.invoke(&inv).await?;
        LedgerReply::parse(&bytes, count)
    })
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
