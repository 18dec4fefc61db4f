//! The plan's TOML schema and its parser: every type here is plain data.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::limiter::MissingKey;
use crate::login::LoginMode;
use crate::policy::Algorithm;
use crate::response::HeaderStyle;

mod edge;

pub use edge::{EdgeAction, EdgeConfig, EdgeKeyKind, EdgeRuleConfig, EdgeTarget};

/// What to do when the shared store fails (see the failure-mode docs of the store).
///
/// ```
/// use tollgate::config::{FailureModeName, Plan};
///
/// let plan = Plan::from_toml("failure_mode = \"local_fallback\"")?;
/// assert_eq!(plan.failure_mode, Some(FailureModeName::LocalFallback));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureModeName {
    /// Allow the request.
    FailOpen,
    /// Refuse it with 503.
    FailClosed,
    /// Decide with a per-instance in-memory limiter.
    LocalFallback,
}

/// The store section.
///
/// ```
/// use tollgate::config::{Plan, StoreKind};
///
/// let plan = Plan::from_toml("[store]\nkind = \"memory\"\nmax_keys = 100000")?;
/// assert_eq!(plan.store.kind, StoreKind::Memory);
///
/// let text = "[store]\nkind = \"sentinel\"\nsentinels = [\"redis://10.0.0.1:26379\"]\nmaster = \"mymaster\"";
/// let plan = Plan::from_toml(text)?;
/// assert_eq!(plan.store.kind, StoreKind::Sentinel);
/// assert_eq!(plan.store.master.as_deref(), Some("mymaster"));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreConfig {
    /// `memory` (default), `redis`, `redis_cluster` or `sentinel`.
    #[serde(default)]
    pub kind: StoreKind,
    /// Redis URL (`redis://host:port`); for a cluster, the seed nodes in `urls`.
    pub url: Option<String>,
    /// Redis Cluster seed nodes.
    #[serde(default)]
    pub urls: Vec<String>,
    /// For `sentinel`: the Sentinel processes (`redis://host:port`).
    #[serde(default)]
    pub sentinels: Vec<String>,
    /// For `sentinel`: the name the sentinels monitor the master by.
    pub master: Option<String>,
    /// Key prefix (default `tollgate`).
    pub prefix: Option<String>,
    /// The memory store's key cap.
    pub max_keys: Option<usize>,
    /// Shared stores: lease blocks of quota for hot keys (see [`crate::store::leased`]),
    /// spendable this long (`"250ms"`, 10 ms to 60 s). Unset: every decision is exact.
    pub lease_time: Option<String>,
    /// With `lease_time`: the largest block, in percent of each limit (1 to 50; default 10).
    pub lease_max_block_percent: Option<u8>,
    /// With `lease_time`: the most keys an instance tracks for leasing (at least 1; default
    /// 100 000). Keys past it are decided exactly, one call each.
    pub lease_max_keys: Option<usize>,
    /// For `redis` (feature `regions`): this instance's region (1 to 64 letters, digits, `-`,
    /// `_` or `.`). With `home`, `url` is the region's Redis and every limit is shared by all
    /// regions through the home ledger (see [`crate::store::regions`]); implies leasing.
    pub region: Option<String>,
    /// With `region`: the home ledger's Redis URL.
    pub home: Option<String>,
    /// With `region`: how long a region may lend a block of the home's (`"1s"`, 50 ms to
    /// 60 s; default 1 s). Calls that need the home wait up to this long.
    pub home_lease: Option<String>,
    /// With `region`: the largest deposit, in percent of each limit (1 to 100; default 25).
    pub deposit_max_percent: Option<u8>,
}

/// Which store.
///
/// See [`StoreConfig`] for an example.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StoreKind {
    /// In-process.
    #[default]
    Memory,
    /// One Redis server.
    Redis,
    /// A Redis Cluster.
    RedisCluster,
    /// The Redis master that Sentinel names, followed across failovers
    /// ([`crate::store::sentinel`]).
    Sentinel,
}

