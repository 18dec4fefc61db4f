//! Reserve, then settle: costs known only after the response, on the memory store and a
//! real Redis, through the direct API and real axum servers.

mod support;

use std::time::Duration;
use tollgate::store::StoreExt;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use tollgate::clock::ManualClock;
use tollgate::key::{Global, Key};
use tollgate::route::{ActualCost, Meter, Route};
use tollgate::store::{MemoryStore, RedisStore, Store};
use tollgate::{
    Algorithm, EstimateFromJsonLayer, HeaderStyle, Limiter, Policy, Rate, RateLimitLayer,
};

use support::scenarios::ALGORITHMS;
use support::RedisServer;

fn policy(algorithm: Algorithm, limit: u64, window: Duration) -> Policy {
    Policy::builder(format!("tokens_{algorithm}"), Rate::new(limit, window))
        .algorithm(algorithm)
        .build()
        .unwrap()
}

/// The units a key has used under `policy`: its capacity minus what a zero-cost look reports.
async fn used<S: Store>(store: &S, key: &Key, policy: &Policy) -> u64 {
    let d = store
        .peek(key, std::slice::from_ref(policy), &[0])
        .await
        .unwrap();
    policy.capacity() - d.remaining()
}

fn memory(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder().clock(clock.clone()).build().unwrap()
}

fn redis(server: &RedisServer, prefix: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .clock(clock.clone())
        .build_with_url(&server.url())
        .unwrap()
}

async fn refund_and_extra_are_exact<S: Store + Clone>(store: S) {
    for algorithm in ALGORITHMS {
        let p = policy(algorithm, 1_000, Duration::from_secs(60));
        let key = Key::new("user", format!("exact-{algorithm}"));
        let limiter = Limiter::builder()
            .store(store.clone())
            .policy(p.clone())
            .build()
            .unwrap();
        let r = limiter.reserve(&key, 400).await.unwrap();
        assert!(r.decision().is_allowed());
        assert_eq!(used(&store, &key, &p).await, 400, "{algorithm}: reserved");
        r.settle(150).await.unwrap();
        assert_eq!(used(&store, &key, &p).await, 150, "{algorithm}: refunded");
        let r = limiter.reserve(&key, 100).await.unwrap();
        r.settle(300).await.unwrap();
        assert_eq!(
            used(&store, &key, &p).await,
            450,
            "{algorithm}: extra charged"
        );
        // Far above the limit: charged in full, a debt past the limit (nothing remains).
        let r = limiter.reserve(&key, 10).await.unwrap();
        r.settle(1_000_000).await.unwrap();
        let after = used(&store, &key, &p).await;
        assert_eq!(after, 1_000, "{algorithm}: nothing remains");
        // A refused reservation charges nothing, and settling it changes nothing.
        let refused = limiter.reserve(&key, 5).await.unwrap();
        assert!(!refused.decision().is_allowed());
        refused.settle(500).await.unwrap();
        assert_eq!(used(&store, &key, &p).await, after, "{algorithm}: refused");
    }
}

#[tokio::test]
async fn refunds_and_extra_charges_are_exact_memory() {
    refund_and_extra_are_exact(memory(&ManualClock::new(1_000_000))).await;
}

#[tokio::test]
async fn refunds_and_extra_charges_are_exact_redis() {
    let server = RedisServer::start();
    refund_and_extra_are_exact(redis(&server, "exact", &ManualClock::new(1_000_000))).await;
}

