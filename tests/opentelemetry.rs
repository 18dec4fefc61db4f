//! The decision as OpenTelemetry span attributes (feature `opentelemetry`), set even on a span
//! that declares none of the fields: the SDK's in-memory exporter behind
//! `tracing-opentelemetry`, a real axum server on loopback and a real HTTP client; the
//! degraded case is a `ResilientStore` failing open over a Redis store whose port nothing
//! listens on.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::Request;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest::StatusCode;
use tollgate::key::Key;
use tollgate::store::{FailureMode, RedisStore, ResilientStore, Store};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
use tower_http::trace::TraceLayer;
use tracing_subscriber::layer::SubscriberExt;

fn app<S: Store>(limiter: Limiter<S>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(limiter))
        // A span that declares no `ratelimit.*` field.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|_: &Request<Body>| tracing::info_span!("request")),
        )
}

fn attributes(span: &SpanData) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| (kv.key.as_str().to_owned(), kv.value.as_str().into_owned()))
        .collect()
}

#[tokio::test]
async fn allowed_refused_and_degraded_decisions_are_span_attributes() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("tollgate-test")));
    // The servers run on this (current-thread) runtime, so the thread's default subscriber
    // sees their spans.
    let _guard = tracing::subscriber::set_default(subscriber);

    let memory = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(1)).unwrap())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    let redis = RedisStore::builder()
        .prefix("tollgate-otel-test")
        .build_with_url(&format!("redis://127.0.0.1:{}", support::free_port()))
        .unwrap();
    let degraded = Limiter::builder()
        .store(
            ResilientStore::builder(redis, FailureMode::FailOpen)
                .timeout(Duration::from_millis(500))
                .build()
                .unwrap(),
        )
        .policy(Policy::new("shared", Rate::per_minute(1)).unwrap())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    let memory_addr = support::serve(app(memory)).await;
    let degraded_addr = support::serve(app(degraded)).await;
    let client = reqwest::Client::new();
    let get = |addr: std::net::SocketAddr| {
        client
            .get(format!("http://{addr}/"))
            .header("x-tenant", "acme")
            .send()
    };
    assert_eq!(get(memory_addr).await.unwrap().status(), StatusCode::OK);
    let res = get(memory_addr).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(get(degraded_addr).await.unwrap().status(), StatusCode::OK);

    // The spans end after the responses are written: wait for all three.
    let spans = loop {
        provider.force_flush().unwrap();
        let spans: Vec<SpanData> = exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.name == "request")
            .collect();
        if spans.len() >= 3 {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let digest = tollgate::key::digest(&Key::new("tenant", "acme"));
    let expected = [
        ("api", "true", "0", "decided"),
        ("api", "false", "0", "decided"),
        ("shared", "true", "1", "fail_open"),
    ];
    for (span, (policy, allowed, remaining, outcome)) in spans.iter().zip(expected) {
        let attrs = attributes(span);
        assert_eq!(attrs["ratelimit.key"], digest, "{attrs:?}");
        assert_eq!(attrs["ratelimit.policy"], policy, "{attrs:?}");
        assert_eq!(attrs["ratelimit.allowed"], allowed, "{attrs:?}");
        assert_eq!(attrs["ratelimit.remaining"], remaining, "{attrs:?}");
        assert_eq!(attrs["ratelimit.outcome"], outcome, "{attrs:?}");
        // Each attribute once, whatever path set it.
        assert_eq!(span.attributes.len(), attrs.len(), "{:?}", span.attributes);
        assert!(attrs.values().all(|v| !v.contains("acme")), "{attrs:?}");
    }
    assert_eq!(
        attributes(&spans[1])["ratelimit.refusal"],
        "rate_limit_exceeded"
    );
    assert!(!attributes(&spans[0]).contains_key("ratelimit.refusal"));
}
