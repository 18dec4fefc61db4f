//! An axum hello-world limited through Redis, exact or leased, for `benches/scripts/leased.sh`
//! (wrk against it, Redis `INFO commandstats` around it). Stops by itself after `<seconds>`.
//!
//! ```text
//! leased_server <bare|memory|exact|leased> <port> <seconds>
//! ```
//!
//! The key is the `x-key` request header (the wrk script picks it), else the peer IP (one
//! hot key). The policy is a per-minute limit no load here exhausts. `HEADERS=near` sends the
//! quota headers on allowed responses only near the limit (`QuotaHeaders::NearLimit`; default:
//! on every response). Redis is `$REDIS_URL`
//! (default `redis://127.0.0.1:6379`), with a key prefix unique to the process. Run with no
//! arguments (as `cargo bench` does) it does nothing.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::key::{from_fn, Key};
use tollgate::store::leased::LeasedStore;
use tollgate::store::RedisStore;
use tollgate::{Limiter, Policy, QuotaHeaders, Rate, RateLimitLayer};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 || args.iter().any(|a| a == "--bench") {
        eprintln!("usage: leased_server <bare|memory|exact|leased> <port> <seconds>");
        return;
    }
    let side = args[1].clone();
    let port: u16 = args[2].parse().expect("port");
    let seconds: u64 = args[3].parse().expect("seconds");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
        .block_on(serve(side, port, seconds));
}

async fn serve(side: String, port: u16, seconds: u64) {
    let app = Router::new().route("/", get(|| async { "hello" }));
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redis = || {
        RedisStore::builder()
            .prefix(format!("tg-leased-{}", std::process::id()))
            .build_with_url(&url)
            .unwrap()
    };
    let extractor = from_fn(|req| {
        let key = match req.headers().get("x-key") {
            Some(v) => v.to_str().ok()?.to_owned(),
            None => req.peer_addr()?.ip().to_string(),
        };
        Some(Key::new("bench", key))
    });
    let policy = Policy::new("bench", Rate::per_minute(6_000_000_000)).unwrap();
    let app = match side.as_str() {
        "bare" => app,
        "memory" => {
            let limiter = Limiter::builder()
                .extractor(extractor)
                .policy(policy)
                .build()
                .unwrap();
            app.layer(layer(RateLimitLayer::new(limiter)))
        }
        "exact" => {
            let store = redis();
            store.ping().await.expect("Redis reachable");
            let limiter = Limiter::builder()
                .store(store)
                .extractor(extractor)
                .policy(policy)
                .build()
                .unwrap();
            app.layer(layer(RateLimitLayer::new(limiter)))
        }
        "leased" => {
            let store = redis();
            store.ping().await.expect("Redis reachable");
            let limiter = Limiter::builder()
                .store(LeasedStore::new(store))
                .extractor(extractor)
                .policy(policy)
                .build()
                .unwrap();
            app.layer(layer(RateLimitLayer::new(limiter)))
        }
        other => panic!("unknown side {other}"),
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    let _ = tokio::time::timeout(Duration::from_secs(seconds), server).await;
}

/// The layer with the quota headers `HEADERS` asks for.
fn layer<S>(layer: RateLimitLayer<S>) -> RateLimitLayer<S> {
    match std::env::var("HEADERS").as_deref() {
        Ok("near") => layer.quota_headers(QuotaHeaders::NearLimit),
        _ => layer,
    }
}
