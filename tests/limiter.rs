//! The direct API decides exactly as the layer does: each feature is exercised through
//! `Limiter::check` / `peek` / `decide` and through a real axum server, with the same answers.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use reqwest::StatusCode;
use tollgate::clock::ManualClock;
use tollgate::key::{from_fn, Global, Key, RequestView};
use tollgate::route::Route;
use tollgate::store::MemoryStore;
use tollgate::{
    Algorithm, CheckError, Limiter, Policy, Rate, RateLimitLayer, Refusal, RefusalKind,
};

const T0: u64 = 1_796_205_600_000;

fn fixed(name: &str, rate: Rate) -> Policy {
    Policy::builder(name, rate)
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap()
}

fn store(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder().clock(clock.clone()).build().unwrap()
}

/// A request as the layer sees it, from `peer`, with an `x-user` header when given.
fn request(method: &str, path: &str, user: Option<&str>) -> http::Request<()> {
    let mut req = http::Request::builder().method(method).uri(path);
    if let Some(user) = user {
        req = req.header("x-user", user);
    }
    let mut req = req.body(()).unwrap();
    req.extensions_mut()
        .insert("192.0.2.10:5000".parse::<SocketAddr>().unwrap());
    req
}

fn by_user() -> impl tollgate::key::KeyExtractor {
    from_fn(|req: &RequestView<'_>| {
        req.headers()
            .get("x-user")
            .map(|v| Key::new("user", v.as_bytes()))
    })
}

