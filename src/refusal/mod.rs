//! [`Refusal`]: every answer tollgate gives instead of calling the service it guards.
//!
//! Like axum's rejections, a refusal knows its HTTP status, its gRPC code, a stable machine
//! error code and a human message, and renders itself for HTTP (a JSON body) or gRPC (a
//! trailers-only status). The layer, the direct [`Limiter`](crate::Limiter) API, the login
//! guard and gRPC calls all produce this one type. The layer's response hook
//! ([`RateLimitLayer::on_refusal`](crate::RateLimitLayer::on_refusal)) sees every refusal the
//! layer gives; [`LoginLayer::on_refusal`](crate::login::LoginLayer::on_refusal) those of the
//! login layer; [`EstimateFromJsonLayer`](crate::EstimateFromJsonLayer) answers its own with
//! [`default_response`](Refusal::default_response).
//!
//! | kind | HTTP | gRPC | `error` code | logged at |
//! |---|---|---|---|---|
//! | [`RateLimited`](RefusalKind::RateLimited) | 429 + `Retry-After` | 8 `RESOURCE_EXHAUSTED` | `rate_limit_exceeded` | DEBUG |
//! | [`CostExceedsCapacity`](RefusalKind::CostExceedsCapacity) | 429, no `Retry-After` | 8 `RESOURCE_EXHAUSTED` | `cost_exceeds_capacity` | DEBUG |
//! | [`MissingKey`](RefusalKind::MissingKey) | 400 | 3 `INVALID_ARGUMENT` | `missing_rate_limit_key` | DEBUG (WARN once per process when the request has no peer address) |
//! | [`Forbidden`](RefusalKind::Forbidden) | 403 | 7 `PERMISSION_DENIED` | `forbidden` | INFO |
//! | [`StoreUnavailable`](RefusalKind::StoreUnavailable) | 503 + `Retry-After` | 14 `UNAVAILABLE` | `rate_limiter_unavailable` | WARN |
//! | [`LoginRefused`](RefusalKind::LoginRefused) | 429 + `Retry-After` | 8 `RESOURCE_EXHAUSTED` | `rate_limit_exceeded` | INFO |
//! | [`LoginBodyTooLarge`](RefusalKind::LoginBodyTooLarge) | 413 | 3 `INVALID_ARGUMENT` | `payload_too_large` | DEBUG |
//! | [`LoginBodyUnreadable`](RefusalKind::LoginBodyUnreadable) | 400 | 3 `INVALID_ARGUMENT` | `unreadable_body` | DEBUG |
//! | [`LoginUsernameAmbiguous`](RefusalKind::LoginUsernameAmbiguous) | 400 | 3 `INVALID_ARGUMENT` | `ambiguous_username` | INFO |
//!
//! Events go to the target `tollgate::refusal` with the fields `ratelimit.refusal` (the
//! error code), `ratelimit.policy` and `ratelimit.key` (a digest, never the raw key) where
//! known. Each refusal is also counted (`tollgate_refusals_total{kind="…"}`, with
//! [`RefusalKind::as_str`] as the kind) and recorded on the current span; see
//! [`crate::observability`]. The JSON body is `{"error":"…","message":"…"}`, with
//! `"retry_after": N` (seconds) when waiting helps. A [sensitive](crate::PolicyBuilder::sensitive) policy's refusal has a
//! generic message and no quota headers, and a login refusal never says which of its limits
//! tripped.
//!
//! # Examples
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use http::StatusCode;
//! use tollgate::{key::RequestView, Limiter, Policy, Rate, RefusalKind};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("api", Rate::per_minute(1))?)
//!     .extractor(tollgate::key::Global::new())
//!     .build()?;
//! let req = http::Request::new(());
//! assert!(limiter.decide(&RequestView::new(&req)).await.is_ok());
//! let refusal = limiter.decide(&RequestView::new(&req)).await.unwrap_err();
//! assert_eq!(refusal.kind(), RefusalKind::RateLimited);
//! assert_eq!(refusal.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(refusal.grpc_code(), 8);
//! assert_eq!(refusal.error_code(), "rate_limit_exceeded");
//! let res = refusal.http_response();
//! assert!(res.headers().contains_key("retry-after"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Response, StatusCode};

use crate::decision::Decision;
use crate::error::StoreError;
use crate::policy::Policy;
use crate::response::HeaderStyle;

mod log;
mod render;

