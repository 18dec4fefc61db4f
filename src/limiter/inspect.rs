//! A key's state under the policies that would decide a request, for operators: a peek that
//! charges nothing.

use serde::{Deserialize, Serialize};

use super::heavy_hitters::shown;
use super::{Limiter, PolicySet};
use crate::algorithm::PolicyDecision;
use crate::error::CheckError;
use crate::key::{Key, RequestView};
use crate::policy::{Algorithm, Policy};
use crate::store::{Store, StoreExt};

/// A key's state under the policies of a request's route ([`Limiter::inspect`]); nothing was
/// charged to get it.
///
/// See [`Limiter::inspect`] for an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KeyState {
    /// The key's source and the first characters of its material (as in
    /// [`RefusedKey`](crate::RefusedKey)).
    pub key: String,
    /// The key's digest, as in logs, spans and [`Limiter::top_refused`].
    pub digest: String,
    /// The route's label, as in metrics (`GET /search`, `default`, the pattern axum matched
    /// for an attached route, `for_route`); `None` for an exempt route.
    pub route: Option<String>,
    /// `allow` or `deny` when an access list holds the key (its requests are then not
    /// decided by the policies), else `None`.
    pub list: Option<String>,
    /// Whether a request with each policy's own cost would go ahead now.
    pub allowed: bool,
    /// Whether a penalty's block is running: refused whatever the policies say.
    pub blocked: bool,
    /// Each enforced policy, then each shadow policy, of the route (or the tier).
    pub policies: Vec<PolicyState>,
}

/// One policy's view of a key, in a [`KeyState`].
///
/// See [`Limiter::inspect`] for an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PolicyState {
    /// The policy's name.
    pub policy: String,
    /// Whether it is a shadow policy (counted, never enforced).
    pub shadow: bool,
    /// Whether it would allow a request of its own cost now.
    pub allowed: bool,
    /// The limit per window (the capacity for the token bucket and GCRA).
    pub limit: u64,
    /// Units left now, before any request (a request of its own cost takes them down by
    /// that cost).
    pub remaining: u64,
    /// Milliseconds until the policy is back to its full limit.
    pub reset_after_ms: u64,
    /// When it refuses: milliseconds until a request of its own cost would pass.
    pub retry_after_ms: u64,
}

/// The policies a limiter enforces, route by route ([`Limiter::effective_plan`]).
///
/// See [`Limiter::effective_plan`] for an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EffectivePlan {
    /// Each route's policy sets (one per tier), in the order routes were declared, the
    /// default route last. Exempt routes have none and are not listed.
    pub routes: Vec<RouteView>,
}

/// The policies of one route, or of one tier of a route, in an [`EffectivePlan`].
///
/// See [`Limiter::effective_plan`] for an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RouteView {
    /// The route's label, as in metrics (`GET /search`, `default`, `for_route`).
    pub route: String,
    /// The tier, for a tier's policies; `None` for requests of no tier.
    pub tier: Option<String>,
    /// How its requests are keyed: the extractor, as its `Debug` shows it (no key material,
    /// no secret), e.g. `ApiKey { header: Some("x-api-key"), .. }`.
    pub key: String,
    /// Whether that is the route's (or the tier's) [own key](crate::route::Route::key)
    /// rather than the limiter's.
    pub own_key: bool,
    /// Its enforced policies, then its shadow policies.
    pub policies: Vec<PolicyView>,
}

/// One policy's settings, in an [`EffectivePlan`].
///
/// See [`Limiter::effective_plan`] for an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PolicyView {
    /// The name.
    pub name: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The limit per window.
    pub limit: u64,
    /// The window in milliseconds.
    pub window_ms: u64,
    /// The capacity (the burst for the token bucket and GCRA, else the limit).
    pub capacity: u64,
    /// Units a request costs unless the route says otherwise.
    pub cost: u64,
    /// Whether it is a shadow policy (counted, never enforced).
    pub shadow: bool,
    /// The penalty's block, in milliseconds, when the policy has one.
    pub penalty_ms: Option<u64>,
}

