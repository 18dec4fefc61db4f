//! [`Limiter`]: policies + key extractor + store, usable with or without HTTP.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::decision::Decision;
use crate::error::{CheckError, ConfigError};
use crate::key::{Key, KeyExtractor, PeerIp, RequestView};
use crate::policy::Policy;
use crate::store::{MemoryStore, Store};

/// What to do with a request from which no key can be extracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingKey {
    /// Answer `400 Bad Request` (the default). With [`PeerIp`] this happens only when the
    /// server does not record peer addresses — a setup mistake that should be loud.
    #[default]
    Reject,
    /// Put every such request in one shared bucket, the key `anonymous:`.
    Shared,
}

/// Decides requests: a set of policies, a key extractor and a store.
///
/// Cheap to clone (clones share everything). Use it directly — background jobs, websocket
/// messages, the login helper — or wrap it in a [`RateLimitLayer`](crate::RateLimitLayer).
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::{Limiter, Policy, Rate, key::Key};
///
/// let limiter = Limiter::builder()
///     .policy(Policy::new("jobs", Rate::per_minute(2))?)
///     .build()?;
/// let tenant = Key::new("tenant", "acme");
/// assert!(limiter.check(&tenant, 1).await?.is_allowed());
/// assert!(limiter.check(&tenant, 1).await?.is_allowed());
/// let denied = limiter.check(&tenant, 1).await?;
/// assert!(!denied.is_allowed());
/// assert!(denied.retry_after().is_some());
///
/// // peek answers without charging; reset forgets the key.
/// assert!(!limiter.peek(&tenant).await?.is_allowed());
/// limiter.reset(&tenant).await?;
/// assert!(limiter.check(&tenant, 1).await?.is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Limiter<S = MemoryStore> {
    inner: Arc<LimiterInner<S>>,
}

struct LimiterInner<S> {
    store: S,
    policies: Box<[Policy]>,
    default_costs: SmallVec<[u64; 2]>,
    extractor: Box<dyn KeyExtractor>,
    missing_key: MissingKey,
}

impl<S> Clone for Limiter<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.inner.store)
            .field("policies", &self.inner.policies)
            .field("extractor", &self.inner.extractor)
            .field("missing_key", &self.inner.missing_key)
            .finish()
    }
}

impl Limiter<MemoryStore> {
    /// A builder using a fresh [`MemoryStore`] and the [`PeerIp`] extractor until told
    /// otherwise.
    pub fn builder() -> LimiterBuilder<MemoryStore> {
        LimiterBuilder {
            store: None,
            make_store: Some(MemoryStore::new),
            policies: Vec::new(),
            extractor: None,
            missing_key: MissingKey::default(),
        }
    }
}

impl<S: Store> Limiter<S> {
    /// The policies every request is checked against, in order.
    pub fn policies(&self) -> &[Policy] {
        &self.inner.policies
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The key for a request: the extractor's, or the shared anonymous key, or `None` when
    /// the request must be rejected for want of a key.
    pub fn key_for(&self, request: &RequestView<'_>) -> Option<Key> {
        match self.inner.extractor.extract(request) {
            Some(key) => Some(key),
            None => match self.inner.missing_key {
                MissingKey::Reject => None,
                MissingKey::Shared => Some(Key::new("anonymous", "")),
            },
        }
    }

    pub(crate) fn default_costs(&self) -> &[u64] {
        &self.inner.default_costs
    }

    /// Checks `key`, charging `cost` units to every policy — all of them or none.
    ///
    /// # Errors
    ///
    /// [`CheckError::CostExceedsCapacity`] when `cost` exceeds a policy's capacity (such a
    /// request could never pass, and charging it must not lock the key out), and
    /// [`CheckError::Store`] when the store fails.
    pub async fn check(&self, key: &Key, cost: u64) -> Result<Decision, CheckError> {
        let costs: SmallVec<[u64; 2]> = self.inner.policies.iter().map(|_| cost).collect();
        self.validate_costs(&costs)?;
        Ok(self.inner.store.check(key, &self.inner.policies, &costs).await?)
    }

    /// What [`check`](Self::check) with each policy's own cost would answer now, charging
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn peek(&self, key: &Key) -> Result<Decision, CheckError> {
        Ok(self
            .inner
            .store
            .peek(key, &self.inner.policies, &self.inner.default_costs)
            .await?)
    }

    /// Forgets `key`'s state for this limiter's policies.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn reset(&self, key: &Key) -> Result<(), CheckError> {
        Ok(self.inner.store.reset(key, &self.inner.policies).await?)
    }

    pub(crate) fn validate_costs(&self, costs: &[u64]) -> Result<(), CheckError> {
        for (p, &c) in self.inner.policies.iter().zip(costs) {
            if c > p.capacity() {
                return Err(CheckError::CostExceedsCapacity {
                    policy: p.name().to_owned(),
                    cost: c,
                    capacity: p.capacity(),
                });
            }
        }
        Ok(())
    }
}

/// Builds a [`Limiter`]; see [`Limiter::builder`].
#[must_use]
pub struct LimiterBuilder<S> {
    store: Option<S>,
    make_store: Option<fn() -> S>,
    policies: Vec<Policy>,
    extractor: Option<Box<dyn KeyExtractor>>,
    missing_key: MissingKey,
}

impl<S: fmt::Debug> fmt::Debug for LimiterBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("store", &self.store)
            .field("policies", &self.policies)
            .field("extractor", &self.extractor)
            .field("missing_key", &self.missing_key)
            .finish()
    }
}

impl<S> LimiterBuilder<S> {
    /// The store (default: a new [`MemoryStore`]).
    pub fn store<S2: Store>(self, store: S2) -> LimiterBuilder<S2> {
        LimiterBuilder {
            store: Some(store),
            make_store: None,
            policies: self.policies,
            extractor: self.extractor,
            missing_key: self.missing_key,
        }
    }

    /// Adds a policy. A request passes only if every policy allows it, and a denied request
    /// is charged to none of them.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds several policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// How requests are keyed (default: [`PeerIp`]).
    pub fn extractor(mut self, extractor: impl KeyExtractor) -> Self {
        self.extractor = Some(Box::new(extractor));
        self
    }

    /// What to do when the extractor yields no key (default: [`MissingKey::Reject`]).
    pub fn missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }
}

impl<S: Store> LimiterBuilder<S> {
    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `policies` when there are none, or when two policies share a name.
    pub fn build(self) -> Result<Limiter<S>, ConfigError> {
        if self.policies.is_empty() {
            return Err(ConfigError::new(
                "policies",
                "[]",
                "a limiter needs at least one policy",
            ));
        }
        for (i, p) in self.policies.iter().enumerate() {
            if self.policies[..i].iter().any(|q| q.name() == p.name()) {
                return Err(ConfigError::new(
                    format!("policies[{i}].name"),
                    format_args!("{:?}", p.name()),
                    "two policies of one limiter share a name; their state would collide",
                ));
            }
        }
        let default_costs = self.policies.iter().map(Policy::cost).collect();
        let store = match (self.store, self.make_store) {
            (Some(store), _) => store,
            (None, Some(make)) => make(),
            (None, None) => {
                return Err(ConfigError::new("store", "none", "a limiter needs a store"));
            }
        };
        Ok(Limiter {
            inner: Arc::new(LimiterInner {
                store,
                policies: self.policies.into_boxed_slice(),
                default_costs,
                extractor: self.extractor.unwrap_or_else(|| Box::new(PeerIp::new())),
                missing_key: self.missing_key,
            }),
        })
    }
}
