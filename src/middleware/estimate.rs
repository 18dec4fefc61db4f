//! [`EstimateFromJsonLayer`]: a metered route's estimate read from a field of the JSON body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::RateLimitBody;
use crate::refusal::{Refusal, Rendering};
use crate::route::CostEstimate;

/// The default cap on the body [`EstimateFromJsonLayer`] reads: 64 KiB.
pub const DEFAULT_MAX_ESTIMATE_BODY: usize = 64 * 1024;

/// Reads a whole-number field of a JSON request body (`max_tokens` of a completion, `limit`
/// of an export) into the request's [`CostEstimate`], for
/// [`Meter::from_body`](crate::route::Meter::from_body) to reserve. Put it outside the
/// [`RateLimitLayer`](crate::RateLimitLayer) (added after it in axum, so that it runs first).
///
/// A JSON body (`Content-Type: application/json`, or a `+json` type) is read into memory
/// with a cap ([`max_body_bytes`](Self::max_body_bytes), default 64 KiB): a larger one is
/// refused with `413` before anything is charged, an unreadable one with `400`; the inner
/// service gets the same bytes. Any other body is passed on as it streams, unread (an upload,
/// a gRPC stream), with no estimate. A body that is not a JSON
/// object, or has no such field, or whose field is not a whole number, gets no estimate (the
/// meter's default applies). A field given twice counts at its larger value, so a client
/// cannot reserve little and be served for much; a value of 0 reserves one unit, so a spent
/// budget refuses it (see [`Meter`](crate::route::Meter)).
///
/// ```
/// use axum::{routing::post, Router};
/// use tollgate::route::{Meter, Route};
/// use tollgate::{EstimateFromJsonLayer, Limiter, Policy, Rate, RateLimitLayer};
///
/// let limiter = Limiter::builder()
///     .route("POST /v1/completions", Route::new()
///         .metered(Policy::new("tokens", Rate::per_minute(90_000))?, Meter::from_body(1_000)))
///     .default_route(Route::exempt())
///     .build()?;
/// let app: Router = Router::new()
///     .route("/v1/completions", post(|| async { "..." }))
///     .layer(RateLimitLayer::new(limiter))
///     .layer(EstimateFromJsonLayer::new("max_tokens"));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct EstimateFromJsonLayer {
    field: Arc<str>,
    max_body: usize,
}

impl EstimateFromJsonLayer {
    /// Reads top-level field `field`.
    pub fn new(field: impl Into<String>) -> Self {
        Self {
            field: Arc::from(field.into().as_str()),
            max_body: DEFAULT_MAX_ESTIMATE_BODY,
        }
    }

    /// The largest body read (default [`DEFAULT_MAX_ESTIMATE_BODY`]); larger ones get `413`.
    pub fn max_body_bytes(mut self, max: usize) -> Self {
        self.max_body = max;
        self
    }
}

impl<S> Layer<S> for EstimateFromJsonLayer {
    type Service = EstimateFromJson<S>;

    fn layer(&self, inner: S) -> Self::Service {
        EstimateFromJson {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`EstimateFromJsonLayer`].
#[derive(Clone)]
pub struct EstimateFromJson<S> {
    inner: S,
    layer: EstimateFromJsonLayer,
}

impl<S: fmt::Debug> fmt::Debug for EstimateFromJson<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EstimateFromJson")
            .field("inner", &self.inner)
            .field("field", &self.layer.field)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for EstimateFromJson<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if !is_json(req.headers()) {
            // Not JSON: nothing to read an estimate from, and the body is left streaming
            // (an upload, a gRPC stream) rather than buffered under a cap it was never meant
            // to fit.
            let future = self.inner.call(req);
            return Box::pin(async move { Ok(future.await?.map(RateLimitBody::inner)) });
        }
        // The body is read before the inner service is called: what its readiness holds (a
        // `ConcurrencyLimit` permit, a `Buffer` slot) is given back now and asked again then,
        // so a client trickling its body holds none of it.
        let mut inner = super::give_back_readiness(&mut self.inner);
        let layer = self.layer.clone();
        let grpc = crate::grpc::call_content_type(&req).cloned();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let bytes = match super::read_capped(body, layer.max_body).await {
                Ok(bytes) => bytes,
                Err(kind) => {
                    let refusal = Refusal::of_body(kind, layer.max_body);
                    refusal.log(None);
                    let rendering = Rendering {
                        grpc,
                        ..Rendering::default()
                    };
                    let res = refusal.with_rendering(rendering).default_response();
                    return Ok(res.map(RateLimitBody::full));
                }
            };
            if let Some(n) = json_number_field(&bytes, &layer.field) {
                parts.extensions.insert(CostEstimate(n));
            }
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            Ok(inner.call(req).await?.map(RateLimitBody::inner))
        })
    }
}

/// Whether the request says its body is JSON: `application/json` or a `+json` type
/// (`application/merge-patch+json`), any parameters, any letter case.
fn is_json(headers: &http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.len() > 5
                && subtype.is_char_boundary(subtype.len() - 5)
                && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// The largest whole-number value of top-level `field` in a JSON object body, if any.
fn json_number_field(body: &[u8], field: &str) -> Option<u64> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    struct Field<'f>(&'f str);
    impl<'de> Visitor<'de> for Field<'_> {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<u64>, A::Error> {
            let mut found: Option<u64> = None;
            while let Some(key) = map.next_key::<String>()? {
                if key != self.0 {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                let value: serde_json::Value = map.next_value()?;
                if let Some(n) = value.as_u64() {
                    found = Some(found.map_or(n, |f| f.max(n)));
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    match de.deserialize_map(Field(field)) {
        Ok(found) if de.end().is_ok() => found,
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::json_number_field;

    #[test]
    fn reads_the_field_and_takes_the_larger_of_two() {
        let read = |b: &str| json_number_field(b.as_bytes(), "max_tokens");
        assert_eq!(read(r#"{"max_tokens":512,"prompt":"hi"}"#), Some(512));
        assert_eq!(read(r#"{"max_tokens":5,"max_tokens":4000}"#), Some(4000));
        assert_eq!(read(r#"{"max_tokens":4000,"max_tokens":5}"#), Some(4000));
        assert_eq!(read(r#"{"max_tokens":-1}"#), None);
        assert_eq!(read(r#"{"max_tokens":1.5}"#), None);
        assert_eq!(read(r#"{"max_tokens":"9"}"#), None);
        assert_eq!(read(r#"{"other":{"max_tokens":9}}"#), None);
        assert_eq!(read("[1]"), None);
        assert_eq!(read("{\"max_tokens\":3} x"), None);
    }
}
