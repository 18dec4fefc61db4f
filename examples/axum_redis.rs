//! An axum server whose limits are shared through Redis by every instance behind a load
//! balancer: per-route policies, the client IP taken from `X-Forwarded-For` only when the
//! peer is a trusted proxy, and a failure mode for when Redis is down.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum_redis --features redis
//! for i in $(seq 6); do curl -s -o /dev/null -w '%{http_code}\n' -XPOST http://127.0.0.1:3000/login; done
//! curl -i http://127.0.0.1:3000/api/items
//! curl -i -H 'X-Forwarded-For: 203.0.113.9' http://127.0.0.1:3000/api/items  # from a trusted proxy (loopback)
//! ```
//!
//! Every instance started against the same Redis enforces one limit together. Each decision
//! is one `EVALSHA`; the script reads the Redis server's clock, so instances with skewed
//! clocks still agree. The app listens on `ADDR` (default `127.0.0.1:3000`).
//!
//! On a Redis Cluster, build the store from `deadpool_redis::cluster::Config::from_urls` and
//! `RedisClusterStore::from_pool` instead (feature `cluster`); nothing else changes: one
//! client's keys share one hash tag, so each decision stays in one slot.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, routing::post, Router};
use tollgate::key::{ClientIp, TrustedProxies};
use tollgate::route::Route;
use tollgate::store::{FailureMode, RedisStore, ResilientStore};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // The application's own pool: tollgate borrows a connection per decision.
    let pool = deadpool_redis::Config::from_url(url.as_str())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    let redis = RedisStore::builder()
        .prefix("axum-example")
        .build_with_pool(pool)?;
    // Fail at start-up rather than on the first request if Redis is unreachable.
    redis.ping().await?;
    // If Redis goes away later, keep limiting locally at a quarter of each limit (4 replicas).
    let store = ResilientStore::builder(redis, FailureMode::LocalFallback { replicas: 4 })
        .timeout(Duration::from_millis(50))
        .deny_cache(10_000)
        .build()?;

    let login = Policy::builder("login", Rate::per_minute(5))
        .sensitive(true)
        .build()?;
    let api = Policy::new("api", Rate::per_second(10))?;
    let api_daily = Policy::new("api-daily", Rate::per_day(10_000))?;
    let site = Policy::new("site", Rate::per_minute(100))?;

    // Behind a proxy on this host (nginx on loopback, say): trust it, and nobody else.
    let client_ip = ClientIp::new(TrustedProxies::loopback());
    let limiter = Limiter::builder()
        .store(store)
        .extractor(client_ip)
        .policy(site)
        .route("POST /login", Route::new().policy(login))
        .route("/api/{*rest}", Route::new().policy(api).policy(api_daily))
        .exempt("/health")
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/login", post(|| async { "welcome (not really)\n" }))
        .route("/api/{*rest}", get(|| async { "[]\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(RateLimitLayer::new(limiter));

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "listening on http://{}, limits kept in {url}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
