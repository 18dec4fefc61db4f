//! The Prometheus alert rules and the Grafana dashboard in `observability/`: the rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`), the dashboard's
//! queries are valid PromQL, and both use only metric names tollgate records.
//!
//! promtool is required (Debian package `prometheus`; CI installs it): these tests fail
//! without it rather than pass without checking anything.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("observability")
}

/// Runs `promtool` with `args`; panics with its output unless it succeeds.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).output().unwrap_or_else(|e| {
        panic!("promtool {args:?}: {e}; install it (Debian package prometheus, or the Prometheus release tarball)")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Every `tollgate_*` metric name in `text`, without the histogram series suffixes.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("tollgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        names.insert(base.to_owned());
        rest = &tail[end..];
    }
    names
}

/// The metric names tollgate records (`src/telemetry.rs`).
fn recorded_names() -> BTreeSet<String> {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/telemetry.rs"))
            .unwrap();
    metric_names(&src)
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let rules = dir().join("prometheus/tollgate-alerts.yml");
    let tests = dir().join("prometheus/tollgate-alerts.test.yml");
    let checked = promtool(&["check", "rules", rules.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS: 7 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", tests.to_str().unwrap()]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn alert_rules_use_only_recorded_metrics() {
    let rules = std::fs::read_to_string(dir().join("prometheus/tollgate-alerts.yml")).unwrap();
    let used = metric_names(&rules);
    let recorded = recorded_names();
    assert!(used.len() >= 5, "{used:?}");
    let unknown: Vec<_> = used.difference(&recorded).collect();
    assert!(unknown.is_empty(), "not recorded by tollgate: {unknown:?}");
}

#[test]
fn dashboard_queries_are_valid_promql_over_recorded_metrics() {
    let text = std::fs::read_to_string(dir().join("grafana/tollgate-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = vec![];
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 8);
    let used = metric_names(&exprs.join("\n"));
    let recorded = recorded_names();
    let unknown: Vec<_> = used.difference(&recorded).collect();
    assert!(unknown.is_empty(), "not recorded by tollgate: {unknown:?}");
    // Every metric tollgate records has a panel, except the eviction histogram.
    let missing: Vec<_> = recorded
        .difference(&used)
        .filter(|n| *n != "tollgate_memory_evicted_usage_ratio")
        .collect();
    assert!(missing.is_empty(), "no panel shows {missing:?}");

    // promtool parses PromQL in rule files: the queries, with Grafana's variables filled in,
    // as recording rules.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        let expr = expr.replace("$__rate_interval", "5m").replace("$job", ".*");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let file = std::env::temp_dir().join(format!("tollgate-dashboard-{}.yml", std::process::id()));
    std::fs::write(&file, rules).unwrap();
    let checked = promtool(&["check", "rules", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(checked.contains("SUCCESS"), "{checked}");
}

#[test]
fn metric_names_strip_histogram_suffixes() {
    let names = metric_names("rate(tollgate_store_latency_seconds_bucket[5m]) tollgate_x_total");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["tollgate_store_latency_seconds", "tollgate_x_total"]
    );
}

/// A histogram the rules or the dashboard read by its `_bucket` series is given buckets in
/// the documented recorder set-up and in the `metrics` example: `metrics-exporter-prometheus`
/// renders a histogram without buckets as a summary, which has no `_bucket` series, and the
/// dashboard's Sentinel failover panel was once empty for that reason.
#[test]
fn every_histogram_read_by_buckets_is_given_buckets_where_the_recorder_is_set_up() {
    let read: String = [
        "prometheus/tollgate-alerts.yml",
        "grafana/tollgate-dashboard.json",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(dir().join(f)).unwrap())
    .collect();
    let mut bucketed = BTreeSet::new();
    let mut rest = read.as_str();
    while let Some(at) = rest.find("_bucket") {
        let start = rest[..at].rfind("tollgate_").unwrap();
        bucketed.insert(rest[start..at].to_owned());
        rest = &rest[at + "_bucket".len()..];
    }
    assert!(!bucketed.is_empty());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for setup in ["docs/observability.md", "examples/metrics.rs"] {
        let text = std::fs::read_to_string(root.join(setup)).unwrap();
        for name in &bucketed {
            assert!(
                text.contains(&format!("Matcher::Full(\"{name}\"")),
                "{setup} sets no buckets for {name}, which the rules or the dashboard read"
            );
        }
    }
}
