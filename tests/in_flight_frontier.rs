//! In-flight slots under cancellation, refunds and resets: a slot is held only by the
//! request that took it, through the direct `Limiter` API and through axum on loopback, on
//! the memory store and on a real Redis.

mod support;

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tollgate::store::StoreExt;

use axum::routing::get;
use axum::Router;
use tollgate::key::{Global, Key};
use tollgate::store::{MemoryStore, RedisStore, Store};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

use support::RedisServer;

fn redis_store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .build_with_url(&server.url())
        .unwrap()
}

fn running(n: u64) -> Limiter<impl Store + Clone> {
    limiter_on(MemoryStore::new(), n)
}

fn limiter_on<S: Store>(store: S, n: u64) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .policy(Policy::in_flight("running", n).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap()
}

/// How many of `n` acquisitions held at once are admitted.
async fn admitted_at_once<S: Store>(limiter: &Limiter<S>, key: &Key, n: usize) -> usize {
    let mut permits = vec![];
    for _ in 0..n {
        permits.push(limiter.acquire(key).await.unwrap());
    }
    permits.iter().filter(|p| p.is_allowed()).count()
}

/// Waits until all `n` slots are free (bounded): the time it took.
async fn all_free_within<S: Store>(
    limiter: &Limiter<S>,
    key: &Key,
    n: usize,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let admitted = admitted_at_once(limiter, key, n).await;
        if admitted == n {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{admitted} of {n} slots free after {within:?}: cancelled acquisitions hold slots"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 300 acquisitions each dropped after being polled `polls` times (0: never polled, 1: its
/// charge sent and its reply not read yet, ...) leave every slot free within a bound.
async fn cancelled_acquisitions_hold_nothing<S: Store>(limiter: Limiter<S>) {
    let key = Key::new("tenant", "shared");
    let mut cut_short = 0;
    for i in 0..300 {
        let mut acquire = Box::pin(limiter.acquire(&key));
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..(i % 4) {
            if let Poll::Ready(permit) = acquire.as_mut().poll(&mut cx) {
                drop(permit); // finished: its permit gives the slot back
                break;
            }
        }
        if i % 7 == 0 {
            // Let a reply arrive (or not) before the drop.
            tokio::task::yield_now().await;
        }
        cut_short += 1;
        drop(acquire);
        if i % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    assert_eq!(cut_short, 300);
    let took = all_free_within(&limiter, &key, 4, Duration::from_secs(2)).await;
    eprintln!("every slot free {took:?} after 300 cancelled acquisitions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_hold_no_slot_memory() {
    cancelled_acquisitions_hold_nothing(running(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_hold_no_slot_redis() {
    let server = RedisServer::start();
    cancelled_acquisitions_hold_nothing(limiter_on(redis_store(&server, "cancel"), 4)).await;
}

/// What a timeout layer does: 300 acquisitions each given 0 to 3 ms, then every slot free.
/// `check` sees the same slots as `limiter` (the same limiter, or another on the same store).
async fn acquisitions_under_timeouts_hold_nothing<S: Store, T: Store>(
    limiter: Limiter<S>,
    check: &Limiter<T>,
) {
    let key = Key::new("tenant", "shared");
    let mut tasks = vec![];
    for i in 0..300u64 {
        let limiter = limiter.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let budget = Duration::from_micros((i * 37) % 3_000);
            let _ = tokio::time::timeout(budget, async {
                let permit = limiter.acquire(&key).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(permit);
            })
            .await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    all_free_within(check, &key, 4, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_hold_no_slot_redis_under_timeouts() {
    let server = RedisServer::start();
    let limiter = limiter_on(redis_store(&server, "timeouts"), 4);
    acquisitions_under_timeouts_hold_nothing(limiter.clone(), &limiter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_hold_no_slot_cluster_under_timeouts() {
    let cluster = support::RedisCluster::start();
    let store = tollgate::store::RedisClusterStore::builder()
        .prefix("timeouts")
        .build_cluster_with_urls(cluster.urls())
        .unwrap();
    let limiter = limiter_on(store, 4);
    acquisitions_under_timeouts_hold_nothing(limiter.clone(), &limiter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_acquisitions_hold_no_slot_resilient_redis_under_timeouts() {
    // The resilient store's own timeout cuts the store's call short too.
    let server = RedisServer::start();
    let store = tollgate::store::ResilientStore::builder(
        redis_store(&server, "resilient"),
        tollgate::store::FailureMode::FailClosed,
    )
    .timeout(Duration::from_millis(1))
    .build()
    .unwrap();
    // Checked through a plain store on the same Redis: the 1 ms timeout would refuse some of
    // the check's own acquisitions on a busy machine.
    let check = limiter_on(redis_store(&server, "resilient"), 4);
    acquisitions_under_timeouts_hold_nothing(limiter_on(store, 4), &check).await;
}

/// Requests that give up before their answer, over HTTP: each client waits 0 to 3 ms.
async fn abandoned_requests_hold_nothing<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let limiter = limiter_on(store, 4);
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                "ok"
            }),
        )
        .layer(RateLimitLayer::new(limiter.clone()));
    let addr = support::serve(app).await;
    let url = format!("http://{addr}/");
    // Connections opened first, so that most of each request's budget is spent on its
    // decision and its handler, not on connecting.
    let client = reqwest::Client::new();
    futures_at_once(&client, &url, 16).await;
    let mut tasks = vec![];
    for i in 0..300u64 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let budget = Duration::from_micros(1 + (i * 37) % 3_000);
            let _ = client.get(&url).timeout(budget).send().await;
        }));
        if i % 16 == 15 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Four requests at once are all served once the slots are back.
    let client = reqwest::Client::new();
    let start = Instant::now();
    loop {
        let answers = futures_at_once(&client, &url, 4).await;
        if answers.iter().all(|&s| s == 200) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "abandoned requests still hold slots: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The statuses of `n` requests sent together, each held in the handler a little.
async fn futures_at_once(client: &reqwest::Client, url: &str, n: usize) -> Vec<u16> {
    let mut tasks = vec![];
    for _ in 0..n {
        let client = client.clone();
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            client
                .get(&url)
                .send()
                .await
                .map_or(0, |r| r.status().as_u16())
        }));
    }
    let mut out = vec![];
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_http_requests_hold_no_slot_memory() {
    abandoned_requests_hold_nothing(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_http_requests_hold_no_slot_redis() {
    let server = RedisServer::start();
    abandoned_requests_hold_nothing(redis_store(&server, "abandoned")).await;
}

/// A route with an in-flight policy and a rate policy: `Limiter::refund` gives units back
/// to the rate policy and never a slot.
fn slot_and_rate<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .policy(Policy::in_flight("running", 1).unwrap())
        .policy(Policy::new("per_minute", Rate::per_minute(100)).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap()
}

async fn a_refund_never_frees_a_slot<S: Store>(limiter: Limiter<S>) {
    let key = Key::global("all");
    let held = limiter.acquire(&key).await.unwrap();
    assert!(held.is_allowed());
    assert_eq!(held.policies()[1].remaining(), 99);
    for _ in 0..3 {
        limiter.refund(&key, 1).await.unwrap();
    }
    let second = limiter.acquire(&key).await.unwrap();
    assert!(
        !second.is_allowed(),
        "a refund gave the held slot to another request"
    );
    drop(second);
    // The rate policy got its unit back.
    drop(held);
    let third = limiter.acquire(&key).await.unwrap();
    assert!(
        third.is_allowed(),
        "the slot comes back when its permit is dropped"
    );
    assert_eq!(third.policies()[1].remaining(), 99);
}

#[tokio::test]
async fn a_refund_never_frees_a_slot_memory() {
    a_refund_never_frees_a_slot(slot_and_rate(MemoryStore::new())).await;
}

#[tokio::test]
async fn a_refund_never_frees_a_slot_redis() {
    let server = RedisServer::start();
    a_refund_never_frees_a_slot(slot_and_rate(redis_store(&server, "refund"))).await;
}

/// Over HTTP: a handler that refunds its request's unit still holds its slot.
async fn a_refunding_handler_keeps_its_slot<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let limiter = slot_and_rate(store);
    let inner = limiter.clone();
    let app = Router::new()
        .route(
            "/work",
            get(move || {
                let limiter = inner.clone();
                async move {
                    limiter.refund(&Key::global("all"), 1).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "done"
                }
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let work = tokio::spawn({
        let client = client.clone();
        let url = format!("http://{addr}/work");
        async move { client.get(&url).send().await.unwrap().status().as_u16() }
    });
    tokio::time::sleep(Duration::from_millis(120)).await;
    let status = client
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(status, 429, "the refund freed the running request's slot");
    assert_eq!(work.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refunding_handler_keeps_its_slot_memory() {
    a_refunding_handler_keeps_its_slot(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refunding_handler_keeps_its_slot_redis() {
    let server = RedisServer::start();
    a_refunding_handler_keeps_its_slot(redis_store(&server, "refund_http")).await;
}

/// A permit taken before a reset and dropped after it releases nothing: the slot it held
/// was forgotten with the state, and the slot another request took since stays held.
async fn a_permit_from_before_a_reset_releases_nothing<S: Store>(limiter: Limiter<S>) {
    let key = Key::global("all");
    let old = limiter.acquire(&key).await.unwrap();
    assert!(old.is_allowed());
    limiter.reset(&key).await.unwrap();
    let new = limiter.acquire(&key).await.unwrap();
    assert!(new.is_allowed(), "a reset frees every slot");
    drop(old);
    tokio::time::sleep(Duration::from_millis(50)).await; // a Redis release is sent meanwhile
    let third = limiter.acquire(&key).await.unwrap();
    assert!(
        !third.is_allowed(),
        "the permit from before the reset freed the new request's slot"
    );
    drop(third);
    drop(new);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(limiter.acquire(&key).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_permit_from_before_a_reset_releases_nothing_memory() {
    a_permit_from_before_a_reset_releases_nothing(limiter_on(MemoryStore::new(), 1)).await;
}

#[tokio::test]
async fn a_permit_from_before_a_reset_releases_nothing_redis() {
    let server = RedisServer::start();
    a_permit_from_before_a_reset_releases_nothing(limiter_on(redis_store(&server, "reset"), 1))
        .await;
}

/// Over HTTP: a response that ends after an operator reset the key frees nothing of the
/// requests admitted since.
async fn a_response_from_before_a_reset_frees_nothing<S: Store + Clone>(store: S)
where
    S::CheckFuture: Send,
{
    let limiter = limiter_on(store, 1);
    let app = Router::new()
        .route(
            "/short",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(250)).await;
                "ok"
            }),
        )
        .route(
            "/long",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                "ok"
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter.clone()));
    let addr = support::serve(app).await;
    let url = format!("http://{addr}/");
    let client = reqwest::Client::new();
    let first = tokio::spawn({
        let (client, url) = (client.clone(), format!("{url}short"));
        async move { client.get(&url).send().await.unwrap().status().as_u16() }
    });
    tokio::time::sleep(Duration::from_millis(60)).await;
    limiter.reset(&Key::global("all")).await.unwrap();
    let second = tokio::spawn({
        let (client, url) = (client.clone(), format!("{url}long"));
        async move { client.get(&url).send().await.unwrap().status().as_u16() }
    });
    assert_eq!(first.await.unwrap(), 200);
    // The first response has ended; the second still runs and holds the one slot.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = client.get(&url).send().await.unwrap().status().as_u16();
    assert_eq!(
        third, 429,
        "the request from before the reset freed the second's slot"
    );
    assert_eq!(second.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_from_before_a_reset_frees_nothing_memory() {
    a_response_from_before_a_reset_frees_nothing(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_from_before_a_reset_frees_nothing_redis() {
    let server = RedisServer::start();
    a_response_from_before_a_reset_frees_nothing(redis_store(&server, "reset_http")).await;
}

#[test]
fn named_slots_are_kept_apart() {
    // Two permits of the memory store name different slots.
    let rt = support::runtime();
    rt.block_on(async {
        let limiter = running(2);
        let key = Key::global("all");
        let a = limiter.acquire(&key).await.unwrap();
        let b = limiter.acquire(&key).await.unwrap();
        assert!(a.is_allowed() && b.is_allowed());
        assert_ne!(a.slot(), 0);
        assert_ne!(a.slot(), b.slot());
    });
}

/// A settlement or a refund whose caller gives up after sending it still applies, once: the
/// call is finished in the background rather than cut off wherever it stood.
async fn cancelled_settlements_still_apply<S: Store>(store: S, direct: &S) {
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(tokens.clone())
        .extractor(Global::new())
        .build()
        .unwrap();
    let key = Key::global("all");
    let used = || async {
        let d = direct
            .peek(&key, std::slice::from_ref(&tokens), &[0])
            .await
            .unwrap();
        1_000 - d.remaining()
    };
    // A future never polled has done nothing (as any Rust future); from its first poll on, it
    // is finished whatever happens to it.
    for polls in 1..4 {
        limiter.reset(&key).await.unwrap();
        let reservation = limiter.reserve(&key, 400).await.unwrap();
        assert!(reservation.decision().is_allowed());
        let mut settle = Box::pin(reservation.settle(100));
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..polls {
            if settle.as_mut().poll(&mut cx).is_ready() {
                break;
            }
        }
        drop(settle);
        let start = Instant::now();
        while used().await != 100 {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "a settlement dropped after {polls} polls left {} charged, not 100",
                used().await
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut refund = Box::pin(limiter.refund(&key, 30));
        for _ in 0..polls {
            if refund.as_mut().poll(&mut cx).is_ready() {
                break;
            }
        }
        drop(refund);
        let start = Instant::now();
        while used().await != 70 {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "a refund dropped after {polls} polls left {} charged, not 70",
                used().await
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_settlements_still_apply_memory() {
    let store = MemoryStore::new();
    cancelled_settlements_still_apply(store.clone(), &store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_settlements_still_apply_redis() {
    let server = RedisServer::start();
    let store = redis_store(&server, "settle_cancel");
    cancelled_settlements_still_apply(store.clone(), &store).await;
}

#[tokio::test]
async fn an_in_flight_refusal_speaks_of_requests_at_once() {
    let limiter = Limiter::builder()
        .policy(Policy::in_flight("exports-running", 2).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "ok"
            }),
        )
        .layer(RateLimitLayer::new(limiter.clone()));
    let addr = support::serve(app).await;
    let url = format!("http://{addr}/");
    let held = tokio::spawn({
        let url = url.clone();
        async move { futures_at_once(&reqwest::Client::new(), &url, 2).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = reqwest::Client::new().get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(
        body["message"],
        "Too many requests in progress: at most 2 at once (exports-running). Retry in 1 s."
    );
    assert_eq!(held.await.unwrap(), vec![200, 200]);
}

/// `Limiter::check` admits only while a slot is free, and holds none: nothing would give it
/// back.
async fn a_check_holds_no_slot<S: Store>(limiter: Limiter<S>) {
    let key = Key::global("all");
    for _ in 0..5 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    tokio::time::sleep(Duration::from_millis(20)).await; // a Redis release is sent meanwhile
    let held = limiter.acquire(&key).await.unwrap();
    assert!(held.is_allowed(), "checks left their slots held");
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    drop(held);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_check_holds_no_slot_memory() {
    a_check_holds_no_slot(limiter_on(MemoryStore::new(), 1)).await;
}

#[tokio::test]
async fn a_check_holds_no_slot_redis() {
    let server = RedisServer::start();
    a_check_holds_no_slot(limiter_on(redis_store(&server, "check"), 1)).await;
}
