//! The tower middleware: [`RateLimitLayer`], [`RateLimitService`], [`ResponseFuture`] and
//! [`RateLimitBody`], and the [`RateLimitInfo`] it leaves in request and response
//! extensions.
//!
//! The middleware only adapts HTTP to the [`Limiter`](crate::Limiter): it asks the limiter's
//! decision path about each request, calls the inner service when the request may go ahead
//! (adding quota headers to its response), and otherwise answers with the
//! [`Refusal`](crate::Refusal), rendered for HTTP or gRPC.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use axum::{routing::get, Router};
//! use tollgate::key::Global;
//! use tollgate::middleware::RateLimitInfo;
//! use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("api", Rate::per_minute(10))?)
//!     .extractor(Global::new())
//!     .build()?;
//! // A handler reads the decision from the request's extensions.
//! let app = Router::new()
//!     .route(
//!         "/",
//!         get(|info: axum::Extension<RateLimitInfo>| async move {
//!             format!("{} left", info.remaining())
//!         }),
//!     )
//!     .layer(RateLimitLayer::new(limiter).info_extensions(true));
//! let res = app.oneshot(http::Request::get("/").body(axum::body::Body::empty())?).await?;
//! assert_eq!(res.status(), 200);
//! assert_eq!(res.headers()["ratelimit-limit"], "10");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod body;
mod estimate;
mod future;
mod grpc_web;
mod held;
mod info;
mod layer;
mod rendering;
mod service;
mod shared;

pub use body::RateLimitBody;
pub(crate) use body::{read_capped, TrailersWatch};
pub use estimate::{EstimateFromJson, EstimateFromJsonLayer, DEFAULT_MAX_ESTIMATE_BODY};
pub use future::ResponseFuture;
pub use info::RateLimitInfo;
pub use layer::RateLimitLayer;
pub use service::RateLimitService;

/// A clone not driven to readiness, for a request that waits (a shaping delay, a body to
/// read) before its call: the ready service is replaced by a fresh clone, giving back what
/// its readiness reserved (a `ConcurrencyLimit` permit, a `Buffer` slot), and the caller
/// drives the returned one to readiness when the wait is over.
pub(crate) fn give_back_readiness<Inner: Clone>(ready: &mut Inner) -> Inner {
    let waiting = ready.clone();
    *ready = waiting.clone();
    waiting
}
