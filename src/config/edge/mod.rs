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
//! together, and at most `burst` at once. Each target expresses that in its own terms, or
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

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::Plan;
use crate::error::ConfigError;

pub(crate) use audit::findings as audit_findings;

/// The `[edge]` section: the coarse limits the edge enforces in front of the origin.
///
/// See the [module docs](self) for the format and an example.
///
/// ```
/// let plan = tollgate::config::Plan::from_toml(
///     "[[edge.rules]]\nname = \"all\"\nunauthenticated = true\nlimit = 100\nwindow = \"1m\"",
/// )?;
/// assert_eq!(plan.edge.unwrap().rules[0].limit, 100);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EdgeConfig {
    /// The edge's rules, exported in order (their index is their priority where a target has
    /// one).
    #[serde(default)]
    pub rules: Vec<EdgeRuleConfig>,
}

/// One edge rule: which routes, keyed how, how many per window, and what happens beyond.
///
/// See the [module docs](self) for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EdgeRuleConfig {
    /// A name of letters, digits, `-` and `_` (it names the rule in every target).
    pub name: String,
    /// Patterns of the plan's `[[routes]]` the rule covers (`"POST /login"`).
    #[serde(default)]
    pub routes: Vec<String>,
    /// Also cover every customer-facing route of `[[routes]]` that is not `authenticated`.
    #[serde(default)]
    pub unauthenticated: bool,
    /// What the edge counts by (default `ip`).
    #[serde(default)]
    pub key: EdgeKeyKind,
    /// For `key = "header"`: the request header (lower case, letters, digits and `-`).
    pub header: Option<String>,
    /// Requests per window and key.
    pub limit: u64,
    /// The window, e.g. `"10s"`, `"1m"`, `"1h"`.
    pub window: String,
    /// At most this many requests at once (default: `limit`).
    pub burst: Option<u64>,
    /// Delay requests beyond the burst by up to this long instead of refusing them (nginx).
    pub max_delay: Option<String>,
    /// What the edge does beyond the limit (default `block`).
    #[serde(default)]
    pub action: EdgeAction,
    /// The targets the rule is for (default: all of them).
    #[serde(default)]
    pub targets: Vec<EdgeTarget>,
}

/// What an edge rule counts by.
///
/// ```
/// use tollgate::config::edge::EdgeKeyKind;
///
/// let plan = tollgate::config::Plan::from_toml(
///     "[[edge.rules]]\nname = \"k\"\nkey = \"header\"\nheader = \"x-api-key\"\nlimit = 9\nwindow = \"1m\"",
/// )?;
/// assert_eq!(plan.edge.unwrap().rules[0].key, EdgeKeyKind::Header);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EdgeKeyKind {
    /// The client address, as the edge sees it (nginx applies the plan's trusted proxies).
    #[default]
    Ip,
    /// A request header's value, such as an API key.
    Header,
    /// One counter for everyone: a backstop for the routes.
    Global,
}

/// What the edge does with a request beyond the limit.
///
/// ```
/// use tollgate::config::edge::EdgeAction;
///
/// assert_eq!(EdgeAction::default(), EdgeAction::Block);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EdgeAction {
    /// Refuse it with 429.
    #[default]
    Block,
    /// Challenge the client (Cloudflare's managed challenge, AWS WAF's challenge).
    Challenge,
}

/// A system the edge rules can be exported to.
///
/// ```
/// use tollgate::config::edge::EdgeTarget;
///
/// assert_eq!("aws-waf".parse::<EdgeTarget>()?, EdgeTarget::AwsWaf);
/// assert_eq!(EdgeTarget::Cloudflare.to_string(), "cloudflare");
/// assert!("haproxy".parse::<EdgeTarget>().is_err());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum EdgeTarget {
    /// nginx's `limit_req` module, with `real_ip`.
    Nginx,
    /// Cloudflare rate limiting rules (the Rulesets API's `http_ratelimit` phase).
    Cloudflare,
    /// AWS WAF (v2) rate-based rules.
    AwsWaf,
    /// Envoy's HTTP local rate limit filter.
    Envoy,
}

impl EdgeTarget {
    /// Every target, in the order the CLI lists them.
    ///
    /// ```
    /// assert_eq!(tollgate::config::edge::EdgeTarget::ALL.len(), 4);
    /// ```
    pub const ALL: [EdgeTarget; 4] = [
        EdgeTarget::Nginx,
        EdgeTarget::Cloudflare,
        EdgeTarget::AwsWaf,
        EdgeTarget::Envoy,
    ];

    /// The name the CLI and the plan use (`aws-waf`).
    ///
    /// ```
    /// assert_eq!(tollgate::config::edge::EdgeTarget::AwsWaf.name(), "aws-waf");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            EdgeTarget::Nginx => "nginx",
            EdgeTarget::Cloudflare => "cloudflare",
            EdgeTarget::AwsWaf => "aws-waf",
            EdgeTarget::Envoy => "envoy",
        }
    }
}

impl fmt::Display for EdgeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EdgeTarget {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EdgeTarget::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                ConfigError::new(
                    "target",
                    format_args!("{s:?}"),
                    "not an edge target: nginx, cloudflare, aws-waf or envoy",
                )
            })
    }
}

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
    /// no `[edge]` rule for the target (`edge.rules`).
    ///
    /// See the [module docs](self) for examples.
    pub fn export_edge(
        &self,
        target: EdgeTarget,
        options: &ExportOptions,
    ) -> Result<EdgeExport, ConfigError> {
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
