//! End to end: a real axum server on loopback, a real HTTP client.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use reqwest::StatusCode;
use tollgate::clock::ManualClock;
use tollgate::key::Global;
use tollgate::store::MemoryStore;
use tollgate::{Algorithm, HeaderStyle, Limiter, Policy, Rate, RateLimitLayer};

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

fn header<'a>(res: &'a reqwest::Response, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .unwrap_or_else(|| panic!("missing header {name}"))
        .to_str()
        .unwrap()
}

// 2026-12-02T10:00:03.250Z: 3.25 s into a 10 s window.
const T0: u64 = 1_796_205_603_250;

/// `limit` requests per 10 s fixed window, named `per-ip`, on a memory store at `clock`.
fn fixed_window_per_ip(clock: &ManualClock, limit: u64) -> Limiter<MemoryStore> {
    Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .policy(
            Policy::builder("per-ip", Rate::new(limit, Duration::from_secs(10)))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_request_over_the_limit_gets_a_complete_429() {
    let clock = ManualClock::new(T0);
    let limiter = fixed_window_per_ip(&clock, 5);
    let addr = support::serve(hello().layer(RateLimitLayer::new(limiter))).await;
    let client = reqwest::Client::new();
    for i in 0..5u64 {
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "ratelimit-limit"), "5");
        assert_eq!(header(&res, "ratelimit-remaining"), (4 - i).to_string());
        // The window ends at :10.000, 6.75 s away: 7 s rounded up.
        assert_eq!(header(&res, "ratelimit-reset"), "7");
        assert_eq!(header(&res, "x-ratelimit-limit"), "5");
        assert_eq!(header(&res, "x-ratelimit-remaining"), (4 - i).to_string());
        assert_eq!(
            header(&res, "x-ratelimit-reset"),
            (T0 / 1000 + 7).to_string()
        );
        assert!(res.headers().get("retry-after").is_none());
        assert_eq!(res.text().await.unwrap(), "hello");
    }
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), "7");
    assert_eq!(header(&res, "ratelimit-limit"), "5");
    assert_eq!(header(&res, "ratelimit-remaining"), "0");
    assert_eq!(header(&res, "ratelimit-reset"), "7");
    assert_eq!(header(&res, "x-ratelimit-limit"), "5");
    assert_eq!(header(&res, "x-ratelimit-remaining"), "0");
    assert_eq!(
        header(&res, "x-ratelimit-reset"),
        (T0 / 1000 + 7).to_string()
    );
    assert_eq!(header(&res, "cache-control"), "no-store");
    assert_eq!(header(&res, "content-type"), "application/json");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "rate_limit_exceeded");
    assert_eq!(body["retry_after"], 7);
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains("5 per 10 seconds"));

    // Exactly when the window flips, the quota is back.
    clock.advance(Duration::from_millis(6_750));
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header(&res, "ratelimit-remaining"), "4");
}

/// `X-RateLimit-Reset` floored the clock before adding the rounded-up wait, so it could name
/// a second before the retry passes: a client that waited for it was refused again.
#[tokio::test]
async fn x_ratelimit_reset_is_never_before_the_retry_passes() {
    let clock = ManualClock::new(1_700_000_000_900);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .policy(
            Policy::builder("x", Rate::new(1, Duration::from_millis(500)))
                .algorithm(Algorithm::SlidingWindowLog)
                .build()
                .unwrap(),
        )
        .extractor(Global::new())
        .build()
        .unwrap();
    let addr = support::serve(hello().layer(RateLimitLayer::new(limiter))).await;
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    clock.advance(Duration::from_millis(50));
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // Refused at …0.950 until …1.400: the Unix second at or after it is …2.
    let reset_at: u64 = header(&res, "x-ratelimit-reset").parse().unwrap();
    assert_eq!(reset_at, 1_700_000_002);
    assert_eq!(header(&res, "ratelimit-reset"), "1");
    clock.set_millis(1_700_000_001_000);
    let early = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS);
    clock.set_millis(reset_at * 1000);
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "allowed at the moment it named"
    );
}

