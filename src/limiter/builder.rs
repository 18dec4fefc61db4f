//! [`LimiterBuilder`]: turns routes and policies into the compiled tables the decision path
//! reads, refusing anything that would not be enforced as written.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::compile::compile_route;
use super::heavy_hitters::{HeavyHitters, DEFAULT_TOP_REFUSED_SLOTS, DEFAULT_TOP_REFUSED_WINDOW};
use super::{
    AccessList, Common, CompiledPlan, Limiter, Lists, MissingKey, PolicyNames, ResetLog,
    RouteTable, ShadowCounters, ATTACHED_ROUTE, DEFAULT_ROUTE,
};
use crate::error::ConfigError;
use crate::key::{Key, KeyExtractor, PeerIp, RequestView};
use crate::policy::Policy;
use crate::route::{Route, TierFn};
use crate::store::{MemoryStore, Store};

/// Builds a [`Limiter`]; [`build`](Self::build) refuses anything not enforced as written.
/// ```
/// use tollgate::{key::ApiKey, route::Route, store::MemoryStore, Limiter, Policy, Rate};
///
/// let limiter = Limiter::builder()
///     .store(MemoryStore::builder().max_keys(100_000).build()?)
///     .route("POST /export", Route::new().policy(Policy::new("export", Rate::per_hour(10))?))
///     .policy(Policy::new("api", Rate::per_second(10))?)
///     .extractor(ApiKey::new()) // X-API-Key or a bearer token, hashed
///     .build()?;
/// assert!(Limiter::builder().route("GET /x", Route::new()).build().is_err()); // no policy
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    shared_usage: Vec<String>,
    top_refused: (usize, Duration),
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

impl LimiterBuilder<MemoryStore> {
    pub(super) fn new() -> Self {
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
            shared_usage: Vec::new(),
            top_refused: (DEFAULT_TOP_REFUSED_SLOTS, DEFAULT_TOP_REFUSED_WINDOW),
        }
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
            shared_usage: self.shared_usage,
            top_refused: self.top_refused,
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

    /// Replaces the default route: the policies of requests that match no route. A limiter
    /// whose routes cover only some paths must say what happens to the others, either with
    /// default policies or explicitly with `default_route(Route::exempt())`:
    ///
    /// ```
    /// use tollgate::{route::Route, Limiter, Policy, Rate};
    ///
    /// let search = Route::new().policy(Policy::new("search", Rate::per_minute(10))?);
    /// let err = Limiter::builder().route("GET /search", search.clone()).build().unwrap_err();
    /// assert_eq!(err.field(), "policies");
    /// let limiter = Limiter::builder()
    ///     .route("GET /search", search)
    ///     .default_route(Route::exempt()) // every other path is not limited, on purpose
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn default_route(mut self, route: Route) -> Self {
        self.default_route = route;
        self
    }

    /// Attaches `route` to `pattern` (`"POST /login"`, `"/api/{*rest}"`); see
    /// [`crate::route`]. Patterns use axum 0.8's syntax (`{id}`, `{*rest}`); a `GET` route
    /// also covers `HEAD`, as axum serves `HEAD` with `GET` handlers.
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
    /// Routes with tiers need it: without one, building fails.
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

    /// Keys that skip limiting entirely (no check, no headers), on every path.
    pub fn allow_key(mut self, key: Key) -> Self {
        self.allow_keys.push(key);
        self
    }

    /// Keys refused at once with `403 Forbidden` (and [`CheckError::Forbidden`] from
    /// [`Limiter::check`]).
    ///
    /// [`CheckError::Forbidden`]: crate::CheckError::Forbidden
    pub fn deny_key(mut self, key: Key) -> Self {
        self.deny_keys.push(key);
        self
    }

    /// Client networks that skip limiting, e.g. `"10.0.0.0/8"`.
    ///
    /// A request is matched by its client address whatever key it gets, when the
    /// extractor reads one ([`KeyExtractor::client_addr`]: [`PeerIp`], `ClientIp`,
    /// `IpUserAgent`, or a chain or composite holding one). On the direct API
    /// ([`Limiter::check`]) an `ip` key is matched: an IPv6 key names its prefix (/56 by
    /// default), which passes only if the network holds all of it.
    pub fn allow_cidr(mut self, cidr: impl Into<String>) -> Self {
        self.allow_cidrs.push(cidr.into());
        self
    }

