//! A limiter built from a TOML plan, audited first.
//!
//! ```text
//! cargo run --example from_config                 # uses examples/from_config.toml
//! cargo run --example from_config -- my-plan.toml
//! ```
//!
//! Serves on `ADDR` (default `127.0.0.1:3000`): `POST /login` (5 per minute), `/health`
//! (exempt) and everything else (20 per minute).

use std::net::SocketAddr;

use axum::{routing::get, routing::post, Router};
use tollgate::config::{OnAuditFailure, Plan};
use tollgate::RateLimitLayer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/from_config.toml").to_owned()
    });
    let plan = Plan::from_file(&path)?;
    let report = tollgate::audit(&plan);
    print!("audit of {path}: {}", report.to_text());
    let layer = RateLimitLayer::from_config_audited(&plan, OnAuditFailure::Refuse)?;

    let app = Router::new()
        .route("/login", post(|| async { "logged in (not really)\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
