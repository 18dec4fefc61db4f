//! What every service made by one [`RateLimitLayer`](crate::RateLimitLayer) shares, and what
//! it does with the limiter's answer: the response of a refusal, and the quota headers and
//! [`RateLimitInfo`] of a request that went ahead.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};

use super::info::RateLimitInfo;
use super::rendering::ResponseConfig;
use crate::decision::Decision;
use crate::limiter::{Limiter, PolicySet};
use crate::refusal::Refusal;
use crate::response::{write_quota_headers, HeaderStyle, QuotaSent, Refused};
use crate::store::Store;

/// What every service made by one layer shares: the limiter and how responses look.
pub(crate) struct Shared<St> {
    pub(crate) limiter: Limiter<St>,
    pub(crate) response: ResponseConfig,
    /// A route's own layer (its limiter made with `for_route`): its quota headers are marked
    /// ([`QuotaSent`]) for a layer further out to weigh.
    pub(crate) marks_quota: bool,
}

impl<St> Clone for Shared<St> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            response: self.response.clone(),
            marks_quota: self.marks_quota,
        }
    }
}

impl<St> Shared<St> {
    /// `limiter`, with the default responses.
    pub(crate) fn new(limiter: Limiter<St>) -> Self {
        let mut response = ResponseConfig::default();
        // A limiter built from a plan brings the plan's response settings.
        if let Some(plan) = limiter.layer_headers() {
            response.style = plan.style;
            response.quota_on_success = plan.quota_headers;
            response.retry_after = plan.retry_after;
        }
        let marks_quota = limiter.is_attached();
        Self {
            limiter,
            response,
            marks_quota,
        }
    }
}

impl<St: Store> Shared<St> {
    /// The response for a refusal: the user's hook, or the refusal's own rendering.
    /// With [`info_extensions`](crate::RateLimitLayer::info_extensions), the response carries the
    /// refusal's [`RateLimitInfo`] in its extensions.
    pub(crate) fn refuse(&self, refusal: Refusal, grpc: Option<&HeaderValue>) -> Response<Bytes> {
        let info = self
            .response
            .info
            .then(|| RateLimitInfo::from_refusal(&refusal));
        let mut res = self.response.render(refusal, grpc);
        // An `on_refusal` hook's response is as much a refusal as tollgate's own.
        res.extensions_mut().insert(Refused);
        if let Some(info) = info {
            res.extensions_mut().insert(info);
        }
        res
    }

    /// For a request that goes ahead: how long a shaping policy makes it wait, and the
    /// decision when the response needs it (for quota headers or a [`RateLimitInfo`]). With
    /// [`info_extensions`](crate::RateLimitLayer::info_extensions), `request` gets the info.
    #[inline]
    pub(crate) fn proceed<B>(
        &self,
        set: &PolicySet,
        decision: Decision,
        request: &mut Request<B>,
    ) -> (Duration, Option<Kept>) {
        let delay = decision.delay();
        let policies = &set.enforced;
        let headers = self.response.decorates(&decision, policies);
        // With headers near the limit only, a response that settles or refunds units can
        // bring the key near its limit (or away from it): asked again when it passes.
        let ask_again = !headers
            && self.response.quota_on_success == crate::QuotaHeaders::NearLimit
            && (!set.meters.is_empty() || set.count.is_some());
        if self.response.info {
            let info = RateLimitInfo::from_decision(&decision, policies);
            request.extensions_mut().insert(info);
        } else if !headers && !ask_again {
            return (delay, None);
        }
        // `X-RateLimit-Reset` is a moment: the decision's `reset_after` counts from now, not
        // from when the handler is done.
        let decided_at = if (headers || ask_again)
            && !matches!(
                self.response.style,
                HeaderStyle::Compact | HeaderStyle::Structured
            ) {
            self.limiter.store().now_millis()
        } else {
            0
        };
        (
            delay,
            Some(Kept {
                decision,
                headers,
                ask_again,
                decided_at,
            }),
        )
    }

    /// Finishes the response of a request that went ahead: the quota headers of the decision
    /// (made with policy set `set`), and its [`RateLimitInfo`].
    pub(crate) fn decorate<B>(&self, set: &PolicySet, kept: Kept, res: &mut Response<B>) {
        if res.extensions().get::<Refused>().is_some() {
            // Refused further in (a route's own layer, the login layer): its quota headers
            // and information are the refusal's, not this layer's policies'.
            return;
        }
        let policies = &set.enforced;
        // A layer further in (a route's own, attached with `for_route`) may have written its
        // quota headers already: the fewer remaining is what the client must heed, so this
        // layer's replace them only when it has fewer left.
        let headers =
            kept.headers || (kept.ask_again && self.response.decorates(&kept.decision, policies));
        let inner_tighter = headers
            && res
                .extensions()
                .get::<QuotaSent>()
                .is_some_and(|inner| inner.0 <= kept.decision.remaining());
        if headers && !inner_tighter {
            if self.marks_quota {
                res.extensions_mut()
                    .insert(QuotaSent(kept.decision.remaining()));
            }
            let style = self.response.style;
            write_quota_headers(
                res.headers_mut(),
                &kept.decision,
                policies,
                kept.decided_at,
                style,
            );
        }
        if self.response.info {
            let info = RateLimitInfo::from_decision(&kept.decision, policies);
            res.extensions_mut().insert(info);
        }
    }
}

/// The decision of a request that went ahead, kept for its response.
pub(crate) struct Kept {
    pub(crate) decision: Decision,
    /// Whether the response gets quota headers.
    headers: bool,
    /// Whether to ask again, with the decision as the response left it (settled, refunded),
    /// when the headers go near the limit only.
    ask_again: bool,
    /// The store's clock at the decision, for `X-RateLimit-Reset` (0 when no header reads
    /// it).
    decided_at: u64,
}
