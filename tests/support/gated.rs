//! A store wrapper that makes a store's replies late: every call of [`Gated`] stops once
//! before it reaches the wrapped store and, unless told otherwise, once more after the store
//! answered and before its caller sees the answer. Each stop is one `Pending` poll (it wakes
//! itself at once), so a driver that counts pending polls ([`super::cancel`]) can drop the
//! caller's future before the call, or after the store acted on it but before the reply.
//!
//! The memory store answers at once, so on its own it offers no await point; behind a
//! `Gated` it stands for a slow store in front of which the limiter's own awaits can be
//! reached.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tollgate::error::StoreError;
use tollgate::key::Key;
use tollgate::overrides::ActiveOverride;
use tollgate::store::leased::{LeaseBackend, LedgerCall, LedgerReply};
use tollgate::store::{Applied, ApplyFuture, BoxFuture, Op, OverrideStore, Store, StoreExt};
use tollgate::{Decision, Policy};

/// Which stops each call makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stops {
    /// Only before the call reaches the store.
    Before,
    /// Before the call, and after the store answered (the reply is late).
    BeforeAndAfter,
}

/// A store whose every call stops before reaching `S` and (see [`Stops`]) after it.
pub struct Gated<S> {
    inner: Arc<S>,
    stops: Stops,
    log: Arc<Mutex<Vec<String>>>,
}

impl<S> Clone for Gated<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            stops: self.stops,
            log: Arc::clone(&self.log),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Gated<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gated")
            .field("inner", &self.inner)
            .field("stops", &self.stops)
            .finish()
    }
}

impl<S> Gated<S> {
    /// `inner`, with `stops` on every call.
    pub fn new(inner: S, stops: Stops) -> Self {
        Self {
            inner: Arc::new(inner),
            stops,
            log: Arc::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The stops passed so far (`"check: before"`, …), oldest first.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The last stop passed, for failure messages.
    pub fn last_stop(&self) -> String {
        self.log
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_else(|| "none".into())
    }

    fn gate(&self, what: &'static str, when: &'static str) -> Stop {
        Stop {
            label: format!("{what}: {when}"),
            log: Arc::clone(&self.log),
            stopped: false,
        }
    }

    /// `call`, made only after the first stop, then (with [`Stops::BeforeAndAfter`]) one
    /// more stop before its answer is handed over.
    fn wrap<T, F>(&self, what: &'static str, call: F) -> BoxFuture<Result<T, StoreError>>
    where
        T: Send + 'static,
        F: FnOnce(&S) -> BoxFuture<Result<T, StoreError>> + Send + 'static,
        S: Send + Sync + 'static,
    {
        let before = self.gate(what, "before");
        let after = (self.stops == Stops::BeforeAndAfter).then(|| self.gate(what, "after"));
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            before.await;
            let answer = call(&inner).await;
            if let Some(after) = after {
                after.await;
            }
            answer
        })
    }
}

/// One stop: `Pending` once (waking itself), then ready.
struct Stop {
    label: String,
    log: Arc<Mutex<Vec<String>>>,
    stopped: bool,
}

impl Future for Stop {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.stopped {
            return Poll::Ready(());
        }
        self.stopped = true;
        let label = self.label.clone();
        self.log.lock().unwrap().push(label);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

fn owned(key: &Key, policies: &[Policy]) -> (Key, Vec<Policy>) {
    (key.clone(), policies.to_vec())
}

impl<S: Store> Store for Gated<S> {
    type CheckFuture = BoxFuture<Result<Decision, StoreError>>;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        let (key, policies) = owned(key, policies);
        let costs = costs.to_vec();
        self.wrap("check", move |s| Box::pin(s.check(&key, &policies, &costs)))
    }

    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if matches!(op, Op::Refresh { .. }) {
            // Refreshes run in the background while a slot is held: never stopped.
            return self.inner.apply(key, policies, op);
        }
        let (key, policies) = owned(key, policies);
        self.wrap(op.name(), move |s| s.apply(&key, &policies, op))
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        self.inner
            .override_store()
            .map(|_| self as &dyn OverrideStore)
    }

    fn now_millis(&self) -> u64 {
        self.inner.now_millis()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn generation(&self) -> u64 {
        self.inner.generation()
    }

    fn applies_failure_modes(&self) -> bool {
        self.inner.applies_failure_modes()
    }
}

impl<S: Store> OverrideStore for Gated<S> {
    fn set(
        &self,
        key: &Key,
        policy: &Policy,
        ttl: Option<Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let (key, policy) = (key.clone(), policy.clone());
        self.wrap("set_override", move |s| s.set_override(&key, &policy, ttl))
    }

    fn remove(&self, key: &Key, policy: &Policy) -> BoxFuture<Result<(), StoreError>> {
        let (key, policy) = (key.clone(), policy.clone());
        self.wrap("remove_override", move |s| s.remove_override(&key, &policy))
    }

    fn list(
        &self,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        self.inner.overrides(key, policies)
    }
}

impl<S: LeaseBackend> LeaseBackend for Gated<S> {
    fn ledger(
        &self,
        key: &Key,
        policies: &[Policy],
        call: LedgerCall,
    ) -> BoxFuture<Result<LedgerReply, StoreError>> {
        let (key, policies) = owned(key, policies);
        self.wrap("ledger", move |s| s.ledger(&key, &policies, call))
    }
}
