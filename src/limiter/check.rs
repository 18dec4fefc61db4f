//! The direct check of a key: [`Limiter::check`], and [`Limiter::check_now`], the same
//! without a future for a store that answers at once.

use std::sync::Arc;

use smallvec::SmallVec;

use super::decide::{self, Listed, PreparedKey, Screen};
use super::finish::Asker;
use super::hold::Completing;
use super::{Limiter, PolicySet};
use crate::decision::Decision;
use crate::error::CheckError;
use crate::key::Key;
use crate::store::Store;

impl<S: Store> Limiter<S> {
    /// Checks `key` against the default route's policies, charging `cost` units to each —
    /// all of them or none — through the same path as the layer: a deny-listed key is
    /// refused, an allow-listed key passes uncharged (an allowed decision with no policies),
    /// a running penalty refuses, shadow policies are checked and counted. With an exempt
    /// default route every key passes uncharged. An [in-flight](crate::Algorithm::InFlight)
    /// policy admits the request only if a slot is free now, and holds none afterwards (the
    /// slot is given back at once): [`acquire`](Self::acquire) holds slots until its
    /// [`Permit`](crate::Permit) is dropped.
    ///
    /// A `cost` of 0 is a look that charges nothing: it is allowed while the key is not past
    /// its limit (a settlement's debt refuses it), so it never serves anything the limit
    /// counts. A reservation ([`reserve`](Self::reserve)) reserves at least one unit.
    ///
    /// # Errors
    ///
    /// [`CheckError::CostExceedsCapacity`] when `cost` exceeds a policy's capacity, or a
    /// per-key override's lower one (such a request could never pass, and charging it must
    /// not lock the key out),
    /// [`CheckError::Forbidden`] for a deny-listed key, and [`CheckError::Store`] when the
    /// store fails.
    pub async fn check(&self, key: &Key, cost: u64) -> Result<Decision, CheckError> {
        self.check_as(Asker::Check, key, cost).await
    }

    /// [`check`](Self::check) for `asker`: the login guard checks its three limits with
    /// [`Asker::Guard`], and records the attempt's one decision itself.
    #[inline(always)]
    pub(crate) async fn check_as(
        &self,
        asker: Asker,
        key: &Key,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        // One load of the plan for the set and the lists, released before any await.
        let asked = {
            let guard = self.plan();
            let plan = &*guard;
            let Some(set) = plan.default_set() else {
                return Ok(Decision::pass());
            };
            let mut given = SmallVec::new();
            let costs = match self.prepare_key(
                set,
                Screen::keys(&plan.lists),
                key,
                Some(cost),
                None,
                &mut given,
            ) {
                PreparedKey::Pass => return Ok(Decision::pass()),
                PreparedKey::Refuse(refusal) => return Err(CheckError::from_refusal(&refusal)),
                PreparedKey::Ask(costs) => costs,
            };
            // A store that answers at once (the memory store) is decided right here: no
            // future, no set or key copied. (Not through `check_now`: handing its answer
            // on would move the decision once more.)
            if let Some(outcome) = self.answer_now(set, key, costs) {
                let result = self.finish(asker, set, key, outcome, None);
                match self.given_back(set, key, &result) {
                    None => return result,
                    Some(release) => Asked::Answered(result, release),
                }
            } else {
                Asked::Later(Arc::clone(set), self.answer_later(set, key, costs))
            }
        };
        let (result, release) = match asked {
            Asked::Answered(result, release) => (result, Some(release)),
            Asked::Later(set, future) => {
                let result = self.finish(asker, &set, key, future.await, None);
                let release = self.given_back(&set, key, &result);
                (result, release)
            }
        };
        if let Some(release) = release {
            release.reported().await;
        }
        result
    }

    /// Gives back the slots a check took ([`give_back_at_once`](Self::give_back_at_once)).
    #[inline(always)]
    fn given_back(
        &self,
        set: &PolicySet,
        key: &Key,
        result: &Result<Decision, CheckError>,
    ) -> Option<Completing> {
        if set.in_flight.is_empty() {
            return None;
        }
        self.give_back_at_once(set, key, result.as_ref().ok()?)
    }

    /// [`check`](Self::check) without waiting: the decision, or `None` when it needs a wait
    /// (a store that answers over the network, or a running penalty to look up), in which
    /// case nothing was charged, recorded or logged and `check` is the way to ask.
    ///
    /// The memory store always answers at once, so a limiter on it answers every key here
    /// unless its plan has [penalties](crate::policy::PolicyBuilder::penalty); this is the
    /// call for code that is not async, and the cheapest check there is (no future to build
    /// or poll). Everything else is `check`'s: lists, shadow policies, costs, in-flight slots
    /// given back at once, metrics and traces, and the same errors.
    ///
    /// ```
    /// use tollgate::{key::Key, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("api", Rate::per_second(2))?)
    ///     .build()?;
    /// let key = Key::new("user", "42");
    /// let first = limiter.check_now(&key, 1).expect("the memory store answers at once")?;
    /// assert!(first.is_allowed());
    /// assert_eq!(first.remaining(), 1);
    /// assert!(limiter.check_now(&key, 1).unwrap()?.is_allowed());
    /// assert!(!limiter.check_now(&key, 1).unwrap()?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`check`](Self::check).
    pub fn check_now(&self, key: &Key, cost: u64) -> Option<Result<Decision, CheckError>> {
        // Shadow policies are checked once the enforced ones answered at once: a `None` must
        // leave nothing counted, since the caller asks again.
        let guard = self.plan();
        let plan = &*guard;
        let Some(set) = plan.default_set() else {
            return Some(Ok(Decision::pass()));
        };
        match decide::screen_lists(&plan.lists, key) {
            Listed::Denied => {
                return Some(Err(CheckError::from_refusal(&decide::forbidden(key))));
            }
            Listed::Allowed => return Some(Ok(Decision::pass())),
            Listed::No => {}
        }
        if !set.penalties.is_empty() {
            return None;
        }
        let mut given = SmallVec::new();
        let costs = match decide::charged(set, Some(cost), None, &mut given) {
            PreparedKey::Ask(costs) => costs,
            other => {
                self.check_shadow(key, set, cost);
                return Some(match other {
                    PreparedKey::Refuse(refusal) => Err(CheckError::from_refusal(&refusal)),
                    _ => Ok(Decision::pass()),
                });
            }
        };
        match self.inner.common.store.check_now(key, &set.enforced, costs) {
            Some(outcome) => {
                self.check_shadow(key, set, cost);
                let result = self.finish(Asker::Check, set, key, outcome, None);
                // Nothing here can wait: a release the store did not finish at once
                // finishes on its own.
                drop(self.given_back(set, key, &result));
                Some(result)
            }
            None => None,
        }
    }

    #[inline(always)]
    fn check_shadow(&self, key: &Key, set: &Arc<PolicySet>, cost: u64) {
        if !set.shadow.is_empty() {
            self.spawn_shadow_check(key, set, Some(cost));
        }
    }
}

/// A check's store answer: given at once (with a release still to wait for), or to await.
enum Asked<F> {
    Answered(Result<Decision, CheckError>, Completing),
    Later(Arc<PolicySet>, F),
}
