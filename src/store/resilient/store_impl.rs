//! The [`Store`] and [`OverrideStore`] implementations of [`ResilientStore`]: every
//! operation within the store's timeout, through the breaker where it changes state, and
//! mirrored in the local fallback where it gives back.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::breaker::Gate;
use super::ResilientStore;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::store::op::refused_misfit;
use crate::store::{
    check_applied, Applied, ApplyFuture, BoxFuture, Costs, Op, OverrideStore, Store, StoreExt,
};
use crate::telemetry;

impl<S: Store> Store for ResilientStore<S> {
    type CheckFuture = BoxFuture<Result<Decision, StoreError>>;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        let inner = &self.inner;
        let now = inner.clock.now_millis();
        let generation = inner.primary.generation();
        let entry = inner.deny_cache.as_ref().map(|c| {
            c.sync(generation);
            let entry = c.entry_of(key, policies, costs);
            (entry, c.forgotten(entry))
        });
        if let (Some(cache), Some((entry, _))) = (&inner.deny_cache, entry) {
            if let Some((d, recheck)) = cache.get(entry, key, now, generation) {
                if let Some(job) = recheck {
                    inner.recheck(job);
                }
                // Not degraded: the store is healthy and said no a moment ago. The limiter
                // counts the decision with its own outcome, `cached_deny`.
                return Box::pin(std::future::ready(Ok(d)));
            }
        }
        let probe = match inner.breaker.gate(now) {
            Gate::Skip => {
                // Decided when first polled, not here: a local fallback's decision takes its
                // slots, and a future dropped before its first poll must hold nothing.
                let this = Arc::clone(inner);
                let key = key.clone();
                let policies: SmallVec<[Policy; 2]> = policies.iter().cloned().collect();
                let costs: SmallVec<[u64; 2]> = costs.iter().copied().collect();
                return Box::pin(async move {
                    telemetry::store_error(&StoreError::CircuitOpen);
                    Ok(this.degraded(&key, &policies, &costs, &StoreError::CircuitOpen, true))
                });
            }
            Gate::Probe => true,
            Gate::Call => false,
        };
        let call = inner.primary.check(key, policies, costs);
        let this = Arc::clone(inner);
        let key = key.clone();
        let policies: SmallVec<[Policy; 2]> = policies.iter().cloned().collect();
        let costs: SmallVec<[u64; 2]> = costs.iter().copied().collect();
        Box::pin(async move {
            let started = Instant::now();
            let mut call = Box::pin(call);
            let (result, timed_out) = match tokio::time::timeout(this.timeout, &mut call).await {
                Ok(r) => (r, false),
                Err(_) => (Err(StoreError::Timeout), true),
            };
            telemetry::store_latency(this.primary.name(), started.elapsed());
            match result {
                Ok(decision) => {
                    this.breaker.success();
                    if !decision.is_allowed() {
                        if let (Some(cache), Some((entry, forgotten))) = (&this.deny_cache, entry) {
                            let now = this.clock.now_millis();
                            cache.insert(
                                entry,
                                &key,
                                &policies,
                                &costs,
                                decision.clone(),
                                now,
                                generation,
                                forgotten,
                            );
                        }
                    }
                    this.learn(&key, &policies, &costs, &decision, None);
                    Ok(decision)
                }
                Err(error) => {
                    telemetry::store_error(&error);
                    this.breaker.failure(this.clock.now_millis(), probe);
                    let degraded = this.degraded(&key, &policies, &costs, &error, true);
                    if timed_out {
                        this.finish_late(call, key, policies, costs, degraded.is_allowed());
                    }
                    Ok(degraded)
                }
            }
        })
    }

    /// Peeks go through the breaker and within the store's timeout, and are answered by the
    /// failure modes (charging nothing) when the store cannot answer; resets go within the
    /// timeout and fail at once while the circuit is open; refunds, settlements and slot
    /// operations go through the breaker too, and to the local fallback (see
    /// [Refunds](crate::store::resilient#refunds)).
    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if let Some(refused) = refused_misfit(&op, policies.len()) {
            return refused;
        }
        let inner = &self.inner;
        let op = match op {
            Op::Check { costs } => return check_applied(self, key, policies, &costs),
            op => op,
        };
        if op.gives_back() {
            // The store may now allow what it refused: this key's cached denials go. (Not
            // for a slot given back: no refusal by an in-flight policy is cached.)
            if let (Some(cache), false) = (&inner.deny_cache, matches!(op, Op::Release { .. })) {
                cache.forget(key);
            }
            self.mirror_in_fallback(key, policies, &op);
        }
        match op {
            Op::Peek { costs } => self.peek(key, policies, costs),
            Op::Reset => self.reset(key, policies),
            // Slot 0 names no slot of the store's (the failure mode decided the request).
            Op::Release { slot: 0 } | Op::Refresh { slot: 0 } => {
                Box::pin(std::future::ready(Ok(Applied::Done)))
            }
            // Given back to the fallback above; the store gets only a debt.
            op @ Op::Fallback { .. } => match op.store_part() {
                Some(op) => self
                    .guarded(|primary| primary.apply(key, policies, op))
                    .unwrap_or_else(|| Box::pin(std::future::ready(Ok(Applied::Done)))),
                None => Box::pin(std::future::ready(Ok(Applied::Done))),
            },
            op => self
                .guarded(|primary| primary.apply(key, policies, op))
                .unwrap_or_else(|| Box::pin(std::future::ready(Ok(Applied::Done)))),
        }
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        self.inner
            .primary
            .override_store()
            .map(|_| self as &dyn OverrideStore)
    }

    fn now_millis(&self) -> u64 {
        self.inner.clock.now_millis()
    }

    fn name(&self) -> &'static str {
        self.inner.primary.name()
    }

    /// The wrapped store's: what it lost, this store's cached denials and fallback learned
    /// from too.
    fn generation(&self) -> u64 {
        self.inner.primary.generation()
    }

    fn applies_failure_modes(&self) -> bool {
        true
    }

    fn failure_mode(&self) -> Option<crate::store::FailureMode> {
        Some(self.inner.mode)
    }
}

