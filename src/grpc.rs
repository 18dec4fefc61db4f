//! gRPC rejections: `RESOURCE_EXHAUSTED` instead of an HTTP 429.
//!
//! gRPC clients cannot read an HTTP 429: they expect HTTP 200 with the outcome in
//! `grpc-status`. When a request is a `POST` whose `Content-Type` starts with
//! `application/grpc` (gRPC, and gRPC-Web, whose clients read the same headers),
//! [`RateLimitLayer`](crate::RateLimitLayer) answers a denial with a *trailers-only* response:
//! HTTP 200, an empty body, and in the headers
//!
//! | header | value |
//! |---|---|
//! | `grpc-status` | `8` (`RESOURCE_EXHAUSTED`) |
//! | `grpc-message` | the same message as the HTTP body's, percent-encoded |
//! | `grpc-status-details-bin` | a `google.rpc.Status` with a `google.rpc.RetryInfo` detail |
//! | `retry-after` | whole seconds, as for HTTP |
//! | `grpc-retry-pushback-ms` | the same wait in milliseconds, which gRPC's own retry policy reads (it reads neither of the above); `-1`, "do not retry", for a cost above the capacity, which no wait cures |
//! | quota headers | as for HTTP (none for a sensitive policy) |
//! | `cache-control` | `no-store`: a cache in front must not keep a refusal of status 200 |
//!
//! Any other method gets the HTTP answer whatever its `Content-Type` (gRPC calls are always
//! `POST`): a client that put a gRPC content type on a `GET` would otherwise turn its own 429
//! into an empty 200 that a cache could keep and serve to everyone.
//!
//! Store failures become `UNAVAILABLE` (14), a request without a key `INVALID_ARGUMENT` (3)
//! and a denied client `PERMISSION_DENIED` (7), mirroring the HTTP 503, 400 and 403.
//!
//! The protobuf is encoded by hand (it is a few bytes), so no gRPC crate is needed to send
//! it; clients decode it with, for example, `tonic-types`' `StatusExt::get_error_details`.
//!
//! # Examples
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tollgate::{key::Global, Limiter, Policy, Rate, RateLimitLayer};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("rpc", Rate::per_minute(1))?)
//!     .extractor(Global::new())
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(limiter))
//!     .service_fn(|_req: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::new()))
//!     });
//! let call = || {
//!     Request::post("/grpc.health.v1.Health/Check")
//!         .header("content-type", "application/grpc")
//!         .body(String::new())
//!         .unwrap()
//! };
//! svc.clone().oneshot(call()).await?;
//! let res = svc.oneshot(call()).await?;
//! assert_eq!(res.status(), StatusCode::OK); // never 429 for gRPC
//! assert_eq!(res.headers()["grpc-status"], "8");
//! assert!(res.headers().contains_key("grpc-status-details-bin"));
//! assert!(res.headers().contains_key("retry-after"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
static GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");
/// Server pushback: how long a client's built-in retry policy waits before it retries (gRPC
/// proposal A6); negative means do not retry.
pub(crate) static GRPC_RETRY_PUSHBACK: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// `RESOURCE_EXHAUSTED`: the gRPC status of a rate-limited call.
pub const RESOURCE_EXHAUSTED: i32 = 8;
/// `UNAVAILABLE`: the gRPC status when the store fails.
pub const UNAVAILABLE: i32 = 14;
/// `INVALID_ARGUMENT`: the gRPC status when a request carries nothing to key it by.
pub const INVALID_ARGUMENT: i32 = 3;
/// `PERMISSION_DENIED`: the gRPC status of a client on the deny list.
pub const PERMISSION_DENIED: i32 = 7;

