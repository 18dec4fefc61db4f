//! An app built from a TOML plan, audited first: the limiter's layer and the `[login]`
//! guard's layer, sharing one store.
//!
//! ```text
//! cargo run --example from_config                 # uses examples/from_config.toml
//! cargo run --example from_config -- my-plan.toml
//! ```
//!
//! Serves on `ADDR` (default `127.0.0.1:3000`): `POST /login` (5 per minute per client, and
//! the login guard: 5 failures per (client, username) per 15 minutes; the password is
//! `correct horse`), `/api/…` (10 per minute per API key, sent as `X-API-Key`: the route's
//! own key), `/health` (exempt) and everything else (20 per minute per client).
//!
//! ```text
//! for k in a a a a a a a a a a a b; do curl -s -o /dev/null -w '%{http_code} ' -H "X-API-Key: $k" http://127.0.0.1:3000/api/items; done
//! ```

use std::net::SocketAddr;

use axum::{http::StatusCode, routing::get, routing::post, Router};
use tollgate::config::Plan;

#[path = "support/report.rs"]
mod report;

/// The login handler: any username, one password.
async fn login(body: String) -> (StatusCode, &'static str) {
    let form: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    if form["password"] == "correct horse" {
        (StatusCode::OK, "welcome\n")
    } else {
        (StatusCode::UNAUTHORIZED, "wrong username or password\n")
    }
}

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/from_config.toml").to_owned()
    });
    let plan = Plan::from_file(&path)?;
    let report = tollgate::audit(&plan);
    print!("audit of {path}: {}", report.to_text());
    if !report.pass {
        return Err("the plan fails the audit".into());
    }
    let built = plan.build()?;

    let mut app = Router::new()
        .route("/login", post(login))
        .route("/api/{*rest}", get(|| async { "[]\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .route("/", get(|| async { "hello\n" }));
    if let Some(guard) = built.login_layer() {
        app = app.layer(guard); // inside: checks only [login].routes
    }
    let app = app.layer(built.layer()); // outside: every request
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
