//! Quota headers and the rejection response.
//!
//! On a denial the layer answers `429 Too Many Requests` with:
//!
//! | header | value |
//! |---|---|
//! | `Retry-After` | whole seconds until the request would pass, rounded up, never 0 |
//! | `RateLimit-Limit` | the governing policy's quota |
//! | `RateLimit-Remaining` | units left |
//! | `RateLimit-Reset` | seconds until reset (on a denial: the same value as `Retry-After`) |
//! | `X-RateLimit-Limit`, `X-RateLimit-Remaining` | the same, legacy names |
//! | `X-RateLimit-Reset` | the same moment as a Unix time in seconds |
//! | `Cache-Control` | `no-store` |
//! | `Content-Type` | `application/json` |
//!
//! and the body `{"error":"rate_limit_exceeded","message":"…","retry_after":N}`.
//!
//! With [`HeaderStyle::Structured`] (or [`HeaderStyle::All`]) the IETF structured fields of
//! draft-ietf-httpapi-ratelimit-headers are sent instead (or as well): `RateLimit-Policy`
//! lists every policy (`"burst";q=10;w=1, "daily";q=1000;w=86400`) and `RateLimit` gives each
//! policy's remaining units and seconds to reset (`"burst";r=0;t=1, "daily";r=990;t=86400`).
//!
//! A [sensitive](crate::PolicyBuilder::sensitive) policy's 429 has a generic message and no
//! quota headers at all (only `Retry-After`), and its allowed responses carry none either:
//! "4 attempts left" helps a brute-forcer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::decision::Decision;
use crate::policy::Policy;