const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The request's `Content-Type` when it is a gRPC (or gRPC-Web) request: `application/grpc`,
/// `application/grpc-web` or `application/grpc-web-text` (any case), alone or followed by `+`
/// (a message format such as `+proto`) or `;` (parameters). Anything else that merely starts
/// the same way (`application/grpcx`) is not gRPC.
///
/// ```
/// let req = http::Request::builder()
///     .header("content-type", "application/grpc+proto")
///     .body(())
///     .unwrap();
/// assert!(tollgate::grpc::content_type(req.headers()).is_some());
/// let req = http::Request::builder()
///     .header("content-type", "application/json")
///     .body(())
///     .unwrap();
/// assert!(tollgate::grpc::content_type(req.headers()).is_none());
/// let req = http::Request::builder()
///     .header("content-type", "application/grpcx")
///     .body(())
///     .unwrap();
/// assert!(tollgate::grpc::content_type(req.headers()).is_none());
/// ```
pub fn content_type(headers: &HeaderMap) -> Option<&HeaderValue> {
    let value = headers.get(CONTENT_TYPE)?;
    let bytes = value.as_bytes();
    let prefix = b"application/grpc";
    if bytes.len() < prefix.len() || !bytes[..prefix.len()].eq_ignore_ascii_case(prefix) {
        return None;
    }
    let mut rest = &bytes[prefix.len()..];
    for suffix in [&b"-web-text"[..], b"-web"] {
        if rest.len() >= suffix.len() && rest[..suffix.len()].eq_ignore_ascii_case(suffix) {
            rest = &rest[suffix.len()..];
            break;
        }
    }
    matches!(rest.first(), None | Some(b'+' | b';')).then_some(value)
}

/// The gRPC content type of a request that is a gRPC call: a `POST` (every gRPC and gRPC-Web
/// call is one) with a gRPC [`content_type`]. A refusal is answered in gRPC terms for these
/// alone: a `GET` that claims a gRPC content type gets the HTTP answer, so that a client cannot
/// turn its refusal into an empty `200` a cache in front would keep and serve to others.
pub(crate) fn call_content_type<B>(request: &http::Request<B>) -> Option<&HeaderValue> {
    if request.method() != http::Method::POST {
        return None;
    }
    content_type(request.headers())
}

/// A trailers-only gRPC error response: HTTP 200, empty body, `grpc-status` `code`,
/// `grpc-message` `message`, `cache-control: no-store` (an HTTP cache must not keep an answer
/// of status 200 that is a refusal), and, when `retry_after` is given, a `retry-after` header
/// and a `google.rpc.RetryInfo` in `grpc-status-details-bin`.
///
/// `content_type` is echoed (use the request's, so gRPC-Web clients get theirs back).
///
/// ```
/// use std::time::Duration;
/// use http::HeaderValue;
/// use tollgate::grpc;
///
/// let res = grpc::error_response(
///     grpc::RESOURCE_EXHAUSTED,
///     "Too many requests. Please try again later.",
///     Some(Duration::from_millis(1500)),
///     &HeaderValue::from_static("application/grpc"),
/// );
/// assert_eq!(res.status(), 200);
/// assert_eq!(res.headers()["grpc-status"], "8");
/// assert_eq!(res.headers()["grpc-message"], "Too many requests. Please try again later.");
/// assert_eq!(res.headers()["retry-after"], "2");
/// assert_eq!(res.headers()["grpc-retry-pushback-ms"], "1500");
/// assert_eq!(res.headers()["cache-control"], "no-store");
/// assert!(res.body().is_empty());
/// ```
pub fn error_response(
    code: i32,
    message: &str,
    retry_after: Option<Duration>,
    content_type: &HeaderValue,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    *res.status_mut() = StatusCode::OK;
    let headers = res.headers_mut();
    headers.insert(CONTENT_TYPE, content_type.clone());
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(GRPC_STATUS.clone(), HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert(GRPC_MESSAGE.clone(), v);
    }
    let details = status_details(code, message, retry_after);
    if let Ok(v) = HeaderValue::from_str(&base64_no_pad(&details)) {
        headers.insert(GRPC_STATUS_DETAILS.clone(), v);
    }
    if let Some(retry) = retry_after {
        let millis = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX);
        headers.insert(RETRY_AFTER, HeaderValue::from(millis.div_ceil(1000).max(1)));
        headers.insert(GRPC_RETRY_PUSHBACK.clone(), HeaderValue::from(millis));
    }
    res
}