/// The statuses a real axum server answers for `requests`, with `limiter` as its layer.
async fn over_http(limiter: Limiter, requests: &[(&str, &str, Option<&str>)]) -> Vec<u16> {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/search", get(|| async { "results" }))
        .route("/login", post(|| async { "welcome" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let mut out = vec![];
    for (method, path, user) in requests {
        let mut req = client.request(method.parse().unwrap(), format!("http://{addr}{path}"));
        if let Some(user) = user {
            req = req.header("x-user", *user);
        }
        out.push(req.send().await.unwrap().status().as_u16());
    }
    out
}

/// The statuses `Limiter::decide` gives for the same requests.
async fn directly(limiter: Limiter, requests: &[(&str, &str, Option<&str>)]) -> Vec<u16> {
    let mut out = vec![];
    for (method, path, user) in requests {
        let req = request(method, path, *user);
        out.push(match limiter.decide(&RequestView::new(&req)).await {
            Ok(_) => 200,
            Err(refusal) => refusal.status().as_u16(),
        });
    }
    out
}

/// Runs `requests` through a fresh limiter from `make` both ways and returns the statuses,
/// asserting that they agree.
async fn parity(make: impl Fn() -> Limiter, requests: &[(&str, &str, Option<&str>)]) -> Vec<u16> {
    let http = over_http(make(), requests).await;
    let direct = directly(make(), requests).await;
    assert_eq!(http, direct, "the layer and Limiter::decide disagree");
    http
}

#[tokio::test]
async fn penalties_hold_on_the_direct_path() {
    let clock = ManualClock::new(T0);
    let policy = Policy::builder("strict", Rate::per_second(1))
        .algorithm(Algorithm::FixedWindow)
        .penalty(Duration::from_secs(60))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store(&clock))
        .policy(policy)
        .build()
        .unwrap();
    let key = Key::new("user", "u1");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    clock.advance(Duration::from_secs(2));
    // The window has passed, but the penalty started by the denial has 58 s to run.
    let blocked = limiter.check(&key, 1).await.unwrap();
    assert!(!blocked.is_allowed());
    assert_eq!(blocked.retry_after(), Some(Duration::from_secs(58)));
    let peeked = limiter.peek(&key).await.unwrap();
    assert!(!peeked.is_allowed(), "peek shows the running block");
    clock.advance(Duration::from_secs(58));
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn penalties_agree_between_layer_and_direct_api() {
    let clock = ManualClock::new(T0);
    let make = || {
        let policy = Policy::builder("strict", Rate::per_minute(1))
            .algorithm(Algorithm::FixedWindow)
            .penalty(Duration::from_secs(600))
            .build()
            .unwrap();
        Limiter::builder()
            .store(store(&clock))
            .policy(policy)
            .build()
            .unwrap()
    };
    let r = [("GET", "/", None); 3];
    assert_eq!(parity(make, &r).await, [200, 429, 429]);
}

#[tokio::test]
async fn shadow_policies_count_on_the_direct_path() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
        .policy(
            Policy::builder("candidate", Rate::per_minute(2))
                .shadow(true)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "u1");
    for _ in 0..5 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    assert_eq!(support::shadow_counts(&limiter), (2, 3));
}

/// A shadow policy predicts what enforcing it would do with a cost above its capacity: a
/// refusal that charges nothing, so the requests after it are counted as they would be
/// decided.
#[tokio::test]
async fn a_shadow_policy_refuses_a_cost_above_its_capacity_charging_nothing() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
        .policy(
            Policy::builder("candidate", Rate::per_minute(10))
                .shadow(true)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "u1");
    assert!(limiter.check(&key, 50).await.unwrap().is_allowed());
    assert_eq!(support::shadow_counts(&limiter), (0, 1), "50 never fits 10");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert_eq!(
        support::shadow_counts(&limiter),
        (1, 1),
        "the refused cost left the candidate's 10 whole"
    );
    // A refund of the big cost gives the candidate nothing back: it was never charged.
    limiter.refund(&key, 50).await.unwrap();
    for _ in 0..9 {
        limiter.check(&key, 1).await.unwrap();
    }
    assert_eq!(support::shadow_counts(&limiter), (10, 1));
    limiter.check(&key, 1).await.unwrap();
    assert_eq!(support::shadow_counts(&limiter), (10, 2), "the 11th of 10");
}

/// Shadow policies are checked together, all or nothing: a cost one of them refuses charges
/// none, and a refund of it gives none of them anything back.
#[tokio::test]
async fn a_shadow_refund_mirrors_the_all_or_nothing_check() {
    use tollgate::store::{MemoryStore, StoreExt};
    let shadow = |name: &str, n: u64| {
        Policy::builder(name, Rate::per_minute(n))
            .shadow(true)
            .build()
            .unwrap()
    };
    let large = shadow("large", 100);
    let store = MemoryStore::new();
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(Policy::new("api", Rate::per_minute(1_000)).unwrap())
        .policy(shadow("small", 30))
        .policy(large.clone())
        .build()
        .unwrap();
    let key = Key::new("user", "u1");
    let large_used = || async {
        let d = store
            .peek(&key, std::slice::from_ref(&large), &[0])
            .await
            .unwrap();
        100 - d.remaining()
    };
    for _ in 0..2 {
        limiter.check(&key, 10).await.unwrap();
    }
    assert_eq!(large_used().await, 20);
    // 50 fits the large one but not the small: the pair charges nothing, and its refund gives
    // the large one nothing back either.
    limiter.check(&key, 50).await.unwrap();
    assert_eq!(large_used().await, 20);
    limiter.refund(&key, 50).await.unwrap();
    assert_eq!(large_used().await, 20, "a refund of what was never charged");
}

#[tokio::test]
async fn shadow_policies_agree_between_layer_and_direct_api() {
    let make = || {
        Limiter::builder()
            .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
            .policy(
                Policy::builder("candidate", Rate::per_minute(2))
                    .shadow(true)
                    .build()
                    .unwrap(),
            )
            .extractor(Global::new())
            .build()
            .unwrap()
    };
    let r = [("GET", "/", None); 5];
    let (a, b) = (make(), make());
    assert_eq!(over_http(a.clone(), &r).await, [200; 5]);
    assert_eq!(directly(b.clone(), &r).await, [200; 5]);
    assert_eq!(support::shadow_counts(&a), (2, 3));
    assert_eq!(a.shadow_counts(), b.shadow_counts());
}

/// A client network applies to the client's own address, whatever key it gets: a client
/// inside a denied network stepped out of it by sending an API key that the chain prefers,
/// and an IPv6 host or /64 denied inside the /56 its key names was never matched.
#[tokio::test]
async fn client_networks_hold_over_http_whatever_key_the_request_gets() {
    use tollgate::key::{ApiKey, Chain, ClientIp, PeerIp};
    type Builder = tollgate::LimiterBuilder<MemoryStore>;
    let app = |build: fn(Builder) -> Builder| {
        let limiter = build(
            Limiter::builder()
                .policy(Policy::new("api", Rate::per_minute(1)).unwrap())
                .extractor(Chain::new(ApiKey::new()).or(ClientIp::default())),
        )
        .build()
        .unwrap();
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter))
    };
    let client = reqwest::Client::new();
    let statuses = |addr: SocketAddr| api_key_statuses(addr, 3, "made-up", None);
    let denied = support::serve(app(|b| b.deny_cidr("127.0.0.0/8"))).await;
    assert_eq!(statuses(denied).await, [403, 403, 403]);
    let by_key = support::serve(app(|b| b.deny_key(Key::new("ip", "127.0.0.1")))).await;
    assert_eq!(statuses(by_key).await, [403, 403, 403]);
    // An allowed network passes uncharged whatever the key: the same API key thrice.
    let allowed = support::serve(app(|b| b.allow_cidr("127.0.0.1"))).await;
    for _ in 0..3 {
        let res = client
            .get(format!("http://{allowed}/"))
            .header("x-api-key", "one")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit-limit").is_none());
    }
    // Elsewhere the API keys are limited as before.
    let other = support::serve(app(|b| b.deny_cidr("192.0.2.0/24"))).await;
    assert_eq!(statuses(other).await, [200, 200, 200]);

    // IPv6: the address itself is matched, not the /56 its key names.
    let Ok(listener) = tokio::net::TcpListener::bind("[::1]:0").await else {
        eprintln!("no IPv6 loopback here: the IPv6 half is covered by the direct path's test");
        return;
    };
    let v6 = listener.local_addr().unwrap();
    drop(listener);
    for (deny, expected) in [("::1", 403), ("::1/128", 403), ("::2", 200)] {
        let limiter = Limiter::builder()
            .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
            .extractor(PeerIp::new())
            .deny_cidr(deny)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter));
        let listener = tokio::net::TcpListener::bind("[::1]:0").await.unwrap();
        let addr = support::serve_on(listener, app);
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(res.status().as_u16(), expected, "deny {deny} ({v6})");
    }
}

