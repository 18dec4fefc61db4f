//! When Redis fails: each failure mode under a real SIGKILL, a SIGSTOP stall and script
//! errors, through a real axum app; the local fallback really limits; the deny cache saves
//! round trips and never denies what Redis would allow.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::store::StoreExt;

use axum::routing::get;
use axum::Router;
use tollgate::clock::ManualClock;
use tollgate::key::{Global, Key};
use tollgate::store::{FailureMode, RedisStore, ResilientStore, Store};
use tollgate::{Algorithm, DecidedBy, Limiter, Policy, Rate, RateLimitLayer};

use support::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(50);

fn resilient(server: &RedisServer, prefix: &str, mode: FailureMode) -> ResilientStore<RedisStore> {
    let redis = RedisStore::builder()
        .prefix(prefix)
        .build_with_url(&server.url())
        .unwrap();
    ResilientStore::builder(redis, mode)
        .timeout(TIMEOUT)
        .circuit_breaker(3, Duration::from_millis(200))
        .build()
        .unwrap()
}

fn limiter(store: ResilientStore<RedisStore>, rate: Rate) -> Limiter<ResilientStore<RedisStore>> {
    Limiter::builder()
        .store(store)
        .policy(Policy::new("api", rate).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap()
}

/// Sends `n` requests one after another; returns (status, latency) each.
async fn burst(client: &reqwest::Client, url: &str, n: usize) -> Vec<(u16, Duration)> {
    let mut out = vec![];
    for _ in 0..n {
        let started = Instant::now();
        let status = client.get(url).send().await.unwrap().status().as_u16();
        out.push((status, started.elapsed()));
    }
    out
}

async fn wait_until_decided(l: &Limiter<ResilientStore<RedisStore>>, within: Duration) -> Duration {
    let started = Instant::now();
    let key = Key::new("probe", "x");
    loop {
        let d = l.check(&key, 1).await.unwrap();
        if d.decided_by() == DecidedBy::Decided {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "still degraded after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_then_restart_in_every_mode() {
    for (mode, outage_status) in [
        (FailureMode::FailOpen, 200u16),
        (FailureMode::FailClosed, 503),
        (FailureMode::LocalFallback { replicas: 1 }, 200),
    ] {
        let mut server = RedisServer::start();
        let limiter = limiter(resilient(&server, "kill", mode), Rate::per_hour(10_000));
        let addr = support::serve(
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(RateLimitLayer::new(limiter.clone()).quota_headers_on_success(true)),
        )
        .await;
        let url = format!("http://{addr}/");
        let client = reqwest::Client::new();

        let healthy = burst(&client, &url, 20).await;
        assert!(
            healthy.iter().all(|(s, _)| *s == 200),
            "{mode:?}: {healthy:?}"
        );

        server.kill();
        let outage = burst(&client, &url, 60).await;
        for (status, latency) in &outage {
            assert_eq!(*status, outage_status, "{mode:?} during the outage");
            assert!(
                *latency <= TIMEOUT + Duration::from_millis(50),
                "{mode:?}: a request took {latency:?} during the outage"
            );
        }
        if outage_status == 503 {
            let res = client.get(&url).send().await.unwrap();
            assert!(res.headers().contains_key("retry-after"));
            let body: serde_json::Value = res.json().await.unwrap();
            assert_eq!(body["error"], "rate_limiter_unavailable");
        }

        server.restart();
        let recovered = wait_until_decided(&limiter, Duration::from_secs(1)).await;
        assert!(
            recovered <= Duration::from_secs(1),
            "{mode:?}: {recovered:?}"
        );
        let res = client.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(
            res.headers().contains_key("ratelimit-remaining"),
            "{mode:?}: limiting resumed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_cannot_stall_requests() {
    let server = RedisServer::start();
    let limiter = limiter(
        resilient(&server, "stall", FailureMode::FailOpen),
        Rate::per_hour(10_000),
    );
    let addr = support::serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter.clone()).quota_headers_on_success(true)),
    )
    .await;
    let url = format!("http://{addr}/");
    let client = reqwest::Client::new();
    assert!(burst(&client, &url, 10)
        .await
        .iter()
        .all(|(s, _)| *s == 200));

    server.signal("STOP");
    let stalled_at = Instant::now();
    let mut during = vec![];
    while stalled_at.elapsed() < Duration::from_secs(2) {
        during.extend(burst(&client, &url, 10).await);
    }
    server.signal("CONT");
    assert!(during.len() > 20);
    for (status, latency) in &during {
        assert_eq!(*status, 200);
        assert!(
            *latency <= TIMEOUT + Duration::from_millis(50),
            "a request took {latency:?} while Redis was stopped"
        );
    }
    wait_until_decided(&limiter, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn script_errors_are_typed_and_the_mode_applies() {
    let (logs, _guard) = support::Logs::capture(tracing::Level::INFO);

    let server = RedisServer::start();
    let limiter = limiter(
        resilient(&server, "wrongtype", FailureMode::FailClosed),
        Rate::per_hour(100),
    );
    let key = Key::new("user", "7");
    assert_eq!(
        limiter.check(&key, 1).await.unwrap().decided_by(),
        DecidedBy::Decided
    );
    // Plant a wrong-type value at every key of this principal.
    let keys = server.scan("wrongtype:*");
    assert!(!keys.is_empty());
    for k in &keys {
        let _: () = server.query(&["DEL", k]).unwrap();
        let _: () = server.query(&["SADD", k, "not-a-limiter"]).unwrap();
    }
    let d = limiter.check(&key, 1).await.unwrap();
    assert_eq!(d.decided_by(), DecidedBy::FailClosed);
    assert!(!d.is_allowed());
    // The raw store reports the typed error.
    let raw = limiter
        .store()
        .primary()
        .check(&key, &limiter.policies(), &[1])
        .await;
    assert!(
        matches!(raw, Err(tollgate::StoreError::Backend(_))),
        "{raw:?}"
    );
    let text = logs.text();
    assert!(text.contains("rate-limit store unavailable"), "{text}");
    assert!(text.contains("fail_closed"), "{text}");
}

#[tokio::test]
async fn local_fallback_still_limits() {
    let mut server = RedisServer::start();
    let store = resilient(
        &server,
        "fallback",
        FailureMode::LocalFallback { replicas: 2 },
    );
    let limiter = Limiter::builder()
        .store(store)
        .policy(
            Policy::builder("api", Rate::per_hour(10))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    server.kill();
    let key = Key::new("user", "1");
    let mut allowed = 0;
    for _ in 0..20 {
        let d = limiter.check(&key, 1).await.unwrap();
        assert_eq!(d.decided_by(), DecidedBy::Fallback);
        allowed += u32::from(d.is_allowed());
    }
    assert_eq!(allowed, 5, "10 per hour shared by 2 replicas: 5 here");
}

#[tokio::test]
async fn the_deny_cache_saves_round_trips_and_never_denies_what_redis_allows() {
    let server = RedisServer::start();
    let clock = ManualClock::new(server.now_millis());
    let make = |prefix: &str, cache: bool| {
        let redis = RedisStore::builder()
            .prefix(prefix)
            .clock(clock.clone())
            .build_with_url(&server.url())
            .unwrap();
        let mut b = ResilientStore::builder(redis, FailureMode::FailClosed)
            .timeout(Duration::from_secs(1))
            .clock(clock.clone());
        if cache {
            b = b.deny_cache(1_000);
        }
        b.build().unwrap()
    };
    let policies = [Policy::builder("hot", Rate::per_minute(5))
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
        .unwrap()];
    let key = Key::new("user", "hot");

    let mut calls = vec![];
    for (prefix, cache) in [("nocache", false), ("cache", true)] {
        let store = make(prefix, cache);
        // Load the script first, so a NOSCRIPT retry does not count.
        store.primary().peek(&key, &policies, &[1]).await.unwrap();
        let before = server.command_calls("evalsha");
        let mut allowed = 0;
        for i in 0..300u64 {
            if i % 50 == 49 {
                clock.advance(Duration::from_millis(1_500));
            }
            // Whatever Redis itself would say right now, without charging:
            let truth = store.primary().peek(&key, &policies, &[1]).await.unwrap();
            let d = store.check(&key, &policies, &[1]).await.unwrap();
            if truth.is_allowed() {
                assert!(
                    d.is_allowed(),
                    "step {i}: the cache denied what Redis allows"
                );
            }
            allowed += u32::from(d.is_allowed());
        }
        // Our own peeks are EVALSHA calls too; count only the checks' share.
        calls.push(server.command_calls("evalsha") - before - 300);
        assert_eq!(allowed, 5, "{prefix}");
        // When the window has passed, the key is allowed again at once.
        clock.advance(Duration::from_secs(60));
        assert!(store
            .check(&key, &policies, &[1])
            .await
            .unwrap()
            .is_allowed());
    }
    let (without, with) = (calls[0], calls[1]);
    eprintln!("store calls for 300 checks of a hot denied key: {without} without the deny cache, {with} with it");
    assert_eq!(without, 300);
    assert!(
        with * 10 <= without,
        "deny cache: {with} store calls vs {without} without"
    );
}

/// Two instances on one Redis, a burst over the limit, and Redis stalling (SIGSTOP) once the
/// limit is reached so that calls time out: the fallback must not hand out a fresh quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_never_hands_out_a_fresh_quota() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    let server = RedisServer::start();
    let make = || {
        let redis = RedisStore::builder()
            .prefix("failover")
            .build_with_url(&server.url())
            .unwrap();
        let store = ResilientStore::builder(redis, FailureMode::LocalFallback { replicas: 4 })
            .timeout(Duration::from_millis(25))
            .build()
            .unwrap();
        Limiter::builder()
            .store(store)
            .policy(Policy::new("api", Rate::per_hour(100)).unwrap())
            .build()
            .unwrap()
    };
    let instances = [make(), make()];
    let key = Key::new("user", "burst");
    let admitted = Arc::new(AtomicU32::new(0));
    let fallback = Arc::new(AtomicU32::new(0));
    let next = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));

    // Once the limit is reached, stall Redis 40 ms out of every 60 ms.
    let pulses = {
        let (admitted, done, pid) = (admitted.clone(), done.clone(), server.pid());
        std::thread::spawn(move || {
            let signal = |s: &str| {
                let _ = std::process::Command::new("kill")
                    .arg(format!("-{s}"))
                    .arg(pid.to_string())
                    .status();
            };
            while admitted.load(Ordering::Relaxed) < 100 && !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            while !done.load(Ordering::Relaxed) {
                signal("STOP");
                std::thread::sleep(Duration::from_millis(40));
                signal("CONT");
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let mut tasks = vec![];
    for t in 0..32 {
        let limiter = instances[t % 2].clone();
        let (key, admitted, fallback, next) = (
            key.clone(),
            admitted.clone(),
            fallback.clone(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < 1_500 {
                let d = limiter.check(&key, 1).await.unwrap();
                admitted.fetch_add(u32::from(d.is_allowed()), Ordering::Relaxed);
                fallback.fetch_add(
                    u32::from(d.decided_by() == DecidedBy::Fallback),
                    Ordering::Relaxed,
                );
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    pulses.join().unwrap();
    let (admitted, fallback) = (
        admitted.load(Ordering::Relaxed),
        fallback.load(Ordering::Relaxed),
    );
    eprintln!(
        "1500 checks on 2 instances: {admitted} admitted, {fallback} decided by the fallback"
    );
    assert!(
        fallback > 0,
        "no call timed out: the test did not exercise the fallback"
    );
    assert!(
        admitted <= 100,
        "{admitted} admitted for a shared limit of 100"
    );
    // On a loaded machine every call can time out before Redis answers, so only the
    // fallback decides; it still admits its own share (limit ÷ replicas per instance).
    assert!(admitted >= 50, "only {admitted} admitted");
}

/// The deny cache after Redis restarts without persistence: the cached denials go as soon
/// as this instance notices the new server, not after their hour-long retry_after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_clears_the_deny_cache() {
    let mut server = RedisServer::start();
    let redis = RedisStore::builder()
        .prefix("denyrestart")
        .build_with_url(&server.url())
        .unwrap();
    let store = ResilientStore::builder(redis, FailureMode::FailClosed)
        .timeout(Duration::from_millis(200))
        .circuit_breaker(1_000, Duration::from_millis(100))
        .deny_cache(1_000)
        // Longer than the test: only noticing the restart can clear the cache in time.
        .deny_cache_max_age(Duration::from_secs(600))
        .build()
        .unwrap();
    let limiter = limiter(store, Rate::per_hour(3));
    let hot = Key::new("user", "hot");
    for _ in 0..3 {
        assert!(limiter.check(&hot, 1).await.unwrap().is_allowed());
    }
    let denied = limiter.check(&hot, 1).await.unwrap();
    assert!(!denied.is_allowed());
    assert!(denied.retry_after_millis() > 60_000);
    assert_eq!(
        limiter.check(&hot, 1).await.unwrap().decided_by(),
        DecidedBy::CachedDeny
    );

    server.kill();
    server.restart();
    // Other traffic reaches the new server (the first call meets the dropped connection).
    wait_until_decided(&limiter, Duration::from_secs(2)).await;
    let after = limiter.check(&hot, 1).await.unwrap();
    assert_eq!(after.decided_by(), DecidedBy::Decided, "{after:?}");
    assert!(
        after.is_allowed(),
        "the restarted Redis holds no state for the key"
    );
}

/// State lost without a restart (FLUSHALL): cached denials last at most the max age.
#[tokio::test]
async fn cached_denials_last_at_most_their_max_age() {
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .prefix("denyflush")
        .build_with_url(&server.url())
        .unwrap();
    let store = ResilientStore::builder(redis, FailureMode::FailClosed)
        .timeout(Duration::from_millis(200))
        .deny_cache(1_000)
        .deny_cache_max_age(Duration::from_millis(300))
        .build()
        .unwrap();
    let limiter = limiter(store, Rate::per_hour(2));
    let hot = Key::new("user", "hot");
    for _ in 0..2 {
        assert!(limiter.check(&hot, 1).await.unwrap().is_allowed());
    }
    assert!(!limiter.check(&hot, 1).await.unwrap().is_allowed());
    let flushed = Instant::now();
    let _: () = server.query(&["FLUSHALL"]).unwrap();
    let cached = limiter.check(&hot, 1).await.unwrap();
    assert_eq!(cached.decided_by(), DecidedBy::CachedDeny);
    // The store's own retry_after is shown, counted down, not the cache's age.
    assert!(cached.retry_after_millis() > 60_000);
    loop {
        let d = limiter.check(&hot, 1).await.unwrap();
        if d.is_allowed() {
            break;
        }
        assert!(
            flushed.elapsed() < Duration::from_millis(300 + 100),
            "still refused {:?} after the flush",
            flushed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The first call through a store built from a URL after Redis is back succeeds (the
/// connection manager's failed reconnect is not handed back as a stale error).
#[tokio::test]
async fn the_first_call_after_a_restart_succeeds_from_a_url() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("urlrestart")
        .build_with_url(&server.url())
        .unwrap();
    let policies = [Policy::new("api", Rate::per_hour(100)).unwrap()];
    let key = Key::new("user", "1");
    store.check(&key, &policies, &[1]).await.unwrap();
    server.kill();
    for _ in 0..3 {
        assert!(store.check(&key, &policies, &[1]).await.is_err());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Long enough for every reconnect those calls started to have failed.
    tokio::time::sleep(Duration::from_millis(800)).await;
    server.restart();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = store.check(&key, &policies, &[1]).await;
    assert!(first.is_ok(), "first call after the restart: {first:?}");
}

/// Decisions resume within the breaker's cool-down + 200 ms of Redis answering again, for a
/// store from a URL and for a pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_after_a_restart_takes_at_most_the_cooldown() {
    const COOLDOWN: Duration = Duration::from_secs(1);
    for pool in [false, true] {
        let mut server = RedisServer::start();
        let builder = RedisStore::builder().prefix("recover");
        let redis = if pool {
            builder.build_with_pool(server.pool(4)).unwrap()
        } else {
            builder.build_with_url(&server.url()).unwrap()
        };
        let store = ResilientStore::builder(redis, FailureMode::FailOpen)
            .timeout(TIMEOUT)
            .circuit_breaker(3, COOLDOWN)
            .build()
            .unwrap();
        let limiter = limiter(store, Rate::per_hour(10_000));
        wait_until_decided(&limiter, Duration::from_secs(1)).await;
        server.kill();
        let key = Key::new("probe", "x");
        while !limiter.store().is_circuit_open() {
            limiter.check(&key, 1).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.restart();
        let took = wait_until_decided(&limiter, Duration::from_secs(5)).await;
        eprintln!(
            "{}: decisions resumed {took:?} after Redis answered PING",
            if pool { "pool" } else { "url" }
        );
        assert!(
            took <= COOLDOWN + Duration::from_millis(200),
            "pool {pool}: {took:?}"
        );
    }
}
