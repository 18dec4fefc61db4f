//! In-flight limits: requests in progress per key, held until the response body is sent or
//! dropped, across instances sharing a real Redis, through real axum servers.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate::store::StoreExt;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use tollgate::key::{Global, Key};
use tollgate::store::{FailureMode, MemoryStore, RedisStore, ResilientStore, Store};
use tollgate::{Algorithm, HeaderStyle, Limiter, Policy, Rate, RateLimitLayer};

use support::RedisServer;

/// Requests in the handler now, and the most seen at once.
#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Gauge {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn redis_store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .build_with_url(&server.url())
        .unwrap()
}

fn in_flight(n: u64, lease: Duration) -> Policy {
    Policy::builder("in_flight", Rate::new(n, lease))
        .algorithm(Algorithm::InFlight)
        .build()
        .unwrap()
}

fn slow_app<S: Store + Clone>(limiter: Limiter<S>, gauge: Gauge) -> Router
where
    S::CheckFuture: Send,
{
    Router::new()
        .route(
            "/",
            get(move || {
                let gauge = gauge.clone();
                async move {
                    gauge.enter();
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    gauge.leave();
                    "done"
                }
            }),
        )
        .layer(RateLimitLayer::new(limiter).header_style(HeaderStyle::All))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_requests_on_two_instances_hold_exactly_n() {
    let server = RedisServer::start();
    let gauge = Gauge::default();
    let mut addrs = vec![];
    for _ in 0..2 {
        let limiter = Limiter::builder()
            .store(redis_store(&server, "inflight64"))
            .policy(in_flight(5, Duration::from_secs(30)))
            .extractor(Global::new())
            .build()
            .unwrap();
        addrs.push(support::serve(slow_app(limiter, gauge.clone())).await);
    }
    let client = reqwest::Client::new();
    let mut tasks = vec![];
    for i in 0..64 {
        let url = format!("http://{}/", addrs[i % 2]);
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let res = client.get(&url).send().await.unwrap();
            let status = res.status().as_u16();
            let retry = res
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            let policy = res
                .headers()
                .get("ratelimit-policy")
                .map(|v| v.to_str().unwrap().to_owned());
            (status, retry, policy)
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        let (status, retry, policy) = t.await.unwrap();
        match status {
            200 => allowed += 1,
            429 => {
                assert_eq!(retry.as_deref(), Some("1"));
                assert_eq!(
                    policy.as_deref(),
                    Some("\"in_flight\";q=5;qu=\"concurrent-requests\"")
                );
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        gauge.max.load(Ordering::SeqCst),
        5,
        "exactly n in flight at the peak"
    );
    assert!(allowed >= 5, "at least n were served ({allowed})");
    // Every slot came back: n more fit at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let keys = server.scan("inflight64:*");
    let held: u64 = keys
        .iter()
        .map(|k| server.query::<u64>(&["ZCARD", k]).unwrap())
        .sum();
    assert_eq!(held, 0, "no slot left behind in Redis");
}

/// A response body that sends `chunks` chunks `every` apart, then ends — or, with
/// `endless`, never ends (until the client goes away and the server drops it).
struct Drip {
    left: usize,
    endless: bool,
    every: Duration,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Drip {
    fn body(chunks: usize, every: Duration, endless: bool) -> Body {
        Body::new(Drip {
            left: chunks,
            endless,
            every,
            sleep: None,
        })
    }
}

impl http_body::Body for Drip {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        use std::future::Future;
        use std::task::Poll;
        if self.left == 0 && !self.endless {
            return Poll::Ready(None);
        }
        let every = self.every;
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        match sleep.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.sleep = None;
                self.left = self.left.saturating_sub(1);
                Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
                    b"data: chunk\n\n",
                )))))
            }
        }
    }
}

fn one_at_a_time<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .policy(in_flight(1, Duration::from_secs(30)))
        .extractor(Global::new())
        .build()
        .unwrap()
}

