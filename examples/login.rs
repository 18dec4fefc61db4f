//! Login protection: a JSON login endpoint guarded per (client IP, username), per client IP
//! and per username, counting failed attempts only.
//!
//! ```text
//! cargo run --example login
//! # six wrong passwords for alice: five 401s, then a generic 429
//! for i in $(seq 6); do
//!   curl -s -o /dev/null -w '%{http_code}\n' -H 'content-type: application/json' \
//!     -d '{"username":"alice","password":"guess"}' http://127.0.0.1:3000/login
//! done
//! ```
//!
//! Two routes show the two forms:
//! * `POST /login`: the handler calls the guard itself (`check`, then `record_failure` or
//!   `record_success`);
//! * `POST /api/login`: the handler only checks the password, and a `LoginLayer` on the route
//!   reads the username from the JSON body and records the outcome from the status (2xx
//!   success, 401 failure).
//!
//! Both share one guard, so their counts add up. The address can be changed with `ADDR`
//! (default `127.0.0.1:3000`).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{request::Parts, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use tollgate::key::RequestView;
use tollgate::login::{LoginGuard, LoginLayer};
use tollgate::store::Store;

#[path = "support/report.rs"]
mod report;

/// The demo's only account.
const USER: &str = "alice";
const PASSWORD: &str = "correct horse battery staple";

#[derive(Deserialize)]
struct Credentials {
    username: String,
    password: String,
}

fn password_ok(c: &Credentials) -> bool {
    // A real service looks the user up and verifies a password hash (argon2, bcrypt).
    tollgate::login::normalise_username(&c.username) == USER && c.password == PASSWORD
}

/// The handler form: the guard is called around the password check.
async fn login<S: Store>(
    State(guard): State<LoginGuard<S>>,
    parts: Parts,
    Json(credentials): Json<Credentials>,
) -> Response {
    let Some(attempt) = guard.attempt(&RequestView::from_parts(&parts), &credentials.username)
    else {
        return (StatusCode::BAD_REQUEST, "no client address").into_response();
    };
    match guard.check(&attempt).await {
        Ok(decision) if !decision.is_allowed() => return decision.into_response(),
        Ok(_) => {}
        // Fail closed: no password checks while the limiter is down.
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
    if password_ok(&credentials) {
        let _ = guard.record_success(&attempt).await;
        Json(serde_json::json!({ "ok": true })).into_response()
    } else {
        let _ = guard.record_failure(&attempt).await;
        (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({ "error": "invalid_credentials" })),
        )
            .into_response()
    }
}

/// The layer form: the handler knows nothing about rate limiting.
async fn api_login(Json(credentials): Json<Credentials>) -> Response {
    if password_ok(&credentials) {
        Json(serde_json::json!({ "ok": true })).into_response()
    } else {
        (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({ "error": "invalid_credentials" })),
        )
            .into_response()
    }
}

/// The example's app, for any store (the tests drive it too).
pub fn app<S: Store>(guard: LoginGuard<S>) -> Router {
    Router::new()
        .route("/login", post(login::<S>))
        .with_state(guard.clone())
        .route(
            "/api/login",
            post(api_login).layer(LoginLayer::json_field(guard, "username")),
        )
}

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    // Defaults: 5 failures per 15 minutes per (IP, username), 50 per IP, 20 per username.
    let guard = LoginGuard::builder().build()?;
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("tollgate login example listening on http://{local}");
    println!("account: {USER} / {PASSWORD}");
    println!(
        "try: for i in $(seq 6); do curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'content-type: application/json' -d '{{\"username\":\"alice\",\"password\":\"guess\"}}' http://{local}/login; done"
    );
    // The guard's default IP source reads the peer address.
    axum::serve(
        listener,
        app(guard).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
