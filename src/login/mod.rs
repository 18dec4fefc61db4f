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
//! The client IP comes from a [`KeyExtractor`] (default [`PeerIp`]), so a trusted-proxy
//! extractor plugs in unchanged. Usernames are normalised with [`normalise_username`] (NFKC,
//! full case folding, invisible code points removed), so `Alice`, `alice `, `ＡＬＩＣＥ` and
//! `al\u{200B}ice` share one limit.
//!
//! # Counting failures only, or every attempt
//!
//! In both modes [`LoginGuard::check`] *reserves*: an allowed attempt is charged to all three
//! limits before the handler verifies the password, and a refused one is charged to none. So
//! attempts beyond a limit never reach verification, however many arrive at once: 100
//! parallel wrong passwords against a limit of 5 get at most 5 verifications.
//!
//! [`LoginMode::FailuresOnly`] (the default, and the friendlier choice) counts failures only:
//! [`LoginGuard::record_success`] refunds the IP and username limits and clears the
//! (IP, username) tuple, so users who type their password right are not counted, and a busy
//! office behind one NAT address does not use up its IP limit by logging in. Concurrent
//! successes hold their places only while their passwords are verified.
//! [`LoginMode::EveryAttempt`] counts successes too: `record_success` only clears the
//! (IP, username) tuple.
//!
//! **An attempt that is never recorded counts as a failure**: its reservation stays. That is
//! the case when the handler records nothing (it panicked, returned early, or the
//! [`LoginLayer`] classified its response as [`LoginOutcome::Unknown`], such as a `400` or a
//! `500`). Counting is the safe default: an attacker cannot escape the limits by making the
//! handler fail, at the price of one unit per server error for a real user.
//! [`LoginGuard::record_failure`] changes nothing (the charge is already there).
//!
//! # The lockout trade-off
//!
//! The username limit is what stops a botnet rotating addresses, and it is also a lever for
//! anyone to lock a user out: `user` failed attempts from anywhere exhaust it for everyone,
//! the real user included. The guard bounds that lockout:
//!
//! * refused attempts are never counted, so hammering a locked account does not extend the
//!   lock, and
//! * the limits use the exact sliding window log by default, so an account is free again at
//!   most **one username window** (default 15 minutes) after the last *counted* failure.
//!
//! To keep a user locked, an attacker must therefore keep spending `user` failures per
//! window, each of which also counts against the attacker's own IP and (IP, username) limits.
//! Choose the username rate with this in mind: higher or shorter means less lockout and more
//! guesses for a botnet. Every refusal is the same generic 429 — no remaining counts, no hint
//! of which tuple tripped (the policies are [sensitive](crate::PolicyBuilder::sensitive)) —
//! with a `Retry-After` that is the earliest moment every exhausted tuple allows again. (With
//! different windows per tuple, that value can still hint at which one tripped; give the
//! three rates one window if even that must not show.)
//!
//! # Usernames never reach the store
//!
//! Key material for usernames is a SHA-256 digest (128 bits, hex) of the normalised name,
//! never the name itself: usernames are often e-mail addresses, and store keys end up in
//! places that personal data should not (Redis `MONITOR` and `KEYS` output, backups, metrics
//! labels). A plain digest of a guessable address can be reversed by guessing, so set
//! [`username_secret`](LoginGuardBuilder::username_secret) — the same on every instance that
//! shares a store — to key the digest. Digests are fixed-length, so the (IP, username) tuple
//! is encoded injectively: `("a:b", "c")` and `("a", "b:c")` never share a key.
//!
//! # Stores
//!
//! A guard works with any [`Store`]: the default in-process [`MemoryStore`], or a shared one
//! (such as the Redis store) so that every instance of the service enforces one limit.
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

mod layer;
mod username;
pub(crate) use layer::read_capped;

pub use layer::{LoginLayer, LoginOutcome, LoginService};
pub use username::normalise_username;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use sha2::{Digest, Sha256};

