//! [`LoginLayer`]: the login guard as a tower layer on the login route.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::{LoginAttempt, LoginGuard, LoginOutcome};
use crate::error::{CheckError, ConfigError, StoreError};
use crate::key::RequestView;
use crate::limiter::RouteTable;
use crate::middleware::{read_capped, RateLimitBody, TrailersWatch};
use crate::refusal::{Refusal, RefusalKind, Rendering};
use crate::store::{MemoryStore, Store};

type PartsFn = dyn Fn(&RequestView<'_>) -> Result<Option<String>, RefusalKind> + Send + Sync;
/// Reads the username from the head and the buffered body; `Err` refuses the request.
type BodyFn = dyn Fn(&RequestView<'_>, &[u8]) -> Result<Option<String>, RefusalKind> + Send + Sync;

#[derive(Clone)]
enum Username {
    Parts(Arc<PartsFn>),
    Body(Arc<BodyFn>),
}

/// Guards a login route with a [`LoginGuard`]: checks before the handler runs, then records
/// the outcome from the response status ([`LoginOutcome::from_status`] by default: 2xx
/// success, 401/403 failure), or from a gRPC call's `grpc-status` (see
/// [`classify`](Self::classify)).
///
/// The username comes from a header, a JSON body field, or a closure. Reading the body means
/// buffering it: the layer reads at most [`max_body_bytes`](Self::max_body_bytes) (default
/// 16 KiB; larger bodies get `413 Payload Too Large` without reaching the handler), then
/// hands the handler the same bytes (trailers, which login forms do not have, are dropped).
/// The username must be read the way the handler reads it; a request whose username cannot
/// be read counts against the empty username (and its IP), so such requests share one small
/// budget instead of escaping the limit.
///
/// A refused attempt gets the generic 429 of [`LoginDecision`](super::LoginDecision) (for a
/// gRPC call: `RESOURCE_EXHAUSTED`, see [`crate::grpc`]); a request without a client address
/// `400`, and a failing store `503` (fail closed; on a
/// [`ResilientStore`](crate::store::ResilientStore), the guard's failure mode decides:
/// [`LoginGuardBuilder::failure_mode`](super::LoginGuardBuilder::failure_mode), and a plan's
/// login fails closed where the plan fails open). The check reserves the attempt's place
/// before the handler runs, so concurrent attempts beyond a limit never reach the handler; a
/// success is recorded (refunded, in the default mode) before the response is returned.
///
/// # Examples
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use std::net::SocketAddr;
/// use axum::{body::Body, routing::post, Router};
/// use http::{Request, StatusCode};
/// use tower::ServiceExt;
/// use tollgate::{login::{LoginGuard, LoginLayer}, Rate};
///
/// let guard = LoginGuard::builder().ip_user_rate(Rate::per_minute(1)).build()?;
/// let app = Router::new()
///     .route("/login", post(|| async { StatusCode::UNAUTHORIZED })) // every password is wrong
///     .layer(LoginLayer::json_field(guard, "username"));
/// let attempt = || {
///     let mut req = Request::post("/login")
///         .header("content-type", "application/json")
///         .body(Body::from(r#"{"username":"alice","password":"guess"}"#))
///         .unwrap();
///     req.extensions_mut().insert("192.0.2.1:4000".parse::<SocketAddr>().unwrap());
///     req
/// };
/// assert_eq!(app.clone().oneshot(attempt()).await?.status(), StatusCode::UNAUTHORIZED);
/// assert_eq!(app.oneshot(attempt()).await?.status(), StatusCode::TOO_MANY_REQUESTS);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// With the username in a header and a custom classification:
///
/// ```
/// use http::StatusCode;
/// use tollgate::login::{LoginGuard, LoginLayer, LoginOutcome};
///
/// let layer = LoginLayer::header(LoginGuard::builder().build()?, http::HeaderName::from_static("x-username"))
///     .classify(|status| match status {
///         StatusCode::SEE_OTHER => LoginOutcome::Success, // redirect after login
///         s => LoginOutcome::from_status(s),
///     });
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct LoginLayer<St = MemoryStore> {
    shared: Arc<Shared<St>>,
}

struct Shared<St> {
    guard: LoginGuard<St>,
    username: Username,
    max_body: usize,
    classify: Arc<dyn Fn(StatusCode) -> LoginOutcome + Send + Sync>,
    /// Only these routes are guarded; `None`: every request.
    routes: Option<Arc<RouteTable>>,
    /// How refusals look: whether 429s carry `Retry-After`.
    rendering: Rendering,
    /// The user's response for a refusal, if set.
    on_refusal: Option<OnRefusal>,
}

type OnRefusal = Arc<dyn Fn(&Refusal) -> Response<Bytes> + Send + Sync>;

impl<St> Clone for Shared<St> {
    fn clone(&self) -> Self {
        Self {
            guard: self.guard.clone(),
            username: self.username.clone(),
            max_body: self.max_body,
            classify: Arc::clone(&self.classify),
            routes: self.routes.clone(),
            rendering: self.rendering.clone(),
            on_refusal: self.on_refusal.clone(),
        }
    }
}

impl<St> Clone for LoginLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for LoginLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginLayer")
            .field("guard", &self.shared.guard)
            .field(
                "reads_body",
                &matches!(self.shared.username, Username::Body(_)),
            )
            .field("max_body", &self.shared.max_body)
            .field("only_routes", &self.shared.routes.is_some())
            .finish_non_exhaustive()
    }
}

