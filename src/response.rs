//! Quota headers, and what a refusal's response looks like.
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
//! [`HeaderStyle::Compact`] sends only the three `RateLimit-*` headers (no `X-` twins).
//! With [`HeaderStyle::Structured`] (or [`HeaderStyle::All`]) the IETF structured fields of
//! draft-ietf-httpapi-ratelimit-headers are sent instead (or as well): `RateLimit-Policy`
//! lists every policy (`"burst";q=10;w=1, "daily";q=1000;w=86400`) and `RateLimit` gives each
//! policy's remaining units and seconds to reset (`"burst";r=0;t=1, "daily";r=990;t=86400`).
//!
//! A [sensitive](crate::PolicyBuilder::sensitive) policy's 429 has a generic message and no
//! quota headers at all (only `Retry-After`), and its allowed responses carry none either:
//! "4 attempts left" helps a brute-forcer.

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

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
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` and their `X-RateLimit-*`
    /// twins (the default: what most clients understand today).
    #[default]
    Classic,
    /// Only `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`: the classic
    /// numbers without their `X-` twins. Half the bytes and header-map work of
    /// [`Classic`](Self::Classic), for clients that read the `RateLimit-*` names.
    ///
    /// ```
    /// use tollgate::{HeaderStyle, Limiter, Policy, Rate, RateLimitLayer};
    ///
    /// let limiter = Limiter::builder().policy(Policy::new("api", Rate::per_second(10))?).build()?;
    /// let layer = RateLimitLayer::new(limiter).header_style(HeaderStyle::Compact);
    /// # let _ = layer;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    Compact,
    /// The IETF structured fields `RateLimit-Policy` and `RateLimit`.
    Structured,
    /// Both sets.
    All,
}

/// Which allowed responses carry the quota headers. A rate-limited 429 always carries the
/// full set its [`HeaderStyle`] names, and `Retry-After`, whatever this says; a refusal
/// that waiting cannot cure (a cost above the capacity) carries neither, and a login
/// refusal or one by a [sensitive](crate::PolicyBuilder::sensitive) policy no quota
/// headers.
///
/// ```
/// use tollgate::{Limiter, Policy, QuotaHeaders, Rate, RateLimitLayer};
///
/// let limiter = Limiter::builder().policy(Policy::new("api", Rate::per_minute(600))?).build()?;
/// // Quota status only once the client is about to be refused.
/// let layer = RateLimitLayer::new(limiter).quota_headers(QuotaHeaders::NearLimit);
/// # let _ = layer;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum QuotaHeaders {
    /// Every allowed response (the default): clients that budget their calls (authenticated
    /// APIs with per-user or per-plan quotas) read the remaining quota from any response.
    #[default]
    Always,
    /// Only allowed responses where some policy has at most a tenth of its quota left,
    /// rounded up (with a limit of 100: from the 90th request of a window on; of 5: the last
    /// two allowed). The IETF ratelimit-headers draft lets a server send the fields only
    /// when the quota is nearly used up, which is when a client can act on them; it saves
    /// most responses the header lines (six in the classic style, about a fifth of the work
    /// of serving an axum hello-world; see BENCHMARKS.md).
    NearLimit,
    /// None: only refusals carry quota headers.
    Never,
}

impl QuotaHeaders {
    /// Whether an allowed `decision` gets the headers.
    #[inline]
    pub(crate) fn wants(self, decision: &Decision) -> bool {
        match self {
            Self::Always => true,
            // Every policy, not only the governing one (the fewest units left): with 10 a
            // second and 1 000 an hour, the hour's quota nears its end while the second's
            // still has more units left than the hour's tenth.
            Self::NearLimit => decision
                .policies()
                .iter()
                .any(|p| p.remaining() <= p.limit().div_ceil(10)),
            Self::Never => false,
        }
    }
}