/// Why tollgate answered instead of the guarded service. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalKind {
    /// A policy denied the request: 429 with `Retry-After`.
    RateLimited,
    /// The request's cost exceeds a policy's capacity, so it could never pass: 429 without
    /// `Retry-After` (waiting would not help).
    CostExceedsCapacity,
    /// The request carries nothing to key it by (and the limiter rejects such requests): 400.
    MissingKey,
    /// The key is on the limiter's deny list: 403.
    Forbidden,
    /// The store failed and the failure mode refuses (or there is none): 503.
    StoreUnavailable,
    /// The login guard refused the attempt: a generic 429.
    LoginRefused,
    /// A request body larger than the layer that reads it accepts (the login guard, or
    /// [`EstimateFromJsonLayer`](crate::EstimateFromJsonLayer)): 413, naming the cap.
    LoginBodyTooLarge,
    /// A request body that could not be read (by the same layers): 400.
    LoginBodyUnreadable,
    /// A login request whose username is given more than once (a JSON body with the
    /// username field twice, the username header twice) or by position (a JSON array): 400,
    /// since parsers disagree on which one counts.
    LoginUsernameAmbiguous,
}

impl RefusalKind {
    /// The HTTP status.
    pub const fn status(self) -> StatusCode {
        match self {
            RefusalKind::RateLimited
            | RefusalKind::CostExceedsCapacity
            | RefusalKind::LoginRefused => StatusCode::TOO_MANY_REQUESTS,
            RefusalKind::MissingKey
            | RefusalKind::LoginBodyUnreadable
            | RefusalKind::LoginUsernameAmbiguous => StatusCode::BAD_REQUEST,
            RefusalKind::Forbidden => StatusCode::FORBIDDEN,
            RefusalKind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            RefusalKind::LoginBodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }

    /// The gRPC status code (see [`crate::grpc`] for the constants).
    pub const fn grpc_code(self) -> i32 {
        match self {
            RefusalKind::RateLimited
            | RefusalKind::CostExceedsCapacity
            | RefusalKind::LoginRefused => crate::grpc::RESOURCE_EXHAUSTED,
            RefusalKind::MissingKey
            | RefusalKind::LoginBodyTooLarge
            | RefusalKind::LoginBodyUnreadable
            | RefusalKind::LoginUsernameAmbiguous => crate::grpc::INVALID_ARGUMENT,
            RefusalKind::Forbidden => crate::grpc::PERMISSION_DENIED,
            RefusalKind::StoreUnavailable => crate::grpc::UNAVAILABLE,
        }
    }

    /// The kind's name in metrics (`tollgate_refusals_total{kind=…}`, see
    /// [`crate::observability`]): unlike [`error_code`](Self::error_code), one per kind.
    ///
    /// ```
    /// use tollgate::RefusalKind;
    ///
    /// assert_eq!(RefusalKind::RateLimited.as_str(), "rate_limited");
    /// assert_eq!(RefusalKind::LoginRefused.as_str(), "login_refused");
    /// assert_eq!(RefusalKind::LoginRefused.error_code(), "rate_limit_exceeded");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            RefusalKind::RateLimited => "rate_limited",
            RefusalKind::CostExceedsCapacity => "cost_exceeds_capacity",
            RefusalKind::MissingKey => "missing_key",
            RefusalKind::Forbidden => "forbidden",
            RefusalKind::StoreUnavailable => "store_unavailable",
            RefusalKind::LoginRefused => "login_refused",
            RefusalKind::LoginBodyTooLarge => "login_body_too_large",
            RefusalKind::LoginBodyUnreadable => "login_body_unreadable",
            RefusalKind::LoginUsernameAmbiguous => "login_username_ambiguous",
        }
    }

    /// The stable machine error code: the JSON body's `error` field.
    pub const fn error_code(self) -> &'static str {
        match self {
            RefusalKind::RateLimited | RefusalKind::LoginRefused => "rate_limit_exceeded",
            RefusalKind::CostExceedsCapacity => "cost_exceeds_capacity",
            RefusalKind::MissingKey => "missing_rate_limit_key",
            RefusalKind::Forbidden => "forbidden",
            RefusalKind::StoreUnavailable => "rate_limiter_unavailable",
            RefusalKind::LoginBodyTooLarge => "payload_too_large",
            RefusalKind::LoginBodyUnreadable => "unreadable_body",
            RefusalKind::LoginUsernameAmbiguous => "ambiguous_username",
        }
    }
}

