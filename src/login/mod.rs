//! Login protection: three limits at once against brute force and password spraying.
//!
//! An attacker guessing one user's password rotates IP addresses; one spraying a weak password
//! across many users keeps one address. No single key stops both, so a [`LoginGuard`] limits
//! three tuples simultaneously, each with its own rate, and refuses an attempt when any is
//! exhausted:
//!
//! | tuple | key | stops | default |
//! |---|---|---|---|
//! | (client IP, username) | `login-ip+user:…` | one client guessing one password | 5 per 15 minutes |
//! | client IP | `login-ip:…` | one client spraying many usernames | 50 per 15 minutes |
//! | username | `login-user:…` | many clients (a botnet) guessing one password | 20 per 15 minutes |
//!
//! The client IP comes from a [`KeyExtractor`](crate::key::KeyExtractor) (default [`PeerIp`](crate::key::PeerIp)), so a trusted-proxy
//! extractor plugs in unchanged. Usernames are normalised with [`normalise_username`] (NFKC,
//! full case folding, invisible code points removed), so `Alice`, `alice `, `ＡＬＩＣＥ` and
//! `al\u{200B}ice` share one limit.
//!
//! How the guard counts (failures only, or every attempt), how long a username can be locked
//! out, why usernames never reach the store and which stores fit are in the
//! [login guide](crate::guide::login).
//!
//! # Examples
//!
//! In an axum handler (see [`LoginLayer`] for the layer form):
//!
//! ```
//! use axum::{extract::State, http::request::Parts, response::IntoResponse, Json};
//! use http::StatusCode;
//! use tollgate::key::RequestView;
//! use tollgate::login::LoginGuard;
//!
//! #[derive(serde::Deserialize)]
//! struct Form { username: String, password: String }
//!
//! async fn login(
//!     State(guard): State<LoginGuard>,
//!     parts: Parts,
//!     Json(form): Json<Form>,
//! ) -> axum::response::Response {
//!     let Some(attempt) = guard.attempt(&RequestView::from_parts(&parts), &form.username) else {
//!         return StatusCode::BAD_REQUEST.into_response(); // no client address
//!     };
//!     match guard.check(&attempt).await {
//!         Ok(decision) if !decision.is_allowed() => return decision.into_response(),
//!         Ok(_) => {}
//!         Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
//!     }
//!     if form.password == "correct horse" {
//!         let _ = guard.record_success(&attempt).await;
//!         "welcome".into_response()
//!     } else {
//!         let _ = guard.record_failure(&attempt).await;
//!         StatusCode::UNAUTHORIZED.into_response()
//!     }
//! }
//!
//! # fn app() -> Result<axum::Router, tollgate::ConfigError> {
//! let guard = LoginGuard::builder().build()?;
//! let app = axum::Router::new()
//!     .route("/login", axum::routing::post(login))
//!     .with_state(guard);
//! # Ok(app) }
//! # app().unwrap();
//! ```
//!
//! Directly, with custom rates:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use tollgate::key::Key;
//! use tollgate::login::LoginGuard;
//! use tollgate::Rate;
//!
//! let guard = LoginGuard::builder()
//!     .ip_user_rate(Rate::per_minute(2))
//!     .build()?;
//! let attempt = guard.attempt_with_ip_key(Key::new("ip", "203.0.113.9"), "Alice");
//! for _ in 0..2 {
//!     assert!(guard.check(&attempt).await?.is_allowed());
//!     guard.record_failure(&attempt).await?; // wrong password
//! }
//! // Same user, other spelling: same limit.
//! let again = guard.attempt_with_ip_key(Key::new("ip", "203.0.113.9"), " ALICE ");
//! let decision = guard.check(&again).await?;
//! assert!(!decision.is_allowed());
//! assert!(decision.retry_after().is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod body_fields;
mod builder;
mod decision;
mod guard;
mod layer;
mod outcome;
mod username;

pub use builder::LoginGuardBuilder;
pub use decision::LoginDecision;
#[cfg(feature = "admin")]
pub(crate) use guard::client_key;
pub use guard::{LoginAttempt, LoginGuard};
pub use layer::{LoginLayer, LoginService};
pub use outcome::LoginOutcome;
pub use username::normalise_username;

/// Which attempts a [`LoginGuard`] counts; see the [login guide](crate::guide::login).
///
/// ```
/// use tollgate::login::{LoginGuard, LoginMode};
///
/// let guard = LoginGuard::builder().mode(LoginMode::EveryAttempt).build()?;
/// assert_eq!(guard.mode(), LoginMode::EveryAttempt);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LoginMode {
    /// Failures count, successes do not (the default): `check` reserves a unit of all three
    /// limits, `record_success` refunds the IP and username limits and clears the
    /// (IP, username) tuple. An attempt never recorded (or recorded as a failure) keeps its
    /// reservation: it counts as a failure.
    #[default]
    FailuresOnly,
    /// Every allowed attempt counts: `check` charges all three limits, `record_success`
    /// only clears the (IP, username) tuple.
    EveryAttempt,
}

/// Where each tuple's limiter, policy and key sit, in every array of three.
const IP_USER: usize = 0;
const IP: usize = 1;
const USER: usize = 2;