/// An extra charge is a debt the key pays back at its limit's rate: a settlement a thousand
/// limits above its reservation keeps the key refused a thousand windows, not one; a
/// settlement of any size saturates (the key waits about 2^52 / limit ms) and `reset` clears
/// it.
async fn an_overcharge_is_a_debt_paid_at_the_limits_rate<S: Store + Clone>(
    store: S,
    clock: &ManualClock,
) {
    let window = Duration::from_secs(10);
    for algorithm in ALGORITHMS {
        let p = policy(algorithm, 10, window);
        let key = Key::new("user", format!("debt-{algorithm}"));
        let limiter = Limiter::builder()
            .store(store.clone())
            .policy(p.clone())
            .build()
            .unwrap();
        clock.set_millis(1_000_000_000);
        let r = limiter.reserve(&key, 1).await.unwrap();
        r.settle(10_001).await.unwrap();
        clock.advance(Duration::from_millis(1));
        assert!(
            !limiter.check(&key, 1).await.unwrap().is_allowed(),
            "{algorithm}: pushed past its limit"
        );
        clock.advance(window * 990);
        assert!(
            !limiter.check(&key, 1).await.unwrap().is_allowed(),
            "{algorithm}: 990 windows later the debt is not paid yet"
        );
        clock.advance(window * 12);
        assert!(
            limiter.check(&key, 1).await.unwrap().is_allowed(),
            "{algorithm}: paid within 1 002 windows"
        );
        let r = limiter.reserve(&key, 1).await.unwrap();
        r.settle(u64::MAX / 4).await.unwrap();
        clock.advance(window * 100_000);
        assert!(
            !limiter.check(&key, 1).await.unwrap().is_allowed(),
            "{algorithm}: a saturated debt"
        );
        limiter.reset(&key).await.unwrap();
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
}

#[tokio::test]
async fn an_overcharge_is_a_debt_paid_at_the_limits_rate_memory() {
    let clock = ManualClock::new(0);
    an_overcharge_is_a_debt_paid_at_the_limits_rate(memory(&clock), &clock).await;
}

#[tokio::test]
async fn an_overcharge_is_a_debt_paid_at_the_limits_rate_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(0);
    an_overcharge_is_a_debt_paid_at_the_limits_rate(redis(&server, "debt", &clock), &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_reserve_settle_pairs_sum_to_the_actual_costs_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(5_000_000);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let p = policy(algorithm, 1_000_000, Duration::from_secs(3_600));
        let store = redis(&server, "pairs", &clock);
        let limiter = Limiter::builder()
            .store(store.clone())
            .policy(p.clone())
            .build()
            .unwrap();
        let key = Key::new("user", format!("pairs-{algorithm}"));
        let mut tasks = vec![];
        let mut total = 0;
        for i in 0..200u64 {
            let estimate = 50 + i % 50;
            let actual = (i * 37) % 160; // below and above the estimate
            total += actual;
            let limiter = limiter.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                let r = limiter.reserve(&key, estimate).await.unwrap();
                assert!(r.decision().is_allowed());
                tokio::task::yield_now().await;
                r.settle(actual).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(used(&store, &key, &p).await, total, "{algorithm}");
    }
}

/// An SSE body of `events` events, one per frame (a stand-in for a model's output stream).
fn sse(events: usize) -> Body {
    Body::new(Frames(
        (0..events)
            .map(|i| Bytes::from(format!("data: token{i}\n\n")))
            .collect(),
    ))
}

struct Frames(std::collections::VecDeque<Bytes>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(http_body::Frame::data(b))))
    }
}

fn count_events(frame: &Bytes) -> u64 {
    frame
        .split(|&b| b == b'\n')
        .filter(|line| line.starts_with(b"data:"))
        .count() as u64
}

struct Api {
    addr: std::net::SocketAddr,
    requests: Policy,
    tokens: Policy,
}

/// `POST /extension`, `/header` and `/stream`, each with 60 requests and 90 000 tokens per
/// minute, the tokens reserved from `max_tokens` and settled three ways.
async fn api<S: Store + Clone>(store: S) -> Api
where
    S::CheckFuture: Send,
{
    let requests = Policy::new("requests", Rate::per_minute(60)).unwrap();
    let tokens = Policy::new("tokens", Rate::per_minute(90_000)).unwrap();
    let route = |meter: Meter| {
        Route::new()
            .policy(requests.clone())
            .metered(tokens.clone(), meter)
    };
    let limiter = Limiter::builder()
        .store(store)
        .route("POST /extension", route(Meter::from_body(1_000)))
        .route(
            "POST /header",
            route(Meter::from_body(1_000).settle_from_header("x-tokens-used".parse().unwrap())),
        )
        .route(
            "POST /stream",
            route(Meter::from_body(1_000).settle_from_stream(count_events)),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/extension",
            post(|| async {
                let mut res = "120 tokens".into_response();
                res.extensions_mut().insert(ActualCost::new(120));
                res
            }),
        )
        .route(
            "/header",
            post(|| async { ([("x-tokens-used", "75")], "75 tokens") }),
        )
        .route(
            "/stream",
            post(|| async { ([("content-type", "text/event-stream")], sse(7)) }),
        )
        .layer(
            RateLimitLayer::new(limiter)
                .header_style(HeaderStyle::Structured)
                .quota_headers_on_success(true),
        )
        .layer(EstimateFromJsonLayer::new("max_tokens").max_body_bytes(1024));
    Api {
        addr: support::serve(app).await,
        requests,
        tokens,
    }
}