/// The key section: which extractor keys requests.
///
/// See [`KeyConfig::build`] for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct KeyConfig {
    /// `peer_ip` (default), `global`, `header`, `client_ip`, `user`, `api_key`,
    /// `ip_user_agent`.
    #[serde(default)]
    pub kind: KeyKind,
    /// For `header` and `api_key`: the header to read; for `client_ip` and `ip_user_agent`:
    /// the forwarding header (`x-forwarded-for` by default, `forwarded`, or a single-value
    /// header such as `cf-connecting-ip`).
    pub header: Option<String>,
    /// For `global`: the bucket's name.
    pub name: Option<String>,
    /// Networks of trusted proxies, for `client_ip`.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// IPv6 grouping prefix (default [`DEFAULT_IPV6_PREFIX`](crate::key::DEFAULT_IPV6_PREFIX),
    /// 56).
    pub ipv6_prefix: Option<u8>,
    /// For `api_key`: the environment variable holding the HMAC secret (without it keys are
    /// plain SHA-256).
    pub secret_env: Option<String>,
    /// The extractor to try when this one yields no key (a chain: `api_key`, else
    /// `client_ip`). Keys from different sources never collide.
    pub fallback: Option<Box<KeyConfig>>,
}

/// Extractor kinds.
///
/// See [`KeyConfig::build`] for an example.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyKind {
    /// The TCP peer address.
    #[default]
    PeerIp,
    /// One key for everyone.
    Global,
    /// A request header's value, keyed with the header's name: `header.x-tenant:acme` for
    /// `x-tenant: acme`, so that two headers with one value never share a key.
    Header,
    /// The client address behind trusted proxies.
    ClientIp,
    /// The authenticated user.
    User,
    /// A hashed API key.
    ApiKey,
    /// Client address and User-Agent.
    IpUserAgent,
}

impl KeyKind {
    /// Whether the key is an address only (for the audit and the login guard).
    ///
    /// ```
    /// assert!(tollgate::config::KeyKind::ClientIp.is_ip_only());
    /// assert!(!tollgate::config::KeyKind::ApiKey.is_ip_only());
    /// ```
    pub fn is_ip_only(&self) -> bool {
        matches!(self, KeyKind::PeerIp | KeyKind::ClientIp)
    }
}

/// One policy.
///
/// See the [module docs](crate::config) for an example.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct PolicyConfig {
    /// The name.
    pub name: String,
    /// Units per window.
    pub limit: u64,
    /// The window, e.g. `"1s"`, `"10s"`, `"1m"`, `"1h"`, `"1d"`, `"500ms"` (for
    /// `algorithm = "in_flight"`, the slot lease in shared stores; `limit` is then the number
    /// of requests in progress at once).
    pub window: String,
    /// The algorithm (default `sliding_window_counter`).
    #[serde(default)]
    pub algorithm: Algorithm,
    /// Burst capacity (token bucket, GCRA).
    pub burst: Option<u64>,
    /// Cost per request (default 1).
    pub cost: Option<u64>,
    /// Generic 429s, no counts.
    #[serde(default)]
    pub sensitive: bool,
    /// Observe only.
    #[serde(default)]
    pub shadow: bool,
    /// Block a denied key for this long.
    pub penalty: Option<String>,
    /// Shape (GCRA): wait up to this long.
    pub max_delay: Option<String>,
}

/// What a route does, for the audit.
///
/// See the [module docs](crate::config) for an example.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RouteKind {
    /// Login, sign-up, password reset, token endpoints.
    Auth,
    /// Reads (the default).
    #[default]
    Read,
    /// Writes.
    Write,
    /// Costly endpoints (search, LLM calls).
    Expensive,
    /// Health checks and other internal endpoints.
    Internal,
}

