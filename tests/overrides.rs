//! Per-key overrides: set, applied, expired and removed, on the memory store and on two
//! instances sharing a real Redis, through the direct API and a real axum server; still one
//! script call per decision, which reads a key's override only when one may be in force.

mod support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{MemoryStore, RedisStore, Store};
use tollgate::{Algorithm, CheckError, Limiter, Override, Policy, Rate, RateLimitLayer};

use support::RedisServer;

fn limiter<S: Store>(store: S, algorithm: Algorithm) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .policy(
            Policy::builder("api", Rate::per_minute(10))
                .algorithm(algorithm)
                .build()
                .unwrap(),
        )
        .extractor(support::by_tenant())
        .build()
        .unwrap()
}

#[tokio::test]
async fn overrides_apply_expire_and_go_on_the_memory_store() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let limiter = limiter(store, Algorithm::SlidingWindowCounter);
    let acme = Key::new("tenant", "acme");
    let other = Key::new("tenant", "other");
    for _ in 0..4 {
        assert!(limiter.check(&acme, 1).await.unwrap().is_allowed());
    }
    limiter
        .set_override(
            &acme,
            Override::new("api", 50).expires_in(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    // The usage so far carries on under the new limit; other keys keep the plan's.
    let d = limiter.check(&acme, 1).await.unwrap();
    assert_eq!((d.limit(), d.remaining()), (50, 45));
    assert_eq!(limiter.check(&other, 1).await.unwrap().limit(), 10);
    let listed = limiter.overrides(&acme).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].policy(), listed[0].limit()), ("api", 50));
    assert_eq!(listed[0].expires_in(), Some(Duration::from_secs(30)));
    assert!(limiter.overrides(&other).await.unwrap().is_empty());
    // It expires.
    clock.advance(Duration::from_secs(31));
    assert_eq!(limiter.check(&acme, 1).await.unwrap().limit(), 10);
    assert!(limiter.overrides(&acme).await.unwrap().is_empty());
    // Removal brings back the plan's limit at once.
    limiter
        .set_override(&acme, Override::new("api", 2))
        .await
        .unwrap();
    assert_eq!(limiter.check(&acme, 1).await.unwrap().limit(), 2);
    limiter.remove_override(&acme, "api").await.unwrap();
    assert_eq!(limiter.check(&acme, 1).await.unwrap().limit(), 10);
}