/// The default cap on a buffered login body: 16 KiB.
const DEFAULT_MAX_BODY: usize = 16 * 1024;

impl<St> LoginLayer<St> {
    fn with(guard: LoginGuard<St>, username: Username) -> Self {
        Self {
            shared: Arc::new(Shared {
                guard,
                username,
                max_body: DEFAULT_MAX_BODY,
                classify: Arc::new(LoginOutcome::from_status),
                routes: None,
                rendering: Rendering::default(),
                on_refusal: None,
            }),
        }
    }

    fn edit(self, f: impl FnOnce(&mut Shared<St>)) -> Self {
        let mut shared = Arc::try_unwrap(self.shared).unwrap_or_else(|arc| (*arc).clone());
        f(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Reads the username from the header `name` (no body buffering).
    ///
    /// A request that carries the header more than once is refused with `400`
    /// ([`RefusalKind::LoginUsernameAmbiguous`]): frameworks disagree on which instance
    /// wins, so `x-username: decoy` then `x-username: victim` could charge the decoy's limits
    /// while the handler checks the victim's password.
    ///
    /// See the type docs for an example.
    pub fn header(guard: LoginGuard<St>, name: HeaderName) -> Self {
        Self::with(
            guard,
            Username::Parts(Arc::new(move |req: &RequestView<'_>| {
                let mut all = req.headers().get_all(&name).iter();
                match (all.next(), all.next()) {
                    (Some(value), None) => {
                        Ok(Some(String::from_utf8_lossy(value.as_bytes()).into_owned()))
                    }
                    (None, _) => Ok(None),
                    (Some(_), Some(_)) => Err(RefusalKind::LoginUsernameAmbiguous),
                }
            })),
        )
    }

    /// Reads the username from the string field `field` of a JSON object body (buffered, see
    /// the type docs).
    ///
    /// An object that has `field` more than once is refused with `400`
    /// ([`RefusalKind::LoginUsernameAmbiguous`]): JSON parsers disagree on which duplicate
    /// wins (this crate's would take the last, many take the first), so a body like
    /// `{"username":"decoy","username":"victim"}` could charge the decoy's limits while the
    /// handler checks the victim's password. So is a JSON array: serde's derived
    /// `Deserialize` (axum's `Json`) reads a struct from one by position.
    ///
    /// See the type docs for an example.
    pub fn json_field(guard: LoginGuard<St>, field: impl Into<String>) -> Self {
        let field = field.into();
        Self::with(
            guard,
            Username::Body(Arc::new(move |_req: &RequestView<'_>, body: &[u8]| {
                super::body_fields::json_string_field(body, &field)
            })),
        )
    }

