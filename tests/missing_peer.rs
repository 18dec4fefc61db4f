//! A server that does not record peer addresses answers 400 to every request keyed by peer
//! IP; the server log must say why and how to fix it, once, not stay silent.

mod support;

use axum::routing::get;
use axum::Router;
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

#[tokio::test]
async fn a_forgotten_connect_info_is_logged_once_with_the_fix() {
    let (captured, _guard) = support::Logs::capture(tracing::Level::WARN);

    let limiter = Limiter::builder()
        .policy(Policy::new("per-ip", Rate::per_minute(100)).unwrap())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(limiter));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The mistake: `app` instead of `app.into_make_service_with_connect_info::<SocketAddr>()`.
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for _ in 0..3 {
        let res = reqwest::get(format!("http://{addr}/")).await.unwrap();
        assert_eq!(res.status(), 400);
    }
    let log = captured.text();
    assert_eq!(
        log.matches("into_make_service_with_connect_info").count(),
        1,
        "{log}"
    );
    assert!(log.contains("WARN"), "{log}");
}