async fn status(client: &reqwest::Client, url: &str) -> u16 {
    client.get(url).send().await.unwrap().status().as_u16()
}

/// Polls until a request is served (a slot came back), or fails after `within`.
async fn eventually_served(client: &reqwest::Client, url: &str, within: Duration) -> Duration {
    let start = std::time::Instant::now();
    loop {
        if status(client, url).await == 200 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "the slot did not come back within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn streaming_holds_the_slot_until_the_stream_ends<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let app = Router::new()
        .route(
            "/stream",
            get(|| async { Drip::body(5, Duration::from_millis(80), false) }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(one_at_a_time(store)));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let res = client
        .get(format!("http://{addr}/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Headers are in; the body is still streaming: the slot is held.
    assert_eq!(status(&client, &format!("http://{addr}/")).await, 429);
    let body = res.bytes().await.unwrap();
    assert_eq!(body.len(), 5 * b"data: chunk\n\n".len());
    eventually_served(&client, &format!("http://{addr}/"), Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_stream_holds_its_slot_until_it_ends_memory() {
    streaming_holds_the_slot_until_the_stream_ends(MemoryStore::new()).await;
}

#[tokio::test]
async fn a_stream_holds_its_slot_until_it_ends_redis() {
    let server = RedisServer::start();
    streaming_holds_the_slot_until_the_stream_ends(redis_store(&server, "stream")).await;
}

async fn a_client_that_disconnects_frees_its_slot<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let app = Router::new()
        .route(
            "/endless",
            get(|| async { Drip::body(0, Duration::from_millis(50), true) }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(one_at_a_time(store)));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let res = client
        .get(format!("http://{addr}/endless"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let url = format!("http://{addr}/");
    assert_eq!(status(&reqwest::Client::new(), &url).await, 429);
    drop(res); // the client goes away mid-body
    drop(client);
    eventually_served(&reqwest::Client::new(), &url, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn a_disconnect_frees_the_slot_memory() {
    a_client_that_disconnects_frees_its_slot(MemoryStore::new()).await;
}

#[tokio::test]
async fn a_disconnect_frees_the_slot_redis() {
    let server = RedisServer::start();
    a_client_that_disconnects_frees_its_slot(redis_store(&server, "disconnect")).await;
}

async fn a_panicking_handler_frees_its_slot<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let app = Router::new()
        .route(
            "/panic",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if true {
                    panic!("the handler failed");
                }
                "never"
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(one_at_a_time(store)));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    // The connection is dropped when the handler panics: the client sees an error.
    assert!(client
        .get(format!("http://{addr}/panic"))
        .send()
        .await
        .is_err());
    eventually_served(&client, &format!("http://{addr}/"), Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_panic_frees_the_slot_memory() {
    a_panicking_handler_frees_its_slot(MemoryStore::new()).await;
}

#[tokio::test]
async fn a_panic_frees_the_slot_redis() {
    let server = RedisServer::start();
    a_panicking_handler_frees_its_slot(redis_store(&server, "panic")).await;
}

#[test]
fn slots_of_a_crashed_instance_come_back_after_their_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1_500);
    let make = || {
        Limiter::builder()
            .store(redis_store(&server, "crash"))
            .policy(in_flight(2, lease))
            .build()
            .unwrap()
    };
    let key = Key::new("tenant", "acme");
    // The "crashed" instance: takes both slots, never gives them back, and its runtime (with
    // the tasks that refresh the leases) goes away.
    let crashed = tokio::runtime::Runtime::new().unwrap();
    crashed.block_on(async {
        let limiter = make();
        for _ in 0..2 {
            let permit = limiter.acquire(&key).await.unwrap();
            assert!(permit.is_allowed() && permit.holds_slots());
            std::mem::forget(permit);
        }
        // Refreshed while the instance lives: still held after more than a lease.
        tokio::time::sleep(lease + Duration::from_millis(500)).await;
        assert!(!limiter.acquire(&key).await.unwrap().is_allowed());
    });
    crashed.shutdown_background();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let limiter = make();
        assert!(!limiter.acquire(&key).await.unwrap().is_allowed());
        let start = std::time::Instant::now();
        loop {
            if limiter.acquire(&key).await.unwrap().is_allowed() {
                break;
            }
            assert!(
                start.elapsed() < lease * 2,
                "the crashed instance's slots must come back within a lease"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[tokio::test]
async fn in_flight_and_rate_policies_are_decided_together() {
    // A request refused by the rate policy takes no slot, and one refused for want of a slot
    // is not charged to the rate.
    for store in [None, Some(RedisServer::start())] {
        let rate = Policy::new("rate", Rate::per_minute(2)).unwrap();
        let key = Key::new("tenant", "both");
        macro_rules! run {
            ($store:expr) => {{
                let limiter = Limiter::builder()
                    .store($store)
                    .policy(in_flight(1, Duration::from_secs(30)))
                    .policy(rate.clone())
                    .build()
                    .unwrap();
                let first = limiter.acquire(&key).await.unwrap();
                assert!(first.is_allowed());
                let busy = limiter.acquire(&key).await.unwrap();
                assert!(!busy.is_allowed() && !busy.holds_slots());
                assert_eq!(busy.retry_after(), Some(Duration::from_secs(1)));
                drop(busy);
                drop(first);
                tokio::time::sleep(Duration::from_millis(50)).await;
                // The refused request was not charged: one unit of the rate is left.
                let second = limiter.acquire(&key).await.unwrap();
                assert!(second.is_allowed());
                drop(second);
                tokio::time::sleep(Duration::from_millis(50)).await;
                // The rate is used up: refused, and no slot taken (the next look finds it free).
                assert!(!limiter.acquire(&key).await.unwrap().is_allowed());
                let look = limiter
                    .store()
                    .peek(&key, &limiter.policies()[..1], &[1])
                    .await
                    .unwrap();
                assert!(
                    look.is_allowed(),
                    "a request refused by the rate took no slot"
                );
            }};
        }
        match &store {
            None => run!(MemoryStore::new()),
            Some(server) => run!(redis_store(server, "together")),
        }
    }
}

/// A slot released through the store under the request's whole plan (its rate policies
/// beside the in-flight one) frees the slot and gives nothing back to the rates: on Redis the
/// slot's name used to be refunded to them as units, wiping a full window.
async fn a_release_under_the_whole_plan_frees_the_slot_only<S: Store>(store: S) {
    let plan = [
        Policy::builder("window", Rate::per_minute(10))
            .algorithm(Algorithm::FixedWindow)
            .build()
            .unwrap(),
        Policy::new("counter", Rate::per_minute(10)).unwrap(),
        in_flight(5, Duration::from_secs(30)),
    ];
    let key = Key::new("tenant", "release");
    for _ in 0..10 {
        let d = store.check(&key, &plan, &[1, 1, 1]).await.unwrap();
        assert!(d.is_allowed());
        store.release(&key, &plan, d.slot()).await.unwrap();
    }
    let refused = store.check(&key, &plan, &[1, 1, 1]).await.unwrap();
    assert!(!refused.is_allowed(), "the rates are spent: {refused:?}");
    let peeked = store.peek(&key, &plan[..2], &[1, 1]).await.unwrap();
    assert_eq!(peeked.remaining(), 0, "{peeked:?}");
    // Every slot came back: a request now would leave 4 of the 5.
    let slots = store.peek(&key, &plan[2..], &[1]).await.unwrap();
    assert_eq!(slots.remaining(), 4, "{slots:?}");
}

#[tokio::test]
async fn a_release_under_the_whole_plan_frees_the_slot_only_memory() {
    a_release_under_the_whole_plan_frees_the_slot_only(MemoryStore::new()).await;
}

#[tokio::test]
async fn a_release_under_the_whole_plan_frees_the_slot_only_redis() {
    let server = RedisServer::start();
    a_release_under_the_whole_plan_frees_the_slot_only(redis_store(&server, "release")).await;
}

/// A permit handed to code with no Tokio runtime (a plain thread) and dropped there gives its
/// slot back at once, without a panic: on a store whose calls need a runtime's timer (a
/// `ResilientStore`'s timeout, a Redis connection's response timeout) too.
async fn a_permit_dropped_outside_a_runtime_gives_its_slot_back<S: Store>(store: S) {
    let limiter = Limiter::builder()
        .store(store)
        .policy(in_flight(1, Duration::from_secs(30)))
        .build()
        .unwrap();
    let key = Key::new("tenant", "thread");
    let permit = limiter.acquire(&key).await.unwrap();
    assert!(permit.is_allowed());
    std::thread::spawn(move || drop(permit))
        .join()
        .expect("dropping a permit outside a runtime panicked");
    let next = limiter.acquire(&key).await.unwrap();
    assert!(next.is_allowed(), "the slot came back: {next:?}");
}

fn resilient<S: Store>(store: S) -> ResilientStore<S> {
    ResilientStore::builder(store, FailureMode::FailClosed)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_dropped_outside_a_runtime_gives_its_slot_back_memory() {
    a_permit_dropped_outside_a_runtime_gives_its_slot_back(MemoryStore::new()).await;
    a_permit_dropped_outside_a_runtime_gives_its_slot_back(resilient(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_dropped_outside_a_runtime_gives_its_slot_back_redis() {
    let server = RedisServer::start();
    a_permit_dropped_outside_a_runtime_gives_its_slot_back(redis_store(&server, "thread")).await;
    a_permit_dropped_outside_a_runtime_gives_its_slot_back(resilient(redis_store(
        &server, "thread_r",
    )))
    .await;
}

/// Holds a slot through a `ResilientStore` (50 ms timeout) around `redis`, stops Redis while
/// another call holds the store's only call or connection, drops the permit (its release
/// cannot be sent before the timeout), resumes Redis: the slot must come back then, not
/// when its lease ends.
async fn a_release_past_the_resilient_timeout_frees_the_slot(
    server: &RedisServer,
    redis: RedisStore,
) {
    let store = ResilientStore::builder(redis.clone(), FailureMode::FailClosed)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(1_000, Duration::from_millis(100))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(in_flight(1, Duration::from_secs(30)))
        .build()
        .unwrap();
    let key = Key::new("tenant", "held");
    let permit = limiter.acquire(&key).await.unwrap();
    assert!(permit.is_allowed());
    // Redis stops; a call takes what the store has (its one call under way, or its pool's
    // one connection) and waits.
    server.signal("STOP");
    let other = Key::new("tenant", "other");
    let plan = [in_flight(1, Duration::from_secs(30))];
    let busy = {
        let redis = redis.clone();
        tokio::spawn(async move { redis.check(&other, &plan, &[1]).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The release waits behind it; the resilient store's timeout gives up waiting.
    drop(permit);
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.signal("CONT");
    let _ = busy.await;
    let mut freed = false;
    for _ in 0..20 {
        if limiter.acquire(&key).await.unwrap().is_allowed() {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "the slot stayed held after Redis answered again");
}

/// A release that waits in the store's queue (Redis busy with the call before it) is sent
/// even when the `ResilientStore` around it stops waiting for its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_queued_past_the_resilient_timeout_still_frees_the_slot() {
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .prefix("queued")
        .max_in_flight(1)
        .build_with_url(&server.url())
        .unwrap();
    a_release_past_the_resilient_timeout_frees_the_slot(&server, redis).await;
}

/// A release that runs its own call but cannot send it before the `ResilientStore` timeout
/// (waiting for the pool's only connection, which a stalled call holds) is finished in the
/// background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_waits_for_a_connection_past_the_timeout_still_frees_the_slot() {
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .prefix("unsent")
        .build_with_pool(server.pool(1))
        .unwrap();
    a_release_past_the_resilient_timeout_frees_the_slot(&server, redis).await;
}

#[test]
fn in_flight_policies_refuse_settings_nothing_would_read() {
    let b = || {
        Policy::builder("p", Rate::new(3, Duration::from_secs(30))).algorithm(Algorithm::InFlight)
    };
    assert_eq!(b().cost(2).build().unwrap_err().field(), "cost");
    assert_eq!(b().shadow(true).build().unwrap_err().field(), "shadow");
    assert_eq!(
        b().penalty(Duration::from_secs(1))
            .build()
            .unwrap_err()
            .field(),
        "penalty"
    );
    assert_eq!(
        Policy::builder("p", Rate::new(3, Duration::from_secs(30)).with_burst(4))
            .algorithm(Algorithm::InFlight)
            .build()
            .unwrap_err()
            .field(),
        "burst"
    );
    assert_eq!(Policy::in_flight("p", 0).unwrap_err().field(), "limit");
    // The login guard counts attempts over time: a slot per attempt would never come back.
    let err = tollgate::login::LoginGuard::builder()
        .algorithm(Algorithm::InFlight)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "algorithm");
}

#[tokio::test]
async fn a_plan_declares_an_in_flight_policy() {
    let plan = tollgate::config::Plan::from_toml(
        "[key]\nkind = \"global\"\n\n[[policies]]\nname = \"exports\"\nalgorithm = \"in_flight\"\nlimit = 1\nwindow = \"30s\"\n\n[default]\npolicies = [\"exports\"]\n",
    )
    .unwrap();
    let limiter = Limiter::from_config(&plan).unwrap();
    assert_eq!(limiter.policies()[0].algorithm(), Algorithm::InFlight);
    let key = Key::global("all");
    let held = limiter.acquire(&key).await.unwrap();
    assert!(held.holds_slots());
    assert!(!limiter.acquire(&key).await.unwrap().is_allowed());
    drop(held);
    assert!(limiter.acquire(&key).await.unwrap().is_allowed());
}

/// A reload that lengthens an in-flight lease reaches the slots already held: their next
/// refresh takes the new lease, so a longer lease rides out a longer outage for requests
/// already running too (`docs/operations.md`, reloads).
#[tokio::test]
async fn a_reload_that_lengthens_a_lease_reaches_held_slots_at_their_next_refresh() {
    let server = support::RedisServer::start();
    let store = RedisStore::builder()
        .prefix("lease-reload")
        .build_with_url(&server.url())
        .unwrap();
    let jobs = |lease_ms| {
        Policy::builder("jobs", Rate::new(1, Duration::from_millis(lease_ms)))
            .algorithm(Algorithm::InFlight)
            .build()
            .unwrap()
    };
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(jobs(300))
        .build()
        .unwrap();
    let key = Key::new("tenant", "lease-reload");
    let held = limiter.acquire(&key).await.unwrap();
    assert!(held.is_allowed());
    let longest_ttl = || {
        server
            .scan("lease-reload*")
            .iter()
            .map(|k| server.query::<i64>(&["PTTL", k]).unwrap())
            .max()
            .unwrap_or(-2)
    };
    let before = longest_ttl();
    assert!(before < 3_000, "{before} ms left on a 300 ms lease");
    limiter.reload(
        &Limiter::builder()
            .store(store)
            .policy(jobs(6_000))
            .build()
            .unwrap(),
    );
    // The next refresh comes within a third of the old lease.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ttl = longest_ttl();
    assert!(
        ttl > 3_000,
        "the held slot is still refreshed for 300 ms: {ttl} ms left"
    );
    drop(held);
}