/// One route.
///
/// See the [module docs](crate::config) for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RouteConfig {
    /// `"POST /login"`, `"/api/{*rest}"`.
    pub pattern: String,
    /// Names of the route's policies.
    #[serde(default)]
    pub policies: Vec<String>,
    /// Policies per tier.
    #[serde(default)]
    pub tiers: BTreeMap<String, Vec<String>>,
    /// Skip limiting.
    #[serde(default)]
    pub exempt: bool,
    /// A fixed cost for every policy of the route.
    pub cost: Option<u64>,
    /// What the route does (for the audit; default `read`).
    #[serde(default)]
    pub kind: RouteKind,
    /// Whether customers call it (default: every kind but `internal`).
    pub customer_facing: Option<bool>,
    /// Whether callers are authenticated (for the audit).
    #[serde(default)]
    pub authenticated: bool,
    /// Which requests count against the route's policies, from the response status:
    /// `"failures"`, `"successes"`, or status classes and codes (`["4xx", "5xx"]`, `"429"`).
    /// See [`CountWhen`](crate::route::CountWhen).
    pub count: Option<CountSetting>,
    /// The route's own key, written as `[key]` is (`key = { kind = "api_key" }`): its
    /// requests are keyed by it instead of `[key]` (see
    /// [`Route::key`](crate::route::Route::key)).
    ///
    /// ```
    /// use tollgate::config::{KeyKind, Plan};
    ///
    /// let plan = Plan::from_toml(r#"
    /// [[policies]]
    /// name = "api"
    /// limit = 100
    /// window = "1m"
    ///
    /// [[routes]]
    /// pattern = "/api/{*rest}"
    /// policies = ["api"]
    /// key = { kind = "api_key", header = "x-api-key" }
    ///
    /// [default]
    /// policies = ["api"]
    /// "#)?;
    /// assert_eq!(plan.routes[0].key.as_ref().unwrap().kind, KeyKind::ApiKey);
    /// let plan = plan.build()?;
    /// assert!(plan.limiter().effective_plan().routes[0].own_key);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub key: Option<KeyConfig>,
    /// Keys of the route's tiers, overriding `key` for their requests
    /// (`tier_keys.partner = { kind = "api_key" }`; see
    /// [`Route::tier_key`](crate::route::Route::tier_key)).
    #[serde(default)]
    pub tier_keys: BTreeMap<String, KeyConfig>,
}

/// A route's `count`: which responses count against its policies.
///
/// ```
/// use tollgate::config::{CountSetting, Plan};
///
/// let plan = Plan::from_toml(r#"
/// [[policies]]
/// name = "login"
/// limit = 5
/// window = "15m"
///
/// [[routes]]
/// pattern = "POST /login"
/// policies = ["login"]
/// count = "failures"
///
/// [[routes]]
/// pattern = "/api/{*rest}"
/// policies = ["login"]
/// count = ["5xx", "429"]
///
/// [default]
/// exempt = true
/// "#)?;
/// assert_eq!(plan.routes[0].count, Some(CountSetting::One("failures".into())));
/// plan.build()?;
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum CountSetting {
    /// `"failures"` (statuses 400 and above), `"successes"` (below 400), or one status class
    /// or code (`"5xx"`, `"429"`).
    One(String),
    /// Status classes and codes: `["4xx", "5xx"]`.
    Statuses(Vec<String>),
}

impl CountSetting {
    /// The counting rule this says; `field` names it in an error.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `field` naming a value that is not `failures`, `successes`, a
    /// status class or a status code.
    pub fn count_when(&self, field: &str) -> Result<crate::route::CountWhen, ConfigError> {
        use crate::route::CountWhen;
        let statuses = match self {
            CountSetting::One(s) if s == "failures" => return Ok(CountWhen::failures()),
            CountSetting::One(s) if s == "successes" => return Ok(CountWhen::successes()),
            CountSetting::One(s) => CountWhen::statuses([s]),
            CountSetting::Statuses(list) => CountWhen::statuses(list),
        };
        statuses.map_err(|e| ConfigError::new(field, e.value(), e.reason()))
    }
}

impl RouteConfig {
    /// Whether customers call the route.
    ///
    /// ```
    /// use tollgate::config::{RouteConfig, RouteKind};
    ///
    /// let mut health = RouteConfig::default();
    /// health.kind = RouteKind::Internal;
    /// assert!(!health.is_customer_facing());
    /// ```
    pub fn is_customer_facing(&self) -> bool {
        self.customer_facing
            .unwrap_or(self.kind != RouteKind::Internal)
    }

    /// The key sections the route names itself (`key`, then each of `tier_keys`), with their
    /// fields; `i` is the route's index in `[[routes]]`.
    pub(crate) fn own_keys(&self, i: usize) -> impl Iterator<Item = (String, &KeyConfig)> {
        let key = self
            .key
            .iter()
            .map(move |k| (format!("routes[{i}].key"), k));
        let tiers = self
            .tier_keys
            .iter()
            .map(move |(t, k)| (format!("routes[{i}].tier_keys.{t}"), k));
        key.chain(tiers)
    }

    /// The key the route's requests of no tier are keyed by, with its field: its own `key`,
    /// else the plan's `[key]`.
    pub(crate) fn key_in<'a>(
        &'a self,
        plan_key: &'a KeyConfig,
        i: usize,
    ) -> (&'a KeyConfig, String) {
        match &self.key {
            Some(k) => (k, format!("routes[{i}].key")),
            None => (plan_key, "key".to_owned()),
        }
    }
}

