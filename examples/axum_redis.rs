//! An axum server whose rate limit is shared through Redis by every instance behind the load
//! balancer.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example axum_redis --features redis
//! curl -i http://127.0.0.1:3000/
//! ```
//!
//! Every instance started against the same Redis enforces one limit together: five requests
//! per ten seconds per client IP, however many instances there are. Each decision is one
//! `EVALSHA`; the script reads the Redis server's clock, so instances with skewed clocks
//! still agree.
//!
//! On a Redis Cluster, build the store from `deadpool_redis::cluster::Config::from_urls`
//! and `RedisClusterStore::from_pool` instead (feature `cluster`); nothing else changes: one
//! client's keys share one hash tag, so each decision stays in one slot.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use tollgate::store::RedisStore;
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let pool = deadpool_redis::Config::from_url(url.as_str())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    let store = RedisStore::builder()
        .prefix("axum-example")
        .build_with_pool(pool)?;
    // Fail at start-up rather than on the first request if Redis is unreachable.
    store.ping().await?;

    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::new(
            "per-ip",
            Rate::new(5, Duration::from_secs(10)),
        )?)
        .build()?; // keyed by the peer IP
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(limiter));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000, limits kept in {url}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
