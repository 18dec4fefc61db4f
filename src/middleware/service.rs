//! [`RateLimitService`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::RateLimitBody;
use super::future::ResponseFuture;
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

impl<Inner: Clone, St> RateLimitService<Inner, St> {
    /// The service that was driven to readiness, for a future that calls it later; a fresh
    /// clone is left behind for the next `poll_ready`.
    fn take_ready_inner(&mut self) -> Inner {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
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
    St: Store,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<Inner, ReqBody, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let (set, concluded, held) = match shared.limiter.prepare(&RequestView::new(&req)) {
            Prepared::Pass => return ResponseFuture::pass(self.inner.call(req)),
            Prepared::Refuse(refusal) => {
                let grpc = crate::grpc::content_type(req.headers());
                return ResponseFuture::early(shared.refuse(refusal, grpc));
            }
            Prepared::Check {
                set,
                future,
                key,
                hold,
            } => {
                return ResponseFuture::checking(
                    future,
                    set,
                    (key, hold),
                    self.take_ready_inner(),
                    req,
                    shared,
                )
            }
            Prepared::Decided {
                set,
                outcome,
                key,
                hold,
            } => {
                let concluded = shared.limiter.conclude(&set, key.as_ref(), outcome);
                let held = match (&concluded, hold) {
                    (Ok(decision), Some(seed)) => shared.limiter.held(&set, seed, decision),
                    _ => None,
                };
                (set, concluded, held)
            }
        };
        match concluded {
            Err(refusal) => {
                let grpc = crate::grpc::content_type(req.headers());
                ResponseFuture::early(shared.refuse(refusal, grpc))
            }
            Ok(decision) => match shared.proceed(&set, decision, &mut req) {
                // The common path: decided without waiting, so the inner service (driven to
                // readiness by `poll_ready`) is called right here, and the future only adds
                // the headers.
                (delay, decision) if delay.is_zero() => {
                    ResponseFuture::calling(self.inner.call(req), set, decision, held, shared)
                }
                (delay, decision) => ResponseFuture::waiting(
                    delay,
                    set,
                    self.take_ready_inner(),
                    req,
                    (decision, held),
                    shared,
                ),
            },
        }
    }
}
