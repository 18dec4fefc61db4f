//! An LLM-style completion endpoint limited by requests *and* tokens per minute, where the
//! token cost is known only once the answer has been streamed: each request reserves its
//! `max_tokens` from the JSON body, the answer streams as server-sent events, and the layer
//! settles the tokens actually sent when the stream ends (the unused part of the reservation
//! comes back). At most two completions per client run at once.
//!
//! ```text
//! cargo run --example llm_tokens
//! curl -sN http://127.0.0.1:3000/v1/completions -H 'content-type: application/json' \
//!      -d '{"prompt":"hello","max_tokens":200}' -D -
//! ```
//!
//! The address can be changed with `ADDR` (default `127.0.0.1:3000`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Json;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use tollgate::route::{Meter, Route};
use tollgate::{EstimateFromJsonLayer, HeaderStyle, Limiter, Policy, Rate, RateLimitLayer};

#[path = "support/report.rs"]
mod report;

/// Counts the `data:` events in a chunk of an SSE stream: one token each here.
fn tokens_in(frame: &Bytes) -> u64 {
    frame
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"data:") && !line.starts_with(b"data: [DONE]"))
        .count() as u64
}

/// A fake model: answers with up to `max_tokens` words (here a few dozen), one SSE event
/// each, a little apart.
async fn complete(Json(body): Json<serde_json::Value>) -> axum::response::Response {
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16);
    let words: Vec<String> = "tollgate settles what was actually streamed, not what was asked for"
        .split(' ')
        .cycle()
        .take(max_tokens.min(24) as usize)
        .map(str::to_owned)
        .collect();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::spawn(async move {
        for word in words {
            let event = Bytes::from(format!("data: {word}\n\n"));
            if tx.send(Ok(event)).await.is_err() {
                return; // the client went away
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::new(ChannelBody(rx)))
        .unwrap_or_default()
}

/// A response body fed by a channel.
struct ChannelBody(tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|next| next.map(|r| r.map(http_body::Frame::data)))
    }
}

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let completions = Route::new()
        .policy(Policy::new("requests", Rate::per_minute(60))?)
        .policy(Policy::in_flight("concurrent", 2)?)
        .metered(
            Policy::new("tokens", Rate::per_minute(2_000))?,
            // No max_tokens in the body: reserve 256.
            Meter::from_body(256).settle_from_stream(tokens_in),
        );
    let limiter = Limiter::builder()
        .route("POST /v1/completions", completions)
        .default_route(tollgate::route::Route::exempt())
        .build()?; // memory store, keyed by the peer IP

    let app = Router::new()
        .route("/v1/completions", post(complete))
        .layer(RateLimitLayer::new(limiter).header_style(HeaderStyle::Structured))
        .layer(EstimateFromJsonLayer::new("max_tokens"));

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    println!("tollgate llm_tokens listening on http://{local}");
    println!(
        "try: curl -sN http://{local}/v1/completions -H 'content-type: application/json' -d '{{\"prompt\":\"hi\",\"max_tokens\":200}}' -D -"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
