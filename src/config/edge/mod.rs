//! Edge and origin from one plan: the `[edge]` section and its exporters to nginx,
//! Cloudflare, AWS WAF and Envoy.
//!
//! The edge (a CDN's WAF, a gateway) drops obvious abuse of unauthenticated traffic cheaply;
//! the origin (tollgate) enforces per-user quotas with full context. `[edge]` describes the
//! coarse edge limits next to the origin's policies, so both are reviewed by one
//! [audit](crate::audit()) and the edge is generated instead of configured by hand:
//!
//! ```toml
//! [[edge.rules]]
//! name = "unauthenticated-ip"
//! unauthenticated = true        # every customer-facing route without `authenticated = true`
//! routes = ["POST /login"]      # and/or patterns of [[routes]]
//! key = "ip"                    # "ip" (default), "header" (with header = "x-api-key"), "global"
//! limit = 300
//! window = "1m"
//! burst = 300                   # at most this many at once (default: limit)
//! action = "block"              # answer 429 (default), or "challenge" where the target has one
//! targets = ["nginx", "cloudflare", "aws-waf"]   # default: every target
//! ```
//!
//! A rule means: `limit` requests per `window` per key, across all of the rule's routes
//! together, and at most `burst` at once. It counts every request, also on a route whose
//! `count` makes the origin count only some (`"failures"`): no target counts by response, so
//! such a rule is a coarse limit on all of the route's traffic, to keep well above the
//! origin's (`TG013` warns when it is not). Each target expresses that in its own terms, or
//! refuses. Cloudflare and AWS WAF count requests per window; nginx and Envoy run a bucket of
//! `burst` refilled at `limit` per `window`, which admits up to `burst + limit` in one window
//! (the bound of tollgate's own token bucket).
//!
//! | target | what it writes | the rule's numbers become |
//! |---|---|---|
//! | nginx | `limit_req_zone` / `limit_req`, `limit_req_status 429`, `real_ip` from `[key]` | a leaky bucket: `rate` = limit/window in `r/s` or `r/m`, `burst` = burst − 1, `nodelay` (or `delay` with `max_delay`) |
//! | Cloudflare | a rule of the `http_ratelimit` phase (Rulesets API) | `period` = window, `requests_per_period` = limit, counted per data center (`cf.colo.id`) |
//! | AWS WAF | a rule with a `RateBasedStatement` | `EvaluationWindowSec` = window, `Limit` = limit, a scope-down statement for the routes |
//! | Envoy | the local rate limit filter, per route | a token bucket: `max_tokens` = burst, `tokens_per_fill` / `fill_interval` = limit/window |
//!
//! What a target cannot express is an error naming the field and the target's constraint,
//! never a different limit: a window Cloudflare or AWS WAF lacks, a limit below AWS WAF's
//! minimum of 10, a per-client key on Envoy's local filter (one bucket per route, shared by
//! every client), a challenge on nginx or Envoy. With
//! [`ExportOptions::round_stricter`], a conversion that must round picks the nearest
//! *stricter* limit instead (a shorter supported window with proportionally fewer requests,
//! a lower nginx rate, a block instead of a challenge) and says so in the output, as a comment
//! (nginx, Envoy) or in the rule's description (Cloudflare), and in [`EdgeExport::notes`]
//! (the only place for AWS WAF, whose rule has no free-text field; the CLI prints the notes
//! on stderr).
//!
//! # Examples
//!
//! ```
//! use tollgate::config::edge::{EdgeTarget, ExportOptions};
//! use tollgate::config::Plan;
//!
//! let plan = Plan::from_toml(r#"
//!     [key]
//!     kind = "client_ip"
//!     trusted_proxies = ["10.0.0.0/8"]
//!     [[policies]]
//!     name = "api"
//!     limit = 100
//!     window = "1m"
//!     [[routes]]
//!     pattern = "/api/{*rest}"
//!     policies = ["api"]
//!     [default]
//!     policies = ["api"]
//!     [[edge.rules]]
//!     name = "api-ip"
//!     routes = ["/api/{*rest}"]
//!     limit = 600
//!     window = "1m"
//! "#)?;
//! let nginx = plan.export_edge(EdgeTarget::Nginx, &ExportOptions::new())?;
//! assert!(nginx.text().contains("limit_req_zone $tollgate_edge_0 zone=tollgate_edge_0:10m rate=10r/s;"));
//! assert!(nginx.text().contains("set_real_ip_from 10.0.0.0/8;"));
//!
//! let aws = plan.export_edge(EdgeTarget::AwsWaf, &ExportOptions::new())?;
//! assert!(aws.text().contains("\"EvaluationWindowSec\": 60"));
//! # Ok::<(), tollgate::ConfigError>(())
//! ```
//!
//! A window the target lacks is refused, unless rounding toward the stricter limit is asked
//! for:
//!
//! ```
//! use tollgate::config::edge::{EdgeTarget, ExportOptions};
//! use tollgate::config::Plan;
//!
//! let plan = Plan::from_toml(r#"
//!     [[policies]]
//!     name = "api"
//!     limit = 100
//!     window = "1m"
//!     [[routes]]
//!     pattern = "/api/{*rest}"
//!     policies = ["api"]
//!     [default]
//!     policies = ["api"]
//!     [[edge.rules]]
//!     name = "api-ip"
//!     routes = ["/api/{*rest}"]
//!     limit = 1000
//!     window = "1h"
//! "#)?;
//! let err = plan.export_edge(EdgeTarget::AwsWaf, &ExportOptions::new()).unwrap_err();
//! assert_eq!(err.field(), "edge.rules[0].window");
//! assert!(err.reason().contains("60, 120, 300 or 600"));
//!
//! let rounded = plan.export_edge(EdgeTarget::AwsWaf, &ExportOptions::new().round_stricter(true))?;
//! assert!(rounded.text().contains("\"Limit\": 166"));
//! assert!(rounded.notes()[0].contains("stricter"));
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