    /// Client networks refused at once with `403 Forbidden` (and
    /// [`CheckError::Forbidden`](crate::CheckError::Forbidden) from [`Limiter::check`]).
    ///
    /// A request is matched by its client address whatever key it gets, when the
    /// extractor reads one ([`KeyExtractor::client_addr`]: [`PeerIp`], `ClientIp`,
    /// `IpUserAgent`, or a chain or composite holding one), so a client inside the network
    /// cannot step out of it with a key of another kind (an extractor that reads no address,
    /// such as a [`from_fn`](crate::key::from_fn) closure keyed by user, leaves the networks
    /// to `ip` keys, and the limiter warns so when built). On the direct API an `ip` key is
    /// matched: an IPv6 key names its prefix (/56 by default), and a network narrower than
    /// that refuses the whole prefix it falls in (its addresses share one limit anyway). A
    /// [`deny_key`](Self::deny_key) of an `ip` key is a network of one address, matched the
    /// same way.
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

    /// Lets policies named `name` differ in their limit (and burst, cost, sensitivity)
    /// across routes and tiers while sharing one counter per key: a client moving from the
    /// `free` tier to `pro` keeps the usage it has. They must still agree on the algorithm
    /// and window, without which one state cannot serve both. Without this, two different
    /// definitions under one name are a build error.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::{Key, RequestView}, route::Route, Limiter, Policy, Rate};
    ///
    /// let free = Policy::new("api", Rate::per_minute(2))?;
    /// let pro = Policy::new("api", Rate::per_minute(100))?;
    /// let build = |share: bool| {
    ///     let b = Limiter::builder()
    ///         .default_route(Route::new().policy(free.clone()).tier("pro", [pro.clone()]))
    ///         .tier_fn(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()));
    ///     if share { b.share_usage("api") } else { b }.build()
    /// };
    /// assert!(build(false).is_err()); // two definitions of "api"
    /// let limiter = build(true)?;
    /// let req = http::Request::get("/").header("x-plan", "pro").body(())?;
    /// # let _ = (limiter, req);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn share_usage(mut self, name: impl Into<String>) -> Self {
        self.shared_usage.push(name.into());
        self
    }

    /// How many keys the sketch behind [`Limiter::top_refused`] tracks per period (default
    /// [`DEFAULT_TOP_REFUSED_SLOTS`], 64); 0 turns it off. Memory is bounded by the slots,
    /// whatever the traffic; see `top_refused` for the bounds on counts.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("api", Rate::per_minute(100))?)
    ///     .top_refused(256)
    ///     .build()?;
    /// assert!(limiter.top_refused(10).is_empty());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn top_refused(mut self, slots: usize) -> Self {
        self.top_refused.0 = slots;
        self
    }

    /// How long a period of [`Limiter::top_refused`] lasts (default
    /// [`DEFAULT_TOP_REFUSED_WINDOW`], 5 minutes): counts cover the current period and the
    /// previous one, so a key that stopped being refused drops off within two periods.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("api", Rate::per_minute(100))?)
    ///     .top_refused_window(Duration::from_secs(60))
    ///     .build()?;
    /// # let _ = limiter;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn top_refused_window(mut self, window: Duration) -> Self {
        self.top_refused.1 = window;
        self
    }
}

