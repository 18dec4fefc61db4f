//! How the layer renders responses: the quota header style, `Retry-After`, quota headers on
//! allowed responses, and the user's refusal hook.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response};

use crate::decision::{DecidedBy, Decision};
use crate::policy::Policy;
use crate::refusal::{Refusal, RefusalFn, Rendering};
use crate::response::HeaderStyle;

/// Which allowed responses carry quota headers. A 429 always carries the full set the style
/// names (and `Retry-After`), whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaOnSuccess {
    /// None.
    Never,
    /// Those whose governing policy has at most a tenth of its quota left (rounded up:
    /// with a limit of 5, the last two requests; of 100, the last ten), and so the client is about
    /// to be refused: the default.
    NearLimit,
    /// Every one.
    Always,
}

impl QuotaOnSuccess {
    /// Whether an allowed `decision` gets the headers.
    #[inline]
    fn wants(self, decision: &Decision) -> bool {
        match self {
            Self::Never => false,
            Self::Always => true,
            Self::NearLimit => decision.remaining() <= decision.limit().div_ceil(10),
        }
    }
}

/// How the layer renders responses.
#[derive(Clone)]
pub(crate) struct ResponseConfig {
    pub(crate) style: HeaderStyle,
    pub(crate) quota_on_success: QuotaOnSuccess,
    pub(crate) retry_after: bool,
    pub(crate) on_refusal: Option<Arc<RefusalFn>>,
    /// Whether requests and responses carry a [`RateLimitInfo`](crate::RateLimitInfo).
    pub(crate) info: bool,
}

impl Default for ResponseConfig {
    fn default() -> Self {
        Self {
            style: HeaderStyle::Classic,
            quota_on_success: QuotaOnSuccess::NearLimit,
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
    /// the limit (by default), or sensitive.
    #[inline]
    pub(crate) fn decorates(&self, decision: &Decision, policies: &[Policy]) -> bool {
        // A fail-open decision knows nothing about the quota: say nothing rather than guess.
        self.quota_on_success.wants(decision)
            && decision.decided_by() != DecidedBy::FailOpen
            && !policies.iter().any(Policy::is_sensitive)
    }
}
