//! A region's deposits in its Redis: `lua/region.lua`, one atomic `EVALSHA` per call, for
//! [`RegionalLedger`](crate::store::regions::RegionalLedger) (feature `regions`). The logic
//! is in `store::regions`; this file carries its calls to Redis and back, and the modes and
//! sizes the script shares with Rust (written into it, see `lua_constants.rs`).

#[cfg(feature = "regions")]
use std::sync::OnceLock;

#[cfg(feature = "regions")]
use redis::Script;

#[cfg(feature = "regions")]
use super::keys::{redis_key, KeyFor};
#[cfg(feature = "regions")]
use super::script_call::ScriptCall;
#[cfg(feature = "regions")]
use super::single::RedisStore;
#[cfg(feature = "regions")]
use crate::error::{Cause, StoreError};
#[cfg(feature = "regions")]
use crate::key::Key;
#[cfg(feature = "regions")]
use crate::policy::Policy;
#[cfg(feature = "regions")]
use crate::store::leased::Kind;

/// A call of the region script: what it does to the deposits it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionMode {
    /// Take a block, or a request's cost, from every deposit (all or nothing).
    Take,
    /// Put new deposits in place of the old ones, answering the old.
    Install,
    /// Give a block's unused units back to the deposit it came from.
    GiveBack,
    /// Record that the home refused, until a time.
    Deny,
    /// Remove every deposit, answering them.
    Drain,
    /// Remove the deposits that are still a given block and have ended, answering them.
    End,
}

impl RegionMode {
    pub(crate) const ALL: [RegionMode; 6] = [
        RegionMode::Take,
        RegionMode::Install,
        RegionMode::GiveBack,
        RegionMode::Deny,
        RegionMode::Drain,
        RegionMode::End,
    ];

    /// The mode's letter, the script's first argument.
    pub(crate) fn code(self) -> &'static str {
        match self {
            RegionMode::Take => "T",
            RegionMode::Install => "I",
            RegionMode::GiveBack => "G",
            RegionMode::Deny => "D",
            RegionMode::Drain => "X",
            RegionMode::End => "E",
        }
    }

    /// The mode's name in the script.
    pub(crate) fn lua_name(self) -> &'static str {
        match self {
            RegionMode::Take => "REGION_TAKE",
            RegionMode::Install => "REGION_INSTALL",
            RegionMode::GiveBack => "REGION_GIVE_BACK",
            RegionMode::Deny => "REGION_DENY",
            RegionMode::Drain => "REGION_DRAIN",
            RegionMode::End => "REGION_END",
        }
    }
}

/// The bytes of one deposit as the script keeps and answers it: sixteen doubles.
pub(crate) const DEPOSIT_BYTES: usize = 16 * 8;

/// The bytes of one policy's ask in a take: cost, wanted, units given back, when they were
/// taken, and whether the deposit is renewed on time.
pub(crate) const REGION_ASK_BYTES: usize = 5 * 8;

/// The region script with the shared constants written in.
#[cfg(feature = "regions")]
fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| super::lua_constants::inline(include_str!("../../../lua/region.lua")))
}

/// The region script, hashed once.
#[cfg(feature = "regions")]
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
#[cfg(feature = "regions")]
pub fn region_script_source() -> &'static str {
    source()
}

#[cfg(feature = "regions")]
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
