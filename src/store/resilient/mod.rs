//! Failure handling for a shared store: timeouts, a circuit breaker, a local deny cache and a
//! chosen failure mode.
//!
//! A rate limiter must never become the outage. [`ResilientStore`] wraps a store (Redis) so
//! that every check answers quickly even when the store is down, stalled or restarting:
//!
//! * **Timeout**: each store call gets at most [`timeout`](ResilientStoreBuilder::timeout)
//!   (default 50 ms); a stalled Redis cannot stall requests.
//! * **Circuit breaker**: after [`N`](ResilientStoreBuilder::circuit_breaker) consecutive
//!   failures (default 5) the store is not called for a cool-down (default 1 s); then one probe
//!   goes through (half-open) and, if it succeeds, calls resume. Each transition is logged
//!   (target `tollgate::breaker`) and counted.
//! * **Failure mode** — no silent default: [`ResilientStore::builder`] takes one, and a policy
//!   may override it with [`PolicyBuilder::failure_mode`](crate::PolicyBuilder::failure_mode):
//!
//! | mode | what clients see | what operators see | pick it when |
//! |---|---|---|---|
//! | [`FailOpen`](FailureMode::FailOpen) | requests pass, no quota headers | a warning (at most one a second) and the `fail_open` counter | availability matters more than the limit |
//! | [`FailClosed`](FailureMode::FailClosed) | `503` with `Retry-After` | the same, `fail_closed` | the limit protects something that must not be overrun (costly or abusable endpoints) |
//! | [`LocalFallback`](FailureMode::LocalFallback) | limiting continues per instance at `limit / replicas` | the same, `fallback` | you want both: degraded but real protection |
//!
//!   A look ([`Op::Peek`](crate::store::Op::Peek): a penalty's running block, the login
//!   guard's limits after a refusal) is answered the same way, charging nothing, so a plan
//!   with penalties or a login guard keeps its failure mode too.
//!
//! * **Deny cache**: when the store denies a key until `T`, the denial is remembered locally
//!   (bounded, [`deny_cache`](ResilientStoreBuilder::deny_cache)) for exactly that key, policy
//!   set and cost, until `T` or for at most
//!   [`deny_cache_max_age`](ResilientStoreBuilder::deny_cache_max_age) (default 1 s),
//!   whichever comes first, and further requests are refused without a round trip (with the
//!   store's own `retry_after`, counted down). `T` is the earliest moment the store, keeping its
//!   state, would allow that request; only a loss of that state can make it allow sooner:
//!   a [`reset`](crate::Limiter::reset) (which clears the local cache too), or Redis losing
//!   its data (a restart without persistence, a failover, `FLUSHALL`/`FLUSHDB`, eviction under
//!   `maxmemory`). Two rules keep a cached denial from outliving that state:
//!
//!   1. **Generation.** Each denial remembers the store's [`generation`](Store::generation)
//!      it was learned under and is never answered once the store's generation differs (a
//!      Redis store reads the server's `run_id` on the first call after a connection failure
//!      or a `NOSCRIPT`, and once a second while calls go through; a new one means a restart
//!      or failover).
//!   2. **Recheck.** A `FLUSHALL` or `FLUSHDB` keeps the `run_id`, and a restart can go
//!      unnoticed (a pool that replaced its connections without failing a call, or no call
//!      at all while the cache answers every request of the key), so while a denial is
//!      answered the store is asked, off the request path, whether it still stands: a peek
//!      (charging nothing) at most every
//!      [`deny_cache_recheck`](ResilientStoreBuilder::deny_cache_recheck) (default 250 ms)
//!      per cached denial, one at a time; the denial goes when the store would allow the
//!      request or its generation moved.
//!
//!   A refusal by an [in-flight](crate::algorithm::in_flight) policy is never cached: a slot
//!   another instance gives back frees it at once, so it has no such `T`. Units another
//!   instance gives back (a refund, a settlement below its reservation) can make the store
//!   allow sooner too; the cache learns that at the next recheck.
//!
//!   **Bound**: while the store keeps its state and no other instance gives units back, the
//!   cache never refuses a request the store would allow; a give-back by another instance is
//!   seen within `deny_cache_recheck` plus one store call. After the store loses a key's state by any means, the cache refuses that
//!   key for at most `deny_cache_recheck` plus one store call (at most the
//!   [`timeout`](ResilientStoreBuilder::timeout); a call that fails is asked again at the
//!   next request), and never longer than `deny_cache_max_age`; a restart this instance has
//!   noticed ends every cached denial at once. (A [`LeasedStore`](crate::store::leased) under
//!   it keeps a refusal of its own for at most one lease time more.) While the circuit is
//!   open nothing is asked, as for decisions.
//!
//! # Local fallback: what it admits
//!
//! The fallback limiter on each instance allows each policy's limit divided by `replicas`.
//! So that a failover never hands out a fresh quota, it is kept up to date while the store
//! answers: every request the store admits is charged to it too, and every refusal from the
//! store fills it for that policy, so during an outage an instance admits only what is left
//! of its share of the window, given what it admitted before.
//!
//! In-flight slots are followed exactly: a request the store admits takes a slot of the
//! fallback's whether or not its share has room (the request runs), and its release gives it
//! back, so an outage starts from the requests running. Rate units are followed as far as
//! the share goes: a charge the store admitted is recorded only while the share has room,
//! but every refund and settlement below its reservation is given back, so after this
//! instance admitted more than its share in a window, its fallback can count less than what
//! still stands there (never below nothing): during an outage it may then admit up to one
//! more share in that window, the bound of a fresh failover.
//!
//! Per-key [overrides](crate::Limiter::set_override) are followed too, at their share: the
//! store's answers carry the limit in force for the key, and when it differs from the
//! fallback's, the store's overrides of that key are read off the request path and copied
//! (see `overrides.rs`). So a tenant lowered from 1 000 an hour to 5 stays at 5 (divided
//! among the replicas) through an outage, and one raised keeps its raise. **Bound**: an
//! override set or removed anywhere is followed from the first request of its key that the
//! store answers after it, plus one store call (at most once a second per key while the
//! store answers the same limits), but for one set elsewhere that changes only a token
//! bucket's or GCRA policy's rate (its answers show the burst, unchanged); one set or
//! removed during the outage is not seen until the store is back.
//!
//! A call that times out may still be executed by the store. It is not abandoned: it runs to
//! its end in the background (for at most ten times the timeout, at least 1 s) and its answer
//! is reconciled with the fallback's: if the store charged a request the fallback admitted,
//! it was counted once, as it should; if the store charged a request the fallback refused,
//! the client lost that unit (the safe direction); if the store refused a request the
//! fallback admitted, one request went over the shared limit: it is counted in
//! `tollgate_fallback_overadmitted_total` (feature `metrics`) and the fallback is filled for
//! that key. **Bound**: while the store is reachable but slow, the fallback over-admits only
//! while its instance has admitted less than its share (`limit / replicas`) of the policy's
//! window and has not yet seen the store refuse the key: at most that share per instance and
//! window, and nothing on an instance that has already used its share. When the circuit is
//! open the store is not called at all, and requests admitted then are not charged to the
//! store: the usual degraded bound, each instance's share per window.
//!
//! # Refunds
//!
//! [`refund`](crate::store::Op::Refund) goes to the store like a check (through the breaker, within the
//! timeout) and also gives the local fallback its share back, since the fallback is charged
//! for every admitted request. It drops the key's cached denials, which the refund may have
//! made wrong. While the circuit is open the store is not called: a request admitted then was
//! charged to the fallback only, which is refunded; a charge the store took before the outage
//! keeps its units. A [`Limiter`](crate::Limiter) sends no give-back at all for a request a
//! failure mode admitted (its reservations, the layer's settlements and counting rules, the
//! login guard): the store never charged it, and a give-back applied once the store is back
//! would come off other requests' units; the fallback then keeps what it charged. A refund that fails or times out may or may not have reached the store;
//! either way nothing is retried, so the charge may stand: the refunded request then counts,
//! which is the safe direction.
//!
//! A [settlement](crate::store::Op::Settle) goes the same way, and its part above the
//! reservation (a debt) is the one exception to "never forgiven": while the circuit is open,
//! or when the call fails or times out, the extra units are charged to the local fallback
//! only (each instance's share), not to the store, whose count then lacks them once it is
//! back. Bound: the units settled above their reservations during the outage, which every
//! such call counts as a store error (`tollgate_store_errors_total`, `kind="circuit_open"` while the
//! circuit is open).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate::store::{FailureMode, MemoryStore, ResilientStore};
//!
//! // Any store can be wrapped; in production it is a RedisStore.
//! let store = ResilientStore::builder(MemoryStore::new(), FailureMode::LocalFallback { replicas: 4 })
//!     .timeout(Duration::from_millis(30))
//!     .circuit_breaker(5, Duration::from_secs(1))
//!     .deny_cache(10_000)
//!     .build()?;
//! # let _ = store;
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use smallvec::SmallVec;

