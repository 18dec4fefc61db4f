//! Per-route policies end to end through a real axum app.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use reqwest::StatusCode;
use tollgate::clock::ManualClock;
use tollgate::key::{from_fn, Key};
use tollgate::route::Route;
use tollgate::store::MemoryStore;
use tollgate::{Algorithm, Limiter, Policy, Rate, RateLimitLayer};

fn app() -> Router {
    Router::new()
        .route("/login", post(|| async { "login" }))
        .route(
            "/api/{*rest}",
            get(|| async { "api" }).post(|| async { "api" }),
        )
        .route("/api/search", get(|| async { "search" }))
        .route("/health", get(|| async { "ok" }))
        .route("/other", get(|| async { "other" }))
        .route("/llm", post(|| async { "llm" }))
}

fn fixed(name: &str, rate: Rate) -> Policy {
    Policy::builder(name, rate)
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap()
}

struct Client {
    addr: SocketAddr,
    http: reqwest::Client,
}

impl Client {
    async fn status(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> StatusCode {
        self.send(method, path, headers).await.status()
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = self.http.request(
            method.parse().unwrap(),
            format!("http://{}{}", self.addr, path),
        );
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send().await.unwrap()
    }
}

async fn start(limiter: Limiter) -> Client {
    Client {
        addr: support::serve(
            app().layer(RateLimitLayer::new(limiter).quota_headers_on_success(true)),
        )
        .await,
        http: reqwest::Client::new(),
    }
}

#[tokio::test]
async fn routes_match_most_specific_first_and_exempt_routes_skip() {
    let limiter = Limiter::builder()
        .policy(fixed("default", Rate::per_minute(1)))
        .route(
            "POST /login",
            Route::new().policy(fixed("login", Rate::per_minute(2))),
        )
        .route(
            "/api/{*rest}",
            Route::new().policy(fixed("api", Rate::per_minute(3))),
        )
        .route(
            "/api/search",
            Route::new().policy(fixed("search", Rate::per_minute(4))),
        )
        .exempt("/health")
        .build()
        .unwrap();
    let c = start(limiter).await;
    let limit_of = |res: &reqwest::Response| {
        res.headers()["ratelimit-limit"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(limit_of(&c.send("POST", "/login", &[]).await), "2");
    assert_eq!(limit_of(&c.send("GET", "/api/a/b", &[]).await), "3");
    assert_eq!(limit_of(&c.send("GET", "/api/search", &[]).await), "4");
    assert_eq!(limit_of(&c.send("GET", "/other", &[]).await), "1");
    // The login route's pattern names POST; a GET to it falls back to the default route.
    assert_eq!(
        c.status("GET", "/other", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..20 {
        let res = c.send("GET", "/health", &[]).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit-limit").is_none());
    }
    // Each route keeps its own quota.
    assert_eq!(c.status("POST", "/login", &[]).await, StatusCode::OK);
    assert_eq!(
        c.status("POST", "/login", &[]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(c.status("GET", "/api/x", &[]).await, StatusCode::OK);
}

#[tokio::test]
async fn layered_limits_all_must_pass_and_deny_charges_none() {
    let clock = ManualClock::new(1_000_000);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .route(
            "/api/{*rest}",
            Route::new()
                .policy(fixed("per-second", Rate::per_second(2)))
                .policy(fixed("per-day", Rate::per_day(5))),
        )
        .default_route(Route::exempt())
        .build()
        .unwrap();
    let c = start(limiter).await;
    let mut ok = 0;
    for second in 0..5 {
        for _ in 0..4 {
            ok += usize::from(c.status("GET", "/api/x", &[]).await == StatusCode::OK);
        }
        if second < 4 {
            clock.advance(Duration::from_secs(1));
        }
    }
    // 2 per second for 3 s = 6 attempts allowed by the burst limit, but only 5 per day; the
    // 14 denials charged nothing, or the daily quota would have run out sooner.
    assert_eq!(ok, 5);
    let res = c.send("GET", "/api/x", &[]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["ratelimit-limit"],
        "5",
        "the daily policy governs now"
    );
}

#[tokio::test]
async fn tiers_choose_the_rate_per_request() {
    let limiter = Limiter::builder()
        .route(
            "/api/{*rest}",
            Route::new()
                .policy(fixed("anon", Rate::per_minute(1)))
                .tier("free", [fixed("free", Rate::per_minute(2))])
                .tier("pro", [fixed("pro", Rate::per_minute(5))]),
        )
        .tier_fn(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
        .extractor(from_fn(|req| {
            req.headers()
                .get("x-user")
                .map(|v| Key::new("user", v.as_bytes()))
        }))
        .default_route(Route::exempt())
        .build()
        .unwrap();
    let c = start(limiter).await;
    let count = |plan: &'static str, user: &'static str| {
        let c = &c;
        async move {
            let mut ok = 0;
            for _ in 0..10 {
                let mut h = vec![("x-user", user)];
                if !plan.is_empty() {
                    h.push(("x-plan", plan));
                }
                ok += usize::from(c.status("GET", "/api/x", &h).await == StatusCode::OK);
            }
            ok
        }
    };
    assert_eq!(count("pro", "a").await, 5);
    assert_eq!(count("free", "b").await, 2);
    assert_eq!(count("", "c").await, 1);
    assert_eq!(
        count("platinum", "d").await,
        1,
        "unknown tiers get the untiered policy"
    );
}

#[tokio::test]
async fn costs_fixed_and_computed() {
    let bucket = |name: &str| {
        Policy::builder(name, Rate::per_hour(10))
            .algorithm(Algorithm::TokenBucket)
            .build()
            .unwrap()
    };
    let limiter = Limiter::builder()
        .route("POST /llm", Route::new().policy(bucket("llm")).cost(4))
        .route(
            "/api/{*rest}",
            Route::new().policy(bucket("batch")).cost_fn(|req| {
                req.headers()
                    .get("x-batch")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            }),
        )
        .default_route(Route::exempt())
        .build()
        .unwrap();
    let c = start(limiter).await;
    let mut ok = 0;
    for _ in 0..5 {
        ok += usize::from(c.status("POST", "/llm", &[]).await == StatusCode::OK);
    }
    assert_eq!(ok, 2, "cost 4 from 10 tokens: two calls");
    assert_eq!(
        c.status("GET", "/api/x", &[("x-batch", "7")]).await,
        StatusCode::OK
    );
    assert_eq!(
        c.status("GET", "/api/x", &[("x-batch", "4")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        c.status("GET", "/api/x", &[("x-batch", "3")]).await,
        StatusCode::OK
    );
    let res = c.send("GET", "/api/x", &[("x-batch", "11")]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        res.headers().get("retry-after").is_none(),
        "waiting would not help"
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "cost_exceeds_capacity");
}

#[tokio::test]
async fn config_mistakes_name_the_field() {
    let err = Limiter::builder()
        .route(
            "POST /llm",
            Route::new()
                .policy(fixed("llm", Rate::per_minute(3)))
                .cost(4),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[0].cost");
    let err = Limiter::builder()
        .route("/a", Route::new().policy(fixed("x", Rate::per_minute(3))))
        .route(
            "/a/{*x}/b",
            Route::new().policy(fixed("y", Rate::per_minute(3))),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[1].pattern");
    let err = Limiter::builder()
        .policy(fixed("x", Rate::per_minute(3)))
        .allow_cidr("10.0.0.0/8")
        .allow_cidr("banana")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "allow_cidrs[1]");

    // An exempt route charges and counts nothing: a cost or a counting rule on one is a
    // setting nothing reads, refused as the plan refuses it.
    let exempt_with = |route: Route| {
        Limiter::builder()
            .policy(fixed("x", Rate::per_minute(3)))
            .route("/health", route)
            .build()
            .map(|_| ())
            .unwrap_err()
    };
    assert_eq!(
        exempt_with(Route::exempt().cost(5)).field(),
        "routes[0].cost"
    );
    assert_eq!(
        exempt_with(Route::exempt().cost_fn(|_| 2)).field(),
        "routes[0].cost"
    );
    assert_eq!(
        exempt_with(Route::exempt().count_when(tollgate::route::CountWhen::failures())).field(),
        "routes[0].count"
    );
    let err = Limiter::builder()
        .default_route(Route::exempt().cost(3))
        .build()
        .map(|_| ())
        .unwrap_err();
    assert!(err.field().ends_with("cost"), "{err}");
}

#[tokio::test]
async fn allow_and_deny_lists() {
    let user = |req: &tollgate::key::RequestView<'_>| {
        req.headers()
            .get("x-user")
            .map(|v| Key::new("user", v.as_bytes()))
    };
    let limiter = Limiter::builder()
        .policy(fixed("api", Rate::per_minute(1)))
        .extractor(from_fn(user))
        .allow_key(Key::new("user", "monitoring"))
        .deny_key(Key::new("user", "mallory"))
        .build()
        .unwrap();
    let c = start(limiter).await;
    for _ in 0..5 {
        let res = c.send("GET", "/other", &[("x-user", "monitoring")]).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit-limit").is_none());
    }
    assert_eq!(
        c.status("GET", "/other", &[("x-user", "mallory")]).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        c.status("GET", "/other", &[("x-user", "alice")]).await,
        StatusCode::OK
    );
    assert_eq!(
        c.status("GET", "/other", &[("x-user", "alice")]).await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // CIDRs apply to IP keys; the test client is 127.0.0.1.
    let limiter = Limiter::builder()
        .policy(fixed("api", Rate::per_minute(1)))
        .deny_cidr("127.0.0.0/8")
        .build()
        .unwrap();
    let c = start(limiter).await;
    assert_eq!(c.status("GET", "/other", &[]).await, StatusCode::FORBIDDEN);
    let limiter = Limiter::builder()
        .policy(fixed("api", Rate::per_minute(1)))
        .allow_cidr("127.0.0.1")
        .build()
        .unwrap();
    let c = start(limiter).await;
    for _ in 0..3 {
        assert_eq!(c.status("GET", "/other", &[]).await, StatusCode::OK);
    }
}

#[tokio::test]
async fn shadow_policies_count_but_never_reject() {
    let shadow = Policy::builder("new-limit", Rate::per_minute(2))
        .algorithm(Algorithm::FixedWindow)
        .shadow(true)
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .policy(fixed("current", Rate::per_minute(100)))
        .policy(shadow)
        .build()
        .unwrap();
    let c = start(limiter.clone()).await;
    for _ in 0..5 {
        let res = c.send("GET", "/other", &[]).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["ratelimit-limit"], "100");
    }
    // Shadow checks run beside the request; give them a moment to land.
    for _ in 0..100 {
        if support::shadow_counts(&limiter) == (2, 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(support::shadow_counts(&limiter), (2, 3));
}

#[tokio::test]
async fn penalties_block_for_their_duration() {
    let clock = ManualClock::new(5_000_000);
    let login = Policy::builder("login", Rate::per_minute(2))
        .algorithm(Algorithm::FixedWindow)
        .penalty(Duration::from_secs(300))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .route("POST /login", Route::new().policy(login))
        .default_route(Route::exempt())
        .build()
        .unwrap();
    let c = start(limiter).await;
    assert_eq!(c.status("POST", "/login", &[]).await, StatusCode::OK);
    assert_eq!(c.status("POST", "/login", &[]).await, StatusCode::OK);
    let res = c.send("POST", "/login", &[]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "300");
    // The minute window has long reset, but the block holds.
    clock.advance(Duration::from_secs(120));
    let res = c.send("POST", "/login", &[]).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "180");
    clock.advance(Duration::from_secs(180));
    assert_eq!(c.status("POST", "/login", &[]).await, StatusCode::OK);
}