use crate::decision::Decision;
use crate::error::{CheckError, ConfigError};
use crate::key::{Key, KeyExtractor, PeerIp, RequestView};
use crate::limiter::Limiter;
use crate::policy::{Algorithm, Policy, Rate};
use crate::refusal::{Refusal, Rendering};
use crate::route::Route;
use crate::store::{MemoryStore, Store};

/// Which attempts a [`LoginGuard`] counts; see the [module docs](crate::login).
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

const IP_USER: usize = 0;
const IP: usize = 1;
const USER: usize = 2;

/// Limits login attempts per (client IP, username), per client IP and per username at once.
///
/// Cheap to clone (clones share state). See the [module docs](crate::login) for the
/// trade-offs and examples.
///
/// ```
/// use tollgate::login::LoginGuard;
///
/// let guard = LoginGuard::builder().build()?;
/// assert_eq!(guard.policies()[0].name(), "login.ip-user");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct LoginGuard<S = MemoryStore> {
    inner: Arc<GuardInner<S>>,
}

struct GuardInner<S> {
    /// One limiter per tuple, (IP, username), IP, username — in that order everywhere —
    /// sharing one store and the IP source: every attempt is decided by the limiter's one
    /// decision path.
    limiters: [Limiter<S>; 3],
    /// The three limiters' policies, in the same order.
    policies: Arc<[Policy]>,
    mode: LoginMode,
    username_secret: Option<Box<[u8]>>,
}

impl<S> Clone for LoginGuard<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LoginGuard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginGuard")
            .field("limiter", &self.inner.limiters[IP_USER])
            .field("policies", &self.inner.policies)
            .field("mode", &self.inner.mode)
            .field("username_secret", &self.inner.username_secret.is_some())
            .finish()
    }
}

impl LoginGuard<MemoryStore> {
    /// A builder with the defaults: a fresh [`MemoryStore`], [`PeerIp`], failures only, and
    /// 5 / 50 / 20 failures per 15 minutes for (IP, username) / IP / username.
    ///
    /// ```
    /// use tollgate::login::LoginGuard;
    ///
    /// let guard = LoginGuard::builder().build()?;
    /// assert_eq!(guard.policies()[1].limit(), 50);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn builder() -> LoginGuardBuilder<MemoryStore> {
        const WINDOW: Duration = Duration::from_secs(15 * 60);
        LoginGuardBuilder {
            store: None,
            make_store: Some(MemoryStore::new),
            name: "login".to_owned(),
            rates: [
                Rate::new(5, WINDOW),
                Rate::new(50, WINDOW),
                Rate::new(20, WINDOW),
            ],
            algorithm: Algorithm::SlidingWindowLog,
            mode: LoginMode::default(),
            ip_source: None,
            username_secret: None,
        }
    }
}

/// One login attempt's three keys, made by [`LoginGuard::attempt`].
///
/// ```
/// use tollgate::key::Key;
/// use tollgate::login::LoginGuard;
///
/// let guard = LoginGuard::builder().build()?;
/// let a = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "Alice");
/// let b = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "  alice");
/// assert_eq!(a, b);
/// assert!(a.ip_key().as_str().starts_with("login-ip:"));
/// assert!(!a.user_key().as_str().contains("alice")); // hashed
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoginAttempt {
    keys: [Key; 3],
}

impl LoginAttempt {
    /// The (client IP, username) key.
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn ip_user_key(&self) -> &Key {
        &self.keys[IP_USER]
    }

    /// The client IP key.
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn ip_key(&self) -> &Key {
        &self.keys[IP]
    }

    /// The username key.
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn user_key(&self) -> &Key {
        &self.keys[USER]
    }
}

impl<S: Store> LoginGuard<S> {
    /// The three policies: (IP, username), IP, username.
    ///
    /// See [`LoginGuard`] and [`LoginMode`] for examples.
    pub fn policies(&self) -> &[Policy] {
        &self.inner.policies
    }