/// How client networks meet keys: an allow-listed client is not refused for a neighbour's
/// denied network; a key an extractor of your own reads from a header is the client (the
/// address is then the load balancer's); a route's own key still comes from an address; a
/// NAT64 address matches a network written either way.
#[tokio::test]
async fn client_networks_screen_the_client_whichever_extractor_names_it() {
    use tollgate::key::{ApiKey, Chain, PeerIp};
    let request = |peer: &str, headers: &[(&str, &str)]| {
        let mut b = http::Request::get("/");
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        let mut req = b.body(()).unwrap();
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        req
    };
    let decide = |limiter: Limiter, req: http::Request<()>| async move {
        limiter
            .decide(&RequestView::new(&req))
            .await
            .map(|d| d.policies().is_empty())
            .map_err(|r| r.kind())
    };
    let build = |b: tollgate::LimiterBuilder<MemoryStore>| {
        b.policy(Policy::new("api", Rate::per_minute(100)).unwrap())
            .build()
            .unwrap()
    };
    // Allowed /64, its neighbour /64 denied, in one /56.
    let limiter = build(
        Limiter::builder()
            .extractor(PeerIp::new())
            .allow_cidr("2001:db8:0:1::/64")
            .deny_cidr("2001:db8:0:2::/64"),
    );
    let allowed = decide(limiter.clone(), request("[2001:db8:0:1::5]:1", &[])).await;
    assert_eq!(allowed, Ok(true), "allowed, uncharged");
    let denied = decide(limiter.clone(), request("[2001:db8:0:2::5]:1", &[])).await;
    assert_eq!(denied, Err(RefusalKind::Forbidden));
    let neighbour = decide(limiter, request("[2001:db8:0:3::5]:1", &[])).await;
    assert_eq!(neighbour, Ok(false), "limited as usual");

    // X-Real-IP read by an extractor of your own, behind a load balancer on loopback.
    let real_ip = || {
        Chain::new(from_fn(|req: &RequestView<'_>| {
            let ip = req.headers().get("x-real-ip")?.to_str().ok()?;
            Some(Key::new("ip", ip))
        }))
        .or(PeerIp::new())
    };
    let via_lb = || request("127.0.0.1:1", &[("x-real-ip", "203.0.113.5")]);
    let lb_allowed = build(
        Limiter::builder()
            .extractor(real_ip())
            .allow_cidr("127.0.0.0/8"),
    );
    assert_eq!(
        decide(lb_allowed, via_lb()).await,
        Ok(false),
        "limited, not passed"
    );
    let client_denied = build(
        Limiter::builder()
            .extractor(real_ip())
            .deny_cidr("203.0.113.0/24"),
    );
    assert_eq!(
        decide(client_denied, via_lb()).await,
        Err(RefusalKind::Forbidden)
    );
    let lb_denied = build(
        Limiter::builder()
            .extractor(real_ip())
            .deny_cidr("127.0.0.0/8"),
    );
    assert_eq!(decide(lb_denied, via_lb()).await, Ok(false));

    // A route keyed by API key: its requests still come from an address.
    let limiter = Limiter::builder()
        .route(
            "GET /export",
            Route::new()
                .policy(Policy::new("export", Rate::per_minute(10)).unwrap())
                .key(ApiKey::new()),
        )
        .extractor(PeerIp::new());
    let limiter = build(limiter.deny_cidr("127.0.0.0/8"));
    let mut export = request("127.0.0.1:1", &[("x-api-key", "k")]);
    *export.uri_mut() = "/export".parse().unwrap();
    assert_eq!(decide(limiter, export).await, Err(RefusalKind::Forbidden));

    // NAT64: 64:ff9b::c000:201 is 192.0.2.1.
    for network in ["64:ff9b::/32", "64:ff9b::c000:200/120", "192.0.2.0/24"] {
        let limiter = build(
            Limiter::builder()
                .extractor(PeerIp::new())
                .deny_cidr(network),
        );
        let nat64 = request("[64:ff9b::c000:201]:1", &[]);
        assert_eq!(
            decide(limiter, nat64).await,
            Err(RefusalKind::Forbidden),
            "{network}"
        );
    }
}

/// Made-up API keys were a fresh limit each: with the keys issued named, an unknown one is
/// limited by the address it comes from, and a decoy header hides no real bearer token.
#[tokio::test]
async fn made_up_api_keys_fall_through_to_the_client_address() {
    use tollgate::key::{ApiKey, Chain, ClientIp};
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(2)).unwrap())
        .extractor(
            Chain::new(ApiKey::new().known(|raw| raw == b"sk_issued")).or(ClientIp::default()),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let statuses = api_key_statuses(addr, 4, "made-up", None).await;
    assert_eq!(statuses, [200, 200, 429, 429]);
    let statuses = api_key_statuses(addr, 3, "decoy", Some("sk_issued")).await;
    assert_eq!(statuses, [200, 200, 429], "one limit for the issued key");
}

/// The statuses of `n` requests to `addr`, each with its own `X-API-Key` (`{prefix}-{i}`) and
/// the bearer token `bearer`, if any.
async fn api_key_statuses(
    addr: SocketAddr,
    n: usize,
    prefix: &str,
    bearer: Option<&str>,
) -> Vec<u16> {
    let client = reqwest::Client::new();
    let mut out = Vec::new();
    for i in 0..n {
        let mut req = client
            .get(format!("http://{addr}/"))
            .header("x-api-key", format!("{prefix}-{i}"));
        if let Some(token) = bearer {
            req = req.bearer_auth(token);
        }
        out.push(req.send().await.unwrap().status().as_u16());
    }
    out
}

/// Two policies with as many units left: the headers follow the one whose quota comes back
/// last, whichever was declared first (they named the 2-second burst, and a client that
/// waited 2 s was refused for 18 s more).
#[tokio::test]
async fn of_policies_tied_on_what_is_left_the_one_that_resets_last_governs() {
    for order in [["burst", "long"], ["long", "burst"]] {
        let clock = ManualClock::new(1_000_000);
        let policy = |name: &str| {
            let window = if name == "burst" { 2 } else { 20 };
            Policy::builder(name, Rate::new(1, Duration::from_secs(window)))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap()
        };
        let limiter = Limiter::builder()
            .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
            .policy(policy(order[0]))
            .policy(policy(order[1]))
            .build()
            .unwrap();
        let key = Key::new("user", "1");
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        let governing = d.governing_index();
        assert_eq!(order[governing], "long", "{order:?}");
        assert_eq!(d.reset_after(), Duration::from_secs(20), "{order:?}");
        clock.advance(d.reset_after());
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
}

/// Two penalised policies denying together start both blocks: the first refusal's
/// `retry_after` named the first policy's penalty, and a client that waited for it was
/// refused again.
#[tokio::test]
async fn the_first_refusal_of_two_penalties_names_the_block_that_ends_last() {
    let clock = ManualClock::new(1_000_000);
    let policy = |name: &str, penalty: u64| {
        Policy::builder(name, Rate::new(1, Duration::from_secs(1)))
            .algorithm(Algorithm::SlidingWindowLog)
            .penalty(Duration::from_secs(penalty))
            .build()
            .unwrap()
    };
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .policy(policy("a", 2))
        .policy(policy("b", 5))
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    let refused = limiter.check(&key, 1).await.unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(5)));
    clock.advance(Duration::from_millis(4_999));
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    clock.advance(Duration::from_millis(1));
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
}

