//! A deterministic review of a rate-limit [`Plan`]: the field's known pitfalls as rules.
//!
//! [`audit`] looks only at the plan's structured fields (never at names or free text), so the
//! same plan always gets the same report. Each [`Finding`] carries a stable rule id:
//!
//! | rule | severity | what trips it |
//! |---|---|---|
//! | `TG001` fixed-window-customer-facing | error | a customer-facing route uses a fixed-window policy (2× boundary burst) |
//! | `TG002` memory-store-replicated | error | the memory store with `replicas > 1` (N pods = N× the limit) |
//! | `TG003` failure-mode-unset | error | a Redis store without a `failure_mode` |
//! | `TG004` fail-open-without-telemetry | error | `failure_mode = "fail_open"` with `telemetry = false` |
//! | `TG005` retry-after-disabled | error | `retry_after = false` |
//! | `TG006` auth-route-unprotected | error | an `auth` route that is exempt or has no policy |
//! | `TG007` login-tuples-incomplete | warning | `auth` routes without a `[login]` section naming the (IP, username), (IP) and (username) policies |
//! | `TG008` ip-only-key-for-authenticated-route | warning | an `authenticated` customer route keyed by IP only |
//! | `TG009` policy-shared-by-auth-and-read | error | one policy on both an `auth` route and a `read` route |
//! | `TG010` cluster-key-template-without-hash-tag | error | Redis Cluster with a `key_template` lacking a `{…}` hash tag |
//!
//! The score starts at 100 and loses 25 per error and 10 per warning (never below 0); a plan
//! passes when it has no error.
//!
//! # Examples
//!
//! ```
//! use tollgate::{audit, config::Plan};
//!
//! let plan = Plan::from_toml(r#"
//!     replicas = 4
//!     [[policies]]
//!     name = "api"
//!     limit = 100
//!     window = "1m"
//!     [default]
//!     policies = ["api"]
//! "#)?;
//! let report = audit(&plan);
//! assert!(!report.pass);
//! assert_eq!(report.findings[0].rule, "TG002");
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::collections::BTreeSet;

use serde::Serialize;

use crate::config::{FailureModeName, Plan, RouteKind, StoreKind};
use crate::policy::Algorithm;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing.
    Info,
    /// Likely a mistake.
    Warning,
    /// A known failure in production; the plan does not pass.
    Error,
}

/// One problem found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The stable rule id (`TG001` …).
    pub rule: &'static str,
    /// The rule's short name.
    pub name: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// What was found, naming the plan's fields.
    pub message: String,
}

/// The audit's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    /// No error-severity finding.
    pub pass: bool,
    /// 100 minus 25 per error and 10 per warning, at least 0.
    pub score: u32,
    /// The findings, in rule order.
    pub findings: Vec<Finding>,
    /// One recommendation per rule that fired.
    pub recommendations: Vec<String>,
}

impl AuditReport {
    /// The report as text, one finding per line.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "{} (score {})\n",
            if self.pass { "PASS" } else { "FAIL" },
            self.score
        );
        for f in &self.findings {
            out.push_str(&format!(
                "{} {:?} [{}] {}\n",
                f.rule, f.severity, f.name, f.message
            ));
        }
        for r in &self.recommendations {
            out.push_str(&format!("recommendation: {r}\n"));
        }
        out
    }
}

struct Rule {
    id: &'static str,
    name: &'static str,
    severity: Severity,
    recommendation: &'static str,
}

const RULES: &[Rule] = &[
    Rule { id: "TG001", name: "fixed-window-customer-facing", severity: Severity::Error,
        recommendation: "Use the sliding window counter (the default) or the sliding window log on customer-facing routes; a fixed window admits 2× its limit around a window flip." },
    Rule { id: "TG002", name: "memory-store-replicated", severity: Severity::Error,
        recommendation: "With more than one replica, use the Redis store so all replicas share one limit; an in-process store lets each replica allow the full limit." },
    Rule { id: "TG003", name: "failure-mode-unset", severity: Severity::Error,
        recommendation: "Choose failure_mode = \"fail_open\", \"fail_closed\" or \"local_fallback\" deliberately for when Redis is down." },
    Rule { id: "TG004", name: "fail-open-without-telemetry", severity: Severity::Error,
        recommendation: "Keep telemetry on with fail_open, and alert on the fail-open counter: abuse during a Redis outage must not go unnoticed." },
    Rule { id: "TG005", name: "retry-after-disabled", severity: Severity::Error,
        recommendation: "Send Retry-After on every 429 so clients back off instead of retrying in a tight loop." },
    Rule { id: "TG006", name: "auth-route-unprotected", severity: Severity::Error,
        recommendation: "Give every auth route a strict policy (about 5–10 per minute) and never exempt it." },
    Rule { id: "TG007", name: "login-tuples-incomplete", severity: Severity::Warning,
        recommendation: "Limit login by (IP, username), (IP) and (username) at once (the login guard): rotating IPs and password spraying each slip past one key." },
    Rule { id: "TG008", name: "ip-only-key-for-authenticated-route", severity: Severity::Warning,
        recommendation: "Key authenticated routes by user or API key: IP keys make users behind one NAT share a limit." },
    Rule { id: "TG009", name: "policy-shared-by-auth-and-read", severity: Severity::Error,
        recommendation: "Give auth and read routes separate policies: one limit is either too loose for login or too tight for reads." },
    Rule { id: "TG010", name: "cluster-key-template-without-hash-tag", severity: Severity::Error,
        recommendation: "Keep a {…} hash tag around the key in key_template so every key of one principal lands in one Cluster slot." },
];