/// How a refusal is rendered: the layer's settings, and whether the request was gRPC.
#[derive(Debug, Clone)]
pub(crate) struct Rendering {
    pub(crate) style: HeaderStyle,
    pub(crate) retry_after: bool,
    pub(crate) grpc: Option<HeaderValue>,
}

impl Default for Rendering {
    fn default() -> Self {
        Self {
            style: HeaderStyle::Classic,
            retry_after: true,
            grpc: None,
        }
    }
}

/// An answer tollgate gives instead of calling the guarded service: status, gRPC code,
/// machine error code, message and rendering in one value. See the [module docs](self).
///
/// Cheap to clone; `'static`, so it can be returned from handlers and stored.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::key::{Global, RequestView};
/// use tollgate::{Limiter, Policy, Rate, RefusalKind};
///
/// let limiter = Limiter::builder()
///     .policy(Policy::new("api", Rate::per_minute(1))?)
///     .extractor(Global::new())
///     .build()?;
/// let req = http::Request::get("/").body(())?;
/// limiter.decide(&RequestView::new(&req)).await.ok();
/// let refusal = limiter.decide(&RequestView::new(&req)).await.unwrap_err();
/// assert_eq!(refusal.kind(), RefusalKind::RateLimited);
/// assert_eq!(refusal.status(), 429);
/// assert_eq!(refusal.policy().map(|p| p.name()), Some("api"));
/// let res = refusal.default_response(); // what the layer answers
/// assert!(res.headers().contains_key("retry-after"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Refusal {
    // Boxed: a refusal travels in `Result`s on the request path, where the common `Ok` case
    // should stay small.
    inner: Box<Details>,
}

#[derive(Clone)]
struct Details {
    kind: RefusalKind,
    decision: Option<Decision>,
    policies: Arc<[Policy]>,
    cost: Option<u64>,
    /// The capacity a cost exceeded, when not the policy's own (a per-key override's).
    capacity: Option<u64>,
    /// For a body too large: the most bytes the layer reads.
    body_limit: Option<usize>,
    store_error: Option<StoreError>,
    now_millis: u64,
    rendering: Rendering,
}

impl fmt::Debug for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refusal")
            .field("kind", &self.inner.kind)
            .field("decision", &self.inner.decision)
            .field(
                "policies",
                &self
                    .inner
                    .policies
                    .iter()
                    .map(Policy::name)
                    .collect::<Vec<_>>(),
            )
            .field("store_error", &self.inner.store_error)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.error_code(),
            self.status(),
            self.message()
        )
    }
}

impl std::error::Error for Refusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .store_error
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

const NO_POLICIES: &[Policy] = &[];

impl Refusal {
    fn details(kind: RefusalKind) -> Details {
        Details {
            kind,
            decision: None,
            policies: Arc::from(NO_POLICIES),
            cost: None,
            capacity: None,
            body_limit: None,
            store_error: None,
            now_millis: 0,
            rendering: Rendering::default(),
        }
    }

    fn from_details(details: Details) -> Self {
        Self {
            inner: Box::new(details),
        }
    }

    /// A denial by the store: rate limited.
    pub(crate) fn rate_limited(decision: Decision, policies: Arc<[Policy]>, now: u64) -> Self {
        Self::from_details(Details {
            decision: Some(decision),
            policies,
            now_millis: now,
            ..Self::details(RefusalKind::RateLimited)
        })
    }

    /// The login guard's refusal (its policies are sensitive: nothing about counts leaks).
    pub(crate) fn login_refused(decision: Decision, policies: Arc<[Policy]>, now: u64) -> Self {
        Self::from_details(Details {
            decision: Some(decision),
            policies,
            now_millis: now,
            ..Self::details(RefusalKind::LoginRefused)
        })
    }

    /// A cost above `capacity`, the capacity of `policy` in force for the key (a per-key
    /// override's), which the store found.
    pub(crate) fn cost_exceeds_capacity_in_force(
        policy: &Policy,
        cost: u64,
        capacity: u64,
    ) -> Self {
        Self::from_details(Details {
            policies: Arc::from([policy.clone()]),
            cost: Some(cost),
            capacity: Some(capacity),
            ..Self::details(RefusalKind::CostExceedsCapacity)
        })
    }

    /// The capacity the cost exceeded, for [`RefusalKind::CostExceedsCapacity`]: the
    /// policy's, or a per-key override's when that is what refused it.
    pub(crate) fn capacity(&self) -> Option<u64> {
        self.inner
            .capacity
            .or_else(|| self.policy().map(Policy::capacity))
    }

