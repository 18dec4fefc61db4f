//! The whole rate-limit plan as a TOML file.
//!
//! A [`Plan`] describes stores, the key, policies, routes, tiers, the failure mode and the
//! header style. [`Plan::from_toml`] parses it (every error names the offending field and
//! value), [`crate::audit()`] reviews it, and [`Limiter::from_config`] /
//! [`RateLimitLayer::from_config`](crate::RateLimitLayer::from_config) build the same limiter
//! the builder API would.
//!
//! ```toml
//! replicas = 3
//! failure_mode = "fail_closed"
//! header_style = "classic"
//!
//! [store]
//! kind = "memory"
//!
//! [key]
//! kind = "peer_ip"
//!
//! [[policies]]
//! name = "login"
//! limit = 5
//! window = "1m"
//! sensitive = true
//!
//! [[policies]]
//! name = "reads"
//! limit = 1000
//! window = "1m"
//!
//! [[routes]]
//! pattern = "POST /login"
//! kind = "auth"
//! policies = ["login"]
//!
//! [[routes]]
//! pattern = "/health"
//! exempt = true
//!
//! [default]
//! policies = ["reads"]
//! ```
//!
//! # Examples
//!
//! ```
//! use tollgate::config::Plan;
//!
//! let plan = Plan::from_toml(r#"
//!     [[policies]]
//!     name = "api"
//!     limit = 100
//!     window = "1m"
//!     [default]
//!     policies = ["api"]
//! "#)?;
//! let limiter = tollgate::Limiter::from_config(&plan)?;
//! assert_eq!(limiter.policies()[0].name(), "api");
//!
//! let err = Plan::from_toml("[[policies]]\nname = \"api\"\nlimit = -1\nwindow = \"1m\"").unwrap_err();
//! assert_eq!(err.field(), "policies[0].limit");
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::key::{Global, Key, KeyExtractor, PeerIp};
use crate::limiter::{Limiter, LimiterBuilder, MissingKey};
use crate::policy::{Algorithm, Policy, Rate};
use crate::response::HeaderStyle;
use crate::route::Route;
use crate::store::{DynStore, MemoryStore};

/// What to do when the shared store fails (see the failure-mode docs of the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureModeName {
    /// Allow the request.
    FailOpen,
    /// Refuse it with 503.
    FailClosed,
    /// Decide with a per-instance in-memory limiter.
    LocalFallback,
}

/// The store section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory` (default), `redis` or `redis_cluster`.
    #[serde(default)]
    pub kind: StoreKind,
    /// Redis URL (`redis://host:port`); for a cluster, the seed nodes in `urls`.
    pub url: Option<String>,
    /// Redis Cluster seed nodes.
    #[serde(default)]
    pub urls: Vec<String>,
    /// Key prefix (default `tollgate`).
    pub prefix: Option<String>,
    /// A custom key layout; must keep a `{…}` hash tag around the key for Redis Cluster.
    pub key_template: Option<String>,
    /// The memory store's key cap.
    pub max_keys: Option<usize>,
}

/// Which store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// In-process.
    #[default]
    Memory,
    /// One Redis server.
    Redis,
    /// A Redis Cluster.
    RedisCluster,
}

/// The key section: which extractor keys requests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
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
    /// IPv6 grouping prefix (default 64).
    pub ipv6_prefix: Option<u8>,
    /// For `api_key`: the environment variable holding the HMAC secret (without it keys are
    /// plain SHA-256).
    pub secret_env: Option<String>,
    /// The extractor to try when this one yields no key (a chain: `api_key`, else
    /// `client_ip`). Keys from different sources never collide.
    pub fallback: Option<Box<KeyConfig>>,
}

/// Extractor kinds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// The TCP peer address.
    #[default]
    PeerIp,
    /// One key for everyone.
    Global,
    /// A request header's value.
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
    /// Whether the key is an address only (for the audit).
    pub fn is_ip_only(&self) -> bool {
        matches!(self, KeyKind::PeerIp | KeyKind::ClientIp)
    }
}

