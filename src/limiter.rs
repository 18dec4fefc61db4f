//! [`Limiter`]: routes and policies + key extractor + store, usable with or without HTTP.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ipnet::IpNet;
use smallvec::SmallVec;

use crate::decision::Decision;
use crate::error::{CheckError, ConfigError, StoreError};
use crate::key::{Key, KeyExtractor, PeerIp, RequestView};
use crate::policy::Policy;
use crate::route::{Cost, Route, RouteTable, TierFn};
use crate::store::{BoxFuture, MemoryStore, Store};

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

/// Decides requests: a route table of policies, a key extractor and a store.
///
/// Cheap to clone (clones share everything). Use it directly — background jobs, websocket
/// messages, the login helper — or wrap it in a [`RateLimitLayer`](crate::RateLimitLayer).
/// See [`crate::route`] for per-route policies, tiers and costs.
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

/// The policies one request is checked against (a route, or a route's tier).
pub(crate) struct PolicySet {
    pub(crate) enforced: Box<[Policy]>,
    pub(crate) shadow: Box<[Policy]>,
    /// Penalty policies, for the enforced policies that have a penalty (in that order).
    pub(crate) penalties: Box<[Policy]>,
    /// For each entry of `penalties`, the index of its policy in `enforced`.
    pub(crate) penalty_of: Box<[usize]>,
    pub(crate) cost: Cost,
    pub(crate) default_costs: SmallVec<[u64; 2]>,
    pub(crate) shadow_costs: SmallVec<[u64; 2]>,
}

struct CompiledRoute {
    exempt: bool,
    default_set: Option<usize>,
    tiers: Vec<(String, usize)>,
}

#[derive(Default)]
struct AccessList {
    keys: HashSet<Key>,
    nets: Vec<IpNet>,
}

impl AccessList {
    fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.nets.is_empty()
    }

    fn contains(&self, key: &Key) -> bool {
        if self.keys.contains(key) {
            return true;
        }
        if self.nets.is_empty() || key.source() != "ip" {
            return false;
        }
        let material = &key.as_str()["ip:".len()..];
        let net = match material.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => match material.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => return false,
            },
        };
        self.nets.iter().any(|n| n.contains(&net))
    }
}

struct LimiterInner<S> {
    store: S,
    sets: Vec<PolicySet>,
    routes: Vec<CompiledRoute>,
    table: Option<RouteTable>,
    extractor: Box<dyn KeyExtractor>,
    missing_key: MissingKey,
    tier_fn: Option<Arc<TierFn>>,
    allow: AccessList,
    deny: AccessList,
    shadow_allowed: AtomicU64,
    shadow_denied: AtomicU64,
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
            .field("policy_sets", &self.inner.sets.len())
            .field("routes", &self.inner.routes.len())
            .field("extractor", &self.inner.extractor)
            .field("missing_key", &self.inner.missing_key)
            .finish_non_exhaustive()
    }
}

/// What the layer should do with a request, decided before any store call completes.
pub(crate) enum Prepared<F> {
    /// Exempt route, allow-listed key, or a route without policies: pass, no headers.
    Pass,
    /// Deny-listed key: 403.
    Forbidden,
    /// No key and [`MissingKey::Reject`]: 400.
    MissingKey,
    /// A computed cost above a policy's capacity.
    TooCostly(CheckError),
    /// The store answered at once ([`Store::check_now`]); render with policy set `set`.
    /// `key` is kept only when decisions are traced.
    Decided {
        set: usize,
        outcome: Result<Decision, StoreError>,
        key: Option<Key>,
    },
    /// Ask the store; render with policy set `set`. `key` is kept only when decisions are
    /// traced.
    Check {
        set: usize,
        future: CheckFuture<F>,
        key: Option<Key>,
    },
}