    /// Reads the username from the field `field` of an `application/x-www-form-urlencoded`
    /// body (buffered, see the type docs), decoded as a form is (`%XX`, and `+` for a space),
    /// so that the guard counts the username the handler's `Form` reads: `username=%61lice`
    /// is `alice`'s attempt, not a fresh username.
    ///
    /// A body that has `field` more than once is refused with `400`
    /// ([`RefusalKind::LoginUsernameAmbiguous`]), as for [`json_field`](Self::json_field).
    ///
    /// ```
    /// use tollgate::login::{LoginGuard, LoginLayer};
    ///
    /// let layer = LoginLayer::form_field(LoginGuard::builder().build()?, "username")
    ///     .max_body_bytes(4096);
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn form_field(guard: LoginGuard<St>, field: impl Into<String>) -> Self {
        let field = field.into();
        Self::with(
            guard,
            Username::Body(Arc::new(move |_req: &RequestView<'_>, body: &[u8]| {
                super::body_fields::form_field(body, &field)
            })),
        )
    }

    /// Reads the username with a closure over the request head (no body buffering). Decode
    /// what you read as your handler does: a username read one way and checked another gets
    /// a fresh budget for every spelling.
    ///
    /// ```
    /// use tollgate::login::{LoginGuard, LoginLayer};
    ///
    /// // `?user=…`, decoded as a query string is (`%61lice` is `alice`).
    /// let layer = LoginLayer::from_fn(LoginGuard::builder().build()?, |req| {
    ///     form_urlencoded::parse(req.uri().query()?.as_bytes())
    ///         .find(|(name, _)| name == "user")
    ///         .map(|(_, value)| value.into_owned())
    /// });
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn from_fn<F>(guard: LoginGuard<St>, f: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> Option<String> + Send + Sync + 'static,
    {
        Self::with(
            guard,
            Username::Parts(Arc::new(move |req: &RequestView<'_>| Ok(f(req)))),
        )
    }

    /// Reads the username with a closure over the request head and the buffered body, for a
    /// body neither [`json_field`](Self::json_field) nor [`form_field`](Self::form_field)
    /// reads. Decode it as your handler does (see [`from_fn`](Self::from_fn)).
    ///
    /// ```
    /// use tollgate::login::{LoginGuard, LoginLayer};
    ///
    /// // A body of `user:password`.
    /// let layer = LoginLayer::from_body_fn(LoginGuard::builder().build()?, |_req, body| {
    ///     let text = std::str::from_utf8(body).ok()?;
    ///     text.split_once(':').map(|(user, _)| user.to_owned())
    /// })
    /// .max_body_bytes(4096);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn from_body_fn<F>(guard: LoginGuard<St>, f: F) -> Self
    where
        F: Fn(&RequestView<'_>, &[u8]) -> Option<String> + Send + Sync + 'static,
    {
        Self::with(
            guard,
            Username::Body(Arc::new(move |req: &RequestView<'_>, body: &[u8]| {
                Ok(f(req, body))
            })),
        )
    }

    /// Whether a 429 carries `Retry-After` (default `true`), as
    /// [`RateLimitLayer::retry_after_header`](crate::RateLimitLayer::retry_after_header). A
    /// plan's `retry_after` sets both layers'. A login refusal carries no quota headers
    /// (it says nothing of which limit refused, or how much is left), so it has no header
    /// style to choose.
    ///
    /// ```
    /// use tollgate::login::{LoginGuard, LoginLayer};
    ///
    /// let guard = LoginGuard::builder().build()?;
    /// let layer = LoginLayer::header(guard, http::HeaderName::from_static("x-user"))
    ///     .retry_after_header(false);
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn retry_after_header(self, enabled: bool) -> Self {
        self.edit(|s| s.rendering.retry_after = enabled)
    }

    /// Replaces the response of every [`Refusal`] this layer gives: a login refused (`429`),
    /// the store unavailable (`503`), a body too large or unreadable, a username given twice,
    /// no key, a deny-listed client. The function gets the refusal (its
    /// [`kind`](Refusal::kind), status, retry time) and can start from
    /// [`Refusal::default_response`], which follows
    /// [`retry_after_header`](Self::retry_after_header). A gRPC call's refusal
    /// ([`Refusal::is_grpc`]) is best answered with [`Refusal::grpc_response`]. The response
    /// is marked as a refusal in its extensions, so a [`RateLimitLayer`](crate::RateLimitLayer)
    /// outside leaves it alone, as it leaves its own.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tollgate::login::{LoginGuard, LoginLayer};
    /// use tollgate::RefusalKind;
    ///
    /// let layer = LoginLayer::json_field(LoginGuard::builder().build()?, "username")
    ///     .on_refusal(|refusal| {
    ///         if refusal.is_grpc() || refusal.kind() != RefusalKind::LoginRefused {
    ///             return refusal.default_response();
    ///         }
    ///         let mut res = refusal.http_response();
    ///         *res.body_mut() = Bytes::from_static(b"{\"message\":\"Too many attempts.\"}");
    ///         res
    ///     });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn on_refusal<F>(self, f: F) -> Self
    where
        F: Fn(&Refusal) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.edit(|s| s.on_refusal = Some(Arc::new(f)))
    }

    /// The largest body buffered to read the username (default 16 KiB). A larger body is
    /// refused (413) before the guard is asked; 0 refuses every body (a plan refuses it).
    ///
    /// See [`from_body_fn`](Self::from_body_fn) for an example.
    pub fn max_body_bytes(self, max: usize) -> Self {
        self.edit(|s| s.max_body = max)
    }

    /// How a response status maps to an outcome (default [`LoginOutcome::from_status`]).
    ///
    /// A gRPC call's HTTP status is 200 whatever its outcome, so for a gRPC response `f`
    /// sees the HTTP status its `grpc-status` stands for instead (`OK` 200,
    /// `UNAUTHENTICATED` 401, `PERMISSION_DENIED` 403, `NOT_FOUND` 404, …), read from the
    /// head of a trailers-only answer or from the trailers as they pass; a call cut short
    /// before its trailers records nothing (the attempt keeps its charge).
    ///
    /// See the type docs for an example.
    pub fn classify<F>(self, f: F) -> Self
    where
        F: Fn(StatusCode) -> LoginOutcome + Send + Sync + 'static,
    {
        self.edit(|s| s.classify = Arc::new(f))
    }

    /// Guards only the requests that match one of `patterns` — route patterns as in
    /// [`crate::route`], such as `POST /login` (a method is optional) — and passes every other
    /// request to the inner service untouched (no body buffering, no count). Without it, the
    /// layer guards every request it sees but those of a safe method (`GET`, `HEAD`,
    /// `OPTIONS`, `TRACE`), so it belongs on the login route only. A safe method is guarded
    /// only by a pattern that names it (`GET /login`, for a login sent as a query): the
    /// login page served on the same path is not an attempt, and its `200` must not read as
    /// a success that clears a guesser's failures.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `routes` (no pattern) or `routes[i]` (a pattern the route table
    /// refuses, or one given twice).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::net::SocketAddr;
    /// use axum::{body::Body, routing::{get, post}, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tollgate::{login::{LoginGuard, LoginLayer}, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_user_rate(Rate::per_minute(1)).build()?;
    /// let layer = LoginLayer::header(guard, http::HeaderName::from_static("x-username"))
    ///     .routes(["POST /login"])?;
    /// let app = Router::new()
    ///     .route("/login", post(|| async { StatusCode::UNAUTHORIZED }))
    ///     .route("/", get(|| async { "home" }))
    ///     .layer(layer);
    /// let req = |method: &str, path: &str| {
    ///     let mut req = Request::builder().method(method).uri(path)
    ///         .header("x-username", "alice").body(Body::empty()).unwrap();
    ///     req.extensions_mut().insert("192.0.2.1:4000".parse::<SocketAddr>().unwrap());
    ///     req
    /// };
    /// assert_eq!(app.clone().oneshot(req("POST", "/login")).await?.status(), StatusCode::UNAUTHORIZED);
    /// assert_eq!(app.clone().oneshot(req("POST", "/login")).await?.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(app.clone().oneshot(req("GET", "/")).await?.status(), StatusCode::OK); // not guarded
    ///
    /// let err = LoginLayer::header(LoginGuard::builder().build()?, http::HeaderName::from_static("x-username"))
    ///     .routes(["POST /login", "/x/{"]).unwrap_err();
    /// assert_eq!(err.field(), "routes[1]");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn routes<I>(self, patterns: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let patterns: Vec<(String, usize)> = patterns
            .into_iter()
            .enumerate()
            .map(|(i, p)| (p.into(), i))
            .collect();
        if patterns.is_empty() {
            return Err(ConfigError::new(
                "routes",
                "[]",
                "name at least one route, e.g. \"POST /login\"",
            ));
        }
        let table = RouteTable::build(&patterns).map_err(|e| {
            let field = e.field().trim_end_matches(".pattern").to_owned();
            ConfigError::new(field, e.value(), e.reason())
        })?;
        Ok(self.edit(|s| s.routes = Some(Arc::new(table))))
    }

    /// The guard.
    ///
    /// ```
    /// use tollgate::login::{LoginGuard, LoginLayer};
    ///
    /// let layer = LoginLayer::json_field(LoginGuard::builder().build()?, "username");
    /// assert_eq!(layer.guard().policies().len(), 3);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn guard(&self) -> &LoginGuard<St> {
        &self.shared.guard
    }
}

