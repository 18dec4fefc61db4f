//! [`Limiter`]: routes and policies + key extractor + store, the one decision path.
//!
//! Every way into tollgate decides here: the layer ([`RateLimitLayer`](crate::RateLimitLayer)),
//! the direct API ([`Limiter::check`], [`Limiter::peek`], [`Limiter::decide`]), the login
//! guard and gRPC calls. Route and tier resolution, the key, allow and deny lists, costs,
//! penalties and shadow policies live in this module, so a feature cannot hold on one path
//! and not on another.

mod access;
mod attached;
mod builder;
mod check;
mod compile;
mod decide;
mod finish;
mod heavy_hitters;
mod hold;
mod inspect;
mod overrides;
mod penalty;
mod permit;
mod refund;
mod reload;
mod resets;
mod route_key;
mod route_table;
mod shadow;

pub use builder::LimiterBuilder;
pub(crate) use decide::{CheckFuture, Pending, Prepared, Reserved, ReservedUnits};
use decide::{OwnCosts, PreparedKey};
pub(crate) use finish::{Admitted, Asker};
#[cfg(feature = "admin")]
pub(crate) use heavy_hitters::shown as shown_key;
pub use heavy_hitters::{RefusedKey, DEFAULT_TOP_REFUSED_SLOTS, DEFAULT_TOP_REFUSED_WINDOW};
pub(crate) use hold::{drive, Charge, Counting, Held, SettleFn, Slots};
pub use inspect::{EffectivePlan, KeyState, PolicyState, PolicyView, RouteView};
pub use permit::{Permit, Reservation};
use resets::ResetLog;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use smallvec::SmallVec;

use crate::decision::Decision;
use crate::error::{CheckError, ConfigError};
use crate::key::{Key, KeyExtractor, RequestView};
use crate::policy::Policy;
use crate::refusal::{Refusal, RefusalKind};
use crate::route::{Cost, CountWhen, Meter, Route, TierFn};
use crate::store::{MemoryStore, Store, StoreExt};

use access::AccessList;
#[cfg(feature = "config")]
pub(crate) use route_table::parse_pattern;
pub(crate) use route_table::RouteTable;
use shadow::ShadowCounters;
pub use shadow::ShadowCounts;

/// What to do with a request from which no key can be extracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer `400 Bad Request` (the default). With [`PeerIp`](crate::key::PeerIp) this
    /// happens only when the server does not record peer addresses — a setup mistake that
    /// should be loud (it is logged as a warning, once per process).
    #[default]
    Reject,
    /// Put every such request in one shared bucket, the key `anonymous:`.
    Shared,
}

/// Decides requests: a route table of policies, a key extractor and a store.
///
/// Cheap to clone (clones share everything). Use it directly — background jobs, websocket
/// messages, the login helper — or wrap it in a [`RateLimitLayer`](crate::RateLimitLayer).
/// Both go through the same decision path: allow and deny lists, costs, penalties and shadow
/// policies hold for [`check`](Self::check) and [`decide`](Self::decide) exactly as for the
/// layer. See [`crate::route`] for per-route policies, tiers and costs.
///
/// # A policy name is one policy
///
/// Stores keep state per key and policy *name*. Two different definitions under one name
/// anywhere in a limiter (two routes, two tiers, a [`for_route`](Self::for_route) layer) are
/// a build error naming both places. The same definition used in several places is one
/// policy with one counter. To let a client keep its usage while moving between tiers whose
/// policies differ only in their limit, ask for it with
/// [`LimiterBuilder::share_usage`].
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

