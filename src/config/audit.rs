//! A deterministic review of a rate-limit [`Plan`]: it builds the plan, then checks the
//! field's known pitfalls as rules.
//!
//! [`audit`] first builds the plan exactly as [`Plan::build`] does (without connecting
//! anywhere): every reason it does not build is a `TG000` finding naming the field and the
//! value. Then it looks at the plan's structured fields (never at names or free text), so the
//! same plan always gets the same report. Each [`Finding`] carries a stable rule id:
//!
//! | rule | severity | what trips it |
//! |---|---|---|
//! | `TG000` plan-does-not-build | error | the plan does not build: an unknown policy, an unused policy, a bad pattern, CIDR, URL or prefix, a broken `[login]` … |
//! | `TG001` fixed-window-customer-facing | error | a customer-facing route uses a fixed-window policy (2× boundary burst) |
//! | `TG002` memory-store-replicated | error | the memory store with `replicas > 1` (N pods = N× the limit) |
//! | `TG003` failure-mode-unset | error | a Redis store without a `failure_mode` |
//! | `TG005` retry-after-disabled | error | `retry_after = false` |
//! | `TG006` auth-route-unprotected | error | an `auth` route that is exempt or has no policy |
//! | `TG007` login-guard-missing | warning | an `auth` route that no building `[login]` guard covers (its pattern is not in `login.routes`) |
//! | `TG008` ip-only-key-for-authenticated-route | warning | an `authenticated` customer route keyed by IP only |
//! | `TG009` policy-shared-by-auth-and-read | error | one policy on both an `auth` route and a `read` route |
//! | `TG011` trust-everything-proxies | error | a trusted-proxy range that is `/0`, or shorter than /8 (IPv4) or /16 (IPv6) outside private space |
//! | `TG012` unauthenticated-route-without-edge | warning | with an `[edge]` section, a customer-facing route without `authenticated = true` that no edge rule covers |
//! | `TG013` edge-stricter-than-origin | warning | an edge rule at least as strict (rate and burst) as an origin policy on the same route and key: the origin limit is dead |
//! | `TG014` edge-key-unseen-by-origin | error | an edge rule keyed by client IP while the origin's `[key]` reads the TCP peer, or trusts no proxy: behind the edge every client shares one key |
//! | `TG015` auth-route-counts-successes | error | an `auth` route whose `count` does not count 401 and 403 responses: failed attempts are free, so guessing is unlimited |
//! | `TG016` region-not-fail-closed | warning | a regional store (`store.region`) whose `failure_mode` is not `fail_closed`: while the home is unreachable, instances admit by that mode, above the global limit |
//!
//! `TG000` also reports an `[edge]` section that does not resolve (see
//! [`edge`](crate::config::edge)). `TG012` grades the gate "edge-layer rate limiting in place
//! for unauthenticated traffic" only for plans that describe their edge: a plan without
//! `[edge]` says nothing about it.
//!
//! `TG004` (fail open without telemetry) and `TG010` (a Cluster key template without a hash
//! tag) are retired with the settings they graded, `telemetry` and `store.key_template`,
//! which built nothing; their ids are not reused.
//!
//! # Trusted proxies (`TG011`)
//!
//! A trusted proxy's forwarding header names the client, so trusting a range means letting
//! every address in it choose its own key. `TG011` checks every trusted-proxy list of the
//! plan (`key.trusted_proxies`, each `key.fallback…` in the chain, each route's own
//! `routes[i].key…` and `routes[i].tier_keys…`, `login.ip_key…`) and
//! flags a range when its prefix is `/0`, or when it is wider than a /8 (IPv4) or a /16
//! (IPv6) and not inside private space (IPv6 unique-local `fc00::/7` or link-local
//! `fe80::/10`; every IPv4 range wider than /8 holds public addresses). Private, loopback
//! and link-local ranges of any usual size, and CDN ranges (a /13, a /29) stay legitimate.
//! IPv4 written in IPv6 (mapped, `::ffff:0:0/96`, or NAT64's `64:ff9b::/96`) is judged as
//! the IPv4 range it holds, as addresses are compared: `64:ff9b::/96` trusts every IPv4
//! client, and so does any wider IPv6 range that holds it or `::ffff:0:0/96`.
//! An IPv4-mapped IPv6 range (`::ffff:0:0/96`) is judged as the IPv4 range it maps.
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
//!
//! A plan that does not build fails, naming the field:
//!
//! ```
//! use tollgate::{audit, config::Plan};
//!
//! let plan = Plan::from_toml(r#"
//!     [[policies]]
//!     name = "api"
//!     limit = 100
//!     window = "1m"
//!     [default]
//!     policies = ["apo"]
//! "#)?;
//! let report = audit(&plan);
//! assert!(!report.pass);
//! let f = &report.findings[0];
//! assert_eq!((f.rule, f.field.as_deref(), f.value.as_deref()), ("TG000", Some("default.policies[0]"), Some("\"apo\"")));
//! assert_eq!(report.findings[1].field.as_deref(), Some("policies[0]")); // "api" limits nothing
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv6Net};
use serde::Serialize;