mod breaker;
mod builder;
mod deny_cache;
mod overrides;
mod store_impl;

use super::{MemoryStore, Store, StoreExt};
use crate::algorithm::PolicyDecision;
use crate::clock::Clock;
use crate::decision::{DecidedBy, Decision};
use crate::error::StoreError;
use crate::key::Key;
pub use crate::policy::FailureMode;
use crate::policy::{Policy, Rate};
use crate::telemetry;
use breaker::Breaker;
pub use builder::{ResilientStoreBuilder, DEFAULT_DENY_CACHE_RECHECK};
use deny_cache::DenyCache;

/// A store that fails gracefully; see the [module docs](crate::store::resilient).
///
/// It wraps the store that may fail (Redis, usually) with a timeout, a circuit breaker, a
/// [`FailureMode`] for when it cannot answer, and optionally a cache of recent denials.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use tollgate::key::Key;
/// use tollgate::store::{FailureMode, MemoryStore, ResilientStore};
/// use tollgate::{DecidedBy, Limiter, Policy, Rate};
///
/// // In production the wrapped store is a `RedisStore`; any store will do.
/// let store = ResilientStore::builder(MemoryStore::new(), FailureMode::FailClosed)
///     .timeout(Duration::from_millis(50))
///     .circuit_breaker(5, Duration::from_secs(10))
///     .deny_cache(10_000)
///     .build()?;
/// let limiter = Limiter::builder()
///     .store(store)
///     .policy(Policy::new("api", Rate::per_minute(100))?)
///     .build()?;
/// let decision = limiter.check(&Key::new("tenant", "acme"), 1).await?;
/// assert_eq!(decision.decided_by(), DecidedBy::Decided); // the wrapped store answered
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct ResilientStore<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for ResilientStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for ResilientStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResilientStore")
            .field("primary", &self.inner.primary)
            .field("mode", &self.inner.mode)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// A policy's definition and the replicas it is divided among: the local fallback's share of
