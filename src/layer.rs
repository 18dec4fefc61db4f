//! [`RateLimitLayer`].

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use crate::limiter::Limiter;
use crate::response::{HeaderStyle, Rejection, ResponseConfig};
use crate::service::RateLimitService;
use crate::store::MemoryStore;

/// Applies a [`Limiter`] to every request of the wrapped service.
///
/// Clones share one limiter — and so one state — which matters because axum and hyper clone
/// the service for every connection. See the [crate docs](crate) for examples.
pub struct RateLimitLayer<St = MemoryStore> {
    pub(crate) shared: Arc<Shared<St>>,
}

pub(crate) struct Shared<St> {
    pub(crate) limiter: Limiter<St>,
    pub(crate) response: ResponseConfig,
}

impl<St> Clone for Shared<St> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            response: self.response.clone(),
        }
    }
}

impl<St> Clone for RateLimitLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for RateLimitLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.shared.limiter)
            .field("response", &self.shared.response)
            .finish()
    }
}

impl<St> RateLimitLayer<St> {
    /// A layer deciding with `limiter`, with the default responses: classic quota headers on
    /// every response, `Retry-After` and a JSON body on a 429.
    pub fn new(limiter: Limiter<St>) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                response: ResponseConfig::default(),
            }),
        }
    }

    fn with_response(self, f: impl FnOnce(&mut ResponseConfig)) -> Self {
        let mut shared = Arc::try_unwrap(self.shared).unwrap_or_else(|arc| (*arc).clone());
        f(&mut shared.response);
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Which quota headers to send (default [`HeaderStyle::Classic`]).
    pub fn header_style(self, style: HeaderStyle) -> Self {
        self.with_response(|r| r.style = style)
    }

    /// Whether allowed responses carry quota headers too (default `true`).
    pub fn quota_headers_on_success(self, enabled: bool) -> Self {
        self.with_response(|r| r.quota_on_success = enabled)
    }

    /// Whether a 429 carries `Retry-After` (default `true`). Turning it off makes clients
    /// retry blindly; only do so if something in front of this service adds it.
    pub fn retry_after_header(self, enabled: bool) -> Self {
        self.with_response(|r| r.retry_after = enabled)
    }

    /// Replaces the 429 response. The function gets the [`Rejection`] (decision, policies,
    /// retry time) and can start from [`Rejection::default_response`]. It is called for gRPC
    /// calls too ([`Rejection::is_grpc`]); answer those with [`Rejection::grpc_response`], as
    /// gRPC clients cannot read an HTTP 429.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(
    ///     Limiter::builder().policy(Policy::new("api", Rate::per_second(5))?).build()?,
    /// )
    /// .on_rejection(|rejection| {
    ///     let mut res = rejection.default_response();
    ///     *res.body_mut() = Bytes::from_static(b"{\"error\":\"slow down\"}");
    ///     res
    /// });
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn on_rejection<F>(self, f: F) -> Self
    where
        F: Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.with_response(|r| r.on_rejection = Some(Arc::new(f)))
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<St> {
        &self.shared.limiter
    }
}

impl<Inner, St> Layer<Inner> for RateLimitLayer<St> {
    type Service = RateLimitService<Inner, St>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimitService::from_shared(inner, Arc::clone(&self.shared))
    }
}