    /// The counting mode.
    ///
    /// See [`LoginGuard`] and [`LoginMode`] for examples.
    pub fn mode(&self) -> LoginMode {
        self.inner.mode
    }

    /// The store.
    ///
    /// See [`LoginGuard`] and [`LoginMode`] for examples.
    pub fn store(&self) -> &S {
        self.inner.limiters[IP_USER].store()
    }

    /// The attempt of `username` from the client of `request`, or `None` when the IP source
    /// finds no client address (with [`PeerIp`] and axum: serve the app with
    /// `into_make_service_with_connect_info::<SocketAddr>()`).
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use tollgate::key::RequestView;
    /// use tollgate::login::LoginGuard;
    ///
    /// let guard = LoginGuard::builder().build()?;
    /// let mut req = http::Request::new(());
    /// assert!(guard.attempt(&RequestView::new(&req), "alice").is_none());
    /// req.extensions_mut().insert("192.0.2.7:5555".parse::<SocketAddr>().unwrap());
    /// let attempt = guard.attempt(&RequestView::new(&req), "alice").unwrap();
    /// assert_eq!(attempt.ip_key().as_str(), "login-ip:ip:192.0.2.7");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn attempt(&self, request: &RequestView<'_>, username: &str) -> Option<LoginAttempt> {
        let ip = self.inner.limiters[IP].key_for(request)?;
        Some(self.attempt_with_ip_key(ip, username))
    }

    /// The attempt of `username` from the client whose IP key is `ip` (for logins that do not
    /// arrive as HTTP requests). Use the same key form as the IP source, e.g.
    /// `Key::new("ip", "192.0.2.7")` for [`PeerIp`].
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn attempt_with_ip_key(&self, ip: Key, username: &str) -> LoginAttempt {
        let user = self.username_digest(username);
        let mut ip_user = Vec::with_capacity(user.len() + ip.as_str().len());
        // The digest has a fixed length, so this concatenation is injective.
        ip_user.extend_from_slice(&user);
        ip_user.extend_from_slice(ip.as_str().as_bytes());
        LoginAttempt {
            keys: [
                Key::new("login-ip+user", &ip_user),
                Key::new("login-ip", ip.as_str()),
                Key::new("login-user", user),
            ],
        }
    }

    /// 128 bits of SHA-256 over the normalised username (keyed when a secret is set), in hex.
    fn username_digest(&self, username: &str) -> [u8; 32] {
        let normalised = normalise_username(username);
        let mut h = Sha256::new();
        h.update(b"tollgate login username\0");
        if let Some(secret) = &self.inner.username_secret {
            h.update((secret.len() as u64).to_be_bytes());
            h.update(secret);
        }
        h.update(normalised.as_bytes());
        crate::key::hex_128(&h.finalize())
    }

    /// Whether the attempt may go ahead. An allowed attempt is charged to all three limits,
    /// in both modes: it holds its place before the password is verified, so attempts beyond
    /// a limit never reach verification however many arrive at once. A refused attempt is
    /// charged to none (the limits charged before the refusing one are refunded). In
    /// [`LoginMode::FailuresOnly`] the charge is a reservation, refunded by
    /// [`record_success`](Self::record_success); an attempt that is never recorded keeps it,
    /// like a failure.
    ///
    /// Call it once per attempt, before verifying the password, and record the outcome once.
    ///
    /// See the [module docs](crate::login) for an example.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails; refuse the login then (fail closed).
    pub async fn check(&self, attempt: &LoginAttempt) -> Result<LoginDecision, CheckError> {
        // Three keys cannot be charged atomically in every store, so they are charged one by
        // one and a refusal refunds the ones before it. Meanwhile a concurrent attempt may
        // find a limit holding this attempt's charge and be refused: a race errs on the side
        // of refusing, never of verifying more passwords than the limits allow.
        let limiters = &self.inner.limiters;
        let mut decisions = Vec::with_capacity(3);
        for (i, (key, limiter)) in attempt.keys.iter().zip(limiters).enumerate() {
            let cost = self.inner.policies[i].cost();
            let d = match limiter.check(key, cost).await {
                Ok(d) => d,
                Err(e) => {
                    self.refund(attempt, 0..i).await;
                    return Err(e);
                }
            };
            let refused = !d.is_allowed();
            decisions.extend(d.policies().first().cloned());
            if refused {
                self.refund(attempt, 0..i).await;
                // The limits after the refusing one, as they stand, so that `retry_after`
                // covers every exhausted limit.
                for (key, limiter) in attempt.keys.iter().zip(limiters).skip(i + 1) {
                    let d = limiter.peek(key).await?;
                    decisions.extend(d.policies().first().cloned());
                }
                break;
            }
        }
        Ok(self.decision(Decision::from_policies(decisions)))
    }

    /// Records a wrong password. The attempt was charged by [`check`](Self::check), so this
    /// changes nothing, in either mode: a failure keeps the charge, exactly like an attempt
    /// that is never recorded. It is kept so that handlers state every outcome.
    ///
    /// See the [module docs](crate::login) for an example.
    ///
    /// # Errors
    ///
    /// None today; the `Result` keeps room for stores that record failures.
    pub async fn record_failure(&self, attempt: &LoginAttempt) -> Result<(), CheckError> {
        let _ = attempt;
        Ok(())
    }

    /// Records a successful login: clears the (IP, username) tuple, so a user who mistyped
    /// a few times starts afresh. In [`LoginMode::FailuresOnly`] it also refunds the IP and
    /// username limits the attempt's [`check`](Self::check) charged, so successes are never
    /// counted against them (a busy office behind one NAT address does not use up its IP
    /// limit by logging in); the failures before it keep their counts (clearing them would
    /// let an attacker who owns one account reset their spraying budget). In
    /// [`LoginMode::EveryAttempt`] the IP and username limits keep the charge.
    ///
    /// Call it once per checked attempt: each call refunds one attempt's units.
    ///
    /// See the [module docs](crate::login) for an example.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails (the attempt then keeps its charge).
    pub async fn record_success(&self, attempt: &LoginAttempt) -> Result<(), CheckError> {
        let mut refunded = Ok(());
        if self.inner.mode == LoginMode::FailuresOnly {
            for i in [IP, USER] {
                let cost = self.inner.policies[i].cost();
                let r = self.inner.limiters[i].refund(&attempt.keys[i], cost).await;
                refunded = refunded.and(r);
            }
        }
        let reset = self.inner.limiters[IP_USER]
            .reset(&attempt.keys[IP_USER])
            .await;
        refunded.and(reset)
    }

    /// Refunds the tuples `which` (charged by this attempt's `check` before it failed or
    /// was refused). A store that fails here leaves the charge, which errs on the side of
    /// counting; it is logged.
    async fn refund(&self, attempt: &LoginAttempt, which: std::ops::Range<usize>) {
        for i in which {
            let cost = self.inner.policies[i].cost();
            let refunded = self.inner.limiters[i].refund(&attempt.keys[i], cost).await;
            if let Err(error) = refunded {
                tracing::warn!(%error, "tollgate: could not refund a refused login attempt's charge");
            }
        }
    }

    /// Clears the username limit of `username` (an administrator unlocking an account).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().user_rate(Rate::per_hour(1)).build()?;
    /// let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "bob");
    /// assert!(guard.check(&attempt).await?.is_allowed());
    /// guard.record_failure(&attempt).await?; // wrong password
    /// let other = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.2"), "bob");
    /// assert!(!guard.check(&other).await?.is_allowed());
    /// guard.unlock_user("Bob").await?;
    /// assert!(guard.check(&other).await?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn unlock_user(&self, username: &str) -> Result<(), CheckError> {
        let key = Key::new("login-user", self.username_digest(username));
        self.inner.limiters[USER].reset(&key).await
    }

    fn decision(&self, decision: Decision) -> LoginDecision {
        LoginDecision {
            decision,
            policies: Arc::clone(&self.inner.policies),
            now_millis: self.store().now_millis(),
        }
    }
}