/// A plan writes `quota_headers = true` (every allowed response), `false` (none), or one of
/// `"always"`, `"near_limit"`, `"never"`.
impl<'de> serde::Deserialize<'de> for QuotaHeaders {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = QuotaHeaders;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(r#"true, false, "always", "near_limit" or "never""#)
            }

            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<QuotaHeaders, E> {
                Ok(if v {
                    QuotaHeaders::Always
                } else {
                    QuotaHeaders::Never
                })
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<QuotaHeaders, E> {
                match v {
                    "always" => Ok(QuotaHeaders::Always),
                    "near_limit" => Ok(QuotaHeaders::NearLimit),
                    "never" => Ok(QuotaHeaders::Never),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Milliseconds until reset: on a denial until the `Retry-After` moment, else until the
/// governing policy's reset.
fn reset_millis(decision: &Decision) -> u64 {
    if decision.is_allowed() {
        decision.reset_after().as_millis() as u64
    } else {
        decision.retry_after_millis()
    }
}

/// Seconds until reset as sent in headers, rounded up (never 0 on a denial).
fn reset_secs(decision: &Decision) -> u64 {
    let secs = reset_millis(decision).div_ceil(1000);
    if decision.is_allowed() {
        secs
    } else {
        secs.max(1)
    }
}

/// The response settings a limiter built from a plan brings to the layers made from it
/// (`header_style`, `quota_headers`, `retry_after`), so that `RateLimitLayer::new` honours
/// them as `BuiltPlan::layer` does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerHeaders {
    pub(crate) style: HeaderStyle,
    pub(crate) quota_headers: QuotaHeaders,
    pub(crate) retry_after: bool,
}

/// Marks a response as a refusal tollgate answered (in its extensions): a layer further out,
/// which admitted the request, leaves such a response as it is, so a 429 never carries
/// another policy's quota headers (`RateLimit-Remaining: 118` beside `Retry-After`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused;

/// Marks a response whose quota headers a route's own layer (one made with `for_route`) wrote,
/// with the units they announce left: a layer further out replaces them only when it has
/// fewer left (the client must heed the tighter).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuotaSent(pub(crate) u64);

/// Writes the quota headers for `decision` in `style`.
pub fn write_quota_headers(
    headers: &mut HeaderMap,
    decision: &Decision,
    policies: &[Policy],
    now_millis: u64,
    style: HeaderStyle,
) {
    if matches!(
        style,
        HeaderStyle::Classic | HeaderStyle::All | HeaderStyle::Compact
    ) {
        let twins = style != HeaderStyle::Compact;
        // One allocation for the entries instead of growing the map on the way.
        headers.reserve(if twins { 6 } else { 3 });
        let reset = reset_secs(decision);
        // The reset moment is only sent by `X-RateLimit-Reset`; 0 renders for free. The Unix
        // second at or after the moment itself: flooring the clock before adding the
        // rounded-up wait could name a second before it, when a retry is still refused.
        let reset_at = if twins {
            now_millis
                .saturating_add(reset_millis(decision))
                .div_ceil(1000)
        } else {
            0
        };
        let [limit, remaining, reset, reset_at] =
            number::values([decision.limit(), decision.remaining(), reset, reset_at]);
        // Each `X-` twin shares its value's bytes: cloning a header value copies no digits.
        headers.insert(RATELIMIT_LIMIT.clone(), limit.clone());
        if twins {
            headers.insert(X_RATELIMIT_LIMIT.clone(), limit);
        }
        headers.insert(RATELIMIT_REMAINING.clone(), remaining.clone());
        if twins {
            headers.insert(X_RATELIMIT_REMAINING.clone(), remaining);
        }
        headers.insert(RATELIMIT_RESET.clone(), reset);
        if twins {
            headers.insert(X_RATELIMIT_RESET.clone(), reset_at);
        }
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

/// Header values for numbers, without a heap allocation per value where it can be helped:
/// this runs on every allowed response.
mod number {
    use std::cell::RefCell;

    use bytes::BytesMut;
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

    /// The digits of the longest `u64`.
    const MAX_DIGITS: usize = 20;
    /// Larger numbers are cut from a per-thread chunk of this many bytes: a value then costs
    /// a reference count instead of an allocation, and a chunk (about a hundred values) is
    /// freed when its last value is.
    const CHUNK: usize = 1024;

    struct Recent {
        /// The last limit and reset moment rendered: they repeat from one response to the
        /// next, so they are rendered once and shared.
        limit: Option<(u64, HeaderValue)>,
        reset_at: Option<(u64, HeaderValue)>,
        chunk: Option<BytesMut>,
    }

    thread_local! {
        static RECENT: RefCell<Recent> = const {
            RefCell::new(Recent { limit: None, reset_at: None, chunk: None })
        };
    }

    /// The limit, remaining units, seconds to reset and reset moment (Unix seconds) as header
    /// values, with one visit to the per-thread state for all four.
    pub(super) fn values([limit, remaining, reset, reset_at]: [u64; 4]) -> [HeaderValue; 4] {
        if limit < SMALL && remaining < SMALL && reset < SMALL && reset_at < SMALL {
            return [
                value(limit),
                value(remaining),
                value(reset),
                value(reset_at),
            ];
        }
        RECENT.with(|recent| {
            let Recent {
                limit: last_limit,
                reset_at: last_reset,
                chunk,
            } = &mut *recent.borrow_mut();
            [
                repeated(last_limit, chunk, limit),
                fresh(chunk, remaining),
                fresh(chunk, reset),
                repeated(last_reset, chunk, reset_at),
            ]
        })
    }

    fn repeated(
        last: &mut Option<(u64, HeaderValue)>,
        chunk: &mut Option<BytesMut>,
        n: u64,
    ) -> HeaderValue {
        if n < SMALL {
            return value(n);
        }
        match last {
            Some((m, v)) if *m == n => v.clone(),
            _ => {
                let v = render(chunk, n);
                *last = Some((n, v.clone()));
                v
            }
        }
    }

    fn fresh(chunk: &mut Option<BytesMut>, n: u64) -> HeaderValue {
        if n < SMALL {
            value(n)
        } else {
            render(chunk, n)
        }
    }

    /// `00010203…99`: two digits per division.
    static PAIRS: [u8; 200] = {
        let mut out = [0; 200];
        let mut i = 0;
        while i < 100 {
            out[2 * i] = b'0' + (i / 10) as u8;
            out[2 * i + 1] = b'0' + (i % 10) as u8;
            i += 1;
        }
        out
    };

    fn render(chunk: &mut Option<BytesMut>, n: u64) -> HeaderValue {
        let mut buf = [0u8; MAX_DIGITS];
        let (mut rest, mut at) = (n, MAX_DIGITS);
        while rest >= 100 {
            let pair = (rest % 100) as usize * 2;
            rest /= 100;
            at -= 2;
            buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if rest >= 10 {
            let pair = rest as usize * 2;
            at -= 2;
            buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            at -= 1;
            buf[at] = b'0' + rest as u8;
        }
        let chunk = match chunk {
            Some(c) if c.capacity() >= MAX_DIGITS => c,
            _ => chunk.insert(BytesMut::with_capacity(CHUNK)),
        };
        chunk.extend_from_slice(&buf[at..]);
        // Digits are always a valid header value; the fallback only keeps this panic-free.
        HeaderValue::from_maybe_shared(chunk.split().freeze())
            .unwrap_or_else(|_| HeaderValue::from(n))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn numbers_render_like_the_allocating_conversion() {
            let big = [u64::MAX, 1_700_000_000, 10_000, 99_999, 1 << 40];
            for n in (0..20_000).chain(big) {
                let expected = HeaderValue::from(n);
                assert_eq!(value(n), expected, "{n}");
                for _ in 0..2 {
                    for v in values([n, n, n, n]) {
                        assert_eq!(v, expected, "{n}");
                    }
                }
            }
        }

        #[test]
        fn values_outlive_their_chunk() {
            // Many more values than one chunk holds, kept while later chunks are cut.
            let kept: Vec<_> = (0..1_000u64)
                .map(|i| values([7, u64::MAX - i, 86_400, 1_700_000_000 + i / 10]))
                .collect();
            for (i, [limit, remaining, reset, reset_at]) in (0..1_000u64).zip(kept) {
                assert_eq!(limit, "7");
                assert_eq!(reset, "86400");
                assert_eq!(remaining, (u64::MAX - i).to_string().as_str());
                assert_eq!(reset_at, (1_700_000_000 + i / 10).to_string().as_str());
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
        let item = policy_list
            .bare_item(name)
            .parameter(q, Integer::try_from(d.limit()).ok()?);
        if policy.is_in_flight() {
            // A quota of requests in progress has no window: the draft's quota unit says so.
            item.parameter(
                KeyRef::constant("qu"),
                StringRef::constant("concurrent-requests"),
            );
        } else {
            let window_secs = policy.window_millis().div_ceil(1000).max(1);
            item.parameter(w, Integer::try_from(window_secs).ok()?);
        }
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
