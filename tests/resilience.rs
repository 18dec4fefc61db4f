//! When Redis fails: each failure mode under a real SIGKILL, a SIGSTOP stall and script
//! errors, through a real axum app; the local fallback really limits; the deny cache saves
//! round trips and never denies what Redis would allow.

mod common;
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tollgate::clock::ManualClock;
use tollgate::key::{Global, Key};
use tollgate::store::{FailureMode, RedisStore, ResilientStore, Store};
use tollgate::{Algorithm, Limiter, Outcome, Policy, Rate, RateLimitLayer};

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
        if d.outcome() == Outcome::Decided {
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
        let addr = common::serve(
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(RateLimitLayer::new(limiter.clone())),
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
    let addr = common::serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter.clone())),
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

/// Captures log lines for the test.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn script_errors_are_typed_and_the_mode_applies() {
    let logs = Logs::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = RedisServer::start();
    let limiter = limiter(
        resilient(&server, "wrongtype", FailureMode::FailClosed),
        Rate::per_hour(100),
    );
    let key = Key::new("user", "7");
    assert_eq!(
        limiter.check(&key, 1).await.unwrap().outcome(),
        Outcome::Decided
    );
    // Plant a wrong-type value at every key of this principal.
    let keys = server.scan("wrongtype:*");
    assert!(!keys.is_empty());
    for k in &keys {
        let _: () = server.query(&["DEL", k]).unwrap();
        let _: () = server.query(&["SADD", k, "not-a-limiter"]).unwrap();
    }
    let d = limiter.check(&key, 1).await.unwrap();
    assert_eq!(d.outcome(), Outcome::FailClosed);
    assert!(!d.is_allowed());
    // The raw store reports the typed error.
    let raw = limiter
        .store()
        .primary()
        .check(&key, limiter.policies(), &[1])
        .await;
    assert!(
        matches!(raw, Err(tollgate::StoreError::Backend(_))),
        "{raw:?}"
    );
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
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
        assert_eq!(d.outcome(), Outcome::Fallback);
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
        b.build()
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