    /// The store failed: `decision` is the failure mode's refusal (with the cool-down as
    /// retry time) when there is one.
    pub(crate) fn store_unavailable(error: Option<StoreError>, decision: Option<Decision>) -> Self {
        Self::from_details(Details {
            store_error: error,
            decision,
            ..Self::details(RefusalKind::StoreUnavailable)
        })
    }

    /// A refusal that needs no details (missing key, forbidden, login body problems).
    pub(crate) fn of_kind(kind: RefusalKind) -> Self {
        Self::from_details(Self::details(kind))
    }

    /// A refusal of a request body that could not be read whole within `limit` bytes (too
    /// large, or unreadable), by whichever layer reads bodies (the login guard,
    /// [`EstimateFromJsonLayer`](crate::EstimateFromJsonLayer)).
    pub(crate) fn of_body(kind: RefusalKind, limit: usize) -> Self {
        Self::from_details(Details {
            body_limit: Some(limit),
            ..Self::details(kind)
        })
    }

    pub(crate) fn with_rendering(mut self, rendering: Rendering) -> Self {
        self.inner.rendering = rendering;
        self
    }

    /// What kind of refusal this is.
    ///
    /// See the [module docs](self) for an example.
    pub fn kind(&self) -> RefusalKind {
        self.inner.kind
    }

    /// The HTTP status (429, 400, 403, 413 or 503).
    ///
    /// See the [module docs](self) for an example.
    pub fn status(&self) -> StatusCode {
        self.inner.kind.status()
    }

    /// The gRPC status code.
    ///
    /// See the [module docs](self) for an example.
    pub fn grpc_code(&self) -> i32 {
        self.inner.kind.grpc_code()
    }

