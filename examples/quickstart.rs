//! The smallest useful setup: an axum server limiting `/` to 5 requests per 10 seconds per
//! client IP, with the in-process memory store.
//!
//! ```text
//! cargo run --example quickstart
//! for i in $(seq 7); do curl -si http://127.0.0.1:3000/ | head -1; done
//! ```
//!
//! The address can be changed with `ADDR` (default `127.0.0.1:3000`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let limiter = Limiter::builder()
        .policy(Policy::new(
            "per-ip",
            Rate::new(5, Duration::from_secs(10)),
        )?)
        .build()?; // memory store, keyed by the peer IP

    let app = Router::new()
        .route("/", get(|| async { "Hello from behind tollgate!\n" }))
        .layer(RateLimitLayer::new(limiter));

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("tollgate quickstart listening on http://{local}");
    println!("try: for i in $(seq 7); do curl -si http://{local}/ | grep -iE '^(HTTP|retry-after|ratelimit-remaining)'; done");
    // Peer addresses are what the default key extractor reads.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
