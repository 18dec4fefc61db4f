//! [`RateLimitInfo`].

use std::sync::Arc;
use std::time::Duration;

use crate::decision::{DecidedBy, Decision};
use crate::policy::Policy;
use crate::refusal::{Refusal, RefusalKind};

/// A read-only view of a request's rate-limit decision, which a [`RateLimitLayer`] with
/// [`info_extensions(true)`](crate::RateLimitLayer::info_extensions) puts in the request's
/// extensions (for the handler) and in the response's extensions (for
/// `TraceLayer::on_response` and other outer layers). A refusal's response carries one too.
/// A request no policy decided (an exempt route, an allow-listed key, only shadow policies)
/// carries none.
///
/// The numbers are the governing policy's (see [`Decision`]). They are the server's to use:
/// for a [sensitive](crate::PolicyBuilder::sensitive) policy, do not show them to clients.
///
/// # Examples
///
/// A handler that shows the remaining quota:
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use axum::{body::Body, routing::get, Extension, Router};
/// use http::Request;
/// use tower::ServiceExt;
/// use tollgate::{key::Global, Limiter, Policy, Rate, RateLimitInfo, RateLimitLayer};
///
/// let limiter = Limiter::builder()
///     .policy(Policy::new("api", Rate::per_minute(10))?)
///     .extractor(Global::new())
///     .build()?;
/// let app = Router::new()
///     .route(
///         "/quota",
///         get(|Extension(info): Extension<RateLimitInfo>| async move {
///             format!("{} of {} left", info.remaining(), info.limit())
///         }),
///     )
///     .layer(RateLimitLayer::new(limiter).info_extensions(true));
/// let res = app.oneshot(Request::get("/quota").body(Body::empty())?).await?;
/// // The response carries it too, for outer layers.
/// let info = res.extensions().get::<RateLimitInfo>().unwrap().clone();
/// assert_eq!(info.policy(), Some("api"));
/// assert!(info.is_allowed());
/// let body = axum::body::to_bytes(res.into_body(), 1024).await?;
/// assert_eq!(&body[..], b"9 of 10 left");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// [`RateLimitLayer`]: crate::RateLimitLayer
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitInfo {
    policy: Option<Arc<str>>,
    allowed: bool,
    limit: u64,
    remaining: u64,
    reset_after: Duration,
    retry_after: Option<Duration>,
    outcome: Option<DecidedBy>,
    refusal: Option<RefusalKind>,
}

impl RateLimitInfo {
    /// The view of `decision`, taken against `policies` (in the decision's order).
    pub(crate) fn from_decision(decision: &Decision, policies: &[Policy]) -> Self {
        Self {
            policy: policies
                .get(decision.governing_index())
                .map(|p| Arc::clone(p.shared_name())),
            allowed: decision.is_allowed(),
            limit: decision.limit(),
            remaining: decision.remaining(),
            reset_after: decision.reset_after(),
            retry_after: decision.retry_after(),
            outcome: Some(decision.decided_by()),
            refusal: None,
        }
    }

    /// The view of a refusal: its decision's when it has one.
    pub(crate) fn from_refusal(refusal: &Refusal) -> Self {
        let base = match refusal.decision() {
            Some(decision) => Self::from_decision(decision, refusal.policies()),
            None => Self {
                policy: refusal.policy().map(|p| Arc::clone(p.shared_name())),
                allowed: false,
                limit: refusal.policy().map_or(0, Policy::capacity),
                remaining: 0,
                reset_after: Duration::ZERO,
                retry_after: None,
                outcome: None,
                refusal: None,
            },
        };
        Self {
            allowed: false,
            retry_after: refusal.retry_after(),
            refusal: Some(refusal.kind()),
            ..base
        }
    }

    /// The governing policy's name; `None` for a refusal before any policy (no key, a
    /// deny-listed key, a store failure without a failure mode).
    ///
    /// See the [type docs](Self) for an example.
    pub fn policy(&self) -> Option<&str> {
        self.policy.as_deref()
    }

    /// Whether the request went ahead.
    ///
    /// See the [type docs](Self) for an example.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// The governing policy's quota (its capacity for a cost refusal; 0 when unknown).
    ///
    /// See the [type docs](Self) for an example.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units the governing policy has left after this request.
    ///
    /// See the [type docs](Self) for an example.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// When the governing policy's quota is whole again.
    ///
    /// See the [type docs](Self) for an example.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// For a refusal where waiting helps, how long until the same request could pass.
    ///
    /// See the [type docs](Self) for an example.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// How the store's decision was reached; `None` when the request was refused before the
    /// store was asked (or the store failed with no failure mode to decide).
    ///
    /// See the [type docs](Self) for an example.
    pub fn decided_by(&self) -> Option<DecidedBy> {
        self.outcome
    }

    /// The kind of refusal, for a response tollgate gave instead of the guarded service.
    ///
    /// See the [type docs](Self) for an example.
    pub fn refusal(&self) -> Option<RefusalKind> {
        self.refusal
    }
}