static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which quota headers to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderStyle {
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` and their `X-RateLimit-*`
    /// twins (the default: what most clients understand today).
    #[default]
    Classic,
    /// The IETF structured fields `RateLimit-Policy` and `RateLimit`.
    Structured,
    /// Both sets.
    All,
}

/// Everything a custom rejection response may want to know.
///
/// See [`RateLimitLayer::on_rejection`](crate::RateLimitLayer::on_rejection).
#[derive(Debug)]
pub struct Rejection<'a> {
    pub(crate) decision: &'a Decision,
    pub(crate) policies: &'a [Policy],
    pub(crate) now_millis: u64,
    pub(crate) config: &'a ResponseConfig,
    pub(crate) grpc: Option<&'a HeaderValue>,
}

impl<'a> Rejection<'a> {
    /// The decision.
    pub fn decision(&self) -> &'a Decision {
        self.decision
    }

    /// The policy that denied (the one that frees up last).
    pub fn policy(&self) -> Option<&'a Policy> {
        self.policies.get(self.decision.governing_index())
    }

    /// Every policy checked, in the order of [`Decision::policies`].
    pub fn policies(&self) -> &'a [Policy] {
        self.policies
    }

    /// Whether any policy checked is sensitive (then say nothing about counts).
    pub fn is_sensitive(&self) -> bool {
        self.policies.iter().any(Policy::is_sensitive)
    }

    /// The `Retry-After` value: whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        self.decision.retry_after_millis().div_ceil(1000).max(1)
    }

    /// Whether the request was a gRPC call (its `Content-Type` starts with
    /// `application/grpc`); the default response is then [`grpc_response`](Self::grpc_response).
    ///
    /// See [`grpc_response`](Self::grpc_response) for an example.
    pub fn is_grpc(&self) -> bool {
        self.grpc.is_some()
    }

    /// The human-readable message: generic when any policy is sensitive, else naming the
    /// rate and policy.
    ///
    /// See [`grpc_response`](Self::grpc_response) for an example.
    pub fn message(&self) -> String {
        let retry = self.retry_after_secs();
        if self.is_sensitive() {
            SENSITIVE_MESSAGE.to_owned()
        } else {
            match self.policy() {
                Some(p) => format!(
                    "Rate limit exceeded: {} ({}). Retry in {retry} s.",
                    p.rate(),
                    p.name()
                ),
                None => format!("Rate limit exceeded. Retry in {retry} s."),
            }
        }
    }

    /// The response tollgate sends by default: [`http_response`](Self::http_response), or
    /// [`grpc_response`](Self::grpc_response) for a gRPC call.
    pub fn default_response(&self) -> Response<Bytes> {
        if self.is_grpc() {
            self.grpc_response()
        } else {
            self.http_response()
        }
    }

    /// The 429 with `Retry-After`, quota headers (unless sensitive) and a JSON body.
    ///
    /// See [`grpc_response`](Self::grpc_response) for an example.
    pub fn http_response(&self) -> Response<Bytes> {
        let retry = self.retry_after_secs();
        let body = serde_json::json!({
            "error": "rate_limit_exceeded",
            "message": self.message(),
            "retry_after": retry,
        });
        let mut res = Response::new(Bytes::from(body.to_string()));
        *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let headers = res.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.config.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry));
        }
        self.write_quota_headers(headers);
        res
    }

    /// The gRPC `RESOURCE_EXHAUSTED` trailers-only response (HTTP 200, `grpc-status: 8`,
    /// `grpc-message`, `retry-after` and a `google.rpc.RetryInfo` in
    /// `grpc-status-details-bin`, quota headers unless sensitive); see [`crate::grpc`].
    ///
    /// A custom rejection that changes the HTTP body but leaves gRPC calls alone:
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::new(
    ///     Limiter::builder().policy(Policy::new("api", Rate::per_second(5))?).build()?,
    /// )
    /// .on_rejection(|rejection| {
    ///     if rejection.is_grpc() {
    ///         return rejection.grpc_response();
    ///     }
    ///     let mut res = rejection.http_response();
    ///     *res.body_mut() = Bytes::from(format!("{{\"error\":{:?}}}", rejection.message()));
    ///     res
    /// });
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn grpc_response(&self) -> Response<Bytes> {
        static GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
        let retry = self
            .decision
            .retry_after()
            .filter(|_| self.config.retry_after)
            .map(|d| d.max(Duration::from_millis(1)));
        let mut res = crate::grpc::error_response(
            crate::grpc::RESOURCE_EXHAUSTED,
            &self.message(),
            retry,
            self.grpc.unwrap_or(&GRPC),
        );
        self.write_quota_headers(res.headers_mut());
        res
    }

    fn write_quota_headers(&self, headers: &mut HeaderMap) {
        if !self.is_sensitive() {
            write_quota_headers(
                headers,
                self.decision,
                self.policies,
                self.now_millis,
                self.config.style,
            );
        }
    }
}

/// The message of a sensitive policy's rejection: no counts, no hint of which limit.
pub(crate) const SENSITIVE_MESSAGE: &str = "Too many requests. Please try again later.";

/// Builds a custom rejection response; see
/// [`RateLimitLayer::on_rejection`](crate::RateLimitLayer::on_rejection).
pub type RejectionFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;

/// How the layer renders responses.
#[derive(Clone)]
pub(crate) struct ResponseConfig {
    pub(crate) style: HeaderStyle,
    pub(crate) quota_on_success: bool,
    pub(crate) retry_after: bool,
    pub(crate) on_rejection: Option<Arc<RejectionFn>>,
}

impl Default for ResponseConfig {
    fn default() -> Self {
        Self {
            style: HeaderStyle::Classic,
            quota_on_success: true,
            retry_after: true,
            on_rejection: None,
        }
    }
}

impl fmt::Debug for ResponseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseConfig")
            .field("style", &self.style)
            .field("quota_on_success", &self.quota_on_success)
            .field("retry_after", &self.retry_after)
            .field("on_rejection", &self.on_rejection.is_some())
            .finish()
    }
}

impl ResponseConfig {
    pub(crate) fn reject(
        &self,
        decision: &Decision,
        policies: &[Policy],
        now_millis: u64,
        grpc: Option<&HeaderValue>,
    ) -> Response<Bytes> {
        let rejection = Rejection {
            decision,
            policies,
            now_millis,
            config: self,
            grpc,
        };
        match &self.on_rejection {
            Some(f) => f(&rejection),
            None => rejection.default_response(),
        }
    }

    /// Adds quota headers to an allowed response, unless turned off or sensitive.
    pub(crate) fn decorate(
        &self,
        headers: &mut HeaderMap,
        decision: &Decision,
        policies: &[Policy],
        now_millis: u64,
    ) {
        // A fail-open decision knows nothing about the quota: say nothing rather than guess.
        if self.quota_on_success
            && decision.outcome() != crate::decision::Outcome::FailOpen
            && !policies.iter().any(Policy::is_sensitive)
        {
            write_quota_headers(headers, decision, policies, now_millis, self.style);
        }
    }
}

/// Seconds until reset as sent in headers: on a denial the `Retry-After` moment, else the
/// governing policy's reset, rounded up.
fn reset_secs(decision: &Decision) -> u64 {
    if decision.is_allowed() {
        (decision.reset_after().as_millis() as u64).div_ceil(1000)
    } else {
        decision.retry_after_millis().div_ceil(1000).max(1)
    }
}

/// Writes the quota headers for `decision` in `style`.
pub fn write_quota_headers(
    headers: &mut HeaderMap,
    decision: &Decision,
    policies: &[Policy],
    now_millis: u64,
    style: HeaderStyle,
) {
    if matches!(style, HeaderStyle::Classic | HeaderStyle::All) {
        // One allocation for the six entries instead of growing the map on the way.
        headers.reserve(6);
        let reset = reset_secs(decision);
        let limit = number::cached(number::LIMIT, decision.limit());
        headers.insert(RATELIMIT_LIMIT.clone(), limit.clone());
        headers.insert(X_RATELIMIT_LIMIT.clone(), limit);
        let remaining = decision.remaining();
        headers.insert(RATELIMIT_REMAINING.clone(), number::value(remaining));
        headers.insert(X_RATELIMIT_REMAINING.clone(), number::value(remaining));
        headers.insert(RATELIMIT_RESET.clone(), number::value(reset));
        headers.insert(
            X_RATELIMIT_RESET.clone(),
            number::cached(number::RESET_AT, now_millis / 1000 + reset),
        );
    }
    if matches!(style, HeaderStyle::Structured | HeaderStyle::All) {
        if let Some((policy_field, ratelimit_field)) = structured_fields(decision, policies) {
            if let Ok(v) = HeaderValue::from_str(&policy_field) {
                headers.insert(RATELIMIT_POLICY.clone(), v);
            }
            if let Ok(v) = HeaderValue::from_str(&ratelimit_field) {
                headers.insert(RATELIMIT.clone(), v);
            }
        }
    }
}

/// Header values for numbers, without an allocation where it can be helped: this runs on every
/// allowed response.
mod number {
    use std::cell::RefCell;

    use http::HeaderValue;

    /// Numbers below this are slices of one static string.
    const SMALL: u64 = 10_000;
    const LEN: usize = 10 + 90 * 2 + 900 * 3 + 9_000 * 4;
    static DIGITS: [u8; LEN] = digits();
    /// `0123456789101112…9999`.
    static NUMBERS: &str = match std::str::from_utf8(&DIGITS) {
        Ok(s) => s,
        Err(_) => panic!("digits are ASCII"),
    };

    const fn width(n: usize) -> usize {
        if n < 10 {
            1
        } else if n < 100 {
            2
        } else if n < 1_000 {
            3
        } else {
            4
        }
    }

    const fn digits() -> [u8; LEN] {
        let mut out = [0; LEN];
        let (mut n, mut at) = (0, 0);
        while n < SMALL as usize {
            let width = width(n);
            let (mut i, mut v) = (width, n);
            while i > 0 {
                i -= 1;
                out[at + i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
            at += width;
            n += 1;
        }
        out
    }

    /// `n` as a header value; below 10 000 without an allocation.
    pub(super) fn value(n: u64) -> HeaderValue {
        if n < SMALL {
            let n = n as usize;
            let at = match width(n) {
                1 => n,
                2 => 10 + (n - 10) * 2,
                3 => 190 + (n - 100) * 3,
                _ => 2_890 + (n - 1_000) * 4,
            };
            HeaderValue::from_static(&NUMBERS[at..at + width(n)])
        } else {
            HeaderValue::from(n)
        }
    }

    /// The slot of a policy's limit (the same on every response).
    pub(super) const LIMIT: usize = 0;
    /// The slot of the reset moment in Unix seconds (the same for a second at a time).
    pub(super) const RESET_AT: usize = 1;

    thread_local! {
        static RECENT: RefCell<[(u64, Option<HeaderValue>); 2]> =
            const { RefCell::new([(0, None), (0, None)]) };
    }

    /// Like [`value`], but a large number that repeats (a limit, the reset moment) is rendered
    /// once per thread and shared afterwards.
    pub(super) fn cached(slot: usize, n: u64) -> HeaderValue {
        if n < SMALL {
            return value(n);
        }
        RECENT.with(|recent| {
            let mut recent = recent.borrow_mut();
            let (last, cached) = &mut recent[slot];
            match cached {
                Some(v) if *last == n => v.clone(),
                _ => {
                    let v = HeaderValue::from(n);
                    *last = n;
                    *cached = Some(v.clone());
                    v
                }
            }
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn numbers_render_like_the_allocating_conversion() {
            for n in (0..20_000).chain([u64::MAX, 1_700_000_000]) {
                assert_eq!(value(n), HeaderValue::from(n), "{n}");
                assert_eq!(cached(LIMIT, n), HeaderValue::from(n), "{n}");
                assert_eq!(cached(LIMIT, n), HeaderValue::from(n), "{n} again");
            }
        }
    }
}

/// `RateLimit-Policy` and `RateLimit` as structured-field lists, one item per policy.
fn structured_fields(decision: &Decision, policies: &[Policy]) -> Option<(String, String)> {
    use sfv::{Integer, KeyRef, ListSerializer, StringRef};
    let q = KeyRef::constant("q");
    let w = KeyRef::constant("w");
    let r = KeyRef::constant("r");
    let t = KeyRef::constant("t");
    let mut policy_list = ListSerializer::new();
    let mut ratelimit_list = ListSerializer::new();
    for (policy, d) in policies.iter().zip(decision.policies()) {
        let name = StringRef::from_str(policy.name()).ok()?;
        let window_secs = policy.window_millis().div_ceil(1000).max(1);
        policy_list
            .bare_item(name)
            .parameter(q, Integer::try_from(d.limit()).ok()?)
            .parameter(w, Integer::try_from(window_secs).ok()?);
        let reset = if d.is_allowed() {
            d.reset_after_millis().div_ceil(1000)
        } else {
            d.retry_after_millis().div_ceil(1000).max(1)
        };
        ratelimit_list
            .bare_item(name)
            .parameter(r, Integer::try_from(d.remaining()).ok()?)
            .parameter(t, Integer::try_from(reset).ok()?);
    }
    Some((policy_list.finish()?, ratelimit_list.finish()?))
}

/// A plain JSON error response (400 for a missing key, 503 when the store fails closed).
pub(crate) fn json_error(status: StatusCode, error: &str, message: &str) -> Response<Bytes> {
    let body = serde_json::json!({ "error": error, "message": message });
    let mut res = Response::new(Bytes::from(body.to_string()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}