/// What every limiter made from one builder shares, [`Limiter::for_route`] ones included.
pub(crate) struct Common<S> {
    pub(crate) store: S,
    shadow: ShadowCounters,
    /// Every policy by name, with the place it was first declared: one name, one policy.
    names: Mutex<PolicyNames>,
    /// The keys refused most often, when kept ([`Limiter::top_refused`]).
    top_refused: Option<Arc<heavy_hitters::HeavyHitters>>,
    /// Resets by key: see [`Limiter::resets_seen`].
    pub(crate) resets: ResetLog,
    /// What the plan in force was described by, kept by whoever built it from a description
    /// (a config plan) for the next reload to compare with; `None` for a plan built in code.
    pub(crate) source: Mutex<Option<PlanSource>>,
    /// The policy sets of the limiters made with [`Limiter::for_route`]: resets and
    /// overrides through any limiter sharing this store reach their policies too.
    /// Held weakly: a limiter made and dropped leaves nothing behind.
    attached: Mutex<Vec<(Option<String>, std::sync::Weak<PolicySet>)>>,
    /// The limiter the builder made (the others come from it by [`Limiter::for_route`]): a
    /// reset or an override through any of them reaches its plan in force too.
    root: std::sync::OnceLock<std::sync::Weak<LimiterInner<S>>>,
    /// The limiters made with [`Limiter::for_route`], held weakly: a reload of the limiter
    /// they were made from gives them its lists, key extractor and tier function.
    attached_limiters: Mutex<Vec<std::sync::Weak<LimiterInner<S>>>>,
    /// The response settings of the plan the limiter was built from, for its layers.
    pub(crate) layer_headers: std::sync::OnceLock<crate::response::LayerHeaders>,
}

impl<S> Common<S> {
    /// Keeps the sets of a limiter made with [`Limiter::for_route`], by tier (`None`: the
    /// route's untiered set).
    fn register_attached(&self, route: &CompiledRoute, sets: &[Arc<PolicySet>]) {
        let mut attached = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        attached.retain(|(_, set)| set.strong_count() > 0);
        attached.extend(
            route
                .default_set
                .map(|id| (None, Arc::downgrade(&sets[id]))),
        );
        attached.extend(
            route
                .tiers
                .iter()
                .map(|(tier, id)| (Some(tier.clone()), Arc::downgrade(&sets[*id]))),
        );
    }

    /// Keeps a limiter made with [`Limiter::for_route`], for a reload to reach.
    fn register_attached_limiter(&self, limiter: &Arc<LimiterInner<S>>) {
        let mut live = self
            .attached_limiters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        live.retain(|l| l.strong_count() > 0);
        live.push(Arc::downgrade(limiter));
    }

    /// The limiters made with [`Limiter::for_route`] that live.
    fn attached_limiters(&self) -> Vec<Arc<LimiterInner<S>>> {
        self.attached_limiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect()
    }

    /// The sets of the limiters made with [`Limiter::for_route`] so far, and those of the
    /// plan in force of the limiter they were made from.
    pub(crate) fn attached_sets(&self) -> Vec<Arc<PolicySet>> {
        let mut sets: Vec<Arc<PolicySet>> =
            self.attached_tiers().into_iter().map(|(_, s)| s).collect();
        if let Some(root) = self.root.get().and_then(std::sync::Weak::upgrade) {
            let plan = if root.reloaded.load(Ordering::Relaxed) {
                root.plan.load_full()
            } else {
                Arc::clone(&root.built)
            };
            sets.extend(plan.sets.iter().cloned());
        }
        sets
    }

    /// The sets of the limiters made with [`Limiter::for_route`] and still alive, by tier.
    pub(crate) fn attached_tiers(&self) -> Vec<(Option<String>, Arc<PolicySet>)> {
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(tier, set)| Some((tier.clone(), set.upgrade()?)))
            .collect()
    }
}

/// The description a plan was built from (a config plan), opaque to the limiter.
pub(crate) type PlanSource = Arc<dyn std::any::Any + Send + Sync>;

/// Moves a key's reset moment when dropped: after the store's reset, or when the reset is
/// given up half way (its store call may have reached the store).
struct ResetEnds<'a>(&'a ResetLog, &'a Key);

impl Drop for ResetEnds<'_> {
    fn drop(&mut self) {
        self.0.mark(self.1);
    }
}

/// The policies of a limiter by name (see "A policy name is one policy" on [`Limiter`]).
#[derive(Debug, Default, Clone)]
pub(crate) struct PolicyNames {
    declared: BTreeMap<String, (Policy, String)>,
    shared_usage: Vec<String>,
}

struct LimiterInner<S> {
    common: Arc<Common<S>>,
    /// The plan the limiter was built with: the plan in force until the first reload, read
    /// without the cost of `plan`'s guard (and kept, unused, after it).
    built: Arc<CompiledPlan>,
    /// Set (once, for good) by the first [`Limiter::reload`]: the plan in force is `plan`'s.
    reloaded: AtomicBool,
    /// The plan in force after a reload: swapped whole by [`Limiter::reload`]; a request
    /// keeps the policy set it started with.
    plan: ArcSwap<CompiledPlan>,
}