/// The answer of [`LoginGuard::check`].
///
/// A refusal renders as a generic 429 (JSON body, `Retry-After`, `Cache-Control: no-store`,
/// no counts and no hint of which limit tripped) with [`to_response`](Self::to_response),
/// or, with the `axum` feature, by returning it from a handler.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::{key::Key, login::LoginGuard, Rate};
///
/// let guard = LoginGuard::builder().ip_rate(Rate::per_minute(1)).build()?;
/// let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "carol");
/// assert!(guard.check(&attempt).await?.is_allowed());
/// guard.record_failure(&attempt).await?; // wrong password
/// let decision = guard.check(&attempt).await?;
/// assert!(!decision.is_allowed());
/// let res = decision.to_response();
/// assert_eq!(res.status(), 429);
/// assert_eq!(res.headers()["retry-after"], "60");
/// assert!(res.headers().get("ratelimit-remaining").is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct LoginDecision {
    decision: Decision,
    policies: Arc<[Policy]>,
    now_millis: u64,
}

impl LoginDecision {
    /// Whether the attempt may go ahead.
    ///
    /// See [`LoginDecision`] for an example.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// When refused, how long until every exhausted limit allows again.
    ///
    /// See [`LoginDecision`] for an example.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision.retry_after()
    }

    /// The per-limit answers, in the order (IP, username), IP, username — for logs and
    /// metrics, never for the client.
    ///
    /// See [`LoginDecision`] for an example.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The generic 429 for a refusal (see the type docs). For an allowed attempt this is a
    /// plain `204 No Content`, which a handler has no reason to send.
    ///
    /// See [`LoginDecision`] for an example.
    pub fn to_response(&self) -> Response<Bytes> {
        self.render(None)
    }

    /// The refusal as a gRPC `RESOURCE_EXHAUSTED` trailers-only response (see
    /// [`crate::grpc`]), with the same generic message.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_rate(Rate::per_minute(1)).build()?;
    /// let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "dave");
    /// assert!(guard.check(&attempt).await?.is_allowed());
    /// guard.record_failure(&attempt).await?; // wrong password
    /// let res = guard.check(&attempt).await?.to_grpc_response();
    /// assert_eq!(res.status(), 200);
    /// assert_eq!(res.headers()["grpc-status"], "8");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn to_grpc_response(&self) -> Response<Bytes> {
        static GRPC: http::HeaderValue = http::HeaderValue::from_static("application/grpc");
        self.render(Some(&GRPC))
    }

    pub(crate) fn render(&self, grpc: Option<&http::HeaderValue>) -> Response<Bytes> {
        match self.refusal() {
            Some(refusal) => refusal
                .with_rendering(Rendering {
                    grpc: grpc.cloned(),
                    ..Rendering::default()
                })
                .default_response(),
            None => {
                let mut res = Response::new(Bytes::new());
                *res.status_mut() = http::StatusCode::NO_CONTENT;
                res
            }
        }
    }

    /// The refusal ([`RefusalKind::LoginRefused`](crate::RefusalKind::LoginRefused)) when
    /// the attempt is refused, `None` when it may go ahead.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, login::LoginGuard, Rate, RefusalKind};
    ///
    /// let guard = LoginGuard::builder().ip_rate(Rate::per_minute(1)).build()?;
    /// let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "frank");
    /// assert!(guard.check(&attempt).await?.refusal().is_none());
    /// guard.record_failure(&attempt).await?;
    /// let refusal = guard.check(&attempt).await?.refusal().unwrap();
    /// assert_eq!(refusal.kind(), RefusalKind::LoginRefused);
    /// assert_eq!(refusal.status(), 429);
    /// assert!(refusal.is_sensitive());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn refusal(&self) -> Option<Refusal> {
        (!self.decision.is_allowed()).then(|| {
            Refusal::login_refused(
                self.decision.clone(),
                Arc::clone(&self.policies),
                self.now_millis,
            )
        })
    }

    /// The refusal as a [`tonic::Status`] (`RESOURCE_EXHAUSTED`, the generic message and a
    /// `google.rpc.RetryInfo` detail) for a login implemented as a gRPC method; `None` when
    /// the attempt is allowed.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_rate(Rate::per_minute(1)).build()?;
    /// let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "erin");
    /// assert!(guard.check(&attempt).await?.to_status().is_none());
    /// guard.record_failure(&attempt).await?;
    /// let status = guard.check(&attempt).await?.to_status().unwrap();
    /// assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "tonic")]
    pub fn to_status(&self) -> Option<tonic::Status> {
        self.refusal().map(|refusal| refusal.to_status())
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for LoginDecision {
    fn into_response(self) -> axum::response::Response {
        self.to_response().map(axum::body::Body::from)
    }
}

/// Builds a [`LoginGuard`]; see [`LoginGuard::builder`].
#[must_use]
pub struct LoginGuardBuilder<S> {
    store: Option<S>,
    make_store: Option<fn() -> S>,
    name: String,
    rates: [Rate; 3],
    algorithm: Algorithm,
    mode: LoginMode,
    ip_source: Option<Box<dyn KeyExtractor>>,
    username_secret: Option<Box<[u8]>>,
}

impl<S: fmt::Debug> fmt::Debug for LoginGuardBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginGuardBuilder")
            .field("store", &self.store)
            .field("name", &self.name)
            .field("rates", &self.rates)
            .field("algorithm", &self.algorithm)
            .field("mode", &self.mode)
            .field("ip_source", &self.ip_source)
            .field("username_secret", &self.username_secret.is_some())
            .finish()
    }
}

