//! A metered stream whose client hangs up before its end is settled with what was counted
//! so far (at least the reservation): hanging up early cannot buy a long stream for the
//! price of the estimate. Through axum on loopback, on the memory store and a real Redis.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tollgate::store::StoreExt;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use tollgate::key::{Global, Key};
use tollgate::middleware::EstimateFromJsonLayer;
use tollgate::route::{Meter, Route};
use tollgate::store::{MemoryStore, RedisStore, Store};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

use support::RedisServer;

/// An endless SSE body: one event every 2 ms until the client goes away.
struct Endless {
    tick: Pin<Box<tokio::time::Sleep>>,
    sent: u64,
}

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::ready!(self.tick.as_mut().poll(cx));
        let next = tokio::time::Instant::now() + Duration::from_millis(2);
        self.tick.as_mut().reset(next);
        self.sent += 1;
        let event = Bytes::from(format!("data: token{}\n\n", self.sent));
        Poll::Ready(Some(Ok(http_body::Frame::data(event))))
    }
}

fn endless() -> Body {
    Body::new(Endless {
        tick: Box::pin(tokio::time::sleep(Duration::from_millis(1))),
        sent: 0,
    })
}

fn count_events(frame: &Bytes) -> u64 {
    frame
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"data:"))
        .count() as u64
}

async fn used<S: Store>(store: &S, policy: &Policy) -> u64 {
    let d = store
        .peek(&Key::global("all"), std::slice::from_ref(policy), &[0])
        .await
        .unwrap();
    policy.capacity() - d.remaining()
}

/// Three clients each reserve 1 token, read 40 events and hang up: 120 events against a
/// budget of 100. Each hang-up is settled at the 40 counted, so the budget is spent and the
/// next request is refused.
async fn hanging_up_pays_for_what_was_streamed<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let tokens = Policy::new("tokens", Rate::per_minute(100)).unwrap();
    let limiter = Limiter::builder()
        .store(store.clone())
        .route(
            "POST /stream",
            Route::new().metered(
                tokens.clone(),
                Meter::from_body(1).settle_from_stream(count_events),
            ),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/stream",
            post(|| async { ([("content-type", "text/event-stream")], endless()) }),
        )
        .layer(RateLimitLayer::new(limiter))
        .layer(EstimateFromJsonLayer::new("max_tokens").max_body_bytes(1024));
    let addr = support::serve(app).await;
    let url = format!("http://{addr}/stream");
    for round in 1..=3u64 {
        let client = reqwest::Client::new();
        let mut res = client
            .post(&url)
            .header("content-type", "application/json")
            .body(r#"{"max_tokens":1}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "round {round}");
        let mut events = 0;
        while events < 40 {
            let chunk = res.chunk().await.unwrap().expect("the stream is endless");
            events += count_events(&chunk);
        }
        drop(res);
        drop(client);
        // Settled once the server notices the hang-up.
        let expected = (round * 40).min(100);
        let mut seen = 0;
        for _ in 0..200 {
            seen = used(&store, &tokens).await;
            if seen >= expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            seen >= expected,
            "round {round}: {seen} tokens charged after {} events streamed",
            round * 40
        );
    }
    let refused = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body(r#"{"max_tokens":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429, "the budget was spent by the streams");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_up_pays_for_what_was_streamed_memory() {
    hanging_up_pays_for_what_was_streamed(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_up_pays_for_what_was_streamed_redis() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("hangup")
        .build_with_url(&server.url())
        .unwrap();
    hanging_up_pays_for_what_was_streamed(store).await;
}

/// A body over `EstimateFromJsonLayer`'s cap gets a 413 that names the cap and says nothing
/// of logins.
#[tokio::test]
async fn an_estimate_body_over_the_cap_gets_a_neutral_413() {
    let tokens = Policy::new("tokens", Rate::per_minute(100)).unwrap();
    let limiter = Limiter::builder()
        .route(
            "POST /v1/completions",
            Route::new().metered(tokens, Meter::from_body(1)),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/v1/completions", post(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter))
        .layer(EstimateFromJsonLayer::new("max_tokens").max_body_bytes(512));
    let addr = support::serve(app).await;
    let big = format!(r#"{{"max_tokens":1,"prompt":"{}"}}"#, "x".repeat(600));
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/v1/completions"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "payload_too_large");
    assert_eq!(
        body["message"],
        "The request body is too large: at most 512 bytes are accepted."
    );
}