/// On the direct API an IPv6 key names its /56: a denied host or /64 inside it refuses it
/// (it was never matched), while an allowed one narrower than the prefix lets nothing
/// through uncharged.
#[tokio::test]
async fn narrow_ipv6_networks_on_the_direct_path() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(1)).unwrap())
        .deny_cidr("2001:db8:0:1::bad")
        .deny_key(Key::new("ip", "2001:db8:1:1::1"))
        .allow_cidr("2001:db8:2:1::/64")
        .build()
        .unwrap();
    for key in ["2001:db8::/56", "2001:db8:1::/56"] {
        let err = limiter.check(&Key::new("ip", key), 1).await.unwrap_err();
        assert_eq!(err, CheckError::Forbidden, "{key}");
    }
    let prefix = Key::new("ip", "2001:db8:2::/56");
    assert!(limiter.check(&prefix, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&prefix, 1).await.unwrap().is_allowed());
    assert!(limiter
        .check(&Key::new("ip", "2001:db8:3::/56"), 1)
        .await
        .unwrap()
        .is_allowed());
}

/// An allowed network skips limiting whatever key the request gets, none included: a monitor
/// on the internal network calling a route keyed by API key without one is let through, not
/// refused for a missing key; anyone else without a key still is.
#[tokio::test]
async fn an_allowed_network_passes_a_request_without_a_key() {
    use tollgate::key::{ApiKey, PeerIp, RequestView};
    let limiter = Limiter::builder()
        .policy(Policy::new("pages", Rate::per_minute(60)).unwrap())
        .extractor(PeerIp::new())
        .route(
            "/api/{*rest}",
            tollgate::route::Route::new()
                .policy(Policy::new("api", Rate::per_minute(600)).unwrap())
                .key(ApiKey::new()),
        )
        .allow_cidr("127.0.0.0/8")
        .build()
        .unwrap();
    let request = |from: &str| {
        let mut r = http::Request::get("/api/x").body(()).unwrap();
        r.extensions_mut()
            .insert(from.parse::<SocketAddr>().unwrap());
        r
    };
    let internal = limiter
        .decide(&RequestView::new(&request("127.0.0.1:4000")))
        .await
        .unwrap();
    assert!(internal.is_allowed() && internal.policies().is_empty());
    let outside = limiter
        .decide(&RequestView::new(&request("192.0.2.1:4000")))
        .await
        .unwrap_err();
    assert_eq!(outside.kind(), tollgate::RefusalKind::MissingKey);
    // Over HTTP: the loopback client is on the allowed network.
    let app = Router::new()
        .route("/api/{*rest}", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let res = reqwest::get(format!("http://{addr}/api/x")).await.unwrap();
    assert_eq!(res.status(), 200);
}

/// The default route's fixed cost is charged by the direct calls that take no cost, as by the
/// layer: a job acquired under `cost(5)` takes five units, and a look asks for five.
#[tokio::test]
async fn acquire_and_peek_charge_the_routes_fixed_cost() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(10)).unwrap())
        .cost(5)
        .build()
        .unwrap();
    let key = Key::new("tenant", "jobs");
    let first = limiter.acquire(&key).await.unwrap();
    assert_eq!(first.remaining(), 5);
    assert!(limiter.peek(&key).await.unwrap().is_allowed());
    // Two left: a look asks for the route's five, by `peek` and by the admin API's `inspect`.
    limiter.check(&key, 3).await.unwrap();
    assert!(!limiter.peek(&key).await.unwrap().is_allowed());
    let mut look = http::Request::get("/").body(()).unwrap();
    look.extensions_mut()
        .insert("192.0.2.10:1".parse::<SocketAddr>().unwrap());
    let state = limiter
        .inspect(&RequestView::new(&look), &key)
        .await
        .unwrap();
    assert!(!state.allowed, "two left, and a request costs five");
    assert!(!limiter.acquire(&key).await.unwrap().is_allowed());
    // The same charge as the layer's path, on one budget.
    let mut request = http::Request::get("/").body(()).unwrap();
    request
        .extensions_mut()
        .insert("192.0.2.9:1".parse::<SocketAddr>().unwrap());
    limiter.decide(&RequestView::new(&request)).await.unwrap();
    let by_ip = limiter.acquire(&Key::new("ip", "192.0.2.9")).await.unwrap();
    assert_eq!(
        by_ip.remaining(),
        0,
        "the layer's path and acquire charge alike"
    );
}

#[tokio::test]
async fn deny_and_allow_lists_hold_on_the_direct_path() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(1)).unwrap())
        .deny_key(Key::new("user", "mallory"))
        .allow_key(Key::new("user", "monitor"))
        .deny_cidr("203.0.113.0/24")
        .build()
        .unwrap();
    let err = limiter
        .check(&Key::new("user", "mallory"), 1)
        .await
        .unwrap_err();
    assert_eq!(err, CheckError::Forbidden);
    let err = limiter
        .check(&Key::new("ip", "203.0.113.7"), 1)
        .await
        .unwrap_err();
    assert_eq!(err, CheckError::Forbidden);
    assert_eq!(
        limiter
            .peek(&Key::new("user", "mallory"))
            .await
            .unwrap_err(),
        CheckError::Forbidden
    );
    for _ in 0..5 {
        let d = limiter
            .check(&Key::new("user", "monitor"), 1)
            .await
            .unwrap();
        assert!(d.is_allowed());
        assert!(d.policies().is_empty(), "allow-listed keys are not charged");
    }
}

