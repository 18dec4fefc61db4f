//! The tower middleware: [`RateLimitLayer`], [`RateLimitService`], [`ResponseFuture`] and
//! [`RateLimitBody`], and the [`RateLimitInfo`] it leaves in request and response
//! extensions.
//!
//! The middleware only adapts HTTP to the [`Limiter`](crate::Limiter): it asks the limiter's
//! decision path about each request, calls the inner service when the request may go ahead
//! (adding quota headers to its response), and otherwise answers with the
//! [`Refusal`](crate::Refusal), rendered for HTTP or gRPC.

mod body;
mod estimate;
mod future;
mod held;
mod info;
mod layer;
mod rendering;
mod service;
mod shared;

pub(crate) use body::read_capped;
pub use body::RateLimitBody;
pub use estimate::{EstimateFromJson, EstimateFromJsonLayer, DEFAULT_MAX_ESTIMATE_BODY};
pub use future::ResponseFuture;
pub use info::RateLimitInfo;
pub use layer::RateLimitLayer;
pub use service::RateLimitService;
