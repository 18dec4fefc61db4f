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
use crate::decision::{Decision, Outcome};
use crate::error::StoreError;
use crate::key::Key;
use crate::layer::Shared;
use crate::limiter::CheckFuture;
use crate::policy::Policy;
use crate::response::{json_error, write_quota_headers};
use crate::store::Store;
use crate::telemetry;

pin_project! {
    /// The future of [`RateLimitService`](crate::RateLimitService): decides, waits when a
    /// shaping policy asks it to, calls the inner service and adds quota headers — or
    /// answers at once with a 429.
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
            set: usize,
            key: Option<Key>,
            inner: Option<Inner>,
            request: Option<Request<ReqBody>>,
            // Moved (not cloned) into the next state: one reference count per request.
            shared: Option<Arc<Shared<St>>>,
        },
        Waiting {
            sleep: Pin<Box<Sleep>>,
            set: usize,
            inner: Option<Inner>,
            request: Option<Request<ReqBody>>,
            // Kept only when the response gets quota headers.
            decision: Option<Decision>,
            // Moved (not cloned) into the next state: one reference count per request.
            shared: Option<Arc<Shared<St>>>,
        },
        Calling {
            #[pin]
            future: Inner::Future,
            set: usize,
            // Kept only when the response gets quota headers.
            decision: Option<Decision>,
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
        set: usize,
        decision: Option<Decision>,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Calling {
                future,
                set,
                decision,
                shared,
            },
        }
    }

    /// A shaping policy delays the request: sleep, then call `inner`.
    pub(crate) fn waiting(
        delay: std::time::Duration,
        set: usize,
        inner: Inner,
        request: Request<ReqBody>,
        decision: Option<Decision>,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Waiting {
                sleep: Box::pin(tokio::time::sleep(delay)),
                set,
                inner: Some(inner),
                request: Some(request),
                decision,
                shared: Some(shared),
            },
        }
    }

    pub(crate) fn checking(
        check: CheckFuture<St::CheckFuture>,
        set: usize,
        key: Option<Key>,
        inner: Inner,
        request: Request<ReqBody>,
        shared: Arc<Shared<St>>,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                set,
                key,
                inner: Some(inner),
                request: Some(request),
                shared: Some(shared),
            },
        }
    }
}

/// What the layer does once the store has answered.
pub(crate) enum Verdict {
    /// Answer with this; the inner service is not called.
    Respond(Response<Bytes>),
    /// Call the inner service after `delay` (zero unless a shaping policy asks to wait);
    /// `decision` is kept only when the response gets quota headers.
    Proceed {
        delay: std::time::Duration,
        decision: Option<Decision>,
    },
}

/// Records the store's answer (metrics, and a trace event when `key` is kept) and turns it
/// into a [`Verdict`]: a 503 when the store failed closed, a 429 when denied, else proceed.
/// `grpc` is asked only for a refusal, which must be in gRPC terms for a gRPC call.
pub(crate) fn verdict<'a, St: Store>(
    shared: &Shared<St>,
    set: usize,
    key: Option<Key>,
    outcome: Result<Decision, StoreError>,
    grpc: impl Fn() -> Option<&'a HeaderValue>,
) -> Verdict {
    let decision = match outcome {
        Ok(decision) => decision,
        Err(error) => return Verdict::Respond(store_failure(&error, grpc())),
    };
    // The policies of the route's set, not the default route's: the message, headers and
    // sensitivity must match the decision.
    let policies = &shared.limiter.set(set).enforced;
    let store = shared.limiter.store().name();
    telemetry::decision(decision.outcome(), decision.is_allowed(), store);
    if let Some(key) = key {
        trace_decision(&key, &decision, policies, store);
    }
    if decision.outcome() == Outcome::FailClosed {
        let mut res = store_failure(&StoreError::CircuitOpen, grpc());
        let retry = decision.retry_after_millis().div_ceil(1000).max(1);
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry));
        return Verdict::Respond(res);
    }
    if !decision.is_allowed() {
        let now = shared.limiter.store().now_millis();
        return Verdict::Respond(shared.response.reject(&decision, policies, now, grpc()));
    }
    Verdict::Proceed {
        delay: decision.delay(),
        decision: shared
            .response
            .decorates(&decision, policies)
            .then_some(decision),
    }
}

/// One debug event per decision, with the fields OpenTelemetry users expect.
fn trace_decision(key: &Key, decision: &Decision, policies: &[Policy], store: &'static str) {
    let digest = crate::key::digest(key);
    let policy = policies
        .get(decision.governing_index())
        .map_or("", Policy::name);
    tracing::event!(
        target: "tollgate::decision",
        tracing::Level::DEBUG,
        ratelimit.key = digest.as_str(),
        ratelimit.policy = policy,
        ratelimit.allowed = decision.is_allowed(),
        ratelimit.remaining = decision.remaining(),
        ratelimit.store = store,
        ratelimit.outcome = decision.outcome().as_str(),
        "rate-limit decision"
    );
}

/// The fail-closed answer: 503 with `Retry-After: 1`, or gRPC `UNAVAILABLE` for a gRPC call.
pub(crate) fn store_failure(error: &StoreError, grpc: Option<&HeaderValue>) -> Response<Bytes> {
    tracing::debug!(%error, "tollgate: refusing the request (fail closed)");
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
                    inner,
                    request,
                    shared,
                } => {
                    let set = *set;
                    let outcome = ready!(check.poll(cx));
                    let shared = shared.take().expect("polled after completion");
                    // Looked up only for a refusal, which must be in gRPC terms for a gRPC call.
                    let grpc = || {
                        request
                            .as_ref()
                            .and_then(|r| crate::grpc::content_type(r.headers()))
                    };
                    match verdict(&shared, set, key.take(), outcome, grpc) {
                        Verdict::Respond(res) => this.state.set(State::Early {
                            response: Some(res),
                        }),
                        Verdict::Proceed { delay, decision } => {
                            let mut inner = inner.take().expect("polled after completion");
                            let request = request.take().expect("polled after completion");
                            let next = if delay.is_zero() {
                                Self::calling(inner.call(request), set, decision, shared)
                            } else {
                                Self::waiting(delay, set, inner, request, decision, shared)
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
                    shared,
                } => {
                    ready!(sleep.as_mut().poll(cx));
                    let mut inner = inner.take().expect("polled after completion");
                    let request = request.take().expect("polled after completion");
                    let shared = shared.take().expect("polled after completion");
                    let next = Self::calling(inner.call(request), *set, decision.take(), shared);
                    this.state.set(next.state);
                }
                StateProj::Calling {
                    future,
                    set,
                    decision,
                    shared,
                } => {
                    let mut res = ready!(future.poll(cx))?;
                    if let Some(decision) = decision.take() {
                        let now = shared.limiter.store().now_millis();
                        write_quota_headers(
                            res.headers_mut(),
                            &decision,
                            &shared.limiter.set(*set).enforced,
                            now,
                            shared.response.style,
                        );
                    }
                    return Poll::Ready(Ok(res.map(RateLimitBody::inner)));
                }
            }
        }
    }
}
