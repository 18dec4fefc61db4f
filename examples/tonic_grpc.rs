//! gRPC: `RateLimitLayer` on a tonic server, and a tonic client seeing `RESOURCE_EXHAUSTED`.
//!
//! ```text
//! cargo run --example tonic_grpc
//! ```
//!
//! Starts the standard gRPC health service on a free loopback port with a per-method policy
//! of 3 calls per 10 seconds on `grpc.health.v1.Health/Check` (other methods: 100 per
//! minute), calls `Check` five times, prints what the client sees (the last two calls are
//! refused with `RESOURCE_EXHAUSTED`, a `retry-after` and a `google.rpc.RetryInfo`), shows
//! that `Watch` is still allowed, and exits.

use std::time::Duration;

use tollgate::key::Global;
use tollgate::route::Route;
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    // Per-method policies: gRPC methods are paths (`/package.Service/Method`), so the route
    // table applies. One quota per method shared by all callers (`Global`); with the `tonic`
    // feature the default key, the peer IP, works for tonic servers too.
    let limiter = Limiter::builder()
        .policy(Policy::new("default", Rate::per_minute(100))?)
        .route(
            "/grpc.health.v1.Health/Check",
            Route::new().policy(Policy::new(
                "health-check",
                Rate::new(3, Duration::from_secs(10)),
            )?),
        )
        .extractor(Global::new())
        .build()?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .layer(RateLimitLayer::new(limiter))
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );
    println!("health service on {addr}: Check limited to 3 calls / 10 s");

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for i in 1..=5 {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        match client.check(request).await {
            Ok(res) => println!(
                "Check #{i}: OK, serving status {}, ratelimit-remaining {:?}",
                res.get_ref().status,
                res.metadata().get("ratelimit-remaining"),
            ),
            Err(status) => {
                let retry_delay = status
                    .get_error_details()
                    .retry_info()
                    .and_then(|r| r.retry_delay);
                println!(
                    "Check #{i}: {:?}: {:?}; retry-after {:?}, RetryInfo.retry_delay {:?}",
                    status.code(),
                    status.message(),
                    status.metadata().get("retry-after"),
                    retry_delay,
                );
            }
        }
    }
    let mut watch = client
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    if let Some(first) = watch.message().await? {
        println!(
            "Watch: OK (the default policy), serving status {}",
            first.status
        );
    }
    drop(watch);

    let _ = stop.send(());
    server.await??;
    println!("server stopped");
    Ok(())
}