use crate::config::{FailureModeName, KeyConfig, Plan, RouteConfig, RouteKind, StoreKind};
use crate::policy::Algorithm;
use crate::store::{DynStore, MemoryStore};

/// How bad a finding is.
///
/// ```
/// use tollgate::audit::Severity;
///
/// assert!(Severity::Error > Severity::Warning);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Severity {
    /// Worth knowing.
    Info,
    /// Likely a mistake.
    Warning,
    /// A known failure in production; the plan does not pass.
    Error,
}

/// One problem found.
///
/// See the [module docs](mod@crate::audit) for an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// The stable rule id (`TG001` …).
    pub rule: &'static str,
    /// The rule's short name.
    pub name: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// What was found, naming the plan's fields.
    pub message: String,
    /// The plan field at fault (`routes[0].pattern`), when one field is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// That field's value, as the plan wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// The audit's result.
///
/// See the [module docs](mod@crate::audit) for an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
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
    /// The report as text: `PASS`/`FAIL` and the score, one finding per line, then the
    /// recommendations.
    ///
    /// ```
    /// use tollgate::{audit, config::Plan};
    ///
    /// let plan = Plan::from_toml("retry_after = false\n[[policies]]\nname = \"a\"\nlimit = 1\nwindow = \"1s\"\n[default]\npolicies = [\"a\"]")?;
    /// let text = audit(&plan).to_text();
    /// assert!(text.starts_with("FAIL (score 75)\nTG005 Error [retry-after-disabled]"));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
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

/// One rule of the audit, as listed in the [module docs](mod@crate::audit).
///
/// ```
/// let ids: Vec<&str> = tollgate::audit::rules().iter().map(|r| r.id).collect();
/// assert_eq!(ids[0], "TG000");
/// assert!(!ids.contains(&"TG010")); // retired
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rule {
    /// The stable id.
    pub id: &'static str,
    /// The short name.
    pub name: &'static str,
    /// The severity of its findings.
    pub severity: Severity,
    /// What trips it.
    pub trips: &'static str,
    /// What to do about it.
    pub recommendation: &'static str,
}

const fn rule(
    id: &'static str,
    name: &'static str,
    severity: Severity,
    trips: &'static str,
    recommendation: &'static str,
) -> Rule {
    Rule {
        id,
        name,
        severity,
        trips,
        recommendation,
    }
}