/// The default route.
///
/// See the [module docs](crate::config) for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DefaultRouteConfig {
    /// Names of the default policies.
    #[serde(default)]
    pub policies: Vec<String>,
    /// Requests that match no route are not limited, on purpose. Without default policies
    /// and without this, a plan whose routes cover only some paths does not build.
    #[serde(default)]
    pub exempt: bool,
    /// Policies per tier.
    #[serde(default)]
    pub tiers: BTreeMap<String, Vec<String>>,
    /// Which requests count, as a route's [`count`](RouteConfig::count) says; for the direct
    /// API too ([`Reservation::count`](crate::Reservation::count)).
    pub count: Option<CountSetting>,
}

/// How the tier is found.
///
/// See the [module docs](crate::config) for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TierConfig {
    /// Read the tier from this request header.
    pub header: Option<String>,
}

/// The `[login]` section: a [`LoginGuard`](crate::login::LoginGuard) on the routes it
/// names, built by [`Plan::build`] (see [`BuiltPlan::login_layer`](super::BuiltPlan::login_layer)).
///
/// The three limits are policies of the plan, named here; the guard takes each one's limit,
/// window and burst, and their common algorithm (they must share one). Those policies may
/// set nothing else the guard would not apply (`cost`, `penalty`, `shadow`, `max_delay`); a
/// login policy is always [sensitive](crate::PolicyBuilder::sensitive). The client address is
/// read the way `[key]` reads it when `[key]` is `peer_ip` or `client_ip`; otherwise set
/// `[login.ip_key]`.
///
/// ```
/// use tollgate::config::Plan;
///
/// let plan = Plan::from_toml(r#"
///     [[policies]]
///     name = "login-ip-user"
///     limit = 5
///     window = "15m"
///     [[policies]]
///     name = "login-ip"
///     limit = 50
///     window = "15m"
///     [[policies]]
///     name = "login-user"
///     limit = 20
///     window = "1h"
///     [[policies]]
///     name = "api"
///     limit = 100
///     window = "1m"
///     [default]
///     policies = ["api"]
///     [login]
///     routes = ["POST /login"]
///     username_field = "username"
///     ip_username = "login-ip-user"
///     ip = "login-ip"
///     username = "login-user"
/// "#)?;
/// let guard = plan.build()?.login_guard().cloned().expect("the plan has [login]");
/// assert_eq!(guard.policies()[2].limit(), 20);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LoginConfig {
    /// The login routes the guard checks, e.g. `["POST /login"]` (the patterns of
    /// `[[routes]]`); other requests pass through untouched.
    #[serde(default)]
    pub routes: Vec<String>,
    /// Read the username from this request header. Set one of `username_header`,
    /// `username_field` and `username_form_field`.
    pub username_header: Option<String>,
    /// Read the username from this string field of a JSON object body (buffered, at most
    /// `max_body_bytes`).
    pub username_field: Option<String>,
    /// Read the username from this field of a form body
    /// (`application/x-www-form-urlencoded`, buffered, at most `max_body_bytes`), decoded as
    /// a form is: see [`LoginLayer::form_field`](crate::login::LoginLayer::form_field).
    pub username_form_field: Option<String>,
    /// The largest login body buffered to read `username_field` or `username_form_field`
    /// (default 16 KiB).
    pub max_body_bytes: Option<usize>,
    /// What the login limits do while the shared store is unavailable: `fail_closed`,
    /// `local_fallback` (with the plan's `replicas`) or `fail_open`. Default: `fail_closed`
    /// when the plan's `failure_mode` is `fail_open` (an outage must not open logins to
    /// brute force), the plan's mode otherwise. Only for a shared store.
    pub failure_mode: Option<FailureModeName>,
    /// The policy limiting attempts per (client IP, username).
    pub ip_username: Option<String>,
    /// The policy limiting attempts per client IP.
    pub ip: Option<String>,
    /// The policy limiting attempts per username.
    pub username: Option<String>,
    /// Which attempts count (default `failures_only`; or `every_attempt`).
    #[serde(default)]
    pub mode: LoginMode,
    /// The prefix of the guard's counters (default `login`).
    pub name: Option<String>,
    /// The environment variable holding the secret that keys username digests.
    pub username_secret_env: Option<String>,
    /// Where the client address comes from, when `[key]` is not `peer_ip` or `client_ip`.
    pub ip_key: Option<KeyConfig>,
}