async fn settles_through_http<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let api = api(store.clone()).await;
    let client = reqwest::Client::new();
    let key = Key::global("all");
    let post = |path: &str, body: &str| {
        client
            .post(format!("http://{}{path}", api.addr))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
    };
    // From the extension: 500 reserved, 120 settled; the headers say so.
    let res = post("/extension", r#"{"max_tokens":500}"#).await.unwrap();
    assert_eq!(res.status(), 200);
    let ratelimit = res.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        ratelimit.contains("\"tokens\";r=89880"),
        "headers after settlement: {ratelimit}"
    );
    assert_eq!(used(&store, &key, &api.tokens).await, 120);
    assert_eq!(used(&store, &key, &api.requests).await, 1);

    // From a header, which the client never sees.
    let res = post("/header", r#"{"max_tokens":400}"#).await.unwrap();
    assert!(res.headers().get("x-tokens-used").is_none());
    assert_eq!(used(&store, &key, &api.tokens).await, 195);

    // Counted over a stream, settled when it ends.
    let res = post("/stream", r#"{"max_tokens":300}"#).await.unwrap();
    let body = res.text().await.unwrap();
    assert_eq!(body.matches("data:").count(), 7);
    let mut settled = 0;
    for _ in 0..100 {
        settled = used(&store, &key, &api.tokens).await;
        if settled == 202 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(settled, 202, "settled at the stream's 7 events");

    // No field: the meter's default is reserved; no actual cost: it stands.
    let res = post("/header", "{}").await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(used(&store, &key, &api.tokens).await, 202 + 75);

    // An estimate above the capacity can never fit: refused, nothing charged.
    let res = post("/extension", r#"{"max_tokens":100000}"#)
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(used(&store, &key, &api.tokens).await, 277);

    // A body above the cap is refused before anything is charged.
    let big = format!(r#"{{"max_tokens":1,"pad":"{}"}}"#, "x".repeat(2048));
    let res = post("/extension", &big).await.unwrap();
    assert_eq!(res.status(), 413);
    assert_eq!(used(&store, &key, &api.requests).await, 4);
}

#[tokio::test]
async fn settles_through_http_memory() {
    settles_through_http(MemoryStore::new()).await;
}

#[tokio::test]
async fn settles_through_http_redis() {
    let server = RedisServer::start();
    settles_through_http(RedisStore::builder().build_with_url(&server.url()).unwrap()).await;
}

/// A reservation made before a reset and settled (or refunded) after it gives nothing back:
/// the reset erased its estimate, and a refund would come off what was charged since. Every
/// algorithm, the memory store and Redis.
async fn a_reset_voids_the_give_back_of_earlier_reservations<S: Store + Clone>(store: S) {
    for algorithm in ALGORITHMS {
        let p = policy(algorithm, 10, Duration::from_secs(60));
        let key = Key::new("user", format!("reset-{algorithm}"));
        let limiter = Limiter::builder()
            .store(store.clone())
            .policy(p.clone())
            .build()
            .unwrap();
        let settled = limiter.reserve(&key, 10).await.unwrap();
        assert!(settled.decision().is_allowed(), "{algorithm}");
        limiter.reset(&key).await.unwrap();
        let refunded = limiter.reserve(&key, 4).await.unwrap();
        assert!(refunded.decision().is_allowed(), "{algorithm}");
        limiter.reset(&key).await.unwrap();
        let fresh = limiter.reserve(&key, 10).await.unwrap();
        assert!(fresh.decision().is_allowed(), "{algorithm}: a fresh window");
        settled.settle(0).await.unwrap();
        refunded.refund().await.unwrap();
        assert_eq!(
            used(&store, &key, &p).await,
            10,
            "{algorithm}: the give-backs of reservations a reset overtook changed nothing"
        );
        fresh.keep();
        // A reservation made after the last reset still settles.
        limiter.reset(&key).await.unwrap();
        let r = limiter.reserve(&key, 8).await.unwrap();
        r.settle(3).await.unwrap();
        assert_eq!(used(&store, &key, &p).await, 3, "{algorithm}");
    }
}

#[tokio::test]
async fn a_reset_voids_the_give_back_of_earlier_reservations_memory() {
    a_reset_voids_the_give_back_of_earlier_reservations(memory(&ManualClock::new(1_000_000))).await;
}

#[tokio::test]
async fn a_reset_voids_the_give_back_of_earlier_reservations_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    a_reset_voids_the_give_back_of_earlier_reservations(redis(&server, "void", &clock)).await;
}

/// A body that sends one SSE event once `wait` is done.
struct OneEventAfter {
    wait: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

impl http_body::Body for OneEventAfter {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let Some(wait) = self.wait.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        std::task::ready!(wait.as_mut().poll(cx));
        self.wait = None;
        let frame = http_body::Frame::data(Bytes::from_static(b"data: one\n\n"));
        std::task::Poll::Ready(Some(Ok(frame)))
    }
}

/// Through HTTP: a metered request admitted before a reset and settled after it (its stream
/// ends after the reset) gives nothing back out of the fresh window.
#[tokio::test]
async fn a_request_settled_after_a_reset_gives_nothing_back_through_http() {
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .route(
            "POST /chat",
            Route::new().metered(
                tokens.clone(),
                Meter::from_body(1_000).settle_from_stream(count_events),
            ),
        )
        .route(
            "POST /fill",
            Route::new().metered(tokens.clone(), Meter::from_body(1_000)),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let (release, released) = tokio::sync::watch::channel(false);
    let app = Router::new()
        .route(
            "/chat",
            post(move || {
                let mut released = released.clone();
                let wait = Box::pin(async move {
                    let _ = released.wait_for(|&r| r).await;
                });
                async move {
                    let body = Body::new(OneEventAfter { wait: Some(wait) });
                    ([("content-type", "text/event-stream")], body)
                }
            }),
        )
        .route("/fill", post(|| async { "filled" }))
        .layer(RateLimitLayer::new(limiter.clone()))
        .layer(EstimateFromJsonLayer::new("max_tokens").max_body_bytes(1024));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let post = |path: &str, max: u64| {
        client
            .post(format!("http://{addr}{path}"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"max_tokens":{max}}}"#))
            .send()
    };
    let key = Key::global("all");
    // Admitted with the whole quota reserved; its stream waits.
    let streaming = post("/chat", 1_000).await.unwrap();
    assert_eq!(streaming.status(), 200);
    limiter.reset(&key).await.unwrap();
    // The fresh window, filled.
    assert_eq!(post("/fill", 1_000).await.unwrap().status(), 200);
    // The first request ends having used one token: settling it at 1 would give back 999
    // of the window filled since the reset.
    release.send(true).unwrap();
    assert_eq!(streaming.bytes().await.unwrap(), "data: one\n\n");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 0);
    assert_eq!(post("/fill", 500).await.unwrap().status(), 429);
}

/// A reset voids the give-backs of its own key's reservations, not every key's: keys share
/// 64 reset counters, so a reset of another key leaves a reservation refundable unless the
/// two share one (one key in 64; eight other keys all sharing it would be one in 2^48).
#[tokio::test]
async fn a_reset_of_another_key_leaves_a_reservation_refundable() {
    let p = policy(Algorithm::SlidingWindowCounter, 10, Duration::from_secs(60));
    let store = memory(&ManualClock::new(1_000_000));
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(p.clone())
        .build()
        .unwrap();
    let mut refunded = 0;
    for other in 0..8 {
        let key = Key::new("user", format!("kept-{other}"));
        let reservation = limiter.reserve(&key, 6).await.unwrap();
        limiter
            .reset(&Key::new("user", format!("other-{other}")))
            .await
            .unwrap();
        reservation.settle(1).await.unwrap();
        if used(&store, &key, &p).await == 1 {
            refunded += 1;
        } else {
            assert_eq!(used(&store, &key, &p).await, 6, "all or nothing");
        }
    }
    assert!(refunded >= 1, "no reservation of eight was refunded");
}

/// Through HTTP on a leased store: a metered request whose estimate is too large for a block
/// (charged at the ledger) is settled at its actual cost, so the next one may reserve what
/// the first gave back.
#[tokio::test]
async fn a_leased_store_settles_an_estimate_too_large_for_a_block_through_http() {
    use tollgate::store::leased::{LeasedStore, MemoryLedger};
    let tokens = Policy::new("tokens", Rate::per_minute(10_000)).unwrap();
    let limiter = Limiter::builder()
        .store(LeasedStore::new(MemoryLedger::new()))
        .route(
            "POST /chat",
            Route::new().metered(tokens, Meter::from_body(1_000)),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/chat",
            post(|| async {
                let mut res = "120 tokens".into_response();
                res.extensions_mut().insert(ActualCost::new(120));
                res
            }),
        )
        .layer(RateLimitLayer::new(limiter))
        .layer(EstimateFromJsonLayer::new("max_tokens").max_body_bytes(1024));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let post = |max: u64| {
        client
            .post(format!("http://{addr}/chat"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"max_tokens":{max}}}"#))
            .send()
    };
    assert_eq!(post(4_000).await.unwrap().status(), 200);
    // 120 used: 9 880 may be reserved (it would not fit had the 4 000 stayed charged).
    assert_eq!(post(9_880).await.unwrap().status(), 200);
    assert_eq!(post(9_880).await.unwrap().status(), 429);
}

/// `EstimateFromJsonLayer` over a whole app reads JSON bodies only: an upload on another route
/// streams to its handler whatever its size. It once buffered every body under its 64 KiB cap
/// and refused a 100 KiB upload with `413`.
#[tokio::test]
async fn the_json_estimate_leaves_other_bodies_alone() {
    let limiter = Limiter::builder()
        .route(
            "POST /v1/completions",
            Route::new().metered(
                Policy::new("tokens", Rate::per_minute(90_000)).unwrap(),
                Meter::from_body(1_000),
            ),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/v1/completions", post(|| async { "done" }))
        .route(
            "/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .layer(RateLimitLayer::new(limiter))
        .layer(EstimateFromJsonLayer::new("max_tokens"));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let big = vec![b'x'; 100 * 1024];
    let res = client
        .post(format!("http://{addr}/upload"))
        .header("content-type", "application/octet-stream")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "102400");
    // A JSON body is still read, and capped.
    let res = client
        .post(format!("http://{addr}/v1/completions"))
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
}

/// Quota headers near the limit only (`QuotaHeaders::NearLimit`) are decided with the state the
/// response leaves: a request reserved far from the limit that settles at nearly all of it
/// tells the client. They were decided at admission, and the next request was refused
/// without warning.
#[tokio::test]
async fn near_limit_headers_follow_the_settlement() {
    let limiter = Limiter::builder()
        .route(
            "POST /v1/completions",
            Route::new().metered(
                Policy::new("tokens", Rate::per_minute(90_000)).unwrap(),
                Meter::fixed(1_000).settle_from_header("x-tokens-used".parse().unwrap()),
            ),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/v1/completions",
            post(|| async { ([("x-tokens-used", "89000")], "a long answer") }),
        )
        .layer(RateLimitLayer::new(limiter).quota_headers(tollgate::QuotaHeaders::NearLimit));
    let addr = support::serve(app).await;
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/v1/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()
            .get("ratelimit-remaining")
            .map(|v| v.to_str().unwrap()),
        Some("1000"),
        "{:?}",
        res.headers()
    );
}
