//! Per-route policies: which policies (and cost, and key) apply to which requests.
//!
//! A [`Limiter`](crate::Limiter) holds a route table: patterns like `POST /login`,
//! `/api/{*rest}` or `/search` (a method is optional; without one the route applies to every
//! method), each with a [`Route`] — policies, per-tier policies, a cost, its own
//! [key](Route::key) — or exempt from limiting altogether. Requests that match no pattern get the default route (the policies given to
//! [`LimiterBuilder::policy`](crate::LimiterBuilder::policy)).
//!
//! Matching uses [`matchit`] (axum's router) with axum 0.8's syntax: the most specific path
//! pattern wins — static segments over `{param}` segments over `{*catch_all}` — and within
//! the winning pattern a route for the request's method beats one for any method. A `GET`
//! route also covers `HEAD` (axum serves `HEAD` with `GET` handlers) unless a `HEAD` route is
//! declared. If the winning pattern has no route for the method, the default route applies,
//! except for a gRPC call: gRPC methods are paths too (`/package.Service/Method`), and a gRPC
//! server serves a call whatever its HTTP method (tonic matches the path alone), so a call
//! with a gRPC content type, or on a path of that shape (two segments, the first with a
//! `.`), takes the pattern's `POST` route whatever its method. axum 0.7's `:id` and `*rest` are
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

pub use crate::count::CountWhen;
use crate::key::{KeyExtractor, RequestView};
use crate::policy::Policy;

/// Computes a request's cost.
pub(crate) type CostFn = dyn Fn(&RequestView<'_>) -> u64 + Send + Sync;

/// Resolves a request's tier (plan), e.g. `free`, `pro`, `internal`.
pub(crate) type TierFn = dyn for<'a> Fn(&RequestView<'a>) -> Option<&'a str> + Send + Sync;

/// How much a request costs.
#[derive(Clone, Default)]
pub(crate) enum Cost {
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

/// What applies to the requests a route pattern matches: policies, a cost, tiers, a counting
/// rule, or an exemption. See the [module docs](crate::route) for patterns.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::key::{Global, RequestView};
/// use tollgate::route::Route;
/// use tollgate::{Limiter, Policy, Rate};
///
/// let limiter = Limiter::builder()
///     .route("GET /search", Route::new().policy(Policy::new("search", Rate::per_minute(1))?))
///     .route("GET /health", Route::exempt())
///     .policy(Policy::new("api", Rate::per_minute(100))?)
///     .extractor(Global::new())
///     .build()?;
/// let search = http::Request::get("/search?q=a").body(())?;
/// assert!(limiter.decide(&RequestView::new(&search)).await.is_ok());
/// assert!(limiter.decide(&RequestView::new(&search)).await.is_err());
/// let health = http::Request::get("/health").body(())?;
/// for _ in 0..3 {
///     assert!(limiter.decide(&RequestView::new(&health)).await.is_ok());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct Route {
    pub(crate) exempt: bool,
    pub(crate) policies: Vec<Policy>,
    pub(crate) tiers: Vec<(String, Vec<Policy>)>,
    pub(crate) cost: Cost,
    /// The metered policies (by name) and how each is estimated and settled.
    pub(crate) meters: Vec<(String, Meter)>,
    /// Which requests count, decided from the response head; `None`: every admitted one.
    pub(crate) count: Option<CountWhen>,
    /// The route's own key; `None`: the limiter's.
    pub(crate) key: Option<Arc<dyn KeyExtractor>>,
    /// Tiers keyed their own way, overriding `key` for their requests.
    pub(crate) tier_keys: Vec<(String, Arc<dyn KeyExtractor>)>,
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

    /// Adds a policy whose cost is known only after the response (tokens generated, rows
    /// exported): the [`Meter`]'s estimate is charged when the request arrives, together with
    /// the route's other policies and all or nothing, and the actual cost is settled when the
    /// response is known — the difference refunded, or the extra charged (see
    /// [`Op::Settle`](crate::store::Op::Settle) for the bound on what an extra charge
    /// can do). The other policies keep their own cost. See [`Meter`] for an example.
    pub fn metered(mut self, policy: Policy, meter: Meter) -> Self {
        self.meters.push((policy.name().to_owned(), meter));
        self.policies.push(policy);
        self
    }

