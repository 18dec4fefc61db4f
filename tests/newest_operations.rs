//! The newest operations as users and attackers reach them: in-flight slots,
//! reserve/settle, overrides and resets on every store, and the `ResilientStore` around
//! them (give-backs of requests a failure mode admitted, the local fallback's share), through
//! the direct API, HTTP, gRPC and the login guard.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tollgate::error::StoreError;
use tollgate::key::{Global, Key};
use tollgate::route::{ActualCost, Meter, Route};
use tollgate::store::{
    ApplyFuture, BoxFuture, FailureMode, MemoryStore, Op, OverrideStore, ResilientStore, Store,
    StoreExt,
};
use tollgate::{Algorithm, DecidedBy, Decision, Limiter, Override, Policy, Rate, RateLimitLayer};

/// A Redis store at `url` under the prefix these tests share.
fn ops_store(url: &str) -> tollgate::store::RedisStore {
    tollgate::store::RedisStore::builder()
        .prefix("ops")
        .build_with_url(url)
        .unwrap()
}

/// A Redis store at `url` whose calls may take up to half a second (a home and its region).
fn slow_store(url: &str) -> tollgate::store::RedisStore {
    tollgate::store::RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .build_with_url(url)
        .unwrap()
}

/// A store that fails every call while `down` is set.
#[derive(Debug, Clone)]
struct Flaky<S> {
    inner: S,
    down: Arc<AtomicBool>,
}

impl<S> Flaky<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            down: Arc::default(),
        }
    }
    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }
}

impl<S: Store + Clone> Store for Flaky<S> {
    type CheckFuture = BoxFuture<Result<Decision, StoreError>>;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        if self.is_down() {
            return Box::pin(std::future::ready(Err(StoreError::Timeout)));
        }
        Box::pin(self.inner.check(key, policies, costs))
    }

    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if self.is_down() {
            return Box::pin(std::future::ready(Err(StoreError::Timeout)));
        }
        self.inner.apply(key, policies, op)
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        self.inner.override_store()
    }

    fn now_millis(&self) -> u64 {
        self.inner.now_millis()
    }

    fn name(&self) -> &'static str {
        "flaky"
    }

    fn generation(&self) -> u64 {
        self.inner.generation()
    }
}

/// Units used of `policy` per the store's own state (a zero-cost look).
async fn used<S: Store>(store: &S, key: &Key, policy: &Policy) -> u64 {
    let d = store
        .peek(key, std::slice::from_ref(policy), &[0])
        .await
        .unwrap();
    policy.capacity() - d.remaining()
}

fn resilient(primary: Flaky<MemoryStore>, mode: FailureMode) -> ResilientStore<Flaky<MemoryStore>> {
    ResilientStore::builder(primary, mode)
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap()
}

/// A reservation admitted while the store was down charged the store nothing; settling it
/// after the store is back must not give the store back units it never took.
async fn degraded_reservation_settled_after_recovery(mode: FailureMode) {
    let primary = Flaky::new(MemoryStore::new());
    let store = resilient(primary.clone(), mode);
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(tokens.clone())
        .build()
        .unwrap();
    let key = Key::new("tenant", "acme");

    // Healthy: 900 used, charged to the shared store.
    assert!(limiter.check(&key, 900).await.unwrap().is_allowed());
    assert_eq!(used(&primary.inner, &key, &tokens).await, 900);

    // Outage: a reservation of 100 is admitted by the failure mode.
    primary.set_down(true);
    let r = limiter.reserve(&key, 100).await.unwrap();
    assert!(r.decision().is_allowed(), "{mode:?}: admitted while down");
    assert_ne!(r.decision().decided_by(), DecidedBy::Decided);

    // Back: the reservation is settled at 0.
    primary.set_down(false);
    r.settle(0).await.unwrap();
    assert_eq!(
        used(&primary.inner, &key, &tokens).await,
        900,
        "{mode:?}: the shared store refunded units of a reservation it never charged"
    );
}

#[tokio::test]
async fn fail_open_reservation_settled_after_recovery_refunds_nothing() {
    degraded_reservation_settled_after_recovery(FailureMode::FailOpen).await;
}

#[tokio::test]
async fn fallback_reservation_settled_after_recovery_refunds_nothing() {
    degraded_reservation_settled_after_recovery(FailureMode::LocalFallback { replicas: 1 }).await;
}

/// The same through Reservation::refund.
#[tokio::test]
async fn fail_open_reservation_refunded_after_recovery_refunds_nothing() {
    let primary = Flaky::new(MemoryStore::new());
    let store = resilient(primary.clone(), FailureMode::FailOpen);
    let tokens = Policy::new("tokens", Rate::per_minute(10)).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(tokens.clone())
        .build()
        .unwrap();
    let key = Key::new("tenant", "acme");
    for _ in 0..10 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    primary.set_down(true);
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(limiter.reserve(&key, 1).await.unwrap());
    }
    primary.set_down(false);
    for r in held {
        r.refund().await.unwrap();
    }
    // The key used its 10; it must still be refused.
    assert_eq!(
        used(&primary.inner, &key, &tokens).await,
        10,
        "refunds of fail-open reservations"
    );
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
}

