//! The TOML plan: parsing errors, the audit rules, the CLI, and a config round trip through
//! a real axum app.

mod common;

use std::process::Command;

use axum::routing::{get, post};
use axum::Router;
use tollgate::audit::Severity;
use tollgate::config::Plan;
use tollgate::{audit, Limiter, RateLimitLayer};

const BASE: &str = r#"
[[policies]]
name = "api"
limit = 100
window = "1m"
[default]
policies = ["api"]
"#;

#[test]
fn broken_files_name_the_field_and_value() {
    let cases: &[(&str, &str, &str)] = &[
        ("[[policies]]\nname = \"a\"\nlimit = 0\nwindow = \"1m\"", "policies[0].limit", "0"),
        ("[[policies]]\nname = \"a\"\nlimit = -1\nwindow = \"1m\"", "policies[0].limit", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"soon\"", "policies[0].window", "\"soon\""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"0s\"", "policies[0].window", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nalgorithm = \"magic\"", "policies[0].algorithm", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nburst = 9", "policies[0].burst", "9"),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\ncost = 6", "policies[0].cost", "6"),
        ("[[policies]]\nname = \"a b\"\nlimit = 5\nwindow = \"1m\"", "policies[0].name", "\"a b\""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\n[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"", "policies[1].name", "\"a\""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nmax_delay = \"1s\"", "policies[0].max_delay", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nlimt = 5", "policies[0].limt", ""),
        ("header_style = \"fancy\"", "header_style", ""),
        ("replicas = \"three\"", "replicas", ""),
        ("[store]\nkind = \"postgres\"", "store.kind", ""),
        ("[[routes]]\npattern = \"/a\"\npolicies = 3", "routes[0].policies", ""),
        ("[policies", "(file)", ""),
    ];
    for (text, field, value) in cases {
        let err = Plan::from_toml(text).expect_err(text);
        assert_eq!(err.field(), *field, "{text}\n→ {err}");
        if !value.is_empty() {
            assert_eq!(err.value(), *value, "{text}\n→ {err}");
        }
        assert!(!err.reason().is_empty());
    }
}

#[test]
fn build_errors_name_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "[[routes]]\npattern = \"/a\"\npolicies = [\"nope\"]",
            "routes[0].policies[0]",
        ),
        (
            "[[routes]]\npattern = \"/b\"\ntiers = { pro = [\"nope\"] }",
            "routes[0].tiers.pro[0]",
        ),
        (
            "[[routes]]\npattern = \"login\"\npolicies = [\"api\"]",
            "routes[0].pattern",
        ),
        (
            "[[routes]]\npattern = \"/a\"\npolicies = [\"api\"]\ncost = 1000",
            "routes[0].cost",
        ),
        ("[key]\nkind = \"header\"", "key.header"),
        ("[key]\nipv6_prefix = 0", "key.ipv6_prefix"),
        ("[tier]\nheader = \"bad header\"", "tier.header"),
        (
            "[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\", \"nope\"]",
            "key.trusted_proxies[1]",
        ),
        (
            "[key]\nkind = \"client_ip\"\nheader = \"not a header\"",
            "key.forwarded_header",
        ),
        ("[key]\nkind = \"user\"", "key.kind"),
        (
            "[key]\nkind = \"api_key\"\n[key.fallback]\nkind = \"client_ip\"\ntrusted_proxies = [\"x\"]",
            "key.fallback.trusted_proxies[0]",
        ),
        (
            "[key]\nkind = \"api_key\"\nsecret_env = \"TOLLGATE_TEST_UNSET_VARIABLE\"",
            "key.secret_env",
        ),
    ];
    #[cfg(feature = "redis")]
    let cases = &[
        cases,
        &[
            (
                "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"",
                "failure_mode",
            ),
            ("[store]\nkind = \"redis\"", "store.url"),
        ][..],
    ]
    .concat();
    #[cfg(not(feature = "redis"))]
    let cases = &[
        cases,
        &[(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"",
            "store.kind",
        )][..],
    ]
    .concat();
    let top_level: &[(&str, &str)] = &[
        (
            "deny_cidrs = [\"10.0.0.0/8\", \"10.0.0.0/99\"]",
            "deny_cidrs[1]",
        ),
        ("allow_cidrs = [\"banana\"]", "allow_cidrs[0]"),
    ];
    for (extra, field) in top_level {
        let text = format!("{extra}\n{BASE}");
        let plan = Plan::from_toml(&text).expect(&text);
        let err = Limiter::from_config(&plan).expect_err(&text);
        assert_eq!(err.field(), *field, "{text}\n→ {err}");
    }
    for (extra, field) in cases {
        let text = format!("{BASE}\n{extra}");
        let plan = Plan::from_toml(&text).expect(&text);
        let err = Limiter::from_config(&plan).expect_err(&text);
        assert_eq!(err.field(), *field, "{text}\n→ {err}");
    }
}

fn rules(text: &str) -> Vec<&'static str> {
    let plan = Plan::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    audit(&plan).findings.iter().map(|f| f.rule).collect()
}

#[test]
fn the_example_plan_passes() {
    let plan = Plan::from_file("examples/plan.toml").unwrap();
    let report = audit(&plan);
    assert!(report.pass, "{}", report.to_text());
    assert_eq!(report.score, 100);
    assert!(report.findings.is_empty());
    // Deterministic: the same plan, the same report.
    assert_eq!(report, audit(&plan));
}