    /// Charges `cost` to every policy of the route (metered and in-flight policies keep
    /// their own: an estimate, one slot).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// Computes the cost from the request.
    ///
    /// A cost above a policy's capacity is refused with a 429 that says so. A cost of 0
    /// charges nothing: the request goes ahead while the key is within its limit, as a look
    /// would. So a cost read from what the client sends must be floored at 1, or a client
    /// sending 0 is never limited:
    ///
    /// ```
    /// use tollgate::{route::Route, Policy, Rate};
    ///
    /// let route = Route::new()
    ///     .policy(Policy::new("tokens", Rate::per_minute(1000))?)
    ///     .cost_fn(|req| {
    ///         req.headers()
    ///             .get("x-batch-size")
    ///             .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    ///             .unwrap_or(1)
    ///             .max(1) // the client's number: `x-batch-size: 0` still costs one
    ///     });
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn cost_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> u64 + Send + Sync + 'static,
    {
        self.cost = Cost::Computed(Arc::new(f));
        self
    }

    /// Counts a request against the route's rate policies only if its response head says
    /// so: only failures, only successes, some statuses, or your own rule. The unit is
    /// charged when the request is admitted and refunded when a response head that does not
    /// count arrives, so concurrent requests never exceed the limit; a request with no
    /// response head (an inner error, a dropped future) counts. See [`CountWhen`] for an
    /// example, and [`Reservation::count`](crate::Reservation::count) for the direct API.
    ///
    /// A route with a counting rule needs a rate policy in each of its policy sets and no
    /// [metered](Self::metered) policies; building the limiter checks both.
    pub fn count_when(mut self, when: CountWhen) -> Self {
        self.count = Some(when);
        self
    }

    /// Keys this route's requests with `extractor` instead of the limiter's
    /// [`extractor`](crate::LimiterBuilder::extractor): one limiter can count `/` per client
    /// address, `/api/*` per API key and `POST /login` per (address, username). Requests of
    /// other routes keep the limiter's key; the allow and deny lists, the
    /// [missing-key](crate::MissingKey) setting and every policy's state work on whichever
    /// key the route gives. The same key from two routes is one principal: a policy shared by
    /// both counts it once.
    ///
    /// An [exempt](Self::exempt) route reads no key, so a key on one is a build error.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::key::{ApiKey, PeerIp, RequestView};
    /// use tollgate::{route::Route, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("pages", Rate::per_minute(60))?) // `/` and the rest: per address
    ///     .extractor(PeerIp::new())
    ///     .route("/api/{*rest}", Route::new()
    ///         .policy(Policy::new("api", Rate::per_minute(1))?)
    ///         .key(ApiKey::new()))                       // `/api/*`: per API key
    ///     .build()?;
    /// let call = |api_key: &str| {
    ///     http::Request::get("/api/items").header("x-api-key", api_key).body(()).unwrap()
    /// };
    /// let (a, b) = (call("key-a"), call("key-b"));
    /// assert_eq!(limiter.key_for(&RequestView::new(&a)).unwrap().source(), "apikey");
    /// assert!(limiter.decide(&RequestView::new(&a)).await.is_ok());
    /// assert!(limiter.decide(&RequestView::new(&a)).await.is_err()); // key-a's minute is spent
    /// assert!(limiter.decide(&RequestView::new(&b)).await.is_ok());  // key-b has its own
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(extractor));
        self
    }

    /// Keys the requests of `tier` with `extractor`, instead of the route's [`key`](Self::key)
    /// or the limiter's. The tier must be one the route names with [`tier`](Self::tier).
    ///
    /// ```
    /// use tollgate::key::{ApiKey, RequestView};
    /// use tollgate::{route::Route, Limiter, Policy, Rate};
    ///
    /// let route = Route::new()
    ///     .policy(Policy::new("anonymous", Rate::per_minute(10))?)
    ///     .tier("partner", [Policy::new("partner", Rate::per_minute(1000))?])
    ///     .tier_key("partner", ApiKey::new());
    /// let limiter = Limiter::builder()
    ///     .route("/api/{*rest}", route)
    ///     .default_route(Route::exempt())
    ///     .tier_fn(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
    ///     .build()?;
    /// let req = http::Request::get("/api/x")
    ///     .header("x-plan", "partner")
    ///     .header("x-api-key", "k")
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(limiter.key_for(&RequestView::new(&req)).unwrap().source(), "apikey");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn tier_key(mut self, tier: impl Into<String>, extractor: impl KeyExtractor) -> Self {
        self.tier_keys.push((tier.into(), Arc::new(extractor)));
        self
    }
}