/// Through the layer over HTTP: a metered request admitted fail-open and settled (from the
/// ActualCost extension) after the store is back.
#[tokio::test]
async fn fail_open_layer_settlement_after_recovery_refunds_nothing() {
    let primary = Flaky::new(MemoryStore::new());
    let store = resilient(primary.clone(), FailureMode::FailOpen);
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .route(
            "POST /gen",
            Route::new().metered(tokens.clone(), Meter::fixed(500)),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let p2 = primary.clone();
    let app = Router::new()
        .route(
            "/gen",
            post(move || {
                let p2 = p2.clone();
                async move {
                    // The store comes back while the request runs.
                    p2.set_down(false);
                    let mut res = "ok".into_response();
                    res.extensions_mut().insert(ActualCost::new(0));
                    res
                }
            }),
        )
        .layer(RateLimitLayer::new(limiter.clone()));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let key = Key::global("all");
    assert!(limiter.check(&key, 0).await.is_ok());
    // 800 used while healthy: charge them via the direct API of the same default key.
    let res = client
        .post(format!("http://{addr}/gen"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // healthy request: 500 reserved, settled at 0 -> nothing used.
    let base = used(&primary.inner, &key, &tokens).await;
    assert_eq!(base, 0);
    // Charge 900 directly to the store, as other instances would.
    primary
        .inner
        .check(&key, std::slice::from_ref(&tokens), &[900])
        .await
        .unwrap();
    primary.set_down(true);
    let res = client
        .post(format!("http://{addr}/gen"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        used(&primary.inner, &key, &tokens).await,
        900,
        "a fail-open request's settlement refunded units others used"
    );
}

/// A metered route settled from its stream: a response whose body is empty was sent to its
/// end with nothing counted, so it settles at 0 (as a one-byte body settles at 1).
#[tokio::test]
async fn empty_streamed_body_settles_at_what_was_counted() {
    let store = MemoryStore::new();
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let route = || {
        Route::new().metered(
            tokens.clone(),
            Meter::fixed(100).settle_from_stream(|f: &bytes::Bytes| f.len() as u64),
        )
    };
    let limiter = Limiter::builder()
        .store(store.clone())
        .route("POST /one", route())
        .route("POST /empty", route())
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/one", post(|| async { "x" }))
        .route("/empty", post(|| async { "" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let key = Key::global("all");

    let res = client
        .post(format!("http://{addr}/one"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap(), "x");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(used(&store, &key, &tokens).await, 1, "one byte counted");

    let res = client
        .post(format!("http://{addr}/empty"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        used(&store, &key, &tokens).await,
        1,
        "an empty body sent to its end counted nothing, yet the estimate stayed charged"
    );
}

/// An override of an in-flight policy's limit: the key may hold that many slots.
async fn in_flight_override<S: Store + Clone>(store: S, tag: &str) {
    let running = Policy::in_flight("running", 1).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(running)
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("ovr-{tag}"));
    limiter
        .set_override(&key, Override::new("running", 3))
        .await
        .unwrap();
    let mut held = Vec::new();
    for i in 0..3 {
        let p = limiter.acquire(&key).await.unwrap();
        assert!(p.is_allowed(), "{tag}: slot {i} of 3 under the override");
        held.push(p);
    }
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "{tag}: a 4th"
    );
    // Lower it again: held slots stay; new ones refused until they end.
    limiter.remove_override(&key, "running").await.unwrap();
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "{tag}: back at 1"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let p = limiter.acquire(&key).await.unwrap();
    assert!(p.is_allowed(), "{tag}: every slot came back");
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "{tag}: one at a time again"
    );
}

#[tokio::test]
async fn in_flight_override_memory() {
    in_flight_override(MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn in_flight_override_redis() {
    let server = support::RedisServer::start();
    let store = ops_store(&server.url());
    in_flight_override(store, "redis").await;
}

/// A reservation holding an in-flight slot: the slot comes back on settle, on drop, and a
/// reservation refused by the rate takes no slot.
async fn reservation_slots<S: Store + Clone>(store: S, tag: &str) {
    let tokens = Policy::new("tokens", Rate::per_minute(100)).unwrap();
    let running = Policy::in_flight("running", 1).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .default_route(
            Route::new()
                .policy(running)
                .metered(tokens, Meter::fixed(1)),
        )
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("rs-{tag}"));
    let r = limiter.reserve(&key, 60).await.unwrap();
    assert!(r.decision().is_allowed());
    let r2 = limiter.reserve(&key, 1).await.unwrap();
    assert!(!r2.decision().is_allowed(), "{tag}: one in flight");
    drop(r2);
    r.settle(10).await.unwrap();
    let r = limiter.reserve(&key, 80).await.unwrap();
    assert!(
        r.decision().is_allowed(),
        "{tag}: slot back after settle; 90 left"
    );
    drop(r);
    // Refused by the rate (only 10 left): takes no slot.
    let r = limiter.reserve(&key, 50).await.unwrap();
    assert!(!r.decision().is_allowed(), "{tag}: refused by the rate");
    let ok = limiter.reserve(&key, 5).await.unwrap();
    assert!(
        ok.decision().is_allowed(),
        "{tag}: the refused one took no slot"
    );
}

#[tokio::test]
async fn reservation_slots_memory() {
    reservation_slots(MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn reservation_slots_redis() {
    let server = support::RedisServer::start();
    let store = ops_store(&server.url());
    reservation_slots(store, "redis").await;
}

/// Redis slots: a short lease is refreshed while held; a reset frees the slots; the
/// pre-reset permit's refresher and release do not resurrect or free new slots.
#[tokio::test]
async fn redis_in_flight_lease_reset_and_refresh() {
    let server = support::RedisServer::start();
    let store = ops_store(&server.url());
    let running = Policy::builder("running", Rate::new(2, Duration::from_millis(300)))
        .algorithm(Algorithm::InFlight)
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(running)
        .build()
        .unwrap();
    let key = Key::new("tenant", "lease");
    let a = limiter.acquire(&key).await.unwrap();
    let b = limiter.acquire(&key).await.unwrap();
    assert!(a.is_allowed() && b.is_allowed());
    // Held for several leases: the refresher keeps them.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "refreshed slots still held"
    );
    limiter.reset(&key).await.unwrap();
    let c = limiter.acquire(&key).await.unwrap();
    let d = limiter.acquire(&key).await.unwrap();
    assert!(c.is_allowed() && d.is_allowed(), "reset freed both");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "2 held after reset, refreshers"
    );
    drop(a);
    drop(b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "pre-reset permits freed slots of post-reset requests"
    );
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let e = limiter.acquire(&key).await.unwrap();
    assert!(e.is_allowed());
    drop((d, e));
}

/// The same on a real Redis behind a proxy that cuts the link (a partition), then heals.
#[tokio::test]
async fn fail_open_reservation_settled_after_partition_redis() {
    let server = support::RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port()).await;
    let redis = ops_store(&proxy.url());
    let direct = ops_store(&server.url());
    let store = ResilientStore::builder(redis, FailureMode::FailOpen)
        .timeout(Duration::from_millis(500))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(tokens.clone())
        .build()
        .unwrap();
    let key = Key::new("tenant", "acme");
    assert!(limiter.check(&key, 900).await.unwrap().is_allowed());
    assert_eq!(used(&direct, &key, &tokens).await, 900);
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = limiter.reserve(&key, 100).await.unwrap();
    assert_eq!(r.decision().decided_by(), DecidedBy::FailOpen);
    proxy.heal();
    // Wait until the limiter reaches Redis again.
    let mut back = false;
    for _ in 0..100 {
        if limiter
            .peek(&key)
            .await
            .map(|d| d.decided_by() == DecidedBy::Decided)
            .unwrap_or(false)
        {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back, "Redis reachable again");
    r.settle(0).await.unwrap();
    assert_eq!(
        used(&direct, &key, &tokens).await,
        900,
        "Redis refunded 100 units of a reservation admitted fail-open"
    );
}

/// A counting rule (only failures count) on a request the local fallback admitted during an
/// outage: its success refunds the shared store, which never charged it.
#[tokio::test]
async fn fallback_admitted_request_refunded_by_count_rule_after_recovery() {
    use tollgate::route::CountWhen;
    let primary = Flaky::new(MemoryStore::new());
    let store = resilient(primary.clone(), FailureMode::LocalFallback { replicas: 1 });
    let attempts = Policy::new("attempts", Rate::per_minute(5)).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .default_route(
            Route::new()
                .policy(attempts.clone())
                .count_when(CountWhen::failures()),
        )
        .extractor(Global::new())
        .build()
        .unwrap();
    let p2 = primary.clone();
    let app = Router::new()
        .route(
            "/fail",
            get(|| async { (http::StatusCode::UNAUTHORIZED, "no") }),
        )
        .route(
            "/ok",
            get(move || {
                let p2 = p2.clone();
                async move {
                    p2.set_down(false);
                    "yes"
                }
            }),
        )
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let key = Key::global("all");
    for _ in 0..4 {
        let s = client
            .get(format!("http://{addr}/fail"))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(s, 401);
    }
    assert_eq!(used(&primary.inner, &key, &attempts).await, 4);
    // Outage: a successful request admitted by the fallback, the store back before its head.
    primary.set_down(true);
    let s = client
        .get(format!("http://{addr}/ok"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(s, 200);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        used(&primary.inner, &key, &attempts).await,
        4,
        "the store lost one of its four counted failures"
    );
}

/// gRPC: a server-streaming call (health Watch) holds its in-flight slot while its stream is
/// open; a second is RESOURCE_EXHAUSTED; when the client drops the stream the slot comes back.
#[tokio::test]
async fn grpc_stream_holds_in_flight_slot_until_client_drops_it() {
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Endpoint, Server};
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let limiter = Limiter::builder()
        .policy(Policy::in_flight("watchers", 1).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        Server::builder()
            .layer(RateLimitLayer::new(limiter))
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = HealthClient::new(channel);
    let req = || HealthCheckRequest {
        service: String::new(),
    };
    let mut first = c.watch(req()).await.expect("first watch").into_inner();
    assert!(first.message().await.unwrap().is_some());
    let status = c.watch(req()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    // A unary call on the same key while the stream is open: also refused.
    assert_eq!(
        c.check(req()).await.unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );
    drop(first);
    let mut ok = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if c.check(req()).await.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "the dropped stream's slot came back");
    // Unary calls end: their slots come back each time.
    for _ in 0..5 {
        c.check(req()).await.expect("unary calls one after another");
    }
}

/// A leased rate policy beside an in-flight one: requests refused for want of a slot are not
/// charged to the rate (all or nothing), so one instance gets exactly the limit in a window.
async fn leased_mixed_all_or_nothing<S: tollgate::store::leased::LeaseBackend + Clone>(
    ledger: S,
    tag: &str,
) {
    use tollgate::clock::ManualClock;
    use tollgate::store::leased::LeasedStore;
    for a in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let clock = ManualClock::new(1_796_205_600_000);
        let store = LeasedStore::builder(ledger.clone())
            .clock(clock.clone())
            .lease_time(Duration::from_millis(250))
            .build()
            .unwrap();
        let rate = Policy::builder(format!("rate-{a}"), Rate::new(100, Duration::from_secs(60)))
            .algorithm(a)
            .build()
            .unwrap();
        let limiter = Limiter::builder()
            .store(store)
            .policy(rate)
            .policy(Policy::in_flight(format!("running-{a}"), 1).unwrap())
            .build()
            .unwrap();
        let key = Key::new("tenant", format!("mixed-{tag}-{a}"));
        let held = limiter.acquire(&key).await.unwrap();
        assert!(held.is_allowed());
        let mut refused = 0;
        for _ in 0..300 {
            let p = limiter.acquire(&key).await.unwrap();
            if !p.is_allowed() {
                refused += 1;
            }
        }
        assert_eq!(refused, 300, "{tag} {a}");
        drop(held);
        tokio::task::yield_now().await;
        let mut admitted = 1;
        for _ in 0..200 {
            let p = limiter.acquire(&key).await.unwrap();
            if p.is_allowed() {
                admitted += 1;
            }
            drop(p);
            tokio::task::yield_now().await;
        }
        assert_eq!(admitted, 100, "{tag} {a}: admitted in one window");
    }
}

#[tokio::test]
async fn leased_mixed_all_or_nothing_memory_ledger() {
    leased_mixed_all_or_nothing(tollgate::store::leased::MemoryLedger::new(), "mem").await;
}

#[tokio::test]
async fn leased_mixed_all_or_nothing_redis() {
    let server = support::RedisServer::start();
    let clock = tollgate::clock::ManualClock::new(1_796_205_600_000);
    let store = tollgate::store::RedisStore::builder()
        .prefix("ops")
        .clock(clock)
        .build_with_url(&server.url())
        .unwrap();
    leased_mixed_all_or_nothing(store, "redis").await;
}

/// The login guard: an attempt checked before `unlock_user` that succeeds after it must
/// not refund a failure counted since the unlock (a reset voids the give-backs of charges
/// made before it, as the limiter's reservations and layer do).
#[tokio::test]
async fn login_success_after_unlock_does_not_erase_a_later_failure() {
    use tollgate::login::LoginGuard;
    let guard = LoginGuard::builder()
        .user_rate(Rate::per_hour(2))
        .build()
        .unwrap();
    let ip = |n: u8| Key::new("ip", format!("192.0.2.{n}"));
    // Alice's own attempt, its password still being verified.
    let alice = guard.attempt_with_ip_key(ip(1), "alice");
    assert!(guard.check(&alice).await.unwrap().is_allowed());
    // An operator unlocks alice meanwhile.
    guard.unlock_user("alice").await.unwrap();
    // An attacker spends the username limit: two failures, then locked.
    for n in 2..4 {
        let a = guard.attempt_with_ip_key(ip(n), "alice");
        assert!(guard.check(&a).await.unwrap().is_allowed());
        guard.record_failure(&a).await.unwrap();
    }
    let probe = guard.attempt_with_ip_key(ip(9), "alice");
    assert!(
        !guard.check(&probe).await.unwrap().is_allowed(),
        "locked after 2 failures"
    );
    // Alice's attempt succeeds.
    guard.record_success(&alice).await.unwrap();
    let next = guard.attempt_with_ip_key(ip(10), "alice");
    assert!(
        !guard.check(&next).await.unwrap().is_allowed(),
        "the attacker's counted failure was refunded by a success charged before the unlock"
    );
}

/// The login guard on a fail-open store: an attempt admitted during an outage and
/// recorded as a success after it refunds units of other attempts.
#[tokio::test]
async fn login_success_recorded_after_outage_refunds_nothing() {
    use tollgate::login::LoginGuard;
    let primary = Flaky::new(MemoryStore::new());
    let store = resilient(primary.clone(), FailureMode::FailOpen);
    // Failing open on purpose (a guard fails closed on such a store unless told).
    let guard = LoginGuard::builder()
        .store(store)
        .failure_mode(FailureMode::FailOpen)
        .user_rate(Rate::per_hour(2))
        .build()
        .unwrap();
    let ip = |n: u8| Key::new("ip", format!("192.0.2.{n}"));
    for n in 2..4 {
        let a = guard.attempt_with_ip_key(ip(n), "alice");
        assert!(guard.check(&a).await.unwrap().is_allowed());
        guard.record_failure(&a).await.unwrap();
    }
    primary.set_down(true);
    let alice = guard.attempt_with_ip_key(ip(1), "alice");
    assert!(guard.check(&alice).await.unwrap().is_allowed(), "fail open");
    primary.set_down(false);
    guard.record_success(&alice).await.unwrap();
    let next = guard.attempt_with_ip_key(ip(10), "alice");
    assert!(
        !guard.check(&next).await.unwrap().is_allowed(),
        "a success admitted fail-open refunded one of the two counted failures"
    );
}

/// LocalFallback with an in-flight policy: the fallback is kept in step with what the store
/// admitted, so an outage starts from the requests this instance has running.
async fn fallback_in_flight_follows_running<S: Store + Clone>(primary: Flaky<S>, tag: &str) {
    let store =
        ResilientStore::builder(primary.clone(), FailureMode::LocalFallback { replicas: 2 })
            .circuit_breaker(1_000, Duration::from_secs(1))
            .build()
            .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::in_flight("running", 4).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("fb-{tag}"));
    // Healthy: four run at once on this instance; two end.
    let mut held = Vec::new();
    for _ in 0..4 {
        let p = limiter.acquire(&key).await.unwrap();
        assert!(p.is_allowed());
        assert_eq!(p.decided_by(), DecidedBy::Decided);
        held.push(p);
    }
    held.truncate(2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Outage: this instance already runs 2, its share (4 / 2 replicas).
    primary.set_down(true);
    let p = limiter.acquire(&key).await.unwrap();
    assert_eq!(p.decided_by(), DecidedBy::Fallback);
    assert!(
        !p.is_allowed(),
        "{tag}: the fallback admitted a third request while two run (share 2)"
    );
}

#[tokio::test]
async fn fallback_in_flight_follows_running_redis() {
    let server = support::RedisServer::start();
    let redis = ops_store(&server.url());
    fallback_in_flight_follows_running(Flaky::new(redis), "redis").await;
}

#[tokio::test]
async fn fallback_in_flight_follows_running_memory() {
    fallback_in_flight_follows_running(Flaky::new(MemoryStore::new()), "memory").await;
}

/// LocalFallback with an in-flight policy on a memory primary: requests that ran and ended
/// while the store was healthy leave no slot held in the fallback.
#[tokio::test]
async fn fallback_in_flight_leaks_no_slots_memory_primary() {
    let primary = Flaky::new(MemoryStore::new());
    let store =
        ResilientStore::builder(primary.clone(), FailureMode::LocalFallback { replicas: 1 })
            .circuit_breaker(1_000, Duration::from_secs(1))
            .build()
            .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::in_flight("running", 2).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", "leak");
    for _ in 0..5 {
        let p = limiter.acquire(&key).await.unwrap();
        assert!(p.is_allowed());
        drop(p);
    }
    primary.set_down(true);
    let p = limiter.acquire(&key).await.unwrap();
    assert_eq!(p.decided_by(), DecidedBy::Fallback);
    assert!(p.is_allowed(), "nothing runs, yet the fallback refuses");
}

/// Control: two run (taken while healthy, none ended) — the fallback refuses a third.
#[tokio::test]
async fn fallback_in_flight_control_two_running_redis() {
    let server = support::RedisServer::start();
    let redis = ops_store(&server.url());
    let primary = Flaky::new(redis);
    let store =
        ResilientStore::builder(primary.clone(), FailureMode::LocalFallback { replicas: 2 })
            .circuit_breaker(1_000, Duration::from_secs(1))
            .build()
            .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::in_flight("running", 4).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", "fb-control");
    let a = limiter.acquire(&key).await.unwrap();
    let b = limiter.acquire(&key).await.unwrap();
    assert!(a.is_allowed() && b.is_allowed());
    primary.set_down(true);
    let p = limiter.acquire(&key).await.unwrap();
    assert_eq!(p.decided_by(), DecidedBy::Fallback);
    assert!(!p.is_allowed(), "control: two run, share 2");
    drop((a, b));
}

/// `Reservation::settle` is documented cancel-safe: "a settlement whose future is dropped
/// before it answers still applies, once". Here the future is dropped before its first poll.
#[tokio::test]
async fn settle_dropped_before_first_poll_still_applies() {
    let store = MemoryStore::new();
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(tokens.clone())
        .build()
        .unwrap();
    let key = Key::new("tenant", "unpolled");
    let r = limiter.reserve(&key, 400).await.unwrap();
    drop(r.settle(150));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        used(&store, &key, &tokens).await,
        150,
        "settle dropped unpolled"
    );
}

#[tokio::test]
async fn refund_dropped_before_first_poll_still_applies() {
    let store = MemoryStore::new();
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(tokens.clone())
        .build()
        .unwrap();
    let key = Key::new("tenant", "unpolled-refund");
    let r = limiter.reserve(&key, 400).await.unwrap();
    drop(r.refund());
    assert!(limiter.check(&key, 100).await.unwrap().is_allowed());
    drop(limiter.refund(&key, 100));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        used(&store, &key, &tokens).await,
        0,
        "refunds dropped unpolled"
    );
}

#[tokio::test]
async fn in_flight_override_and_reservation_slots_cluster() {
    let cluster = support::RedisCluster::start();
    let store = tollgate::store::RedisClusterStore::builder()
        .prefix("ops")
        .build_cluster_with_urls(cluster.urls())
        .unwrap();
    in_flight_override(store.clone(), "cluster").await;
    reservation_slots(store, "cluster").await;
}

#[tokio::test]
async fn in_flight_override_and_reservation_slots_leased() {
    use tollgate::store::leased::{LeasedStore, MemoryLedger};
    let store = LeasedStore::new(MemoryLedger::new());
    in_flight_override(store.clone(), "leased-mem").await;
    reservation_slots(store, "leased-mem").await;
    let server = support::RedisServer::start();
    let redis = ops_store(&server.url());
    let store = LeasedStore::new(redis);
    in_flight_override(store.clone(), "leased-redis").await;
    reservation_slots(store, "leased-redis").await;
}

/// A reset frees held slots on a leased store (in-flight decided by the wrapped store), and
/// permits taken before it free nothing of the requests admitted after.
async fn reset_frees_slots<S: Store + Clone>(store: S, tag: &str) {
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::new("rate", Rate::per_minute(1_000)).unwrap())
        .policy(Policy::in_flight("running", 2).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("reset-{tag}"));
    let a = limiter.acquire(&key).await.unwrap();
    let b = limiter.acquire(&key).await.unwrap();
    assert!(a.is_allowed() && b.is_allowed(), "{tag}");
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "{tag}: full"
    );
    limiter.reset(&key).await.unwrap();
    let c = limiter.acquire(&key).await.unwrap();
    let d = limiter.acquire(&key).await.unwrap();
    assert!(c.is_allowed() && d.is_allowed(), "{tag}: reset freed both");
    drop((a, b));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "{tag}: permits from before the reset freed slots of later requests"
    );
    drop((c, d));
}

#[tokio::test]
async fn reset_frees_slots_all_stores() {
    use tollgate::store::leased::{LeasedStore, MemoryLedger};
    reset_frees_slots(MemoryStore::new(), "memory").await;
    reset_frees_slots(LeasedStore::new(MemoryLedger::new()), "leased-mem").await;
    let server = support::RedisServer::start();
    let redis = ops_store(&server.url());
    reset_frees_slots(redis.clone(), "redis").await;
    reset_frees_slots(LeasedStore::new(redis.clone()), "leased-redis").await;
    let resilient = ResilientStore::builder(redis, FailureMode::FailClosed)
        .deny_cache(100)
        .build()
        .unwrap();
    reset_frees_slots(resilient, "resilient-redis").await;
}

/// A streamed body of the given frames, never saying it has ended until polled past its last
/// frame (as a body forwarded from an upstream is, and as `StreamBody` is).
struct Frames(std::collections::VecDeque<http_body::Frame<bytes::Bytes>>);

impl Frames {
    /// `n` frames of `data: x\n` (8 bytes each).
    fn events(n: usize) -> Self {
        Self(
            (0..n)
                .map(|_| http_body::Frame::data(bytes::Bytes::from_static(b"data: x\n")))
                .collect(),
        )
    }
}

impl http_body::Body for Frames {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// A streamed, metered response with a Content-Length (a gateway forwarding an upstream's
/// answer) sent to its end: settled at what was counted, as without the header.
#[tokio::test]
async fn streamed_body_with_content_length_settles_at_what_was_counted() {
    let store = MemoryStore::new();
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let count = |f: &bytes::Bytes| {
        f.split(|&b| b == b'\n')
            .filter(|l| l.starts_with(b"data:"))
            .count() as u64
    };
    let route =
        || Route::new().metered(tokens.clone(), Meter::fixed(100).settle_from_stream(count));
    let limiter = Limiter::builder()
        .store(store.clone())
        .route("GET /chunked", route())
        .route("GET /sized", route())
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/chunked",
            get(|| async { axum::body::Body::new(Frames::events(3)) }),
        )
        .route(
            "/sized",
            get(|| async {
                (
                    [("content-length", "24")],
                    axum::body::Body::new(Frames::events(3)),
                )
            }),
        )
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let key = Key::global("all");

    let res = client
        .get(format!("http://{addr}/chunked"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.text().await.unwrap().matches("data:").count(), 3);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(used(&store, &key, &tokens).await, 3, "chunked: 3 counted");

    let res = client
        .get(format!("http://{addr}/sized"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["content-length"], "24");
    assert_eq!(res.text().await.unwrap().matches("data:").count(), 3);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        used(&store, &key, &tokens).await,
        6,
        "sized: 3 counted, all 24 bytes sent, yet settled as if cut short"
    );
}

/// Over HTTP, on the memory store: requests hold in-flight slots in a slow handler; the
/// admin API raises the key's in-flight limit by override, resets the key (freeing every
/// slot), and the requests admitted before the reset free nothing when they end.
#[tokio::test]
async fn admin_override_and_reset_of_in_flight_over_http() {
    use tollgate::admin::Admin;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let limiter = Limiter::builder()
        .policy(Policy::in_flight("running", 1).unwrap())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    let g = Arc::clone(&gate);
    let app = Router::new()
        .route(
            "/work",
            get(move || {
                let g = Arc::clone(&g);
                async move {
                    g.acquire().await.unwrap().forget();
                    "done"
                }
            }),
        )
        .layer(RateLimitLayer::new(limiter.clone()))
        .nest("/admin", Admin::new(limiter.clone()).router());
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let work = || {
        client
            .get(format!("http://{addr}/work"))
            .header("x-tenant", "acme")
            .send()
    };
    let status_now = |c: &reqwest::Client| {
        let c = c.clone();
        async move {
            let res = tokio::time::timeout(
                Duration::from_millis(300),
                c.get(format!("http://{addr}/work"))
                    .header("x-tenant", "acme")
                    .send(),
            )
            .await;
            match res {
                Ok(Ok(r)) => r.status().as_u16(),
                _ => 0, // still running (admitted)
            }
        }
    };
    let put = client
        .put(format!(
            "http://{addr}/admin/overrides/tenant/acme?policy=running&limit=2"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200, "{}", put.text().await.unwrap());
    let a = tokio::spawn(work());
    let b = tokio::spawn(work());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        status_now(&client).await,
        429,
        "two run under the override of 2"
    );
    let del = client
        .delete(format!("http://{addr}/admin/keys/tenant/acme"))
        .send()
        .await
        .unwrap();
    assert!(del.status().is_success());
    let c = tokio::spawn(work());
    let d = tokio::spawn(work());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        status_now(&client).await,
        429,
        "two run again after the reset"
    );
    // Let a and b (admitted before the reset) end: 2 permits. Order of release is unknown,
    // so let exactly two handlers finish and see that the two others still count.
    gate.add_permits(2);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let finished = [
        a.is_finished(),
        b.is_finished(),
        c.is_finished(),
        d.is_finished(),
    ];
    let done = finished.iter().filter(|f| **f).count();
    assert_eq!(done, 2, "{finished:?}");
    assert_eq!(
        status_now(&client).await,
        if finished[0] && finished[1] { 429 } else { 0 },
        "finished {finished:?}: pre-reset requests ending freed slots of later ones?"
    );
    gate.add_permits(100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_in_flight_override_and_reset() {
    use tollgate::store::leased::LeasedStore;
    use tollgate::store::regions::RegionalLedger;
    let home = support::RedisServer::start();
    let local = support::RedisServer::start();
    let store = slow_store;
    let ledger = RegionalLedger::builder("eu", store(&local.url()), store(&home.url()))
        .build()
        .unwrap();
    let leased = LeasedStore::new(ledger);
    in_flight_override(leased.clone(), "regions").await;
    reset_frees_slots(leased, "regions").await;
}

/// A LeasedStore over a Redis ledger: a reservation with a large estimate settled far below
/// it is charged what it used (docs: "a metered request with a large estimate is charged
/// what it used, as on the exact stores"), so the key has its quota back. A region keeps
/// such a give-back charged, as `store::regions` says, and counts it as dropped.
async fn large_estimate_settled_low<S: Store + Clone>(store: S, tag: &str) {
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(tokens.clone())
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("large-{tag}"));
    let r = limiter.reserve(&key, 900).await.unwrap();
    assert!(r.decision().is_allowed(), "{tag}");
    r.settle(0).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = limiter.reserve(&key, 900).await.unwrap();
    assert!(
        r.decision().is_allowed(),
        "{tag}: 0 of 1000 used, yet 900 refused: {:?}",
        r.decision()
    );
    r.keep();
    // Given back no more than was charged: 900 of 1000 stand.
    let over = limiter.reserve(&key, 200).await.unwrap();
    assert!(
        !over.decision().is_allowed(),
        "{tag}: 900 of 1000 used, yet 200 more admitted: {:?}",
        over.decision()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_estimate_settled_low_leased_redis_and_regions() {
    use tollgate::store::leased::LeasedStore;
    use tollgate::store::regions::RegionalLedger;
    let home = support::RedisServer::start();
    let local = support::RedisServer::start();
    let store = slow_store;
    large_estimate_settled_low(LeasedStore::new(store(&home.url())), "leased-redis").await;
    let ledger = RegionalLedger::builder("eu", store(&local.url()), store(&home.url()))
        .build()
        .unwrap();
    large_estimate_settled_low(LeasedStore::new(ledger.clone()), "region").await;
    assert_eq!(ledger.stats().units_dropped, 0, "{:?}", ledger.stats());
}

/// Concurrent reservations settled at random costs: the store ends with exactly the sum of
/// the actual costs (a manual clock that never moves, so every refund is exact).
async fn concurrent_settles_sum_exactly<S: Store + Clone>(store: S, tag: &str) {
    for a in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let tokens = Policy::builder(
            format!("cc-{a}"),
            Rate::new(100_000, Duration::from_secs(3600)),
        )
        .algorithm(a)
        .build()
        .unwrap();
        let limiter = Limiter::builder()
            .store(store.clone())
            .policy(tokens.clone())
            .build()
            .unwrap();
        let key = Key::new("tenant", format!("cc-{tag}-{a}"));
        let mut tasks = Vec::new();
        let mut expected = 0u64;
        for i in 0..200u64 {
            let actual = (i * 7919) % 23; // 0..22, around the estimate of 10
            expected += actual;
            let limiter = limiter.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                let r = limiter.reserve(&key, 10).await.unwrap();
                assert!(r.decision().is_allowed());
                tokio::task::yield_now().await;
                r.settle(actual).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let got = used(&store, &key, &tokens).await;
        assert_eq!(got, expected, "{tag} {a}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settles_sum_exactly_all_stores() {
    use tollgate::clock::ManualClock;
    let clock = ManualClock::new(1_796_205_600_000);
    concurrent_settles_sum_exactly(
        MemoryStore::builder().clock(clock.clone()).build().unwrap(),
        "memory",
    )
    .await;
    let server = support::RedisServer::start();
    let redis = tollgate::store::RedisStore::builder()
        .prefix("ops")
        .clock(clock.clone())
        .build_with_url(&server.url())
        .unwrap();
    concurrent_settles_sum_exactly(redis, "redis").await;
    let cluster = support::RedisCluster::start();
    let c = tollgate::store::RedisClusterStore::builder()
        .prefix("ops")
        .clock(clock.clone())
        .build_cluster_with_urls(cluster.urls())
        .unwrap();
    concurrent_settles_sum_exactly(c, "cluster").await;
}

/// An override raising a key's capacity lets a reservation above the plan's capacity
/// through, and its settlement below the estimate gives the difference back.
async fn raised_override_reservation<S: Store + Clone>(store: S, tag: &str) {
    let tokens = Policy::new("tokens", Rate::per_minute(100)).unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(tokens)
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("raised-{tag}"));
    limiter
        .set_override(&key, Override::new("tokens", 1_000))
        .await
        .unwrap();
    let r = limiter.reserve(&key, 800).await.unwrap();
    assert!(
        r.decision().is_allowed(),
        "{tag}: 800 under an override of 1000"
    );
    assert_eq!(r.decision().limit(), 1_000, "{tag}");
    r.settle(100).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = limiter.reserve(&key, 800).await.unwrap();
    assert!(
        r.decision().is_allowed(),
        "{tag}: 100 used of 1000, 800 more refused: {:?}",
        r.decision()
    );
    drop(r);
    let err = limiter.reserve(&key, 1_001).await.unwrap_err();
    assert!(
        matches!(err, tollgate::CheckError::CostExceedsCapacity { .. }),
        "{tag}: {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raised_override_reservation_all_stores() {
    use tollgate::store::leased::{LeasedStore, MemoryLedger};
    use tollgate::store::regions::RegionalLedger;
    raised_override_reservation(MemoryStore::new(), "memory").await;
    raised_override_reservation(LeasedStore::new(MemoryLedger::new()), "leased-mem").await;
    let home = support::RedisServer::start();
    let local = support::RedisServer::start();
    let store = slow_store;
    raised_override_reservation(store(&home.url()), "redis").await;
    raised_override_reservation(LeasedStore::new(store(&home.url())), "leased-redis").await;
    let ledger = RegionalLedger::builder("eu", store(&local.url()), store(&home.url()))
        .build()
        .unwrap();
    raised_override_reservation(LeasedStore::new(ledger), "region").await;
}

/// `check` keeps nothing: an in-flight slot it took goes back at once, so checks one after
/// another on an in-flight policy of 1 are all allowed.
async fn sequential_checks_in_flight<S: Store + Clone>(store: S, tag: &str) {
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::new("rate", Rate::per_minute(100_000)).unwrap())
        .policy(Policy::in_flight("running", 1).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("seq-{tag}"));
    let mut refused = 0;
    for _ in 0..200 {
        if !limiter.check(&key, 1).await.unwrap().is_allowed() {
            refused += 1;
        }
    }
    assert_eq!(
        refused, 0,
        "{tag}: sequential checks refused for a slot nobody holds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequential_checks_in_flight_stores() {
    sequential_checks_in_flight(MemoryStore::new(), "memory").await;
    let server = support::RedisServer::start();
    let redis = ops_store(&server.url());
    sequential_checks_in_flight(redis.clone(), "redis").await;
    sequential_checks_in_flight(
        tollgate::store::leased::LeasedStore::new(redis),
        "leased-redis",
    )
    .await;
    let cluster = support::RedisCluster::start();
    let c = tollgate::store::RedisClusterStore::builder()
        .prefix("ops")
        .build_cluster_with_urls(cluster.urls())
        .unwrap();
    sequential_checks_in_flight(c, "cluster").await;
}

/// A store whose releases reach it late, as a release sent on another connection can reach
/// Redis after a check sent later on the first.
#[derive(Debug, Clone)]
struct LateRelease<S>(S);

impl<S: Store + Clone> Store for LateRelease<S> {
    type CheckFuture = S::CheckFuture;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        self.0.check(key, policies, costs)
    }

    fn apply(&self, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if !matches!(op, Op::Release { .. }) {
            return self.0.apply(key, policies, op);
        }
        let (inner, key, policies) = (self.0.clone(), key.clone(), policies.to_vec());
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            inner.apply(&key, &policies, op).await
        })
    }

    fn override_store(&self) -> Option<&dyn OverrideStore> {
        self.0.override_store()
    }

    fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }

    fn name(&self) -> &'static str {
        "late-release"
    }

    fn generation(&self) -> u64 {
        self.0.generation()
    }
}

/// `check` and `decide` answer only once the slot they took is back, so the caller's next
/// check finds it free even when the release reaches the store late: a release left to
/// finish on its own arrived after the next check, which was refused for a slot nobody held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_answers_after_its_slot_is_back() {
    let store = LateRelease(MemoryStore::new());
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(Policy::in_flight("running", 1).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let key = Key::new("tenant", "late");
    for i in 0..10 {
        let decision = limiter.check(&key, 1).await.unwrap();
        assert!(
            decision.is_allowed(),
            "check {i} refused for a slot nobody holds"
        );
    }
    for i in 0..10 {
        let request = http::Request::get("/").body(()).unwrap();
        let view = tollgate::key::RequestView::new(&request);
        assert!(
            limiter.decide(&view).await.is_ok(),
            "decide {i} refused for a slot nobody holds"
        );
    }
    // Dropped while its release is under way, a check still gives the slot back.
    let check = limiter.check(&key, 1);
    let _ = tokio::time::timeout(Duration::from_millis(1), check).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
}

/// In-flight leases at the small end of what a policy accepts: one shorter than the
/// shortest a renewal can keep up with is refused when built (with leases of a few ms a
/// held slot expired between renewals and the limit stopped holding); from it up, a held
/// slot stays held while its permit lives (the refresher keeps it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_in_flight_short_leases_are_refused_or_keep_the_held_slot() {
    let server = support::RedisServer::start();
    let store = ops_store(&server.url());
    let mut refused = Vec::new();
    let mut results = Vec::new();
    for lease_ms in [1u64, 8, 99, 100, 150] {
        let running = Policy::builder(
            format!("short-{lease_ms}"),
            Rate::new(1, Duration::from_millis(lease_ms)),
        )
        .algorithm(Algorithm::InFlight)
        .build();
        let running = match running {
            Ok(p) => p,
            Err(e) => {
                assert_eq!(e.field(), "window", "{e}");
                refused.push(lease_ms);
                continue;
            }
        };
        let limiter = Limiter::builder()
            .store(store.clone())
            .policy(running)
            .build()
            .unwrap();
        let key = Key::new("tenant", format!("short-{lease_ms}"));
        let held = limiter.acquire(&key).await.unwrap();
        assert!(held.is_allowed());
        let mut admitted = 0;
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let p = limiter.acquire(&key).await.unwrap();
            if p.is_allowed() {
                admitted += 1;
            }
        }
        results.push((lease_ms, admitted));
        drop(held);
    }
    assert_eq!(refused, [1, 8, 99], "leases below 100 ms are refused");
    assert!(
        results.iter().all(|&(_, a)| a == 0),
        "(lease ms, admitted of 60 while one slot was held): {results:?}"
    );
}

