//! [`RateLimitLayer`].

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::rendering::ResponseConfig;
use super::service::RateLimitService;
use super::shared::Shared;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::refusal::Refusal;
use crate::response::{HeaderStyle, QuotaHeaders};
use crate::route::Route;
use crate::store::{MemoryStore, Store};

/// Applies a [`Limiter`] to every request of the wrapped service.
///
/// Clones share one limiter — and so one state — which matters because axum and hyper clone
/// the service for every connection. See [`for_route`](Self::for_route) for attaching
/// policies through axum's router.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use http::{Request, Response, StatusCode};
/// use tollgate::key::Global;
/// use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// let limiter = Limiter::builder()
///     .policy(Policy::new("api", Rate::per_minute(1))?)
///     .extractor(Global::new()) // one budget for everyone, for the example
///     .build()?;
/// let layer = RateLimitLayer::new(limiter);
/// let service = layer.layer(service_fn(|_: Request<String>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(String::from("hello")))
/// }));
///
/// let first = service.clone().oneshot(Request::new(String::new())).await?;
/// assert_eq!(first.status(), StatusCode::OK);
/// assert_eq!(first.headers()["ratelimit-remaining"], "0");
/// let second = service.oneshot(Request::new(String::new())).await?;
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert!(second.headers().contains_key("retry-after"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct RateLimitLayer<St = MemoryStore> {
    pub(crate) shared: Arc<Shared<St>>,
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
    /// A layer deciding with `limiter`, with the default responses: the classic quota
    /// headers on every response, and on a 429 also `Retry-After` and a JSON body (see
    /// [`quota_headers`](Self::quota_headers) for sending them on fewer allowed responses).
    /// A limiter built from a plan ([`Limiter::from_config`]) brings the plan's
    /// `header_style`, `quota_headers` and `retry_after` instead; this layer's own setters
    /// change them.
    pub fn new(limiter: Limiter<St>) -> Self {
        Self {
            shared: Arc::new(Shared::new(limiter)),
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

    /// Which allowed responses carry the quota headers (default
    /// [`QuotaHeaders::Always`]). A rate-limited 429 always carries them (unless its policy
    /// is [sensitive](crate::PolicyBuilder::sensitive)); a cost above the capacity, which no
    /// wait cures, is refused without them and without `Retry-After`.
    ///
    /// [`QuotaHeaders::NearLimit`] sends them only once the client has at most a tenth of
    /// its quota left, which the IETF draft allows and which spares most responses the
    /// header lines; see [`QuotaHeaders`] for an example and the trade-off. On a route that
    /// settles or refunds (a meter, a counting rule) it is asked with the state the response
    /// leaves, so a settlement that spends the quota is announced on its own response.
    pub fn quota_headers(self, which: QuotaHeaders) -> Self {
        self.with_response(|r| r.quota_on_success = which)
    }

    /// Whether allowed responses carry quota headers: `true` is [`QuotaHeaders::Always`]
    /// (the default), `false` is [`QuotaHeaders::Never`].
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
    ///
    /// let limiter = Limiter::builder().policy(Policy::new("api", Rate::per_minute(600))?).build()?;
    /// let layer = RateLimitLayer::new(limiter).quota_headers_on_success(false);
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn quota_headers_on_success(self, enabled: bool) -> Self {
        self.quota_headers(if enabled {
            QuotaHeaders::Always
        } else {
            QuotaHeaders::Never
        })
    }

    /// Whether a 429 carries `Retry-After` (default `true`). Turning it off makes clients
    /// retry blindly; only do so if something in front of this service adds it.
    pub fn retry_after_header(self, enabled: bool) -> Self {
        self.with_response(|r| r.retry_after = enabled)
    }

    /// Whether each decided request carries a [`RateLimitInfo`] in its extensions, for the
    /// handler (to show the remaining quota), and its response too — a refusal's included —
    /// for outer layers such as tower-http's `TraceLayer::on_response` (default `false`:
    /// it costs two allocations per request). See [`RateLimitInfo`] for an example.
    ///
    /// [`RateLimitInfo`]: super::RateLimitInfo
    pub fn info_extensions(self, enabled: bool) -> Self {
        self.with_response(|r| r.info = enabled)
    }

    /// Replaces the response of every [`Refusal`]: rate limited, cost too high, missing key,
    /// forbidden, store unavailable. The function gets the refusal (kind, status, decision,
    /// policies, retry time) and can start from [`Refusal::default_response`], which
    /// already follows this layer's header settings. It is called for gRPC calls too
    /// ([`Refusal::is_grpc`]); answer those with [`Refusal::grpc_response`], as gRPC clients
    /// cannot read an HTTP status.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tollgate::{Limiter, Policy, Rate, RateLimitLayer, RefusalKind};
    ///
    /// let layer = RateLimitLayer::new(
    ///     Limiter::builder().policy(Policy::new("api", Rate::per_second(5))?).build()?,
    /// )
    /// .on_refusal(|refusal| {
    ///     if refusal.is_grpc() || refusal.kind() != RefusalKind::RateLimited {
    ///         return refusal.default_response();
    ///     }
    ///     let mut res = refusal.http_response();
    ///     *res.body_mut() = Bytes::from_static(b"{\"error\":\"slow down\"}");
    ///     res
    /// });
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn on_refusal<F>(self, f: F) -> Self
    where
        F: Fn(&Refusal) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.with_response(|r| r.on_refusal = Some(Arc::new(f)))
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<St> {
        &self.shared.limiter
    }
}

impl<St: Store> RateLimitLayer<St> {
    /// A layer for one route's policies, to attach through axum's own router with
    /// `route_layer`, sharing this layer's store, key extractor, lists, policy names and
    /// response settings. axum's routing then decides which requests the policies see:
    /// `HEAD` on a `GET` route, path parameters, nested routers. See [`Limiter::for_route`].
    ///
    /// The two ways of attaching policies to routes, side by side:
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tollgate::{key::Global, route::Route, Limiter, Policy, Rate, RateLimitLayer};
    ///
    /// let search = Route::new().policy(Policy::new("search", Rate::per_minute(2))?);
    ///
    /// // 1. The limiter's route table: patterns in axum's syntax, matched by tollgate.
    /// let by_table = Router::new()
    ///     .route("/search", get(|| async { "results" }))
    ///     .layer(RateLimitLayer::new(
    ///         Limiter::builder()
    ///             .route("GET /search", search.clone())
    ///             .default_route(Route::exempt())
    ///             .extractor(Global::new())
    ///             .build()?,
    ///     ));
    ///
    /// // 2. axum's router: one shared layer, per-route layers made from it.
    /// let limits = RateLimitLayer::new(
    ///     Limiter::builder().default_route(Route::exempt()).extractor(Global::new()).build()?,
    /// );
    /// let by_router = Router::new()
    ///     .route("/search", get(|| async { "results" }).route_layer(limits.for_route(search)?));
    ///
    /// for app in [by_table, by_router] {
    ///     let req = |method: &str| Request::builder().method(method).uri("/search").body(Body::empty());
    ///     assert_eq!(app.clone().oneshot(req("GET")?).await?.status(), StatusCode::OK);
    ///     assert_eq!(app.clone().oneshot(req("HEAD")?).await?.status(), StatusCode::OK);
    ///     assert_eq!(app.clone().oneshot(req("GET")?).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] as for [`Limiter::for_route`].
    pub fn for_route(&self, route: Route) -> Result<Self, ConfigError> {
        Ok(Self {
            shared: Arc::new(Shared {
                limiter: self.shared.limiter.for_route(route)?,
                response: self.shared.response.clone(),
                marks_quota: true,
            }),
        })
    }
}

impl<Inner, St> Layer<Inner> for RateLimitLayer<St> {
    type Service = RateLimitService<Inner, St>;

    fn layer(&self, inner: Inner) -> Self::Service {
        RateLimitService::from_shared(inner, Arc::clone(&self.shared))
    }
}
