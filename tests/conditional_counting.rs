//! Conditional counting (`Route::count_when`): a request counts only if its response head
//! says so, race-free — charged while it runs, refunded when a head that does not count
//! arrives. Through real axum servers and the direct API, on the memory store and a real
//! Redis.
#![cfg(all(feature = "redis", feature = "axum"))]

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tollgate::key::{Global, Key};
use tollgate::route::{CountWhen, Meter, Route};
use tollgate::store::{MemoryStore, RedisStore, Store};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
use tower::{Service, ServiceExt};

use support::RedisServer;

fn redis(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .build_with_url(&server.url())
        .unwrap()
}

fn limiter<S: Store>(store: S, limit: u64, when: CountWhen) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .default_route(
            Route::new()
                .policy(Policy::new("calls", Rate::per_hour(limit)).unwrap())
                .count_when(when),
        )
        .extractor(Global::new())
        .build()
        .unwrap()
}

/// Where the slow handlers wait: how many arrived, and the gate that lets them answer.
#[derive(Clone, Default)]
struct Gate {
    arrived: Arc<AtomicUsize>,
    open: Arc<tokio::sync::Notify>,
    opened: Arc<std::sync::atomic::AtomicBool>,
}

impl Gate {
    async fn pass(&self) {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        loop {
            let notified = self.open.notified();
            if self.opened.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    fn open(&self) {
        self.opened.store(true, Ordering::SeqCst);
        self.open.notify_waiters();
    }
}

/// `/ok` answers 200, `/fail` 500; `/slow-fail` waits at the gate, then answers 500.
async fn app<S: Store + Clone>(limiter: Limiter<S>, gate: Gate) -> SocketAddr {
    let router = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "no") }),
        )
        .route(
            "/slow-fail",
            get(move || {
                let gate = gate.clone();
                async move {
                    gate.pass().await;
                    (StatusCode::INTERNAL_SERVER_ERROR, "no")
                }
            }),
        )
        .layer(RateLimitLayer::new(limiter));
    support::serve(router).await
}

async fn status(client: &reqwest::Client, addr: SocketAddr, path: &str) -> u16 {
    let res = client
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap();
    res.status().as_u16()
}

async fn failures_only_counts_failures<S: Store + Clone>(store: S) {
    let addr = app(limiter(store, 3, CountWhen::failures()), Gate::default()).await;
    let client = reqwest::Client::new();
    for _ in 0..10 {
        assert_eq!(status(&client, addr, "/ok").await, 200);
    }
    for _ in 0..3 {
        assert_eq!(status(&client, addr, "/fail").await, 500);
    }
    assert_eq!(status(&client, addr, "/ok").await, 429);
    assert_eq!(status(&client, addr, "/fail").await, 429);
}

#[tokio::test]
async fn http_failures_only_counts_failures_on_memory() {
    failures_only_counts_failures(MemoryStore::new()).await;
}

#[tokio::test]
async fn http_failures_only_counts_failures_on_redis() {
    let server = RedisServer::start();
    failures_only_counts_failures(redis(&server, "failures")).await;
}