impl<S> LoginGuardBuilder<S> {
    /// The store (default: a new [`MemoryStore`]). Share one store between instances (e.g.
    /// Redis) so the limits hold across them.
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, store::MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let guard = LoginGuard::builder().store(store.clone()).build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn store<S2: Store>(self, store: S2) -> LoginGuardBuilder<S2> {
        LoginGuardBuilder {
            store: Some(store),
            make_store: None,
            name: self.name,
            rates: self.rates,
            algorithm: self.algorithm,
            mode: self.mode,
            ip_source: self.ip_source,
            username_secret: self.username_secret,
        }
    }

    /// The prefix of the policy names (default `login`, giving `login.ip-user`, `login.ip`
    /// and `login.user`). Give two guards sharing a store (login, password reset) different
    /// names so their counts stay apart.
    ///
    /// ```
    /// use tollgate::login::LoginGuard;
    ///
    /// let reset = LoginGuard::builder().name("password-reset").build()?;
    /// assert_eq!(reset.policies()[2].name(), "password-reset.user");
    /// assert_eq!(LoginGuard::builder().name("no spaces").build().unwrap_err().field(), "name");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Attempts per (client IP, username) (default 5 per 15 minutes).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_user_rate(Rate::per_hour(10)).build()?;
    /// assert_eq!(guard.policies()[0].limit(), 10);
    /// let err = LoginGuard::builder().ip_user_rate(Rate::per_hour(0)).build().unwrap_err();
    /// assert_eq!(err.field(), "ip_user_rate.limit");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ip_user_rate(mut self, rate: Rate) -> Self {
        self.rates[IP_USER] = rate;
        self
    }

    /// Attempts per client IP, whatever the username (default 50 per 15 minutes).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_rate(Rate::per_hour(100)).build()?;
    /// assert_eq!(guard.policies()[1].limit(), 100);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ip_rate(mut self, rate: Rate) -> Self {
        self.rates[IP] = rate;
        self
    }

    /// Attempts per username, from any client (default 20 per 15 minutes). Its window bounds
    /// how long an attacker can lock a user out; see the [module docs](crate::login).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().user_rate(Rate::per_hour(30)).build()?;
    /// assert_eq!(guard.policies()[2].limit(), 30);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn user_rate(mut self, rate: Rate) -> Self {
        self.rates[USER] = rate;
        self
    }

    /// The algorithm of all three limits (default [`Algorithm::SlidingWindowLog`]: exact, so
    /// a lockout ends exactly one window after the last counted failure; its memory grows
    /// with the limit, which is small for logins).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Algorithm};
    ///
    /// let guard = LoginGuard::builder().algorithm(Algorithm::FixedWindow).build()?;
    /// assert_eq!(guard.policies()[0].algorithm(), Algorithm::FixedWindow);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Which attempts count (default [`LoginMode::FailuresOnly`]).
    ///
    /// See [`LoginMode`] for an example.
    pub fn mode(mut self, mode: LoginMode) -> Self {
        self.mode = mode;
        self
    }

    /// Where the client IP comes from (default [`PeerIp`]). Behind a proxy, use an
    /// extractor that trusts only your proxies' forwarding headers, such as
    /// [`ClientIp`](crate::key::ClientIp).
    ///
    /// ```
    /// use tollgate::key::{ClientIp, TrustedProxies};
    /// use tollgate::login::LoginGuard;
    ///
    /// let guard = LoginGuard::builder()
    ///     .ip_source(ClientIp::new(TrustedProxies::parse(["10.0.0.0/8"])?))
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ip_source(mut self, extractor: impl KeyExtractor) -> Self {
        self.ip_source = Some(Box::new(extractor));
        self
    }

    /// Keys the username digest with `secret`, so store keys cannot be reversed by guessing
    /// usernames. Every instance sharing a store must use the same secret, or their limits
    /// stop adding up; changing it resets every username count.
    ///
    /// ```
    /// use tollgate::{key::Key, login::LoginGuard};
    ///
    /// let plain = LoginGuard::builder().build()?;
    /// let keyed = LoginGuard::builder().username_secret(b"from the secret store").build()?;
    /// let ip = Key::new("ip", "192.0.2.1");
    /// assert_ne!(
    ///     plain.attempt_with_ip_key(ip.clone(), "alice").user_key(),
    ///     keyed.attempt_with_ip_key(ip, "alice").user_key(),
    /// );
    /// assert_eq!(LoginGuard::builder().username_secret(b"").build().unwrap_err().field(), "username_secret");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn username_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.username_secret = Some(secret.as_ref().into());
        self
    }
}

