//! Per-route policies: which policies (and cost) apply to which requests.
//!
//! A [`Limiter`](crate::Limiter) holds a route table: patterns like `POST /login`,
//! `/api/{*rest}` or `/search` (a method is optional; without one the route applies to every
//! method), each with a [`Route`] — policies, per-tier policies, a cost — or exempt from limiting
//! altogether. Requests that match no pattern get the default route (the policies given to
//! [`LimiterBuilder::policy`](crate::LimiterBuilder::policy)).
//!
//! Matching uses [`matchit`] (axum's router) with axum 0.8's syntax: the most specific path
//! pattern wins — static segments over `{param}` segments over `{*catch_all}` — and within
//! the winning pattern a route for the request's method beats one for any method. A `GET`
//! route also covers `HEAD` (axum serves `HEAD` with `GET` handlers) unless a `HEAD` route is
//! declared. If the winning pattern has no route for the method, the default route applies.
//! gRPC methods are paths too (`/package.Service/Method`). axum 0.7's `:id` and `*rest` are
//! build errors naming the `{id}` / `{*rest}` form (matchit would match them literally).
//!
//! What is declared is enforced: a route without policies is a build error (use
//! [`Route::exempt`]), tiers need [`LimiterBuilder::tier_fn`](crate::LimiterBuilder::tier_fn)
//! and untiered policies, and when routes cover only some paths the default route needs
//! policies or an explicit `default_route(Route::exempt())`.
//!
//! To let axum's router decide instead, attach one route's policies with
//! [`RateLimitLayer::for_route`](crate::RateLimitLayer::for_route) and `route_layer`.
//!
//! # Examples
//!
//! ```
//! use tollgate::{Algorithm, Limiter, Policy, Rate, route::Route};
//!
//! let login = Policy::builder("login", Rate::per_minute(5)).sensitive(true).build()?;
//! let reads = Policy::new("reads", Rate::per_minute(1000))?;
//! let burst = Policy::new("burst", Rate::per_second(10))?;
//! let daily = Policy::new("daily", Rate::per_day(10_000))?;
//! let llm = Policy::builder("llm", Rate::per_minute(100).with_burst(200))
//!     .algorithm(Algorithm::TokenBucket)
//!     .build()?;
//!
//! let limiter = Limiter::builder()
//!     .policy(reads)                                            // the default route
//!     .route("POST /login", Route::new().policy(login))
//!     .route("/api/{*rest}", Route::new().policy(burst).policy(daily)) // both must pass
//!     .route("POST /v1/completions", Route::new().policy(llm).cost(10))
//!     .exempt("/health")
//!     .build()?;
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::fmt;
use std::sync::Arc;

use crate::key::RequestView;
use crate::policy::Policy;

/// Computes a request's cost.
pub type CostFn = dyn Fn(&RequestView<'_>) -> u64 + Send + Sync;

/// Resolves a request's tier (plan), e.g. `free`, `pro`, `internal`.
pub type TierFn = dyn for<'a> Fn(&RequestView<'a>) -> Option<&'a str> + Send + Sync;

/// How much a request costs.
#[derive(Clone, Default)]
pub enum Cost {
    /// Each policy's own [`cost`](crate::PolicyBuilder::cost) (default 1).
    #[default]
    PolicyDefault,
    /// The same cost for every policy of the route.
    Fixed(u64),
    /// Computed from the request. A cost above a policy's capacity is refused with a 429 that
    /// says so (no `Retry-After`: waiting would not help).
    Computed(Arc<CostFn>),
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cost::PolicyDefault => f.write_str("PolicyDefault"),
            Cost::Fixed(c) => write!(f, "Fixed({c})"),
            Cost::Computed(_) => f.write_str("Computed(..)"),
        }
    }
}

/// What applies to the requests a route pattern matches. See the
/// [module docs](crate::route).
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct Route {
    pub(crate) exempt: bool,
    pub(crate) policies: Vec<Policy>,
    pub(crate) tiers: Vec<(String, Vec<Policy>)>,
    pub(crate) cost: Cost,
}

impl Route {
    /// A route with no policies yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A route that skips limiting entirely (no check, no headers).
    pub fn exempt() -> Self {
        Self {
            exempt: true,
            ..Self::default()
        }
    }

    /// Adds a policy. Every policy of a route must allow a request, and a denied request is
    /// charged to none of them. With tiers, these policies apply to requests whose tier is
    /// unknown or has no policies of its own.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Adds several policies.
    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// The policies for requests of `tier` (as resolved by
    /// [`LimiterBuilder::tier_fn`](crate::LimiterBuilder::tier_fn)).
    ///
    /// ```
    /// use tollgate::{route::Route, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .route("/api/{*rest}", Route::new()
    ///         .policy(Policy::new("anon", Rate::per_minute(10))?)
    ///         .tier("free", [Policy::new("free", Rate::per_minute(100))?])
    ///         .tier("pro", [Policy::new("pro", Rate::per_minute(10_000))?]))
    ///     .policy(Policy::new("other", Rate::per_minute(60))?)
    ///     .tier_fn(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn tier(
        mut self,
        tier: impl Into<String>,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Self {
        self.tiers
            .push((tier.into(), policies.into_iter().collect()));
        self
    }

    /// Charges `cost` to every policy of the route.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// Computes the cost from the request.
    ///
    /// ```
    /// use tollgate::{route::Route, Policy, Rate};
    ///
    /// let route = Route::new()
    ///     .policy(Policy::new("tokens", Rate::per_minute(1000))?)
    ///     .cost_fn(|req| req.headers().get("x-batch-size")
    ///         .and_then(|v| v.to_str().ok()?.parse().ok())
    ///         .unwrap_or(1));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn cost_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> u64 + Send + Sync + 'static,
    {
        self.cost = Cost::Computed(Arc::new(f));
        self
    }
}