/// The plan in force, borrowed for one request or call ([`Limiter::plan`]).
enum PlanRef<'a> {
    Built(&'a CompiledPlan),
    Reloaded(arc_swap::Guard<Arc<CompiledPlan>>),
}

impl std::ops::Deref for PlanRef<'_> {
    type Target = CompiledPlan;

    #[inline]
    fn deref(&self) -> &CompiledPlan {
        match self {
            PlanRef::Built(plan) => plan,
            PlanRef::Reloaded(guard) => guard,
        }
    }
}

impl<S> Limiter<S> {
    /// The plan in force. Until the first reload that is the plan built with the limiter,
    /// read directly; after it, `plan`'s. A relaxed load of the flag is enough: a thread that
    /// has not yet seen a reload decides by the plan before it, as a request that started
    /// just before the reload would, and either plan is whole.
    #[inline]
    fn plan(&self) -> PlanRef<'_> {
        if self.inner.reloaded.load(Ordering::Relaxed) {
            PlanRef::Reloaded(self.inner.plan.load())
        } else {
            PlanRef::Built(&self.inner.built)
        }
    }

    /// The plan in force, kept (see [`plan`](Self::plan)).
    fn plan_full(&self) -> Arc<CompiledPlan> {
        self.inner.plan_in_force()
    }
}

impl<S> Limiter<S> {
    /// Whether this limiter was made with [`for_route`](Self::for_route) (a route's own).
    pub(crate) fn is_attached(&self) -> bool {
        self.plan().attached.is_some()
    }
}

impl<S> LimiterInner<S> {
    /// The plan in force, kept.
    fn plan_in_force(&self) -> Arc<CompiledPlan> {
        if self.reloaded.load(Ordering::Relaxed) {
            self.plan.load_full()
        } else {
            Arc::clone(&self.built)
        }
    }
}

/// Routes, policy sets, lists and the key: everything a reload replaces.
pub(crate) struct CompiledPlan {
    sets: Vec<Arc<PolicySet>>,
    /// The routes of the table, then the default route last.
    routes: Vec<CompiledRoute>,
    table: Option<RouteTable>,
    lists: Arc<Lists>,
    /// For a limiter made by [`Limiter::for_route`]: its sets labelled by the pattern axum
    /// matched.
    attached: Option<Arc<attached::Labels>>,
}

/// How a request becomes a key, and the keys that skip the policies.
pub(crate) struct Lists {
    extractor: Box<dyn KeyExtractor>,
    missing_key: MissingKey,
    tier_fn: Option<Arc<TierFn>>,
    pub(crate) allow: AccessList,
    pub(crate) deny: AccessList,
}

