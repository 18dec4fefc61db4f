//! Cloudflare: rate limiting rules for the Rulesets API's `http_ratelimit` phase
//! (`PUT /zones/{zone_id}/rulesets/phases/http_ratelimit/entrypoint` with this body, which
//! replaces the phase's rules: merge them with any it has first).

use serde_json::{json, Value};

use super::resolve::{EdgeRule, Key, PathMatch, RouteMatch};
use super::{EdgeAction, EdgeTarget, ExportOptions};
use crate::error::ConfigError;

const TARGET: EdgeTarget = EdgeTarget::Cloudflare;

/// The `period` values the API accepts, in seconds (which ones a zone may use depends on
/// its plan).
pub(crate) const PERIODS: [u64; 6] = [10, 60, 120, 300, 600, 3600];

/// A string literal of Cloudflare's rules language.
fn literal(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn route_expression(route: &RouteMatch) -> String {
    let path = match &route.path {
        PathMatch::Exact(p) => format!("http.request.uri.path eq {}", literal(p)),
        PathMatch::Prefix(p) => format!("starts_with(http.request.uri.path, {})", literal(p)),
        PathMatch::Regex(r) => format!("http.request.uri.path matches {}", literal(r)),
    };
    match route.methods.as_deref() {
        None => format!("({path})"),
        Some([one]) => format!("(http.request.method eq {} and {path})", literal(one)),
        Some(many) => {
            let set: Vec<String> = many.iter().map(|m| literal(m)).collect();
            format!("(http.request.method in {{{}}} and {path})", set.join(" "))
        }
    }
}

fn rule_json(
    rule: &EdgeRule,
    round_stricter: bool,
    notes: &mut Vec<String>,
) -> Result<Value, ConfigError> {
    let before = notes.len();
    let (period, requests) = rule.window_counter(TARGET, &PERIODS, 1, round_stricter, notes)?;
    let mut characteristics = vec![json!("cf.colo.id")];
    match &rule.key {
        Key::Ip => characteristics.push(json!("ip.src")),
        Key::Header(h) => characteristics.push(json!(format!("http.request.headers[\"{h}\"]"))),
        Key::Global => {}
    }
    let expression: Vec<String> = rule.routes.iter().map(route_expression).collect();
    let mut description = format!(
        "tollgate edge.rules[{}] {:?}: {}; counted per Cloudflare data center",
        rule.index,
        rule.name,
        rule.describe()
    );
    if rule.key == Key::Ip {
        notes.push(format!(
            "edge.rules[{}] {:?}: Cloudflare counts each IPv6 address alone, where the origin groups IPv6 clients by prefix (/56 unless [key] says otherwise)",
            rule.index, rule.name
        ));
    }
    if let Key::Header(h) = &rule.key {
        notes.push(format!(
            "edge.rules[{}] {:?}: Cloudflare advises against a header ({h}) as a rule's only characteristic besides cf.colo.id; it is used as the plan says",
            rule.index, rule.name
        ));
    }
    for note in &notes[before..] {
        description.push_str(&format!("; note: {note}"));
    }
    let mut out = json!({
        "description": description,
        "expression": expression.join(" or "),
        "ratelimit": {
            "characteristics": characteristics,
            "period": period,
            "requests_per_period": requests,
        },
    });
    // A challenge resets the client's counter when passed; the API wants no timeout with it.
    let (action, timeout) = match rule.action {
        EdgeAction::Block => ("block", period),
        EdgeAction::Challenge => ("managed_challenge", 0),
    };
    out["action"] = json!(action);
    out["ratelimit"]["mitigation_timeout"] = json!(timeout);
    if rule.action == EdgeAction::Block {
        out["action_parameters"] = json!({
            "response": {
                "status_code": 429,
                "content_type": "application/json",
                "content": "{\"error\":\"rate_limited\",\"message\":\"Too many requests.\"}",
            }
        });
    }
    Ok(out)
}

pub(super) fn export(
    rules: &[EdgeRule],
    options: &ExportOptions,
    notes: &mut Vec<String>,
) -> Result<String, ConfigError> {
    let rules = rules
        .iter()
        .map(|r| rule_json(r, options.round_stricter, notes))
        .collect::<Result<Vec<_>, _>>()?;
    let body = json!({ "rules": rules });
    let mut text = serde_json::to_string_pretty(&body).unwrap_or_default();
    text.push('\n');
    Ok(text)
}
