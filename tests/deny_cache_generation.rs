//! The deny cache never outlives the state it cached: a `ResilientStore` whose deny cache
//! holds a key's denial for an hour (max age 600 s, the store's `retry_after` over a
//! minute) refuses it no longer than the recheck interval plus a store call once Redis has
//! lost the key's state — restarted by the harness (a store from a URL, and a pool that
//! reconnects without ever failing a call) or flushed without a restart — through the
//! direct API and over HTTP, on a `RedisStore` and on the `LeasedStore` plans build.

mod support;

use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tollgate::key::Key;
use tollgate::store::leased::LeasedStore;
use tollgate::store::{FailureMode, RedisStore, ResilientStore, Store};
use tollgate::{DecidedBy, Limiter, Policy, Rate, RateLimitLayer};

use support::RedisServer;

const RECHECK: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_millis(200);
/// The stated bound is `RECHECK` plus one store call (at most `TIMEOUT`); a restarted
/// server's first call may fail on the dropped connection, and the next hit asks again.
/// The rest is slack for a loaded test machine: far below the denial's max age (600 s) and
/// its `retry_after` (over a minute), which is what the cache answered before.
const WITHIN: Duration = Duration::from_secs(3);

/// A resilient store whose cached denials would last ten minutes if nothing asked again.
fn resilient<S: Store>(primary: S) -> ResilientStore<S> {
    ResilientStore::builder(primary, FailureMode::FailClosed)
        .timeout(TIMEOUT)
        // Failures while Redis restarts must not open the circuit: this test is about the
        // cache, not the breaker.
        .circuit_breaker(1_000, Duration::from_millis(100))
        .deny_cache(1_000)
        .deny_cache_max_age(Duration::from_secs(600))
        .deny_cache_recheck(RECHECK)
        .build()
        .unwrap()
}

fn redis(server: &RedisServer, prefix: &str, pool: bool) -> RedisStore {
    let b = RedisStore::builder().prefix(prefix);
    if pool {
        b.build_with_pool(server.pool(4)).unwrap()
    } else {
        b.build_with_url(&server.url()).unwrap()
    }
}

fn limiter<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .policy(Policy::new("api", Rate::per_hour(3)).unwrap())
        .extractor(support::by_tenant())
        .build()
        .unwrap()
}