/// it is kept under this.
type FallbackKey = (u32, u32, crate::policy::Limits, crate::Algorithm, bool);

struct Inner<S> {
    primary: S,
    mode: FailureMode,
    timeout: Duration,
    breaker: Breaker,
    deny_cache: Option<DenyCache>,
    fallback: MemoryStore,
    /// Each policy's share, by its definition and the replicas: a reload that changes a
    /// policy under the same name gets its own share (keyed by the name alone, the first
    /// definition's share stayed in force).
    fallback_policies: RwLock<HashMap<FallbackKey, Policy>>,
    /// When each key's overrides were last read for the fallback.
    followed: overrides::Followed,
    clock: Arc<dyn Clock>,
    warned_at: AtomicU64,
    suppressed: AtomicU64,
}

impl<S: Store> ResilientStore<S> {
    /// The wrapped store.
    pub fn primary(&self) -> &S {
        &self.inner.primary
    }

    /// Whether the circuit breaker is open (the store is being skipped).
    pub fn is_circuit_open(&self) -> bool {
        self.inner.breaker.open_until.load(Ordering::Acquire) != 0
    }
}

/// A request's local-fallback policies: their indexes in the request, the scaled policies and
/// their costs.
type FallbackParts = (
    SmallVec<[usize; 2]>,
    SmallVec<[Policy; 2]>,
    SmallVec<[u64; 2]>,
);

