//! The response body of [`RateLimitService`](crate::RateLimitService), and request bodies
//! read whole under a cap (for the login layer and the estimate layer).

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::grpc_web::WebTrailers;
use super::held::BodyHold;
use crate::refusal::RefusalKind;

pin_project! {
    /// Either the inner service's body or a body tollgate wrote (a 429, 400 or 503).
    #[derive(Debug)]
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        // The inner body, and what the request holds until it ends: in-flight slots (given
        // back when this is dropped), frames to count for a settlement.
        Held { #[pin] body: B, hold: Box<BodyHold> },
        // The inner body of a gRPC response whose status is still to come in its trailers.
        Watched { #[pin] body: B, watch: Box<TrailersWatch> },
    }
}

/// What to do with a gRPC response's trailers (HTTP/2 trailers, or a binary gRPC-Web body's
/// trailers frame) once they pass: `then` runs once with them, and never for a body that
/// ends or is dropped without them.
pub(crate) struct TrailersWatch {
    web: Option<WebTrailers>,
    then: Option<Box<OnTrailers>>,
}

type OnTrailers = dyn FnOnce(&http::HeaderMap) + Send + Sync;

impl TrailersWatch {
    /// A watch on the response with these `headers`.
    pub(crate) fn new(
        headers: &http::HeaderMap,
        then: impl FnOnce(&http::HeaderMap) + Send + Sync + 'static,
    ) -> Self {
        Self {
            web: WebTrailers::for_response(headers),
            then: Some(Box::new(then)),
        }
    }

    fn frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(trailers) = frame.trailers_ref() {
            self.trailers(trailers);
        } else if let Some(data) = frame.data_ref() {
            if let Some(trailers) = self.web.as_mut().and_then(|web| web.feed(data)) {
                self.web = None;
                self.trailers(&trailers);
            }
        }
    }

    fn trailers(&mut self, trailers: &http::HeaderMap) {
        if let Some(then) = self.then.take() {
            then(trailers);
        }
    }
}

impl std::fmt::Debug for TrailersWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrailersWatch")
            .field("grpc_web", &self.web.is_some())
            .field("waiting", &self.then.is_some())
            .finish()
    }
}

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// `body` with what its request holds, and the body's length when its head did not
    /// say (see `BodyHold::learn_length`).
    pub(crate) fn held(body: B, mut hold: BodyHold) -> Self
    where
        B: Body,
    {
        hold.learn_length(body.is_end_stream(), &body.size_hint());
        Self {
            kind: Kind::Held {
                body,
                hold: Box::new(hold),
            },
        }
    }

    /// `body`, whose trailers go to `watch` as they pass.
    pub(crate) fn watched(body: B, watch: TrailersWatch) -> Self {
        Self {
            kind: Kind::Watched {
                body,
                watch: Box::new(watch),
            },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Held { mut body, hold } => {
                let mut frame = ready!(body.as_mut().poll_frame(cx));
                match &mut frame {
                    Some(Ok(f)) => {
                        if let Some(data) = f.data_ref() {
                            hold.frame(data);
                        } else if let Some(trailers) = f.trailers_mut() {
                            hold.trailers_mut(trailers);
                            // Trailers are a body's last frame: hyper sends them and polls no
                            // further, whatever `is_end_stream` says.
                            hold.end();
                        }
                        if body.is_end_stream() {
                            hold.end();
                        }
                    }
                    None => hold.end(),
                    Some(Err(_)) => {}
                }
                Poll::Ready(frame)
            }
            KindProj::Watched { body, watch } => {
                let frame = ready!(body.poll_frame(cx));
                if let Some(Ok(f)) = &frame {
                    watch.frame(f);
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } | Kind::Watched { body, .. } => {
                body.is_end_stream()
            }
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } | Kind::Watched { body, .. } => {
                body.size_hint()
            }
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// Reads a body of at most `max` bytes; a larger one is refused with 413, an unreadable one
/// with 400.
pub(crate) async fn read_capped<B>(body: B, max: usize) -> Result<Bytes, RefusalKind>
where
    B: Body<Data = Bytes>,
{
    if body.size_hint().lower() > max as u64 {
        return Err(RefusalKind::LoginBodyTooLarge);
    }
    let mut body = std::pin::pin!(body);
    let mut buf = BytesMut::new();
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let Ok(frame) = frame else {
            return Err(RefusalKind::LoginBodyUnreadable);
        };
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(RefusalKind::LoginBodyTooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}
