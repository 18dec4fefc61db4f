//! The login guard's metrics (feature `metrics`): one `tollgate_decisions_total` per attempt,
//! under one `route` label (the guard's name), whatever the number of limits it checks. A
//! real axum server on loopback, a real HTTP client, and the Prometheus recorder's text.
//!
//! One test in this binary: the `metrics` recorder is global to the process.

mod support;

use axum::http::StatusCode as AxumStatus;
use axum::routing::post;
use axum::Router;
use metrics_exporter_prometheus::PrometheusBuilder;
use reqwest::StatusCode;
use tollgate::key::Key;
use tollgate::login::{LoginGuard, LoginLayer};

/// The `tollgate_decisions_total` samples of `text`: (labels, value) per line.
fn decisions(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{"))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_is_one_decision_under_the_guards_name() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();

    // The defaults: 5 failures per (IP, username), 50 per IP, 20 per username.
    let guard = LoginGuard::builder().build().unwrap();
    let app = Router::new()
        .route("/login", post(|| async { AxumStatus::UNAUTHORIZED }))
        .layer(LoginLayer::json_field(guard.clone(), "username"));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let mut refused = 0;
    for _ in 0..100 {
        let status = client
            .post(format!("http://{addr}/login"))
            .json(&serde_json::json!({ "username": "alice", "password": "guess" }))
            .send()
            .await
            .unwrap()
            .status();
        refused += usize::from(status == StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(refused, 95);
    // The direct API counts the same way.
    let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "bob");
    assert!(guard.check(&attempt).await.unwrap().is_allowed());

    let text = handle.render();
    let samples = decisions(&text);
    let total: f64 = samples.iter().map(|(_, v)| v).sum();
    assert_eq!(total, 101.0, "{text}");
    for (series, _) in &samples {
        assert!(series.contains(r#"route="login""#), "{series}");
    }
    let of = |allowed: &str, policy: &str| {
        samples
            .iter()
            .filter(|(s, _)| {
                s.contains(&format!(r#"allowed="{allowed}""#))
                    && s.contains(&format!(r#"policy="{policy}""#))
            })
            .map(|(_, v)| v)
            .sum::<f64>()
    };
    // Admitted attempts are governed by the tightest limit, (IP, username); so is every
    // refusal here.
    assert_eq!(of("true", "login.ip-user"), 6.0, "{text}");
    assert_eq!(of("false", "login.ip-user"), 95.0, "{text}");
    assert!(
        text.contains(r#"tollgate_refusals_total{kind="login_refused"} 95"#),
        "{text}"
    );
}
