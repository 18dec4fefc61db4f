//! The admin API (feature `admin`) mounted behind the application's own auth, on limits
//! shared through Redis; `tollgate inspect`, `reset` and `top` work on the same plan.
//!
//! ```text
//! cargo run --example admin --features admin,redis
//! for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-tenant: acme' http://127.0.0.1:3000/search; done
//! curl -s -H 'authorization: Bearer let-me-in' 'http://127.0.0.1:3000/admin/ratelimit/keys/header/acme?route=/search'
//! curl -s -H 'authorization: Bearer let-me-in' http://127.0.0.1:3000/admin/ratelimit/top
//! curl -s -H 'authorization: Bearer let-me-in' http://127.0.0.1:3000/admin/ratelimit/plan
//! curl -s -XDELETE -H 'authorization: Bearer let-me-in' http://127.0.0.1:3000/admin/ratelimit/keys/header/acme
//!
//! # The same from the command line (feature cli):
//! cargo run --features cli --bin tollgate -- inspect examples/admin.toml header:acme --route /search
//! cargo run --features cli --bin tollgate -- reset examples/admin.toml header:acme
//! cargo run --features cli --bin tollgate -- top http://127.0.0.1:3000/admin/ratelimit -H 'authorization: Bearer let-me-in'
//! ```
//!
//! The app listens on `ADDR` (default `127.0.0.1:3000`), uses Redis at `REDIS_URL` (default
//! the plan's `redis://127.0.0.1:6379`) and takes the admin token from `ADMIN_TOKEN`
//! (default `let-me-in`; use your real auth). Start two instances on two ports: they share
//! the limits, `inspect` and `reset` act on both, and each has its own `top`.

use std::net::SocketAddr;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{routing::get, Router};
use tollgate::admin::Admin;
use tollgate::config::Plan;

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let mut plan = Plan::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/admin.toml"))?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        plan.store.url = Some(url);
    }
    let built = plan.build()?;

    // The admin API has no auth of its own: this stands in for the application's.
    let token = std::env::var("ADMIN_TOKEN").unwrap_or_else(|_| "let-me-in".to_owned());
    let expected = format!("Bearer {token}");
    let admin = Admin::new(built.limiter().clone())
        .plan(&plan)
        .router()
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let allowed = req
                .headers()
                .get("authorization")
                .is_some_and(|v| v.as_bytes() == expected.as_bytes());
            async move {
                if allowed {
                    next.run(req).await
                } else {
                    Response::builder()
                        .status(StatusCode::UNAUTHORIZED)
                        .body(axum::body::Body::empty())
                        .unwrap_or_default()
                }
            }
        }));

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }))
        .layer(built.layer())
        // Nested after the layer: the admin API itself is not rate limited.
        .nest("/admin/ratelimit", admin);

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "listening on http://{}, admin API on http://{0}/admin/ratelimit",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
