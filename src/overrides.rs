//! Per-key overrides: another limit for one key (a customer, an API key's digest, a tenant)
//! under one named policy, with an optional expiry.
//!
//! An override changes a policy's limit (and burst), not its window or algorithm, so the
//! key's state carries on under the new numbers: a customer raised from 1 000 to 5 000 per
//! hour keeps the requests already counted (GCRA keeps a key's debt as time, its TAT: a debt
//! of 6 s, one request at 10 a minute, is 100 requests at 1 000 a minute). The store applies it inside the decision itself:
//! with Redis the override lives in Redis, next to the key's state (same hash tag), and is
//! read by the same script call that decides — still one round trip — so every instance
//! applies it from its next decision; with the memory store it is local to the process.
//! Removing an override, or its expiry, brings back the plan's limit.
//!
//! What the usage becomes under the new numbers:
//!
//! * the window algorithms count units: what the key used stays counted, and what is
//!   counted beyond a lower limit is a debt paid at that limit per window (as a settlement's
//!   debt is, see [`Op::Settle`](crate::store::Op::Settle));
//! * a token bucket refills at the new rate from the moment the override is set or removed,
//!   the time before refilled at the rate in force then (see
//!   [`token_bucket`](crate::algorithm::token_bucket)); GCRA keeps its debt as time;
//! * a cost is measured against the override's capacity, not the plan's: one that raises
//!   the capacity lets larger costs through (a tenant raised to 100 000 tokens may reserve
//!   more than the plan's 1 000 at once), and a cost above the override's capacity can
//!   never pass: it is refused as
//!   [`CostExceedsCapacity`](crate::CheckError::CostExceedsCapacity) (naming the override's
//!   capacity), charging nothing, as a cost above the plan's capacity is for a key without
//!   an override.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::time::Duration;
//! use tollgate::{key::Key, Limiter, Override, Policy, Rate};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("api", Rate::per_hour(1_000))?)
//!     .build()?;
//! let acme = Key::new("tenant", "acme");
//! // An enterprise contract, for the next 30 days.
//! limiter
//!     .set_override(&acme, Override::new("api", 5_000).expires_in(Duration::from_secs(30 * 86_400)))
//!     .await?;
//! assert_eq!(limiter.check(&acme, 1).await?.limit(), 5_000);
//! assert_eq!(limiter.overrides(&acme).await?[0].limit(), 5_000);
//! limiter.remove_override(&acme, "api").await?;
//! assert_eq!(limiter.check(&acme, 1).await?.limit(), 1_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::time::Duration;

/// Another limit for one key under one named policy; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub(crate) policy: String,
    pub(crate) limit: u64,
    pub(crate) burst: Option<u64>,
    pub(crate) expires_in: Option<Duration>,
}

impl Override {
    /// `limit` per the policy's window for policy `policy` (by name).
    pub fn new(policy: impl Into<String>, limit: u64) -> Self {
        Self {
            policy: policy.into(),
            limit,
            burst: None,
            expires_in: None,
        }
    }

    /// The burst capacity (token bucket and GCRA); without one the capacity is the limit.
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Ends the override after `ttl` (at least one millisecond); without one it lasts until
    /// removed.
    pub fn expires_in(mut self, ttl: Duration) -> Self {
        self.expires_in = Some(ttl);
        self
    }
}

/// An override in force, as a store reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActiveOverride {
    policy: String,
    limit: u64,
    capacity: u64,
    expires_in: Option<Duration>,
}

impl ActiveOverride {
    /// An override of `policy` to `limit` (capacity `capacity`), ending in `expires_in`.
    pub fn new(policy: String, limit: u64, capacity: u64, expires_in: Option<Duration>) -> Self {
        Self {
            policy,
            limit,
            capacity,
            expires_in,
        }
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The limit in force for the key.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The capacity in force (the burst, or the limit).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How long until it ends, if it has an expiry.
    pub fn expires_in(&self) -> Option<Duration> {
        self.expires_in
    }
}