const RULES: &[Rule] = &[
    rule("TG000", "plan-does-not-build", Severity::Error,
        "the plan does not build: an unknown policy, an unused policy, a bad pattern, CIDR, URL or prefix, a broken `[login]` …",
        "Fix the field named: the plan must build exactly as Limiter::from_config and Plan::build build it."),
    rule("TG001", "fixed-window-customer-facing", Severity::Error,
        "a customer-facing route uses a fixed-window policy (2× boundary burst)",
        "Use the sliding window counter (the default) or the sliding window log on customer-facing routes; a fixed window admits 2× its limit around a window flip."),
    rule("TG002", "memory-store-replicated", Severity::Error,
        "the memory store with `replicas > 1` (N pods = N× the limit)",
        "With more than one replica, use the Redis store so all replicas share one limit; an in-process store lets each replica allow the full limit."),
    rule("TG003", "failure-mode-unset", Severity::Error,
        "a Redis store without a `failure_mode`",
        "Choose failure_mode = \"fail_open\", \"fail_closed\" or \"local_fallback\" deliberately for when Redis is down."),
    rule("TG005", "retry-after-disabled", Severity::Error,
        "`retry_after = false`",
        "Send Retry-After on every 429 so clients back off instead of retrying in a tight loop."),
    rule("TG006", "auth-route-unprotected", Severity::Error,
        "an `auth` route that is exempt or has no policy",
        "Give every auth route a strict policy (about 5–10 per minute) and never exempt it."),
    rule("TG007", "login-guard-missing", Severity::Warning,
        "an `auth` route that no building `[login]` guard covers (its pattern is not in `login.routes`)",
        "Guard login routes with [login]: it limits (IP, username), IP and username at once, since rotating IPs and password spraying each slip past one key."),
    rule("TG008", "ip-only-key-for-authenticated-route", Severity::Warning,
        "an `authenticated` customer route keyed by IP only",
        "Key authenticated routes by user or API key: IP keys make users behind one NAT share a limit."),
    rule("TG009", "policy-shared-by-auth-and-read", Severity::Error,
        "one policy on both an `auth` route and a `read` route",
        "Give auth and read routes separate policies: one limit is either too loose for login or too tight for reads."),
    rule("TG011", "trust-everything-proxies", Severity::Error,
        "a trusted-proxy range that is `/0`, or shorter than /8 (IPv4) or /16 (IPv6) outside private space",
        "Trust only your own proxies' addresses (private ranges, or your CDN's published ranges): every address in a trusted range can choose its own rate-limit key."),
    rule("TG012", "unauthenticated-route-without-edge", Severity::Warning,
        "with an `[edge]` section, a customer-facing route without `authenticated = true` that no edge rule covers",
        "Cover every unauthenticated route with an [[edge.rules]] entry (or unauthenticated = true): the edge drops abuse before the origin pays for it."),
    rule("TG013", "edge-stricter-than-origin", Severity::Warning,
        "an edge rule at least as strict (rate and burst) as an origin policy on the same route and key: the origin limit is dead",
        "Keep the edge coarse: its limit on a key should be looser than the origin's, which decides with full context."),
    rule("TG014", "edge-key-unseen-by-origin", Severity::Error,
        "an edge rule keyed by client IP while the origin's `[key]` reads the TCP peer, or trusts no proxy: behind the edge every client shares one key",
        "Behind an edge, key the origin with kind = \"client_ip\" and the edge's (and load balancers') addresses in trusted_proxies, so it sees the client the edge saw."),
    rule("TG015", "auth-route-counts-successes", Severity::Error,
        "an `auth` route whose `count` does not count 401 and 403 responses: failed attempts are free, so guessing is unlimited",
        "On an auth route count failures (count = \"failures\", or a list with \"4xx\"), or drop `count`."),
    rule("TG016", "region-not-fail-closed", Severity::Warning,
        "a regional store (`store.region`) whose `failure_mode` is not `fail_closed`: while the home is unreachable, instances admit by that mode, above the global limit",
        "Set failure_mode = \"fail_closed\" to keep the global limit through a partition (regions still spend the blocks they hold), or accept the over-admission knowingly."),
];

/// Every rule of the audit, in id order.
///
/// See [`Rule`] for an example.
pub fn rules() -> &'static [Rule] {
    RULES
}

/// Whether `net` trusts other people's networks (see the [module docs](mod@crate::audit)).
fn trusts_everyone(net: IpNet) -> bool {
    // As addresses are compared: IPv4 written in IPv6 (mapped, or NAT64's `64:ff9b::/96`)
    // is the IPv4 range it holds, so `64:ff9b::/96` trusts every IPv4 client.
    match crate::key::canonical_net(net) {
        IpNet::V4(v4) => v4.prefix_len() < 8,
        IpNet::V6(v6) => {
            let nets = |list: &[&str]| -> Vec<Ipv6Net> {
                list.iter().filter_map(|p| p.parse().ok()).collect()
            };
            let private = nets(&["fc00::/7", "fe80::/10"])
                .iter()
                .any(|p| p.contains(&v6));
            // A wider range holding the IPv4 ranges written in IPv6 holds every IPv4
            // client that reaches the service through NAT64 or a dual-stack socket.
            let holds_ipv4 = nets(&["::ffff:0:0/96", "64:ff9b::/96"])
                .iter()
                .any(|p| v6.contains(p));
            v6.prefix_len() == 0 || (v6.prefix_len() < 16 && !private) || holds_ipv4
        }
    }
}

