//! The audit's edge rules: `[edge]` that does not resolve (`TG000`), unauthenticated routes
//! no edge rule covers (`TG012`), edge limits that leave an origin limit dead (`TG013`), and
//! edge IP keys the origin would not see the same way (`TG014`).

use super::resolve::{self, EdgeRule, Key};
use crate::config::schema::parse_duration;
use crate::config::{KeyConfig, KeyKind, Plan, RouteConfig};

/// A finding: rule id, message, and the field and value at fault.
pub(crate) type EdgeFinding = (&'static str, String, Option<(String, String)>);

/// Whether the origin's `[key]` counts by the same thing as the edge rule's key.
fn same_key(origin: &KeyConfig, edge: &Key) -> bool {
    match edge {
        Key::Ip => origin.kind.is_ip_only(),
        Key::Header(h) => {
            matches!(origin.kind, KeyKind::Header | KeyKind::ApiKey)
                && origin
                    .header
                    .as_deref()
                    .is_some_and(|o| o.trim().eq_ignore_ascii_case(h))
        }
        Key::Global => origin.kind == KeyKind::Global,
    }
}

/// Requests per window and at once that `policy` allows on `route`, with its window (ms).
fn origin_allowance(plan: &Plan, route: &RouteConfig, policy: &str) -> Option<(u64, u64, u64)> {
    let p = plan.policies.iter().find(|p| p.name == policy)?;
    let window = parse_duration("window", &p.window).ok()?;
    let window_ms = u64::try_from(window.as_millis()).ok()?.max(1);
    let cost = route.cost.or(p.cost).unwrap_or(1).max(1);
    let capacity = p.burst.unwrap_or(p.limit);
    Some((p.limit / cost, window_ms, capacity / cost))
}

/// `TG013`: edge rules stricter than an origin policy on the same key and route (the route's
/// own key, else `[key]`).
fn dead_origin_limits(plan: &Plan, rule: &EdgeRule, out: &mut Vec<EdgeFinding>) {
    for route in &rule.routes {
        let Some((k, r)) = plan
            .routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.pattern.trim() == route.pattern)
        else {
            continue;
        };
        if !same_key(r.key_in(&plan.key, k).0, &rule.key) {
            continue;
        }
        let names = r.policies.iter().chain(r.tiers.values().flatten());
        for name in names {
            let Some((requests, window_ms, capacity)) = origin_allowance(plan, r, name) else {
                continue;
            };
            let slower = u128::from(rule.limit) * u128::from(window_ms)
                <= u128::from(requests) * u128::from(rule.window_ms);
            if slower && rule.burst <= capacity {
                out.push((
                    "TG013",
                    format!(
                        "edge.rules[{}] {:?} ({}) is at least as strict as policy {name:?} on routes[{k}] ({:?}) for the same key: the origin limit never trips",
                        rule.index,
                        rule.name,
                        rule.describe(),
                        r.pattern
                    ),
                    Some((rule.field("limit"), rule.limit.to_string())),
                ));
            }
        }
    }
}

/// The origin's view of the client address for `key` and its fallbacks: the first section
/// that reads an address, with its path.
fn origin_ip_section(key: &KeyConfig, path: String) -> Option<(&KeyConfig, String)> {
    if matches!(
        key.kind,
        KeyKind::PeerIp | KeyKind::ClientIp | KeyKind::IpUserAgent
    ) {
        return Some((key, path));
    }
    key.fallback
        .as_deref()
        .and_then(|next| origin_ip_section(next, format!("{path}.fallback")))
}

/// `TG014`: an edge keyed by client IP in front of an origin that sees only the edge: for
/// `[key]`, and for the own key of each route an IP-keyed rule covers.
fn unseen_edge_keys(plan: &Plan, rules: &[EdgeRule], out: &mut Vec<EdgeFinding>) {
    let Some(rule) = rules.iter().find(|r| r.key == Key::Ip) else {
        return;
    };
    let mut keys = vec![(&plan.key, "key".to_owned())];
    for (k, r) in plan.routes.iter().enumerate() {
        let covered = rules
            .iter()
            .filter(|r| r.key == Key::Ip)
            .any(|rule| rule.routes.iter().any(|m| m.pattern == r.pattern.trim()));
        if covered {
            keys.extend(r.own_keys(k).map(|(path, key)| (key, path)));
        }
    }
    for (key, path) in keys {
        let Some((section, path)) = origin_ip_section(key, path) else {
            continue; // this key does not read an address at all
        };
        let (field, value) = match section.kind {
            KeyKind::PeerIp => (format!("{path}.kind"), "\"peer_ip\"".to_owned()),
            _ if section.trusted_proxies.is_empty() => {
                (format!("{path}.trusted_proxies"), "[]".to_owned())
            }
            _ => continue,
        };
        out.push((
            "TG014",
            format!(
                "edge.rules[{}] {:?} keys by client IP, but behind the edge {field} = {value} makes the origin see the edge's (or a load balancer's) address: every client shares one origin key",
                rule.index, rule.name
            ),
            Some((field, value)),
        ));
    }
}

/// Every edge finding of the plan, for [`audit`](crate::audit()).
pub(crate) fn findings(plan: &Plan) -> Vec<EdgeFinding> {
    let mut out = vec![];
    if plan.edge.is_none() {
        return out;
    }
    let rules = match resolve::rules(plan) {
        Ok(rules) => rules,
        Err(e) => {
            out.push((
                "TG000",
                e.to_string(),
                Some((e.field().to_owned(), e.value().to_owned())),
            ));
            return out;
        }
    };
    for (k, route) in plan.routes.iter().enumerate() {
        if route.authenticated || !route.is_customer_facing() {
            continue;
        }
        let covered = rules
            .iter()
            .any(|r| r.routes.iter().any(|m| m.pattern == route.pattern.trim()));
        if !covered {
            out.push((
                "TG012",
                format!(
                    "routes[{k}] ({:?}) serves unauthenticated customers and no [[edge.rules]] covers it",
                    route.pattern
                ),
                Some((
                    format!("routes[{k}].pattern"),
                    format!("{:?}", route.pattern),
                )),
            ));
        }
    }
    for rule in &rules {
        dead_origin_limits(plan, rule, &mut out);
    }
    unseen_edge_keys(plan, &rules, &mut out);
    out
}