impl<S: Store> ResilientStore<S> {
    /// The same operation for the local fallback, which was charged for every admitted
    /// request, by the store or by itself: each fallback policy's costs clamped to its
    /// capacity, as its checks were, but for what a settlement charges above its reservation,
    /// which is charged in full. The memory store applies it at call time; its future only
    /// reports success.
    fn mirror_in_fallback(&self, key: &Key, policies: &[Policy], op: &Op) {
        let inner = &self.inner;
        let mirrored = match op {
            Op::Reset => {
                let fallback: Vec<Policy> = {
                    let map = inner.fallback_policies.read();
                    map.values()
                        .filter(|fp| {
                            policies
                                .iter()
                                .any(|p| fp.name() == format!("{}-fallback", p.name()))
                        })
                        .cloned()
                        .collect()
                };
                drop(inner.fallback.apply(key, &fallback, Op::Reset));
                return;
            }
            Op::Refund { costs } => {
                let (_, fps, fcosts) = inner.fallback_parts(policies, costs);
                (fps, Op::refund(&fcosts[..]))
            }
            Op::Settle { reserved, actual } => {
                let (idx, fps, r) = inner.fallback_parts(policies, reserved);
                // What is charged above the reservation is a debt, charged in full as a
                // check's extra charge is (`charge_above_shares`): capped at the capacity, a
                // settlement far above its estimate would be forgiven within two windows.
                let a: SmallVec<[u64; 2]> = idx
                    .iter()
                    .zip(&fps)
                    .zip(&r)
                    .map(
                        |((&i, fp), &charged)| match actual[i].checked_sub(reserved[i]) {
                            Some(above) if above > 0 => charged.saturating_add(above),
                            _ => actual[i].min(fp.capacity()),
                        },
                    )
                    .collect();
                (fps, Op::settle(&r[..], &a[..]))
            }
            Op::Release { slot } => {
                let ones: SmallVec<[u64; 2]> = policies.iter().map(|_| 1).collect();
                let (_, fps, _) = inner.fallback_parts(policies, &ones);
                (fps, Op::Release { slot: *slot })
            }
            Op::Fallback { op } => return self.mirror_in_fallback(key, policies, op),
            _ => return,
        };
        let (fallback_policies, op) = mirrored;
        if !fallback_policies.is_empty() {
            drop(inner.fallback.apply(key, &fallback_policies, op));
        }
    }