pin_project_lite::pin_project! {
    /// The store call of one request: the store's own future, or a boxed one when penalties
    /// need more than one call.
    #[project = CheckFutureProj]
    pub(crate) enum CheckFuture<F> {
        Direct { #[pin] future: F },
        Boxed { future: BoxFuture<Result<Decision, StoreError>> },
    }
}

impl<F> std::future::Future for CheckFuture<F>
where
    F: std::future::Future<Output = Result<Decision, StoreError>>,
{
    type Output = Result<Decision, StoreError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.project() {
            CheckFutureProj::Direct { future } => future.poll(cx),
            CheckFutureProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl Limiter<MemoryStore> {
    /// A builder using a fresh [`MemoryStore`] and the [`PeerIp`] extractor until told
    /// otherwise.
    pub fn builder() -> LimiterBuilder<MemoryStore> {
        LimiterBuilder {
            store: None,
            make_store: Some(MemoryStore::new),
            default_route: Route::new(),
            routes: Vec::new(),
            extractor: None,
            missing_key: MissingKey::default(),
            tier_fn: None,
            allow_keys: Vec::new(),
            deny_keys: Vec::new(),
            allow_cidrs: Vec::new(),
            deny_cidrs: Vec::new(),
        }
    }
}

impl<S> Limiter<S> {
    pub(crate) fn set(&self, id: usize) -> &PolicySet {
        &self.inner.sets[id]
    }
}

impl<S: Store> Limiter<S> {
    /// The default route's policies (for requests of no tier), in order.
    pub fn policies(&self) -> &[Policy] {
        self.default_set().map_or(&[], |s| &s.enforced)
    }

    fn default_set(&self) -> Option<&PolicySet> {
        let route = self.inner.routes.last()?;
        route.default_set.map(|i| &self.inner.sets[i])
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// How many shadow-policy checks would have allowed and denied so far.
    pub fn shadow_counts(&self) -> (u64, u64) {
        (
            self.inner.shadow_allowed.load(Ordering::Relaxed),
            self.inner.shadow_denied.load(Ordering::Relaxed),
        )
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

    /// Checks `key` against the default route's policies, charging `cost` units to each —
    /// all of them or none.
    ///
    /// # Errors
    ///
    /// [`CheckError::CostExceedsCapacity`] when `cost` exceeds a policy's capacity (such a
    /// request could never pass, and charging it must not lock the key out),
    /// [`CheckError::NoPolicies`] when the limiter has only per-route policies, and
    /// [`CheckError::Store`] when the store fails.
    pub async fn check(&self, key: &Key, cost: u64) -> Result<Decision, CheckError> {
        let set = self.default_set().ok_or(CheckError::NoPolicies)?;
        let costs: SmallVec<[u64; 2]> = set.enforced.iter().map(|_| cost).collect();
        validate_costs(&set.enforced, &costs)?;
        Ok(self.inner.store.check(key, &set.enforced, &costs).await?)
    }

    /// What [`check`](Self::check) with each policy's own cost would answer now, charging
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`CheckError::NoPolicies`] or [`CheckError::Store`], as for `check`.
    pub async fn peek(&self, key: &Key) -> Result<Decision, CheckError> {
        let set = self.default_set().ok_or(CheckError::NoPolicies)?;
        Ok(self
            .inner
            .store
            .peek(key, &set.enforced, &set.default_costs)
            .await?)
    }

    /// Forgets `key`'s state for every policy of this limiter (all routes and tiers,
    /// penalties included).
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn reset(&self, key: &Key) -> Result<(), CheckError> {
        let mut all: Vec<Policy> = vec![];
        for set in &self.inner.sets {
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
        Ok(self.inner.store.reset(key, &all).await?)
    }

    /// Resolves a request to the policy set that applies, or `None` when it is exempt.
    fn resolve(&self, request: &RequestView<'_>) -> Option<usize> {
        let inner = &*self.inner;
        let route_idx = inner
            .table
            .as_ref()
            .and_then(|t| t.lookup(request.method(), request.uri().path()))
            .unwrap_or(inner.routes.len() - 1);
        let route = &inner.routes[route_idx];
        if route.exempt {
            return None;
        }
        if !route.tiers.is_empty() {
            if let Some(tier) = inner.tier_fn.as_ref().and_then(|f| f(request)) {
                if let Some((_, set)) = route.tiers.iter().find(|(t, _)| t == tier) {
                    return Some(*set);
                }
            }
        }
        route.default_set
    }

    /// Everything the layer does before the store answers.
    pub(crate) fn prepare(&self, request: &RequestView<'_>) -> Prepared<S::CheckFuture> {
        let Some(set_id) = self.resolve(request) else {
            return Prepared::Pass;
        };
        let Some(key) = self.key_for(request) else {
            return Prepared::MissingKey;
        };
        let inner = &*self.inner;
        if !inner.deny.is_empty() && inner.deny.contains(&key) {
            return Prepared::Forbidden;
        }
        if !inner.allow.is_empty() && inner.allow.contains(&key) {
            return Prepared::Pass;
        }
        let set = &inner.sets[set_id];
        // A computed cost is asked of the request once, for shadow and enforced policies alike.
        let cost = match &set.cost {
            Cost::PolicyDefault => None,
            Cost::Fixed(c) => Some(*c),
            Cost::Computed(f) => Some(f(request)),
        };
        if !set.shadow.is_empty() {
            self.spawn_shadow_check(&key, set, cost);
        }
        if set.enforced.is_empty() {
            return Prepared::Pass;
        }
        // The policies' own costs are borrowed, not copied: the common case, on every request.
        let given: SmallVec<[u64; 2]>;
        let costs: &[u64] = match cost {
            None => &set.default_costs,
            Some(c) => {
                given = set.enforced.iter().map(|_| c).collect();
                &given
            }
        };
        if let Cost::Computed(_) = set.cost {
            if let Err(e) = validate_costs(&set.enforced, costs) {
                return Prepared::TooCostly(e);
            }
        }
        let traced = tracing::enabled!(target: "tollgate::decision", tracing::Level::DEBUG);
        let traced_key = traced.then(|| key.clone());
        let future = if set.penalties.is_empty() {
            if let Some(outcome) = inner.store.check_now(&key, &set.enforced, costs) {
                return Prepared::Decided {
                    set: set_id,
                    outcome,
                    key: traced_key,
                };
            }
            CheckFuture::Direct {
                future: inner.store.check(&key, &set.enforced, costs),
            }
        } else {
            CheckFuture::Boxed {
                future: Box::pin(self.clone().check_with_penalties(
                    key,
                    set_id,
                    SmallVec::from_slice(costs),
                )),
            }
        };
        Prepared::Check {
            set: set_id,
            future,
            key: traced_key,
        }
    }

    /// Penalties: refuse while a block runs; start a block when a penalised policy denies.
    async fn check_with_penalties(
        self,
        key: Key,
        set_id: usize,
        costs: SmallVec<[u64; 2]>,
    ) -> Result<Decision, StoreError> {
        let set = &self.inner.sets[set_id];
        let store = &self.inner.store;
        let ones: SmallVec<[u64; 2]> = set.penalties.iter().map(|_| 1).collect();
        let blocks = store.peek(&key, &set.penalties, &ones).await?;
        if !blocks.is_allowed() {
            let current = store.peek(&key, &set.enforced, &costs).await?;
            let (j, block) = blocks
                .policies()
                .iter()
                .enumerate()
                .filter(|(_, d)| !d.is_allowed())
                .max_by_key(|(_, d)| d.retry_after_millis())
                .map(|(j, d)| (j, *d))
                .unwrap_or((0, blocks.policies()[0]));
            return Ok(current.blocked(set.penalty_of[j], block.retry_after_millis()));
        }
        let decision = store.check(&key, &set.enforced, &costs).await?;
        if !decision.is_allowed() {
            // The penalised policies that denied: start their blocks.
            let (denied_at, start): (Vec<usize>, Vec<Policy>) = set
                .penalty_of
                .iter()
                .zip(set.penalties.iter())
                .filter(|(&i, _)| !decision.policies()[i].is_allowed())
                .map(|(&i, p)| (i, p.clone()))
                .unzip();
            if let (Some(&index), Some(first)) = (denied_at.first(), start.first()) {
                let ones = vec![1; start.len()];
                store.check(&key, &start, &ones).await?;
                let penalty_ms = first.window_millis();
                return Ok(decision.blocked(index, penalty_ms));
            }
        }
        Ok(decision)
    }

    fn spawn_shadow_check(&self, key: &Key, set: &PolicySet, cost: Option<u64>) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let costs: SmallVec<[u64; 2]> = match cost {
            None => set.shadow_costs.clone(),
            Some(c) => set.shadow.iter().map(|p| c.min(p.capacity())).collect(),
        };
        let future = self.inner.store.check(key, &set.shadow, &costs);
        let this = self.clone();
        let key = key.clone();
        let names: Vec<String> = set.shadow.iter().map(|p| p.name().to_owned()).collect();
        handle.spawn(async move {
            match future.await {
                Ok(d) if d.is_allowed() => {
                    this.inner.shadow_allowed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(d) => {
                    this.inner.shadow_denied.fetch_add(1, Ordering::Relaxed);
                    let policy = names.get(d.governing_index()).map_or("", String::as_str);
                    let digest = crate::key::digest(&key);
                    let retry_after_ms = d.retry_after_millis();
                    tracing::event!(
                        target: "tollgate::shadow",
                        tracing::Level::INFO,
                        ratelimit.policy = policy,
                        ratelimit.key = digest.as_str(),
                        ratelimit.retry_after_ms = retry_after_ms,
                        "shadow policy would have denied this request"
                    );
                }
                Err(error) => {
                    tracing::warn!(target: "tollgate::shadow", %error, "shadow check failed");
                }
            }
        });
    }
}

fn validate_costs(policies: &[Policy], costs: &[u64]) -> Result<(), CheckError> {
    for (p, &c) in policies.iter().zip(costs) {
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

/// Builds a [`Limiter`]; see [`Limiter::builder`].
#[must_use]
pub struct LimiterBuilder<S> {
    store: Option<S>,
    make_store: Option<fn() -> S>,
    default_route: Route,
    routes: Vec<(String, Route)>,
    extractor: Option<Box<dyn KeyExtractor>>,
    missing_key: MissingKey,
    tier_fn: Option<Arc<TierFn>>,
    allow_keys: Vec<Key>,
    deny_keys: Vec<Key>,
    allow_cidrs: Vec<String>,
    deny_cidrs: Vec<String>,
}

impl<S: fmt::Debug> fmt::Debug for LimiterBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimiterBuilder")
            .field("store", &self.store)
            .field("default_route", &self.default_route)
            .field("routes", &self.routes)
            .field("extractor", &self.extractor)
            .field("missing_key", &self.missing_key)
            .finish_non_exhaustive()
    }
}

impl<S> LimiterBuilder<S> {
    /// The store (default: a new [`MemoryStore`]).
    pub fn store<S2: Store>(self, store: S2) -> LimiterBuilder<S2> {
        LimiterBuilder {
            store: Some(store),
            make_store: None,
            default_route: self.default_route,
            routes: self.routes,
            extractor: self.extractor,
            missing_key: self.missing_key,
            tier_fn: self.tier_fn,
            allow_keys: self.allow_keys,
            deny_keys: self.deny_keys,
            allow_cidrs: self.allow_cidrs,
            deny_cidrs: self.deny_cidrs,
        }
    }

    /// Adds a policy to the default route (requests that match no route). A request passes
    /// only if every policy allows it, and a denied request is charged to none of them.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.default_route = self.default_route.policy(policy);
        self
    }

    /// Adds several policies to the default route.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.default_route = self.default_route.policies(policies);
        self
    }

    /// Policies of the default route for requests of `tier`; see [`Route::tier`].
    pub fn tier(
        mut self,
        tier: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.default_route = self.default_route.tier(tier, policies);
        self
    }

    /// Sets the cost of the default route's requests; see [`Route::cost`].
    pub fn cost(mut self, cost: u64) -> Self {
        self.default_route = self.default_route.cost(cost);
        self
    }

    /// Replaces the default route.
    pub fn default_route(mut self, route: Route) -> Self {
        self.default_route = route;
        self
    }

    /// Attaches `route` to `pattern` (`"POST /login"`, `"/api/{*rest}"`); see
    /// [`crate::route`].
    pub fn route(mut self, pattern: impl Into<String>, route: Route) -> Self {
        self.routes.push((pattern.into(), route));
        self
    }

    /// Exempts `pattern` from limiting (`"/health"`).
    pub fn exempt(self, pattern: impl Into<String>) -> Self {
        self.route(pattern, Route::exempt())
    }

    /// How a request's tier is found (e.g. from a header or an auth extension); requests
    /// without a tier, or with one a route does not name, get the route's untiered policies.
    pub fn tier_fn<F>(mut self, f: F) -> Self
    where
        F: for<'a> Fn(&RequestView<'a>) -> Option<&'a str> + Send + Sync + 'static,
    {
        self.tier_fn = Some(Arc::new(f));
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

    /// Keys that skip limiting entirely (no check, no headers).
    pub fn allow_key(mut self, key: Key) -> Self {
        self.allow_keys.push(key);
        self
    }

    /// Keys refused at once with `403 Forbidden`.
    pub fn deny_key(mut self, key: Key) -> Self {
        self.deny_keys.push(key);
        self
    }

    /// Client networks (for IP keys) that skip limiting, e.g. `"10.0.0.0/8"`.
    pub fn allow_cidr(mut self, cidr: impl Into<String>) -> Self {
        self.allow_cidrs.push(cidr.into());
        self
    }

    /// Client networks (for IP keys) refused at once with `403 Forbidden`.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Rate};
    ///
    /// let err = Limiter::builder()
    ///     .policy(Policy::new("api", Rate::per_minute(60))?)
    ///     .deny_cidr("203.0.113.0/33")
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), "deny_cidrs[0]");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn deny_cidr(mut self, cidr: impl Into<String>) -> Self {
        self.deny_cidrs.push(cidr.into());
        self
    }
}

fn parse_cidrs(field: &str, cidrs: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    cidrs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.trim();
            c.parse::<IpNet>()
                .or_else(|_| c.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    ConfigError::new(
                        format!("{field}[{i}]"),
                        format_args!("{c:?}"),
                        "not an IP network (expected e.g. 10.0.0.0/8 or 2001:db8::/32)",
                    )
                })
        })
        .collect()
}

