//! The decision where operators and handlers look: on the request's `TraceLayer` span, and as a
//! `RateLimitInfo` in the request extensions (for the handler) and the response extensions
//! (for `TraceLayer::on_response`). A real axum server on loopback, a real HTTP client, and
//! a `tracing` subscriber that only lets INFO through (so no debug event can stand in for the
//! span fields).

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{Request, Response};
use reqwest::StatusCode;
use tollgate::key::Key;
use tollgate::route::Route;
use tollgate::{DecidedBy, Limiter, Policy, Rate, RateLimitInfo, RateLimitLayer, RefusalKind};
use tower_http::trace::TraceLayer;
use tracing::field::{Empty, Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The fields of every closed `request` span, in closing order.
#[derive(Clone, Default)]
struct Closed(Arc<Mutex<Vec<HashMap<String, String>>>>);

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Closed {
    /// The first `n` closed spans, once there are that many (a span closes after its response
    /// is written).
    async fn wait(&self, n: usize) -> Vec<HashMap<String, String>> {
        loop {
            let spans = self.0.lock().unwrap().clone();
            if spans.len() >= n {
                return spans;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// An app limited to `per_minute` requests per tenant, inside a `TraceLayer` whose spans
/// `make_span` opens.
fn traced_app(per_minute: u64, make_span: fn(&Request<Body>) -> tracing::Span) -> Router {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(per_minute)).unwrap())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(limiter))
        .layer(TraceLayer::new_for_http().make_span_with(make_span))
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Closed {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            if span.name() == "request" {
                if let Some(fields) = span.extensions_mut().remove::<Fields>() {
                    self.0.lock().unwrap().push(fields.0);
                }
            }
        }
    }
}

/// The span a user declares, as the README shows it.
fn request_span(req: &Request<Body>) -> tracing::Span {
    tracing::info_span!(
        "request",
        method = %req.method(),
        uri = %req.uri(),
        ratelimit.key = Empty,
        ratelimit.policy = Empty,
        ratelimit.allowed = Empty,
        ratelimit.remaining = Empty,
        ratelimit.outcome = Empty,
        ratelimit.refusal = Empty,
    )
}

#[tokio::test]
async fn the_decision_fills_the_fields_a_trace_layer_span_declares() {
    let closed = Closed::default();
    let subscriber =
        tracing_subscriber::registry().with(closed.clone().with_filter(LevelFilter::INFO));
    // The server runs on this (current-thread) runtime, so the thread's default subscriber
    // sees its spans.
    let _guard = tracing::subscriber::set_default(subscriber);

    let addr = support::serve(traced_app(2, request_span)).await;
    let client = reqwest::Client::new();
    let get = |tenant: Option<&str>| {
        let mut req = client.get(format!("http://{addr}/"));
        if let Some(tenant) = tenant {
            req = req.header("x-tenant", tenant);
        }
        req.send()
    };
    assert_eq!(get(Some("acme")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(get(Some("acme")).await.unwrap().status(), StatusCode::OK);
    let res = get(Some("acme")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let res = get(None).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);

    let spans = closed.wait(4).await;
    let digest = tollgate::key::digest(&Key::new("tenant", "acme"));
    assert_eq!(digest.len(), 16);
    let field = |i: usize, name: &str| spans[i].get(name).cloned();
    for (i, remaining) in [(0, "1"), (1, "0")] {
        assert_eq!(field(i, "ratelimit.key").as_deref(), Some(digest.as_str()));
        assert_eq!(field(i, "ratelimit.policy").as_deref(), Some("api"));
        assert_eq!(field(i, "ratelimit.allowed").as_deref(), Some("true"));
        assert_eq!(field(i, "ratelimit.remaining").as_deref(), Some(remaining));
        assert_eq!(field(i, "ratelimit.outcome").as_deref(), Some("decided"));
        assert_eq!(field(i, "ratelimit.refusal"), None);
    }
    assert_eq!(field(2, "ratelimit.key").as_deref(), Some(digest.as_str()));
    assert_eq!(field(2, "ratelimit.policy").as_deref(), Some("api"));
    assert_eq!(field(2, "ratelimit.allowed").as_deref(), Some("false"));
    assert_eq!(field(2, "ratelimit.remaining").as_deref(), Some("0"));
    assert_eq!(field(2, "ratelimit.outcome").as_deref(), Some("decided"));
    assert_eq!(
        field(2, "ratelimit.refusal").as_deref(),
        Some("rate_limit_exceeded")
    );
    // Refused before any policy: no key, no policy, but the refusal and `allowed`.
    assert_eq!(field(3, "ratelimit.key"), None);
    assert_eq!(field(3, "ratelimit.allowed").as_deref(), Some("false"));
    assert_eq!(
        field(3, "ratelimit.refusal").as_deref(),
        Some("missing_rate_limit_key")
    );
    // The raw key is nowhere.
    for span in &spans {
        assert!(span.values().all(|v| !v.contains("acme")), "{span:?}");
    }
}

#[tokio::test]
async fn a_span_that_declares_nothing_is_left_alone() {
    let closed = Closed::default();
    let subscriber = tracing_subscriber::registry().with(closed.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let bare = |_: &Request<Body>| tracing::info_span!("request");
    let addr = support::serve(traced_app(1, bare)).await;
    let res = reqwest::Client::new()
        .get(format!("http://{addr}/"))
        .header("x-tenant", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let spans = closed.wait(1).await;
    assert!(spans[0].is_empty(), "{:?}", spans[0]);
}

/// What `TraceLayer::on_response` read from the response extensions, per request.
type Seen = Arc<Mutex<Vec<Option<RateLimitInfo>>>>;

#[tokio::test]
async fn the_handler_and_on_response_see_the_decision() {
    let seen: Seen = Arc::default();
    let on_response = {
        let seen = Arc::clone(&seen);
        move |res: &Response<_>, _: std::time::Duration, _: &tracing::Span| {
            let info = res.extensions().get::<RateLimitInfo>().cloned();
            seen.lock().unwrap().push(info);
        }
    };
    let limits = RateLimitLayer::new(
        Limiter::builder()
            .route(
                "GET /search",
                Route::new().policy(Policy::new("search", Rate::per_minute(2)).unwrap()),
            )
            .exempt("/health")
            .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
            .extractor(support::by_tenant())
            .build()
            .unwrap(),
    )
    .info_extensions(true);
    let app =
        Router::new()
            .route(
                "/search",
                get(|Extension(info): Extension<RateLimitInfo>| async move {
                    format!(
                        "{} {}/{} {}",
                        info.policy().unwrap_or("-"),
                        info.remaining(),
                        info.limit(),
                        info.decided_by().map_or("-", |o| o.as_str())
                    )
                }),
            )
            .route(
                "/health",
                get(|info: Option<Extension<RateLimitInfo>>| async move {
                    format!("{}", info.is_some())
                }),
            )
            .layer(limits)
            .layer(TraceLayer::new_for_http().on_response(on_response));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let get = |path: &str| {
        client
            .get(format!("http://{addr}{path}"))
            .header("x-tenant", "acme")
            .send()
    };
    let body = |res: reqwest::Response| async move { res.text().await.unwrap() };
    assert_eq!(
        body(get("/search").await.unwrap()).await,
        "search 1/2 decided"
    );
    assert_eq!(
        body(get("/search").await.unwrap()).await,
        "search 0/2 decided"
    );
    let res = get("/search").await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // An exempt route is not decided: nothing to show.
    assert_eq!(body(get("/health").await.unwrap()).await, "false");

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    let allowed = seen[1]
        .as_ref()
        .expect("an allowed response carries the info");
    assert_eq!(allowed.policy(), Some("search"));
    assert!(allowed.is_allowed());
    assert_eq!((allowed.limit(), allowed.remaining()), (2, 0));
    assert_eq!(allowed.decided_by(), Some(DecidedBy::Decided));
    assert!(allowed.reset_after() > std::time::Duration::ZERO);
    assert_eq!(allowed.refusal(), None);
    let refused = seen[2].as_ref().expect("a refusal carries the info");
    assert_eq!(refused.policy(), Some("search"));
    assert!(!refused.is_allowed());
    assert_eq!(refused.remaining(), 0);
    assert_eq!(refused.refusal(), Some(RefusalKind::RateLimited));
    assert!(refused.retry_after().is_some());
    assert_eq!(seen[3], None);
}

/// The login guard fills the same span fields on every attempt it decides, admitted or
/// refused, keyed by the client IP's digest.
#[tokio::test]
async fn a_login_attempt_fills_the_span_whether_admitted_or_refused() {
    use axum::routing::post;
    use tollgate::login::{LoginGuard, LoginLayer};

    let closed = Closed::default();
    let subscriber =
        tracing_subscriber::registry().with(closed.clone().with_filter(LevelFilter::INFO));
    let _guard = tracing::subscriber::set_default(subscriber);

    let guard = LoginGuard::builder()
        .ip_user_rate(Rate::per_minute(1))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", post(|| async { http::StatusCode::UNAUTHORIZED }))
        .layer(LoginLayer::json_field(guard, "username"))
        .layer(TraceLayer::new_for_http().make_span_with(request_span));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    for expected in [StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS] {
        let res = client
            .post(format!("http://{addr}/login"))
            .json(&serde_json::json!({ "username": "alice", "password": "guess" }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), expected);
    }
    let spans = closed.wait(2).await;
    let field = |i: usize, name: &str| spans[i].get(name).cloned();
    for (i, allowed) in [(0, "true"), (1, "false")] {
        let key = field(i, "ratelimit.key").expect("the client IP's digest");
        assert_eq!(key.len(), 16);
        assert_eq!(
            field(i, "ratelimit.policy").as_deref(),
            Some("login.ip-user")
        );
        assert_eq!(field(i, "ratelimit.allowed").as_deref(), Some(allowed));
        assert_eq!(field(i, "ratelimit.outcome").as_deref(), Some("decided"));
    }
    assert_eq!(field(0, "ratelimit.remaining").as_deref(), Some("0"));
    assert_eq!(field(0, "ratelimit.refusal"), None);
    assert!(field(1, "ratelimit.refusal").is_some());
}