impl CompiledPlan {
    /// The policy set that applies to a request, or `None` when it is exempt.
    #[inline]
    pub(crate) fn resolve(&self, request: &RequestView<'_>) -> Option<attached::SetRef<'_>> {
        let id = self.resolve_id(request)?;
        Some(match &self.attached {
            None => attached::SetRef::Plan(&self.sets[id]),
            Some(labels) => labels.set(&self.sets, id, request),
        })
    }

    /// The index of the policy set that applies to a request, or `None` when it is exempt.
    #[inline]
    fn resolve_id(&self, request: &RequestView<'_>) -> Option<usize> {
        let route_idx = self
            .table
            .as_ref()
            .and_then(|t| {
                t.lookup_request(
                    request.method(),
                    request.uri(),
                    request.headers(),
                    request.extensions(),
                )
            })
            .unwrap_or(self.routes.len() - 1);
        let route = &self.routes[route_idx];
        if route.exempt {
            return None;
        }
        if !route.tiers.is_empty() {
            let tier_fn = self.lists.tier_fn.as_ref();
            if let Some(tier) = tier_fn.and_then(|f| f(request)) {
                if let Some((_, set)) = route.tiers.iter().find(|(t, _)| t == tier) {
                    return Some(*set);
                }
            }
        }
        route.default_set
    }

    /// The default route's policy set, `None` when it is exempt.
    fn default_set(&self) -> Option<&Arc<PolicySet>> {
        self.routes
            .last()
            .and_then(|r| r.default_set)
            .map(|s| &self.sets[s])
    }
}

/// The policies one request is checked against (a route, or a route's tier).
pub(crate) struct PolicySet {
    /// The route's label in metrics: its pattern as declared, [`DEFAULT_ROUTE`], the
    /// pattern axum matched for an attached route, or [`ATTACHED_ROUTE`] when there is none;
    /// never a request's path.
    pub(crate) route: Arc<str>,
    pub(crate) enforced: Arc<[Policy]>,
    /// The in-flight policies among `enforced`: their slots are held until the response ends.
    pub(crate) in_flight: Arc<[Policy]>,
    /// The metered policies (their index in `enforced`) and how each is settled.
    pub(crate) meters: Box<[(usize, Meter)]>,
    /// Which requests count, from the response head: the others are refunded.
    pub(crate) count: Option<CountWhen>,
    shadow: Box<[Policy]>,
    /// Penalty policies, for the enforced policies that have a penalty (in that order).
    penalties: Box<[Policy]>,
    /// For each entry of `penalties`, the index of its policy in `enforced`.
    penalty_of: Box<[usize]>,
    cost: Cost,
    default_costs: SmallVec<[u64; 2]>,
    /// For which given costs `default_costs` can be charged instead.
    own_costs: OwnCosts,
    shadow_costs: SmallVec<[u64; 2]>,
    /// The keys of the decisions counter (feature `metrics`), built once per set.
    metric_keys: crate::telemetry::DecisionKeys,
    /// The route's (or the tier's) own key; `None`: the limiter's.
    key: Option<Arc<dyn KeyExtractor>>,
}

/// The `route` label of the default route's decisions.
pub(crate) const DEFAULT_ROUTE: &str = "default";
/// The `route` label of a route attached with [`Limiter::for_route`] when axum did not say
/// which pattern it matched (see [`attached`]).
pub(crate) const ATTACHED_ROUTE: &str = "for_route";

#[derive(Clone)]
struct CompiledRoute {
    exempt: bool,
    default_set: Option<usize>,
    tiers: Vec<(String, usize)>,
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
        let plan = self.plan();
        f.debug_struct("Limiter")
            .field("store", &self.inner.common.store)
            .field("policy_sets", &plan.sets.len())
            .field("routes", &plan.routes.len())
            .field("extractor", &plan.lists.extractor)
            .field("missing_key", &plan.lists.missing_key)
            .finish_non_exhaustive()
    }
}

impl Limiter<MemoryStore> {
    /// A builder using a fresh [`MemoryStore`] and the [`PeerIp`](crate::key::PeerIp)
    /// extractor until told otherwise.
    pub fn builder() -> LimiterBuilder<MemoryStore> {
        LimiterBuilder::new()
    }
}

impl<S> Limiter<S> {
    /// A limiter around `plan`, sharing `common`.
    fn from_parts(common: Arc<Common<S>>, plan: CompiledPlan) -> Self {
        let built = Arc::new(plan);
        Self {
            inner: Arc::new(LimiterInner {
                common,
                plan: ArcSwap::new(Arc::clone(&built)),
                built,
                reloaded: AtomicBool::new(false),
            }),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.common.store
    }
}

impl<S: Store> Limiter<S> {
    /// The default route's policies (for requests of no tier), in order; empty when the
    /// default route is exempt.
    pub fn policies(&self) -> Arc<[Policy]> {
        self.default_set()
            .map_or_else(|| Arc::from([]), |set| Arc::clone(&set.enforced))
    }

    /// The default route's policy set in the plan in force, `None` when it is exempt.
    fn default_set(&self) -> Option<Arc<PolicySet>> {
        self.plan().default_set().cloned()
    }

    /// The allow and deny lists, extractor and tier function in force.
    fn lists(&self) -> Arc<Lists> {
        Arc::clone(&self.plan().lists)
    }