    /// A look at the store's answer, within its timeout, while the circuit is closed; when
    /// the store cannot answer, the failure modes answer as they would a check, charging
    /// nothing: a look (a penalty's running block, the login guard's other limits) must not
    /// turn an outage the failure modes cover into an error. A failed look counts toward
    /// opening the circuit; a successful one closes nothing (see `Breaker::is_open`).
    fn peek(&self, key: &Key, policies: &[Policy], costs: Costs) -> ApplyFuture {
        let inner = &self.inner;
        if inner.breaker.is_open() {
            let d = inner.degraded(key, policies, &costs, &StoreError::CircuitOpen, false);
            return Box::pin(std::future::ready(Ok(Applied::Decision(d))));
        }
        let call = inner.primary.apply(
            key,
            policies,
            Op::Peek {
                costs: costs.clone(),
            },
        );
        let this = Arc::clone(inner);
        let key = key.clone();
        let policies: SmallVec<[Policy; 2]> = policies.iter().cloned().collect();
        Box::pin(async move {
            let started = Instant::now();
            let result = tokio::time::timeout(this.timeout, call)
                .await
                .unwrap_or(Err(StoreError::Timeout));
            telemetry::store_latency(this.primary.name(), started.elapsed());
            match result {
                // A look that succeeds says nothing of the checks: it closes nothing.
                Ok(applied) => Ok(applied),
                Err(error) => {
                    telemetry::store_error(&error);
                    this.breaker.failure(this.clock.now_millis(), false);
                    let d = this.degraded(&key, &policies, &costs, &error, false);
                    Ok(Applied::Decision(d))
                }
            }
        })
    }

    /// A reset, within the store's timeout; while the circuit is open it fails at once (the
    /// login guard's `record_success` ends with one) rather than waiting out the timeout.
    /// As for a look, a failure counts toward opening the circuit and a success closes
    /// nothing: a full Redis runs `UNLINK` but refuses the checks' writes, and must still
    /// open it.
    fn reset(&self, key: &Key, policies: &[Policy]) -> ApplyFuture {
        let inner = &self.inner;
        if inner.breaker.is_open() {
            telemetry::store_error(&StoreError::CircuitOpen);
            return Box::pin(std::future::ready(Err(StoreError::CircuitOpen)));
        }
        let call = inner.primary.apply(key, policies, Op::Reset);
        let this = Arc::clone(inner);
        Box::pin(async move {
            let started = Instant::now();
            let result = tokio::time::timeout(this.timeout, call)
                .await
                .unwrap_or(Err(StoreError::Timeout));
            telemetry::store_latency(this.primary.name(), started.elapsed());
            if let Err(error) = &result {
                telemetry::store_error(error);
                this.breaker.failure(this.clock.now_millis(), false);
            }
            result
        })
    }

