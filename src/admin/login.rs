//! The login guard's part of the admin API ([`Admin::login`]): unlocking a username or a
//! client, and the login keys refused most often.

use std::sync::Arc;

use axum::extract::{OriginalUri, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::Serialize;

use super::{only, raw_param, top_answer, Admin, Failure, Params, Shared, Top};
use crate::key::Key;
use crate::login::LoginGuard;
use crate::store::Store;

impl<S: Store> Admin<S> {
    /// Adds the login guard's endpoints, for the guard of the same application (with a plan,
    /// [`BuiltPlan::login_guard`](crate::config::BuiltPlan::login_guard)):
    ///
    /// | request | answer |
    /// |---|---|
    /// | `DELETE /login/users?username=alice` | clears the username's limit ([`LoginGuard::unlock_user`]): the account's owner can try again from anywhere. The username is read as the guard reads it (normalised, so `Alice` is the same account); in the query, a `+` in it is written `%2B` |
    /// | `DELETE /login/ips?key=ip:192.0.2.7` | clears a client's IP limit ([`LoginGuard::unlock_ip`]), the key written as the IP source builds it and as keys are shown |
    /// | `GET /login/top?n=20` | the login keys refused most often lately ([`LoginGuard::top_refused`]): `{"keys": [RefusedKey, …]}` |
    ///
    /// Without a guard these answer 404. An unlock is logged at `INFO` on target
    /// `tollgate::admin`.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use axum::{body::Body, http::{Request, StatusCode}};
    /// use tower::ServiceExt;
    /// use tollgate::{admin::Admin, key::Key, login::LoginGuard, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder().policy(Policy::new("api", Rate::per_minute(60))?).build()?;
    /// let guard = LoginGuard::builder().user_rate(Rate::per_hour(1)).build()?;
    /// let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "alice");
    /// guard.check(&attempt).await?;
    /// guard.record_failure(&attempt).await?; // alice is locked out for the hour
    ///
    /// let app = Admin::new(limiter).login(guard.clone()).router();
    /// let unlock = Request::delete("/login/users?username=alice").body(Body::empty())?;
    /// assert_eq!(app.oneshot(unlock).await?.status(), StatusCode::OK);
    /// let again = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.9"), "alice");
    /// assert!(guard.check(&again).await?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn login(mut self, guard: LoginGuard<S>) -> Self {
        self.login = Some(guard);
        self
    }
}

/// The login endpoints, on the admin router.
pub(super) fn routes<S: Store>(router: Router<Arc<Admin<S>>>) -> Router<Arc<Admin<S>>> {
    router
        .route("/login/users", delete(unlock_user::<S>))
        .route("/login/ips", delete(unlock_ip::<S>))
        .route("/login/top", get(top::<S>))
}

fn guard<S>(admin: &Admin<S>) -> Result<&LoginGuard<S>, Failure> {
    admin.login.as_ref().ok_or_else(|| Failure {
        status: StatusCode::NOT_FOUND,
        code: "not_found",
        message: "this admin API has no login guard (Admin::login adds one)".into(),
    })
}

#[derive(Serialize)]
struct Unlocked {
    unlocked: &'static str,
    digest: String,
}

fn unlocked(limit: &'static str, key: &Key) -> Json<Unlocked> {
    let digest = crate::key::digest(key);
    tracing::event!(
        target: "tollgate::admin",
        tracing::Level::INFO,
        ratelimit.key = digest.as_str(),
        limit,
        "login limit cleared through the admin API"
    );
    Json(Unlocked {
        unlocked: limit,
        digest,
    })
}

async fn unlock_user<S: Store>(
    State(admin): Shared<S>,
    Params(params): Params,
) -> Result<Json<Unlocked>, Failure> {
    only(&params, &["username"])?;
    let guard = guard(&admin)?;
    let username = match params.get("username") {
        Some(name) if !name.trim().is_empty() => name,
        given => {
            return Err(Failure::bad(
                "username",
                given.map_or("", String::as_str),
                "name the username to unlock, ?username=…",
            ))
        }
    };
    guard.unlock_user(username).await?;
    Ok(unlocked("user", &guard.user_key(username)))
}

async fn unlock_ip<S: Store>(
    State(admin): Shared<S>,
    OriginalUri(uri): OriginalUri,
    Params(params): Params,
) -> Result<Json<Unlocked>, Failure> {
    only(&params, &["key"])?;
    let guard = guard(&admin)?;
    let Some(text) = raw_param(uri.query().unwrap_or(""), "key")? else {
        return Err(Failure::bad(
            "key",
            "",
            "name the client by its IP key, as the IP source builds it: ?key=ip:192.0.2.7",
        ));
    };
    let ip: Key = text.parse().map_err(Failure::from_config)?;
    guard.unlock_ip(&ip).await?;
    Ok(unlocked("ip", &crate::login::client_key(&ip)))
}

async fn top<S: Store>(
    State(admin): Shared<S>,
    Params(params): Params,
) -> Result<Json<Top>, Failure> {
    let guard = guard(&admin)?;
    top_answer(&params, |n| guard.top_refused(n))
}