/// Every trusted-proxy list of a key section and its fallback chain, with its field path.
fn proxy_lists<'a>(key: &'a KeyConfig, path: String, out: &mut Vec<(String, &'a [String])>) {
    out.push((format!("{path}.trusted_proxies"), &key.trusted_proxies));
    if let Some(next) = &key.fallback {
        proxy_lists(next, format!("{path}.fallback"), out);
    }
}

/// Reviews a plan; see the [module docs](mod@crate::audit) for the rules.
///
/// See the [module docs](mod@crate::audit) for an example.
pub fn audit(plan: &Plan) -> AuditReport {
    let mut findings = Findings::default();
    plan_builds(plan, &mut findings);
    fixed_windows_facing_customers(plan, &mut findings);
    store_and_response_settings(plan, &mut findings);
    auth_routes_guarded(plan, &mut findings);
    auth_routes_count_failures(plan, &mut findings);
    authenticated_routes_keyed_by_ip(plan, &mut findings);
    policies_shared_by_auth_and_read(plan, &mut findings);
    trusted_proxy_ranges(plan, &mut findings);
    // TG000 (an `[edge]` that does not resolve), TG012, TG013, TG014
    for (id, message, at) in crate::config::edge::audit_findings(plan) {
        findings.push(id, message, at);
    }
    findings.into_report()
}

/// The findings of one audit, in the order the rules found them.
#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    /// A finding of rule `id`, at the field and value `at` where one field is at fault.
    fn push(&mut self, id: &'static str, message: String, at: Option<(String, String)>) {
        if let Some(rule) = RULES.iter().find(|r| r.id == id) {
            let (field, value) = at.unzip();
            self.0.push(Finding {
                rule: rule.id,
                name: rule.name,
                severity: rule.severity,
                message,
                field,
                value,
            });
        }
    }

    /// The report: the findings in rule order, the score, and one recommendation per rule
    /// that fired.
    fn into_report(self) -> AuditReport {
        let mut findings = self.0;
        findings.sort_by(|a, b| a.rule.cmp(b.rule).then_with(|| a.message.cmp(&b.message)));
        let count = |severity| findings.iter().filter(|f| f.severity == severity).count() as u32;
        let (errors, warnings) = (count(Severity::Error), count(Severity::Warning));
        let score = 100u32.saturating_sub(
            25u32
                .saturating_mul(errors)
                .saturating_add(10u32.saturating_mul(warnings)),
        );
        let mut recommendations: Vec<String> = vec![];
        for f in &findings {
            if let Some(rule) = RULES.iter().find(|r| r.id == f.rule) {
                let text = format!("{}: {}", rule.id, rule.recommendation);
                if !recommendations.contains(&text) {
                    recommendations.push(text);
                }
            }
        }
        AuditReport {
            pass: errors == 0,
            score,
            findings,
            recommendations,
        }
    }
}

/// The algorithm of the plan's policy `name`.
fn algorithm_of(plan: &Plan, name: &str) -> Option<Algorithm> {
    plan.policies
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.algorithm)
}

/// Every policy a route names, untiered or in a tier.
fn route_policy_names(r: &RouteConfig) -> BTreeSet<String> {
    r.policies
        .iter()
        .chain(r.tiers.values().flatten())
        .cloned()
        .collect()
}

/// Every policy the default route names, untiered or in a tier.
fn default_policy_names(plan: &Plan) -> BTreeSet<String> {
    plan.default
        .policies
        .iter()
        .chain(plan.default.tiers.values().flatten())
        .cloned()
        .collect()
}