#[tokio::test]
async fn lists_agree_between_layer_and_direct_api() {
    let make = || {
        Limiter::builder()
            .policy(Policy::new("api", Rate::per_minute(1)).unwrap())
            .extractor(by_user())
            .deny_key(Key::new("user", "mallory"))
            .allow_key(Key::new("user", "monitor"))
            .build()
            .unwrap()
    };
    let r = [
        ("GET", "/", Some("mallory")),
        ("GET", "/", Some("monitor")),
        ("GET", "/", Some("monitor")),
        ("GET", "/", Some("alice")),
        ("GET", "/", Some("alice")),
        ("GET", "/", None),
    ];
    assert_eq!(parity(make, &r).await, [403, 200, 200, 200, 429, 400]);
}

#[tokio::test]
async fn costs_above_capacity_are_refused_on_both_paths() {
    let limiter = Limiter::builder()
        .policy(Policy::new("tokens", Rate::per_minute(10)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "u1");
    let err = limiter.check(&key, 11).await.unwrap_err();
    assert_eq!(
        err,
        CheckError::CostExceedsCapacity {
            policy: "tokens".into(),
            cost: 11,
            capacity: 10
        }
    );
    // Nothing was charged.
    assert_eq!(limiter.check(&key, 10).await.unwrap().remaining(), 0);

    let make = || {
        Limiter::builder()
            .default_route(
                Route::new()
                    .policy(Policy::new("tokens", Rate::per_minute(10)).unwrap())
                    .cost_fn(|req| {
                        req.headers()
                            .get("x-user")
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .unwrap_or(1)
                    }),
            )
            .extractor(Global::new())
            .build()
            .unwrap()
    };
    let r = [
        ("GET", "/", Some("11")),
        ("GET", "/", Some("10")),
        ("GET", "/", Some("1")),
    ];
    assert_eq!(parity(make, &r).await, [429, 200, 429]);
    let req = request("GET", "/", Some("11"));
    let refusal = make().decide(&RequestView::new(&req)).await.unwrap_err();
    assert_eq!(refusal.kind(), RefusalKind::CostExceedsCapacity);
    assert_eq!(refusal.retry_after(), None, "waiting would not help");
}

#[tokio::test]
async fn routes_tiers_and_head_agree_between_layer_and_direct_api() {
    let make = || {
        Limiter::builder()
            .route(
                "GET /search",
                Route::new().policy(fixed("search", Rate::per_minute(2))),
            )
            .route(
                "POST /login",
                Route::new()
                    .policy(fixed("login", Rate::per_minute(1)))
                    .tier("staff", [fixed("login-staff", Rate::per_minute(3))]),
            )
            .policy(fixed("other", Rate::per_minute(100)))
            .tier_fn(|req| req.headers().get("x-user").and_then(|v| v.to_str().ok()))
            .extractor(Global::new())
            .build()
            .unwrap()
    };
    let r = [
        ("GET", "/search", None),
        ("HEAD", "/search", None),
        ("GET", "/search", None),
        ("HEAD", "/search", None),
        ("GET", "/", None),
        ("POST", "/login", None),
        ("POST", "/login", None),
        ("POST", "/login", Some("staff")),
        ("POST", "/login", Some("staff")),
        ("POST", "/login", Some("staff")),
        ("POST", "/login", Some("staff")),
    ];
    assert_eq!(
        parity(make, &r).await,
        [200, 200, 429, 429, 200, 200, 429, 200, 200, 200, 429]
    );
}

#[tokio::test]
async fn the_direct_path_holds_no_in_flight_slot() {
    // `decide` and `check` keep nothing that would give a slot back, so the slot an in-flight
    // policy takes to admit a request goes back at once: one at a time, every time.
    let limiter = Limiter::builder()
        .policy(Policy::in_flight("one", 1).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let req = request("GET", "/", None);
    for _ in 0..3 {
        assert!(limiter.decide(&RequestView::new(&req)).await.is_ok());
        assert!(limiter
            .check(&Key::new("job", "1"), 1)
            .await
            .unwrap()
            .is_allowed());
    }
    // `acquire` holds its slot until the permit is dropped.
    let permit = limiter.acquire(&Key::new("job", "1")).await.unwrap();
    assert!(permit.holds_slots());
    assert!(!limiter
        .check(&Key::new("job", "1"), 1)
        .await
        .unwrap()
        .is_allowed());
}

#[tokio::test]
async fn a_refused_acquire_counts_among_the_top_refused() {
    let limiter = Limiter::builder()
        .policy(Policy::in_flight("one", 1).unwrap())
        .build()
        .unwrap();
    let tenant = Key::new("tenant", "acme");
    let _permit = limiter.acquire(&tenant).await.unwrap();
    assert!(!limiter.acquire(&tenant).await.unwrap().is_allowed());
    assert!(!limiter
        .reserve(&tenant, 1)
        .await
        .unwrap()
        .decision()
        .is_allowed());
    let top = limiter.top_refused(10);
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].count, 2);
}

#[tokio::test]
async fn a_missing_key_is_the_same_refusal_on_both_paths() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(5)).unwrap())
        .build()
        .unwrap();
    let req = http::Request::new(()); // no peer address
    let refusal = limiter.decide(&RequestView::new(&req)).await.unwrap_err();
    assert_eq!(refusal.kind(), RefusalKind::MissingKey);
    assert_eq!(refusal.status(), 400);
    assert_eq!(refusal.grpc_code(), tollgate::grpc::INVALID_ARGUMENT);
    let body: serde_json::Value = serde_json::from_slice(refusal.http_response().body()).unwrap();
    assert_eq!(body["error"], "missing_rate_limit_key");
}

