//! Per-key overrides on both Redis stores ([`OverrideStore`](crate::store::OverrideStore)):
//! each state's override key holds the overriding limit and capacity, which the decision
//! and lease scripts read next to the state.

use std::sync::Arc;
use std::time::Duration;

use super::connector::{store_error, Connector};
use super::engine::Core;
use super::keys::{redis_key, KeyFor};
use super::wire;
use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::Policy;
use crate::store::BoxFuture;

impl<C: Connector> Core<C> {
    /// See [`OverrideStore::set`](crate::store::OverrideStore::set): one script
    /// (`lua/set_override.lua`) that sets the state's override key, with `PX` when it
    /// expires, and takes the override mark off the key's state (the common call reads no
    /// override for a marked state; see `lua/prelude.lua`); for a token bucket it also brings
    /// the bucket up to date under the rate in force until now and keeps its state key as long
    /// as the override's refill rate needs, and for a fixed window or a sliding window counter
    /// it keeps the state key as long as a count past a lower limit takes to be paid.
    pub(crate) fn set_override(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
        ttl: Option<Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let ttl = ttl.map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1));
        self.override_script(key, policy, Some(ttl))
    }

    /// The key of `key`'s override of `policy`.
    fn override_key(&self, key: &Key, policy: &Policy) -> String {
        redis_key(
            &self.prefix,
            key,
            policy.name(),
            KeyFor::Override(policy.algorithm()),
        )
    }

    /// Sets (`Some` TTL or none) or removes (`None`) an override in one script
    /// (`lua/set_override.lua`); for a token bucket, the time before the change refills at
    /// the rate in force then, as the memory store does.
    fn override_script(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
        set: Option<Option<u64>>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let core = Arc::clone(self);
        let mut call = super::script::set_override_script().prepare_invoke();
        call.key(redis_key(
            &self.prefix,
            key,
            policy.name(),
            KeyFor::State(policy.algorithm()),
        ))
        .key(self.override_key(key, policy));
        match set {
            Some(ttl) => call
                .arg(wire::override_value(policy))
                .arg(ttl.map_or_else(String::new, |t| t.to_string())),
            None => call.arg("").arg(""),
        };
        if policy.algorithm() == crate::policy::Algorithm::TokenBucket {
            call.arg(policy.plan_limits().limit());
        } else {
            call.arg(""); // not a bucket: only the override and the mark
        }
        call.arg(if self.clock.is_injected() {
            self.clock.now_millis().to_string()
        } else {
            String::new() // the script reads TIME
        });
        // For the windows whose debt a lower override stretches: the key's TTL follows.
        call.arg(crate::algorithm::registration(policy.algorithm()).script_id)
            .arg(policy.plan_limits().limit())
            .arg(policy.window_millis());
        Box::pin(async move {
            let mut conn = core.connector.connection().await?;
            let _: i64 = call.invoke_async(&mut conn).await.map_err(store_error)?;
            Ok(())
        })
    }

    /// See [`OverrideStore::remove`](crate::store::OverrideStore::remove): one `UNLINK` (the
    /// state stays unmarked until its next write reads that no override is left); for a
    /// token bucket, the script of [`set_override`](Self::set_override).
    pub(crate) fn remove_override(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
    ) -> BoxFuture<Result<(), StoreError>> {
        if policy.algorithm() == crate::policy::Algorithm::TokenBucket {
            return self.override_script(key, policy, None);
        }
        let mut cmd = redis::cmd("UNLINK");
        cmd.arg(self.override_key(key, policy));
        let core = Arc::clone(self);
        Box::pin(async move {
            let mut conn = core.connector.connection().await?;
            let _: i64 = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(())
        })
    }

    /// See [`OverrideStore::list`](crate::store::OverrideStore::list): a `GET` and a `PTTL` per
    /// policy, in one pipeline.
    pub(crate) fn overrides(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        let mut pipe = redis::pipe();
        for p in policies {
            let k = self.override_key(key, p);
            pipe.cmd("GET").arg(&k).cmd("PTTL").arg(&k);
        }
        let names: Vec<String> = policies.iter().map(|p| p.name().to_owned()).collect();
        let core = Arc::clone(self);
        Box::pin(async move {
            if names.is_empty() {
                return Ok(vec![]);
            }
            let mut conn = core.connector.connection().await?;
            let replies: Vec<(Option<Vec<u8>>, i64)> =
                pipe.query_async(&mut conn).await.map_err(store_error)?;
            Ok(names
                .into_iter()
                .zip(replies)
                .filter_map(|(name, (value, pttl))| {
                    let (limit, capacity) = wire::read_override(&value?)?;
                    let expires = (pttl > 0).then(|| Duration::from_millis(pttl as u64));
                    Some(ActiveOverride::new(name, limit, capacity, expires))
                })
                .collect())
        })
    }
}