impl<S: Store> LoginGuardBuilder<S> {
    /// Builds the guard.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field: `name`, `ip_user_rate.*`, `ip_rate.*`,
    /// `user_rate.*` (an invalid rate for the algorithm) or `username_secret` (empty).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let err = LoginGuard::builder().user_rate(Rate::per_day(200_000)).build().unwrap_err();
    /// assert_eq!(err.field(), "user_rate.limit"); // too many for the sliding window log
    /// ```
    pub fn build(self) -> Result<LoginGuard<S>, ConfigError> {
        if self
            .username_secret
            .as_deref()
            .is_some_and(<[u8]>::is_empty)
        {
            return Err(ConfigError::new(
                "username_secret",
                "\"\"",
                "an empty secret keys nothing; leave it unset instead",
            ));
        }
        let name_ok = (1..=48).contains(&self.name.len())
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !name_ok {
            return Err(ConfigError::new(
                "name",
                format_args!("{:?}", self.name),
                "must be 1-48 ASCII letters, digits, '_', '-' or '.'",
            ));
        }
        let build = |suffix: &str, field: &str, rate: Rate| {
            Policy::builder(format!("{}.{suffix}", self.name), rate)
                .algorithm(self.algorithm)
                .sensitive(true)
                .build()
                .map_err(|e| e.within(field))
        };
        let policies = [
            build("ip-user", "ip_user_rate", self.rates[IP_USER])?,
            build("ip", "ip_rate", self.rates[IP])?,
            build("user", "user_rate", self.rates[USER])?,
        ];
        let store = match (self.store, self.make_store) {
            (Some(store), _) => store,
            (None, Some(make)) => make(),
            (None, None) => {
                return Err(ConfigError::new(
                    "store",
                    "none",
                    "a login guard needs a store",
                ));
            }
        };
        let [ip_user, ip, user] = policies;
        let base = Limiter::builder()
            .store(store)
            .extractor(self.ip_source.unwrap_or_else(|| Box::new(PeerIp::new())))
            .policy(ip_user.clone())
            .build()?;
        let ip_limiter = base.for_route(Route::new().policy(ip.clone()))?;
        let user_limiter = base.for_route(Route::new().policy(user.clone()))?;
        Ok(LoginGuard {
            inner: Arc::new(GuardInner {
                limiters: [base, ip_limiter, user_limiter],
                policies: Arc::from([ip_user, ip, user]),
                mode: self.mode,
                username_secret: self.username_secret,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> LoginGuard {
        LoginGuard::builder().build().unwrap()
    }

    #[test]
    fn tuple_encoding_is_injective() {
        let g = guard();
        // The IP key material is attacker-influenced text; splitting it differently between
        // "username" and "ip" must never give the same key.
        let a = g.attempt_with_ip_key(Key::new("a:b", "c"), "x");
        let b = g.attempt_with_ip_key(Key::new("a", "b:c"), "x");
        assert_ne!(a.ip_user_key(), b.ip_user_key());
        let a = g.attempt_with_ip_key(Key::new("ip", "1"), "a:b");
        let b = g.attempt_with_ip_key(Key::new("ip", "1"), "a");
        assert_ne!(a.ip_user_key(), b.ip_user_key());
        assert_ne!(a.user_key(), b.user_key());
        assert_eq!(a.ip_key(), b.ip_key());
        // Sources keep the three tuples apart even for equal material.
        assert_ne!(a.ip_key().source(), a.user_key().source());
        assert_ne!(a.ip_user_key().source(), a.ip_key().source());
    }

    #[test]
    fn usernames_are_normalised_and_hashed() {
        let g = guard();
        let ip = Key::new("ip", "192.0.2.1");
        let a = g.attempt_with_ip_key(ip.clone(), "Alice@Example.com");
        let b = g.attempt_with_ip_key(ip.clone(), " alice@example.com\n");
        assert_eq!(a, b);
        assert!(!a.user_key().as_str().contains("alice"));
        assert!(!a.ip_user_key().as_str().contains("alice"));
        assert_eq!(a.user_key().as_str().len(), "login-user:".len() + 32);
    }

    #[tokio::test]
    async fn every_attempt_mode_charges_in_check() {
        let g = LoginGuard::builder()
            .mode(LoginMode::EveryAttempt)
            .ip_user_rate(Rate::per_minute(2))
            .build()
            .unwrap();
        let a = g.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "u");
        assert!(g.check(&a).await.unwrap().is_allowed());
        g.record_failure(&a).await.unwrap(); // no-op
        assert!(g.check(&a).await.unwrap().is_allowed());
        assert!(!g.check(&a).await.unwrap().is_allowed());
        // The refusal charged nothing: another user's attempt from the same IP is the IP
        // limit's third, not its fourth.
        let b = g.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "v");
        let third = g.check(&b).await.unwrap();
        assert_eq!(third.decision().policies()[IP].remaining(), 47);
        g.record_success(&a).await.unwrap();
        assert!(g.check(&a).await.unwrap().is_allowed());
    }

    #[test]
    fn bad_names_are_config_errors() {
        let err = LoginGuard::builder().name("").build().unwrap_err();
        assert_eq!(err.field(), "name");
        let err = LoginGuard::builder()
            .ip_rate(Rate::new(5, Duration::ZERO))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "ip_rate.window");
    }
}
