//! A login attempt's answer and its rendering: one generic refusal, whatever tripped.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use crate::decision::Decision;
use crate::policy::Policy;
use crate::refusal::{Refusal, Rendering};

/// The answer of [`LoginGuard::check`](super::LoginGuard::check).
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
    pub(super) decision: Decision,
    pub(super) policies: Arc<[Policy]>,
    pub(super) now_millis: u64,
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
    /// the attempt is refused, `None` when it may go ahead. An attempt refused because the
    /// store is down and a limit fails closed gets
    /// [`RefusalKind::StoreUnavailable`](crate::RefusalKind::StoreUnavailable) (503, as the
    /// layer answers), not a lockout it did not earn.
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
            if self.decision.decided_by() == crate::DecidedBy::FailClosed {
                return Refusal::store_unavailable(None, Some(self.decision.clone()));
            }
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