impl<S: Store> LimiterBuilder<S> {
    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field, for anything that would not be enforced as
    /// written: no policies and no explicitly exempt default route; a route without policies
    /// (use [`Route::exempt`]); tiers without a [`tier_fn`](Self::tier_fn), or without
    /// untiered policies for requests of no tier; two policies of one route sharing a name;
    /// one name with two definitions (see [`share_usage`](Self::share_usage)); a bad route
    /// pattern (including axum 0.7's `:id` and `*rest`); a fixed cost above a policy's
    /// capacity; a bad CIDR.
    pub fn build(self) -> Result<Limiter<S>, ConfigError> {
        let mut names = PolicyNames {
            declared: Default::default(),
            shared_usage: self.shared_usage,
        };
        let has_tier_fn = self.tier_fn.is_some();
        let mut sets = vec![];
        let mut routes = vec![];
        let mut patterns = vec![];
        for (i, (pattern, route)) in self.routes.iter().enumerate() {
            let field = format!("routes[{i}]");
            let here = format!("route {pattern:?}");
            let label = Arc::from(pattern.as_str());
            let compiled = compile_route(
                (&field, &here, label),
                route,
                has_tier_fn,
                &mut sets,
                &mut names,
            )?;
            routes.push(compiled);
            patterns.push((pattern.clone(), i));
        }
        let table = if patterns.is_empty() {
            None
        } else {
            Some(RouteTable::build(&patterns)?)
        };
        let default = &self.default_route;
        if !default.exempt && default.policies.is_empty() && default.tiers.is_empty() {
            return Err(ConfigError::new(
                "policies",
                "[]",
                if self.routes.is_empty() {
                    "a limiter needs at least one policy"
                } else {
                    "requests that match no route would not be limited: give the default route \
                     a policy (LimiterBuilder::policy), or say so explicitly with \
                     LimiterBuilder::default_route(Route::exempt())"
                },
            ));
        }
        // The default route goes last; its errors read as the builder's own fields.
        routes.push(compile_route(
            ("", "the default route", Arc::from(DEFAULT_ROUTE)),
            default,
            has_tier_fn,
            &mut sets,
            &mut names,
        )?);
        let allow = AccessList::new(
            self.allow_keys,
            "allow_cidrs",
            &self.allow_cidrs,
            super::access::Side::Allow,
        )?;
        let deny = AccessList::new(
            self.deny_keys,
            "deny_cidrs",
            &self.deny_cidrs,
            super::access::Side::Deny,
        )?;
        let store = match (self.store, self.make_store) {
            (Some(store), _) => store,
            (None, Some(make)) => make(),
            (None, None) => {
                return Err(ConfigError::new("store", "none", "a limiter needs a store"));
            }
        };
        failure_modes_applied(&store, &sets)?;
        let common = Arc::new(Common {
            store,
            shadow: ShadowCounters::default(),
            names: Mutex::new(names),
            top_refused: HeavyHitters::new(self.top_refused.0, self.top_refused.1),
            resets: ResetLog::new(),
            source: Mutex::new(None),
            attached: Mutex::new(Vec::new()),
            root: std::sync::OnceLock::new(),
            attached_limiters: Mutex::new(Vec::new()),
            layer_headers: std::sync::OnceLock::new(),
        });
        let lists = Arc::new(Lists {
            extractor: self.extractor.unwrap_or_else(|| Box::new(PeerIp::new())),
            missing_key: self.missing_key,
            tier_fn: self.tier_fn,
            allow,
            deny,
        });
        lists.warn_if_networks_unread();
        let limiter = Limiter::from_parts(
            common,
            CompiledPlan {
                sets: sets.into_iter().map(Arc::new).collect(),
                routes,
                table,
                lists,
                attached: None,
            },
        );
        let _ = limiter
            .inner
            .common
            .root
            .set(Arc::downgrade(&limiter.inner));
        Ok(limiter)
    }
}

/// Refuses a policy's own failure mode when `store` would never read it: only a store that
/// answers by failure modes ([`Store::applies_failure_modes`]) does.
fn failure_modes_applied<S: Store>(
    store: &S,
    sets: &[super::PolicySet],
) -> Result<(), ConfigError> {
    if store.applies_failure_modes() {
        return Ok(());
    }
    for set in sets {
        let policies = set.enforced.iter().chain(set.shadow.iter());
        if let Some((p, mode)) = policies.filter_map(|p| Some((p, p.failure_mode()?))).next() {
            let route = if &*set.route == DEFAULT_ROUTE {
                "the default route".to_owned()
            } else {
                format!("route {:?}", set.route)
            };
            return Err(ConfigError::new(
                format!("policies[{:?}].failure_mode", p.name()),
                format_args!("{mode:?}"),
                format!(
                    "policy {:?} of {route} sets a failure mode, but the store ({}) never \
                     answers by one, so nothing would read it: wrap the store in \
                     ResilientStore, or drop the setting",
                    p.name(),
                    store.name()
                ),
            ));
        }
    }
    Ok(())
}

/// A limiter applying `route` to every request, sharing `common`; see
/// [`Limiter::for_route`].
pub(super) fn attach<S: Store>(
    common: &Arc<Common<S>>,
    lists: &Arc<Lists>,
    route: Route,
) -> Result<Limiter<S>, ConfigError> {
    let mut sets = vec![];
    let has_tier_fn = lists.tier_fn.is_some();
    // Checked against a copy: a route refused for its names leaves no trace of them.
    let mut names = common.names.lock().unwrap_or_else(|e| e.into_inner());
    let mut trial = PolicyNames {
        declared: names.declared.clone(),
        shared_usage: names.shared_usage.clone(),
    };
    let compiled = compile_route(
        ("route", "the route", Arc::from(ATTACHED_ROUTE)),
        &route,
        has_tier_fn,
        &mut sets,
        &mut trial,
    )?;
    failure_modes_applied(&common.store, &sets)?;
    *names = trial;
    let sets: Vec<Arc<super::PolicySet>> = sets.into_iter().map(Arc::new).collect();
    common.register_attached(&compiled, &sets);
    let limiter = Limiter::from_parts(
        Arc::clone(common),
        CompiledPlan {
            sets,
            routes: vec![compiled],
            table: None,
            lists: Arc::clone(lists),
            attached: Some(Arc::default()),
        },
    );
    common.register_attached_limiter(&limiter.inner);
    Ok(limiter)
}
