//! The `[edge]` exporters: golden files, each target's published constraints, Envoy's YAML
//! field by field, every refusal, `nginx -t` on every generated config, and a real nginx in
//! front of a tollgate-limited axum origin.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use serde_json::Value;
use tollgate::config::edge::{EdgeTarget, ExportOptions};
use tollgate::config::Plan;
use tollgate::key::RequestView;
use yaml_rust2::{Yaml, YamlLoader};

/// A plan with every shape of route and key the exporters translate.
const VARIETY: &str = r#"
[key]
kind = "client_ip"
trusted_proxies = ["10.0.0.0/8", "2001:db8::/32"]
header = "x-real-ip"

[[policies]]
name = "api"
limit = 100000
window = "1m"

[[routes]]
pattern = "/users/{id}/posts"
policies = ["api"]

[[routes]]
pattern = "GET /search"
policies = ["api"]

[[routes]]
pattern = "POST /login"
kind = "auth"
policies = ["api"]

[[routes]]
pattern = "/files/{*path}"
policies = ["api"]

[default]
policies = ["api"]

[[edge.rules]]
name = "users"
routes = ["/users/{id}/posts"]
limit = 10
window = "1s"
burst = 20
max_delay = "500ms"
targets = ["nginx"]

[[edge.rules]]
name = "search-key"
routes = ["GET /search"]
key = "header"
header = "x-api-key"
limit = 600
window = "1m"
targets = ["nginx", "cloudflare", "aws-waf"]

[[edge.rules]]
name = "login-global"
routes = ["POST /login"]
key = "global"
limit = 50
window = "10s"
targets = ["nginx", "cloudflare", "envoy"]

[[edge.rules]]
name = "files"
routes = ["/files/{*path}"]
key = "global"
limit = 1200
window = "2m"
action = "challenge"
targets = ["cloudflare", "aws-waf"]
"#;

fn example() -> Plan {
    Plan::from_file("examples/plan.toml").unwrap()
}

fn export(plan: &Plan, target: EdgeTarget) -> String {
    plan.export_edge(target, &ExportOptions::new())
        .unwrap_or_else(|e| panic!("{target}: {e}"))
        .into_text()
}

fn golden_name(target: EdgeTarget) -> String {
    let ext = match target {
        EdgeTarget::Nginx => "conf",
        EdgeTarget::Envoy => "yaml",
        _ => "json",
    };
    format!("tests/data/edge/golden/plan.{target}.{ext}")
}

/// The example plan's export for each target, byte for byte (`UPDATE_GOLDEN=1` rewrites
/// the files after a deliberate change).
#[test]
fn every_target_matches_its_golden_file() {
    let plan = example();
    for target in EdgeTarget::ALL {
        let text = export(&plan, target);
        let path = golden_name(target);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::create_dir_all("tests/data/edge/golden").unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(text, golden, "{path} differs (UPDATE_GOLDEN=1 rewrites it)");
    }
}

/// A plan the origin refuses to build exports nothing: its edge rules would put limits in
/// front of an origin that cannot start. The export once checked the routes' patterns only,
/// and a default naming no policy exported (and `tollgate edge` exited 0).
#[test]
fn a_plan_that_does_not_build_exports_nothing() {
    let plan = Plan::from_toml(
        "[[policies]]\nname = \"api\"\nlimit = 10\nwindow = \"1m\"\n\
         [default]\npolicies = [\"nope\"]\n\
         [[edge.rules]]\nname = \"all\"\nroutes = [\"/\"]\nkey = \"global\"\nlimit = 50\nwindow = \"10s\"\n",
    )
    .unwrap();
    assert!(plan.build().is_err());
    for target in EdgeTarget::ALL {
        let err = plan
            .export_edge(target, &ExportOptions::new())
            .expect_err("a plan that does not build is refused");
        let fields: Vec<String> = plan
            .build_errors()
            .iter()
            .map(|e| e.field().to_owned())
            .collect();
        assert!(fields.iter().any(|f| f == err.field()), "{target}: {err}");
        assert!(
            fields.iter().any(|f| f.starts_with("default.policies")),
            "{fields:?}"
        );
    }
}