/// Computes a metered policy's estimate from a request.
pub(crate) type EstimateFn = dyn Fn(&RequestView<'_>) -> u64 + Send + Sync;

/// Counts a streamed response's cost from its data frames (tokens in a server-sent-events
/// stream, rows in an export): called once per frame, the results summed.
pub(crate) type FrameCostFn = dyn Fn(&bytes::Bytes) -> u64 + Send + Sync;

/// How a [metered](Route::metered) policy's cost is reserved on arrival and settled after the
/// response.
///
/// **The estimate**, charged when the request arrives: a fixed number, a function of the
/// request head, or the [`CostEstimate`] that
/// [`EstimateFromJsonLayer`](crate::EstimateFromJsonLayer) read from a field of the JSON body.
/// An estimate above the policy's capacity is refused like any cost that could never fit; an
/// estimate of 0 reserves one unit (a spent budget refuses it), given back when the request
/// settles at 0.
///
/// **The actual cost**, settled when the response is known, by default from an
/// [`ActualCost`] the handler puts in the response's extensions; or from a response header
/// (removed before the response is sent); or counted over the response body's frames as they
/// are sent, and settled when the body ends. When no actual cost comes (a handler that sets
/// none, a client gone before a streamed body ended, a panic), the reservation stands: the
/// estimate stays charged.
///
/// ```
/// use tollgate::route::{Meter, Route};
/// use tollgate::{Limiter, Policy, Rate};
///
/// // 60 requests and 90 000 tokens per minute; a completion reserves its `max_tokens` and
/// // settles the tokens it streamed.
/// let route = Route::new()
///     .policy(Policy::new("requests", Rate::per_minute(60))?)
///     .metered(
///         Policy::new("tokens", Rate::per_minute(90_000))?,
///         Meter::from_body(1_000)
///             .settle_from_stream(|frame| frame.split(|&b| b == b'\n').filter(|l| l.starts_with(b"data:")).count() as u64),
///     );
/// let limiter = Limiter::builder().route("POST /v1/completions", route).default_route(Route::exempt()).build()?;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Meter {
    pub(crate) estimate: Estimate,
    pub(crate) actual: Actual,
}

#[derive(Clone)]
pub(crate) enum Estimate {
    Fixed(u64),
    Computed(Arc<EstimateFn>),
    /// The request's [`CostEstimate`] extension, or this when it has none.
    Body(u64),
}

#[derive(Clone)]
pub(crate) enum Actual {
    Extension,
    Header(http::HeaderName),
    Stream(Arc<FrameCostFn>),
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let estimate = match &self.estimate {
            Estimate::Fixed(n) => format!("Fixed({n})"),
            Estimate::Computed(_) => "Computed(..)".to_owned(),
            Estimate::Body(n) => format!("Body(default {n})"),
        };
        let actual = match &self.actual {
            Actual::Extension => "Extension".to_owned(),
            Actual::Header(h) => format!("Header({h})"),
            Actual::Stream(_) => "Stream(..)".to_owned(),
        };
        f.debug_struct("Meter")
            .field("estimate", &estimate)
            .field("actual", &actual)
            .finish()
    }
}

impl Meter {
    /// Reserves `estimate` units per request.
    pub fn fixed(estimate: u64) -> Self {
        Self::with(Estimate::Fixed(estimate))
    }

    /// Reserves what `f` computes from the request head (a header, a query parameter).
    ///
    /// ```
    /// use tollgate::route::Meter;
    ///
    /// let meter = Meter::from_fn(|req| req.headers().get("x-max-rows")
    ///     .and_then(|v| v.to_str().ok()?.parse().ok())
    ///     .unwrap_or(100));
    /// ```
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> u64 + Send + Sync + 'static,
    {
        Self::with(Estimate::Computed(Arc::new(f)))
    }

