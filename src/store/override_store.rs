//! Per-key [overrides](crate::overrides) as a store keeps them: a trait of its own, reached
//! through [`Store::override_store`](super::Store::override_store), for the stores that keep
//! them (every store of this crate does; a store of your own need not).

use std::time::Duration;

use crate::error::StoreError;
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::Policy;

use super::BoxFuture;

/// Where a store keeps per-key overrides; see [`crate::overrides`].
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use tollgate::key::Key;
/// use tollgate::store::{MemoryStore, Store};
/// use tollgate::{Policy, Rate};
///
/// let store = MemoryStore::new();
/// let key = Key::new("tenant", "acme");
/// let raised = Policy::new("api", Rate::per_minute(500))?;
/// let overrides = store.override_store().expect("the memory store keeps overrides");
/// overrides.set(&key, &raised, None).await?;
/// assert_eq!(overrides.list(&key, &[raised.clone()]).await?[0].limit(), 500);
/// overrides.remove(&key, &raised).await?;
/// assert!(overrides.list(&key, &[raised]).await?.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub trait OverrideStore: Send + Sync {
    /// Decides `key`'s requests under `policy` (by name and algorithm) with `policy`'s limit
    /// and capacity from now on, until `ttl` ends (`None`: until removed).
    fn set(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<Duration>,
    ) -> BoxFuture<Result<(), StoreError>>;

    /// Removes `key`'s override of `policy`, if any: the plan's limit applies again.
    fn remove(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>>;

    /// `key`'s overrides in force among `policies`.
    fn list(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>>;
}

/// The error of a store that keeps no overrides.
pub(crate) fn no_overrides(store: &str) -> StoreError {
    StoreError::Backend(crate::error::Cause::from(format!(
        "the {store} store keeps no per-key overrides"
    )))
}
