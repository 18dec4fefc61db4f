//! The `[edge]` section: plain data, parsed with the rest of the plan. The exporters that read
//! it are in [`config::edge`](crate::config::edge).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The `[edge]` section: the coarse limits the edge enforces in front of the origin.
///
/// See the [module docs](crate::config::edge) for the format and an example.
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
/// See the [module docs](crate::config::edge) for an example.
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