impl<S: Store> Inner<S> {
    fn warn_degraded(&self, outcome: DecidedBy, error: &StoreError) {
        let now = self.clock.now_millis();
        let last = self.warned_at.load(Ordering::Relaxed);
        if now >= last + 1_000
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            tracing::warn!(
                target: "tollgate::store",
                outcome = outcome.as_str(),
                %error,
                suppressed,
                "rate-limit store unavailable; deciding by failure mode"
            );
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn fallback_policy(&self, policy: &Policy, replicas: u32) -> Policy {
        let key: FallbackKey = (
            policy.id(),
            replicas,
            *policy.limits(),
            policy.algorithm(),
            policy.is_sensitive(),
        );
        if let Some(p) = self.fallback_policies.read().get(&key) {
            return p.clone();
        }
        let mut cache = self.fallback_policies.write();
        cache
            .entry(key)
            .or_insert_with(|| {
                let share = |n: u64| overrides::share(n, replicas);
                let rate = policy.rate();
                let mut scaled = Rate::new(share(rate.limit()), rate.window());
                if policy.algorithm().has_burst() {
                    scaled = scaled.with_burst(share(policy.capacity()));
                }
                let mut b = Policy::builder(format!("{}-fallback", policy.name()), scaled)
                    .algorithm(policy.algorithm())
                    .sensitive(policy.is_sensitive());
                if let Some(d) = policy.max_delay() {
                    b = b.shape(d);
                }
                // The share is checked as the policy was (a smaller limit and capacity can
                // only pass those checks); the name may be longer than a user's may be.
                b.build_derived().unwrap_or_else(|error| {
                    tracing::error!(target: "tollgate::store", %error, policy = policy.name(), "the local fallback could not divide this policy; it falls back to the whole limit");
                    policy.clone()
                })
            })
            .clone()
    }

    /// The local-fallback policies of a request (with their indexes and costs), if any.
    fn fallback_parts(&self, policies: &[Policy], costs: &[u64]) -> FallbackParts {
        let mut idx = SmallVec::new();
        let mut fps = SmallVec::new();
        let mut fcosts = SmallVec::new();
        for (i, p) in policies.iter().enumerate() {
            if let Some(replicas) = self.replicas(p) {
                let fp = self.fallback_policy(p, replicas);
                fcosts.push(costs[i].min(fp.capacity()));
                fps.push(fp);
                idx.push(i);
            }
        }
        (idx, fps, fcosts)
    }

    /// Keeps the fallback limiter in step with the store's answer, so that it reflects what
    /// this instance admitted. `fallback_admitted` is the fallback's own answer when the
    /// store answered too late (the request was decided by the fallback).
    fn learn(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        store: &Decision,
        fallback_admitted: Option<bool>,
    ) {
        let (idx, fps, fcosts) = self.fallback_parts(policies, costs);
        if fps.is_empty() {
            return;
        }
        if self.followed.take_changed(key) {
            self.follow_overrides(key, policies, store);
        }
        if store.is_allowed() {
            // Admitted by the store and not yet charged here (a late answer for a request the
            // fallback decided was charged here already, or refused).
            if fallback_admitted.is_none() {
                // A slot is taken whether or not the share has room: the request runs, and
                // its release (mirrored here) must not take the count below what runs.
                let (slots, rates): (SmallVec<[usize; 2]>, SmallVec<[usize; 2]>) =
                    (0..fps.len()).partition(|&j| fps[j].is_in_flight());
                if !slots.is_empty() {
                    let held: SmallVec<[Policy; 2]> =
                        slots.iter().map(|&j| fps[j].clone()).collect();
                    self.fallback.take_slots(key, &held);
                }
                if !rates.is_empty() {
                    let ps: SmallVec<[Policy; 2]> = rates.iter().map(|&j| fps[j].clone()).collect();
                    let cs: SmallVec<[u64; 2]> = rates.iter().map(|&j| fcosts[j]).collect();
                    if let Ok(local) = self.fallback.decide(key, &ps, &cs, true) {
                        let parted = rates.iter().zip(local.policies()).any(|(&j, l)| {
                            self.limits_part(&policies[idx[j]], store, idx[j], l.limit)
                        });
                        if parted {
                            self.follow_overrides(key, policies, store);
                        }
                    }
                }
            }
            return;
        }
        if fallback_admitted == Some(true) {
            telemetry::fallback_overadmitted();
            tracing::debug!(target: "tollgate::store", "the local fallback admitted a request the store refused");
        }
        // The store refused: no fallback decision in this window may hand out what the store
        // would not. Fill each refusing policy's local share.
        for (j, fp) in idx.iter().zip(&fps) {
            // Not a sign of the share being spent: a cost above the capacity (charged nothing
            // anywhere), or slots held elsewhere (a slot taken here would never be given back;
            // the slots this instance holds are followed as they are taken and released).
            let refused = store
                .policies()
                .get(*j)
                .is_some_and(|d| !d.is_allowed() && !d.exceeds_capacity());
            if !refused || fp.is_in_flight() {
                continue;
            }
            let one = std::slice::from_ref(fp);
            let local = self.fallback.decide(key, one, &[0], false).ok();
            if local.as_ref().is_some_and(|d| {
                d.policies()
                    .first()
                    .is_some_and(|l| self.limits_part(&policies[*j], store, *j, l.limit))
            }) {
                self.follow_overrides(key, policies, store);
            }
            let left = local.map_or(0, |d| d.remaining());
            if left > 0 {
                let _ = self.fallback.decide(key, one, &[left], true);
            }
        }
    }

    /// A request that costs more than an instance's share of a policy is admitted by the
    /// fallback only while that share is untouched (its cost is clamped to the share to be
    /// decided at all); the rest of its cost is charged as a debt, as a settlement above its
    /// reservation is ([`Op::Settle`](crate::store::Op::Settle)), so the instance then refuses
    /// until it has paid it back at its share's rate and serves no more than its share over
    /// time (one request's overshoot at most).
    fn charge_above_shares(&self, key: &Key, idx: &[usize], fps: &[Policy], costs: &[u64]) {
        let (mut over, mut reserved, mut actual) = (
            SmallVec::<[Policy; 2]>::new(),
            SmallVec::<[u64; 2]>::new(),
            SmallVec::<[u64; 2]>::new(),
        );
        for (&i, fp) in idx.iter().zip(fps) {
            if costs[i] > fp.capacity() {
                over.push(fp.clone());
                reserved.push(fp.capacity());
                actual.push(costs[i]);
            }
        }
        if !over.is_empty() {
            // The memory store settles when called; its future only reports success.
            drop(self.fallback.apply(
                key,
                &over,
                crate::store::Op::settle(&reserved[..], &actual[..]),
            ));
        }
    }

    /// The whole capacity in force of `policy` for `key` and the units shaping admits beyond
    /// it (an override's, as the fallback follows it at its share `fallback`), if `cost` is
    /// above both.
    fn capacity_exceeded(
        &self,
        key: &Key,
        policy: &Policy,
        fallback: &Policy,
        cost: u64,
    ) -> Option<(u64, u64)> {
        let (capacity, slack) = match self.fallback.overridden(key, fallback) {
            None => (policy.capacity(), policy.limits().shaping_slack()),
            // A followed override, kept at its share (rounded up): its whole capacity is at
            // most this.
            Some(share) => {
                let replicas = u64::from(self.replicas(policy).unwrap_or(1).max(1));
                (
                    share.capacity().saturating_mul(replicas),
                    share.limits().shaping_slack().saturating_mul(replicas),
                )
            }
        };
        (cost > capacity.saturating_add(slack)).then_some((capacity, slack))
    }

    /// Decides without the store, by each policy's failure mode.
    fn degraded(
        &self,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        error: &StoreError,
        charge: bool,
    ) -> Decision {
        let modes: SmallVec<[FailureMode; 2]> = policies
            .iter()
            .map(|p| p.failure_mode().unwrap_or(self.mode))
            .collect();
        let closed = modes.contains(&FailureMode::FailClosed);
        let retry_ms = self.breaker.cooldown_ms.max(1_000);
        let (fallback_idx, fallback_policies, fallback_costs) =
            self.fallback_parts(policies, costs);
        // A cost above a policy's whole capacity is refused as the store refuses it, charging
        // nothing: only a cost above this instance's share is clamped to be decided.
        let over_capacity: SmallVec<[Option<(u64, u64)>; 2]> = fallback_idx
            .iter()
            .zip(&fallback_policies)
            .map(|(&i, fp)| self.capacity_exceeded(key, &policies[i], fp, costs[i]))
            .collect();
        let refused_for_cost = over_capacity.iter().any(Option::is_some);
        // Charge the fallback limiter only when nothing fails closed (all or nothing).
        let local = if fallback_policies.is_empty() {
            None
        } else {
            let charge = charge && !closed && !refused_for_cost;
            self.fallback
                .decide(key, &fallback_policies, &fallback_costs, charge)
                .ok()
        };
        if charge
            && !closed
            && !refused_for_cost
            && local.as_ref().is_some_and(Decision::is_allowed)
        {
            self.charge_above_shares(key, &fallback_idx, &fallback_policies, costs);
        }
        let mut out: SmallVec<[PolicyDecision; 2]> = SmallVec::new();
        for (i, (p, m)) in policies.iter().zip(&modes).enumerate() {
            let d = match m {
                FailureMode::FailOpen => {
                    PolicyDecision::from_parts(true, p.capacity(), p.capacity(), 0, 0, 0)
                }
                FailureMode::FailClosed => {
                    PolicyDecision::from_parts(false, p.capacity(), 0, retry_ms, retry_ms, 0)
                }
                FailureMode::LocalFallback { .. } => {
                    let j = fallback_idx.iter().position(|&k| k == i).unwrap_or(0);
                    if let Some((capacity, slack)) = over_capacity.get(j).copied().flatten() {
                        out.push(
                            PolicyDecision::from_parts(false, capacity, 0, 0, 0, 0)
                                .for_cost(costs[i], || slack),
                        );
                        continue;
                    }
                    local
                        .as_ref()
                        .and_then(|l| l.policies().get(j).copied())
                        .unwrap_or_else(|| {
                            PolicyDecision::from_parts(
                                false,
                                p.capacity(),
                                0,
                                retry_ms,
                                retry_ms,
                                0,
                            )
                        })
                }
            };
            out.push(d);
        }
        let outcome = if closed {
            DecidedBy::FailClosed
        } else if !fallback_idx.is_empty() {
            DecidedBy::Fallback
        } else {
            DecidedBy::FailOpen
        };
        self.warn_degraded(outcome, error);
        let mut decision = Decision::from_policies(out).with_decided_by(outcome);
        // The fallback's name for the slot it gave: its release frees that slot only, and
        // nothing once a reset has forgotten it.
        if let Some(local) = &local {
            decision = decision.with_slot_of(local);
        }
        // Counted in `tollgate_degraded_total` by whoever decides the request with it (the
        // limiter, the login guard), once per request, not here per call.
        decision
    }
}

impl<S: Store> Inner<S> {
    /// Asks the store, off the request path, whether a cached denial still stands: a peek,
    /// which charges nothing, under the store's timeout. Skipped while the circuit is open
    /// (the store is not being called) and without a runtime; the entry is then asked about
    /// at a later hit.
    fn recheck(self: &Arc<Self>, job: deny_cache::Recheck) {
        let Some(cache) = &self.deny_cache else {
            return;
        };
        let runtime = tokio::runtime::Handle::try_current();
        let closed = self.breaker.open_until.load(Ordering::Acquire) == 0;
        let (Ok(runtime), true) = (runtime, closed) else {
            cache.rechecked(
                &job,
                None,
                self.clock.now_millis(),
                self.primary.generation(),
            );
            return;
        };
        let call = self.primary.peek(&job.key, &job.policies, &job.costs);
        let this = Arc::clone(self);
        runtime.spawn(async move {
            let answer = match tokio::time::timeout(this.timeout, call).await {
                Ok(Ok(d)) => Some((d.is_allowed(), d.retry_after_millis())),
                Ok(Err(_)) | Err(_) => None,
            };
            if let Some(cache) = &this.deny_cache {
                let now = this.clock.now_millis();
                cache.rechecked(&job, answer, now, this.primary.generation());
            }
        });
    }

