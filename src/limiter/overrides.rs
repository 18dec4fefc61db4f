//! [`Limiter::set_override`] and friends: per-key overrides of the plan's policies; see
//! [`crate::overrides`].

use super::Limiter;
use crate::error::{CheckError, ConfigError};
use crate::key::Key;
use crate::overrides::{ActiveOverride, Override};
use crate::policy::Policy;
use crate::store::{Store, StoreExt};

/// The longest expiry an override may have, in ms.
const MAX_OVERRIDE_TTL_MS: u64 = (1 << 53) - 1;

impl<S: Store> Limiter<S> {
    /// Decides `key` under the policy the override names with the override's limit (and
    /// burst) from its next request on — on every instance when the store is shared — until
    /// it expires or is removed. The key's usage so far carries on under the new limit. See
    /// [`crate::overrides`] for an example.
    ///
    /// Another instance that keeps a deny cache ([`ResilientStore`](crate::store::ResilientStore))
    /// may answer a key it refused lately from that cache for at most its
    /// `deny_cache_recheck` plus one store call (never past its `deny_cache_max_age`) before
    /// it reads the override; this instance drops its cached refusals of the key when the
    /// override lands, and caches none from a check that crossed the change.
    ///
    /// # Errors
    ///
    /// [`CheckError::Invalid`] naming the field when the policy is not one of this
    /// limiter's, or the limit, burst or expiry is not valid (checked like a policy's: a zero
    /// limit is an error; an expiry of 1 ms to 2^53 − 1 ms); [`CheckError::Store`] when the store fails or keeps no overrides.
    pub async fn set_override(&self, key: &Key, over: Override) -> Result<(), CheckError> {
        let policy = self.named_policy(&over.policy)?;
        let overriding = policy.with_limit(over.limit, over.burst).map_err(|e| {
            // A setting the override keeps from the policy (its cost, its shaping) refuses
            // the new limit: the limit is what the caller sent, and what to change.
            if ["cost", "max_delay", "penalty"]
                .iter()
                .any(|f| e.field() == *f || e.field().starts_with(&format!("{f}.")))
            {
                CheckError::Invalid(ConfigError::new(
                    "limit",
                    over.limit,
                    format!(
                        "the policy's {} = {} does not fit it: {}",
                        e.field(),
                        e.value(),
                        e.reason()
                    ),
                ))
            } else {
                CheckError::Invalid(e)
            }
        })?;
        if let Some(ttl) = over.expires_in {
            if ttl.as_millis() == 0 {
                return Err(CheckError::Invalid(ConfigError::new(
                    "expires_in",
                    format_args!("{ttl:?}"),
                    "must be at least 1 ms (or none, for an override until removed)",
                )));
            }
            // Beyond 2^53 ms (285 000 years) an expiry is no longer a time any store keeps
            // exactly (Redis refuses one past its clock's range).
            if ttl.as_millis() > u128::from(MAX_OVERRIDE_TTL_MS) {
                return Err(CheckError::Invalid(ConfigError::new(
                    "expires_in",
                    format_args!("{ttl:?}"),
                    "must be at most 2^53 - 1 ms (or none, for an override until removed)",
                )));
            }
        }
        self.store()
            .set_override(key, &overriding, over.expires_in)
            .await?;
        tracing::info!(
            target: "tollgate::overrides",
            key = %crate::key::digest(key),
            policy = policy.name(),
            limit = overriding.limit(),
            capacity = overriding.capacity(),
            expires_in_ms = over.expires_in.map(|d| d.as_millis() as u64),
            "per-key override set"
        );
        Ok(())
    }

    /// Removes `key`'s override of `policy`: the plan's limit applies from its next request.
    ///
    /// # Errors
    ///
    /// [`CheckError::Invalid`] when the policy is not one of this limiter's;
    /// [`CheckError::Store`] when the store fails.
    pub async fn remove_override(&self, key: &Key, policy: &str) -> Result<(), CheckError> {
        let policy = self.named_policy(policy)?;
        self.store().remove_override(key, &policy).await?;
        tracing::info!(
            target: "tollgate::overrides",
            key = %crate::key::digest(key),
            policy = policy.name(),
            "per-key override removed"
        );
        Ok(())
    }

    /// `key`'s overrides in force, under any of this limiter's policies.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn overrides(&self, key: &Key) -> Result<Vec<ActiveOverride>, CheckError> {
        let policies = self.all_policies();
        Ok(self.store().overrides(key, &policies).await?)
    }

    /// The policy of this limiter (any route or tier) named `name`.
    fn named_policy(&self, name: &str) -> Result<Policy, CheckError> {
        self.all_policies()
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                CheckError::Invalid(ConfigError::new(
                    "policy",
                    format_args!("{name:?}"),
                    "no policy of this limiter has this name",
                ))
            })
    }

    /// Every enforced policy of the plan in force and of the limiters made from it with
    /// [`for_route`](Self::for_route), each name once.
    fn all_policies(&self) -> Vec<Policy> {
        let plan = self.plan();
        let attached = self.inner.common.attached_sets();
        let mut all: Vec<Policy> = vec![];
        for set in plan.sets.iter().chain(&attached) {
            for p in set.enforced.iter() {
                if !all.iter().any(|q| q.name() == p.name()) {
                    all.push(p.clone());
                }
            }
        }
        all
    }
}