/// The plan's `auth` routes, with their indexes.
fn auth_routes(plan: &Plan) -> Vec<(usize, &RouteConfig)> {
    plan.routes
        .iter()
        .enumerate()
        .filter(|(_, r)| r.kind == RouteKind::Auth)
        .collect()
}

/// A shared store without a failure mode (`TG003`).
fn failure_mode_unset(plan: &Plan) -> bool {
    plan.store.kind != StoreKind::Memory && plan.failure_mode.is_none()
}

/// `TG000`: the plan builds, as [`Plan::build`] builds it.
fn plan_builds(plan: &Plan, findings: &mut Findings) {
    for e in plan.build_errors() {
        if e.field() == "failure_mode" && failure_mode_unset(plan) {
            continue; // TG003 says it, with its recommendation
        }
        findings.push(
            "TG000",
            e.to_string(),
            Some((e.field().to_owned(), e.value().to_owned())),
        );
    }
}

/// `TG001`: no fixed-window policy on a customer-facing route or on the default route.
fn fixed_windows_facing_customers(plan: &Plan, findings: &mut Findings) {
    for (i, r) in plan.routes.iter().enumerate() {
        if r.exempt || !r.is_customer_facing() {
            continue;
        }
        for name in route_policy_names(r) {
            if algorithm_of(plan, &name) == Some(Algorithm::FixedWindow) {
                findings.push(
                    "TG001",
                    format!(
                        "routes[{i}] ({:?}) uses fixed-window policy {name:?}",
                        r.pattern
                    ),
                    None,
                );
            }
        }
    }
    for name in &default_policy_names(plan) {
        if algorithm_of(plan, name) == Some(Algorithm::FixedWindow) {
            findings.push(
                "TG001",
                format!("the default route uses fixed-window policy {name:?}"),
                None,
            );
        }
    }
}

/// `TG002` (a memory store behind several replicas), `TG003` (no failure mode for a shared
/// store) and `TG005` (no `Retry-After`).
fn store_and_response_settings(plan: &Plan, findings: &mut Findings) {
    let replicas = plan.replicas.unwrap_or(1);
    if plan.store.kind == StoreKind::Memory && replicas > 1 {
        findings.push(
            "TG002",
            format!("store.kind = \"memory\" with replicas = {replicas}: the effective limit is {replicas}× each policy"),
            Some(("replicas".to_owned(), replicas.to_string())),
        );
    }
    if failure_mode_unset(plan) {
        findings.push(
            "TG003",
            format!(
                "store.kind = {:?} but failure_mode is not set",
                plan.store.kind
            ),
            Some(("failure_mode".to_owned(), "(missing)".to_owned())),
        );
    }
    if plan.store.region.is_some() && plan.failure_mode != Some(FailureModeName::FailClosed) {
        let mode = format!("{:?}", plan.failure_mode);
        let message = format!("store.region is set and failure_mode is {mode}");
        findings.push("TG016", message, Some(("failure_mode".to_owned(), mode)));
    }
    if plan.retry_after == Some(false) {
        findings.push(
            "TG005",
            "retry_after = false".to_owned(),
            Some(("retry_after".to_owned(), "false".to_owned())),
        );
    }
}

/// `TG006` (an auth route exempt or without a policy) and `TG007` (an auth route no building
/// `[login]` guard covers).
fn auth_routes_guarded(plan: &Plan, findings: &mut Findings) {
    let auth_routes = auth_routes(plan);
    for (i, r) in &auth_routes {
        if r.exempt || route_policy_names(r).is_empty() {
            findings.push(
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
                Some((format!("routes[{i}]"), format!("{:?}", r.pattern))),
            );
        }
    }
    if auth_routes.is_empty() {
        return;
    }
    // The section must build (on a throwaway store) to count. A memory store cannot be
    // unavailable and refuses a failure mode, which the plan's shared store reads: that
    // setting is checked where the plan builds, not here.
    let builds = || {
        if plan.store.kind == StoreKind::Memory
            || plan.login.as_ref().is_none_or(|l| l.failure_mode.is_none())
        {
            return matches!(plan.login(DynStore::new(MemoryStore::new())), Ok(Some(_)));
        }
        let mut shared = plan.clone();
        if let Some(l) = &mut shared.login {
            l.failure_mode = None;
        }
        matches!(shared.login(DynStore::new(MemoryStore::new())), Ok(Some(_)))
    };
    let guard_routes: Vec<&str> = match &plan.login {
        Some(l) if builds() => l.routes.iter().map(|r| r.trim()).collect(),
        _ => vec![],
    };
    for (i, r) in &auth_routes {
        if !guard_routes.contains(&r.pattern.trim()) {
            findings.push(
                "TG007",
                format!(
                    "routes[{i}] ({:?}) is an auth route that no building [login] guard covers",
                    r.pattern
                ),
                Some((format!("routes[{i}].pattern"), format!("{:?}", r.pattern))),
            );
        }
    }
}

