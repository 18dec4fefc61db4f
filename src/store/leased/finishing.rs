//! A future that runs to its end once started, even when its caller gives up: a lease grant
//! cut off half way would lose a whole block.

use std::future::Future;

/// A future that, once polled, runs to its end even if its caller drops it: the rest is
/// finished on the current Tokio runtime (without one, it is dropped where it stands).
pub(super) struct Finishing<F: Future + Send + 'static> {
    future: Option<std::pin::Pin<Box<F>>>,
    started: bool,
}

impl<F: Future + Send + 'static> Finishing<F> {
    pub(super) fn new(future: F) -> Self {
        Self {
            future: Some(Box::pin(future)),
            started: false,
        }
    }
}

impl<F: Future + Send + 'static> Future for Finishing<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.started = true;
        let Some(future) = self.future.as_mut() else {
            return std::task::Poll::Pending; // answered already; never polled again
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        std::task::Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for Finishing<F> {
    fn drop(&mut self) {
        if let (Some(future), true) = (self.future.take(), self.started) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = future.await;
                });
            }
        }
    }
}
