//! Limits changed while the service runs: the plan file is watched, and every edit is
//! checked and put in force without a restart (counters kept); a broken edit is refused and
//! logged, and the limits in force stay.
//!
//! ```text
//! cargo run --example reload --features watch                 # watches examples/reload.toml
//! cargo run --example reload --features watch -- my-plan.toml
//! curl -si http://127.0.0.1:3000/ | grep -i ratelimit-limit   # 10
//! # edit `limit = 10` to `limit = 100` in the file, then:
//! curl -si http://127.0.0.1:3000/ | grep -i ratelimit-limit   # 100
//! ```
//!
//! Serves on `ADDR` (default `127.0.0.1:3000`).

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tollgate::config::{Plan, PlanWatcher};

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/examples/reload.toml").to_owned());
    let plan = Plan::from_file(&path)?;
    let report = tollgate::audit(&plan);
    if !report.pass {
        return Err(format!("the plan fails the audit:\n{}", report.to_text()).into());
    }
    let built = plan.build()?;
    // The layer and the watcher share one limiter: a reload applies to the layer too. The
    // watcher is kept for as long as the server runs (dropping it stops the watching).
    let _watcher = PlanWatcher::spawn(&path, built.limiter().clone())?;

    let app = Router::new()
        .route("/", get(|| async { "Hello from behind tollgate!\n" }))
        .layer(built.layer());

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("tollgate reload listening on http://{local}, watching {path}");
    println!("try: curl -si http://{local}/ | grep -i ratelimit-limit, then edit the file");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
