//! The admin API (feature `admin`) mounted behind the application's own auth, on limits
//! shared through Redis; `tollgate inspect`, `reset` and `top` work on the same plan.
//!
//! ```text
//! cargo run --example admin --features admin,redis
//! for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-tenant: acme' http://127.0.0.1:3000/search; done
//! curl -s -H 'authorization: Bearer let-me-in' 'http://127.0.0.1:3000/admin/ratelimit/keys/header.x-tenant/acme?route=/search'
//! curl -s -H 'authorization: Bearer let-me-in' http://127.0.0.1:3000/admin/ratelimit/top
//! curl -s -H 'authorization: Bearer let-me-in' http://127.0.0.1:3000/admin/ratelimit/plan
//! curl -s -XDELETE -H 'authorization: Bearer let-me-in' http://127.0.0.1:3000/admin/ratelimit/keys/header.x-tenant/acme
//! # Any key top lists, by the digest it shows (tuples and long keys too):
//! curl -s -XDELETE -H 'authorization: Bearer let-me-in' 'http://127.0.0.1:3000/admin/ratelimit/keys?digest=4a180c52eec7664c'
//!
//! # The same from the command line (feature cli):
//! cargo run --features cli --bin tollgate -- inspect examples/admin.toml header.x-tenant:acme --route /search
//! cargo run --features cli --bin tollgate -- reset examples/admin.toml header.x-tenant:acme
//! cargo run --features cli --bin tollgate -- top http://127.0.0.1:3000/admin/ratelimit -H 'authorization: Bearer let-me-in'
//! ```
//!
//! The app listens on `ADDR` (default `127.0.0.1:3000`), uses Redis at `REDIS_URL` (default
//! the plan's `redis://127.0.0.1:6379`) and takes the admin token from `ADMIN_TOKEN`
//! (default `let-me-in`; use your real auth). Start two instances on two ports: they share
//! the limits, `inspect` and `reset` act on both, and each has its own `top`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{routing::get, Router};
use subtle::ConstantTimeEq;
use tollgate::admin::Admin;
use tollgate::config::Plan;
use tollgate::key::Key;
use tollgate::{Limiter, Policy, Rate};

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let mut plan = Plan::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/admin.toml"))?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        plan.store.url = Some(url);
    }
    let built = plan.build()?;

    // The admin API has no auth of its own: this stands in for the application's. The
    // token is compared in constant time (no timing tells how much of a guess was right),
    // and failed attempts are limited per client address by tollgate itself: 5 per minute,
    // counted race-free (a unit is reserved before the comparison and given back when the
    // token is right, so parallel guesses cannot exceed the limit).
    let token = std::env::var("ADMIN_TOKEN").unwrap_or_else(|_| "let-me-in".to_owned());
    let expected: Arc<[u8]> = format!("Bearer {token}").into_bytes().into();
    let failures = Limiter::builder()
        .policy(Policy::new("admin-auth-failures", Rate::per_minute(5))?)
        .build()?;
    let admin = Admin::new(built.limiter().clone())
        .plan(&plan)
        .router()
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let (expected, failures) = (Arc::clone(&expected), failures.clone());
            async move {
                let peer = req
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .map_or_else(String::new, |c| c.0.ip().to_string());
                let client = Key::new("admin-ip", &peer);
                let attempt = match failures.reserve(&client, 1).await {
                    Ok(attempt) if attempt.decision().is_allowed() => attempt,
                    _ => return status(StatusCode::TOO_MANY_REQUESTS),
                };
                let given = req
                    .headers()
                    .get("authorization")
                    .map_or(&[][..], |v| v.as_bytes());
                if bool::from(given.ct_eq(&expected)) {
                    // The right token costs nothing.
                    let _ = attempt.settle(0).await;
                    next.run(req).await
                } else {
                    // The unit stays charged: one failure counted.
                    status(StatusCode::UNAUTHORIZED)
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

/// An empty response with `status`.
fn status(status: StatusCode) -> Response {
    Response::builder()
        .status(status)
        .body(axum::body::Body::empty())
        .unwrap_or_default()
}