impl PolicyView {
    fn new(p: &Policy) -> Self {
        Self {
            name: p.name().to_owned(),
            algorithm: p.algorithm(),
            limit: p.limit(),
            window_ms: p.window_millis(),
            capacity: p.capacity(),
            cost: p.cost(),
            shadow: p.is_shadow(),
            penalty_ms: p
                .penalty()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

impl PolicyState {
    /// From a peek with `cost`, which answers as a request of that cost would: what is left
    /// after it when allowed.
    fn new(policy: &Policy, shadow: bool, d: &PolicyDecision, cost: u64) -> Self {
        let remaining = if d.is_allowed() {
            d.remaining().saturating_add(cost).min(d.limit())
        } else {
            d.remaining()
        };
        Self {
            policy: policy.name().to_owned(),
            shadow,
            allowed: d.is_allowed(),
            limit: d.limit(),
            remaining,
            reset_after_ms: d.reset_after_millis(),
            retry_after_ms: d.retry_after_millis(),
        }
    }
}

impl<S: Store> Limiter<S> {
    /// The state of `key` under every policy that would decide `request` (its route, as the
    /// route table matches it, and its tier), each policy on its own, charging nothing: what
    /// an operator asks when a client says it is being refused. The request's own key is not
    /// read; `key` is the one looked at. A [`for_route`](Self::for_route) limiter shows its
    /// route's policies for any request.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::{Key, RequestView}, route::Route, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .route("GET /search", Route::new().policy(Policy::new("search", Rate::per_minute(1))?))
    ///     .policy(Policy::new("api", Rate::per_minute(100))?)
    ///     .build()?;
    /// let key = Key::new("user", "42");
    /// let search = http::Request::get("/search").body(())?;
    /// let view = RequestView::new(&search);
    /// let state = limiter.inspect(&view, &key).await?;
    /// assert_eq!(state.route.as_deref(), Some("GET /search"));
    /// assert!(state.allowed);
    /// assert_eq!((state.policies[0].policy.as_str(), state.policies[0].remaining), ("search", 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn inspect(
        &self,
        request: &RequestView<'_>,
        key: &Key,
    ) -> Result<KeyState, CheckError> {
        let common = &self.inner.common;
        let mut state = KeyState {
            key: shown(key),
            digest: crate::key::digest(key),
            route: None,
            list: None,
            allowed: true,
            blocked: false,
            policies: Vec::new(),
        };
        let plan = self.plan_full();
        let Some(set) = plan.resolve(request) else {
            return Ok(state);
        };
        let set = &**set;
        state.route = Some(set.route.to_string());
        if plan.lists.deny.contains(key) {
            state.list = Some("deny".to_owned());
            state.allowed = false;
        } else if plan.lists.allow.contains(key) {
            state.list = Some("allow".to_owned());
        }
        if !set.enforced.is_empty() {
            // What the request would be charged: the route's cost, fixed or computed from it.
            let costs = set.look_costs(Some(request));
            let block = self.running_block(key, set, &costs).await?;
            state.blocked = block.is_some();
            let decision = match block {
                Some(blocked) => blocked,
                None => common.store.peek(key, &set.enforced, &costs).await?,
            };
            if state.list.is_none() {
                state.allowed = decision.is_allowed();
            }
            state.policies.extend(
                set.enforced
                    .iter()
                    .zip(decision.policies())
                    .zip(costs.iter())
                    .map(|((p, d), &cost)| PolicyState::new(p, false, d, cost)),
            );
        }
        if !set.shadow.is_empty() {
            let shadow = common
                .store
                .peek(key, &set.shadow, &set.shadow_costs)
                .await?;
            state.policies.extend(
                set.shadow
                    .iter()
                    .zip(shadow.policies())
                    .zip(set.shadow_costs.iter())
                    .map(|((p, d), &cost)| PolicyState::new(p, true, d, cost)),
            );
        }
        Ok(state)
    }

    /// The policies this limiter enforces, route by route and tier by tier: what the admin
    /// API's `GET /plan` shows.
    ///
    /// ```
    /// use tollgate::{route::Route, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .route("GET /search", Route::new().policy(Policy::new("search", Rate::per_minute(10))?))
    ///     .policy(Policy::new("api", Rate::per_minute(100))?)
    ///     .build()?;
    /// let plan = limiter.effective_plan();
    /// assert_eq!(plan.routes[0].route, "GET /search");
    /// assert_eq!(plan.routes[1].route, "default");
    /// assert_eq!((plan.routes[1].policies[0].name.as_str(), plan.routes[1].policies[0].limit), ("api", 100));
    /// assert!(!plan.routes[1].own_key && plan.routes[1].key.starts_with("PeerIp"));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn effective_plan(&self) -> EffectivePlan {
        let plan = self.plan();
        let sets = &plan.sets;
        let view = |set: &PolicySet, tier: Option<&str>| {
            let (key, own_key) = plan.lists.describe_key(set);
            RouteView {
                route: set.route.to_string(),
                tier: tier.map(str::to_owned),
                key,
                own_key,
                policies: set
                    .enforced
                    .iter()
                    .chain(set.shadow.iter())
                    .map(PolicyView::new)
                    .collect(),
            }
        };
        let mut routes = Vec::new();
        for route in &plan.routes {
            routes.extend(route.default_set.map(|id| view(&sets[id], None)));
            routes.extend(route.tiers.iter().map(|(t, id)| view(&sets[*id], Some(t))));
        }
        // The routes of limiters made with `for_route` (axum's router decides which
        // requests they see), under the label their metrics carry.
        if plan.attached.is_none() {
            for (tier, set) in self.inner.common.attached_tiers() {
                routes.push(view(&set, tier.as_deref()));
            }
        }
        EffectivePlan { routes }
    }
}
