//! The one [`Store`](crate::store::Store) implementation of both Redis stores: every call
//! goes to the engine ([`engine::Core`](super::engine)), whatever the connection.

/// Implements `Store` for a Redis store type holding `core: Arc<Core<_>>`, named `$name` in
/// logs and metrics.
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

            fn peek(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
                costs: &[u64],
            ) -> $crate::store::BoxFuture<Result<$crate::Decision, $crate::StoreError>> {
                self.core.decide(
                    key,
                    policies,
                    costs,
                    $crate::store::redis::engine::Mode::Peek,
                )
            }

            fn refund(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
                costs: &[u64],
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.refund(key, policies, costs)
            }

            fn settle(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
                reserved: &[u64],
                actual: &[u64],
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.settle(key, policies, reserved, actual)
            }

            fn release(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
                slot: u64,
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.slot(
                    key,
                    policies,
                    slot,
                    $crate::store::redis::engine::Mode::Refund,
                )
            }

            fn refresh(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
                slot: u64,
            ) -> Option<$crate::store::BoxFuture<Result<(), $crate::StoreError>>> {
                Some(self.core.slot(
                    key,
                    policies,
                    slot,
                    $crate::store::redis::engine::Mode::Refresh,
                ))
            }

            fn reset(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.reset(key, policies)
            }

            fn set_override(
                &self,
                key: &$crate::key::Key,
                policy: &$crate::Policy,
                ttl: Option<std::time::Duration>,
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.set_override(key, policy, ttl)
            }

            fn remove_override(
                &self,
                key: &$crate::key::Key,
                policy: &$crate::Policy,
            ) -> $crate::store::BoxFuture<Result<(), $crate::StoreError>> {
                self.core.remove_override(key, policy)
            }

            fn overrides(
                &self,
                key: &$crate::key::Key,
                policies: &[$crate::Policy],
            ) -> $crate::store::BoxFuture<
                Result<Vec<$crate::overrides::ActiveOverride>, $crate::StoreError>,
            > {
                self.core.overrides(key, policies)
            }

            fn now_millis(&self) -> u64 {
                self.core.now_millis()
            }

            fn name(&self) -> &'static str {
                $name
            }

            fn generation(&self) -> u64 {
                self.core.generation()
            }
        }
    };
}

pub(crate) use engine_store;