/// The same plan as JSON exports the same configuration.
#[test]
fn a_json_plan_is_the_same_plan() {
    let plan = example();
    let json = serde_json::to_string_pretty(&plan).unwrap();
    let dir = temp_dir("json");
    let path = dir.join("plan.json");
    std::fs::write(&path, &json).unwrap();
    let again = Plan::from_file(&path).unwrap();
    assert_eq!(again, plan);
    for target in EdgeTarget::ALL {
        assert_eq!(export(&again, target), export(&plan, target));
    }
    let err = Plan::from_json(r#"{"edge": {"rules": [{"name": "a", "limit": 5, "windw": "1m"}]}}"#)
        .unwrap_err();
    assert_eq!(err.field(), "edge.rules[0].windw", "{err}");
    let err = Plan::from_json("{\"replicas\": 1} trailing").unwrap_err();
    assert_eq!(err.field(), "(file)", "{err}");
}

fn constraints(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("tests/data/edge/{name}")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

fn check_cloudflare(body: &Value, c: &Value) {
    let rules = body["rules"].as_array().expect("a {\"rules\": [...]} body");
    assert!(!rules.is_empty());
    for rule in rules {
        let obj = rule.as_object().unwrap();
        for field in strings(&c["rule_required"]) {
            assert!(obj.contains_key(field), "missing {field}: {rule}");
        }
        for field in obj.keys() {
            assert!(
                strings(&c["rule_fields"]).contains(&field.as_str()),
                "unknown {field}"
            );
        }
        let action = rule["action"].as_str().unwrap();
        assert!(strings(&c["action"]).contains(&action), "{action}");
        let rl = rule["ratelimit"].as_object().unwrap();
        for field in strings(&c["ratelimit_required"]) {
            assert!(rl.contains_key(field), "missing ratelimit.{field}: {rule}");
        }
        for field in rl.keys() {
            assert!(
                strings(&c["ratelimit_fields"]).contains(&field.as_str()),
                "unknown ratelimit.{field}"
            );
        }
        let characteristics = strings(&rule["ratelimit"]["characteristics"]);
        assert!(characteristics.contains(&c["mandatory_characteristic"].as_str().unwrap()));
        for ch in &characteristics {
            assert!(
                strings(&c["characteristic_forms"])
                    .iter()
                    .any(|form| ch.starts_with(form)),
                "{ch}"
            );
            if let Some(name) = ch.strip_prefix("http.request.headers[\"") {
                assert_eq!(name, name.to_lowercase(), "header names are lower case");
            }
        }
        for pair in c["incompatible_characteristics"].as_array().unwrap() {
            let pair = strings(pair);
            assert!(!(characteristics.contains(&pair[0]) && characteristics.contains(&pair[1])));
        }
        let period = rule["ratelimit"]["period"].as_u64().unwrap();
        assert!(numbers(&c["period"]).contains(&period), "{period}");
        let timeout = rule["ratelimit"]["mitigation_timeout"].as_u64().unwrap();
        assert!(
            numbers(&c["mitigation_timeout"]).contains(&timeout),
            "{timeout}"
        );
        if strings(&c["challenge_actions"]).contains(&action) {
            assert_eq!(timeout, 0, "a challenge takes no timeout");
        }
        let requests = rule["ratelimit"]["requests_per_period"].as_u64().unwrap();
        assert!(requests >= c["requests_per_period_min"].as_u64().unwrap());
        if action == "block" {
            let response = &rule["action_parameters"]["response"];
            let code = response["status_code"].as_u64().unwrap();
            assert!((c["block_status_code"]["min"].as_u64().unwrap()
                ..=c["block_status_code"]["max"].as_u64().unwrap())
                .contains(&code));
            assert_eq!(code, 429);
            let ct = response["content_type"].as_str().unwrap();
            assert!(strings(&c["block_content_type"]).contains(&ct));
            let content = response["content"].as_str().unwrap();
            assert!(content.len() as u64 <= c["block_content_max_bytes"].as_u64().unwrap());
            serde_json::from_str::<Value>(content).expect("the JSON body is JSON");
        }
        let expression = rule["expression"].as_str().unwrap();
        assert!(
            !expression.contains("cf.colo.id"),
            "not a field for expressions"
        );
        assert_eq!(
            expression.matches('(').count(),
            expression.matches(')').count()
        );
    }
}

#[test]
fn cloudflare_output_meets_the_published_constraints() {
    let c = constraints("cloudflare-constraints.json");
    for plan in [example(), Plan::from_toml(VARIETY).unwrap()] {
        let body: Value = serde_json::from_str(&export(&plan, EdgeTarget::Cloudflare)).unwrap();
        check_cloudflare(&body, &c);
    }
    let body: Value = serde_json::from_str(&export(
        &Plan::from_toml(VARIETY).unwrap(),
        EdgeTarget::Cloudflare,
    ))
    .unwrap();
    let rules = body["rules"].as_array().unwrap();
    assert_eq!(
        rules[0]["expression"],
        "(http.request.method in {\"GET\" \"HEAD\"} and http.request.uri.path eq \"/search\")"
    );
    assert_eq!(
        strings(&rules[0]["ratelimit"]["characteristics"]),
        ["cf.colo.id", "http.request.headers[\"x-api-key\"]"]
    );
    assert_eq!(rules[1]["ratelimit"]["period"], 10);
    assert_eq!(rules[2]["action"], "managed_challenge");
    assert_eq!(rules[2]["ratelimit"]["period"], 120);
}

fn word_chars(s: &str, extra: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || extra.contains(ch))
}

/// Walks a statement: nesting statements hold at least two; leaves are regex matches.
fn check_aws_statement(s: &Value, c: &Value) {
    let obj = s.as_object().unwrap();
    assert_eq!(obj.len(), 1, "one statement kind per statement: {s}");
    let (kind, body) = obj.iter().next().unwrap();
    match kind.as_str() {
        "AndStatement" | "OrStatement" => {
            let inner = body["Statements"].as_array().unwrap();
            assert!(inner.len() as u64 >= c["nesting_statements_min"].as_u64().unwrap());
            for s in inner {
                check_aws_statement(s, c);
            }
        }
        "RegexMatchStatement" => {
            let regex = body["RegexString"].as_str().unwrap();
            assert!(
                !regex.is_empty() && regex.len() as u64 <= c["regex_string_max"].as_u64().unwrap()
            );
            assert!(regex.starts_with('^'), "{regex}");
            let field = body["FieldToMatch"].as_object().unwrap();
            assert_eq!(field.len(), 1);
            assert!(strings(&c["field_to_match"]).contains(&field.keys().next().unwrap().as_str()));
            check_transformations(&body["TextTransformations"], c);
        }
        other => panic!("unexpected statement {other}"),
    }
}

fn check_transformations(t: &Value, c: &Value) {
    let t = t.as_array().unwrap();
    assert!(!t.is_empty());
    for (i, tt) in t.iter().enumerate() {
        assert_eq!(tt["Priority"].as_u64(), Some(i as u64));
        assert!(strings(&c["text_transformation_types"]).contains(&tt["Type"].as_str().unwrap()));
    }
}

fn check_aws(rules: &Value, c: &Value) {
    let rules = rules.as_array().expect("a Rules list");
    assert!(!rules.is_empty());
    let mut names = std::collections::BTreeSet::new();
    for (i, rule) in rules.iter().enumerate() {
        for field in strings(&c["rule_required"]) {
            assert!(rule.get(field).is_some(), "missing {field}: {rule}");
        }
        let name = rule["Name"].as_str().unwrap();
        assert!(name.len() as u64 <= c["name_max"].as_u64().unwrap() && word_chars(name, "-"));
        assert!(names.insert(name), "names are unique");
        assert_eq!(rule["Priority"].as_u64(), Some(i as u64));
        let v = &rule["VisibilityConfig"];
        assert!(
            v["SampledRequestsEnabled"].is_boolean() && v["CloudWatchMetricsEnabled"].is_boolean()
        );
        let metric = v["MetricName"].as_str().unwrap();
        assert!(metric.len() as u64 <= c["metric_name_max"].as_u64().unwrap());
        assert!(word_chars(metric, "#:.-/"));
        let action = rule["Action"].as_object().unwrap();
        assert_eq!(action.len(), 1);
        let (kind, body) = action.iter().next().unwrap();
        assert!(strings(&c["rate_based_actions"]).contains(&kind.as_str()));
        if kind == "Block" {
            let code = body["CustomResponse"]["ResponseCode"].as_u64().unwrap();
            assert!(code >= c["response_code"]["min"].as_u64().unwrap());
            assert!(code <= c["response_code"]["max"].as_u64().unwrap());
        }
        let rb = &rule["Statement"]["RateBasedStatement"];
        let limit = rb["Limit"].as_u64().unwrap();
        assert!(
            limit >= c["limit"]["min"].as_u64().unwrap()
                && limit <= c["limit"]["max"].as_u64().unwrap()
        );
        let window = rb["EvaluationWindowSec"].as_u64().unwrap();
        assert!(numbers(&c["evaluation_window_sec"]).contains(&window));
        let key = rb["AggregateKeyType"].as_str().unwrap();
        assert!(strings(&c["aggregate_key_type"]).contains(&key));
        if strings(&c["scope_down_required_with"]).contains(&key) {
            assert!(rb.get("ScopeDownStatement").is_some());
        }
        if strings(&c["custom_keys_required_with"]).contains(&key) {
            for k in rb["CustomKeys"].as_array().unwrap() {
                check_transformations(&k["Header"]["TextTransformations"], c);
            }
        } else {
            assert!(rb.get("CustomKeys").is_none());
        }
        if let Some(s) = rb.get("ScopeDownStatement") {
            check_aws_statement(s, c);
        }
    }
}

#[test]
fn aws_waf_output_meets_the_published_constraints() {
    let c = constraints("aws-waf-constraints.json");
    for plan in [example(), Plan::from_toml(VARIETY).unwrap()] {
        let rules: Value = serde_json::from_str(&export(&plan, EdgeTarget::AwsWaf)).unwrap();
        check_aws(&rules, &c);
    }
    let rules: Value = serde_json::from_str(&export(
        &Plan::from_toml(VARIETY).unwrap(),
        EdgeTarget::AwsWaf,
    ))
    .unwrap();
    let header = &rules[0]["Statement"]["RateBasedStatement"];
    assert_eq!(header["AggregateKeyType"], "CUSTOM_KEYS");
    assert_eq!(header["CustomKeys"][0]["Header"]["Name"], "x-api-key");
    let files = &rules[1];
    assert_eq!(files["Action"], serde_json::json!({ "Challenge": {} }));
    assert_eq!(
        files["Statement"]["RateBasedStatement"]["EvaluationWindowSec"],
        120
    );
    assert_eq!(
        files["Statement"]["RateBasedStatement"]["AggregateKeyType"],
        "CONSTANT"
    );
    assert_eq!(
        files["Statement"]["RateBasedStatement"]["ScopeDownStatement"]["RegexMatchStatement"]
            ["RegexString"],
        "^/files/"
    );
}

fn yaml(text: &str) -> Yaml {
    let mut docs = YamlLoader::load_from_str(text).expect("valid YAML");
    assert_eq!(docs.len(), 1);
    docs.remove(0)
}

#[test]
fn envoy_output_parses_as_yaml_field_by_field() {
    let doc = yaml(&export(
        &Plan::from_toml(VARIETY).unwrap(),
        EdgeTarget::Envoy,
    ));
    let filters = doc["http_filters"].as_vec().unwrap();
    assert_eq!(
        filters[0]["name"].as_str(),
        Some("envoy.filters.http.local_ratelimit")
    );
    assert_eq!(
        filters[0]["typed_config"]["@type"].as_str(),
        Some("type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit")
    );
    assert!(
        filters[0]["typed_config"]["token_bucket"].is_badvalue(),
        "no global bucket"
    );
    assert_eq!(
        filters[1]["name"].as_str(),
        Some("envoy.filters.http.router")
    );
    let vh = &doc["route_config"]["virtual_hosts"][0];
    assert_eq!(vh["domains"][0].as_str(), Some("*"));
    let routes = vh["routes"].as_vec().unwrap();
    assert_eq!(routes.len(), 2, "the login route and the catch-all");
    let login = &routes[0];
    assert_eq!(login["match"]["path"].as_str(), Some("/login"));
    assert_eq!(
        login["match"]["headers"][0]["name"].as_str(),
        Some(":method")
    );
    assert_eq!(
        login["match"]["headers"][0]["string_match"]["exact"].as_str(),
        Some("POST")
    );
    assert_eq!(login["route"]["cluster"].as_str(), Some("tollgate_origin"));
    let cfg = &login["typed_per_filter_config"]["envoy.filters.http.local_ratelimit"];
    assert_eq!(
        cfg["@type"].as_str(),
        filters[0]["typed_config"]["@type"].as_str()
    );
    assert_eq!(cfg["status"]["code"].as_str(), Some("TooManyRequests"));
    // 50 per 10 s: a bucket of 50, one token every 200 ms.
    assert_eq!(cfg["token_bucket"]["max_tokens"].as_i64(), Some(50));
    assert_eq!(cfg["token_bucket"]["tokens_per_fill"].as_i64(), Some(1));
    assert_eq!(
        cfg["token_bucket"]["fill_interval"].as_str(),
        Some("0.200s")
    );
    for which in ["filter_enabled", "filter_enforced"] {
        assert_eq!(cfg[which]["default_value"]["numerator"].as_i64(), Some(100));
        assert_eq!(
            cfg[which]["default_value"]["denominator"].as_str(),
            Some("HUNDRED")
        );
        assert!(cfg[which]["runtime_key"].as_str().is_some());
    }
    assert_eq!(routes[1]["match"]["prefix"].as_str(), Some("/"));

    // A fast rate is filled in steps Envoy accepts (at least 50 ms).
    let fast = Plan::from_toml(&VARIETY.replace(
        "limit = 50\nwindow = \"10s\"",
        "limit = 1000\nwindow = \"1s\"",
    ))
    .unwrap();
    let doc = yaml(&export(&fast, EdgeTarget::Envoy));
    let cfg = &doc["route_config"]["virtual_hosts"][0]["routes"][0]["typed_per_filter_config"]
        ["envoy.filters.http.local_ratelimit"];
    assert_eq!(cfg["token_bucket"]["tokens_per_fill"].as_i64(), Some(50));
    assert_eq!(
        cfg["token_bucket"]["fill_interval"].as_str(),
        Some("0.050s")
    );

    let doc = yaml(&export(&example(), EdgeTarget::Envoy));
    assert_eq!(
        doc["route_config"]["virtual_hosts"][0]["routes"]
            .as_vec()
            .unwrap()
            .len(),
        2
    );
}

/// A plan with one edge rule over `/api/{*rest}`, edited by `(from, to)` pairs.
fn one_rule(edits: &[(&str, &str)]) -> Result<Plan, tollgate::ConfigError> {
    let mut text = r#"
[key]
kind = "client_ip"
trusted_proxies = ["10.0.0.0/8"]
[[policies]]
name = "api"
limit = 100
window = "1m"
[[routes]]
pattern = "/api/{*rest}"
policies = ["api"]
[[routes]]
pattern = "/other"
policies = ["api"]
[default]
policies = ["api"]
[[edge.rules]]
name = "api"
routes = ["/api/{*rest}"]
key = "ip"
limit = 600
window = "1m"
"#
    .to_owned();
    for (from, to) in edits {
        assert!(text.contains(from), "{from}");
        text = text.replacen(from, to, 1);
    }
    Plan::from_toml(&text)
}

#[test]
fn every_target_refuses_what_it_cannot_express() {
    use EdgeTarget::*;
    // (edits, target, round toward stricter, field, words of the reason)
    type Case<'a> = (&'a [(&'a str, &'a str)], EdgeTarget, bool, &'a str, &'a str);
    let cases: &[Case<'_>] = &[
        // AWS WAF: windows, the minimum limit.
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"10s\"",
            )],
            AwsWaf,
            true,
            "edge.rules[0].window",
            "60, 120, 300 or 600",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"90s\"",
            )],
            AwsWaf,
            false,
            "edge.rules[0].window",
            "aws-waf: the period must be 60, 120, 300 or 600 seconds",
        ),
        (
            &[("limit = 600\nwindow = \"1m\"", "limit = 5\nwindow = \"1m\"")],
            AwsWaf,
            true,
            "edge.rules[0].limit",
            "at least 10",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"1m\"\nburst = 900",
            )],
            AwsWaf,
            false,
            "edge.rules[0].burst",
            "no separate burst",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"1m\"\nmax_delay = \"1s\"",
            )],
            AwsWaf,
            false,
            "edge.rules[0].max_delay",
            "cannot delay",
        ),
        // Cloudflare: periods.
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"90s\"",
            )],
            Cloudflare,
            false,
            "edge.rules[0].window",
            "10, 60, 120, 300, 600 or 3600",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"5s\"",
            )],
            Cloudflare,
            true,
            "edge.rules[0].window",
            "no stricter equivalent",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"1m\"\nburst = 10",
            )],
            Cloudflare,
            false,
            "edge.rules[0].burst",
            "no separate burst",
        ),
        // nginx: whole r/s or r/m, no challenge, no Forwarded header.
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 1000\nwindow = \"1h\"",
            )],
            Nginx,
            false,
            "edge.rules[0].window",
            "r/s, r/m",
        ),
        (
            &[("limit = 600\nwindow = \"1m\"", "limit = 1\nwindow = \"1d\"")],
            Nginx,
            true,
            "edge.rules[0].window",
            "slowest rate is 1r/m",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"1m\"\naction = \"challenge\"",
            )],
            Nginx,
            false,
            "edge.rules[0].action",
            "no challenge",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"1m\"\nmax_delay = \"15ms\"",
            )],
            Nginx,
            false,
            "edge.rules[0].max_delay",
            "whole number",
        ),
        (
            &[(
                "trusted_proxies = [\"10.0.0.0/8\"]",
                "trusted_proxies = [\"10.0.0.0/8\"]\nheader = \"forwarded\"",
            )],
            Nginx,
            false,
            "key.header",
            "Forwarded",
        ),
        // nginx matches the decoded path: a percent-encoded pattern would match nothing.
        (
            &[
                ("pattern = \"/other\"", "pattern = \"/caf%C3%A9\""),
                (
                    "routes = [\"/api/{*rest}\"]",
                    "routes = [\"/api/{*rest}\", \"/caf%C3%A9\"]",
                ),
            ],
            Nginx,
            false,
            "edge.rules[0].routes",
            "normalised path",
        ),
        (
            &[
                ("pattern = \"/other\"", "pattern = \"/x/../y\""),
                (
                    "routes = [\"/api/{*rest}\"]",
                    "routes = [\"/api/{*rest}\", \"/x/../y\"]",
                ),
            ],
            Nginx,
            false,
            "edge.rules[0].routes",
            "`..` segment",
        ),
        (
            &[
                ("pattern = \"/other\"", "pattern = \"/a//b\""),
                (
                    "routes = [\"/api/{*rest}\"]",
                    "routes = [\"/api/{*rest}\", \"/a//b\"]",
                ),
            ],
            Nginx,
            false,
            "edge.rules[0].routes",
            "empty segment",
        ),
        // Counts nginx cannot hold (`nginx -t` would fail).
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 4000000000\nwindow = \"1s\"\nmax_delay = \"366d\"",
            )],
            Nginx,
            false,
            "edge.rules[0].max_delay",
            "more than nginx holds",
        ),
        // Envoy: one bucket per route, shared by every client.
        (
            &[],
            Envoy,
            true,
            "edge.rules[0].key",
            "one token bucket per route",
        ),
        (
            &[
                ("key = \"ip\"", "key = \"global\""),
                (
                    "routes = [\"/api/{*rest}\"]",
                    "routes = [\"/api/{*rest}\", \"/other\"]",
                ),
            ],
            Envoy,
            true,
            "edge.rules[0].routes",
            "own rule",
        ),
        (
            &[("key = \"ip\"", "key = \"global\"\naction = \"challenge\"")],
            Envoy,
            false,
            "edge.rules[0].action",
            "no challenge",
        ),
        (
            &[("key = \"ip\"", "key = \"global\"\nmax_delay = \"1s\"")],
            Envoy,
            false,
            "edge.rules[0].max_delay",
            "cannot delay",
        ),
        // Every target: the rule itself.
        (
            &[("routes = [\"/api/{*rest}\"]", "routes = [\"/nope\"]")],
            Nginx,
            false,
            "edge.rules[0].routes[0]",
            "no [[routes]] entry",
        ),
        (
            &[("limit = 600", "limit = 0")],
            Cloudflare,
            false,
            "edge.rules[0].limit",
            "between 1",
        ),
        (
            &[("key = \"ip\"", "key = \"header\"")],
            AwsWaf,
            false,
            "edge.rules[0].header",
            "needs the header",
        ),
        (
            &[("key = \"ip\"", "key = \"header\"\nheader = \"X_Key\"")],
            AwsWaf,
            false,
            "edge.rules[0].header",
            "lower-case",
        ),
        (
            &[("name = \"api\"\nroutes", "name = \"a b\"\nroutes")],
            Envoy,
            false,
            "edge.rules[0].name",
            "letters",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"soon\"",
            )],
            Nginx,
            false,
            "edge.rules[0].window",
            "not a duration",
        ),
        (
            &[(
                "limit = 600\nwindow = \"1m\"",
                "limit = 600\nwindow = \"1m\"\ntargets = [\"nginx\"]",
            )],
            Cloudflare,
            false,
            "edge.rules",
            "no [[edge.rules]] for cloudflare",
        ),
    ];
    for (edits, target, round, field, reason) in cases {
        let plan = one_rule(edits).unwrap();
        let options = ExportOptions::new().round_stricter(*round);
        let err = plan
            .export_edge(*target, &options)
            .expect_err(&format!("{target} {edits:?}"));
        assert_eq!(err.field(), *field, "{target} {edits:?}: {err}");
        assert!(err.reason().contains(reason), "{target} {edits:?}: {err}");
    }
}