fn compile_set(
    field: &str,
    policies: &[Policy],
    cost: &Cost,
    sets: &mut Vec<PolicySet>,
) -> Result<Option<usize>, ConfigError> {
    if policies.is_empty() {
        return Ok(None);
    }
    for (i, p) in policies.iter().enumerate() {
        if policies[..i].iter().any(|q| q.name() == p.name()) {
            return Err(ConfigError::new(
                format!("{field}[{i}].name"),
                format_args!("{:?}", p.name()),
                "two policies of one route share a name; their state would collide",
            ));
        }
    }
    let enforced: Box<[Policy]> = policies
        .iter()
        .filter(|p| !p.is_shadow())
        .cloned()
        .collect();
    let shadow: Box<[Policy]> = policies.iter().filter(|p| p.is_shadow()).cloned().collect();
    if let Cost::Fixed(c) = cost {
        for p in enforced.iter() {
            if *c == 0 || *c > p.capacity() {
                return Err(ConfigError::new(
                    format!("{field}.cost"),
                    c,
                    format!(
                        "must be between 1 and the capacity of policy \"{}\" ({})",
                        p.name(),
                        p.capacity()
                    ),
                ));
            }
        }
    }
    let (penalty_of, penalties): (Vec<usize>, Vec<Policy>) = enforced
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.penalty_policy().map(|pp| (i, pp)))
        .unzip();
    sets.push(PolicySet {
        default_costs: enforced.iter().map(Policy::cost).collect(),
        shadow_costs: shadow.iter().map(Policy::cost).collect(),
        enforced,
        shadow,
        penalties: penalties.into_boxed_slice(),
        penalty_of: penalty_of.into_boxed_slice(),
        cost: cost.clone(),
    });
    Ok(Some(sets.len() - 1))
}

