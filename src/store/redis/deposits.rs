//! A region's deposits in its Redis: `lua/region.lua`, one atomic `EVALSHA` per call, for
//! [`RegionalLedger`](crate::store::regions::RegionalLedger) (feature `regions`). The logic
//! is in `store::regions`; this file carries its calls to Redis and back (the modes and sizes
//! the script shares with Rust are in `wire.rs`).

use std::sync::OnceLock;

use redis::Script;

use super::keys::{redis_key, KeyFor};
use super::script_call::ScriptCall;
use super::single::RedisStore;
use super::wire::RegionMode;
use crate::error::{Cause, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::store::leased::Kind;

/// The region script with the shared constants written in.
fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| super::lua_constants::inline(include_str!("../../../lua/region.lua")))
}

/// The region script, hashed once.
fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(source()))
}

/// The Lua text of the region script (`lua/region.lua`, the shared constants written in),
/// for inspection or loading ahead of time.
///
/// ```
/// assert!(tollgate::store::redis::region_script_source().contains("deposit"));
/// ```
pub fn region_script_source() -> &'static str {
    source()
}

impl RedisStore {
    /// The deposit keys of `key`'s `policies`, one per policy, leased as `kinds`.
    pub(crate) fn deposit_keys(
        &self,
        key: &Key,
        policies: &[Policy],
        kinds: &[Kind],
    ) -> Vec<String> {
        policies
            .iter()
            .zip(kinds)
            .map(|(p, &k)| redis_key(self.core.prefix(), key, p.name(), KeyFor::Deposit(k)))
            .collect()
    }

    /// One call of the region script: `mode` on `keys`, then `args` (binary strings). The
    /// reply is the script's binary string.
    pub(crate) async fn deposits(
        &self,
        mode: RegionMode,
        keys: &[String],
        args: &[&[u8]],
    ) -> Result<Vec<u8>, StoreError> {
        if keys.is_empty() {
            return Err(StoreError::Protocol(Cause::from(
                "a region call names no policy",
            )));
        }
        let bytes = args.iter().map(|a| a.len()).sum::<usize>();
        let mut call = ScriptCall::new(script(), keys.len(), args.len() + 2, bytes);
        for k in keys {
            call.key(k.as_str());
        }
        call.arg(mode.code());
        match self.core.injected_now() {
            Some(now) => call.arg(now),
            None => call.arg(""),
        };
        for a in args {
            call.arg(*a);
        }
        self.core.invoke(&call).await
    }
}