#[test]
fn rounding_is_toward_the_stricter_limit_and_only_when_asked() {
    let round = ExportOptions::new().round_stricter(true);
    // nginx: 1000 an hour is 16.666 a minute: 16r/m, said in a comment.
    let plan = one_rule(&[(
        "limit = 600\nwindow = \"1m\"",
        "limit = 1000\nwindow = \"1h\"",
    )])
    .unwrap();
    let err = plan
        .export_edge(EdgeTarget::Nginx, &ExportOptions::new())
        .unwrap_err();
    assert!(err.reason().contains("ask for rounding"), "{err}");
    let out = plan.export_edge(EdgeTarget::Nginx, &round).unwrap();
    assert!(out.text().contains("rate=16r/m;"), "{}", out.text());
    assert!(out
        .text()
        .contains("#   note: edge.rules[0] \"api\": rate rounded down to 16r/m"));
    // AWS WAF: 1000 an hour becomes 166 per 600 s (996 an hour at most).
    let out = plan.export_edge(EdgeTarget::AwsWaf, &round).unwrap();
    assert!(
        out.text().contains("\"Limit\": 166,")
            && out.text().contains("\"EvaluationWindowSec\": 600,")
    );
    assert!(out
        .notes()
        .iter()
        .any(|n| n.contains("166 per 600 s instead of 1000 per 1h")));
    // Cloudflare has the hour: exact, no note of rounding (only that IPv6 addresses count
    // alone).
    let out = plan.export_edge(EdgeTarget::Cloudflare, &round).unwrap();
    assert!(out.text().contains("\"period\": 3600"));
    assert!(
        out.notes().len() == 1 && out.notes()[0].contains("IPv6"),
        "{:?}",
        out.notes()
    );
    // Cloudflare, 90 s: the next shorter period, 60 s, with 2/3 of the requests, in the description.
    let plan = one_rule(&[(
        "limit = 600\nwindow = \"1m\"",
        "limit = 100\nwindow = \"90s\"",
    )])
    .unwrap();
    let out = plan.export_edge(EdgeTarget::Cloudflare, &round).unwrap();
    let body: Value = serde_json::from_str(out.text()).unwrap();
    assert_eq!(body["rules"][0]["ratelimit"]["period"], 60);
    assert_eq!(body["rules"][0]["ratelimit"]["requests_per_period"], 66);
    assert!(body["rules"][0]["description"]
        .as_str()
        .unwrap()
        .contains("rounded toward the stricter limit: 66 per 60 s"));
    // A challenge where nginx has none becomes a block, said so.
    let plan = one_rule(&[(
        "limit = 600\nwindow = \"1m\"",
        "limit = 600\nwindow = \"1m\"\naction = \"challenge\"",
    )])
    .unwrap();
    let out = plan.export_edge(EdgeTarget::Nginx, &round).unwrap();
    assert!(out
        .text()
        .contains("blocks with 429 instead of challenging"));
}