    /// Lets a call that timed out run to its end in the background (the store may execute
    /// it anyway; a call still queued for its batch would otherwise be dropped unsent) and
    /// reconciles its answer with the fallback's. See the [module docs](self).
    fn finish_late(
        self: Arc<Self>,
        call: std::pin::Pin<Box<S::CheckFuture>>,
        key: Key,
        policies: SmallVec<[Policy; 2]>,
        costs: SmallVec<[u64; 2]>,
        admitted: bool,
    ) {
        let uses_fallback = policies.iter().any(|p| {
            matches!(
                p.failure_mode().unwrap_or(self.mode),
                FailureMode::LocalFallback { .. }
            )
        });
        // Without a fallback there is nothing to reconcile: the call is dropped as before.
        let Some(runtime) = uses_fallback
            .then(tokio::runtime::Handle::try_current)
            .and_then(Result::ok)
        else {
            return;
        };
        let grace = (self.timeout * 10).max(Duration::from_secs(1));
        runtime.spawn(async move {
            if let Ok(Ok(decision)) = tokio::time::timeout(grace, call).await {
                // The fallback decided the request: a slot the store took for it late is
                // nobody's, and goes back at once.
                if decision.is_allowed() && decision.slot() != 0 {
                    let held: SmallVec<[Policy; 2]> =
                        policies.iter().filter(|p| p.is_in_flight()).cloned().collect();
                    if let Err(error) = self
                        .primary
                        .release(&key, &held, decision.slot())
                        .await
                    {
                        tracing::warn!(target: "tollgate::store", %error, "giving back a slot taken after the timeout failed; it comes back when its lease ends");
                    }
                }
                let admitted = Some(admitted);
                self.learn(&key, &policies, &costs, &decision, admitted);
            }
        });
    }
}
