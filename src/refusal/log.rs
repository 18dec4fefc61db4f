//! What operators see of a refusal: a counter, the current span's fields and a log event at
//! the kind's documented level.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Refusal, RefusalKind};
use crate::key::Key;
use crate::policy::Policy;
use crate::telemetry;

impl Refusal {
    /// Counts the refusal (`tollgate_refusals_total`), records it on the current span and
    /// logs it at its documented level (see the [module docs](crate::refusal)). Called once
    /// for each refusal tollgate answers with.
    pub(crate) fn log(&self, key: Option<&Key>) {
        telemetry::refusal(self.inner.kind.as_str());
        let code = self.error_code();
        let policy = self.policy().map(Policy::name);
        let digest = key.map(crate::key::digest);
        if let Some(span) = telemetry::current_span() {
            let decision = self.inner.decision.as_ref();
            telemetry::span_decision(&span, digest.as_deref(), policy, decision, Some(code));
        }
        let policy = policy.unwrap_or("");
        let key = digest.as_deref().unwrap_or("");
        macro_rules! event {
            ($level:expr) => {
                tracing::event!(
                    target: "tollgate::refusal",
                    $level,
                    ratelimit.refusal = code,
                    ratelimit.policy = policy,
                    ratelimit.key = key,
                    "{}",
                    self.message()
                )
            };
        }
        match self.inner.kind {
            RefusalKind::Forbidden
            | RefusalKind::LoginRefused
            | RefusalKind::LoginUsernameAmbiguous => event!(tracing::Level::INFO),
            RefusalKind::StoreUnavailable => match &self.inner.store_error {
                Some(error) => tracing::event!(
                    target: "tollgate::refusal",
                    tracing::Level::WARN,
                    ratelimit.refusal = code,
                    %error,
                    "refusing the request: the rate-limit store failed"
                ),
                None => event!(tracing::Level::WARN),
            },
            _ => event!(tracing::Level::DEBUG),
        }
    }

    /// Warns once per process when a request without a key has no peer address, which with
    /// the default extractor means the server does not record it. The refusal itself is
    /// logged by [`log`](Self::log).
    pub(crate) fn warn_missing_peer(has_peer: bool) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        if !has_peer && !WARNED.swap(true, Ordering::Relaxed) {
            tracing::event!(
                target: "tollgate::refusal",
                tracing::Level::WARN,
                ratelimit.refusal = "missing_rate_limit_key",
                "a request has no peer address, so it cannot be keyed by client IP and is \
                 refused with 400; with axum, serve the app with \
                 `into_make_service_with_connect_info::<SocketAddr>()` (tonic records it \
                 itself), or key requests another way (logged once)"
            );
        }
    }
}
