//! Production-grade rate limiting for [tower] services: axum, tonic, anything that speaks
//! `tower::Service<http::Request<B>>`.
//!
//! * Five algorithms ([`Algorithm`]): sliding window counter (the default), sliding window
//!   log, token bucket, fixed window and GCRA (with optional shaping).
//! * An in-process [`MemoryStore`](store::MemoryStore) that needs no setup: sharded, bounded,
//!   swept.
//! * [`RateLimitLayer`]: keys requests with a [`KeyExtractor`](key::KeyExtractor), decides,
//!   and answers denials with a complete 429 (`Retry-After`, `RateLimit-*`, JSON body).
//! * [`Limiter`]: the same decisions without HTTP (`check`, `peek`, `reset`).
//! * [`login::LoginGuard`]: (client IP, username), client IP and username limits at once
//!   against brute force and password spraying, as a direct API or a layer.
//! * gRPC: a denied gRPC call is a `RESOURCE_EXHAUSTED` status with retry information, not an
//!   HTTP 429 (see [`grpc`]).
//!
//! A denied request consumes nothing, in every algorithm and in every policy of a request.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `axum` (default) | reads axum's `ConnectInfo<SocketAddr>` for peer addresses |
//! | `config` (default) | TOML plans ([`config`]), the [`audit()`], building a limiter from a plan |
//! | `redis` | `store::RedisStore`: one Lua script per decision |
//! | `cluster` | `store::RedisClusterStore` on Redis Cluster |
//! | `metrics` | counters and a store-latency histogram through the `metrics` facade (see [`observability`]) |
//! | `opentelemetry` | the decision as attributes of the request's OpenTelemetry span, through `tracing-opentelemetry` (see [`observability`]) |
//! | `tonic` | reads tonic's `TcpConnectInfo` for peer addresses; `LoginDecision::to_status`, `Refusal::to_status` |
//! | `cli` | the `tollgate` command (`tollgate audit plan.toml`); implies `config` and `cluster` |
//!
//! Also: per-route policies ([`route`]), trusted-proxy client addresses and other keys
//! ([`key`]), TOML plans with a deterministic audit (feature `config`), and failure handling
//! for shared stores ([`store::ResilientStore`]). What operators see — the decision on the
//! request's span, a [`RateLimitInfo`] for handlers, metrics and log events — is in
//! [`observability`].
//!
//! # Public dependencies
//!
//! These crates' types appear in tollgate's public API, so a major version of one of them is
//! a major version of tollgate; the list is kept short on purpose, and every other dependency
//! stays private:
//!
//! * [`http`] 1 (requests, responses, header names, status codes), [`http_body`] 1 (the
//!   response bodies) and [`bytes`] 1 (refusal bodies, the frames a streamed meter counts);
//! * `tower-layer` 0.3 and `tower-service` 0.3 (the layers and services);
//! * [`serde`] 1 (plans, [`Algorithm`] and [`HeaderStyle`] deserialize and serialize);
//! * [`ipnet`] 2 ([`key::TrustedProxies::with`] and [`key::TrustedProxies::nets`]);
//! * with feature `axum` or `admin`, `axum` 0.8 (`IntoResponse` for [`Refusal`], the admin
//!   router); with `tonic`, `tonic` 0.14 (statuses); with `redis` or `cluster`,
//!   `deadpool-redis` 0.23 (the pools the Redis stores take).
//!
//! # Examples
//!
//! Five requests per ten seconds per client IP on an axum app:
//!
//! ```no_run
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{routing::get, Router};
//! use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("per-ip", Rate::new(5, Duration::from_secs(10)))?)
//!     .build()?; // memory store, keyed by peer IP
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! Any tower stack, keyed globally, with the structured IETF headers:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tollgate::{key::Global, HeaderStyle, Limiter, Policy, Rate, RateLimitLayer};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("burst", Rate::per_second(1))?)
//!     .extractor(Global::new())
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(limiter).header_style(HeaderStyle::Structured))
//!     .service_fn(|_req: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("ok")))
//!     });
//!
//! let res = svc.clone().oneshot(Request::new(String::new())).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["ratelimit-policy"], "\"burst\";q=1;w=1");
//! let res = svc.oneshot(Request::new(String::new())).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(res.headers().contains_key("retry-after"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Architecture
//!
//! One decision per request, on one path. The middleware ([`middleware`]) only adapts HTTP:
//! it asks the [`Limiter`] about the request and then either calls the inner service (adding
//! quota headers) or answers with the [`Refusal`]. The limiter resolves the route and tier,
//! extracts the key, applies allow and deny lists, computes the cost, runs penalties and
//! shadow policies, and asks the [`store`] about every policy at once; the direct API
//! ([`Limiter::check`], [`Limiter::decide`]), the login guard and gRPC calls go through the
//! same code. Algorithms ([`algorithm`]) are pure functions over a small state; the memory
//! store runs them in Rust and the Redis stores run the same math as Lua scripts.
//!
//! [tower]: https://docs.rs/tower

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
pub mod admin;
pub mod algorithm;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod decision;
mod error;
pub mod grpc;
pub mod guide;
pub mod key;
mod limiter;
pub mod login;
pub mod middleware;
pub mod observability;
pub mod policy;
pub mod refusal;
pub mod response;
pub mod route;
pub mod store;
mod telemetry;

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctests {}

#[cfg(feature = "config")]
pub use config::audit;
#[cfg(feature = "config")]
pub use config::audit::{audit, AuditReport};
pub use decision::{Decision, Outcome};
pub use error::{CheckError, ConfigError, StoreError};
pub use limiter::{
    EffectivePlan, KeyState, Limiter, LimiterBuilder, MissingKey, Permit, PolicyState, PolicyView,
    RefusedKey, Reservation, RouteView, DEFAULT_TOP_REFUSED_SLOTS, DEFAULT_TOP_REFUSED_WINDOW,
};
pub use middleware::{
    EstimateFromJson, EstimateFromJsonLayer, RateLimitBody, RateLimitInfo, RateLimitLayer,
    RateLimitService, ResponseFuture,
};
pub use policy::{Algorithm, Policy, PolicyBuilder, Rate};
pub use refusal::{Refusal, RefusalKind};
pub use response::HeaderStyle;