#[tokio::test]
async fn a_refusal_is_a_value_with_status_code_message_and_rendering() {
    let limiter = Limiter::builder()
        .policy(
            Policy::builder("api", Rate::per_minute(1))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .extractor(Global::new())
        .build()
        .unwrap();
    let req = request("GET", "/", None);
    limiter.decide(&RequestView::new(&req)).await.unwrap();
    let refusal: Refusal = limiter.decide(&RequestView::new(&req)).await.unwrap_err();
    assert_eq!(refusal.kind(), RefusalKind::RateLimited);
    assert_eq!(refusal.error_code(), "rate_limit_exceeded");
    assert_eq!(refusal.policy().unwrap().name(), "api");
    assert!(refusal.message().contains("api"));
    let res = refusal.http_response();
    assert_eq!(res.status(), 429);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(res.headers()["ratelimit-limit"], "1");
    let res = refusal.grpc_response();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "8");
    // A refusal is an error value that can be kept and sent across threads.
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(refusal);
    assert!(boxed.to_string().contains("rate_limit_exceeded"));
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_store_that_fails_closed_is_the_same_refusal_on_both_paths() {
    use tollgate::store::{FailureMode, RedisStore, ResilientStore};
    let dead = RedisStore::builder()
        .build_with_url("redis://127.0.0.1:1")
        .unwrap();
    let store = ResilientStore::builder(dead, FailureMode::FailClosed)
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::new("api", Rate::per_minute(5)).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let req = request("GET", "/", None);
    let refusal = limiter.decide(&RequestView::new(&req)).await.unwrap_err();
    assert_eq!(refusal.kind(), RefusalKind::StoreUnavailable);
    assert_eq!(refusal.status(), 503);
    assert_eq!(refusal.grpc_code(), tollgate::grpc::UNAVAILABLE);
    assert!(refusal
        .http_response()
        .headers()
        .contains_key("retry-after"));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let res = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[test]
fn one_name_is_one_policy() {
    let err = Limiter::builder()
        .route(
            "/a",
            Route::new().policy(Policy::new("api", Rate::per_minute(2)).unwrap()),
        )
        .route(
            "/b",
            Route::new().policy(Policy::new("api", Rate::per_minute(500)).unwrap()),
        )
        .default_route(Route::exempt())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[1].policies[0].name");
    assert!(err.reason().contains("routes[0].policies[0]"), "{err}");
    // Tier lists likewise.
    let err = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(2)).unwrap())
        .tier("pro", [Policy::new("api", Rate::per_minute(500)).unwrap()])
        .tier_fn(|_| None)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tiers.pro[0].name");
    // The same definition twice is one policy, and builds.
    let api = Policy::new("api", Rate::per_minute(2)).unwrap();
    Limiter::builder()
        .route("/a", Route::new().policy(api.clone()))
        .policy(api)
        .build()
        .unwrap();
}

#[tokio::test]
async fn shared_usage_is_asked_for_and_shares_one_counter() {
    let free = fixed("api", Rate::per_minute(2));
    let pro = fixed("api", Rate::per_minute(4));
    let limiter = Limiter::builder()
        .policy(free)
        .tier("pro", [pro])
        .tier_fn(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
        .extractor(Global::new())
        .share_usage("api")
        .build()
        .unwrap();
    let plan = |p: Option<&str>| {
        let mut r = http::Request::builder();
        if let Some(p) = p {
            r = r.header("x-plan", p);
        }
        r.body(()).unwrap()
    };
    let free_req = plan(None);
    let pro_req = plan(Some("pro"));
    assert!(limiter.decide(&RequestView::new(&free_req)).await.is_ok());
    assert!(limiter.decide(&RequestView::new(&free_req)).await.is_ok());
    assert!(limiter.decide(&RequestView::new(&free_req)).await.is_err());
    // Upgraded: the two units used on free still count.
    assert!(limiter.decide(&RequestView::new(&pro_req)).await.is_ok());
    assert!(limiter.decide(&RequestView::new(&pro_req)).await.is_ok());
    assert!(limiter.decide(&RequestView::new(&pro_req)).await.is_err());
    // Shared usage still needs one algorithm and window.
    let err = Limiter::builder()
        .policy(fixed("api", Rate::per_minute(2)))
        .tier("pro", [fixed("api", Rate::per_hour(2))])
        .tier_fn(|_| None)
        .share_usage("api")
        .build()
        .unwrap_err();
    assert!(err.reason().contains("window"), "{err}");
}

#[test]
fn settings_that_would_be_ignored_are_build_errors() {
    let p = || Policy::new("p", Rate::per_minute(2)).unwrap();
    // A route with no policies is not silently exempt.
    let err = Limiter::builder()
        .policy(p())
        .route("/x", Route::new())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[0].policies");
    // Tiers without a tier function.
    let err = Limiter::builder()
        .policy(p())
        .tier("pro", [Policy::new("q", Rate::per_minute(9)).unwrap()])
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "tiers");
    // Only tiered policies: requests of no tier would be unlimited.
    let err = Limiter::builder()
        .route("/x", Route::new().tier("pro", [p()]))
        .policy(Policy::new("d", Rate::per_minute(9)).unwrap())
        .tier_fn(|_| None)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[0].policies");
    // Only per-route policies: every other path must be declared exempt.
    let err = Limiter::builder()
        .route("/x", Route::new().policy(p()))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "policies");
    assert!(err.reason().contains("Route::exempt()"), "{err}");
    // axum 0.7 path syntax.
    for pattern in ["/api/:id", "/api/*rest"] {
        let err = Limiter::builder()
            .route(pattern, Route::new().policy(p()))
            .default_route(Route::exempt())
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "routes[0].pattern", "{pattern}");
        assert!(err.reason().contains("{"), "{err}");
    }
}