impl KeyConfig {
    /// The extractor this section describes; `path` names the section in errors (`key`,
    /// `key.fallback`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `<path>.*` when the kind needs settings that are missing, or is not
    /// available in this build.
    pub fn build(&self, path: &str) -> Result<Box<dyn KeyExtractor>, ConfigError> {
        let k = self;
        let prefix = k.ipv6_prefix.unwrap_or(64);
        if !(1..=128).contains(&prefix) {
            return Err(ConfigError::new(
                "key.ipv6_prefix",
                prefix,
                "must be between 1 and 128",
            ));
        }
        let first: Box<dyn KeyExtractor> = match k.kind {
            KeyKind::PeerIp => Box::new(PeerIp::new().ipv6_prefix(prefix)),
            KeyKind::Global => Box::new(Global::named(k.name.as_deref().unwrap_or("all"))),
            KeyKind::Header => {
                let header = k.header.clone().ok_or_else(|| {
                    ConfigError::new(
                        format!("{path}.header"),
                        "(missing)",
                        "the header kind needs a header name",
                    )
                })?;
                let name = http::HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                    ConfigError::new(
                        format!("{path}.header"),
                        format_args!("{header:?}"),
                        "not a header name",
                    )
                })?;
                Box::new(crate::key::from_fn(move |req| {
                    req.headers()
                        .get(&name)
                        .map(|v| Key::new("header", v.as_bytes()))
                }))
            }
            KeyKind::ClientIp => Box::new(self.client_ip(path, prefix)?),
            KeyKind::IpUserAgent => Box::new(crate::key::IpUserAgent::new(self.client_ip(path, prefix)?)),
            KeyKind::ApiKey => {
                let mut extractor = crate::key::ApiKey::new();
                if let Some(h) = &k.header {
                    let name = http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                        ConfigError::new(format!("{path}.header"), format_args!("{h:?}"), "not a header name")
                    })?;
                    extractor = extractor.header(name);
                }
                if let Some(var) = &k.secret_env {
                    let secret = std::env::var(var).map_err(|_| {
                        ConfigError::new(
                            format!("{path}.secret_env"),
                            format_args!("{var:?}"),
                            "the environment variable is not set",
                        )
                    })?;
                    extractor = extractor.secret(secret);
                }
                Box::new(extractor)
            }
            KeyKind::User => {
                return Err(ConfigError::new(
                    format!("{path}.kind"),
                    "\"user\"",
                    "the user extractor reads a typed value from the request extensions: build it in code (tollgate::key::User), or use kind = \"header\" with the header your auth proxy sets",
                ))
            }
        };
        match &k.fallback {
            Some(next) => Ok(Box::new(
                crate::key::Chain::new(first).or(next.build(&format!("{path}.fallback"))?),
            )),
            None => Ok(first),
        }
    }

    fn client_ip(&self, path: &str, ipv6_prefix: u8) -> Result<crate::key::ClientIp, ConfigError> {
        let k = self;
        let trusted =
            crate::key::TrustedProxies::parse(k.trusted_proxies.iter().map(String::as_str))
                .map_err(|e| e.within(path))?;
        let mut ip = crate::key::ClientIp::new(trusted).ipv6_prefix(ipv6_prefix);
        if let Some(h) = &k.header {
            ip = ip.header(crate::key::ForwardedHeader::from_name(h).map_err(|e| e.within(path))?);
        }
        Ok(ip)
    }
}

/// One policy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The name.
    pub name: String,
    /// Units per window.
    pub limit: u64,
    /// The window, e.g. `"1s"`, `"10s"`, `"1m"`, `"1h"`, `"1d"`, `"500ms"`.
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
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
}

impl RouteConfig {
    /// Whether customers call the route.
    pub fn is_customer_facing(&self) -> bool {
        self.customer_facing
            .unwrap_or(self.kind != RouteKind::Internal)
    }
}