/// The protobuf bytes of `google.rpc.Status { code, message, details }`, with one
/// `google.rpc.RetryInfo` detail when `retry_after` is given.
///
/// ```
/// use std::time::Duration;
///
/// let bytes = tollgate::grpc::status_details(8, "slow down", Some(Duration::from_secs(2)));
/// assert_eq!(&bytes[..2], &[0x08, 8]); // field 1 (code), varint 8
/// ```
pub fn status_details(code: i32, message: &str, retry_after: Option<Duration>) -> Vec<u8> {
    let mut status = Vec::with_capacity(96);
    if code != 0 {
        put_tag(&mut status, 1, 0);
        // int32 is encoded as a sign-extended 64-bit varint.
        put_varint(&mut status, i64::from(code) as u64);
    }
    if !message.is_empty() {
        put_bytes(&mut status, 2, message.as_bytes());
    }
    if let Some(retry) = retry_after {
        let mut duration = Vec::with_capacity(12);
        if retry.as_secs() != 0 {
            put_tag(&mut duration, 1, 0);
            put_varint(&mut duration, retry.as_secs());
        }
        if retry.subsec_nanos() != 0 {
            put_tag(&mut duration, 2, 0);
            put_varint(&mut duration, u64::from(retry.subsec_nanos()));
        }
        let mut retry_info = Vec::with_capacity(16);
        put_bytes(&mut retry_info, 1, &duration);
        let mut any = Vec::with_capacity(64);
        put_bytes(&mut any, 1, RETRY_INFO_TYPE_URL.as_bytes());
        put_bytes(&mut any, 2, &retry_info);
        put_bytes(&mut status, 3, &any);
    }
    status
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_tag(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `grpc-message` encoding: bytes outside `0x20..=0x7E`, and `%`, become `%XX`.
fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.extend(crate::key::percent_escaped(b));
        }
    }
    out
}

fn base64_no_pad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | u32::from(b) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64_no_pad(b""), "");
        assert_eq!(base64_no_pad(b"f"), "Zg");
        assert_eq!(base64_no_pad(b"fo"), "Zm8");
        assert_eq!(base64_no_pad(b"foo"), "Zm9v");
        assert_eq!(base64_no_pad(b"foob"), "Zm9vYg");
        assert_eq!(base64_no_pad(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn status_details_encode_retry_info() {
        let bytes = status_details(8, "x", Some(Duration::new(3, 5)));
        let expected: Vec<u8> = [
            &[0x08, 8, 0x12, 1, b'x', 0x1a, 50, 0x0a, 40][..],
            RETRY_INFO_TYPE_URL.as_bytes(),
            &[0x12, 6, 0x0a, 4, 0x08, 3, 0x10, 5],
        ]
        .concat();
        assert_eq!(bytes, expected);
    }

    #[test]
    fn only_grpc_content_types_are_grpc() {
        let is_grpc = |ct: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            content_type(&h).is_some()
        };
        for yes in [
            "application/grpc",
            "APPLICATION/GRPC",
            "application/grpc+proto",
            "application/grpc;charset=utf-8",
            "application/grpc-web",
            "application/grpc-web+proto",
            "application/grpc-web-text",
            "Application/gRPC-Web-Text+proto",
        ] {
            assert!(is_grpc(yes), "{yes}");
        }
        for no in [
            "application/grpcx",
            "application/grpc-x",
            "application/grpc-webx",
            "application/grpc-web-textual",
            "application/grp",
            "application/json",
            "",
        ] {
            assert!(!is_grpc(no), "{no}");
        }
        assert!(content_type(&HeaderMap::new()).is_none());
    }

    #[test]
    fn grpc_message_is_percent_encoded() {
        assert_eq!(percent_encode("a b%ü"), "a b%25%C3%BC");
    }

    #[test]
    fn content_type_detection() {
        let mut h = HeaderMap::new();
        assert!(content_type(&h).is_none());
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("Application/GRPC-web", true),
            ("application/json", false),
            ("application/grp", false),
        ] {
            h.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(content_type(&h).is_some(), grpc, "{ct}");
        }
    }
}