#[tokio::test]
async fn for_route_shares_store_names_and_lists() {
    let base = Limiter::builder()
        .default_route(Route::exempt())
        .deny_key(Key::new("user", "mallory"))
        .build()
        .unwrap();
    let search = base
        .for_route(Route::new().policy(fixed("search", Rate::per_minute(1))))
        .unwrap();
    let err = base
        .for_route(Route::new().policy(fixed("search", Rate::per_minute(9))))
        .unwrap_err();
    assert_eq!(err.field(), "route.policies[0].name");
    assert_eq!(
        search
            .check(&Key::new("user", "mallory"), 1)
            .await
            .unwrap_err(),
        CheckError::Forbidden
    );
    let key = Key::new("user", "u1");
    assert!(search.check(&key, 1).await.unwrap().is_allowed());
    // Another handle for the same policy shares its state through the shared store.
    let again = base
        .for_route(Route::new().policy(fixed("search", Rate::per_minute(1))))
        .unwrap();
    assert!(!again.check(&key, 1).await.unwrap().is_allowed());
    // An exempt default route lets every key through uncharged on the direct path too.
    assert!(base.check(&key, 1).await.unwrap().is_allowed());
}

/// `check_now` is `check` without a future: run with no Tokio runtime at all, it gives the
/// same answers (lists, costs, in-flight slots given back, shadow policies counted once).
#[test]
fn check_now_answers_as_check_does_with_no_runtime() {
    let make = || {
        Limiter::builder()
            .policy(Policy::new("api", Rate::per_minute(3)).unwrap())
            .policy(Policy::in_flight("running", 1).unwrap())
            .policy(
                Policy::builder("candidate", Rate::per_minute(2))
                    .shadow(true)
                    .build()
                    .unwrap(),
            )
            .deny_key(Key::new("user", "mallory"))
            .allow_key(Key::new("user", "monitor"))
            .build()
            .unwrap()
    };
    let asked = [
        ("u1", 1),
        ("u1", 1),
        ("u1", 9),
        ("u1", 1),
        ("u1", 1),
        ("mallory", 1),
    ];
    let now = make();
    let answers: Vec<_> = asked
        .iter()
        .map(|&(user, cost)| {
            now.check_now(&Key::new("user", user), cost)
                .expect("the memory store answers at once")
                .map(|d| (d.is_allowed(), d.remaining()))
        })
        .collect();
    let later = make();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let expected: Vec<_> = asked
        .iter()
        .map(|&(user, cost)| {
            rt.block_on(later.check(&Key::new("user", user), cost))
                .map(|d| (d.is_allowed(), d.remaining()))
        })
        .collect();
    assert_eq!(answers, expected);
    assert_eq!(
        answers[0],
        Ok((true, 0)),
        "the in-flight slot is the tighter one"
    );
    assert!(matches!(
        answers[2],
        Err(CheckError::CostExceedsCapacity { cost: 9, .. })
    ));
    assert_eq!(answers[4], Ok((false, 0)), "three a minute");
    assert_eq!(answers[5], Err(CheckError::Forbidden));
    // The cost-9 check counted on the shadow policy as `check` does: 5 checks of u1.
    assert_eq!(support::shadow_counts(&now), support::shadow_counts(&later));
    assert_eq!(support::shadow_counts(&now), (2, 3));
    let monitor = now
        .check_now(&Key::new("user", "monitor"), 1)
        .unwrap()
        .unwrap();
    assert!(monitor.is_allowed() && monitor.policies().is_empty());
}

/// Where the answer needs a wait (a running penalty to look up), `check_now` gives `None`
/// and charges nothing, so asking again with `check` counts the request once.
#[tokio::test]
async fn check_now_defers_to_check_when_it_must_wait_and_charges_nothing() {
    let clock = ManualClock::new(T0);
    let policy = Policy::builder("strict", Rate::per_minute(2))
        .algorithm(Algorithm::FixedWindow)
        .penalty(Duration::from_secs(60))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store(&clock))
        .policy(policy)
        .policy(
            Policy::builder("candidate", Rate::per_minute(1))
                .shadow(true)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "u1");
    for _ in 0..10 {
        assert!(limiter.check_now(&key, 1).is_none());
    }
    assert_eq!(support::shadow_counts(&limiter), (0, 0));
    let first = limiter.check(&key, 1).await.unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.remaining(), 1, "the deferred checks charged nothing");
    assert_eq!(support::shadow_counts(&limiter), (1, 0));
}

// Client networks screen a request by the address its extractor reads. An extractor that
// reads none (a closure keyed by user) leaves them to `ip` keys: said when the limiter is
// built, not discovered when a denied network's client gets through.
#[test]
fn networks_with_an_extractor_that_reads_no_address_warn_when_built() {
    let (captured, _guard) = support::Logs::capture(tracing::Level::WARN);
    let build = |extractor: Option<Box<dyn tollgate::key::KeyExtractor>>| {
        let mut builder = Limiter::builder()
            .policy(Policy::new("api", Rate::per_minute(10)).unwrap())
            .deny_cidr("203.0.113.0/24");
        if let Some(extractor) = extractor {
            builder = builder.extractor(extractor);
        }
        builder.build().unwrap()
    };
    let by_user = from_fn(|req: &RequestView<'_>| {
        let user = req.headers().get("x-user")?.to_str().ok()?;
        Some(Key::new("user", user))
    });
    build(None);
    build(Some(Box::new(
        tollgate::key::Chain::new(tollgate::key::ApiKey::new())
            .or(tollgate::key::ClientIp::default()),
    )));
    assert!(
        !captured.text().contains("client networks"),
        "{}",
        captured.text()
    );
    build(Some(Box::new(by_user)));
    let log = captured.text();
    assert_eq!(log.matches("reads no client address").count(), 1, "{log}");
}

