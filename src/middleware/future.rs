//! The response future of [`RateLimitService`](crate::RateLimitService).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use super::body::RateLimitBody;
use super::held::{count, on_response};
use super::shared::{Kept, Shared};
use crate::decision::Decision;
use crate::error::StoreError;
use crate::limiter::{Admitted, Asker, CheckFuture, Held, Pending, PolicySet};
use crate::refusal::Refusal;
use crate::store::Store;

pin_project! {
    /// The future of [`RateLimitService`](crate::RateLimitService): waits for the store's
    /// answer when it was not immediate, waits when a shaping policy asks it to, calls the
    /// inner service and adds quota headers — or answers with the limiter's refusal.
    pub struct ResponseFuture<Inner, ReqBody, St>
    where
        Inner: Service<Request<ReqBody>>,
        St: Store,
    {
        #[pin]
        state: State<Inner, ReqBody, St>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Inner, ReqBody, St>
    where
        Inner: Service<Request<ReqBody>>,
        St: Store,
    {
        Checking {
            #[pin]
            check: CheckFuture<St::CheckFuture>,
            pending: Option<Pending>,
            inner: Option<Inner>,
            request: Option<Request<ReqBody>>,
            // Moved (not cloned) into the next state: one reference count per request.
            shared: Option<Arc<Shared<St>>>,
        },
        Waiting {
            // `None` once the delay is over and only the inner service's readiness is left.
            sleep: Option<Pin<Box<Sleep>>>,
            set: Arc<PolicySet>,
            // A clone not yet driven to readiness: a delayed request holds none of the inner
            // service's capacity (a `ConcurrencyLimit` permit, a `Buffer` slot) while it waits.
            inner: Option<Inner>,
            request: Option<Request<ReqBody>>,
            // Kept only when the response gets quota headers or a `RateLimitInfo`.
            decision: Option<Kept>,
            held: Option<Box<Held>>,
            // Moved (not cloned) into the next state: one reference count per request.
            shared: Option<Arc<Shared<St>>>,
        },
        Calling {
            #[pin]
            future: Inner::Future,
            set: Arc<PolicySet>,
            // Kept only when the response gets quota headers or a `RateLimitInfo`.
            decision: Option<Kept>,
            // Slots and settlement, when the route has in-flight or metered policies.
            held: Option<Box<Held>>,
            shared: Arc<Shared<St>>,
        },
        Early {
            response: Option<Response<Bytes>>,
        },
        Passing {
            #[pin]
            future: Inner::Future,
        },
    }
}

impl<Inner, ReqBody, St> ResponseFuture<Inner, ReqBody, St>
where
    Inner: Service<Request<ReqBody>> + Clone,
    St: Store,
{
    pub(crate) fn early(response: Response<Bytes>) -> Self {
        Self {
            state: State::Early {
                response: Some(response),
            },
        }
    }

    pub(crate) fn pass(future: Inner::Future) -> Self {
        Self {
            state: State::Passing { future },
        }
    }

    /// The store answered: the limiter finishes the decision (the one finishing step), then
    /// the refusal is answered, or the request goes to `inner` now or after a shaping
    /// policy's delay, with what the limiter handed along (the decision for the headers,
    /// what the request holds).
    #[inline(always)]
    pub(crate) fn answered(
        shared: Arc<Shared<St>>,
        pending: Pending,
        outcome: Result<Decision, StoreError>,
        mut request: Request<ReqBody>,
        inner: Ready<'_, Inner>,
    ) -> Self {
        let Pending { set, key, reserved } = pending;
        let admitted: Result<Admitted, Refusal> =
            shared
                .limiter
                .finish(Asker::Layer, &set, &key, outcome, reserved);
        match admitted {
            Err(refusal) => {
                // A refusal must be in gRPC terms for a gRPC call.
                let grpc = crate::grpc::call_content_type(&request);
                Self::early(shared.refuse(refusal, grpc))
            }
            Ok(Admitted { decision, held }) => match shared.proceed(&set, decision, &mut request) {
                (delay, decision) if delay.is_zero() => {
                    Self::calling(inner.call(request), set, decision, held, shared)
                }
                (delay, decision) => Self::waiting(
                    delay,
                    set,
                    inner.unready(),
                    request,
                    (decision, held),
                    shared,
                ),
            },
        }
    }

    /// The inner service was called: only the headers are left to add.
    fn calling(
        future: Inner::Future,
        set: Arc<PolicySet>,
        decision: Option<Kept>,
        held: Option<Box<Held>>,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Calling {
                future,
                set,
                decision,
                held,
                shared,
            },
        }
    }

    /// A shaping policy delays the request: sleep, then drive `inner` to readiness and call it.
    fn waiting(
        delay: std::time::Duration,
        set: Arc<PolicySet>,
        inner: Inner,
        request: Request<ReqBody>,
        (decision, held): (Option<Kept>, Option<Box<Held>>),
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Waiting {
                sleep: Some(Box::pin(tokio::time::sleep(delay))),
                set,
                inner: Some(inner),
                request: Some(request),
                decision,
                held,
                shared: Some(shared),
            },
        }
    }

    /// The store's answer is to wait for: then [`answered`](Self::answered).
    pub(crate) fn checking(
        check: CheckFuture<St::CheckFuture>,
        pending: Pending,
        inner: Inner,
        request: Request<ReqBody>,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                pending: Some(pending),
                inner: Some(inner),
                request: Some(request),
                shared: Some(shared),
            },
        }
    }
}