/// The default route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultRouteConfig {
    /// Names of the default policies.
    #[serde(default)]
    pub policies: Vec<String>,
    /// Policies per tier.
    #[serde(default)]
    pub tiers: BTreeMap<String, Vec<String>>,
}

/// How the tier is found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// Read the tier from this request header.
    pub header: Option<String>,
}

/// The login helper's limits, for the audit's login-tuple rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoginConfig {
    /// Policy name for (client IP, username).
    pub ip_username: Option<String>,
    /// Policy name for (client IP).
    pub ip: Option<String>,
    /// Policy name for (username).
    pub username: Option<String>,
}

/// A whole rate-limit plan. See the [module docs](crate::config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// How many replicas of the service run (default 1).
    pub replicas: Option<u32>,
    /// What to do when the shared store fails.
    pub failure_mode: Option<FailureModeName>,
    /// Whether failures and decisions are logged and counted (default true).
    pub telemetry: Option<bool>,
    /// Quota header style.
    #[serde(default)]
    pub header_style: HeaderStyle,
    /// Whether 429s carry `Retry-After` (default true).
    pub retry_after: Option<bool>,
    /// Whether allowed responses carry quota headers (default true).
    pub quota_headers: Option<bool>,
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
    /// Login limits.
    pub login: Option<LoginConfig>,
    /// Client networks that skip limiting (IP keys), e.g. `["10.0.0.0/8"]`.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Client networks refused with 403 (IP keys).
    #[serde(default)]
    pub deny_cidrs: Vec<String>,
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