    /// How many shadow-policy checks would have allowed and denied so far (shared by every
    /// limiter made with [`for_route`](Self::for_route)).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("api", Rate::per_minute(100))?)
    ///     .policy(Policy::builder("stricter", Rate::per_minute(1)).shadow(true).build()?)
    ///     .build()?;
    /// let key = Key::new("user", "1");
    /// assert!(limiter.check(&key, 1).await?.is_allowed());
    /// assert!(limiter.check(&key, 1).await?.is_allowed()); // the shadow policy would deny
    /// let counts = limiter.shadow_counts();
    /// assert_eq!((counts.allowed, counts.denied), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn shadow_counts(&self) -> ShadowCounts {
        self.inner.common.shadow.get()
    }

    /// The key for a request: the extractor's of the route the request matches (its
    /// [own key](crate::route::Route::key), if it names one) or the limiter's, or the shared
    /// anonymous key, or `None` when the request must be rejected for want of a key. This is
    /// the key [`decide`](Self::decide) and the layer decide the request by.
    ///
    /// See [`Route::key`](crate::route::Route::key) for an example.
    pub fn key_for(&self, request: &RequestView<'_>) -> Option<Key> {
        let plan = self.plan();
        let set = plan.resolve(request);
        plan.lists.key_for(set.as_deref().map(|s| &**s), request)
    }

    /// What [`check`](Self::check) with each policy's own cost (or the default route's
    /// [`cost`](crate::LimiterBuilder::cost), when it sets a fixed one) would answer now,
    /// charging nothing (a running penalty shows as a denial; lists apply as for `check`).
    ///
    /// # Errors
    ///
    /// [`CheckError::Forbidden`] or [`CheckError::Store`], as for `check`.
    pub async fn peek(&self, key: &Key) -> Result<Decision, CheckError> {
        let Some(set) = self.default_set() else {
            return Ok(Decision::pass());
        };
        let common = &self.inner.common;
        let lists = self.lists();
        if lists.deny.contains(key) {
            return Err(CheckError::Forbidden);
        }
        if lists.allow.contains(key) {
            return Ok(Decision::pass());
        }
        let costs = set.look_costs(None);
        if let Some(blocked) = self.running_block(key, &set, &costs).await? {
            return Ok(blocked);
        }
        Ok(common.store.peek(key, &set.enforced, &costs).await?)
    }

    /// Everything the layer decides for `request`, without HTTP: the route (as the route
    /// table matches it) and tier, the key, lists, cost, penalties and shadow policies.
    /// `Ok` with the decision when the request may go ahead (an exempt route or an
    /// allow-listed key gives an allowed decision with no policies), or the [`Refusal`] the
    /// layer would answer with.
    ///
    /// What the layer does after the response is not done here, since there is none: an
    /// admitted request stays charged whatever a route's counting rule
    /// ([`Route::count_when`](crate::route::Route::count_when)) or meter would say of its
    /// response, and an in-flight slot is given back at once. For those, use
    /// [`reserve`](Self::reserve) and tell its [`Reservation`] how the request ended
    /// ([`count`](Reservation::count), [`settle`](Reservation::settle)).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::{Global, RequestView}, route::Route, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .route("GET /search", Route::new().policy(Policy::new("search", Rate::per_minute(1))?))
    ///     .policy(Policy::new("other", Rate::per_minute(100))?)
    ///     .extractor(Global::new())
    ///     .build()?;
    /// let search = http::Request::get("/search").body(())?;
    /// assert!(limiter.decide(&RequestView::new(&search)).await.is_ok());
    /// // HEAD is served by GET handlers, so it counts against the GET route.
    /// let head = http::Request::head("/search").body(())?;
    /// let refusal = limiter.decide(&RequestView::new(&head)).await.unwrap_err();
    /// assert_eq!(refusal.policy().unwrap().name(), "search");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// The [`Refusal`] for any answer other than going ahead.
    pub async fn decide(&self, request: &RequestView<'_>) -> Result<Decision, Refusal> {
        let (outcome, pending) = match self.prepare(request) {
            Prepared::Pass => return Ok(Decision::pass()),
            Prepared::Refuse(refusal) => return Err(refusal),
            Prepared::Decided { outcome, pending } => (outcome, pending),
            Prepared::Check { future, pending } => (future.await, pending),
        };
        let Pending { set, key, reserved } = pending;
        let admitted: Result<Admitted, Refusal> =
            self.finish(Asker::Decide, &set, &key, outcome, reserved);
        let decision = admitted?.decision;
        if let Some(release) = self.give_back_at_once(&set, &key, &decision) {
            release.reported().await;
        }
        Ok(decision)
    }