    /// Reserves the request's [`CostEstimate`] (put there by
    /// [`EstimateFromJsonLayer`](crate::EstimateFromJsonLayer), or by your own layer), or
    /// `default` when it has none.
    pub fn from_body(default: u64) -> Self {
        Self::with(Estimate::Body(default))
    }

    fn with(estimate: Estimate) -> Self {
        Self {
            estimate,
            actual: Actual::Extension,
        }
    }

    /// Settles with the [`ActualCost`] the handler puts in the response extensions (the
    /// default).
    pub fn settle_from_extension(mut self) -> Self {
        self.actual = Actual::Extension;
        self
    }

    /// Settles with the number in response header `name`, which is removed before the
    /// response is sent (a backend reports its cost to the gateway, not to the client). A
    /// header that is not a whole number leaves the reservation standing. A gRPC call may
    /// report it in its trailers (trailing metadata, for a cost known at the end) when the
    /// head has none: settled as they pass, and removed from them (a gRPC-Web body's
    /// trailers frame is read, not rewritten); a call cut short before them leaves the
    /// reservation standing.
    pub fn settle_from_header(mut self, name: http::HeaderName) -> Self {
        self.actual = Actual::Header(name);
        self
    }

    /// Settles when the response body ends with the sum of `count` over its data frames. The
    /// headers then describe the reservation (they are sent before the body).
    pub fn settle_from_stream<F>(mut self, count: F) -> Self
    where
        F: Fn(&bytes::Bytes) -> u64 + Send + Sync + 'static,
    {
        self.actual = Actual::Stream(Arc::new(count));
        self
    }

    /// The estimate for `request`.
    pub(crate) fn estimate(&self, request: &RequestView<'_>) -> u64 {
        match &self.estimate {
            Estimate::Fixed(n) => *n,
            Estimate::Computed(f) => f(request),
            Estimate::Body(default) => request
                .extensions()
                .get::<CostEstimate>()
                .map_or(*default, |e| e.0),
        }
    }
}

/// A request's estimated cost for its [metered](Route::metered) policies, in its extensions:
/// what [`Meter::from_body`] reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostEstimate(pub u64);

/// The actual cost of a request, put in the response extensions by the handler, for the
/// route's [metered](Route::metered) policies that settle from the extension (the default).
///
/// ```
/// use axum::response::IntoResponse;
/// use tollgate::route::ActualCost;
///
/// async fn export() -> impl IntoResponse {
///     let rows = 1_250; // what the export produced
///     let mut res = "...".into_response();
///     res.extensions_mut().insert(ActualCost::new(rows));
///     res
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualCost {
    all: Option<u64>,
    named: smallvec::SmallVec<[(Arc<str>, u64); 1]>,
}

impl ActualCost {
    /// `cost` for every metered policy of the route.
    pub fn new(cost: u64) -> Self {
        Self {
            all: Some(cost),
            named: smallvec::SmallVec::new(),
        }
    }

    /// `cost` for the metered policy named `policy` only (others take [`new`](Self::new)'s
    /// cost, if any, or keep their reservation).
    ///
    /// ```
    /// use tollgate::route::ActualCost;
    ///
    /// let cost = ActualCost::new(1).with("input_tokens", 812).with("output_tokens", 95);
    /// assert_eq!(cost.for_policy("output_tokens"), Some(95));
    /// assert_eq!(cost.for_policy("anything_else"), Some(1));
    /// ```
    pub fn with(mut self, policy: &str, cost: u64) -> Self {
        self.named.push((Arc::from(policy), cost));
        self
    }

    /// An actual cost with no cost for every policy, only named ones.
    pub fn named(policy: &str, cost: u64) -> Self {
        Self {
            all: None,
            named: smallvec::smallvec![(Arc::from(policy), cost)],
        }
    }

    /// The cost for `policy`, if this says one.
    pub fn for_policy(&self, policy: &str) -> Option<u64> {
        self.named
            .iter()
            .find(|(name, _)| &**name == policy)
            .map(|(_, c)| *c)
            .or(self.all)
    }
}