impl<Inner, St> Layer<Inner> for LoginLayer<St> {
    type Service = LoginService<Inner, St>;

    fn layer(&self, inner: Inner) -> Self::Service {
        LoginService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The middleware made by [`LoginLayer`]; see there for an example.
pub struct LoginService<Inner, St = MemoryStore> {
    inner: Inner,
    shared: Arc<Shared<St>>,
}

impl<Inner: Clone, St> Clone for LoginService<Inner, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Inner: fmt::Debug, St: fmt::Debug> fmt::Debug for LoginService<Inner, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginService")
            .field("inner", &self.inner)
            .field("guard", &self.shared.guard)
            .finish()
    }
}

impl<Inner, St> LoginService<Inner, St> {
    /// The inner service.
    ///
    /// See [`LoginLayer`] for an example of the middleware.
    pub fn get_ref(&self) -> &Inner {
        &self.inner
    }

    /// Consumes the middleware, returning the inner service.
    ///
    /// See [`LoginLayer`] for an example of the middleware.
    pub fn into_inner(self) -> Inner {
        self.inner
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<Inner, St, ReqBody, ResBody> Service<Request<ReqBody>> for LoginService<Inner, St>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    St: Store,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = Inner::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // A safe method (a `GET` of the login page on the same path) is not an attempt unless
        // a route names it: counted, its `200` would read as a success and clear the
        // (IP, username) failures a guesser earned.
        let safe = matches!(
            *req.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS | http::Method::TRACE
        );
        let guarded = match &self.shared.routes {
            None => !safe,
            Some(routes) if safe => routes.names_method(req.method(), req.uri(), req.extensions()),
            Some(routes) => routes
                .lookup_request(req.method(), req.uri(), req.headers(), req.extensions())
                .is_some(),
        };
        if !guarded {
            let future = self.inner.call(req);
            return Box::pin(async move { Ok(future.await?.map(RateLimitBody::inner)) });
        }
        // The body is read and the guard asked before the inner service is called: what its
        // readiness holds (a `ConcurrencyLimit` permit, a `Buffer` slot) is given back now and
        // asked again then, so a client trickling its body holds none of it.
        let mut inner = crate::middleware::give_back_readiness(&mut self.inner);
        let shared = Arc::clone(&self.shared);
        let grpc = crate::grpc::call_content_type(&req).cloned();
        Box::pin(async move {
            let early = |refusal: Refusal, key: Option<&crate::key::Key>| {
                refusal.log(key);
                let rendering = Rendering {
                    grpc: grpc.clone(),
                    ..shared.rendering.clone()
                };
                let refusal = refusal.with_rendering(rendering);
                let res = match &shared.on_refusal {
                    Some(f) => {
                        let mut res = f(&refusal);
                        // The hook's response is as much a refusal as the default one.
                        res.extensions_mut().insert(crate::response::Refused);
                        res
                    }
                    None => refusal.default_response(),
                };
                Ok(res.map(RateLimitBody::full))
            };
            let (req, username) = match &shared.username {
                Username::Parts(f) => match f(&RequestView::new(&req)) {
                    Ok(username) => (req, username),
                    Err(kind) => return early(Refusal::of_kind(kind), None),
                },
                Username::Body(f) => {
                    let (parts, body) = req.into_parts();
                    let bytes = match read_capped(body, shared.max_body).await {
                        Ok(bytes) => bytes,
                        Err(kind) => return early(Refusal::of_body(kind, shared.max_body), None),
                    };
                    let username = match f(&RequestView::from_parts(&parts), &bytes) {
                        Ok(username) => username,
                        Err(kind) => return early(Refusal::of_kind(kind), None),
                    };
                    (Request::from_parts(parts, ReqBody::from(bytes)), username)
                }
            };
            let guard = &shared.guard;
            let view = RequestView::new(&req);
            let Some(attempt) = guard.attempt(&view, &username.unwrap_or_default()) else {
                Refusal::warn_missing_peer(view.peer_addr().is_some());
                return early(Refusal::of_kind(RefusalKind::MissingKey), None);
            };
            match guard.check(&attempt).await {
                Ok(decision) => {
                    if let Some(refusal) = decision.refusal() {
                        return early(refusal, Some(attempt.ip_key()));
                    }
                }
                Err(CheckError::Forbidden) => {
                    return early(Refusal::of_kind(RefusalKind::Forbidden), None);
                }
                Err(error) => {
                    let error = store_error(error);
                    return early(Refusal::store_unavailable(Some(error), None), None);
                }
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let res = inner.call(req).await?;
            let Some(status) = answered_status(&res) else {
                // A gRPC call's status comes in the trailers, after the body: the outcome is
                // recorded as they pass (a call cut short records nothing, and keeps its charge).
                let watch = TrailersWatch::new(res.headers(), move |trailers| {
                    let Some(code) = crate::count::grpc_status(trailers) else {
                        return;
                    };
                    let outcome = (shared.classify)(crate::count::grpc_http_equivalent(code));
                    let record = async move {
                        record(&shared.guard, &attempt, outcome)
                            .await
                            .map_err(store_error)
                    };
                    crate::limiter::drive("record a login outcome", Box::pin(record));
                });
                return Ok(res.map(|body| RateLimitBody::watched(body, watch)));
            };
            let outcome = (shared.classify)(status);
            let guard = guard.clone();
            let recorded = async move { record(&guard, &attempt, outcome).await };
            // In a task of its own, awaited: the next attempt sees it, and a client that
            // hangs up meanwhile does not cut it short (a refund made, the tuple not cleared).
            let result = crate::store::to_the_end(recorded).await.unwrap_or_else(|| {
                Err(CheckError::Store(StoreError::Backend(
                    crate::error::Cause::from("the record did not finish"),
                )))
            });
            if let Err(error) = result {
                tracing::warn!(%error, "tollgate: could not record a login outcome");
            }
            Ok(res.map(RateLimitBody::inner))
        })
    }
}

/// The status a login route answered with: the HTTP status, or for a gRPC call the HTTP
/// status its `grpc-status` stands for (`OK` 200, `UNAUTHENTICATED` 401, `PERMISSION_DENIED`
/// 403, …). `None` while a gRPC call's status is still to come in its trailers.
fn answered_status<B>(res: &Response<B>) -> Option<StatusCode> {
    if res.status() != StatusCode::OK || crate::grpc::content_type(res.headers()).is_none() {
        return Some(res.status());
    }
    crate::count::grpc_status(res.headers()).map(crate::count::grpc_http_equivalent)
}

async fn record<St: Store>(
    guard: &LoginGuard<St>,
    attempt: &LoginAttempt,
    outcome: LoginOutcome,
) -> Result<(), CheckError> {
    match outcome {
        LoginOutcome::Success => guard.record_success(attempt).await,
        LoginOutcome::Failure => guard.record_failure(attempt).await,
        LoginOutcome::Unknown => Ok(()),
    }
}

fn store_error(error: CheckError) -> StoreError {
    match error {
        CheckError::Store(e) => e,
        other => StoreError::Backend(crate::error::Cause::from(other.to_string())),
    }
}