/// Reviews a plan; see the [module docs](mod@crate::audit) for the rules.
pub fn audit(plan: &Plan) -> AuditReport {
    let mut findings: Vec<Finding> = vec![];
    let mut push = |id: &'static str, message: String| {
        let rule = RULES.iter().find(|r| r.id == id).expect("known rule");
        findings.push(Finding {
            rule: rule.id,
            name: rule.name,
            severity: rule.severity,
            message,
        });
    };
    let algorithm_of = |name: &str| {
        plan.policies
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.algorithm)
    };
    let route_policy_names = |r: &crate::config::RouteConfig| -> BTreeSet<String> {
        r.policies
            .iter()
            .chain(r.tiers.values().flatten())
            .cloned()
            .collect()
    };

    // TG001
    for (i, r) in plan.routes.iter().enumerate() {
        if r.exempt || !r.is_customer_facing() {
            continue;
        }
        for name in route_policy_names(r) {
            if algorithm_of(&name) == Some(Algorithm::FixedWindow) {
                push(
                    "TG001",
                    format!(
                        "routes[{i}] ({:?}) uses fixed-window policy {name:?}",
                        r.pattern
                    ),
                );
            }
        }
    }
    let default_names: BTreeSet<String> = plan
        .default
        .policies
        .iter()
        .chain(plan.default.tiers.values().flatten())
        .cloned()
        .collect();
    for name in &default_names {
        if algorithm_of(name) == Some(Algorithm::FixedWindow) {
            push(
                "TG001",
                format!("the default route uses fixed-window policy {name:?}"),
            );
        }
    }
    // TG002
    let replicas = plan.replicas.unwrap_or(1);
    if plan.store.kind == StoreKind::Memory && replicas > 1 {
        push(
            "TG002",
            format!("store.kind = \"memory\" with replicas = {replicas}: the effective limit is {replicas}× each policy"),
        );
    }
    // TG003
    if plan.store.kind != StoreKind::Memory && plan.failure_mode.is_none() {
        push(
            "TG003",
            format!(
                "store.kind = {:?} but failure_mode is not set",
                plan.store.kind
            ),
        );
    }
    // TG004
    if plan.failure_mode == Some(FailureModeName::FailOpen) && plan.telemetry == Some(false) {
        push(
            "TG004",
            "failure_mode = \"fail_open\" with telemetry = false".to_owned(),
        );
    }
    // TG005
    if plan.retry_after == Some(false) {
        push("TG005", "retry_after = false".to_owned());
    }
    // TG006, TG007
    let auth_routes: Vec<(usize, &crate::config::RouteConfig)> = plan
        .routes
        .iter()
        .enumerate()
        .filter(|(_, r)| r.kind == RouteKind::Auth)
        .collect();
    for (i, r) in &auth_routes {
        if r.exempt || route_policy_names(r).is_empty() {
            push(
                "TG006",
                format!(
                    "routes[{i}] ({:?}) is an auth route {}",
                    r.pattern,
                    if r.exempt {
                        "marked exempt"
                    } else {
                        "without a policy"
                    }
                ),
            );
        }
    }
    if !auth_routes.is_empty() {
        let complete = plan.login.as_ref().is_some_and(|l| {
            [&l.ip_username, &l.ip, &l.username]
                .iter()
                .all(|p| p.as_ref().is_some_and(|n| algorithm_of(n).is_some()))
        });
        if !complete {
            push(
                "TG007",
                "auth routes exist but [login] does not name existing policies for ip_username, ip and username".to_owned(),
            );
        }
    }
    // TG008
    if plan.key.kind.is_ip_only() {
        for (i, r) in plan.routes.iter().enumerate() {
            if r.authenticated && r.is_customer_facing() && !r.exempt {
                push(
                    "TG008",
                    format!(
                        "routes[{i}] ({:?}) is authenticated but key.kind = {:?}",
                        r.pattern, plan.key.kind
                    ),
                );
            }
        }
    }
    // TG009
    let auth_names: BTreeSet<String> = auth_routes
        .iter()
        .flat_map(|(_, r)| route_policy_names(r))
        .collect();
    let mut read_names: BTreeSet<String> = plan
        .routes
        .iter()
        .filter(|r| r.kind == RouteKind::Read)
        .flat_map(route_policy_names)
        .collect();
    read_names.extend(default_names.iter().cloned());
    for name in auth_names.intersection(&read_names) {
        push(
            "TG009",
            format!("policy {name:?} limits both auth and read routes"),
        );
    }
    // TG010
    if plan.store.kind == StoreKind::RedisCluster {
        if let Some(t) = &plan.store.key_template {
            let tagged = t
                .find('{')
                .is_some_and(|open| t[open + 1..].find('}').is_some_and(|len| len > 0));
            if !tagged {
                push(
                    "TG010",
                    format!("store.key_template = {t:?} has no {{…}} hash tag"),
                );
            }
        }
    }

    findings.sort_by(|a, b| a.rule.cmp(b.rule).then_with(|| a.message.cmp(&b.message)));
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count() as u32;
    let warnings = findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .count() as u32;
    let score = 100u32.saturating_sub(25 * errors + 10 * warnings);
    let mut recommendations: Vec<String> = vec![];
    for f in &findings {
        let rule = RULES.iter().find(|r| r.id == f.rule).expect("known rule");
        let text = format!("{}: {}", rule.id, rule.recommendation);
        if !recommendations.contains(&text) {
            recommendations.push(text);
        }
    }
    AuditReport {
        pass: errors == 0,
        score,
        findings,
        recommendations,
    }
}