    /// An operator's call of the store (an override), under the store's timeout.
    fn within_timeout<T: Send + 'static>(
        &self,
        call: BoxFuture<Result<T, StoreError>>,
    ) -> BoxFuture<Result<T, StoreError>> {
        let timeout = self.inner.timeout;
        Box::pin(async move {
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or(Err(StoreError::Timeout))
        })
    }

    /// A call of the store that is not a decision (a refund, settlement, release or
    /// refresh) under the same timeout and circuit breaker as decisions: skipped (`None`)
    /// while the circuit is open; its errors counted and fed to the breaker.
    fn guarded(&self, call: impl FnOnce(&S) -> ApplyFuture) -> Option<ApplyFuture> {
        let inner = &self.inner;
        let probe = match inner.breaker.gate(inner.clock.now_millis()) {
            // The store is skipped while the circuit is open, as checks are.
            Gate::Skip => {
                telemetry::store_error(&StoreError::CircuitOpen);
                return None;
            }
            Gate::Probe => true,
            Gate::Call => false,
        };
        let call = call(&inner.primary);
        let this = Arc::clone(inner);
        Some(Box::pin(async move {
            let started = Instant::now();
            let mut call = call;
            let result = match tokio::time::timeout(this.timeout, &mut call).await {
                Ok(result) => result,
                Err(_) => {
                    finish_in_background(call, (this.timeout * 10).max(Duration::from_secs(1)));
                    Err(StoreError::Timeout)
                }
            };
            // Every call whose errors are counted is counted here too: the error ratio the
            // alert rules read is errors over these.
            telemetry::store_latency(this.primary.name(), started.elapsed());
            match &result {
                Ok(_) => this.breaker.success(),
                Err(error) => {
                    telemetry::store_error(error);
                    this.breaker.failure(this.clock.now_millis(), probe);
                }
            }
            result
        }))
    }
}

/// The most calls [`finish_in_background`] has under way at once, per process.
const MAX_BACKGROUND_CALLS: usize = 1024;

/// Calls under way in [`finish_in_background`].
static BACKGROUND_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Lets a call the caller stopped waiting for (the store's timeout) run to its end: a
/// release, refund, settlement or refresh not yet sent when the timeout fired (waiting for a
/// pooled connection, or for the script to load) would otherwise never be, and a slot would
/// stay held until its lease ends. Each for at most `grace` (ten timeouts, at least a
/// second, as a check that timed out), and at most [`MAX_BACKGROUND_CALLS`] at once; past
/// that, during a long outage under load, a call is dropped as before.
fn finish_in_background(call: ApplyFuture, grace: Duration) {
    /// One call counted in [`BACKGROUND_CALLS`] until it is dropped, run or not.
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            BACKGROUND_CALLS.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if BACKGROUND_CALLS.fetch_add(1, Ordering::AcqRel) >= MAX_BACKGROUND_CALLS {
        BACKGROUND_CALLS.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    // Made before the task: a task a closing runtime drops unpolled still uncounts.
    let counted = Counted;
    runtime.spawn(async move {
        let _counted = counted;
        let _ = tokio::time::timeout(grace, call).await;
    });
}

/// Overrides are the wrapped store's, set and read within its timeout; setting or removing
/// one drops this key's cached denials.
impl<S: Store> OverrideStore for ResilientStore<S> {
    fn set(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(key);
        }
        let changed = self.within_timeout(self.inner.primary.set_override(key, policy, ttl));
        // Then the next answer for the key reads it into the local fallback at once.
        let (inner, key) = (Arc::clone(&self.inner), key.clone());
        Box::pin(async move {
            let result = changed.await;
            inner.override_changed(&key);
            // A refusal cached by a check that crossed the change goes too.
            if let Some(cache) = &inner.deny_cache {
                cache.forget(&key);
            }
            result
        })
    }

    fn remove(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(key);
        }
        let changed = self.within_timeout(self.inner.primary.remove_override(key, policy));
        // Then the next answer for the key reads it into the local fallback at once.
        let (inner, key) = (Arc::clone(&self.inner), key.clone());
        Box::pin(async move {
            let result = changed.await;
            inner.override_changed(&key);
            // A refusal cached by a check that crossed the change goes too.
            if let Some(cache) = &inner.deny_cache {
                cache.forget(&key);
            }
            result
        })
    }

    fn list(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<crate::overrides::ActiveOverride>, StoreError>> {
        self.within_timeout(self.inner.primary.overrides(key, policies))
    }
}
