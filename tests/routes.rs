//! Routes as axum routes them, over a real axum server: `HEAD` counts against `GET` routes,
//! attaching policies through axum's router agrees with the limiter's route table, and the
//! response hook sees every refusal.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use tollgate::key::{from_fn, Key, RequestView};
use tollgate::route::Route;
use tollgate::{Algorithm, Limiter, Policy, Rate, RateLimitLayer, RefusalKind};

fn fixed(name: &str, rate: Rate) -> Policy {
    Policy::builder(name, rate)
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap()
}

async fn send(client: &reqwest::Client, method: &str, url: &str) -> u16 {
    client
        .request(method.parse().unwrap(), url)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn head_requests_count_against_the_get_route() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let limiter = Limiter::builder()
        .route(
            "GET /search",
            Route::new().policy(Policy::new("search", Rate::per_minute(2)).unwrap()),
        )
        .policy(Policy::new("default", Rate::per_minute(1000)).unwrap())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/search",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { "results" }
            }),
        )
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/search");
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(send(&client, "GET", &url).await);
    }
    for _ in 0..5 {
        statuses.push(send(&client, "HEAD", &url).await);
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429, 429, 429]);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the handler ran past the limit"
    );
}

/// The same policies attached both ways; the statuses of a request sequence must agree.
#[tokio::test]
async fn attaching_through_axum_agrees_with_the_route_table() {
    let item = || Route::new().policy(fixed("item", Rate::per_minute(2)));
    let files = || Route::new().policy(fixed("files", Rate::per_minute(1)));
    let key = || {
        from_fn(|req: &RequestView<'_>| {
            req.headers()
                .get("x-user")
                .map(|v| Key::new("user", v.as_bytes()))
                .or_else(|| Some(Key::global("all")))
        })
    };
    let handler = || get(|| async { "ok" });

    let by_table = Router::new()
        .route("/items/{id}", handler())
        .nest("/v1", Router::new().route("/files/{*path}", handler()))
        .route("/health", handler())
        .layer(RateLimitLayer::new(
            Limiter::builder()
                .route("GET /items/{id}", item())
                .route("GET /v1/files/{*path}", files())
                .default_route(Route::exempt())
                .extractor(key())
                .build()
                .unwrap(),
        ));

    let limits = RateLimitLayer::new(
        Limiter::builder()
            .default_route(Route::exempt())
            .extractor(key())
            .build()
            .unwrap(),
    );
    let by_router = Router::new()
        .route(
            "/items/{id}",
            handler().route_layer(limits.for_route(item()).unwrap()),
        )
        .nest(
            "/v1",
            Router::new().route(
                "/files/{*path}",
                handler().route_layer(limits.for_route(files()).unwrap()),
            ),
        )
        .route("/health", handler());

    let sequence = [
        ("GET", "/items/1"),
        ("HEAD", "/items/2"),
        ("GET", "/items/3"),
        ("GET", "/v1/files/a/b.txt"),
        ("HEAD", "/v1/files/c"),
        ("GET", "/health"),
        ("GET", "/health"),
        ("GET", "/health"),
    ];
    let mut results = vec![];
    for app in [by_table, by_router] {
        let addr = support::serve(app).await;
        let client = reqwest::Client::new();
        let mut statuses = vec![];
        for (method, path) in sequence {
            statuses.push(send(&client, method, &format!("http://{addr}{path}")).await);
        }
        results.push(statuses);
    }
    assert_eq!(results[0], [200, 200, 429, 200, 429, 200, 200, 200]);
    assert_eq!(results[0], results[1]);
}

#[tokio::test]
async fn the_hook_sees_every_refusal() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let limiter = Limiter::builder()
        .default_route(
            Route::new()
                .policy(fixed("api", Rate::per_minute(1)))
                .cost_fn(|req| {
                    req.headers()
                        .get("x-cost")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                }),
        )
        .extractor(from_fn(|req: &RequestView<'_>| {
            req.headers()
                .get("x-user")
                .map(|v| Key::new("user", v.as_bytes()))
        }))
        .deny_key(Key::new("user", "mallory"))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter).on_refusal(move |refusal| {
        log.lock().unwrap().push(refusal.kind());
        let mut res = refusal.default_response();
        res.headers_mut()
            .insert("x-refused-by", http::HeaderValue::from_static("tollgate"));
        res
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/");
    let cases: [(&[(&str, &str)], u16); 5] = [
        (&[("x-user", "mallory")], 403),
        (&[], 400),
        (&[("x-user", "alice"), ("x-cost", "5")], 429),
        (&[("x-user", "alice")], 200),
        (&[("x-user", "alice")], 429),
    ];
    for (headers, status) in cases {
        let mut req = client.get(&url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status().as_u16(), status, "{headers:?}");
        if status != 200 {
            assert_eq!(res.headers()["x-refused-by"], "tollgate");
        }
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [
            RefusalKind::Forbidden,
            RefusalKind::MissingKey,
            RefusalKind::CostExceedsCapacity,
            RefusalKind::RateLimited
        ]
    );
}

#[tokio::test]
async fn a_refused_grpc_call_gets_the_grpc_code_of_its_refusal() {
    let limiter = Limiter::builder()
        .policy(Policy::new("rpc", Rate::per_minute(5)).unwrap())
        .extractor(from_fn(|_: &RequestView<'_>| {
            Some(Key::new("user", "mallory"))
        }))
        .deny_key(Key::new("user", "mallory"))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/pkg.Svc/Call", axum::routing::post(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/pkg.Svc/Call"))
        .header("content-type", "application/grpc")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.headers()["grpc-status"], "7"); // PERMISSION_DENIED
}

