//! The layer calls the inner service that `poll_ready` drove to readiness, on every path:
//! decided at once (memory store), decided by a future (a store that waits), and delayed by a
//! shaping policy. `ConcurrencyLimit` panics when a clone that was never made ready is called.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use tollgate::key::Global;
use tollgate::store::{DynStore, FailureMode, MemoryStore, ResilientStore, Store};
use tollgate::{Algorithm, Limiter, Policy, Rate, RateLimitLayer};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

async fn statuses<St: Store>(limiter: Limiter<St>, requests: usize) -> Vec<StatusCode> {
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter))
        .concurrency_limit(1)
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::from("hello")))
        }));
    let mut out = vec![];
    for _ in 0..requests {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap();
        out.push(res.status());
    }
    out
}

fn limiter<St: Store>(store: St, policy: Policy) -> Limiter<St> {
    Limiter::builder()
        .store(store)
        .policy(policy)
        .extractor(Global::new())
        .build()
        .unwrap()
}

fn two_per_minute() -> Policy {
    Policy::new("api", Rate::per_minute(2)).unwrap()
}

const ALLOWED_THEN_DENIED: [StatusCode; 3] = [
    StatusCode::OK,
    StatusCode::OK,
    StatusCode::TOO_MANY_REQUESTS,
];

#[tokio::test]
async fn decided_at_once_calls_the_ready_service() {
    let statuses = statuses(limiter(MemoryStore::new(), two_per_minute()), 3).await;
    assert_eq!(statuses, ALLOWED_THEN_DENIED);
}

#[tokio::test]
async fn decided_at_once_through_a_dyn_store() {
    let store = DynStore::new(MemoryStore::new());
    assert!(store
        .check_now(
            &tollgate::key::Key::global("probe"),
            &[two_per_minute()],
            &[1]
        )
        .is_some());
    let statuses = statuses(limiter(store, two_per_minute()), 3).await;
    assert_eq!(statuses, ALLOWED_THEN_DENIED);
}

#[tokio::test]
async fn decided_by_a_future_calls_the_ready_service() {
    let store = ResilientStore::builder(MemoryStore::new(), FailureMode::FailOpen)
        .build()
        .unwrap();
    assert!(store
        .check_now(
            &tollgate::key::Key::global("probe"),
            &[two_per_minute()],
            &[1]
        )
        .is_none());
    let statuses = statuses(limiter(store, two_per_minute()), 3).await;
    assert_eq!(statuses, ALLOWED_THEN_DENIED);
}

#[tokio::test]
async fn a_shaped_request_waits_then_calls_the_ready_service() {
    // One at a time, 100 ms apart, and up to 1 s of waiting: the second request waits ~100 ms.
    let policy = Policy::builder("smooth", Rate::new(1, Duration::from_millis(100)))
        .algorithm(Algorithm::Gcra)
        .shape(Duration::from_secs(1))
        .build()
        .unwrap();
    let started = Instant::now();
    let statuses = statuses(limiter(MemoryStore::new(), policy), 2).await;
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK]);
    assert!(
        started.elapsed() >= Duration::from_millis(90),
        "{:?}",
        started.elapsed()
    );
}
