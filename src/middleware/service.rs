//! [`RateLimitService`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::RateLimitBody;
use super::future::{Ready, ResponseFuture};
use super::shared::Shared;
use crate::key::RequestView;
use crate::limiter::{Limiter, Prepared};
use crate::store::Store;

/// The middleware made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `poll_ready` only forwards the inner service's readiness: limits are per key and are
/// decided in `call`, so one throttled client never holds up another.
pub struct RateLimitService<Inner, St> {
    inner: Inner,
    shared: Arc<Shared<St>>,
}

impl<Inner, St> RateLimitService<Inner, St> {
    /// Wraps `inner` with `limiter` and the default responses.
    pub fn new(inner: Inner, limiter: Limiter<St>) -> Self {
        Self::from_shared(inner, Arc::new(Shared::new(limiter)))
    }

    pub(crate) fn from_shared(inner: Inner, shared: Arc<Shared<St>>) -> Self {
        Self { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &Inner {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }

    /// Consumes the middleware, returning the inner service.
    pub fn into_inner(self) -> Inner {
        self.inner
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<St> {
        &self.shared.limiter
    }
}

/// The service that was driven to readiness, for a future that calls it later; a fresh clone
/// is left behind for the next `poll_ready`.
fn take_ready<Inner: Clone>(inner: &mut Inner) -> Inner {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

impl<Inner: Clone, St> Clone for RateLimitService<Inner, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Inner: fmt::Debug, St: fmt::Debug> fmt::Debug for RateLimitService<Inner, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("limiter", &self.shared.limiter)
            .finish()
    }
}

impl<Inner, St, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<Inner, St>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body,
    St: Store,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<Inner, ReqBody, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        match shared.limiter.prepare(&RequestView::new(&req)) {
            Prepared::Pass => ResponseFuture::pass(self.inner.call(req)),
            Prepared::Refuse(refusal) => {
                let grpc = crate::grpc::call_content_type(&req);
                ResponseFuture::early(shared.refuse(refusal, grpc))
            }
            // The common path: decided without waiting, so the inner service (driven to
            // readiness by `poll_ready`) is called right here, and the future only adds the
            // headers.
            Prepared::Decided { outcome, pending } => ResponseFuture::answered(
                shared,
                pending,
                outcome,
                req,
                Ready::InPlace(&mut self.inner),
            ),
            Prepared::Check { future, pending } => {
                ResponseFuture::checking(future, pending, take_ready(&mut self.inner), req, shared)
            }
        }
    }
}