impl Plan {
    /// Parses a plan.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (`policies[1].window`) and its value.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let de = toml::de::Deserializer::parse(text)
            .map_err(|e| ConfigError::new("(file)", "", e.message().trim().to_owned()))?;
        let plan: Plan = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            ConfigError::new(
                if path == "." {
                    "(file)".to_owned()
                } else {
                    path
                },
                "",
                inner.message().trim().to_owned(),
            )
        })?;
        plan.policies()?;
        Ok(plan)
    }

    /// Reads and parses a plan file.
    ///
    /// # Errors
    ///
    /// As for [`from_toml`](Self::from_toml), or when the file cannot be read.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("(file)", path.display(), format!("cannot be read: {e}"))
        })?;
        Self::from_toml(&text)
    }

    /// Builds every policy, by name.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `policies[i].<field>`.
    pub fn policies(&self) -> Result<BTreeMap<String, Policy>, ConfigError> {
        let mut out = BTreeMap::new();
        for (i, p) in self.policies.iter().enumerate() {
            let at = format!("policies[{i}]");
            let window = parse_duration("window", &p.window).map_err(|e| e.within(&at))?;
            let mut rate = Rate::new(p.limit, window);
            if let Some(b) = p.burst {
                rate = rate.with_burst(b);
            }
            let mut b = Policy::builder(p.name.clone(), rate)
                .algorithm(p.algorithm)
                .sensitive(p.sensitive)
                .shadow(p.shadow);
            if let Some(c) = p.cost {
                b = b.cost(c);
            }
            if let Some(d) = &p.penalty {
                b = b.penalty(parse_duration("penalty", d).map_err(|e| e.within(&at))?);
            }
            if let Some(d) = &p.max_delay {
                b = b.shape(parse_duration("max_delay", d).map_err(|e| e.within(&at))?);
            }
            let policy = b.build().map_err(|e| e.within(&at))?;
            if out.insert(p.name.clone(), policy).is_some() {
                return Err(ConfigError::new(
                    format!("{at}.name"),
                    format_args!("{:?}", p.name),
                    "two policies share this name",
                ));
            }
        }
        Ok(out)
    }

    fn lookup(
        policies: &BTreeMap<String, Policy>,
        field: &str,
        names: &[String],
    ) -> Result<Vec<Policy>, ConfigError> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                policies.get(n).cloned().ok_or_else(|| {
                    ConfigError::new(
                        format!("{field}[{i}]"),
                        format_args!("{n:?}"),
                        "no policy has this name",
                    )
                })
            })
            .collect()
    }

    /// The key extractor the plan names (`[key]`, with its `[key.fallback]` chain).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `key.*` when the kind needs settings that are missing, or is not
    /// available in this build.
    pub fn extractor(&self) -> Result<Box<dyn KeyExtractor>, ConfigError> {
        self.key.build("key")
    }

    fn route(
        policies: &BTreeMap<String, Policy>,
        field: &str,
        names: &[String],
        tiers: &BTreeMap<String, Vec<String>>,
    ) -> Result<Route, ConfigError> {
        let mut route =
            Route::new().policies(Self::lookup(policies, &format!("{field}.policies"), names)?);
        for (tier, names) in tiers {
            route = route.tier(
                tier.clone(),
                Self::lookup(policies, &format!("{field}.tiers.{tier}"), names)?,
            );
        }
        Ok(route)
    }

    /// A limiter builder configured from the plan, on `store`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field.
    pub fn builder_with_store<S: crate::store::Store>(
        &self,
        store: S,
    ) -> Result<LimiterBuilder<S>, ConfigError> {
        let policies = self.policies()?;
        let default = Self::route(
            &policies,
            "default",
            &self.default.policies,
            &self.default.tiers,
        )?;
        let mut b = Limiter::builder()
            .store(store)
            .default_route(default)
            .missing_key(self.missing_key);
        b = b.extractor(self.extractor()?);
        for (i, r) in self.routes.iter().enumerate() {
            let at = format!("routes[{i}]");
            let route = if r.exempt {
                Route::exempt()
            } else {
                let mut route = Self::route(&policies, &at, &r.policies, &r.tiers)?;
                if let Some(c) = r.cost {
                    route = route.cost(c);
                }
                route
            };
            b = b.route(r.pattern.clone(), route);
        }
        for cidr in &self.allow_cidrs {
            b = b.allow_cidr(cidr.clone());
        }
        for cidr in &self.deny_cidrs {
            b = b.deny_cidr(cidr.clone());
        }
        if let Some(header) = &self.tier.header {
            let name = http::HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
                ConfigError::new(
                    "tier.header",
                    format_args!("{header:?}"),
                    "not a header name",
                )
            })?;
            b = b.tier_fn(move |req| req.headers().get(&name).and_then(|v| v.to_str().ok()));
        }
        Ok(b)
    }

    /// The store the plan names.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `store.*` when the store is not available in this build or its
    /// settings are incomplete.
    pub fn store(&self) -> Result<DynStore, ConfigError> {
        match self.store.kind {
            StoreKind::Memory => {
                let mut b = MemoryStore::builder();
                if let Some(m) = self.store.max_keys {
                    b = b.max_keys(m);
                }
                Ok(DynStore::new(b.build()))
            }
            #[cfg(feature = "redis")]
            StoreKind::Redis => {
                let url = self.store.url.clone().ok_or_else(|| {
                    ConfigError::new("store.url", "(missing)", "a redis store needs a url")
                })?;
                let mut b = crate::store::RedisStore::builder();
                if let Some(p) = &self.store.prefix {
                    b = b.prefix(p.clone());
                }
                let store = b.build_with_url(&url).map_err(|e| e.within("store"))?;
                Ok(DynStore::new(self.resilient(store)?))
            }
            #[cfg(feature = "cluster")]
            StoreKind::RedisCluster => {
                if self.store.urls.is_empty() {
                    return Err(ConfigError::new(
                        "store.urls",
                        "[]",
                        "a redis_cluster store needs seed urls",
                    ));
                }
                let mut b = crate::store::RedisClusterStore::builder();
                if let Some(p) = &self.store.prefix {
                    b = b.prefix(p.clone());
                }
                let store = b
                    .build_cluster_with_urls(self.store.urls.iter().map(String::as_str))
                    .map_err(|e| e.within("store"))?;
                Ok(DynStore::new(self.resilient(store)?))
            }
            #[allow(unreachable_patterns)]
            other => Err(ConfigError::new(
                "store.kind",
                format_args!("{other:?}"),
                "this store needs a cargo feature this build lacks (redis, cluster)",
            )),
        }
    }

    /// Wraps a shared store in the plan's failure mode; the mode must be chosen.
    #[cfg(feature = "redis")]
    fn resilient<S: crate::store::Store>(
        &self,
        store: S,
    ) -> Result<crate::store::ResilientStore<S>, ConfigError> {
        use crate::store::{FailureMode, ResilientStore};
        let mode =
            match self.failure_mode {
                Some(FailureModeName::FailOpen) => FailureMode::FailOpen,
                Some(FailureModeName::FailClosed) => FailureMode::FailClosed,
                Some(FailureModeName::LocalFallback) => FailureMode::LocalFallback {
                    replicas: self.replicas.unwrap_or(1).max(1),
                },
                None => return Err(ConfigError::new(
                    "failure_mode",
                    "(missing)",
                    "a shared store needs a failure mode: fail_open, fail_closed or local_fallback",
                )),
            };
        Ok(ResilientStore::builder(store, mode)
            .deny_cache(10_000)
            .build())
    }
}