/// LocalFallback with rate units: the fallback learns a store-admitted charge only while its
/// share has room but takes back every give-back, so after a burst above the share it can
/// count less than what stands. The bound `store::resilient` states: during the outage that
/// follows, this instance admits at most one more share in the window.
#[tokio::test]
async fn fallback_rate_drift_is_at_most_one_share() {
    let primary = Flaky::new(MemoryStore::new());
    let store =
        ResilientStore::builder(primary.clone(), FailureMode::LocalFallback { replicas: 2 })
            .circuit_breaker(1_000, Duration::from_secs(1))
            .build()
            .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::new("units", Rate::per_hour(100)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", "drift");
    // Healthy: ten reservations of 10 (the whole limit); five settle at 0, fifty stand.
    let mut held = Vec::new();
    for _ in 0..10 {
        let r = limiter.reserve(&key, 10).await.unwrap();
        assert!(r.decision().is_allowed());
        held.push(r);
    }
    for r in held.drain(..5) {
        r.settle(0).await.unwrap();
    }
    // Outage: the share is 50 (100 / 2), all of it standing; the fallback may admit up to
    // one more share, never more.
    primary.set_down(true);
    let mut admitted = 0;
    for _ in 0..200 {
        let d = limiter.check(&key, 1).await.unwrap();
        assert_eq!(d.decided_by(), DecidedBy::Fallback);
        if d.is_allowed() {
            admitted += 1;
        }
    }
    assert!(
        admitted <= 50,
        "{admitted} admitted past what stands: more than one share"
    );
}

/// LocalFallback with an in-flight policy: a slot the fallback gave is named, so a request
/// admitted before a reset frees nothing when it ends, not the slot of one admitted since.
#[tokio::test]
async fn a_fallback_slot_taken_before_a_reset_frees_nothing() {
    let primary = Flaky::new(MemoryStore::new());
    let limiter = Limiter::builder()
        .store(resilient(
            primary.clone(),
            FailureMode::LocalFallback { replicas: 1 },
        ))
        .policy(Policy::in_flight("jobs", 1).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", "fallback-slots");
    primary.set_down(true);
    let before = limiter.acquire(&key).await.unwrap();
    assert_eq!(before.decided_by(), DecidedBy::Fallback);
    assert!(before.is_allowed());
    // The store is down: the reset fails, and still forgets the fallback's count.
    let _ = limiter.reset(&key).await;
    let since = limiter.acquire(&key).await.unwrap();
    assert!(
        since.is_allowed(),
        "the reset freed the key in the fallback"
    );
    drop(before);
    let third = limiter.acquire(&key).await.unwrap();
    assert!(
        !third.is_allowed(),
        "the request from before the reset freed the slot of the one admitted since"
    );
}

/// LocalFallback with rate units: a settlement far above its reservation is charged in full
/// while the store is down (a debt the next windows pay), as a check's extra charge is.
#[tokio::test]
async fn a_fallback_settlement_above_the_capacity_is_charged_in_full() {
    let primary = Flaky::new(MemoryStore::new());
    let limiter = Limiter::builder()
        .store(resilient(
            primary.clone(),
            FailureMode::LocalFallback { replicas: 1 },
        ))
        .policy(Policy::new("tokens", Rate::per_second(1_000)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "fallback-debt");
    primary.set_down(true);
    let r = limiter.reserve(&key, 1).await.unwrap();
    assert_eq!(r.decision().decided_by(), DecidedBy::Fallback);
    // The store is down: the settlement fails there, and the fallback charges it.
    let _ = r.settle(1_000_000).await;
    // A thousand windows of debt: two windows on, the key is still refused.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let d = limiter.check(&key, 1).await.unwrap();
    assert_eq!(d.decided_by(), DecidedBy::Fallback);
    assert!(
        !d.is_allowed(),
        "the debt above one capacity was forgiven: {d:?}"
    );
}

/// A streamed body whose last frame is its trailers ends there: hyper sends the trailers and
/// polls no further, so the body is dropped right after them. It settles at what was counted,
/// not at the estimate kept for a body cut short.
#[tokio::test]
async fn a_streamed_body_ending_with_trailers_settles_at_what_was_counted() {
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};
    let store = MemoryStore::new();
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .store(store.clone())
        .route(
            "POST /gen",
            Route::new().metered(
                tokens.clone(),
                Meter::fixed(100).settle_from_stream(|f: &bytes::Bytes| f.len() as u64),
            ),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let mut svc = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter))
        .service(tower::service_fn(|_req: http::Request<String>| async {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-done", "1".parse().unwrap());
            let frames = [
                http_body::Frame::data(bytes::Bytes::from_static(b"ab")),
                http_body::Frame::data(bytes::Bytes::from_static(b"c")),
                http_body::Frame::trailers(trailers),
            ];
            Ok::<_, std::convert::Infallible>(http::Response::new(Frames(frames.into())))
        }));
    let req = http::Request::post("/gen").body(String::new()).unwrap();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let key = Key::global("all");
    assert_eq!(
        used(&store, &key, &tokens).await,
        100,
        "the estimate, while it runs"
    );
    let mut body = res.into_body();
    for _ in 0..3 {
        let frame = body.frame().await.unwrap().unwrap();
        if frame.is_trailers() {
            break;
        }
    }
    // Dropped after its trailers, as hyper does.
    drop(body);
    assert_eq!(used(&store, &key, &tokens).await, 3, "three bytes sent");
}
