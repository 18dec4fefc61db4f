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

/// A request a shaping policy delays holds none of the inner service's capacity while it
/// waits: with `concurrency_limit(1)` inside the layer, another client's request is served
/// at once, not after the delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_request_holds_none_of_the_inner_services_capacity() {
    // Per client: one request every 2 s, up to 5 s of waiting.
    let policy = Policy::builder("smooth", Rate::new(1, Duration::from_secs(2)))
        .algorithm(Algorithm::Gcra)
        .shape(Duration::from_secs(5))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(MemoryStore::new())
        .policy(policy)
        .extractor(tollgate::key::from_fn(|req| {
            let client = req.headers().get("x-client")?.to_str().ok()?;
            Some(tollgate::key::Key::new("client", client))
        }))
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter))
        .concurrency_limit(1)
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, Infallible>(Response::new(String::from("hello")))
        }));
    let request = |client: &str| {
        Request::builder()
            .header("x-client", client)
            .body(String::new())
            .unwrap()
    };
    let mut a = svc.clone();
    assert_eq!(
        a.ready()
            .await
            .unwrap()
            .call(request("a"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // Client a's second request waits about 2 s.
    let mut delayed = svc.clone();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let res = delayed
            .ready()
            .await
            .unwrap()
            .call(request("a"))
            .await
            .unwrap();
        (res.status(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Meanwhile client b is served at once.
    let mut b = svc.clone();
    let started = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(10), async {
        b.ready()
            .await
            .unwrap()
            .call(request("b"))
            .await
            .unwrap()
            .status()
    })
    .await
    .unwrap();
    let b_took = started.elapsed();
    assert_eq!(status, StatusCode::OK);
    let (a_status, a_took) = waiting.await.unwrap();
    assert_eq!(a_status, StatusCode::OK);
    assert!(a_took >= Duration::from_millis(1500), "a waited {a_took:?}");
    assert!(
        b_took < Duration::from_millis(1000),
        "b waited {b_took:?} behind a delayed request"
    );
}

/// A body that sends what its channel gives, then ends when the channel closes.
struct Trickle(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for Trickle {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// The layers that read a body before calling the inner service (the login layer, the JSON
/// estimate) hold none of its capacity while a client trickles that body: with
/// `concurrency_limit(1)` inside, another client is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_holds_none_of_the_inner_services_capacity() {
    use axum::body::Body;
    use tower::util::BoxCloneService;
    type Svc = BoxCloneService<Request<Body>, Response<Body>, Infallible>;
    let inner = || {
        ServiceBuilder::new()
            .concurrency_limit(1)
            .service(service_fn(|_req: Request<Body>| async {
                Ok::<_, Infallible>(Response::new(Body::from("ok")))
            }))
    };
    let login: Svc = BoxCloneService::new(
        ServiceBuilder::new()
            .map_response(|res: Response<_>| res.map(Body::new))
            .layer(tollgate::login::LoginLayer::json_field(
                tollgate::login::LoginGuard::builder().build().unwrap(),
                "username",
            ))
            .service(inner()),
    );
    let estimate: Svc = BoxCloneService::new(
        ServiceBuilder::new()
            .map_response(|res: Response<_>| res.map(Body::new))
            .layer(tollgate::EstimateFromJsonLayer::new("max_tokens"))
            .service(inner()),
    );
    for (name, svc) in [("login", login), ("estimate", estimate)] {
        let json =
            |body: Body| {
                let mut req = Request::builder()
                    .method("POST")
                    .uri("/login")
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap();
                req.extensions_mut().insert(axum::extract::ConnectInfo(
                    std::net::SocketAddr::from(([127, 0, 0, 1], 4000)),
                ));
                req
            };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut slow = svc.clone();
        let trickling = tokio::spawn(async move {
            let req = json(Body::new(Trickle(rx)));
            slow.ready()
                .await
                .unwrap()
                .call(req)
                .await
                .unwrap()
                .status()
        });
        tx.send(bytes::Bytes::from_static(b"{\"username\":"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut other = svc.clone();
        let served = tokio::time::timeout(Duration::from_secs(2), async move {
            let req = json(Body::from(r#"{"username":"bob","max_tokens":5}"#));
            other
                .ready()
                .await
                .unwrap()
                .call(req)
                .await
                .unwrap()
                .status()
        })
        .await;
        assert_eq!(
            served.ok(),
            Some(StatusCode::OK),
            "{name}: another client waited behind a trickled body"
        );
        tx.send(bytes::Bytes::from_static(b"\"alice\"}"))
            .await
            .unwrap();
        drop(tx);
        assert_eq!(trickling.await.unwrap(), StatusCode::OK, "{name}");
    }
}
