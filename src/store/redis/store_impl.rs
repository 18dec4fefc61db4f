//! The one [`Store`](crate::store::Store) implementation of both Redis stores: every call
//! goes to the engine ([`engine::Core`](super::engine)), whatever the connection.

/// Implements `Store` and `OverrideStore` for a Redis store type holding
/// `core: Arc<Core<_>>`, named `$name` in logs and metrics.
macro_rules! engine_store {
    ($store:ty, $name:expr) => {
        impl $crate::store::Store for $store {
            type CheckFuture =
                $crate::store::BoxFuture<Result<$crate::Decision, $crate::StoreError>>;

            fn check(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
                costs: &[u64],
            ) -> Self::CheckFuture {
                self.core.charge(key, policies, costs)
            }

            fn apply(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
                op: $crate::store::Op,
            ) -> $crate::store::ApplyFuture {
                self.core.apply(key, policies, op)
            }

            fn override_store(&self) -> Option<&dyn $crate::store::OverrideStore> {
                Some(self)
            }

            fn now_millis(&self) -> u64 {
                self.core.now_millis()
            }

            fn name(&self) -> &'static str {
                $name
            }

            fn applies_failure_modes(&self) -> bool {
                false
            }

            fn generation(&self) -> u64 {
                self.core.generation()
            }
        }

        impl $crate::store::OverrideStore for $store {
            fn set(
                &self,
                key: &$crate::key::Key,
                policy: &$crate::Policy,
                ttl: Option<std::time::Duration>,
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.set_override(key, policy, ttl)
            }

            fn remove(
                &self,
                key: &$crate::key::Key,
                policy: &$crate::Policy,
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.remove_override(key, policy)
            }

            fn list(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
            ) -> $crate::store::BoxFuture<
                Result<Vec<$crate::overrides::ActiveOverride>, $crate::StoreError>,
            > {
                self.core.overrides(key, policies)
            }
        }
    };
}

pub(crate) use engine_store;