/// Inside axum's `nest` a layer sees the path with the prefix stripped: a pattern written
/// with it (`POST /auth/login` for a layer inside `nest("/auth", …)`) matched nothing, so the
/// route's strict limit, and the login guard's routes, silently guarded nothing. A pattern
/// written relative to the nested router still matches as before.
#[tokio::test]
async fn patterns_with_the_nest_prefix_guard_routes_inside_a_nested_router() {
    use axum::http::{HeaderName, StatusCode};
    use axum::routing::post;
    use tollgate::login::{LoginGuard, LoginLayer};

    let limiter = |pattern: &str| {
        Limiter::builder()
            .route(
                pattern,
                Route::new().policy(Policy::new("login", Rate::per_minute(1)).unwrap()),
            )
            .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
            .extractor(tollgate::key::Global::new())
            .build()
            .unwrap()
    };
    let client = reqwest::Client::new();
    for pattern in ["POST /auth/login", "POST /login"] {
        let app = Router::new().nest(
            "/auth",
            Router::new()
                .route("/login", post(|| async { "ok" }))
                .route("/other", post(|| async { "ok" }))
                .layer(RateLimitLayer::new(limiter(pattern))),
        );
        let addr = support::serve(app).await;
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let res = client
                .post(format!("http://{addr}/auth/login"))
                .send()
                .await
                .unwrap();
            statuses.push(res.status().as_u16());
        }
        assert_eq!(statuses, [200, 429, 429], "{pattern}");
        let res = client
            .post(format!("http://{addr}/auth/other"))
            .send()
            .await
            .unwrap();
        assert_eq!(
            res.status(),
            200,
            "{pattern}: the other route keeps its policy"
        );
    }

    let guard = LoginGuard::builder()
        .ip_user_rate(Rate::per_minute(1))
        .build()
        .unwrap();
    let login = LoginLayer::header(guard, HeaderName::from_static("x-username"))
        .routes(["POST /auth/login"])
        .unwrap();
    let app = Router::new().nest(
        "/auth",
        Router::new()
            .route("/login", post(|| async { StatusCode::UNAUTHORIZED }))
            .layer(login),
    );
    let addr = support::serve(app).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let res = client
            .post(format!("http://{addr}/auth/login"))
            .header("x-username", "alice")
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [401, 429, 429]);
}

/// A route's own policy attached with `for_route` inside the service-wide layer: the route's
/// 429 carries the route's numbers, not the outer policy's that admitted the request (the
/// outer layer wrote its own quota headers over the refusal's: `Retry-After` from the login
/// policy beside `RateLimit-Remaining: 118` from the pages policy). An allowed response
/// carries the headers of the layer with fewer units left.
#[tokio::test]
async fn an_inner_refusal_keeps_its_own_quota_headers_under_an_outer_layer() {
    let limits = RateLimitLayer::new(
        Limiter::builder()
            .policy(fixed("pages", Rate::per_minute(120)))
            .extractor(tollgate::key::Global::new())
            .build()
            .unwrap(),
    );
    let login = Route::new().policy(fixed("login", Rate::per_minute(1)));
    let app = Router::new()
        .route(
            "/login",
            axum::routing::post(|| async { "welcome" })
                .route_layer(limits.for_route(login).unwrap()),
        )
        .route("/", get(|| async { "home" }))
        .layer(limits);
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let post = || client.post(format!("http://{addr}/login")).send();
    let allowed = post().await.unwrap();
    assert_eq!(allowed.status(), 200);
    // The allowed response's headers are the tighter layer's: the route's last unit is gone,
    // though the outer policy has 119 left (it once wrote 120 / 119 over the route's 1 / 0,
    // and the client's next request was refused without warning).
    let allowed_header = |name: &str| allowed.headers().get(name).unwrap().to_str().unwrap();
    assert_eq!(
        allowed_header("ratelimit-limit"),
        "1",
        "{:?}",
        allowed.headers()
    );
    assert_eq!(allowed_header("ratelimit-remaining"), "0");
    assert_eq!(allowed_header("x-ratelimit-remaining"), "0");
    let refused = post().await.unwrap();
    assert_eq!(refused.status(), 429);
    let header = |name: &str| {
        refused
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    assert_eq!(
        header("x-ratelimit-limit").as_deref(),
        Some("1"),
        "{:?}",
        refused.headers()
    );
    assert_eq!(header("x-ratelimit-remaining").as_deref(), Some("0"));
    assert!(header("retry-after").is_some());
    let home = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(
        home.headers().get("x-ratelimit-limit").unwrap(),
        "120",
        "an allowed response carries the outer layer's headers"
    );
}