    /// The stable machine error code (the JSON body's `error` field). A cost above a
    /// [sensitive](crate::PolicyBuilder::sensitive) policy's capacity answers
    /// `rate_limit_exceeded`, as its other refusals do: a client that chooses its cost would
    /// otherwise find the capacity by bisection. (It can still tell the two apart by the
    /// missing `Retry-After`, since waiting does not help such a cost: keep costs a client
    /// chooses off sensitive policies.)
    ///
    /// See the [module docs](self) for an example.
    pub fn error_code(&self) -> &'static str {
        match self.inner.kind {
            RefusalKind::CostExceedsCapacity if self.is_sensitive() => {
                RefusalKind::RateLimited.error_code()
            }
            kind => kind.error_code(),
        }
    }

    /// The store's decision, for refusals that came from one (rate limited, login refused,
    /// a failure mode refusing while the store is down).
    ///
    /// See the [module docs](self) for an example.
    pub fn decision(&self) -> Option<&Decision> {
        self.inner.decision.as_ref()
    }

    /// The policy that denied (the one that frees up last), or whose capacity a cost
    /// exceeds.
    ///
    /// See the [module docs](self) for an example.
    pub fn policy(&self) -> Option<&Policy> {
        match &self.inner.decision {
            Some(decision) => self.inner.policies.get(decision.governing_index()),
            None => self.inner.policies.first(),
        }
    }

    /// The cost asked for, for [`RefusalKind::CostExceedsCapacity`].
    ///
    /// See the [module docs](self) for an example.
    pub fn cost(&self) -> Option<u64> {
        self.inner.cost
    }

    /// Every policy the request was checked against, in the order of
    /// [`Decision::policies`]; empty for refusals decided before any policy.
    ///
    /// See the [module docs](self) for an example.
    pub fn policies(&self) -> &[Policy] {
        &self.inner.policies
    }

    /// The store error behind a [`RefusalKind::StoreUnavailable`], when there was one (a
    /// failure mode refusing during an open circuit has none).
    ///
    /// See the [module docs](self) for an example.
    pub fn store_error(&self) -> Option<&StoreError> {
        self.inner.store_error.as_ref()
    }

    /// Whether the refusal must not reveal counts (a sensitive policy, or the login guard).
    ///
    /// See the [module docs](self) for an example.
    pub fn is_sensitive(&self) -> bool {
        self.inner.kind == RefusalKind::LoginRefused
            || self.inner.policies.iter().any(Policy::is_sensitive)
    }

    /// Whether the request was a gRPC call; the default response is then
    /// [`grpc_response`](Self::grpc_response).
    ///
    /// See the [module docs](self) for an example.
    pub fn is_grpc(&self) -> bool {
        self.inner.rendering.grpc.is_some()
    }

    /// How long until the same request could pass, when waiting helps: the denying policy's
    /// retry time, or for a store failure the failure mode's cool-down (1 s at least).
    ///
    /// See the [module docs](self) for an example.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.inner.kind {
            RefusalKind::RateLimited | RefusalKind::LoginRefused => self
                .inner
                .decision
                .as_ref()
                .map(|d| Duration::from_millis(d.retry_after_millis().max(1))),
            RefusalKind::StoreUnavailable => Some(Duration::from_millis(
                self.inner
                    .decision
                    .as_ref()
                    .map_or(1_000, |d| d.retry_after_millis().max(1_000)),
            )),
            _ => None,
        }
    }

    /// [`retry_after`](Self::retry_after) in whole seconds, rounded up, at least 1: the
    /// `Retry-After` value.
    ///
    /// See the [module docs](self) for an example.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after()
            .map(|d| (d.as_millis() as u64).div_ceil(1000).max(1))
    }

    /// The human-readable message: generic when sensitive, else naming what happened.
    ///
    /// See the [module docs](self) for an example.
    pub fn message(&self) -> Cow<'static, str> {
        match self.inner.kind {
            RefusalKind::RateLimited | RefusalKind::LoginRefused => {
                if self.is_sensitive() {
                    return Cow::Borrowed(SENSITIVE_MESSAGE);
                }
                let retry = self.retry_after_secs().unwrap_or(1);
                // The limit in force, which a per-key override may have changed: the
                // decision's, where it counts requests per window as the rate does.
                let limit = self.decision().map(Decision::limit).filter(|&l| l > 0);
                Cow::Owned(match self.policy() {
                    // An in-flight limit is a number at once; its window is the slot lease.
                    Some(p) if p.is_in_flight() => format!(
                        "Too many requests in progress: at most {} at once ({}). Retry in {retry} s.",
                        limit.unwrap_or(p.limit()),
                        p.name()
                    ),
                    Some(p) => {
                        let windowed = matches!(
                            p.algorithm(),
                            crate::Algorithm::FixedWindow
                                | crate::Algorithm::SlidingWindowCounter
                                | crate::Algorithm::SlidingWindowLog
                        );
                        let rate = match limit {
                            Some(l) if windowed => crate::Rate::new(l, p.rate().window()),
                            _ => p.rate(),
                        };
                        format!(
                            "Rate limit exceeded: {rate} ({}). Retry in {retry} s.",
                            p.name()
                        )
                    }
                    None => format!("Rate limit exceeded. Retry in {retry} s."),
                })
            }
            RefusalKind::CostExceedsCapacity => {
                Cow::Owned(match (self.policy(), self.inner.cost) {
                    // A sensitive policy's name and capacity are counts too.
                    _ if self.is_sensitive() => {
                        "The request costs more than any limit allows.".to_owned()
                    }
                    (Some(p), Some(cost)) => format!(
                        "cost {cost} exceeds the capacity {} of policy \"{}\"",
                        self.capacity().unwrap_or_else(|| p.capacity()),
                        p.name()
                    ),
                    _ => "The request costs more than any limit allows.".to_owned(),
                })
            }
            RefusalKind::MissingKey => {
                Cow::Borrowed("The request carries nothing to rate-limit it by.")
            }
            RefusalKind::Forbidden => Cow::Borrowed("This client is not allowed."),
            RefusalKind::StoreUnavailable => {
                Cow::Borrowed("The rate limiter is unavailable. Please retry shortly.")
            }
            RefusalKind::LoginBodyTooLarge => match self.inner.body_limit {
                Some(limit) => Cow::Owned(format!(
                    "The request body is too large: at most {limit} bytes are accepted."
                )),
                None => Cow::Borrowed("The request body is too large."),
            },
            RefusalKind::LoginBodyUnreadable => {
                Cow::Borrowed("The request body could not be read.")
            }
            RefusalKind::LoginUsernameAmbiguous => {
                Cow::Borrowed("The login request gives the username more than once.")
            }
        }
    }
}

/// The message of a sensitive refusal: no counts, no hint of which limit.
pub(crate) const SENSITIVE_MESSAGE: &str = "Too many requests. Please try again later.";

/// Builds a custom response for a refusal; see
/// [`RateLimitLayer::on_refusal`](crate::RateLimitLayer::on_refusal).
pub(crate) type RefusalFn = dyn Fn(&Refusal) -> Response<Bytes> + Send + Sync;