/// The inner service an admitted request goes to, driven to readiness.
pub(crate) enum Ready<'a, Inner> {
    /// The middleware's own, driven to readiness by `poll_ready`.
    InPlace(&'a mut Inner),
    /// One the future took from the middleware.
    Taken(Inner),
}

impl<Inner> Ready<'_, Inner> {
    #[inline]
    fn call<R>(self, request: R) -> Inner::Future
    where
        Inner: Service<R>,
    {
        match self {
            Ready::InPlace(inner) => inner.call(request),
            Ready::Taken(mut inner) => inner.call(request),
        }
    }

    /// A clone not driven to readiness, for a request that waits before its call. The ready
    /// one is dropped, giving back what its readiness reserved (the middleware's own is
    /// replaced by a fresh clone, which its next `poll_ready` drives).
    fn unready(self) -> Inner
    where
        Inner: Clone,
    {
        match self {
            Ready::InPlace(inner) => super::give_back_readiness(inner),
            Ready::Taken(inner) => inner.clone(),
        }
    }
}

fn into_body<B>(res: Response<Bytes>) -> Response<RateLimitBody<B>> {
    res.map(RateLimitBody::full)
}

impl<Inner, ReqBody, ResBody, St> Future for ResponseFuture<Inner, ReqBody, St>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body,
    St: Store,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, Inner::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Early { response } => {
                    let res = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(into_body(res)));
                }
                StateProj::Passing { future } => {
                    let res = ready!(future.poll(cx))?;
                    return Poll::Ready(Ok(res.map(RateLimitBody::inner)));
                }
                StateProj::Checking {
                    check,
                    pending,
                    inner,
                    request,
                    shared,
                } => {
                    let outcome = ready!(check.poll(cx));
                    let taken = "polled after completion";
                    let next = Self::answered(
                        shared.take().expect(taken),
                        pending.take().expect(taken),
                        outcome,
                        request.take().expect(taken),
                        Ready::Taken(inner.take().expect(taken)),
                    );
                    this.state.set(next.state);
                }
                StateProj::Waiting {
                    sleep,
                    set,
                    inner,
                    request,
                    decision,
                    held,
                    shared,
                } => {
                    if let Some(delay) = sleep {
                        ready!(delay.as_mut().poll(cx));
                        *sleep = None;
                    }
                    let readiness = inner
                        .as_mut()
                        .expect("polled after completion")
                        .poll_ready(cx);
                    if let Err(error) = ready!(readiness) {
                        // Done: a later poll must not call the service that failed.
                        this.state.set(State::Early { response: None });
                        return Poll::Ready(Err(error));
                    }
                    let mut inner = inner.take().expect("polled after completion");
                    let request = request.take().expect("polled after completion");
                    let shared = shared.take().expect("polled after completion");
                    let next = Self::calling(
                        inner.call(request),
                        Arc::clone(set),
                        decision.take(),
                        held.take(),
                        shared,
                    );
                    this.state.set(next.state);
                }
                StateProj::Calling {
                    future,
                    set,
                    decision,
                    held,
                    shared,
                } => {
                    let mut res = ready!(future.poll(cx))?;
                    // Settled (or refunded) first, so that the headers report the state after.
                    if let Some(h) = held.as_deref_mut() {
                        res = count(h, res, decision.as_mut().map(|k| &mut k.decision));
                    }
                    let body_hold = held.take().map(|h| {
                        on_response(*h, &mut res, decision.as_mut().map(|k| &mut k.decision))
                    });
                    if let Some(kept) = decision.take() {
                        shared.decorate(set, kept, &mut res);
                    }
                    return Poll::Ready(Ok(match body_hold {
                        Some(hold) if !hold.is_empty() => {
                            res.map(|body| RateLimitBody::held(body, hold))
                        }
                        _ => res.map(RateLimitBody::inner),
                    }));
                }
            }
        }
    }
}