impl Limiter<DynStore> {
    /// Builds the limiter a [`Plan`] describes.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field.
    pub fn from_config(plan: &Plan) -> Result<Self, ConfigError> {
        plan.builder_with_store(plan.store()?)?.build()
    }
}

/// What [`RateLimitLayer::from_config_audited`](crate::RateLimitLayer::from_config_audited)
/// does with a plan that fails the [audit](crate::audit()).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnAuditFailure {
    /// Refuse to build: a [`ConfigError`] on `(audit)` listing the failed rules.
    Refuse,
    /// Build anyway and log each finding as a warning.
    Warn,
}

impl crate::RateLimitLayer<DynStore> {
    /// [`from_config`](Self::from_config), after an [audit](crate::audit()) of the plan.
    ///
    /// ```
    /// use tollgate::{config::{OnAuditFailure, Plan}, RateLimitLayer};
    ///
    /// let plan = Plan::from_toml(r#"
    ///     replicas = 3
    ///     [[policies]]
    ///     name = "api"
    ///     limit = 100
    ///     window = "1m"
    ///     [default]
    ///     policies = ["api"]
    /// "#)?;
    /// let err = RateLimitLayer::from_config_audited(&plan, OnAuditFailure::Refuse).unwrap_err();
    /// assert!(err.to_string().contains("TG002"));
    /// assert!(RateLimitLayer::from_config_audited(&plan, OnAuditFailure::Warn).is_ok());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field, or on `(audit)` when the audit fails and
    /// `on_failure` is [`OnAuditFailure::Refuse`].
    pub fn from_config_audited(
        plan: &Plan,
        on_failure: OnAuditFailure,
    ) -> Result<Self, ConfigError> {
        let report = crate::audit(plan);
        if !report.pass {
            match on_failure {
                OnAuditFailure::Refuse => {
                    let rules: Vec<String> = report
                        .findings
                        .iter()
                        .filter(|f| f.severity == crate::audit::Severity::Error)
                        .map(|f| format!("{} {}", f.rule, f.message))
                        .collect();
                    return Err(ConfigError::new(
                        "(audit)",
                        format_args!("score {}", report.score),
                        format!("the plan fails the audit: {}", rules.join("; ")),
                    ));
                }
                OnAuditFailure::Warn => {
                    for f in &report.findings {
                        tracing::warn!(
                            rule = f.rule,
                            name = f.name,
                            "tollgate audit: {}",
                            f.message
                        );
                    }
                }
            }
        }
        Self::from_config(plan)
    }

    /// Builds the layer a [`Plan`] describes (limiter, header style, `Retry-After`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field.
    pub fn from_config(plan: &Plan) -> Result<Self, ConfigError> {
        Ok(crate::RateLimitLayer::new(Limiter::from_config(plan)?)
            .header_style(plan.header_style)
            .retry_after_header(plan.retry_after.unwrap_or(true))
            .quota_headers_on_success(plan.quota_headers.unwrap_or(true)))
    }
}