// A limiter made with `for_route` shares its parent's store and policy names: a reset through
// it reached its siblings' policies but left the parent's own, so a key stayed refused.
#[tokio::test]
async fn a_reset_through_an_attached_limiter_reaches_the_parents_policies() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(1)).unwrap())
        .build()
        .unwrap();
    let reports = limiter
        .for_route(Route::new().policy(Policy::new("reports", Rate::per_minute(1)).unwrap()))
        .unwrap();
    let key = Key::new("user", "1");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    reports.reset(&key).await.unwrap();
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());
    // An override through it may name the parent's policy too.
    reports
        .set_override(&key, tollgate::Override::new("api", 5))
        .await
        .unwrap();
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
}

/// A shaping GCRA policy admits a cost above its burst by making it wait: such a request,
/// refused now, is refused for the rate (a `Retry-After`, a penalty's strike), not as a cost
/// that could never pass. Only a cost above what even the longest wait admits is that. The
/// memory store and Redis alike.
#[tokio::test]
async fn a_shaped_policy_refuses_a_cost_its_wait_admits_for_the_rate() {
    let server = support::RedisServer::start();
    let redis = tollgate::store::RedisStore::builder()
        .build_with_url(&server.url())
        .unwrap();
    // Burst 1 at 2 a second; a wait of up to 1.2 s admits 2.4 more units: costs up to 3.
    let shaped = || {
        Policy::builder("shaped", Rate::per_second(2).with_burst(1))
            .algorithm(Algorithm::Gcra)
            .shape(Duration::from_millis(1_200))
            .build()
            .unwrap()
    };
    async fn run<S: tollgate::store::Store>(limiter: Limiter<S>, store: &str) {
        let key = Key::new("user", format!("shaped-{store}"));
        let first = limiter.check(&key, 2).await.unwrap();
        assert!(first.is_allowed(), "{store}");
        assert!(
            first.delay() > Duration::ZERO,
            "{store}: admitted after a wait"
        );
        match limiter.check(&key, 2).await {
            Ok(d) => {
                assert!(!d.is_allowed(), "{store}");
                let retry = d.retry_after().expect("a refusal for the rate says when");
                assert!(retry <= Duration::from_millis(300), "{store}: {retry:?}");
            }
            Err(e) => panic!("{store}: a cost of 2 that a wait admits refused as {e}"),
        }
        match limiter.check(&key, 4).await {
            Err(CheckError::CostExceedsCapacity { cost: 4, .. }) => {}
            other => panic!("{store}: a cost no wait admits: {other:?}"),
        }
        // Under an override the override's rate says what the wait admits: 1 a second,
        // burst 1, waiting up to 1.2 s: costs up to 2.
        let over = Key::new("user", format!("shaped-over-{store}"));
        limiter
            .set_override(&over, tollgate::Override::new("shaped", 1))
            .await
            .unwrap();
        assert!(
            limiter.check(&over, 2).await.unwrap().is_allowed(),
            "{store}"
        );
        let refused = limiter.check(&over, 2).await;
        assert!(
            matches!(&refused, Ok(d) if !d.is_allowed()),
            "{store}: a cost of 2 under the override: {refused:?}"
        );
        match limiter.check(&over, 3).await {
            Err(CheckError::CostExceedsCapacity { cost: 3, .. }) => {}
            other => panic!("{store}: a cost no wait admits under the override: {other:?}"),
        }
    }
    let memory = Limiter::builder().policy(shaped()).build().unwrap();
    run(memory, "memory").await;
    let redis = Limiter::builder()
        .store(redis)
        .policy(shaped())
        .build()
        .unwrap();
    run(redis, "redis").await;
}

/// A store that never answers a check of the shadow policy (a stalled Redis, as far as the
/// shadow check sees) and answers the rest as the memory store.
#[derive(Debug, Clone)]
struct ShadowNeverAnswers(MemoryStore);

impl tollgate::store::Store for ShadowNeverAnswers {
    type CheckFuture = tollgate::store::BoxFuture<Result<tollgate::Decision, tollgate::StoreError>>;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        if policies.iter().any(|p| p.name() == "shadow") {
            return Box::pin(std::future::pending());
        }
        Box::pin(self.0.check(key, policies, costs))
    }

    fn apply(
        &self,
        key: &Key,
        policies: &[Policy],
        op: tollgate::store::Op,
    ) -> tollgate::store::ApplyFuture {
        self.0.apply(key, policies, op)
    }

    fn now_millis(&self) -> u64 {
        tollgate::store::Store::now_millis(&self.0)
    }

    fn name(&self) -> &'static str {
        "shadow-never-answers"
    }
}

/// Shadow checks waiting for a store that does not answer are bounded: past 1 024 a
/// request's shadow check is skipped and counted, instead of one more task per request.
#[tokio::test]
async fn shadow_checks_waiting_for_a_stalled_store_are_bounded() {
    let limiter = Limiter::builder()
        .store(ShadowNeverAnswers(MemoryStore::new()))
        .policy(Policy::new("api", Rate::per_minute(1_000_000)).unwrap())
        .policy(
            Policy::builder("shadow", Rate::per_minute(1))
                .shadow(true)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    for _ in 0..3_000 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    let counts = limiter.shadow_counts();
    assert_eq!((counts.allowed, counts.denied), (0, 0));
    assert_eq!(counts.skipped, 3_000 - 1_024, "{counts:?}");
}
