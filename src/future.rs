//! The response future of [`RateLimitService`](crate::RateLimitService).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::layer::Shared;
use crate::response::json_error;
use crate::store::Store;

pin_project! {
    /// The future of [`RateLimitService`](crate::RateLimitService): decides, waits when a
    /// shaping policy asks it to, calls the inner service and adds quota headers — or
    /// answers at once with a 429.
    pub struct ResponseFuture<Inner, Check, ReqBody, St>
    where
        Inner: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<Inner, Check, ReqBody, St>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<Inner, Check, ReqBody, St>
    where
        Inner: Service<Request<ReqBody>>,
    {
        Checking {
            #[pin]
            check: Check,
            inner: Option<Inner>,
            request: Option<Request<ReqBody>>,
            shared: Arc<Shared<St>>,
            grpc: Option<HeaderValue>,
        },
        Waiting {
            sleep: Pin<Box<Sleep>>,
            inner: Option<Inner>,
            request: Option<Request<ReqBody>>,
            decision: Option<Decision>,
            shared: Arc<Shared<St>>,
        },
        Calling {
            #[pin]
            future: Inner::Future,
            decision: Option<Decision>,
            shared: Arc<Shared<St>>,
        },
        Early {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<Inner, Check, ReqBody, St> ResponseFuture<Inner, Check, ReqBody, St>
where
    Inner: Service<Request<ReqBody>>,
{
    pub(crate) fn early(response: Response<Bytes>) -> Self {
        Self {
            state: State::Early {
                response: Some(response),
            },
        }
    }

    pub(crate) fn checking(
        check: Check,
        inner: Inner,
        request: Request<ReqBody>,
        shared: Arc<Shared<St>>,
        grpc: Option<HeaderValue>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                inner: Some(inner),
                request: Some(request),
                shared,
                grpc,
            },
        }
    }
}

pub(crate) fn store_failure(error: &StoreError, grpc: Option<&HeaderValue>) -> Response<Bytes> {
    tracing::warn!(%error, "tollgate: rate-limit store failed; refusing the request (fail closed)");
    const MESSAGE: &str = "The rate limiter is unavailable. Please retry shortly.";
    if let Some(ct) = grpc {
        return crate::grpc::error_response(
            crate::grpc::UNAVAILABLE,
            MESSAGE,
            Some(std::time::Duration::from_secs(1)),
            ct,
        );
    }
    let mut res = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "rate_limiter_unavailable",
        MESSAGE,
    );
    res.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

fn into_body<B>(res: Response<Bytes>) -> Response<RateLimitBody<B>> {
    res.map(RateLimitBody::full)
}

impl<Inner, Check, ReqBody, ResBody, St> Future for ResponseFuture<Inner, Check, ReqBody, St>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>>,
    Check: Future<Output = Result<Decision, StoreError>>,
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
                StateProj::Checking {
                    check,
                    inner,
                    request,
                    shared,
                    grpc,
                } => {
                    let outcome = ready!(check.poll(cx));
                    let shared = Arc::clone(shared);
                    let decision = match outcome {
                        Ok(decision) => decision,
                        Err(error) => {
                            let res = store_failure(&error, grpc.as_ref());
                            this.state.set(State::Early {
                                response: Some(res),
                            });
                            continue;
                        }
                    };
                    if !decision.is_allowed() {
                        let now = shared.limiter.store().now_millis();
                        let res = shared.response.reject(
                            &decision,
                            shared.limiter.policies(),
                            now,
                            grpc.as_ref(),
                        );
                        this.state.set(State::Early {
                            response: Some(res),
                        });
                        continue;
                    }
                    let mut inner = inner.take().expect("polled after completion");
                    let request = request.take().expect("polled after completion");
                    let delay = decision.delay();
                    if delay.is_zero() {
                        let future = inner.call(request);
                        this.state.set(State::Calling {
                            future,
                            decision: Some(decision),
                            shared,
                        });
                    } else {
                        this.state.set(State::Waiting {
                            sleep: Box::pin(tokio::time::sleep(delay)),
                            inner: Some(inner),
                            request: Some(request),
                            decision: Some(decision),
                            shared,
                        });
                    }
                }
                StateProj::Waiting {
                    sleep,
                    inner,
                    request,
                    decision,
                    shared,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let mut inner = inner.take().expect("polled after completion");
                    let request = request.take().expect("polled after completion");
                    let future = inner.call(request);
                    let decision = decision.take();
                    let shared = Arc::clone(shared);
                    this.state.set(State::Calling {
                        future,
                        decision,
                        shared,
                    });
                }
                StateProj::Calling {
                    future,
                    decision,
                    shared,
                } => {
                    let mut res = ready!(future.poll(cx))?;
                    if let Some(decision) = decision.take() {
                        let now = shared.limiter.store().now_millis();
                        shared.response.decorate(
                            res.headers_mut(),
                            &decision,
                            shared.limiter.policies(),
                            now,
                        );
                    }
                    return Poll::Ready(Ok(res.map(RateLimitBody::inner)));
                }
            }
        }
    }
}