#[tokio::test]
async fn retry_after_is_never_zero_and_rounds_up() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .policy(
            Policy::builder("fast", Rate::per_second(1))
                .algorithm(Algorithm::Gcra)
                .build()
                .unwrap(),
        )
        .extractor(Global::new())
        .build()
        .unwrap();
    let addr = support::serve(hello().layer(RateLimitLayer::new(limiter))).await;
    let client = reqwest::Client::new();
    assert!(client
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
    clock.advance(Duration::from_millis(999));
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    // 1 ms to go: still "1", never "0".
    assert_eq!(header(&res, "retry-after"), "1");
    assert_eq!(header(&res, "ratelimit-reset"), "1");
}

#[tokio::test]
async fn sensitive_policies_leak_no_counts() {
    let limiter = Limiter::builder()
        .policy(
            Policy::builder("login", Rate::per_minute(2))
                .sensitive(true)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let addr = support::serve(hello().layer(RateLimitLayer::new(limiter))).await;
    let client = reqwest::Client::new();
    for _ in 0..2 {
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(res.headers().get("ratelimit-remaining").is_none());
    }
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("retry-after").is_some());
    for name in [
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
    ] {
        assert!(res.headers().get(name).is_none(), "{name} leaked");
    }
    let body = res.text().await.unwrap();
    assert!(
        !body.contains("login") && !body.contains("per minute"),
        "{body}"
    );
    assert!(body.contains("rate_limit_exceeded"));
}

#[tokio::test]
async fn structured_fields_list_every_policy() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock).build().unwrap())
        .policy(
            Policy::builder("burst", Rate::per_second(2))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .policy(
            Policy::builder("daily", Rate::per_day(1000))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let addr =
        support::serve(hello().layer(RateLimitLayer::new(limiter).header_style(HeaderStyle::All)))
            .await;
    let client = reqwest::Client::new();
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy"),
        r#""burst";q=2;w=1, "daily";q=1000;w=86400"#
    );
    // T0 is 10:00:03.250 UTC: the day window resets at midnight, 50 396.75 s away.
    assert_eq!(
        header(&res, "ratelimit"),
        r#""burst";r=1;t=1, "daily";r=999;t=50397"#
    );
    // The classic headers describe the most restrictive policy.
    assert_eq!(header(&res, "ratelimit-limit"), "2");
    client.get(format!("http://{addr}/")).send().await.unwrap();
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&res, "ratelimit"),
        r#""burst";r=0;t=1, "daily";r=998;t=50397"#
    );
}

#[tokio::test]
async fn shaping_delays_then_forwards() {
    let limiter = Limiter::builder()
        .policy(
            Policy::builder("smooth", Rate::per_second(2).with_burst(1))
                .algorithm(Algorithm::Gcra)
                .shape(Duration::from_millis(1_200))
                .build()
                .unwrap(),
        )
        .extractor(Global::new())
        .build()
        .unwrap();
    let addr = support::serve(hello().layer(RateLimitLayer::new(limiter))).await;
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut tasks = vec![];
    for _ in 0..4 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let res = client.get(format!("http://{addr}/")).send().await.unwrap();
            (res.status(), started.elapsed())
        }));
    }
    let mut results = vec![];
    for t in tasks {
        results.push(t.await.unwrap());
    }
    // Slots at 0, 500 and 1000 ms; a fourth would wait 1500 ms > 1200 ms and is rejected
    // (unless the requests were spread over more than 300 ms, which loopback never is).
    let ok: Vec<Duration> = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .map(|(_, e)| *e)
        .collect();
    assert_eq!(ok.len(), 3, "{results:?}");
    assert_eq!(
        results
            .iter()
            .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        1
    );
    // The last admitted one waited for its slot.
    let slowest = ok.into_iter().max().unwrap();
    assert!(slowest >= Duration::from_millis(990), "{slowest:?}");
}