    /// Forgets `key`'s state for every policy of this limiter (all routes and tiers,
    /// penalties and shadow policies included), of the limiters made from it with
    /// [`for_route`](Self::for_route), and, for one made that way, of the limiter it was
    /// made from.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn reset(&self, key: &Key) -> Result<(), CheckError> {
        // Marked before the store's reset (a give-back made while it runs would come off the
        // fresh count) and after it, or when it is given up (a charge made while it runs may
        // have been erased).
        let resets = &self.inner.common.resets;
        resets.mark(key);
        let _ends = ResetEnds(resets, key);
        self.reset_in_store(key).await
    }

    /// The moment of this limiter's resets now (shared with the limiters
    /// [`for_route`](Self::for_route) made from it): a reservation or a layer request reads it
    /// before its charge, and gives nothing back unless
    /// [`untouched_since`](Self::untouched_since) that moment — a reset of the key erased the
    /// charge, or may have, and a give-back would come off what was charged since.
    pub(crate) fn resets_seen(&self) -> u64 {
        self.inner.common.resets.now()
    }

    /// Whether no reset of `key` through this limiter (or one sharing its store by
    /// [`for_route`](Self::for_route)) has begun or ended since `seen`
    /// ([`resets_seen`](Self::resets_seen) read before a charge).
    pub(crate) fn untouched_since(&self, key: &Key, seen: u64) -> bool {
        self.inner.common.resets.untouched_since(key, seen)
    }

    async fn reset_in_store(&self, key: &Key) -> Result<(), CheckError> {
        let mut all: Vec<Policy> = vec![];
        let plan = self.plan();
        let attached = self.inner.common.attached_sets();
        for set in plan.sets.iter().chain(&attached) {
            for p in set
                .enforced
                .iter()
                .chain(set.shadow.iter())
                .chain(set.penalties.iter())
            {
                if !all.iter().any(|q| q.name() == p.name()) {
                    all.push(p.clone());
                }
            }
        }
        Ok(self.inner.common.store.reset(key, &all).await?)
    }

    /// A limiter for one route's policies, sharing this limiter's store, key extractor,
    /// lists, tier function and policy names: for attaching limits through axum's own router
    /// (`.route_layer(...)`), so that axum's routing — `HEAD` on `GET` routes, path
    /// parameters, nesting — decides which policy applies. The new limiter applies `route`
    /// to every request it sees (it has no route table of its own), keyed by the route's
    /// [own key](crate::route::Route::key) if it names one. Its decisions are labelled in
    /// metrics with the path pattern axum matched (`/reports/{id}`), or `for_route` when
    /// the request carries none (tonic, a direct [`decide`](Self::decide)).
    ///
    /// The limiter made stays known to this one while it lives: a
    /// [`reset`](Self::reset), an [override](Self::set_override) and the
    /// [effective plan](Self::effective_plan) reach its policies; a reset or an override
    /// through it reaches this one's (and its siblings'). Make it once per route, when
    /// the router is built.
    ///
    /// See [`RateLimitLayer::for_route`](crate::RateLimitLayer::for_route) for the layer and
    /// an example.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] as for [`LimiterBuilder::build`]: a route without policies, tiers
    /// without a tier function, a policy name already used for another definition.
    pub fn for_route(&self, route: Route) -> Result<Limiter<S>, ConfigError> {
        builder::attach(&self.inner.common, &self.lists(), route)
    }
}

impl CheckError {
    fn from_refusal(refusal: &Refusal) -> Self {
        match refusal.kind() {
            RefusalKind::Forbidden => CheckError::Forbidden,
            RefusalKind::CostExceedsCapacity => {
                let policy = refusal.policies().first();
                CheckError::CostExceedsCapacity {
                    policy: policy.map_or_else(String::new, |p| p.name().to_owned()),
                    cost: refusal.cost().unwrap_or(0),
                    capacity: refusal.capacity().unwrap_or(0),
                }
            }
            _ => CheckError::Store(crate::StoreError::Backend(crate::error::Cause::from(
                refusal.to_string(),
            ))),
        }
    }
}
