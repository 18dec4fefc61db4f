//! AWS WAF (v2): one rule with a `RateBasedStatement` per edge rule, as the `Rules` list of
//! a web ACL (`aws wafv2 update-web-acl --rules file://rules.json …`, which replaces the web
//! ACL's rules: merge them with any it has first).

use serde_json::{json, Value};

use super::resolve::{EdgeRule, Key, PathMatch, RouteMatch};
use super::{EdgeAction, EdgeTarget, ExportOptions};
use crate::error::ConfigError;

const TARGET: EdgeTarget = EdgeTarget::AwsWaf;

/// The `EvaluationWindowSec` values AWS WAF accepts.
pub(crate) const WINDOWS: [u64; 4] = [60, 120, 300, 600];
/// The smallest `Limit` AWS WAF accepts.
pub(crate) const MIN_LIMIT: u64 = 10;
/// The largest `Limit` AWS WAF accepts.
pub(crate) const MAX_LIMIT: u64 = 2_000_000_000;

fn no_transformation() -> Value {
    json!([{ "Priority": 0, "Type": "NONE" }])
}

/// Regular expressions rather than byte matches: their pattern is a plain string in every
/// client, where a byte match's search string is base64 in the API and raw in some SDKs.
fn regex_match(field: Value, regex: String) -> Value {
    json!({
        "RegexMatchStatement": {
            "RegexString": regex,
            "FieldToMatch": field,
            "TextTransformations": no_transformation(),
        }
    })
}

fn all_of(mut statements: Vec<Value>) -> Value {
    if statements.len() == 1 {
        statements.remove(0)
    } else {
        json!({ "AndStatement": { "Statements": statements } })
    }
}

fn any_of(mut statements: Vec<Value>) -> Value {
    if statements.len() == 1 {
        statements.remove(0)
    } else {
        json!({ "OrStatement": { "Statements": statements } })
    }
}

fn route_statement(route: &RouteMatch) -> Value {
    let regex = match &route.path {
        PathMatch::Exact(p) => format!("^{}$", p.replace('.', "\\.")),
        PathMatch::Prefix(p) => format!("^{}", p.replace('.', "\\.")),
        PathMatch::Regex(r) => r.clone(),
    };
    let mut parts = vec![];
    if let Some(methods) = &route.methods {
        parts.push(regex_match(
            json!({ "Method": {} }),
            format!("^({})$", methods.join("|")),
        ));
    }
    parts.push(regex_match(json!({ "UriPath": {} }), regex));
    all_of(parts)
}

fn rule_json(
    rule: &EdgeRule,
    priority: usize,
    round_stricter: bool,
    notes: &mut Vec<String>,
) -> Result<Value, ConfigError> {
    let (window, limit) =
        rule.window_counter(TARGET, &WINDOWS, MIN_LIMIT, round_stricter, notes)?;
    if limit > MAX_LIMIT {
        return Err(rule.refuse(
            "limit",
            rule.limit,
            TARGET,
            format!("the Limit must be at most {MAX_LIMIT} per evaluation window"),
        ));
    }
    let mut statement = json!({
        "Limit": limit,
        "EvaluationWindowSec": window,
        "ScopeDownStatement": any_of(rule.routes.iter().map(route_statement).collect()),
    });
    match &rule.key {
        Key::Ip => notes.push(format!(
            "edge.rules[{}] {:?}: AWS WAF counts each IPv6 address alone, where the origin groups IPv6 clients by prefix (/56 unless [key] says otherwise)",
            rule.index, rule.name
        )),
        Key::Header(h) => notes.push(format!(
            "edge.rules[{}] {:?}: AWS WAF leaves a request without {h} out of the rule: only the origin limits those",
            rule.index, rule.name
        )),
        Key::Global => {}
    }
    match &rule.key {
        Key::Ip => statement["AggregateKeyType"] = json!("IP"),
        Key::Global => statement["AggregateKeyType"] = json!("CONSTANT"),
        Key::Header(h) => {
            statement["AggregateKeyType"] = json!("CUSTOM_KEYS");
            statement["CustomKeys"] = json!([{
                "Header": { "Name": h, "TextTransformations": no_transformation() }
            }]);
        }
    }
    let action = match rule.action {
        EdgeAction::Block => json!({ "Block": { "CustomResponse": { "ResponseCode": 429 } } }),
        EdgeAction::Challenge => json!({ "Challenge": {} }),
    };
    let name = format!("tollgate-edge-{}", rule.name);
    Ok(json!({
        "Name": name,
        "Priority": priority,
        "Statement": { "RateBasedStatement": statement },
        "Action": action,
        "VisibilityConfig": {
            "SampledRequestsEnabled": true,
            "CloudWatchMetricsEnabled": true,
            "MetricName": name,
        },
    }))
}

pub(super) fn export(
    rules: &[EdgeRule],
    options: &ExportOptions,
    notes: &mut Vec<String>,
) -> Result<String, ConfigError> {
    let rules = rules
        .iter()
        .enumerate()
        .map(|(priority, r)| rule_json(r, priority, options.round_stricter, notes))
        .collect::<Result<Vec<_>, _>>()?;
    let mut text = serde_json::to_string_pretty(&rules).unwrap_or_default();
    text.push('\n');
    Ok(text)
}