#[tokio::test]
async fn the_limit_holds_across_many_connections() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { "hello" }
            }),
        )
        .layer(RateLimitLayer::new(
            Limiter::builder()
                .policy(Policy::new("shared", Rate::per_hour(50)).unwrap())
                .build()
                .unwrap(),
        ));
    let addr = support::serve(app).await;
    let mut tasks = vec![];
    for _ in 0..64 {
        tasks.push(tokio::spawn(async move {
            // A client per task: a connection per task, so axum clones the service 64 times.
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            let mut ok = 0;
            for _ in 0..3 {
                let res = client.get(format!("http://{addr}/")).send().await.unwrap();
                ok += usize::from(res.status() == StatusCode::OK);
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    assert_eq!(ok, 50);
    assert_eq!(hits.load(Ordering::SeqCst), 50);
}

#[tokio::test]
async fn route_layer_limits_only_its_routes() {
    let limiter = Limiter::builder()
        .policy(Policy::new("login", Rate::per_minute(1)).unwrap())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "login" }))
        .route_layer(RateLimitLayer::new(limiter))
        .route("/health", get(|| async { "ok" }));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let get = |path: &'static str| {
        let client = client.clone();
        async move {
            client
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(get("/login").await, StatusCode::OK);
    assert_eq!(get("/login").await, StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..5 {
        assert_eq!(get("/health").await, StatusCode::OK);
    }
}

#[tokio::test]
async fn a_missing_peer_address_is_a_clear_400() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(5)).unwrap())
        .build()
        .unwrap();
    let app = hello().layer(RateLimitLayer::new(limiter));
    // Served without connect info: PeerIp has nothing to key on.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let res = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "missing_rate_limit_key");
}

#[tokio::test]
async fn custom_refusal_and_quiet_success() {
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(1)).unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter)
        .quota_headers_on_success(false)
        .on_refusal(|refusal| {
            let mut res = http::Response::new(bytes::Bytes::from(format!(
                "slow down for {}s",
                refusal.retry_after_secs().unwrap_or(1)
            )));
            *res.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
            res
        });
    let addr = support::serve(hello().layer(layer)).await;
    let res = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("ratelimit-limit").is_none());
    let res = reqwest::get(format!("http://{addr}/")).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.text().await.unwrap().starts_with("slow down for "));
}

#[tokio::test]
async fn compact_headers_are_the_ratelimit_trio_without_twins() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock).build().unwrap())
        .policy(
            Policy::builder("per-ip", Rate::new(2, Duration::from_secs(10)))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let addr = support::serve(
        hello().layer(RateLimitLayer::new(limiter).header_style(HeaderStyle::Compact)),
    )
    .await;
    let client = reqwest::Client::new();
    for remaining in ["1", "0"] {
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "ratelimit-limit"), "2");
        assert_eq!(header(&res, "ratelimit-remaining"), remaining);
        assert_eq!(header(&res, "ratelimit-reset"), "7");
        for absent in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "ratelimit",
            "ratelimit-policy",
        ] {
            assert!(res.headers().get(absent).is_none(), "{absent}");
        }
    }
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), "7");
    assert_eq!(header(&res, "ratelimit-remaining"), "0");
    assert_eq!(header(&res, "ratelimit-reset"), "7");
    assert!(res.headers().get("x-ratelimit-reset").is_none());
}

#[tokio::test]
async fn near_limit_quota_headers_come_only_with_the_last_tenth_of_the_quota() {
    let clock = ManualClock::new(T0);
    let limiter = fixed_window_per_ip(&clock, 20);
    let layer = RateLimitLayer::new(limiter).quota_headers(tollgate::QuotaHeaders::NearLimit);
    let addr = support::serve(hello().layer(layer)).await;
    let client = reqwest::Client::new();
    for i in 0..20u64 {
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let remaining = 19 - i;
        if remaining > 2 {
            assert!(
                res.headers().get("ratelimit-remaining").is_none(),
                "request {i}"
            );
            assert!(
                res.headers().get("x-ratelimit-limit").is_none(),
                "request {i}"
            );
        } else {
            assert_eq!(header(&res, "ratelimit-remaining"), remaining.to_string());
            assert_eq!(header(&res, "x-ratelimit-limit"), "20");
        }
    }
    // A refusal carries the full set whatever the setting.
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    for name in [
        "retry-after",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ] {
        assert!(res.headers().get(name).is_some(), "{name} missing on a 429");
    }
}