fn compile_route(
    field: &str,
    route: &Route,
    sets: &mut Vec<PolicySet>,
) -> Result<CompiledRoute, ConfigError> {
    if route.exempt {
        return Ok(CompiledRoute {
            exempt: true,
            default_set: None,
            tiers: vec![],
        });
    }
    let default_set = compile_set(
        &format!("{field}.policies"),
        &route.policies,
        &route.cost,
        sets,
    )?;
    let mut tiers = vec![];
    for (i, (tier, policies)) in route.tiers.iter().enumerate() {
        if route.tiers[..i].iter().any(|(t, _)| t == tier) {
            return Err(ConfigError::new(
                format!("{field}.tiers[{i}]"),
                format_args!("{tier:?}"),
                "the same tier appears twice",
            ));
        }
        if let Some(set) = compile_set(
            &format!("{field}.tiers.{tier}"),
            policies,
            &route.cost,
            sets,
        )? {
            tiers.push((tier.clone(), set));
        }
    }
    Ok(CompiledRoute {
        exempt: false,
        default_set,
        tiers,
    })
}

impl<S: Store> LimiterBuilder<S> {
    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field: no policies anywhere, two policies of one route
    /// sharing a name, a bad route pattern, a fixed cost above a policy's capacity, a bad
    /// CIDR.
    pub fn build(self) -> Result<Limiter<S>, ConfigError> {
        let no_policies = |r: &Route| r.policies.is_empty() && r.tiers.is_empty();
        if no_policies(&self.default_route) && self.routes.iter().all(|(_, r)| no_policies(r)) {
            return Err(ConfigError::new(
                "policies",
                "[]",
                "a limiter needs at least one policy",
            ));
        }
        let mut sets = vec![];
        let mut routes = vec![];
        let mut patterns = vec![];
        for (i, (pattern, route)) in self.routes.iter().enumerate() {
            routes.push(compile_route(&format!("routes[{i}]"), route, &mut sets)?);
            patterns.push((pattern.clone(), i));
        }
        // The default route goes last.
        routes.push(
            compile_route("default", &self.default_route, &mut sets).map_err(|e| {
                // Errors on the default route read as the builder's own fields.
                let field = e.field().trim_start_matches("default.").to_owned();
                ConfigError::new(field, e.value(), e.reason())
            })?,
        );
        let table = if patterns.is_empty() {
            None
        } else {
            Some(RouteTable::build(&patterns)?)
        };
        let allow = AccessList {
            keys: self.allow_keys.into_iter().collect(),
            nets: parse_cidrs("allow_cidrs", &self.allow_cidrs)?,
        };
        let deny = AccessList {
            keys: self.deny_keys.into_iter().collect(),
            nets: parse_cidrs("deny_cidrs", &self.deny_cidrs)?,
        };
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
                sets,
                routes,
                table,
                extractor: self.extractor.unwrap_or_else(|| Box::new(PeerIp::new())),
                missing_key: self.missing_key,
                tier_fn: self.tier_fn,
                allow,
                deny,
                shadow_allowed: AtomicU64::new(0),
                shadow_denied: AtomicU64::new(0),
            }),
        })
    }
}
