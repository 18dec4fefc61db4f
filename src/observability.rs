//! What tollgate tells operators: the decision on the request's span, a view of it for
//! handlers, metrics, and log events.
//!
//! # The decision on the request's span
//!
//! Every decision is recorded on the *current* span, so a span the application opens per
//! request — tower-http's `TraceLayer`, placed outside the [`RateLimitLayer`] — carries it:
//!
//! | field | value |
//! |---|---|
//! | `ratelimit.key` | a digest of the key ([`key::digest`]), never the key itself |
//! | `ratelimit.policy` | the governing policy: the one that denied, or the one with the fewest units left |
//! | `ratelimit.allowed` | `true` or `false` |
//! | `ratelimit.remaining` | units the governing policy has left |
//! | `ratelimit.outcome` | how the decision was reached: `decided`, `cached_deny`, `fail_open`, `fail_closed`, `fallback` ([`DecidedBy`]) |
//! | `ratelimit.refusal` | for a refusal, its error code ([`RefusalKind::error_code`]) |
//!
//! `tracing` records only the fields a span declares, so declare them as
//! [`Empty`](tracing::field::Empty). A refusal before any policy (no key, a deny-listed key)
//! fills what it knows: `allowed`, `refusal`, and the key when there is one. When the current
//! span is disabled (no subscriber, or filtered out) nothing is computed; the key's digest is
//! only computed for a span that declares `ratelimit.key`.
//!
//! With the `opentelemetry` feature and a `tracing-opentelemetry` layer, the same values are
//! also attributes of the span's OpenTelemetry span when the span does not declare them, so
//! they reach the trace backend without any declaration (each attribute once either way).
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use axum::{body::Body, routing::get, Router};
//! use http::Request;
//! use tower::ServiceExt;
//! use tower_http::trace::TraceLayer;
//! use tracing::field::Empty;
//! use tollgate::{key::Global, Limiter, Policy, Rate, RateLimitLayer};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("api", Rate::per_minute(100))?)
//!     .extractor(Global::new())
//!     .build()?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter))
//!     .layer(TraceLayer::new_for_http().make_span_with(|req: &Request<Body>| {
//!         tracing::info_span!(
//!             "request",
//!             method = %req.method(),
//!             uri = %req.uri(),
//!             ratelimit.key = Empty,
//!             ratelimit.policy = Empty,
//!             ratelimit.allowed = Empty,
//!             ratelimit.remaining = Empty,
//!             ratelimit.outcome = Empty,
//!             ratelimit.refusal = Empty,
//!         )
//!     }));
//! let res = app.oneshot(Request::new(Body::empty())).await?;
//! assert_eq!(res.status(), 200);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # The decision for handlers and `on_response`
//!
//! With [`RateLimitLayer::info_extensions`], a request that goes ahead carries a
//! [`RateLimitInfo`] in its extensions, so a handler can show the remaining quota; the
//! response carries the same in its extensions (a refusal's response too), where
//! `TraceLayer::on_response` or any outer layer can read it. Requests that no policy decided
//! (an exempt route, an allow-listed key, only shadow policies) carry none. It is off by
//! default: it costs two allocations per request. See [`RateLimitInfo`] for an example.
//!
//! # Metrics
//!
//! With the `metrics` feature, through the [`metrics`](https://docs.rs/metrics) facade
//! (install any recorder; without one they cost next to nothing):
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `outcome` (`decided`, `cached_deny`, `fail_open`, `fail_closed`, `fallback`), `allowed` (`true`/`false`), `store` ([`Store::name`]: `memory`, `redis`, `redis-cluster`, `redis-sentinel`), `policy` (the governing policy's name), `route` (see below) |
//! | `tollgate_refusals_total` | counter | `kind` ([`RefusalKind::as_str`]: `rate_limited`, `cost_exceeds_capacity`, `missing_key`, `forbidden`, `store_unavailable`, `login_refused`, `login_body_too_large`, `login_body_unreadable`, `login_username_ambiguous`) |
//! | `tollgate_degraded_total` | counter | `outcome` (`fail_open`, `fail_closed`, `fallback`): requests (and login attempts) a failure mode decided because the store failed, one each however many store calls it made (a shadow policy's check is not a request); a `ResilientStore` called directly, without a limiter, counts none |
//! | `tollgate_store_errors_total` | counter | `kind` (`connection`, `timeout`, `backend`, `protocol`, `circuit_open`, `capacity`) |
//! | `tollgate_store_latency_seconds` | histogram | `store`: each call a [`ResilientStore`] makes to the store it wraps, a timeout counting as the time waited |
//! | `tollgate_breaker_transitions_total` | counter | `state`: `open` (closed to open, once per outage: a failed probe keeps it open uncounted), `half_open` (each probe), `closed` |
//! | `tollgate_memory_evictions_total` | counter | — (live entries a full memory store evicted to admit a new key) |
//! | `tollgate_memory_evicted_usage_ratio` | histogram | — (the share of its limit each evicted entry had used) |
//! | `tollgate_fallback_overadmitted_total` | counter | — (requests the local fallback admitted that the store, answering late, refused) |
//! | `tollgate_lease_units_total` | counter | `event`: units of [leased](crate::store::leased) blocks `granted`, `returned` unused, or `dropped` unused (under-admission until their window or refill frees them) |
//! | `tollgate_sentinel_switches_total` | counter | — (master switches a [Sentinel store](crate::store::sentinel) followed: failovers) |
//! | `tollgate_sentinel_failover_seconds` | histogram | — (for each switch, how long the store had been without a master, from the first call that found none to the first call on the new one) |
//! | `tollgate_region_home_calls_total` | counter | `region`, `call`: calls a [region](crate::store::regions) made to the home ledger (`grant`, `exact`, `refused`, `return`, `forward`, `error`) |
//! | `tollgate_region_units_total` | counter | `region`, `flow`: units between a region and the home (`deposited`, `returned`, `dropped`) |
//! | `tollgate_plan_reloads_total` | counter | `result`: `ok`, `refused` (plans put in force, or refused while the plan in force stayed) |
//!
//! **`route`** is the route's pattern as declared in the limiter's route table
//! (`"GET /search"`), `default` for the default route, and for a route attached through
//! axum's router ([`RateLimitLayer::for_route`]) the path pattern axum matched
//! (`"/reports/{id}"`; `for_route` when axum names none, as for tonic, or past 64 patterns on
//! one layer). It is never a request's path, so the label set stays bounded: routes ×
//! policies × outcomes.
//!
//! **The login guard** records one decision per attempt, however many of its three limits
//! it checked: `route` is the guard's name (`login` by default, see
//! [`LoginGuardBuilder::name`](crate::login::LoginGuardBuilder::name)) and `policy` the
//! limit that governed the attempt (the one that refused it, or the tightest).
//!
//! **Refusals**: every answer tollgate gives instead of the guarded service is counted once
//! in `tollgate_refusals_total`, from the layer, [`Limiter::decide`] and the login layer; a
//! rate-limited refusal is also a `tollgate_decisions_total{allowed="false"}`.
//!
//! **The deny cache**: a request a [`ResilientStore`]'s deny cache refused is a decision with
//! `outcome="cached_deny"`, not a degraded one: the store is healthy and denied that key a
//! moment ago, so alerting on `tollgate_degraded_total` does not fire during ordinary abuse.
//!
//! Metrics are described (Prometheus `# HELP`) on the first one recorded, so install the
//! recorder before traffic.
//!
//! ## Histogram buckets
//!
//! A histogram's buckets are chosen by the recorder, not by the code that records.
//! [`STORE_LATENCY_BUCKETS`] fits a network store (a Redis round trip on a local network is
//! well under a millisecond, across zones a few, and [`ResilientStore`]'s default timeout is
//! 50 ms), [`SENTINEL_FAILOVER_BUCKETS`] a Sentinel failover (seconds to minutes);
//! `metrics-exporter-prometheus` renders histograms as summaries unless told, and the alert
//! rules and the dashboard read `_bucket` series, so set them:
//!
//! ```
//! # #[cfg(feature = "metrics")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! let builder = PrometheusBuilder::new()
//!     .set_buckets_for_metric(
//!         Matcher::Full("tollgate_store_latency_seconds".to_owned()),
//!         tollgate::observability::STORE_LATENCY_BUCKETS,
//!     )?
//!     .set_buckets_for_metric(
//!         Matcher::Full("tollgate_sentinel_failover_seconds".to_owned()),
//!         tollgate::observability::SENTINEL_FAILOVER_BUCKETS,
//!     )?;
//! // builder.with_http_listener(addr).install()?;
//! # let _ = builder;
//! # Ok(()) }
//! # #[cfg(not(feature = "metrics"))]
//! # fn main() {}
//! ```
//!
//! # Alerts, a dashboard and operator tools
//!
//! The repository's `observability/` directory holds Prometheus alert rules over these
//! metrics (fail-open, fallback and fail-closed rates, breaker open, store errors and
//! latency, a policy refusing an unusual share of its route) with their `promtool test rules`
//! unit tests, and a Grafana dashboard. To see *which* keys are refused, use
//! [`Limiter::top_refused`] or, with the `admin` feature, the admin API's `GET /top`.
//!
//! # Log events
//!
//! Each refusal is an event on target `tollgate::refusal` at the level the [`refusal`
//! module](crate::refusal) documents; each decision a `DEBUG` event on target
//! `tollgate::decision` with the fields above and `ratelimit.store`; store trouble is logged
//! on `tollgate::store` and `tollgate::breaker`.
//!
//! [`RateLimitLayer`]: crate::RateLimitLayer
//! [`RateLimitLayer::for_route`]: crate::RateLimitLayer::for_route
//! [`RateLimitLayer::info_extensions`]: crate::RateLimitLayer::info_extensions
//! [`RateLimitInfo`]: crate::RateLimitInfo
//! [`Limiter::decide`]: crate::Limiter::decide
//! [`Limiter::top_refused`]: crate::Limiter::top_refused
//! [`key::digest`]: crate::key::digest
//! [`DecidedBy`]: crate::DecidedBy
//! [`RefusalKind::error_code`]: crate::RefusalKind::error_code
//! [`RefusalKind::as_str`]: crate::RefusalKind::as_str
//! [`ResilientStore`]: crate::store::ResilientStore
//! [`Store::name`]: crate::store::Store::name

/// Histogram buckets (seconds) for `tollgate_store_latency_seconds` that fit a network store:
/// 0.5 ms to 1 s, dense around a local round trip and around the default 50 ms timeout. Give
/// them to your recorder; see the [module docs](self).
///
/// ```
/// let buckets = tollgate::observability::STORE_LATENCY_BUCKETS;
/// assert!(buckets.windows(2).all(|w| w[0] < w[1]));
/// assert!(buckets.contains(&0.05)); // the default store timeout
/// ```
pub const STORE_LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Histogram buckets (seconds) for `tollgate_sentinel_failover_seconds`: 0.5 s to 5 minutes,
/// dense around Sentinel's usual failover (its `down-after-milliseconds`, 30 s by default,
/// and the election after it). The dashboard's failover panel reads them as `_bucket`
/// series, which `metrics-exporter-prometheus` renders only for a histogram given buckets;
/// see the [module docs](self).
///
/// ```
/// let buckets = tollgate::observability::SENTINEL_FAILOVER_BUCKETS;
/// assert!(buckets.windows(2).all(|w| w[0] < w[1]));
/// assert!(buckets.contains(&30.0)); // Sentinel's default down-after
/// ```
pub const SENTINEL_FAILOVER_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0,
];
