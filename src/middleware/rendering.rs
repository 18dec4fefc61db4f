//! How the layer renders responses: the quota header style, `Retry-After`, quota headers on
//! allowed responses, and the user's refusal hook.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response};

use crate::decision::{DecidedBy, Decision};
use crate::policy::Policy;
use crate::refusal::{Refusal, RefusalFn, Rendering};
use crate::response::{HeaderStyle, QuotaHeaders};

/// How the layer renders responses.
#[derive(Clone)]
pub(crate) struct ResponseConfig {
    pub(crate) style: HeaderStyle,
    pub(crate) quota_on_success: QuotaHeaders,
    pub(crate) retry_after: bool,
    pub(crate) on_refusal: Option<Arc<RefusalFn>>,
    /// Whether requests and responses carry a [`RateLimitInfo`](crate::RateLimitInfo).
    pub(crate) info: bool,
}

impl Default for ResponseConfig {
    fn default() -> Self {
        Self {
            style: HeaderStyle::Classic,
            quota_on_success: QuotaHeaders::Always,
            retry_after: true,
            on_refusal: None,
            info: false,
        }
    }
}

impl fmt::Debug for ResponseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseConfig")
            .field("style", &self.style)
            .field("quota_on_success", &self.quota_on_success)
            .field("retry_after", &self.retry_after)
            .field("on_refusal", &self.on_refusal.is_some())
            .field("info", &self.info)
            .finish()
    }
}

impl ResponseConfig {
    /// The response for `refusal` (to a gRPC call when `grpc` is its content type): the
    /// user's hook, or the refusal's own rendering with this layer's header settings.
    pub(crate) fn render(&self, refusal: Refusal, grpc: Option<&HeaderValue>) -> Response<Bytes> {
        let refusal = refusal.with_rendering(Rendering {
            style: self.style,
            retry_after: self.retry_after,
            grpc: grpc.cloned(),
        });
        match &self.on_refusal {
            Some(f) => f(&refusal),
            None => refusal.default_response(),
        }
    }

    /// Whether an allowed response gets quota headers: not when turned off, not yet near
    /// the limit (with [`QuotaHeaders::NearLimit`]), or sensitive.
    #[inline]
    pub(crate) fn decorates(&self, decision: &Decision, policies: &[Policy]) -> bool {
        // A fail-open decision knows nothing about the quota: say nothing rather than guess.
        self.quota_on_success.wants(decision)
            && decision.decided_by() != DecidedBy::FailOpen
            && !policies.iter().any(Policy::is_sensitive)
    }
}
