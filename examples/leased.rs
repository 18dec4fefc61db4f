//! An axum server whose per-client limit is shared through Redis by every instance, with
//! hot clients decided locally from blocks of quota leased from Redis: no round trip per
//! request, and the limit is never exceeded across instances.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 ADDR=127.0.0.1:3000 cargo run --release --example leased --features redis
//! REDIS_URL=redis://127.0.0.1:6379 ADDR=127.0.0.1:3001 cargo run --release --example leased --features redis
//! for i in $(seq 1200); do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:300$((i % 2))/; done | sort | uniq -c
//! ```
//!
//! Both instances together admit what one exact limiter of 1000 per minute per client IP
//! would, never more: the default sliding window counter admits about 1000 in any minute,
//! at most 1000 within each calendar minute, and, across a minute boundary, at most
//! `1000 + 1000·L/60 s` in any span of `L` (a few more than 1000 can pass in the 60 s
//! straddling two windows; see `tollgate::algorithm::sliding_window_counter`). Each
//! response carries `RateLimit-Limit: 1000`. A client that stays quiet is decided exactly,
//! one call per request; a busy one takes blocks of at most a tenth of the limit, and the
//! units it does not use go back to Redis when the block ends or on shutdown (Ctrl-C).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use tollgate::key::{ClientIp, TrustedProxies};
use tollgate::store::leased::LeasedStore;
use tollgate::store::{FailureMode, RedisStore, ResilientStore};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let addr: SocketAddr = std::env::var("ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()?;
    let redis = RedisStore::builder()
        .prefix("leased-example")
        .timeout(Duration::from_millis(200))
        .build_with_url(&url)?;
    // Fail at start-up rather than on the first request if Redis is unreachable.
    redis.ping().await?;
    let leased = LeasedStore::builder(redis)
        .lease_time(Duration::from_millis(500))
        .build()?;
    // Blocks in hand keep deciding through a Redis outage; after that, refuse (503).
    let store = ResilientStore::builder(leased.clone(), FailureMode::FailClosed)
        .timeout(Duration::from_millis(250))
        .build()?;

    let per_client = Policy::new("per-client", Rate::per_minute(1000))?;
    println!(
        "limit: {} requests per minute per client IP, shared through {url}",
        per_client.limit()
    );
    let limiter = Limiter::builder()
        .store(store)
        .extractor(ClientIp::new(TrustedProxies::none()))
        .policy(per_client)
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(limiter));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{addr}");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    // Graceful shutdown: the unused units of every block go back to Redis.
    leased.shutdown().await;
    Ok(())
}