mod audit;
mod aws_waf;
mod cloudflare;
mod envoy;
mod nginx;
mod resolve;

use super::Plan;
use crate::error::ConfigError;

pub use super::schema::{EdgeAction, EdgeConfig, EdgeKeyKind, EdgeRuleConfig, EdgeTarget};
pub(crate) use audit::findings as audit_findings;

/// How to export: rounding, and where nginx listens and proxies to.
///
/// ```
/// use tollgate::config::edge::ExportOptions;
///
/// let options = ExportOptions::new()
///     .round_stricter(true)
///     .listen("127.0.0.1:8080")
///     .origin("127.0.0.1:3000");
/// assert!(options.is_round_stricter());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportOptions {
    round_stricter: bool,
    listen: String,
    origin: String,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            round_stricter: false,
            listen: "80".to_owned(),
            origin: "127.0.0.1:3000".to_owned(),
        }
    }
}

impl ExportOptions {
    /// Exact conversions only; nginx listens on port 80 and proxies to `127.0.0.1:3000`.
    ///
    /// See the type docs for an example.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where a conversion must round, round toward the stricter limit (and say so in the
    /// output) instead of failing.
    ///
    /// See the [module docs](self) for an example.
    pub fn round_stricter(mut self, yes: bool) -> Self {
        self.round_stricter = yes;
        self
    }

    /// nginx's `listen` parameter (`8080`, `127.0.0.1:8080`).
    ///
    /// See the type docs for an example.
    pub fn listen(mut self, listen: impl Into<String>) -> Self {
        self.listen = listen.into();
        self
    }

    /// The origin nginx proxies to (`host:port`).
    ///
    /// See the type docs for an example.
    pub fn origin(mut self, origin: impl Into<String>) -> Self {
        self.origin = origin.into();
        self
    }

    /// Whether conversions may round toward the stricter limit.
    ///
    /// See the type docs for an example.
    pub fn is_round_stricter(&self) -> bool {
        self.round_stricter
    }
}

/// One target's configuration, generated from a plan's `[edge]`.
///
/// See the [module docs](self) for an example.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EdgeExport {
    target: EdgeTarget,
    text: String,
    notes: Vec<String>,
}

impl EdgeExport {
    /// The target it is for.
    ///
    /// See the [module docs](self) for an example.
    pub fn target(&self) -> EdgeTarget {
        self.target
    }

    /// The configuration: nginx directives, JSON (Cloudflare, AWS WAF) or YAML (Envoy).
    ///
    /// See the [module docs](self) for an example.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Where the conversion rounded toward a stricter limit, and what else differs from the
    /// plan's numbers by the target's nature (also written into the output where the format
    /// allows comments).
    ///
    /// See the [module docs](self) for an example.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The configuration text, by value.
    ///
    /// See the [module docs](self) for an example.
    pub fn into_text(self) -> String {
        self.text
    }
}

impl Plan {
    /// Generates `target`'s configuration from the plan's `[edge]` rules (those whose
    /// `targets` include it).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (`edge.rules[0].window`) when the rule is invalid,
    /// or when the target cannot express it (naming the target's constraint); the plan has
    /// no `[edge]` rule for the target (`edge.rules`); the plan does not build (the first of
    /// [`build_errors`](Plan::build_errors), as [`build`](Plan::build) would refuse it).
    ///
    /// See the [module docs](self) for examples.
    pub fn export_edge(
        &self,
        target: EdgeTarget,
        options: &ExportOptions,
    ) -> Result<EdgeExport, ConfigError> {
        // The edge mirrors the origin: a plan the origin refuses to build has no origin to
        // mirror, and exporting it would put limits at the edge that nothing behind enforces.
        if let Some(error) = self.build_errors().into_iter().next() {
            return Err(error);
        }
        let rules = resolve::rules(self)?;
        let rules: Vec<_> = rules
            .into_iter()
            .filter(|r| r.targets.is_empty() || r.targets.contains(&target))
            .collect();
        if rules.is_empty() {
            return Err(ConfigError::new(
                "edge.rules",
                "[]",
                format!("the plan has no [[edge.rules]] for {target}"),
            ));
        }
        let mut notes = vec![];
        let text = match target {
            EdgeTarget::Nginx => nginx::export(self, &rules, options, &mut notes)?,
            EdgeTarget::Cloudflare => cloudflare::export(&rules, options, &mut notes)?,
            EdgeTarget::AwsWaf => aws_waf::export(&rules, options, &mut notes)?,
            EdgeTarget::Envoy => envoy::export(&rules, options, &mut notes)?,
        };
        Ok(EdgeExport {
            target,
            text,
            notes,
        })
    }
}
