//! Metrics for Prometheus: tollgate's counters and store-latency histogram through the
//! `metrics` facade, exposed by `metrics-exporter-prometheus`.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! curl -s http://127.0.0.1:3000/            # a few times, until 429
//! curl -s http://127.0.0.1:9000/metrics | grep tollgate
//! ```
//!
//! The app listens on `ADDR` (default `127.0.0.1:3000`), the exporter on `METRICS_ADDR`
//! (default `127.0.0.1:9000`).

use std::net::SocketAddr;

use axum::{routing::get, Router};
use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let metrics_addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9000".to_owned())
        .parse()?;
    PrometheusBuilder::new()
        .with_http_listener(metrics_addr)
        .install()?;

    let limiter = Limiter::builder()
        .policy(Policy::new("per-ip", Rate::per_minute(5))?)
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(limiter));
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