/// A whole rate-limit plan. See the [module docs](crate::config) for an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Plan {
    /// How many replicas of the service run (default 1).
    pub replicas: Option<u32>,
    /// What to do when the shared store fails.
    pub failure_mode: Option<FailureModeName>,
    /// Quota header style of the limiter's layer (the login layer's refusals carry no quota
    /// headers).
    #[serde(default)]
    pub header_style: HeaderStyle,
    /// Whether 429s carry `Retry-After` (default true), the limiter's layer's and the login
    /// layer's alike.
    pub retry_after: Option<bool>,
    /// Which allowed responses carry quota headers: `true` or `"always"` (the default),
    /// `"near_limit"`, `false` or `"never"` (see [`QuotaHeaders`](crate::QuotaHeaders)).
    pub quota_headers: Option<crate::QuotaHeaders>,
    /// What to do with requests without a key.
    #[serde(default)]
    pub missing_key: MissingKey,
    /// The store.
    #[serde(default)]
    pub store: StoreConfig,
    /// The key.
    #[serde(default)]
    pub key: KeyConfig,
    /// The policies, referred to by name.
    #[serde(default)]
    pub policies: Vec<PolicyConfig>,
    /// The routes.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// The default route.
    #[serde(default)]
    pub default: DefaultRouteConfig,
    /// Tier resolution.
    #[serde(default)]
    pub tier: TierConfig,
    /// The login guard.
    pub login: Option<LoginConfig>,
    /// Client networks that skip the limiter's policies (IP keys), e.g. `["10.0.0.0/8"]`.
    /// Not the login guard's: an allow-listed network's login attempts are still limited
    /// (guessing passwords from a trusted network is still guessing), and a denied network
    /// is refused by the limiter's layer before the login layer inside it sees the request.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Client networks refused with 403 (IP keys).
    #[serde(default)]
    pub deny_cidrs: Vec<String>,
    /// The coarse limits the edge (nginx, Cloudflare, AWS WAF, Envoy) enforces in front of
    /// the origin; see [`edge`](crate::config::edge).
    pub edge: Option<EdgeConfig>,
}

pub(crate) fn parse_duration(field: &str, value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.trim()).map_err(|e| {
        ConfigError::new(
            field,
            format_args!("{value:?}"),
            format!("not a duration ({e}); write e.g. \"500ms\", \"10s\", \"1m\", \"1h\", \"1d\""),
        )
    })
}

/// Settings earlier versions accepted that built nothing, and why they are gone.
const REMOVED: &[(&str, &str)] = &[
    (
        "store.key_template",
        "no longer exists: nothing used it; keys are always `<prefix>:{<key>}:<policy>:<part>` (set store.prefix); delete this line",
    ),
    (
        "telemetry",
        "no longer exists: it changed nothing but the audit; tollgate always logs failures with tracing (and counts them with the metrics feature); delete this line",
    ),
];

/// `line L, column C` (both from 1) of byte `offset` in `text`.
fn location(text: &str, offset: usize) -> String {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}")
}

impl Plan {
    /// Parses a plan. This checks the syntax, the types and each policy; [`Plan::build`] and
    /// the [audit](crate::audit()) check the rest.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (`policies[1].window`) and its value; a syntax or
    /// type error also names the line and column.
    ///
    /// ```
    /// use tollgate::config::Plan;
    ///
    /// let err = Plan::from_toml("[[policies]]\nname = \"api\"\nlimit = \"ten\"").unwrap_err();
    /// assert_eq!(err.field(), "policies[0].limit");
    /// assert!(err.reason().contains("line 3, column 9"));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let de = toml::de::Deserializer::parse(text).map_err(|e| {
            let at = e
                .span()
                .map_or_else(String::new, |s| location(text, s.start));
            ConfigError::new("(file)", at, e.message().trim().to_owned())
        })?;
        let plan: Plan = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let span = inner.span();
            let value = span
                .clone()
                .and_then(|s| text.get(s))
                .filter(|v| !v.contains('\n'))
                .unwrap_or("")
                .trim()
                .to_owned();
            let mut reason = inner.message().trim().to_owned();
            if let Some((_, why)) = REMOVED.iter().find(|(field, _)| *field == path) {
                reason = (*why).to_owned();
            }
            if let Some(s) = span {
                reason = format!("{reason} ({})", location(text, s.start));
            }
            let field = if path == "." {
                "(file)".to_owned()
            } else {
                path
            };
            ConfigError::new(field, value, reason)
        })?;
        plan.build_policies()?;
        Ok(plan)
    }
}
