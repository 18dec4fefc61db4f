//! How a refusal answers: an HTTP response with a JSON body, a gRPC trailers-only
//! response, or a `tonic::Status`.

use bytes::Bytes;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::Response;

use super::{Refusal, RefusalKind};
use crate::response::{write_quota_headers, Refused};

impl Refusal {
    /// The response tollgate sends by default: [`http_response`](Self::http_response), or
    /// [`grpc_response`](Self::grpc_response) for a gRPC call.
    ///
    /// See [`RateLimitLayer::on_refusal`](crate::RateLimitLayer::on_refusal) for an example.
    pub fn default_response(&self) -> Response<Bytes> {
        if self.is_grpc() {
            self.grpc_response()
        } else {
            self.http_response()
        }
    }

    /// The HTTP response: the status, a JSON body, `Cache-Control: no-store`, `Retry-After`
    /// where waiting helps, and quota headers for a rate-limited, non-sensitive refusal.
    ///
    /// See the [module docs](crate::refusal) for an example.
    pub fn http_response(&self) -> Response<Bytes> {
        let retry = self.retry_after_header();
        let mut body = serde_json::json!({
            "error": self.error_code(),
            "message": self.message(),
        });
        if let Some(retry) = self.retry_after_secs() {
            body["retry_after"] = retry.into();
        }
        let mut res = Response::new(Bytes::from(body.to_string()));
        *res.status_mut() = self.status();
        let headers = res.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(retry) = retry {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry));
        }
        self.write_quota_headers(&mut res);
        res.extensions_mut().insert(Refused);
        res
    }

    /// The gRPC trailers-only response (HTTP 200, `grpc-status`, `grpc-message`,
    /// `grpc-status-details-bin` with a `google.rpc.RetryInfo` where waiting helps, quota
    /// headers as for HTTP); see [`crate::grpc`].
    ///
    /// See [`RateLimitLayer::on_refusal`](crate::RateLimitLayer::on_refusal) for an example.
    pub fn grpc_response(&self) -> Response<Bytes> {
        static GRPC: HeaderValue = HeaderValue::from_static("application/grpc");
        let retry = self.retry_after().filter(|_| {
            self.inner.rendering.retry_after || self.inner.kind == RefusalKind::StoreUnavailable
        });
        let mut res = crate::grpc::error_response(
            self.grpc_code(),
            &self.message(),
            retry,
            self.inner.rendering.grpc.as_ref().unwrap_or(&GRPC),
        );
        if self.inner.kind == RefusalKind::CostExceedsCapacity {
            // No wait cures it: a client's retry policy must not try again.
            res.headers_mut().insert(
                crate::grpc::GRPC_RETRY_PUSHBACK.clone(),
                HeaderValue::from_static("-1"),
            );
        }
        self.write_quota_headers(&mut res);
        res.extensions_mut().insert(Refused);
        res
    }

    /// The refusal as a [`tonic::Status`] (the code, the message and, where waiting helps, a
    /// `google.rpc.RetryInfo` detail), for code that answers gRPC calls itself.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::{Global, RequestView}, Limiter, Policy, Rate};
    ///
    /// let limiter = Limiter::builder()
    ///     .policy(Policy::new("rpc", Rate::per_minute(1))?)
    ///     .extractor(Global::new())
    ///     .build()?;
    /// let call = http::Request::post("/pkg.Svc/Method").body(())?;
    /// limiter.decide(&RequestView::new(&call)).await?;
    /// let refusal = limiter.decide(&RequestView::new(&call)).await.unwrap_err();
    /// assert_eq!(refusal.to_status().code(), tonic::Code::ResourceExhausted);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[cfg(feature = "tonic")]
    pub fn to_status(&self) -> tonic::Status {
        let message = self.message();
        let retry = self.retry_after();
        let details = crate::grpc::status_details(self.grpc_code(), &message, retry);
        // The wait in the metadata too, where gRPC's own retry policy reads it.
        let mut metadata = tonic::metadata::MetadataMap::new();
        let pushback = match retry {
            Some(wait) => Some(
                u64::try_from(wait.as_millis())
                    .unwrap_or(u64::MAX)
                    .to_string(),
            ),
            None if self.inner.kind == RefusalKind::CostExceedsCapacity => Some("-1".to_owned()),
            None => None,
        };
        if let Some(value) = pushback.and_then(|v| v.parse().ok()) {
            metadata.insert("grpc-retry-pushback-ms", value);
        }
        tonic::Status::with_details_and_metadata(
            tonic::Code::from_i32(self.grpc_code()),
            message,
            Bytes::from(details),
            metadata,
        )
    }

    /// The `Retry-After` value to send: only where waiting helps, and (for rate limits) only
    /// when the layer sends it.
    fn retry_after_header(&self) -> Option<u64> {
        let wanted =
            self.inner.kind == RefusalKind::StoreUnavailable || self.inner.rendering.retry_after;
        self.retry_after_secs().filter(|_| wanted)
    }

    fn write_quota_headers<B>(&self, res: &mut Response<B>) {
        if self.inner.kind != RefusalKind::RateLimited || self.is_sensitive() {
            return;
        }
        if let Some(decision) = &self.inner.decision {
            write_quota_headers(
                res.headers_mut(),
                decision,
                &self.inner.policies,
                self.inner.now_millis,
                self.inner.rendering.style,
            );
        }
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        self.default_response().map(axum::body::Body::from)
    }
}
