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
use super::held::on_response;
use super::shared::{Kept, Shared};
use crate::key::Key;
use crate::limiter::{CheckFuture, Held, HoldSeed, PolicySet};
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
            set: Arc<PolicySet>,
            key: Option<Key>,
            hold: Option<Box<HoldSeed>>,
            inner: Option<Inner>,
            request: Option<Request<ReqBody>>,
            // Moved (not cloned) into the next state: one reference count per request.
            shared: Option<Arc<Shared<St>>>,
        },
        Waiting {
            sleep: Pin<Box<Sleep>>,
            set: Arc<PolicySet>,
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
    Inner: Service<Request<ReqBody>>,
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

    /// The inner service was called from `call`: only the headers are left to add.
    pub(crate) fn calling(
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

    /// A shaping policy delays the request: sleep, then call `inner`.
    pub(crate) fn waiting(
        delay: std::time::Duration,
        set: Arc<PolicySet>,
        inner: Inner,
        request: Request<ReqBody>,
        (decision, held): (Option<Kept>, Option<Box<Held>>),
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Waiting {
                sleep: Box::pin(tokio::time::sleep(delay)),
                set,
                inner: Some(inner),
                request: Some(request),
                decision,
                held,
                shared: Some(shared),
            },
        }
    }

    pub(crate) fn checking(
        check: CheckFuture<St::CheckFuture>,
        set: Arc<PolicySet>,
        (key, hold): (Option<Key>, Option<Box<HoldSeed>>),
        inner: Inner,
        request: Request<ReqBody>,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                set,
                key,
                hold,
                inner: Some(inner),
                request: Some(request),
                shared: Some(shared),
            },
        }
    }
}

fn into_body<B>(res: Response<Bytes>) -> Response<RateLimitBody<B>> {
    res.map(RateLimitBody::full)
}

impl<Inner, ReqBody, ResBody, St> Future for ResponseFuture<Inner, ReqBody, St>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>>,
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
                    set,
                    key,
                    hold,
                    inner,
                    request,
                    shared,
                } => {
                    let outcome = ready!(check.poll(cx));
                    let set = Arc::clone(set);
                    let shared = shared.take().expect("polled after completion");
                    match shared.limiter.conclude(&set, key.as_ref(), outcome) {
                        Err(refusal) => {
                            // A refusal must be in gRPC terms for a gRPC call.
                            let grpc = request
                                .as_ref()
                                .and_then(|r| crate::grpc::content_type(r.headers()));
                            let res = shared.refuse(refusal, grpc);
                            this.state.set(State::Early {
                                response: Some(res),
                            });
                        }
                        Ok(decision) => {
                            let mut request = request.take().expect("polled after completion");
                            let held = hold
                                .take()
                                .and_then(|seed| shared.limiter.held(&set, seed, &decision));
                            let (delay, decision) = shared.proceed(&set, decision, &mut request);
                            let mut inner = inner.take().expect("polled after completion");
                            let next = if delay.is_zero() {
                                Self::calling(inner.call(request), set, decision, held, shared)
                            } else {
                                Self::waiting(delay, set, inner, request, (decision, held), shared)
                            };
                            this.state.set(next.state);
                        }
                    }
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
                    ready!(sleep.as_mut().poll(cx));
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
                    // Settled first, so that the headers report the state after it.
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