/// With several policies, the headers come once any of them nears its end, not only the
/// one with the fewest units left: a burst limit of 10 a second keeps 9 left at one request
/// a second (the fewest), while 300 an hour runs down to its last tenth, 30 left; the
/// headers once came only when the hour had fewer than 9 left.
#[tokio::test]
async fn near_limit_quota_headers_come_when_any_policy_nears_its_end() {
    let clock = ManualClock::new(T0);
    let fixed = |name: &str, rate: Rate| {
        Policy::builder(name, rate)
            .algorithm(Algorithm::FixedWindow)
            .build()
            .unwrap()
    };
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .policy(fixed("burst", Rate::per_second(10)))
        .policy(fixed("hourly", Rate::per_hour(300)))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter).quota_headers(tollgate::QuotaHeaders::NearLimit);
    let addr = support::serve(hello().layer(layer)).await;
    let client = reqwest::Client::new();
    let mut first_with_headers = None;
    for i in 1..=280u64 {
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "request {i}");
        if first_with_headers.is_none() && res.headers().get("ratelimit-remaining").is_some() {
            first_with_headers = Some(i);
        }
        clock.advance(Duration::from_secs(1));
    }
    // The 270th leaves 30 of the hour's 300: its last tenth.
    assert_eq!(first_with_headers, Some(270));
}

#[test]
fn a_plan_names_which_allowed_responses_carry_quota_headers() {
    use tollgate::config::Plan;
    let plan = |setting: &str| {
        Plan::from_toml(&format!(
            "quota_headers = {setting}\n[default]\npolicies = [\"p\"]\n[[policies]]\nname = \"p\"\nlimit = 10\nwindow = \"1m\"\n"
        ))
    };
    for ok in ["true", "false", "\"always\"", "\"near_limit\"", "\"never\""] {
        assert!(plan(ok).is_ok(), "{ok}");
    }
    let err = plan("\"sometimes\"").unwrap_err().to_string();
    assert!(
        err.contains("quota_headers") && err.contains("sometimes"),
        "{err}"
    );
    assert!(err.contains("near_limit"), "{err}");
}

/// A sensitive policy reveals no counts, and its name and capacity are counts too: the 429
/// for a computed cost above its capacity named both.
#[tokio::test]
async fn a_cost_above_a_sensitive_policys_capacity_names_neither() {
    use tollgate::route::Route;
    let limiter = Limiter::builder()
        .route(
            "POST /login",
            Route::new()
                .policy(
                    Policy::builder("login-secret", Rate::per_minute(5))
                        .sensitive(true)
                        .build()
                        .unwrap(),
                )
                .cost_fn(|_| 6),
        )
        .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", axum::routing::post(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let res = reqwest::Client::new()
        .post(format!("http://{addr}/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("ratelimit-limit").is_none());
    let body = res.text().await.unwrap();
    assert!(
        !body.contains("login-secret") && !body.contains('5'),
        "{body}"
    );
    assert!(body.contains("rate_limit_exceeded"), "{body}");
}

/// `X-RateLimit-Reset` is the moment the window resets, counted from the decision: a slow
/// handler does not move it (the clock was read when the response was written, after the
/// handler, and the wait, measured at the decision, added to it).
#[tokio::test]
async fn the_reset_moment_does_not_move_with_the_handlers_time() {
    let clock = ManualClock::new(T0);
    let limiter = fixed_window_per_ip(&clock, 20);
    let slow_clock = clock.clone();
    let app = Router::new()
        .route("/", get(|| async { "quick" }))
        .route(
            "/slow",
            get(move || {
                slow_clock.advance(Duration::from_secs(3));
                async { "slow" }
            }),
        )
        .layer(RateLimitLayer::new(limiter));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let quick = client.get(format!("http://{addr}/")).send().await.unwrap();
    let slow = client
        .get(format!("http://{addr}/slow"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        header(&slow, "x-ratelimit-reset"),
        header(&quick, "x-ratelimit-reset"),
        "one window, one reset moment"
    );
}
