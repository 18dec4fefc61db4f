//! Metrics for Prometheus: tollgate's counters and store-latency histogram through the
//! `metrics` facade, exposed by `metrics-exporter-prometheus` (see
//! `tollgate::observability` for every name and label).
//!
//! ```text
//! cargo run --example metrics --features metrics
//! curl -s http://127.0.0.1:3000/search       # twice: the second is a 429
//! curl -s http://127.0.0.1:3000/             # shows the remaining quota
//! curl -s http://127.0.0.1:9000/metrics | grep tollgate
//! ```
//!
//! The scrape then shows, among others:
//!
//! ```text
//! tollgate_decisions_total{outcome="decided",allowed="false",store="memory",policy="search",route="GET /search"} 1
//! tollgate_refusals_total{kind="rate_limited"} 1
//! ```
//!
//! The app listens on `ADDR` (default `127.0.0.1:3000`), the exporter on `METRICS_ADDR`
//! (default `127.0.0.1:9000`). The store-latency histogram appears once a `ResilientStore`
//! wraps a network store (Redis); its buckets are set here, as the exporter would otherwise
//! render it as a summary. With the `redis` feature and `REDIS_URL` set, the limits live in
//! that Redis behind a fail-open `ResilientStore` (what `observability/render_chart.py` runs
//! to draw the chart in `docs/observability.md`).

use std::net::SocketAddr;

use axum::{routing::get, Extension, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tollgate::route::Route;
use tollgate::store::{DynStore, MemoryStore};
use tollgate::{Limiter, Policy, Rate, RateLimitInfo, RateLimitLayer};

#[path = "support/report.rs"]
mod report;

/// A fail-open `ResilientStore` over the Redis at `REDIS_URL`, when set (feature `redis`);
/// else a memory store.
fn store() -> Result<DynStore, Box<dyn std::error::Error>> {
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("REDIS_URL") {
        use tollgate::store::{FailureMode, RedisStore, ResilientStore};
        let redis = RedisStore::builder()
            .prefix("metrics-example")
            .build_with_url(&url)?;
        return Ok(DynStore::new(
            ResilientStore::builder(redis, FailureMode::FailOpen).build()?,
        ));
    }
    Ok(DynStore::new(MemoryStore::new()))
}

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let metrics_addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9000".to_owned())
        .parse()?;
    // Before any traffic, so that every metric gets its help text.
    PrometheusBuilder::new()
        .with_http_listener(metrics_addr)
        .set_buckets_for_metric(
            Matcher::Full("tollgate_store_latency_seconds".to_owned()),
            tollgate::observability::STORE_LATENCY_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("tollgate_sentinel_failover_seconds".to_owned()),
            tollgate::observability::SENTINEL_FAILOVER_BUCKETS,
        )?
        .install()?;

    let limiter = Limiter::builder()
        .store(store()?)
        .route(
            "GET /search",
            Route::new().policy(Policy::new("search", Rate::per_minute(1))?),
        )
        .policy(Policy::new("per-ip", Rate::per_minute(5))?)
        .build()?;
    let app = Router::new()
        .route(
            "/",
            get(|Extension(info): Extension<RateLimitInfo>| async move {
                format!("hello: {} of {} left\n", info.remaining(), info.limit())
            }),
        )
        .route("/search", get(|| async { "results\n" }))
        .layer(RateLimitLayer::new(limiter).info_extensions(true));
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "app on http://{}, metrics on http://{metrics_addr}/metrics",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
