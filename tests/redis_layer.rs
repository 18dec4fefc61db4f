//! The layer's per-route features against a real Redis: layered limits, penalties and shadow
//! policies behave as with the memory store.

mod support;

use std::time::Duration;

use axum::routing::post;
use axum::Router;
use tollgate::clock::ManualClock;
use tollgate::route::Route;
use tollgate::store::RedisStore;
use tollgate::{Algorithm, Limiter, Policy, Rate, RateLimitLayer};

use support::RedisServer;

#[tokio::test]
async fn penalties_layered_limits_and_shadow_through_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(server.now_millis());
    let store = RedisStore::builder()
        .prefix("layer")
        .clock(clock.clone())
        .build_with_url(&server.url())
        .unwrap();
    let login = Policy::builder("login", Rate::per_minute(2))
        .algorithm(Algorithm::SlidingWindowLog)
        .penalty(Duration::from_secs(600))
        .build()
        .unwrap();
    let daily = Policy::new("login-daily", Rate::per_day(100)).unwrap();
    let watch = Policy::builder("login-watch", Rate::per_minute(1))
        .shadow(true)
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .route(
            "POST /login",
            Route::new().policy(login).policy(daily).policy(watch),
        )
        .default_route(Route::exempt())
        .build()
        .unwrap();
    let addr = support::serve(
        Router::new()
            .route("/login", post(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter.clone())),
    )
    .await;
    let client = reqwest::Client::new();
    let post = || client.post(format!("http://{addr}/login")).send();

    assert_eq!(post().await.unwrap().status(), 200);
    assert_eq!(post().await.unwrap().status(), 200);
    let res = post().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "600");
    // The denial charged nothing: the daily policy counted two requests.
    assert_eq!(res.headers()["ratelimit-limit"], "2");

    clock.advance(Duration::from_secs(120));
    let res = post().await.unwrap();
    assert_eq!(res.status(), 429, "the block outlives the window");
    assert_eq!(res.headers()["retry-after"], "480");

    clock.advance(Duration::from_secs(480));
    let res = post().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["ratelimit-remaining"], "1");

    // The shadow policy (1 per minute) never rejected, but counted its would-be denials.
    for _ in 0..100 {
        if support::shadow_counts(&limiter) == (3, 2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // It saw all five requests: allowed at 0 s, denied twice at 0 s, allowed again at 120 s
    // and 600 s (fresh windows).
    assert_eq!(support::shadow_counts(&limiter), (3, 2));
    // Every key has a TTL.
    for key in server.scan("layer:*") {
        let ttl: i64 = server.query(&["PTTL", &key]).unwrap();
        assert!(ttl > 0, "{key} has no TTL");
    }
}