#[test]
fn each_rule_has_a_plan_that_trips_exactly_it() {
    let good = std::fs::read_to_string("examples/plan.toml").unwrap();
    let with = |from: &str, to: &str| {
        assert!(good.contains(from), "{from}");
        good.replacen(from, to, 1)
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "TG001",
            with(
                "name = \"burst\"\nlimit = 20\nwindow = \"1s\"",
                "name = \"burst\"\nlimit = 20\nwindow = \"1s\"\nalgorithm = \"fixed_window\"",
            ),
        ),
        (
            "TG002",
            with("kind = \"redis\"\nurl", "kind = \"memory\"\nurl"),
        ),
        ("TG003", with("failure_mode = \"local_fallback\"\n", "")),
        (
            "TG004",
            with(
                "failure_mode = \"local_fallback\"\ntelemetry = true",
                "failure_mode = \"fail_open\"\ntelemetry = false",
            ),
        ),
        ("TG005", with("retry_after = true", "retry_after = false")),
        (
            "TG006",
            with(
                "kind = \"auth\"\npolicies = [\"login\"]",
                "kind = \"auth\"\nexempt = true",
            ),
        ),
        ("TG007", with("username = \"login-user\"\n", "")),
        (
            "TG008",
            with(
                "pattern = \"/api/{*rest}\"\nkind = \"read\"",
                "pattern = \"/api/{*rest}\"\nkind = \"read\"\nauthenticated = true",
            ),
        ),
        (
            "TG009",
            with(
                "policies = [\"burst\", \"daily\"]",
                "policies = [\"burst\", \"daily\", \"login\"]",
            ),
        ),
        (
            "TG010",
            with(
                "kind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
                "kind = \"redis_cluster\"\nkey_template = \"rl:<key>:<policy>\"",
            ),
        ),
    ];
    for (rule, text) in cases {
        assert_eq!(rules(&text), vec![rule], "{rule}:\n{text}");
        let report = audit(&Plan::from_toml(&text).unwrap());
        let f = &report.findings[0];
        assert_eq!(report.pass, f.severity != Severity::Error);
        assert!(report.score < 100);
        assert_eq!(report.recommendations.len(), 1);
        assert!(report.recommendations[0].starts_with(rule));
    }
    // A cluster template that keeps its hash tag is fine.
    let text = with(
        "kind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"",
        "kind = \"redis_cluster\"\nkey_template = \"rl:{<key>}:<policy>\"",
    );
    assert!(rules(&text).is_empty());
}

#[test]
fn the_cli_audits_in_text_and_json() {
    let bin = env!("CARGO_BIN_EXE_tollgate");
    let out = Command::new(bin)
        .args(["audit", "examples/plan.toml"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("PASS (score 100)"));

    let dir = std::env::temp_dir().join(format!("tollgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, format!("replicas = 2\n{BASE}")).unwrap();
    let out = Command::new(bin)
        .args(["audit", bad.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pass"], false);
    assert_eq!(report["findings"][0]["rule"], "TG002");
    assert_eq!(report["findings"][0]["severity"], "error");

    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[[policies]]\nname = 1").unwrap();
    let out = Command::new(bin)
        .args(["audit", broken.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("policies[0].name"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_plan_round_trips_into_a_working_layer() {
    let plan = Plan::from_toml(
        r#"
header_style = "all"

[[policies]]
name = "login"
limit = 2
window = "1m"
sensitive = true

[[policies]]
name = "reads"
limit = 3
window = "1m"

[[routes]]
pattern = "POST /login"
kind = "auth"
policies = ["login"]

[[routes]]
pattern = "/health"
exempt = true

[default]
policies = ["reads"]
"#,
    )
    .unwrap();
    // Serialising and parsing again gives the same plan.
    let again = Plan::from_toml(&toml::to_string(&plan).unwrap()).unwrap();
    assert_eq!(again, plan);

    let app = Router::new()
        .route("/login", post(|| async { "login" }))
        .route("/health", get(|| async { "ok" }))
        .route("/", get(|| async { "home" }))
        .layer(RateLimitLayer::from_config(&plan).unwrap());
    let addr = common::serve(app).await;
    let client = reqwest::Client::new();
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(
            client
                .post(format!("http://{addr}/login"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
    for _ in 0..5 {
        let res = client
            .get(format!("http://{addr}/health"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.headers()["ratelimit-policy"], "\"reads\";q=3;w=60");
}

#[tokio::test]
async fn a_key_chain_from_toml() {
    let plan = Plan::from_toml(
        r#"
[key]
kind = "api_key"
[key.fallback]
kind = "client_ip"
trusted_proxies = ["127.0.0.1/32"]

[[policies]]
name = "api"
limit = 2
window = "1m"
[default]
policies = ["api"]
"#,
    )
    .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::from_config(&plan).unwrap());
    let addr = common::serve(app).await;
    let client = reqwest::Client::new();
    let send = |key: Option<&'static str>, xff: &'static str| {
        let mut req = client
            .get(format!("http://{addr}/"))
            .header("x-forwarded-for", xff);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // Each API key has its own budget; without one, the forwarded client address is the key.
    assert_eq!(
        [
            send(Some("k1"), "1.1.1.1").await,
            send(Some("k1"), "2.2.2.2").await
        ],
        [200, 200]
    );
    assert_eq!(send(Some("k1"), "3.3.3.3").await, 429);
    assert_eq!(send(Some("k2"), "1.1.1.1").await, 200);
    assert_eq!(
        [send(None, "1.1.1.1").await, send(None, "1.1.1.1").await],
        [200, 200]
    );
    assert_eq!(send(None, "1.1.1.1").await, 429);
    assert_eq!(send(None, "2.2.2.2").await, 200);
}