#[tokio::test]
async fn http_successes_only_refunds_failures_and_headers_show_it() {
    let addr = app(
        limiter(MemoryStore::new(), 3, CountWhen::successes()),
        Gate::default(),
    )
    .await;
    let client = reqwest::Client::new();
    for _ in 0..10 {
        let res = client
            .get(format!("http://{addr}/fail"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 500);
        // The refund shows in the quota headers of the response itself.
        assert_eq!(res.headers()["ratelimit-remaining"], "3");
    }
    for _ in 0..3 {
        assert_eq!(status(&client, addr, "/ok").await, 200);
    }
    assert_eq!(status(&client, addr, "/fail").await, 429);
}

/// `n + extra` slow requests that will all fail, under "count only successes" with a limit
/// of `n`: at most `n` are admitted while they run, the others refused at once; once they
/// have failed, the budget is whole again.
async fn slow_failures_hold_their_unit<S: Store + Clone>(store: S, n: usize, extra: usize) {
    let gate = Gate::default();
    let limiter = limiter(store, n as u64, CountWhen::successes());
    let addr = app(limiter.clone(), gate.clone()).await;
    let client = reqwest::Client::new();
    let requests: Vec<_> = (0..n + extra)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { status(&client, addr, "/slow-fail").await })
        })
        .collect();
    // The refused answer at once; the admitted wait at the gate.
    tokio::time::timeout(Duration::from_secs(10), async {
        while gate.arrived.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the admitted requests reach the handler");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        gate.arrived.load(Ordering::SeqCst),
        n,
        "never more than n run"
    );
    assert_eq!(
        status(&client, addr, "/ok").await,
        429,
        "the budget is held"
    );
    gate.open();
    let mut statuses = vec![];
    for r in requests {
        statuses.push(r.await.unwrap());
    }
    statuses.sort_unstable();
    let admitted = statuses.iter().filter(|&&s| s == 500).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((admitted, refused), (n, extra), "{statuses:?}");
    // Every one failed and was refunded: the whole budget is back (a refund sent to Redis
    // after the head may land just after the client has read the response).
    let key = Key::global("all");
    tokio::time::timeout(Duration::from_secs(5), async {
        while limiter.peek(&key).await.unwrap().remaining() < n as u64 - 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the refunds land");
    for _ in 0..n {
        assert_eq!(status(&client, addr, "/ok").await, 200);
    }
    assert_eq!(status(&client, addr, "/ok").await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_that_will_not_count_still_hold_their_unit_on_memory() {
    slow_failures_hold_their_unit(MemoryStore::new(), 4, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_that_will_not_count_still_hold_their_unit_on_redis() {
    let server = RedisServer::start();
    slow_failures_hold_their_unit(redis(&server, "slow"), 4, 6).await;
}

/// express-rate-limit's `skipSuccessfulRequests` counts at request time and decrements
/// afterwards, or (skip-after variants) decides only after the response: concurrent
/// requests then see a budget nobody holds. Here, limit 5, count only failures, 20
/// concurrent failing requests: exactly 5 admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_failures_under_a_limit_of_five_admit_exactly_five() {
    let gate = Gate::default();
    let addr = app(
        limiter(MemoryStore::new(), 5, CountWhen::failures()),
        gate.clone(),
    )
    .await;
    let client = reqwest::Client::new();
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { status(&client, addr, "/slow-fail").await })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(10), async {
        while gate.arrived.load(Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    gate.open();
    let mut admitted = 0;
    for r in requests {
        match r.await.unwrap() {
            500 => admitted += 1,
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(admitted, 5);
    // They failed, so they count: the budget stays spent.
    assert_eq!(status(&client, addr, "/ok").await, 429);
}

/// An inner service error, and a response future dropped before its head, count.
#[tokio::test]
async fn no_response_head_counts() {
    let limiter = limiter(MemoryStore::new(), 2, CountWhen::failures());
    let key = Key::global("all");
    let failing = tower::service_fn(|_: http::Request<String>| async {
        Err::<http::Response<String>, _>(std::io::Error::other("backend gone"))
    });
    let mut svc = RateLimitLayer::new(limiter.clone()).layer_service(failing);
    let req = || http::Request::get("/").body(String::new()).unwrap();
    assert!(svc.ready().await.unwrap().call(req()).await.is_err());
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 0, "one used");

    let hanging = tower::service_fn(|_: http::Request<String>| async {
        std::future::pending::<Result<http::Response<String>, Infallible>>().await
    });
    let mut svc = RateLimitLayer::new(limiter.clone()).layer_service(hanging);
    let future = svc.ready().await.unwrap().call(req());
    let cancelled = tokio::time::timeout(Duration::from_millis(20), future).await;
    assert!(cancelled.is_err());
    let d = limiter.peek(&key).await.unwrap();
    assert!(!d.is_allowed(), "both count: the budget is spent");
}

trait LayerService {
    fn layer_service<T>(self, inner: T) -> tollgate::RateLimitService<T, MemoryStore>;
}

impl LayerService for RateLimitLayer<MemoryStore> {
    fn layer_service<T>(self, inner: T) -> tollgate::RateLimitService<T, MemoryStore> {
        tower::Layer::layer(&self, inner)
    }
}

async fn direct_keep_refund_and_count<S: Store + Clone>(store: S) {
    let limiter = limiter(store, 2, CountWhen::failures());
    let key = Key::new("user", "direct");
    let ok = http::Response::builder()
        .status(200)
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let failed = http::Response::builder()
        .status(503)
        .body(())
        .unwrap()
        .into_parts()
        .0;
    for _ in 0..5 {
        let r = limiter.reserve(&key, 1).await.unwrap();
        assert!(r.decision().is_allowed());
        r.count(&ok).await.unwrap();
    }
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 1); // peek asks for one
    let r = limiter.reserve(&key, 1).await.unwrap();
    r.refund().await.unwrap();
    let r = limiter.reserve(&key, 1).await.unwrap();
    r.count(&failed).await.unwrap(); // counts
    let r = limiter.reserve(&key, 1).await.unwrap();
    assert!(r.decision().is_allowed());
    drop(r); // dropped unsettled: the charge stands
    let refused = limiter.reserve(&key, 1).await.unwrap();
    assert!(!refused.decision().is_allowed());
    refused.refund().await.unwrap(); // a refused reservation charged nothing
    assert!(!limiter
        .reserve(&key, 1)
        .await
        .unwrap()
        .decision()
        .is_allowed());
    // `keep` keeps.
    let other = Key::new("user", "keeper");
    limiter.reserve(&other, 1).await.unwrap().keep();
    limiter.reserve(&other, 1).await.unwrap().keep();
    assert!(!limiter.peek(&other).await.unwrap().is_allowed());
}

#[tokio::test]
async fn direct_api_keeps_refunds_and_counts_on_memory() {
    direct_keep_refund_and_count(MemoryStore::new()).await;
}

#[tokio::test]
async fn direct_api_keeps_refunds_and_counts_on_redis() {
    let server = RedisServer::start();
    direct_keep_refund_and_count(redis(&server, "direct")).await;
}

#[test]
fn a_counting_rule_needs_a_rate_policy_and_no_meters() {
    let slots = Policy::in_flight("slots", 2).unwrap();
    let err = Limiter::builder()
        .route(
            "/a",
            Route::new().policy(slots).count_when(CountWhen::failures()),
        )
        .default_route(Route::exempt())
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[0].count");
    assert_eq!(err.value(), "failures");

    let rate = Policy::new("rate", Rate::per_minute(10)).unwrap();
    let tokens = Policy::new("tokens", Rate::per_minute(1000)).unwrap();
    let err = Limiter::builder()
        .route(
            "/b",
            Route::new()
                .policy(rate)
                .metered(tokens, Meter::fixed(10))
                .count_when(CountWhen::statuses(["5xx"]).unwrap()),
        )
        .default_route(Route::exempt())
        .build()
        .unwrap_err();
    assert!(err.field().ends_with("count"), "{err}");
    assert_eq!(err.value(), "5xx");
}

#[cfg(feature = "config")]
mod plans {
    use super::*;
    use tollgate::config::edge::{EdgeTarget, ExportOptions};
    use tollgate::config::Plan;

    const POLICY: &str = "[[policies]]\nname = \"calls\"\nlimit = 2\nwindow = \"1h\"\n";

    fn plan(route: &str) -> Plan {
        let text = format!(
            "{POLICY}[key]\nkind = \"global\"\n[[routes]]\npattern = \"/{{*rest}}\"\n{route}\n[default]\nexempt = true\n"
        );
        Plan::from_toml(&text).unwrap()
    }

    #[tokio::test]
    async fn a_plan_counts_only_failures_through_http() {
        let built = plan("policies = [\"calls\"]\ncount = \"failures\"")
            .build()
            .unwrap();
        let addr = support::serve(
            Router::new()
                .route("/ok", get(|| async { "ok" }))
                .route("/fail", get(|| async { (StatusCode::UNAUTHORIZED, "no") }))
                .layer(built.layer()),
        )
        .await;
        let client = reqwest::Client::new();
        for _ in 0..5 {
            assert_eq!(status(&client, addr, "/ok").await, 200);
        }
        assert_eq!(status(&client, addr, "/fail").await, 401);
        assert_eq!(status(&client, addr, "/fail").await, 401);
        assert_eq!(status(&client, addr, "/ok").await, 429);
    }

    #[tokio::test]
    async fn a_plan_takes_status_classes_and_codes() {
        // On the default route, which the direct API decides by.
        let text =
            format!("{POLICY}[default]\npolicies = [\"calls\"]\ncount = [\"5xx\", \"404\"]\n");
        let built = Plan::from_toml(&text).unwrap().build().unwrap();
        let limiter = built.limiter();
        let key = Key::global("all");
        let head = |s: u16| {
            http::Response::builder()
                .status(s)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        for s in [200, 401, 429, 200] {
            limiter
                .reserve(&key, 1)
                .await
                .unwrap()
                .count(&head(s))
                .await
                .unwrap();
        }
        limiter
            .reserve(&key, 1)
            .await
            .unwrap()
            .count(&head(404))
            .await
            .unwrap();
        limiter
            .reserve(&key, 1)
            .await
            .unwrap()
            .count(&head(502))
            .await
            .unwrap();
        assert!(!limiter
            .reserve(&key, 1)
            .await
            .unwrap()
            .decision()
            .is_allowed());
    }

    #[test]
    fn plan_mistakes_name_the_field_and_value() {
        let cases = [
            (
                "policies = [\"calls\"]\ncount = [\"4xx\", \"6xx\"]",
                "\"6xx\"",
            ),
            ("policies = [\"calls\"]\ncount = \"failure\"", "\"failure\""),
            (
                "exempt = true\ncount = \"failures\"",
                "Some(One(\"failures\"))",
            ),
        ];
        for (route, value) in cases {
            let text = format!("{POLICY}[[routes]]\npattern = \"/a\"\n{route}\n[default]\npolicies = [\"calls\"]\n");
            let err = Plan::from_toml(&text).unwrap().build().unwrap_err();
            assert_eq!(
                (err.field(), err.value()),
                ("routes[0].count", value),
                "{err}"
            );
        }
        let in_flight = "[[policies]]\nname = \"slots\"\nlimit = 2\nwindow = \"1m\"\nalgorithm = \"in_flight\"\n\
            [[routes]]\npattern = \"/a\"\npolicies = [\"slots\"]\ncount = \"successes\"\n[default]\nexempt = true\n";
        let err = Plan::from_toml(in_flight).unwrap().build().unwrap_err();
        assert_eq!(
            (err.field(), err.value()),
            ("routes[0].count", "successes"),
            "{err}"
        );
    }

    /// No edge target counts by response: an edge rule on a counted route counts every
    /// request (a coarse limit, as the `[edge]` docs state), and the audit says when it is
    /// as strict as the origin.
    #[test]
    fn an_edge_rule_on_a_counted_route_counts_every_request() {
        let text = format!(
            "{POLICY}[[routes]]\npattern = \"POST /login\"\npolicies = [\"calls\"]\ncount = \"failures\"\n\
             [default]\nexempt = true\n[[edge.rules]]\nname = \"login\"\nroutes = [\"POST /login\"]\nlimit = 100\nwindow = \"1m\"\n"
        );
        let plan = Plan::from_toml(&text).unwrap();
        let nginx = plan
            .export_edge(EdgeTarget::Nginx, &ExportOptions::new())
            .unwrap();
        assert!(nginx.text().contains("limit_req"), "{}", nginx.text());
    }

    #[test]
    fn the_audit_flags_an_auth_route_that_does_not_count_failures() {
        let route = |count: &str| {
            format!(
                "{POLICY}[[routes]]\npattern = \"POST /login\"\nkind = \"auth\"\npolicies = [\"calls\"]\ncount = {count}\n[default]\nexempt = true\n"
            )
        };
        let rules = |count: &str| -> Vec<&'static str> {
            let report = tollgate::audit(&Plan::from_toml(&route(count)).unwrap());
            report.findings.iter().map(|f| f.rule).collect()
        };
        assert!(rules("\"successes\"").contains(&"TG015"));
        assert!(rules("[\"5xx\"]").contains(&"TG015"));
        assert!(!rules("\"failures\"").contains(&"TG015"));
        assert!(!rules("[\"4xx\"]").contains(&"TG015"));
    }
}