/// Exhausts `key` and checks the cache now answers its denial.
async fn exhaust<S: Store>(l: &Limiter<S>, key: &Key) {
    for _ in 0..3 {
        assert!(l.check(key, 1).await.unwrap().is_allowed());
    }
    let denied = l.check(key, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert!(denied.retry_after_millis() > 60_000);
    let cached = l.check(key, 1).await.unwrap();
    assert_eq!(cached.decided_by(), DecidedBy::CachedDeny);
}

/// Checks `key` every 10 ms (and nothing else) until it is allowed; how long that took.
async fn until_allowed<S: Store>(l: &Limiter<S>, key: &Key) -> Duration {
    let started = Instant::now();
    loop {
        let d = l.check(key, 1).await.unwrap();
        if d.is_allowed() {
            assert_eq!(d.decided_by(), DecidedBy::Decided);
            return started.elapsed();
        }
        assert!(
            started.elapsed() < WITHIN,
            "still refused {:?} after Redis lost the state: {d:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_ends_cached_denials_within_the_recheck() {
    for pool in [false, true] {
        let mut server = RedisServer::start();
        let l = limiter(resilient(redis(&server, "restart", pool)));
        let key = Key::new("tenant", "hot");
        exhaust(&l, &key).await;
        server.kill();
        server.restart();
        // Only this key's requests: every one of them is a cache hit until it goes.
        let took = until_allowed(&l, &key).await;
        eprintln!(
            "{}: allowed {took:?} after the restart",
            if pool { "pool" } else { "url" }
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_ends_cached_denials_within_the_recheck() {
    let server = RedisServer::start();
    let l = limiter(resilient(redis(&server, "flush", false)));
    let key = Key::new("tenant", "hot");
    exhaust(&l, &key).await;
    let _: () = server.query(&["FLUSHALL"]).unwrap();
    let took = until_allowed(&l, &key).await;
    eprintln!("allowed {took:?} after FLUSHALL");
    // While Redis keeps the state, the cache keeps answering, and asks no more than once a
    // recheck: the key stays refused.
    for _ in 0..2 {
        assert!(l.check(&key, 1).await.unwrap().is_allowed());
    }
    assert!(!l.check(&key, 1).await.unwrap().is_allowed());
    let before = server.command_calls("evalsha");
    let started = Instant::now();
    let mut cached = 0u32;
    while started.elapsed() < Duration::from_millis(500) {
        let d = l.check(&key, 1).await.unwrap();
        assert!(!d.is_allowed());
        cached += u32::from(d.decided_by() == DecidedBy::CachedDeny);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let calls = server.command_calls("evalsha") - before;
    eprintln!("{cached} cached denials in 500 ms cost {calls} store calls");
    assert!(cached > 50);
    assert!(calls <= 500 / 100 + 2, "{calls} store calls");
}

/// Serves `l` behind the layer; requests keyed by `x-tenant`.
async fn app<S: Store + Clone>(l: Limiter<S>) -> String {
    let addr = support::serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(l)),
    )
    .await;
    format!("http://{addr}/")
}

async fn status(client: &reqwest::Client, url: &str) -> u16 {
    client
        .get(url)
        .header("x-tenant", "web")
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Over HTTP: 429 from the cache before the restart, 200 within the bound after it.
async fn over_http(url: &str, mut lose_state: impl FnMut()) -> Duration {
    let client = reqwest::Client::new();
    for _ in 0..3 {
        assert_eq!(status(&client, url).await, 200);
    }
    for _ in 0..5 {
        assert_eq!(status(&client, url).await, 429);
    }
    lose_state();
    let started = Instant::now();
    loop {
        match status(&client, url).await {
            200 => return started.elapsed(),
            429 => assert!(
                started.elapsed() < WITHIN,
                "still 429 {:?} after Redis lost the state",
                started.elapsed()
            ),
            other => panic!("{other}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_restart_ends_cached_denials_within_the_recheck() {
    // A Redis store from a pool, and the stack plans build: resilient over leased over Redis.
    let mut server = RedisServer::start();
    let url = app(limiter(resilient(redis(&server, "http-pool", true)))).await;
    let took = over_http(&url, || {
        server.kill();
        server.restart();
    })
    .await;
    eprintln!("pool over HTTP: 200 {took:?} after the restart");

    let mut server = RedisServer::start();
    let leased = LeasedStore::new(redis(&server, "http-leased", false));
    let url = app(limiter(resilient(leased))).await;
    let took = over_http(&url, || {
        server.kill();
        server.restart();
    })
    .await;
    eprintln!("leased over HTTP: 200 {took:?} after the restart");

    let server = RedisServer::start();
    let leased = LeasedStore::new(redis(&server, "http-flush", false));
    let url = app(limiter(resilient(leased))).await;
    let took = over_http(&url, || {
        let _: () = server.query(&["FLUSHALL"]).unwrap();
    })
    .await;
    eprintln!("leased over HTTP: 200 {took:?} after FLUSHALL");
}

/// The resilient store reports its primary's generation, so a store above it (or an
/// application caching its answers) sees a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resilient_store_reports_its_primarys_generation() {
    let mut server = RedisServer::start();
    let store = resilient(redis(&server, "generation", false));
    let policies = [Policy::new("api", Rate::per_hour(3)).unwrap()];
    let key = Key::new("tenant", "g");
    store.check(&key, &policies, &[1]).await.unwrap();
    assert_eq!(store.generation(), store.primary().generation());
    let before = store.generation();
    server.kill();
    server.restart();
    let started = Instant::now();
    while store.generation() == before {
        assert!(started.elapsed() < WITHIN, "the restart went unnoticed");
        let _ = store.check(&key, &policies, &[1]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.generation(), store.primary().generation());
}