fn temp_dir(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-edge-{}-{name}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The nginx binary, or `None` (with a notice) where it is not installed; CI installs it
/// (Debian package `nginx`) and must not skip.
fn nginx() -> Option<PathBuf> {
    for candidate in ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(candidate).exists() {
            return Some(candidate.into());
        }
    }
    let found = Command::new("nginx").arg("-v").output().is_ok();
    if found {
        return Some("nginx".into());
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "nginx is not installed (apt-get install nginx)"
    );
    println!("NOTICE: nginx not found; the nginx tests did not run (CI installs it)");
    None
}

/// A main configuration around the exported `edge.conf`, with every path in `dir`.
fn main_conf(dir: &Path) -> PathBuf {
    let d = dir.display();
    let conf = format!(
        "worker_processes 1;\nerror_log {d}/error.log;\nevents {{ worker_connections 64; }}\nhttp {{\n    access_log off;\n    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n    include {d}/edge.conf;\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    path
}

/// `nginx -t` on `edge`, included in a main configuration of its own.
fn nginx_t(nginx: &Path, edge: &str) {
    let dir = temp_dir("t");
    std::fs::write(dir.join("edge.conf"), edge).unwrap();
    let conf = main_conf(&dir);
    let out = Command::new(nginx)
        .arg("-t")
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-g")
        .arg(format!("pid {};", dir.join("nginx.pid").display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nginx -t: {}\n{edge}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nginx_accepts_every_generated_config() {
    let Some(nginx) = nginx() else { return };
    let round = ExportOptions::new().round_stricter(true);
    let mut configs = vec![
        export(&example(), EdgeTarget::Nginx),
        export(&Plan::from_toml(VARIETY).unwrap(), EdgeTarget::Nginx),
        export(&one_rule(&[]).unwrap(), EdgeTarget::Nginx),
        export(&edge_plan(), EdgeTarget::Nginx),
    ];
    for edits in [
        &[(
            "limit = 600\nwindow = \"1m\"",
            "limit = 1000\nwindow = \"1h\"",
        )][..],
        &[("limit = 600\nwindow = \"1m\"", "limit = 1\nwindow = \"1s\"")][..],
        &[(
            "limit = 600\nwindow = \"1m\"",
            "limit = 5\nwindow = \"1m\"\nburst = 1\nmax_delay = \"1m\"",
        )][..],
        &[(
            "limit = 600\nwindow = \"1m\"",
            "limit = 600\nwindow = \"1m\"\naction = \"challenge\"\nmax_delay = \"15ms\"",
        )][..],
        &[("trusted_proxies = [\"10.0.0.0/8\"]", "trusted_proxies = []")][..],
        &[(
            "kind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]",
            "kind = \"peer_ip\"",
        )][..],
        &[("key = \"ip\"", "key = \"header\"\nheader = \"x-api-key\"")][..],
        // An extension method with a `-` (its `map` variable must still be one nginx name).
        &[
            (
                "pattern = \"/api/{*rest}\"",
                "pattern = \"M-SEARCH /api/{*rest}\"",
            ),
            (
                "routes = [\"/api/{*rest}\"]",
                "routes = [\"M-SEARCH /api/{*rest}\"]",
            ),
        ][..],
        &[(
            "trusted_proxies = [\"10.0.0.0/8\"]",
            "trusted_proxies = [\"::ffff:10.0.0.0/104\", \"::ffff:192.0.2.1\"]",
        )][..],
    ] {
        let plan = one_rule(edits).unwrap();
        configs.push(
            plan.export_edge(EdgeTarget::Nginx, &round)
                .unwrap()
                .into_text(),
        );
    }
    for conf in configs {
        nginx_t(&nginx, &conf);
    }
}

/// Behind nginx: per-user limits at the origin, 6 a minute per client IP at the edge.
fn edge_plan() -> Plan {
    Plan::from_toml(
        r#"
[key]
kind = "header"
header = "x-user"
[key.fallback]
kind = "client_ip"
trusted_proxies = ["127.0.0.1/32"]

[[policies]]
name = "per-user"
limit = 2
window = "1m"

[[routes]]
pattern = "/api/{*rest}"
policies = ["per-user"]

[default]
exempt = true

[[edge.rules]]
name = "api-ip"
routes = ["/api/{*rest}"]
limit = 6
window = "1m"
"#,
    )
    .unwrap()
}

/// nginx in the foreground, killed when dropped.
struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Nginx {
    fn start(nginx: &Path, edge: &str, port: u16) -> Nginx {
        let dir = temp_dir("run");
        std::fs::write(dir.join("edge.conf"), edge).unwrap();
        let conf = main_conf(&dir);
        let child = Command::new(nginx)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-g")
            // One process, so that killing it stops nginx entirely.
            .arg(format!(
                "daemon off; master_process off; pid {};",
                dir.join("nginx.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut guard = Nginx { child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = guard.child.try_wait() {
                let log = std::fs::read_to_string(guard.dir.join("error.log")).unwrap_or_default();
                panic!("nginx exited ({status}): {log}");
            }
            assert!(Instant::now() < deadline, "nginx did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        guard
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_drops_excess_before_the_origin_which_still_limits_per_user() {
    let Some(nginx_bin) = nginx() else { return };
    let plan = edge_plan();
    assert!(
        tollgate::audit(&plan).pass,
        "{}",
        tollgate::audit(&plan).to_text()
    );

    // The origin: a counting layer outside tollgate's layer (every request that reached the
    // app), and a handler that counts the requests tollgate let through and answers with the
    // key tollgate used.
    let reached = Arc::new(AtomicUsize::new(0));
    let handled = Arc::new(AtomicUsize::new(0));
    let extractor: Arc<dyn tollgate::key::KeyExtractor> = Arc::from(plan.extractor().unwrap());
    let built = plan.build().unwrap();
    let handler = {
        let handled = handled.clone();
        move |req: axum::extract::Request<Body>| {
            let handled = handled.clone();
            let extractor = extractor.clone();
            async move {
                handled.fetch_add(1, Ordering::SeqCst);
                extractor
                    .extract(&RequestView::new(&req))
                    .map(|k| k.as_str().to_owned())
                    .unwrap_or_default()
            }
        }
    };
    let counting = {
        let reached = reached.clone();
        axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                reached.fetch_add(1, Ordering::SeqCst);
                next.run(req)
            },
        )
    };
    let app = Router::new()
        .route("/api/{*rest}", get(handler))
        .layer(built.layer())
        .layer(counting);
    let origin: SocketAddr = support::serve(app).await;

    let port = support::free_port();
    let options = ExportOptions::new()
        .listen(format!("127.0.0.1:{port}"))
        .origin(origin.to_string());
    let edge = plan.export_edge(EdgeTarget::Nginx, &options).unwrap();
    assert!(
        edge.text().contains("set_real_ip_from 127.0.0.1/32;"),
        "{}",
        edge.text()
    );
    assert!(edge.text().contains("rate=6r/m;") && edge.text().contains("burst=5 nodelay;"));
    nginx_t(&nginx_bin, edge.text());
    let _nginx = Nginx::start(&nginx_bin, edge.text(), port);

    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    // The test client connects from 127.0.0.1, which nginx trusts to name the client: each
    // X-Forwarded-For below is a different client at the edge.
    let get = |ip: &'static str, user: Option<&'static str>| {
        let mut req = client
            .get(format!("http://127.0.0.1:{port}/api/items"))
            .header("x-forwarded-for", ip);
        if let Some(user) = user {
            req = req.header("x-user", user);
        }
        async move {
            let res = req.send().await.unwrap();
            let status = res.status().as_u16();
            let from_tollgate = res.headers().contains_key("retry-after");
            (status, from_tollgate, res.text().await.unwrap())
        }
    };
    let a = "203.0.113.7";
    let mut seen = vec![];
    for user in [
        Some("alice"),
        Some("alice"),
        Some("alice"),
        None,
        None,
        Some("bob"),
    ] {
        seen.push(get(a, user).await);
    }
    let statuses: Vec<u16> = seen.iter().map(|s| s.0).collect();
    // Within the edge's 6: alice's third is the origin's per-user 429, the others pass.
    assert_eq!(statuses, [200, 200, 429, 200, 200, 200], "{seen:?}");
    assert!(seen[2].1, "the origin's 429 carries Retry-After: {seen:?}");
    assert!(seen[0].2.contains("alice"), "{seen:?}");
    // Without a user the origin keys on the client nginx forwarded, not on nginx.
    assert_eq!(seen[3].2, format!("ip:{a}"));
    assert_eq!(reached.load(Ordering::SeqCst), 6);
    assert_eq!(handled.load(Ordering::SeqCst), 5);

    // Beyond the edge's 6: nginx answers 429 itself; the app never sees the requests.
    for user in [Some("carol"), None] {
        let (status, from_tollgate, body) = get(a, user).await;
        assert_eq!(status, 429, "{body}");
        assert!(!from_tollgate && body.contains("nginx"), "{body}");
    }
    assert_eq!(reached.load(Ordering::SeqCst), 6);
    assert_eq!(handled.load(Ordering::SeqCst), 5);

    // The same client spelling the path so that nginx would choose another location (an
    // unlimited one) while the origin routes it to /api/{*rest}: refused at the edge. Sent as
    // raw bytes: an HTTP client would normalise the path first.
    for path in [
        "/api/a/../../x",
        "/api/a/%2e%2e/%2E%2E/x",
        "/api/a%2F..%2Fx",
        "/x/../api/items",
    ] {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: edge\r\nX-Forwarded-For: {a}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 400") || answer.starts_with("HTTP/1.1 429"),
            "{path}: {answer}"
        );
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        6,
        "a re-spelt path reached the origin"
    );

    // Another client still passes the edge, and is keyed as itself at the origin.
    let b = "198.51.100.9";
    let (status, _, body) = get(b, None).await;
    assert_eq!((status, body.as_str()), (200, format!("ip:{b}").as_str()));
    assert_eq!(reached.load(Ordering::SeqCst), 7);
    assert_eq!(handled.load(Ordering::SeqCst), 6);
}

/// The guide's worked example: its plan exports exactly the nginx file it shows.
#[test]
fn the_readme_example_is_what_the_exporter_writes() {
    let readme = std::fs::read_to_string("docs/edge.md").unwrap();
    let section = &readme[readme.find("# Edge and origin").unwrap()..];
    let block = |fence: &str| {
        let start = section.find(fence).unwrap() + fence.len();
        section[start..start + section[start..].find("```").unwrap()].to_owned()
    };
    let plan = Plan::from_toml(&block("```toml\n")).unwrap();
    assert!(tollgate::audit(&plan).pass);
    let text = plan
        .export_edge(EdgeTarget::Nginx, &ExportOptions::new().listen("8080"))
        .unwrap()
        .into_text();
    let body: String = text
        .lines()
        .skip_while(|l| l.starts_with('#') || l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(body, block("```nginx\n"));
}

/// An `[edge]` that does not resolve fails the audit, naming the field.
#[test]
fn a_broken_edge_section_fails_the_audit() {
    let plan = one_rule(&[("routes = [\"/api/{*rest}\"]", "routes = [\"/nope\"]")]).unwrap();
    let report = tollgate::audit(&plan);
    assert!(!report.pass);
    let f = report.findings.iter().find(|f| f.rule == "TG000").unwrap();
    assert_eq!(f.field.as_deref(), Some("edge.rules[0].routes[0]"));
    assert_eq!(f.value.as_deref(), Some("\"/nope\""));
    // /other is unauthenticated and uncovered; the edge's 600 a minute leaves the origin's
    // 100 alive, until the origin's limit is the looser one.
    let plan = one_rule(&[]).unwrap();
    let rules = |plan: &Plan| -> Vec<&'static str> {
        tollgate::audit(plan)
            .findings
            .iter()
            .map(|f| f.rule)
            .collect()
    };
    assert_eq!(rules(&plan), ["TG012"]);
    let dead = one_rule(&[("limit = 100\n", "limit = 1000\n")]).unwrap();
    assert_eq!(rules(&dead), ["TG012", "TG013"]);
}

// nginx sees an IPv4 peer as IPv4: an IPv4-mapped trusted proxy, which the origin matches
// either way, is written as the IPv4 network, or no peer matches and nginx reads every
// client as the proxy (one key for all of them).
#[test]
fn nginx_trusts_an_ipv4_mapped_proxy_as_the_ipv4_network() {
    let plan = one_rule(&[(
        "trusted_proxies = [\"10.0.0.0/8\"]",
        "trusted_proxies = [\"::ffff:10.0.0.0/104\", \"::ffff:192.0.2.1\", \"2001:db8::/32\"]",
    )])
    .unwrap();
    let text = export(&plan, EdgeTarget::Nginx);
    assert!(text.contains("set_real_ip_from 10.0.0.0/8;"), "{text}");
    assert!(text.contains("set_real_ip_from 192.0.2.1;"), "{text}");
    assert!(text.contains("set_real_ip_from 2001:db8::/32;"), "{text}");
    assert!(!text.contains("::ffff:"), "{text}");
}

// A plan keyed by a header: the exported comment says nginx keys IP rules on the
// connection, not that the plan reads the TCP peer.
#[test]
fn the_nginx_comment_names_what_the_plan_keys_by() {
    let plan = one_rule(&[(
        "kind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]",
        "kind = \"api_key\"\nheader = \"x-api-key\"",
    )])
    .unwrap();
    let text = export(&plan, EdgeTarget::Nginx);
    assert!(!text.contains("reads the TCP peer"), "{text}");
    assert!(text.contains("reads no address behind proxies"), "{text}");
}

/// Routes of which the origin (matchit, as axum) prefers the catch-all on some paths and the
/// parameters on others, and patterns that mix text and parameters in a segment: each with
/// the limit of its edge rule (per client, a minute), or none.
const PRECEDENCE: &[(&str, Option<u64>)] = &[
    ("/api/users/{*rest}", Some(1)),
    ("/api/{kind}/{id}", Some(600)),
    ("/assets/{*rest}", Some(1)),
    ("/assets/img-{id}", None),
    ("/docs/{page}", Some(600)),
    ("/docs/v{*path}", Some(1)),
    ("/f{x}", Some(600)),
    ("/file-{id}", Some(1)),
];

/// A plan with a route and, where a limit is given, an edge rule for each of `routes`.
fn precedence_plan(routes: &[(&str, Option<u64>)]) -> Plan {
    let mut text = String::from(
        "[key]\nkind = \"peer_ip\"\n[[policies]]\nname = \"open\"\nlimit = 1000\nwindow = \"1m\"\n[default]\nexempt = true\n",
    );
    for (pattern, _) in routes {
        text.push_str(&format!(
            "[[routes]]\npattern = {pattern:?}\npolicies = [\"open\"]\n"
        ));
    }
    for (i, (pattern, limit)) in routes.iter().enumerate() {
        if let Some(limit) = limit {
            text.push_str(&format!(
                "[[edge.rules]]\nname = \"r{i}\"\nroutes = [{pattern:?}]\nlimit = {limit}\nwindow = \"1m\"\n"
            ));
        }
    }
    Plan::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

// nginx tries regex locations before a prefix unless the prefix says `^~`, where the origin
// prefers the more specific route: `/api/users/5` is the origin's `/api/users/{*rest}`, and
// must be limited by that route's edge rule, not by `/api/{kind}/{id}`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_picks_the_route_the_origin_picks() {
    let Some(nginx_bin) = nginx() else { return };
    let plan = precedence_plan(PRECEDENCE);
    plan.build().expect("a route set the origin accepts");
    let origin: SocketAddr = support::serve(Router::new().fallback(|| async { "origin" })).await;
    let port = support::free_port();
    let options = ExportOptions::new()
        .listen(format!("127.0.0.1:{port}"))
        .origin(origin.to_string());
    let edge = plan.export_edge(EdgeTarget::Nginx, &options).unwrap();
    nginx_t(&nginx_bin, edge.text());
    let _nginx = Nginx::start(&nginx_bin, edge.text(), port);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let statuses = |path: &'static str| {
        let client = client.clone();
        async move {
            let mut seen = vec![];
            for _ in 0..2 {
                let url = format!("http://127.0.0.1:{port}{path}");
                seen.push(client.get(url).send().await.unwrap().status().as_u16());
            }
            seen
        }
    };
    let text = edge.text();
    // The origin's `/api/users/{*rest}` (a static segment before a parameter): 1 allowed.
    assert_eq!(statuses("/api/users/5").await, [200, 429], "{text}");
    assert_eq!(statuses("/api/users/6/photos").await, [429, 429], "{text}");
    // The catch-all needs a character after its prefix: `/api/users/` is no route of the rule.
    assert_eq!(statuses("/api/users/").await, [200, 200], "{text}");
    // `/assets/img-{id}`, which no edge rule limits, is not counted under the rule of
    // `/assets/{*rest}`, which limits the rest.
    assert_eq!(statuses("/assets/img-5").await, [200, 200], "{text}");
    assert_eq!(statuses("/assets/app.js").await, [200, 429], "{text}");
    // `/api/{kind}/{id}`: 600 allowed.
    assert_eq!(statuses("/api/orders/5").await, [200, 200], "{text}");
    // `/docs/v{*path}` (a static `v` before `{page}`): 1 allowed; other pages 600.
    assert_eq!(statuses("/docs/v2").await, [200, 429], "{text}");
    assert_eq!(statuses("/docs/intro").await, [200, 200], "{text}");
    // `/file-{id}` over `/f{x}`: 1 allowed; other `/f…` paths 600.
    assert_eq!(statuses("/file-1").await, [200, 429], "{text}");
    assert_eq!(statuses("/fun").await, [200, 200], "{text}");
}

/// A route's method reaches nginx `map` keys and AWS WAF regexes: one those read as syntax
/// (`~` a regex, `#` a comment, `'` a quote, `|` and `*` regex operators) is refused, naming
/// the route, rather than exported to match every method or none.
#[test]
fn a_method_the_edge_would_read_as_syntax_is_refused() {
    for method in ["~", "#X", "'X", "A|B", ".*"] {
        let pattern = format!("{method} /api/{{*rest}}");
        let plan = one_rule(&[
            (
                "pattern = \"/api/{*rest}\"",
                &format!("pattern = {pattern:?}"),
            ),
            (
                "routes = [\"/api/{*rest}\"]",
                &format!("routes = [{pattern:?}]"),
            ),
        ])
        .unwrap();
        for target in [
            EdgeTarget::Nginx,
            EdgeTarget::AwsWaf,
            EdgeTarget::Cloudflare,
        ] {
            let err = plan
                .export_edge(target, &ExportOptions::new())
                .expect_err(&format!("{target} {method}"));
            assert!(
                err.field().starts_with("edge.rules[0].routes"),
                "{target} {method}: {err}"
            );
            assert!(err.reason().contains("method"), "{target} {method}: {err}");
        }
    }
    // An ordinary method is exported.
    let plan = one_rule(&[
        (
            "pattern = \"/api/{*rest}\"",
            "pattern = \"POST /api/{*rest}\"",
        ),
        (
            "routes = [\"/api/{*rest}\"]",
            "routes = [\"POST /api/{*rest}\"]",
        ),
    ])
    .unwrap();
    assert!(export(&plan, EdgeTarget::Nginx).contains("POST"));
}

/// With a one-address header (`x-real-ip`), nginx sends the origin the client it resolved,
/// not the header as the client wrote it: the origin trusts nginx and keys by that header.
#[test]
fn nginx_passes_on_the_client_it_resolved_in_a_one_address_header() {
    let text = export(&Plan::from_toml(VARIETY).unwrap(), EdgeTarget::Nginx);
    assert!(text.contains("real_ip_header x-real-ip;"), "{text}");
    assert!(
        text.contains("proxy_set_header x-real-ip $remote_addr;"),
        "{text}"
    );
}

/// Where the edge counts less than the origin, the export says so: each IPv6 address alone
/// (the origin groups them by prefix), and, keyed by a header, no request without it.
#[test]
fn what_the_edge_does_not_count_is_noted_for_every_target() {
    let by_ip = one_rule(&[]).unwrap();
    let by_header =
        one_rule(&[("key = \"ip\"", "key = \"header\"\nheader = \"x-api-key\"")]).unwrap();
    for target in [
        EdgeTarget::Nginx,
        EdgeTarget::AwsWaf,
        EdgeTarget::Cloudflare,
    ] {
        let out = by_ip.export_edge(target, &ExportOptions::new()).unwrap();
        assert!(
            out.notes().iter().any(|n| n.contains("IPv6")),
            "{target}: {:?}",
            out.notes()
        );
    }
    for target in [EdgeTarget::Nginx, EdgeTarget::AwsWaf] {
        let out = by_header
            .export_edge(target, &ExportOptions::new())
            .unwrap();
        assert!(
            out.notes().iter().any(|n| n.contains("without x-api-key")),
            "{target}: {:?}",
            out.notes()
        );
    }
}