/// `TG015`: an auth route whose `count` lets refused credentials (401, 403) go uncounted.
fn auth_routes_count_failures(plan: &Plan, findings: &mut Findings) {
    for (i, r) in auth_routes(plan) {
        let Some(Ok(when)) = r.count.as_ref().map(|c| c.count_when("count")) else {
            continue;
        };
        let head = |s: u16| {
            http::Response::builder()
                .status(s)
                .body(())
                .map(|r| r.into_parts().0)
        };
        if [401, 403]
            .iter()
            .any(|&s| head(s).is_ok_and(|h| !when.counts(&h)))
        {
            let at = (format!("routes[{i}].count"), format!("{:?}", r.count));
            let message = format!(
                "routes[{i}] ({:?}) is an auth route that does not count failed attempts",
                r.pattern
            );
            findings.push("TG015", message, Some(at));
        }
    }
}

/// `TG008`: an authenticated customer route keyed by IP only.
fn authenticated_routes_keyed_by_ip(plan: &Plan, findings: &mut Findings) {
    for (i, r) in plan.routes.iter().enumerate() {
        let (key, path) = r.key_in(&plan.key, i);
        if key.kind.is_ip_only() && r.authenticated && r.is_customer_facing() && !r.exempt {
            findings.push(
                "TG008",
                format!(
                    "routes[{i}] ({:?}) is authenticated but {path}.kind = {:?}",
                    r.pattern, key.kind
                ),
                None,
            );
        }
    }
}

/// `TG009`: one policy on both an auth route and a read route (the default route counts as
/// a read route).
fn policies_shared_by_auth_and_read(plan: &Plan, findings: &mut Findings) {
    let auth_names: BTreeSet<String> = auth_routes(plan)
        .iter()
        .flat_map(|(_, r)| route_policy_names(r))
        .collect();
    let mut read_names: BTreeSet<String> = plan
        .routes
        .iter()
        .filter(|r| r.kind == RouteKind::Read)
        .flat_map(route_policy_names)
        .collect();
    read_names.extend(default_policy_names(plan));
    for name in auth_names.intersection(&read_names) {
        findings.push(
            "TG009",
            format!("policy {name:?} limits both auth and read routes"),
            None,
        );
    }
}

/// `TG011`: a trusted-proxy range of any key section that trusts other people's networks.
fn trusted_proxy_ranges(plan: &Plan, findings: &mut Findings) {
    let mut lists = vec![];
    proxy_lists(&plan.key, "key".to_owned(), &mut lists);
    for (path, k) in plan
        .routes
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.own_keys(i))
    {
        proxy_lists(k, path, &mut lists);
    }
    if let Some(k) = plan.login.as_ref().and_then(|l| l.ip_key.as_ref()) {
        proxy_lists(k, "login.ip_key".to_owned(), &mut lists);
    }
    for (path, list) in lists {
        for (i, text) in list.iter().enumerate() {
            let t = text.trim();
            let net = t
                .parse::<IpNet>()
                .or_else(|_| t.parse::<IpAddr>().map(IpNet::from));
            if net.is_ok_and(trusts_everyone) {
                findings.push(
                    "TG011",
                    format!("{path}[{i}] = {text:?} trusts other people's networks as proxies: any client there chooses its own key"),
                    Some((format!("{path}[{i}]"), format!("{text:?}"))),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
