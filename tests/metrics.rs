//! The Prometheus exposition of a real server after real traffic (feature `metrics`): names,
//! kinds, labels and values, then `promtool check metrics` over the same text.
//!
//! One test in this binary: the `metrics` recorder is global to the process.

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use axum::http::StatusCode as AxumStatus;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use reqwest::StatusCode;
use tollgate::key::Key;
use tollgate::login::{LoginGuard, LoginLayer};
use tollgate::route::Route;
use tollgate::store::{FailureMode, RedisStore, ResilientStore};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};

use support::RedisServer;

/// One sample of the exposition: name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the text exposition's samples (label values may hold spaces and commas).
fn parse(text: &str) -> Vec<Sample> {
    let mut out = vec![];
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value.parse().unwrap();
        let (name, labels) = match series.split_once('{') {
            None => (series.to_owned(), BTreeMap::new()),
            Some((name, rest)) => {
                let mut labels = BTreeMap::new();
                let mut rest = rest.strip_suffix('}').unwrap();
                while !rest.is_empty() {
                    let (key, after) = rest.split_once("=\"").unwrap();
                    let mut value = String::new();
                    let mut chars = after.char_indices();
                    let end = loop {
                        match chars.next().unwrap() {
                            (_, '\\') => value.push(chars.next().unwrap().1),
                            (i, '"') => break i,
                            (_, c) => value.push(c),
                        }
                    };
                    labels.insert(key.to_owned(), value);
                    rest = after[end + 1..].trim_start_matches(',');
                }
                (name.to_owned(), labels)
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// The summed value of the samples named `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

fn has(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> bool {
    samples.iter().any(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

#[tokio::test]
async fn the_exposition_after_traffic_names_policies_routes_and_refusals() {
    let metrics_addr: SocketAddr = ([127, 0, 0, 1], support::free_port()).into();
    PrometheusBuilder::new()
        .with_http_listener(metrics_addr)
        .set_buckets_for_metric(
            Matcher::Full("tollgate_store_latency_seconds".to_owned()),
            tollgate::observability::STORE_LATENCY_BUCKETS,
        )
        .unwrap()
        .install()
        .unwrap();

    // 1. The memory store: a route table, a default route, an axum-attached route, the
    //    deny list, a cost no policy can pay, requests without a key.
    let limits = RateLimitLayer::new(
        Limiter::builder()
            .route(
                "GET /search",
                Route::new().policy(Policy::new("search", Rate::per_minute(1)).unwrap()),
            )
            .route(
                "POST /export",
                Route::new()
                    .policy(Policy::new("export", Rate::per_minute(10)).unwrap())
                    .cost_fn(|_| 1_000),
            )
            .policy(Policy::new("api", Rate::per_minute(100)).unwrap())
            .deny_key(Key::new("tenant", "banned"))
            .extractor(support::by_tenant())
            .build()
            .unwrap(),
    );
    let reports = limits
        .for_route(Route::new().policy(Policy::new("reports", Rate::per_minute(5)).unwrap()))
        .unwrap();
    let guard = LoginGuard::builder()
        .ip_rate(Rate::per_minute(1))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/search", get(|| async { "results" }))
        .route("/export", post(|| async { "exported" }))
        .route("/", get(|| async { "home" }))
        .route(
            "/reports/{id}",
            get(|| async { "report" }).route_layer(reports),
        )
        .layer(limits)
        .merge(
            Router::new()
                .route("/login", post(|| async { AxumStatus::UNAUTHORIZED }))
                .layer(LoginLayer::json_field(guard, "username")),
        );
    let addr = support::serve(app).await;

    // 2. A healthy Redis behind a resilient store with a deny cache.
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .prefix(support::scenarios::unique_prefix("metrics"))
        .build_with_url(&server.url())
        .unwrap();
    let cached = Limiter::builder()
        .store(
            ResilientStore::builder(redis, FailureMode::FailClosed)
                .timeout(Duration::from_secs(1))
                .deny_cache(100)
                .build()
                .unwrap(),
        )
        .policy(Policy::new("shared", Rate::per_minute(1)).unwrap())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    let cached_addr = support::serve(
        Router::new()
            .route("/", get(|| async { "home" }))
            .layer(RateLimitLayer::new(cached)),
    )
    .await;

    // 3. A Redis store whose port nothing listens on, failing open.
    let dead = RedisStore::builder()
        .prefix("tollgate-metrics-dead")
        .build_with_url(&format!("redis://127.0.0.1:{}", support::free_port()))
        .unwrap();
    let open = Limiter::builder()
        .store(
            ResilientStore::builder(dead, FailureMode::FailOpen)
                .timeout(Duration::from_millis(500))
                .circuit_breaker(1, Duration::from_secs(60))
                .build()
                .unwrap(),
        )
        .policy(Policy::new("shared-open", Rate::per_minute(1)).unwrap())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    let open_addr = support::serve(
        Router::new()
            .route("/", get(|| async { "home" }))
            .layer(RateLimitLayer::new(open)),
    )
    .await;

    let client = reqwest::Client::new();
    let send = |req: reqwest::RequestBuilder, tenant: Option<&str>| {
        let req = match tenant {
            Some(t) => req.header("x-tenant", t),
            None => req,
        };
        async move { req.send().await.unwrap().status() }
    };
    let get = |a: SocketAddr, path: &str| client.get(format!("http://{a}{path}"));
    let ok = StatusCode::OK;
    let too_many = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(send(get(addr, "/search"), Some("acme")).await, ok);
    assert_eq!(send(get(addr, "/search"), Some("acme")).await, too_many);
    assert_eq!(send(get(addr, "/search"), Some("acme")).await, too_many);
    for _ in 0..3 {
        assert_eq!(send(get(addr, "/"), Some("acme")).await, ok);
    }
    for id in 0..2 {
        assert_eq!(
            send(get(addr, &format!("/reports/{id}")), Some("acme")).await,
            ok
        );
    }
    let export = client.post(format!("http://{addr}/export"));
    assert_eq!(send(export, Some("acme")).await, too_many);
    assert_eq!(
        send(get(addr, "/"), Some("banned")).await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(send(get(addr, "/"), None).await, StatusCode::BAD_REQUEST);
    let login = || {
        client
            .post(format!("http://{addr}/login"))
            .header("content-type", "application/json")
            .body(r#"{"username":"alice","password":"guess"}"#)
    };
    assert_eq!(send(login(), None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(send(login(), None).await, too_many);
    assert_eq!(send(get(cached_addr, "/"), Some("acme")).await, ok);
    // Redis refuses, then the deny cache does, with Redis healthy.
    assert_eq!(send(get(cached_addr, "/"), Some("acme")).await, too_many);
    assert_eq!(send(get(cached_addr, "/"), Some("acme")).await, too_many);
    assert_eq!(send(get(open_addr, "/"), Some("acme")).await, ok);
    // The first failure opened the breaker: the second request skips the store.
    assert_eq!(send(get(open_addr, "/"), Some("acme")).await, ok);

    // 4. A watched plan file, broken: refused before it is a plan, and counted all the same.
    let dir = std::env::temp_dir().join(format!("tollgate-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.toml");
    std::fs::write(
        &path,
        "[[policies]]\nname = \"api\"\nlimit = 3\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]\n",
    )
    .unwrap();
    let watched = Limiter::from_config(&tollgate::config::Plan::from_file(&path).unwrap()).unwrap();
    let watcher = tollgate::config::PlanWatcher::spawn(&path, watched).unwrap();
    std::fs::write(&path, "[[policies]]\nname = \"api\"\nlimit = ").unwrap();
    let start = std::time::Instant::now();
    while watcher.refused() == 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "no refusal");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(watcher);
    let _ = std::fs::remove_dir_all(&dir);

    let text = reqwest::get(format!("http://{metrics_addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse(&text);
    let s = &samples;
    let decisions = "tollgate_decisions_total";

    // Decisions by policy and route: the pattern as declared, `default` for the default
    // route, the pattern axum matched for a route attached through axum's router (the raw
    // paths `/reports/0` and `/reports/1` are one series); never the raw path.
    let search = [("policy", "search"), ("route", "GET /search")];
    let allowed = [
        ("allowed", "true"),
        ("outcome", "decided"),
        ("store", "memory"),
    ];
    let denied = [
        ("allowed", "false"),
        ("outcome", "decided"),
        ("store", "memory"),
    ];
    assert_eq!(value(s, decisions, &[&search[..], &allowed].concat()), 1.0);
    assert_eq!(value(s, decisions, &[&search[..], &denied].concat()), 2.0);
    // Three requests to `/`, and the two to `/reports/…`, which the outer layer decides too.
    let api = [("policy", "api"), ("route", "default"), ("allowed", "true")];
    assert_eq!(value(s, decisions, &api), 5.0);
    let reports = [("policy", "reports"), ("route", "/reports/{id}")];
    assert_eq!(value(s, decisions, &reports), 2.0);
    assert!(
        !text.contains("/reports/0") && !text.contains("/reports/1"),
        "a raw path leaked into a label:\n{text}"
    );

    // Every refusal kind, login included.
    let refusals = "tollgate_refusals_total";
    for (kind, n) in [
        ("rate_limited", 4.0),
        ("cost_exceeds_capacity", 1.0),
        ("forbidden", 1.0),
        ("missing_key", 1.0),
        ("login_refused", 1.0),
    ] {
        assert_eq!(value(s, refusals, &[("kind", kind)]), n, "{kind}\n{text}");
    }

    // A plan file that does not parse is a refused reload.
    assert_eq!(
        value(s, "tollgate_plan_reloads_total", &[("result", "refused")]),
        1.0,
        "{text}"
    );

    // A deny-cache hit is its own outcome, not a degraded decision.
    let cached_deny = [
        ("outcome", "cached_deny"),
        ("policy", "shared"),
        ("allowed", "false"),
    ];
    assert_eq!(value(s, decisions, &cached_deny), 1.0, "{text}");
    assert!(
        !has(s, "tollgate_degraded_total", &[("outcome", "cached_deny")]),
        "{text}"
    );
    assert_eq!(
        value(s, "tollgate_degraded_total", &[("outcome", "fail_open")]),
        2.0
    );
    assert_eq!(
        value(
            s,
            decisions,
            &[("outcome", "fail_open"), ("policy", "shared-open")]
        ),
        2.0
    );
    assert_eq!(
        value(s, "tollgate_store_errors_total", &[("kind", "connection")]),
        1.0,
        "{text}"
    );
    assert_eq!(
        value(
            s,
            "tollgate_store_errors_total",
            &[("kind", "circuit_open")]
        ),
        1.0,
        "{text}"
    );

    // Store latency is a histogram with the documented buckets (three calls reached Redis,
    // one failed to connect).
    assert!(
        text.contains("# TYPE tollgate_store_latency_seconds histogram"),
        "{text}"
    );
    let latency = "tollgate_store_latency_seconds_bucket";
    for le in tollgate::observability::STORE_LATENCY_BUCKETS {
        assert!(
            has(s, latency, &[("le", &le.to_string())]),
            "le={le}\n{text}"
        );
    }
    assert_eq!(
        value(s, latency, &[("store", "redis"), ("le", "+Inf")]),
        3.0,
        "{text}"
    );
    assert_eq!(
        value(
            s,
            "tollgate_store_latency_seconds_count",
            &[("store", "redis")]
        ),
        3.0
    );
    // Every metric is described.
    for name in [decisions, refusals, "tollgate_store_latency_seconds"] {
        assert!(text.contains(&format!("# HELP {name} ")), "{name}\n{text}");
    }

    promtool_check(&text);

    // A failure mode's decisions are counted once per request or login attempt, however many
    // store calls each made: a login attempt asks three limits, a shadow policy asks again.
    let dead = || {
        let store = RedisStore::builder()
            .prefix("tollgate-metrics-dead-again")
            .build_with_url(&format!("redis://127.0.0.1:{}", support::free_port()))
            .unwrap();
        ResilientStore::builder(store, FailureMode::FailOpen)
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap()
    };
    let guard = LoginGuard::builder()
        .store(dead())
        .failure_mode(FailureMode::FailOpen)
        .build()
        .unwrap();
    let shadowed = Limiter::builder()
        .store(dead())
        .policy(Policy::new("shadowed-open", Rate::per_minute(1)).unwrap())
        .policy(
            Policy::builder("shadow-open", Rate::per_minute(1))
                .shadow(true)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let before = value(s, "tollgate_degraded_total", &[("outcome", "fail_open")]);
    // Store errors over store calls, the ratio `TollgateStoreErrors` reads (calls the open
    // circuit skipped are neither).
    let calls = |s: &[Sample]| {
        let errors = value(s, "tollgate_store_errors_total", &[])
            - value(
                s,
                "tollgate_store_errors_total",
                &[("kind", "circuit_open")],
            );
        (
            errors,
            value(s, "tollgate_store_latency_seconds_count", &[]),
        )
    };
    let (errors_before, calls_before) = calls(s);
    let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "carol");
    assert!(guard.check(&attempt).await.unwrap().is_allowed());
    let key = Key::new("tenant", "acme");
    assert!(shadowed.check(&key, 1).await.unwrap().is_allowed());
    let start = std::time::Instant::now();
    while support::shadow_counts(&shadowed) == (0, 0) {
        assert!(start.elapsed() < Duration::from_secs(5), "no shadow check");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A reset is a store call too: its error once had no call to be counted against.
    assert!(shadowed.reset(&key).await.is_err());
    let text = reqwest::get(format!("http://{metrics_addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let samples = parse(&text);
    let after = value(
        &samples,
        "tollgate_degraded_total",
        &[("outcome", "fail_open")],
    );
    assert_eq!(after - before, 2.0, "{text}");
    let (errors, calls) = calls(&samples);
    assert!(errors > errors_before, "{text}");
    assert_eq!(
        errors - errors_before,
        calls - calls_before,
        "every failed call is a call\n{text}"
    );
}

/// Lints the exposition with `promtool check metrics`, which CI installs (Debian package
/// `prometheus`); skipped with a notice where the binary is absent.
fn promtool_check(text: &str) {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("NOTICE: promtool not found; the exposition was not linted (CI installs it)");
            return;
        }
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
