//! An axum hello-world for end-to-end load tests, with or without a rate limiter, that stops by
//! itself (after `<seconds>`, or on SIGTERM). `benches/scripts/e2e.sh` runs it pinned to one core and
//! `wrk` pinned to the other; `benches/scripts/e2e_instructions.sh` counts its instructions per request
//! under callgrind.
//!
//! ```text
//! http_server <side> <port> <seconds>
//! ```
//!
//! Sides: `bare`; `tollgate` (the default layer: the six classic quota headers on every
//! response); `tollgate_near_limit` (`QuotaHeaders::NearLimit`: quota headers on allowed
//! responses only near the limit, so none here); `tollgate_every` (the six classic headers on
//! every response, asked for explicitly);
//! `tollgate_compact` (the three `RateLimit-*` headers on every response);
//! `tollgate_no_headers`; `tower_governor` (its default) and `tower_governor_headers` (its
//! `use_headers()`: two headers on every response); `tollgate_redis` and
//! `tollgate_redis_every` (no quota headers on allowed responses, and the classic headers on every response, over
//! a `RedisStore` at `$REDIS_URL`, default `redis://127.0.0.1:6379`, with a key prefix unique
//! to the process; `CLIENTS=64` keys by the client port instead of the IP, so each of wrk's
//! connections is its own key).
//!
//! Every side keys by the peer IP (all loopback, so one hot key) with a quota no load here can
//! exhaust. Run with no arguments (as `cargo bench` does) it does nothing.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::signal::unix::{signal, SignalKind};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 || args.iter().any(|a| a == "--bench") {
        eprintln!("usage: http_server <side> <port> <seconds>");
        return;
    }
    let side = args[1].clone();
    let port: u16 = args[2].parse().expect("port");
    let seconds: u64 = args[3].parse().expect("seconds");
    let workers = std::env::var("WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(1);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
        .block_on(serve(side, port, seconds));
}

async fn serve(side: String, port: u16, seconds: u64) {
    let app = Router::new().route("/", get(|| async { "hello" }));
    let policy = || Policy::new("bench", Rate::per_second(1_000_000_000)).unwrap();
    let app = match side.as_str() {
        "bare" => app,
        "tollgate" => {
            let limiter = Limiter::builder().policy(policy()).build().unwrap();
            app.layer(RateLimitLayer::new(limiter))
        }
        "tollgate_near_limit" => {
            let limiter = Limiter::builder().policy(policy()).build().unwrap();
            app.layer(RateLimitLayer::new(limiter).quota_headers(tollgate::QuotaHeaders::NearLimit))
        }
        "tollgate_every" | "tollgate_no_headers" => {
            let limiter = Limiter::builder().policy(policy()).build().unwrap();
            app.layer(
                RateLimitLayer::new(limiter).quota_headers_on_success(side == "tollgate_every"),
            )
        }
        "tollgate_compact" => {
            let limiter = Limiter::builder().policy(policy()).build().unwrap();
            app.layer(
                RateLimitLayer::new(limiter)
                    .header_style(tollgate::HeaderStyle::Compact)
                    .quota_headers_on_success(true),
            )
        }
        "tower_governor" => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000_000)
                .finish()
                .unwrap();
            app.layer(GovernorLayer::new(config))
        }
        "tower_governor_headers" => {
            // `use_headers()` returns a builder of another type: it must be chained.
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000_000)
                .use_headers()
                .finish()
                .unwrap();
            app.layer(GovernorLayer::new(config))
        }
        #[cfg(feature = "redis")]
        "tollgate_redis" | "tollgate_redis_every" => {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
            let store = tollgate::store::RedisStore::builder()
                .prefix(format!("tg-e2e-{}", std::process::id()))
                .build_with_url(&url)
                .unwrap();
            store.ping().await.expect("Redis reachable");
            let mut limiter = Limiter::builder().store(store).policy(policy());
            if std::env::var("CLIENTS").is_ok() {
                // Each connection its own key: the peer's port.
                limiter = limiter.extractor(tollgate::key::from_fn(|r| {
                    r.peer_addr()
                        .map(|a| tollgate::key::Key::new("conn", a.port().to_string()))
                }));
            }
            app.layer(
                RateLimitLayer::new(limiter.build().unwrap())
                    .quota_headers_on_success(side == "tollgate_redis_every"),
            )
        }
        other => panic!("unknown side {other}"),
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    // SIGTERM stops it cleanly too, so a run under valgrind ends with its counts written.
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            term.recv().await;
        } else {
            std::future::pending::<()>().await;
        }
    });
    let _ = tokio::time::timeout(Duration::from_secs(seconds), server).await;
}