#[tokio::test]
async fn invalid_overrides_are_refused_naming_the_field() {
    let limiter = limiter(MemoryStore::new(), Algorithm::TokenBucket);
    let key = Key::new("tenant", "acme");
    let field = |e: CheckError| match e {
        CheckError::Invalid(e) => e.field().to_owned(),
        other => panic!("not an invalid-input error: {other:?}"),
    };
    let e = limiter
        .set_override(&key, Override::new("api", 0))
        .await
        .unwrap_err();
    assert_eq!(field(e), "limit");
    let e = limiter
        .set_override(&key, Override::new("nope", 5))
        .await
        .unwrap_err();
    assert_eq!(field(e), "policy");
    let e = limiter
        .set_override(&key, Override::new("api", 5).burst(0))
        .await
        .unwrap_err();
    assert_eq!(field(e), "burst");
    let e = limiter
        .set_override(&key, Override::new("api", 5).expires_in(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(field(e), "expires_in");
    // A burst applies to the bucket.
    limiter
        .set_override(&key, Override::new("api", 5).burst(40))
        .await
        .unwrap();
    assert_eq!(limiter.check(&key, 1).await.unwrap().limit(), 40);
}

/// A limit that a setting the override keeps from its policy refuses (a cost of 5 needs a
/// capacity of 5) is refused naming `limit`, what the caller sent and can change: it named
/// the policy's `cost`, which the caller never sent.
#[tokio::test]
async fn an_override_refused_for_its_policys_cost_names_the_limit() {
    let limiter = Limiter::builder()
        .policy(
            Policy::builder("api", Rate::per_minute(100))
                .cost(5)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let e = limiter
        .set_override(&Key::new("tenant", "acme"), Override::new("api", 3))
        .await
        .unwrap_err();
    let CheckError::Invalid(e) = e else {
        panic!("not an invalid-input error: {e:?}");
    };
    assert_eq!(e.field(), "limit", "{e}");
    assert_eq!(e.value(), "3", "{e}");
    assert!(e.to_string().contains("cost"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_on_one_instance_applies_on_the_other_through_redis() {
    let server = RedisServer::start();
    let store = || {
        RedisStore::builder()
            .prefix("ovr")
            .build_with_url(&server.url())
            .unwrap()
    };
    for algorithm in [
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ] {
        let a = limiter(store(), algorithm);
        let b = limiter(store(), algorithm);
        let key = Key::new("tenant", format!("acme-{algorithm}"));
        assert_eq!(b.check(&key, 1).await.unwrap().limit(), 10);
        a.set_override(&key, Override::new("api", 1_000))
            .await
            .unwrap();
        let before = server.command_calls("evalsha");
        let d = b.check(&key, 1).await.unwrap();
        assert_eq!(
            d.limit(),
            1_000,
            "{algorithm}: applied by the other instance"
        );
        // GCRA keeps a key's debt as time (its TAT): one request at 10 a minute is 6 s, which
        // at 1 000 a minute is 100 requests.
        let used = if algorithm == Algorithm::Gcra { 100 } else { 1 };
        assert_eq!(
            d.remaining(),
            1_000 - used - 1,
            "{algorithm}: usage carried on"
        );
        assert_eq!(
            server.command_calls("evalsha") - before,
            1,
            "{algorithm}: still one script call per decision"
        );
        assert_eq!(b.overrides(&key).await.unwrap()[0].limit(), 1_000);
        a.remove_override(&key, "api").await.unwrap();
        assert_eq!(
            b.check(&key, 1).await.unwrap().limit(),
            10,
            "{algorithm}: removed"
        );
    }
    // Expiry, on Redis's own clock.
    let a = limiter(store(), Algorithm::FixedWindow);
    let key = Key::new("tenant", "expiring");
    a.set_override(
        &key,
        Override::new("api", 77).expires_in(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    assert_eq!(a.check(&key, 1).await.unwrap().limit(), 77);
    let ttl = a.overrides(&key).await.unwrap()[0].expires_in().unwrap();
    assert!(ttl <= Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(a.check(&key, 1).await.unwrap().limit(), 10);
    // A lower limit than the usage already counted refuses at once.
    let low = Key::new("tenant", "lowered");
    for _ in 0..5 {
        a.check(&low, 1).await.unwrap();
    }
    a.set_override(&low, Override::new("api", 3)).await.unwrap();
    assert!(!a.check(&low, 1).await.unwrap().is_allowed());
}

/// With deny caches (as plans build Redis stores), an override reaches a key another instance
/// refused lately within that instance's `deny_cache_recheck` plus a call, and the instance
/// that sets it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_reaches_a_key_another_instances_deny_cache_holds_within_its_recheck() {
    use tollgate::store::{FailureMode, ResilientStore};
    let server = RedisServer::start();
    let recheck = Duration::from_millis(250);
    let store = || {
        let redis = RedisStore::builder()
            .prefix("ovr-deny")
            .build_with_url(&server.url())
            .unwrap();
        ResilientStore::builder(redis, FailureMode::FailClosed)
            .deny_cache(1_000)
            .deny_cache_recheck(recheck)
            .deny_cache_max_age(Duration::from_secs(600))
            .build()
            .unwrap()
    };
    // A day's window: a minute's could roll over between the steps and admit afresh.
    let daily = |store| {
        Limiter::builder()
            .store(store)
            .policy(
                Policy::builder("api", Rate::per_day(10))
                    .algorithm(Algorithm::FixedWindow)
                    .build()
                    .unwrap(),
            )
            .extractor(support::by_tenant())
            .build()
            .unwrap()
    };
    let (a, b) = (daily(store()), daily(store()));
    let key = Key::new("tenant", "raised");
    for _ in 0..10 {
        assert!(b.check(&key, 1).await.unwrap().is_allowed());
    }
    assert!(!b.check(&key, 1).await.unwrap().is_allowed());
    assert!(!a.check(&key, 1).await.unwrap().is_allowed());
    // Set on A: A's own cached refusal goes at once.
    a.set_override(&key, Override::new("api", 100))
        .await
        .unwrap();
    assert!(a.check(&key, 1).await.unwrap().is_allowed());
    // B answers from its cache for at most its recheck, then asks Redis and admits.
    let set_at = std::time::Instant::now();
    while !b.check(&key, 1).await.unwrap().is_allowed() {
        assert!(
            set_at.elapsed() < recheck + Duration::from_millis(500),
            "B still refuses {:?} after the override",
            set_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And a removal through B ends the raise there at once.
    b.remove_override(&key, "api").await.unwrap();
    assert!(!b.check(&key, 1).await.unwrap().is_allowed());
}

/// A lower override turns what is counted past its limit into a debt paid at that limit per
/// window, on Redis as in memory: the key's state outlives the window it would have expired
/// in under the plan's limit (a refused request writes nothing that would keep it).
async fn a_lowered_limit_keeps_the_debt_past_the_plans_expiry<S: Store>(
    store: impl Fn() -> S,
    tag: &str,
) {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let limiter = Limiter::builder()
            .store(store())
            .policy(
                Policy::builder("api", Rate::new(50, Duration::from_secs(1)))
                    .algorithm(algorithm)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let key = Key::new("tenant", format!("{tag}-lowered-{algorithm}"));
        assert!(limiter.check(&key, 50).await.unwrap().is_allowed());
        limiter
            .set_override(&key, Override::new("api", 5))
            .await
            .unwrap();
        // 45 units past the new limit of 5 a second: nine more windows. Under the plan's
        // 50 a second they would have been paid by now, and the key expired.
        tokio::time::sleep(Duration::from_millis(3_200)).await;
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(
            !d.is_allowed(),
            "{tag} {algorithm}: the debt under the lowered limit was forgiven: {d:?}"
        );
    }
}

#[tokio::test]
async fn a_lowered_limit_keeps_the_debt_past_the_plans_expiry_memory() {
    a_lowered_limit_keeps_the_debt_past_the_plans_expiry(MemoryStore::new, "memory").await;
}

#[tokio::test]
async fn a_lowered_limit_keeps_the_debt_past_the_plans_expiry_redis() {
    let server = RedisServer::start();
    let store = || {
        RedisStore::builder()
            .prefix("ovr-debt")
            .build_with_url(&server.url())
            .unwrap()
    };
    a_lowered_limit_keeps_the_debt_past_the_plans_expiry(store, "redis").await;
}

#[tokio::test]
async fn a_lowered_limit_keeps_the_debt_past_the_plans_expiry_leased_redis() {
    let server = RedisServer::start();
    let store = || {
        let redis = RedisStore::builder()
            .prefix("ovr-debt-leased")
            .build_with_url(&server.url())
            .unwrap();
        tollgate::store::leased::LeasedStore::builder(redis)
            .lease_time(Duration::from_millis(100))
            .build()
            .unwrap()
    };
    a_lowered_limit_keeps_the_debt_past_the_plans_expiry(store, "leased").await;
}

/// The common call reads a key's override only when its state is not marked as written with
/// none in force, and setting an override takes the mark off at once: the next decision, on
/// any instance, reads and applies it (a lower limit refuses there and then).
#[tokio::test]
async fn a_state_written_with_no_override_is_decided_without_reading_one() {
    let server = RedisServer::start();
    let store = || {
        RedisStore::builder()
            .prefix("mark")
            .build_with_url(&server.url())
            .unwrap()
    };
    let reads = || (server.command_calls("get"), server.command_calls("mget"));
    for algorithm in [
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ] {
        let (a, b) = (limiter(store(), algorithm), limiter(store(), algorithm));
        let key = Key::new("tenant", format!("marked-{algorithm}"));
        // A new key: its state and then its override are read.
        let (get, mget) = reads();
        assert!(b.check(&key, 1).await.unwrap().is_allowed());
        assert_eq!(reads(), (get + 2, mget), "{algorithm}: a new key");
        // Marked now: the state alone.
        for _ in 0..3 {
            let (get, mget) = reads();
            assert!(b.check(&key, 1).await.unwrap().is_allowed());
            assert_eq!(reads(), (get + 1, mget), "{algorithm}: a marked state");
        }
        // Four used; an override of 4 set on the other instance applies to the fifth.
        a.set_override(&key, Override::new("api", 4)).await.unwrap();
        let (get, _) = reads();
        let d = b.check(&key, 1).await.unwrap();
        assert_eq!(d.limit(), 4, "{algorithm}: the override was not read");
        // GCRA keeps its usage as time (four requests at 10 a minute are 24 s, under 2 at
        // 4 a minute); the others count requests.
        assert_eq!(d.is_allowed(), algorithm == Algorithm::Gcra, "{algorithm}");
        assert_eq!(
            reads().0,
            get + 2,
            "{algorithm}: the state, then its override"
        );
        // Removed: the next write reads that none is left and marks the state again.
        a.remove_override(&key, "api").await.unwrap();
        assert_eq!(b.check(&key, 1).await.unwrap().limit(), 10, "{algorithm}");
        let (get, mget) = reads();
        assert_eq!(b.check(&key, 1).await.unwrap().limit(), 10, "{algorithm}");
        assert_eq!(reads(), (get + 1, mget), "{algorithm}: marked again");
    }
}

#[tokio::test]
async fn headers_show_the_effective_limit() {
    let store = MemoryStore::new();
    let limiter = limiter(store, Algorithm::SlidingWindowCounter);
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(limiter.clone())
            .header_style(tollgate::HeaderStyle::All)
            .quota_headers_on_success(true),
    );
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let get = |tenant: &'static str| {
        client
            .get(format!("http://{addr}/"))
            .header("x-tenant", tenant)
            .send()
    };
    limiter
        .set_override(&Key::new("tenant", "acme"), Override::new("api", 500))
        .await
        .unwrap();
    let res = get("acme").await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "500");
    assert_eq!(res.headers()["ratelimit-policy"], "\"api\";q=500;w=60");
    let res = get("other").await.unwrap();
    assert_eq!(res.headers()["x-ratelimit-limit"], "10");
    // The refusal's message says the limit in force too, not the plan's.
    limiter
        .set_override(&Key::new("tenant", "small"), Override::new("api", 1))
        .await
        .unwrap();
    assert_eq!(get("small").await.unwrap().status(), 200);
    let res = get("small").await.unwrap();
    assert_eq!(res.status(), 429);
    let body = res.text().await.unwrap();
    assert!(body.contains("1 per minute"), "{body}");
}

#[cfg(feature = "admin")]
#[tokio::test]
async fn the_admin_api_sets_lists_and_removes_overrides() {
    use axum::body::Body;
    use http::{Request, StatusCode};
    use tower::ServiceExt;

    let limiter = limiter(MemoryStore::new(), Algorithm::FixedWindow);
    let app: Router = Router::new().nest(
        "/admin",
        tollgate::admin::Admin::new(limiter.clone()).router(),
    );
    let call = |method: &str, uri: &str| {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap();
        let app = app.clone();
        async move {
            let res = app.oneshot(req).await.unwrap();
            let status = res.status();
            let body = axum::body::to_bytes(res.into_body(), 1 << 20)
                .await
                .unwrap();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            )
        }
    };
    let (status, body) = call(
        "PUT",
        "/admin/overrides/tenant/acme?policy=api&limit=300&ttl_ms=60000",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["overrides"][0]["limit"], 300);
    let key = Key::new("tenant", "acme");
    assert_eq!(limiter.check(&key, 1).await.unwrap().limit(), 300);
    let (status, body) = call("PUT", "/admin/overrides/tenant/acme?policy=api&limit=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["message"].as_str().unwrap().contains("limit"),
        "{body}"
    );
    let (status, _) = call("PUT", "/admin/overrides/tenant/acme?policy=nope&limit=5").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (_, body) = call("GET", "/admin/overrides/tenant/acme").await;
    assert_eq!(body["overrides"].as_array().unwrap().len(), 1);
    let (status, body) = call("DELETE", "/admin/overrides/tenant/acme?policy=api").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["overrides"].as_array().unwrap().is_empty());
    assert_eq!(limiter.check(&key, 1).await.unwrap().limit(), 10);
}

#[cfg(feature = "cli")]
#[tokio::test]
async fn the_cli_manages_overrides_in_redis() {
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("tollgate-ovr-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("plan.toml");
    std::fs::write(
        &plan,
        "[store]\nkind = \"redis\"\nprefix = \"cliovr\"\n\n[[policies]]\nname = \"api\"\nlimit = 10\nwindow = \"1m\"\n\n[default]\npolicies = [\"api\"]\n",
    )
    .unwrap();
    let tollgate = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("override")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let url = server.url();
    let plan = plan.to_str().unwrap();
    let (code, out, err) = tollgate(&[
        "set",
        plan,
        "tenant:acme",
        "api",
        "250",
        "--ttl",
        "1h",
        "--redis",
        &url,
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let app = Limiter::builder()
        .store(
            RedisStore::builder()
                .prefix("cliovr")
                .build_with_url(&url)
                .unwrap(),
        )
        .policy(Policy::new("api", Rate::per_minute(10)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", "acme");
    assert_eq!(app.check(&key, 1).await.unwrap().limit(), 250);
    let (code, out, _) = tollgate(&["list", plan, "tenant:acme", "--redis", &url, "--json"]);
    assert_eq!(code, Some(0));
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["overrides"][0]["limit"], 250);
    assert!(listed["overrides"][0]["expires_in_ms"].as_u64().unwrap() <= 3_600_000);
    let (code, _, err) = tollgate(&["set", plan, "tenant:acme", "api", "0", "--redis", &url]);
    assert_eq!(code, Some(2), "a zero limit is invalid input");
    assert!(err.contains("limit"), "{err}");
    let (code, _, err) = tollgate(&["set", plan, "tenant:acme", "nope", "5", "--redis", &url]);
    assert_eq!(code, Some(2));
    assert!(err.contains("policy"), "{err}");
    let (code, _, _) = tollgate(&["remove", plan, "tenant:acme", "api", "--redis", &url]);
    assert_eq!(code, Some(0));
    assert_eq!(app.check(&key, 1).await.unwrap().limit(), 10);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A raised override raises the largest cost a key can be charged with it: a cost above the
/// plan's capacity but within the override's is decided (and charged) as any other, one
/// above the override's is refused naming the override's capacity — every algorithm, on the
/// memory store and on Redis.
async fn a_raised_override_admits_costs_up_to_its_capacity<S: Store + Clone>(
    store: S,
    label: &str,
) {
    for algorithm in support::scenarios::ALGORITHMS {
        let limiter = limiter(store.clone(), algorithm);
        let key = Key::new("tenant", format!("big-{label}-{algorithm}"));
        limiter
            .set_override(&key, Override::new("api", 1_000))
            .await
            .unwrap();
        let d = limiter.check(&key, 900).await.unwrap();
        assert!(d.is_allowed(), "{label} {algorithm}: 900 of 1 000");
        assert_eq!(d.limit(), 1_000, "{label} {algorithm}");
        let reservation = limiter.reserve(&key, 50).await.unwrap();
        assert!(reservation.decision().is_allowed(), "{label} {algorithm}");
        reservation.settle(50).await.unwrap();
        match limiter.check(&key, 1_001).await {
            Err(CheckError::CostExceedsCapacity { cost, capacity, .. }) => {
                assert_eq!((cost, capacity), (1_001, 1_000), "{label} {algorithm}");
            }
            other => panic!("{label} {algorithm}: {other:?}"),
        }
        // Without the override the plan's capacity holds again.
        limiter.remove_override(&key, "api").await.unwrap();
        match limiter.check(&key, 11).await {
            Err(CheckError::CostExceedsCapacity { capacity, .. }) => {
                assert_eq!(capacity, 10, "{label} {algorithm}");
            }
            other => panic!("{label} {algorithm}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_raised_override_admits_costs_up_to_its_capacity_memory() {
    a_raised_override_admits_costs_up_to_its_capacity(MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn a_raised_override_admits_costs_up_to_its_capacity_redis() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("big")
        .build_with_url(&server.url())
        .unwrap();
    a_raised_override_admits_costs_up_to_its_capacity(store, "redis").await;
}

/// Through HTTP, a metered route: a tenant whose token quota is raised may send a request
/// whose estimate is above the plan's capacity; another tenant may not.
#[tokio::test]
async fn a_raised_override_admits_a_larger_estimate_through_http() {
    use tollgate::route::{Meter, Route};
    let tokens = Policy::new("tokens", Rate::per_minute(1_000)).unwrap();
    let limiter = Limiter::builder()
        .route(
            "POST /chat",
            Route::new().metered(tokens, Meter::from_body(100)),
        )
        .default_route(Route::exempt())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    limiter
        .set_override(&Key::new("tenant", "big"), Override::new("tokens", 100_000))
        .await
        .unwrap();
    let app = Router::new()
        .route("/chat", axum::routing::post(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter))
        .layer(tollgate::EstimateFromJsonLayer::new("max_tokens").max_body_bytes(1024));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let post = |tenant: &'static str| {
        client
            .post(format!("http://{addr}/chat"))
            .header("x-tenant", tenant)
            .header("content-type", "application/json")
            .body(r#"{"max_tokens":5000}"#)
            .send()
    };
    let res = post("big").await.unwrap();
    assert_eq!(res.status(), 200, "{:?}", res.text().await);
    let res = post("small").await.unwrap();
    assert_eq!(res.status(), 429);
    let body = res.text().await.unwrap();
    assert!(body.contains("cost_exceeds_capacity"), "{body}");
    assert!(body.contains("1000"), "{body}");
}

/// A refund of a cost above the plan's capacity but within an override's gave nothing back:
/// the charge the override admitted was kept.
#[tokio::test]
async fn a_refund_within_an_overrides_capacity_gives_the_units_back() {
    for algorithm in [
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let limiter = Limiter::builder()
            .policy(
                Policy::builder("api", Rate::per_minute(10))
                    .algorithm(algorithm)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let key = Key::new("tenant", "big");
        limiter
            .set_override(&key, tollgate::Override::new("api", 50))
            .await
            .unwrap();
        assert!(limiter.check(&key, 20).await.unwrap().is_allowed());
        limiter.refund(&key, 20).await.unwrap();
        // A look answers as a request of one unit would: 49 after it.
        let left = limiter.peek(&key).await.unwrap().remaining();
        assert_eq!(left, 49, "{algorithm:?}");
        // Above the override's capacity, the check was refused and the refund gives nothing.
        assert!(limiter.check(&key, 10).await.unwrap().is_allowed());
        assert!(limiter.check(&key, 60).await.is_err());
        limiter.refund(&key, 60).await.unwrap();
        assert_eq!(
            limiter.peek(&key).await.unwrap().remaining(),
            39,
            "{algorithm:?}"
        );
    }
}

/// A cost that a lowered override refused charged nothing, and its refund gives nothing back
/// (it took the units of the charges that stand).
#[tokio::test]
async fn a_refund_of_a_cost_a_lowered_override_refused_gives_nothing_back() {
    let limiter = Limiter::builder()
        .policy(
            Policy::builder("api", Rate::per_minute(10))
                .algorithm(Algorithm::SlidingWindowLog)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("tenant", "small");
    limiter
        .set_override(&key, Override::new("api", 5))
        .await
        .unwrap();
    assert_eq!(limiter.check(&key, 3).await.unwrap().remaining(), 2);
    assert!(limiter.check(&key, 8).await.is_err());
    limiter.refund(&key, 8).await.unwrap();
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 1);
}
