//! What a plan builds: the store, the key, the policies, the limiter and the login guard, all
//! through the same builders the code API uses.

use std::collections::{BTreeMap, BTreeSet};

use http::HeaderName;

use super::schema::{parse_duration, KeyConfig, KeyKind, Plan, StoreKind};
use crate::error::ConfigError;
use crate::key::{Global, Key, KeyExtractor, PeerIp};
use crate::limiter::{Limiter, LimiterBuilder};
use crate::login::{LoginGuard, LoginLayer};
use crate::policy::{Policy, Rate};
use crate::response::HeaderStyle;
use crate::route::Route;
use crate::store::{DynStore, MemoryStore, Store};

/// A header name from the plan, or an error on `field`.
fn header_name(field: &str, value: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(value.as_bytes())
        .map_err(|_| ConfigError::new(field, format_args!("{value:?}"), "not a header name"))
}

/// The value of the environment variable `var`, or an error on `field`.
fn env_secret(field: &str, var: &str) -> Result<String, ConfigError> {
    std::env::var(var).map_err(|_| {
        ConfigError::new(
            field,
            format_args!("{var:?}"),
            "the environment variable is not set",
        )
    })
}

impl KeyConfig {
    /// The extractor this section describes; `path` names the section in errors (`key`,
    /// `key.fallback`, `login.ip_key`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `<path>.*` when the kind needs settings that are missing, or is not
    /// available in this build.
    ///
    /// ```
    /// use tollgate::config::Plan;
    ///
    /// let plan = Plan::from_toml("[key]\nkind = \"api_key\"\n[key.fallback]\nipv6_prefix = 200")?;
    /// assert_eq!(plan.key.build("key").unwrap_err().field(), "key.fallback.ipv6_prefix");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn build(&self, path: &str) -> Result<Box<dyn KeyExtractor>, ConfigError> {
        let k = self;
        self.unread(path)?;
        let prefix = k.ipv6_prefix.unwrap_or(crate::key::DEFAULT_IPV6_PREFIX);
        if !(1..=128).contains(&prefix) {
            return Err(ConfigError::new(
                format!("{path}.ipv6_prefix"),
                prefix,
                "must be between 1 and 128",
            ));
        }
        let first: Box<dyn KeyExtractor> = match k.kind {
            KeyKind::PeerIp => Box::new(PeerIp::new().ipv6_prefix(prefix).map_err(|e| e.within(path))?),
            KeyKind::Global => Box::new(Global::named(k.name.as_deref().unwrap_or("all"))),
            KeyKind::Header => {
                let header = k.header.as_deref().ok_or_else(|| {
                    ConfigError::new(
                        format!("{path}.header"),
                        "(missing)",
                        "the header kind needs a header name",
                    )
                })?;
                let name = header_name(&format!("{path}.header"), header)?;
                Box::new(crate::key::from_fn(move |req| {
                    req.headers()
                        .get(&name)
                        .map(|v| Key::new("header", v.as_bytes()))
                }))
            }
            KeyKind::ClientIp => Box::new(self.client_ip(path, prefix)?),
            KeyKind::IpUserAgent => {
                Box::new(crate::key::IpUserAgent::new(self.client_ip(path, prefix)?))
            }
            KeyKind::ApiKey => {
                let mut extractor = crate::key::ApiKey::new();
                if let Some(h) = &k.header {
                    extractor = extractor.header(header_name(&format!("{path}.header"), h)?);
                }
                if let Some(var) = &k.secret_env {
                    extractor = extractor.secret(env_secret(&format!("{path}.secret_env"), var)?);
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

    /// A setting this kind of key does not read is an error, not a silent no-op.
    fn unread(&self, path: &str) -> Result<(), ConfigError> {
        use KeyKind::*;
        let kind = self.kind;
        let quoted = |v: &Option<String>| v.as_ref().map(|v| format!("{v:?}"));
        let settings = [
            (
                "header",
                quoted(&self.header),
                matches!(kind, Header | ApiKey | ClientIp | IpUserAgent),
            ),
            ("name", quoted(&self.name), kind == Global),
            (
                "trusted_proxies",
                (!self.trusted_proxies.is_empty()).then(|| format!("{:?}", self.trusted_proxies)),
                matches!(kind, ClientIp | IpUserAgent),
            ),
            (
                "ipv6_prefix",
                self.ipv6_prefix.map(|p| p.to_string()),
                matches!(kind, PeerIp | ClientIp | IpUserAgent),
            ),
            ("secret_env", quoted(&self.secret_env), kind == ApiKey),
        ];
        match settings.into_iter().find(|(_, set, read)| set.is_some() && !*read) {
            Some((setting, value, _)) => Err(ConfigError::new(
                format!("{path}.{setting}"),
                value.unwrap_or_default(),
                format!("a key of kind {kind:?} does not read {setting}: delete it or change {path}.kind"),
            )),
            None => Ok(()),
        }
    }

    fn client_ip(&self, path: &str, ipv6_prefix: u8) -> Result<crate::key::ClientIp, ConfigError> {
        let trusted =
            crate::key::TrustedProxies::parse(self.trusted_proxies.iter().map(String::as_str))
                .map_err(|e| e.within(path))?;
        let mut ip = crate::key::ClientIp::new(trusted)
            .ipv6_prefix(ipv6_prefix)
            .map_err(|e| e.within(path))?;
        if let Some(h) = &self.header {
            ip = ip.header(crate::key::ForwardedHeader::from_name(h).map_err(|e| e.within(path))?);
        }
        Ok(ip)
    }
}

/// A login guard and the layer that applies it.
type Login<S> = (LoginGuard<S>, LoginLayer<S>);

/// Everything a [`Plan`] builds, sharing one store: the limiter, its layer, and the login
/// guard of `[login]` with its layer. Made by [`Plan::build`].
///
/// # Examples
///
/// An app with both layers (the login layer inside, so the limiter's policies see the login
/// route too):
///
/// ```
/// use axum::{routing::{get, post}, Router};
/// use http::StatusCode;
/// use tollgate::config::Plan;
///
/// let plan = Plan::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/from_config.toml"))?;
/// let built = plan.build()?;
/// let mut app = Router::new()
///     .route("/login", post(|| async { StatusCode::UNAUTHORIZED }))
///     .route("/", get(|| async { "home" }));
/// if let Some(login) = built.login_layer() {
///     app = app.layer(login);
/// }
/// let app: Router = app.layer(built.layer());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct BuiltPlan {
    store: DynStore,
    limiter: Limiter<DynStore>,
    login: Option<Login<DynStore>>,
    header_style: HeaderStyle,
    retry_after: bool,
    quota_headers: bool,
}

impl BuiltPlan {
    /// The store every part shares.
    ///
    /// See the type docs for an example of a built plan.
    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// The limiter (`[[policies]]`, `[[routes]]`, `[default]`, `[key]`, the access lists).
    ///
    /// ```
    /// let plan = tollgate::config::Plan::from_toml(
    ///     "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1s\"\n[default]\npolicies = [\"api\"]",
    /// )?;
    /// assert_eq!(plan.build()?.limiter().policies()[0].name(), "api");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn limiter(&self) -> &Limiter<DynStore> {
        &self.limiter
    }

    /// The limiter as a layer, with the plan's `header_style`, `retry_after` and
    /// `quota_headers`.
    ///
    /// See the type docs for an example.
    pub fn layer(&self) -> crate::RateLimitLayer<DynStore> {
        crate::RateLimitLayer::new(self.limiter.clone())
            .header_style(self.header_style)
            .retry_after_header(self.retry_after)
            .quota_headers_on_success(self.quota_headers)
    }

    /// The login guard of `[login]`, if the plan has one, for a handler that checks and
    /// records attempts itself.
    ///
    /// See [`LoginConfig`](super::LoginConfig) for an example.
    pub fn login_guard(&self) -> Option<&LoginGuard<DynStore>> {
        self.login.as_ref().map(|(guard, _)| guard)
    }

    /// The login guard as a layer that checks only `[login].routes` and reads the username
    /// from `username_header` or `username_field`; `None` without `[login]`.
    ///
    /// See the type docs for an example.
    pub fn login_layer(&self) -> Option<LoginLayer<DynStore>> {
        self.login.as_ref().map(|(_, layer)| layer.clone())
    }
}

impl Plan {
    fn rate(&self, i: usize) -> Result<Rate, ConfigError> {
        let p = &self.policies[i];
        let window = parse_duration("window", &p.window)
            .map_err(|e| e.within(format_args!("policies[{i}]")))?;
        let rate = Rate::new(p.limit, window);
        Ok(match p.burst {
            Some(b) => rate.with_burst(b),
            None => rate,
        })
    }

    fn policy(&self, i: usize) -> Result<Policy, ConfigError> {
        let p = &self.policies[i];
        let at = format!("policies[{i}]");
        let builder = |rate: Rate| {
            let mut b = Policy::builder(p.name.clone(), rate)
                .algorithm(p.algorithm)
                .sensitive(p.sensitive)
                .shadow(p.shadow);
            if let Some(c) = p.cost {
                b = b.cost(c);
            }
            if let Some(d) = &p.penalty {
                b = b.penalty(parse_duration("penalty", d)?);
            }
            if let Some(d) = &p.max_delay {
                b = b.shape(parse_duration("max_delay", d)?);
            }
            Ok::<_, ConfigError>(b)
        };
        let rate = self.rate(i)?;
        builder(rate)
            .and_then(crate::PolicyBuilder::build)
            .map_err(|e| {
                // A window so long that not even a limit of 1 builds is the window's fault.
                let window_alone = e.field() == "limit"
                    && builder(Rate::new(1, rate.window()))
                        .and_then(|b| b.cost(1).build())
                        .is_err_and(|e| e.field() == "limit");
                if window_alone {
                    ConfigError::new(
                        format!("{at}.window"),
                        format_args!("{:?}", p.window),
                        "too long: limit × window must not exceed 2^50 ms, and this window alone does",
                    )
                } else {
                    e.within(&at)
                }
            })
    }

    /// The former name of [`Plan::build_policies`].
    #[deprecated(
        since = "0.1.0",
        note = "renamed to `build_policies`: it builds, not reads"
    )]
    pub fn policies(&self) -> Result<BTreeMap<String, Policy>, ConfigError> {
        self.build_policies()
    }

    /// Builds and validates every policy, by name: the policies the plan's routes, default
    /// and login guard refer to.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `policies[i].<field>`, or on `policies[i].name` when two policies
    /// share a name.
    ///
    /// ```
    /// let plan = tollgate::config::Plan::from_toml("[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1s\"")?;
    /// assert_eq!(plan.build_policies()?["api"].limit(), 5);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn build_policies(&self) -> Result<BTreeMap<String, Policy>, ConfigError> {
        let mut out = BTreeMap::new();
        for (i, p) in self.policies.iter().enumerate() {
            let policy = self.policy(i)?;
            if out.insert(p.name.clone(), policy).is_some() {
                return Err(ConfigError::new(
                    format!("policies[{i}].name"),
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
    ///
    /// ```
    /// let plan = tollgate::config::Plan::from_toml("[key]\nkind = \"header\"")?;
    /// assert_eq!(plan.extractor().unwrap_err().field(), "key.header");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
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

    /// Settings of the plan that would build nothing: a policy no route, default or
    /// `[login]` uses, and policies or a cost on an exempt route.
    fn unused(&self) -> Vec<ConfigError> {
        let mut errors = vec![];
        fn names<'a>(
            policies: &'a [String],
            tiers: &'a BTreeMap<String, Vec<String>>,
        ) -> impl Iterator<Item = &'a str> {
            policies
                .iter()
                .chain(tiers.values().flatten())
                .map(String::as_str)
        }
        let mut used: BTreeSet<&str> = names(&self.default.policies, &self.default.tiers).collect();
        for (i, r) in self.routes.iter().enumerate() {
            if !r.exempt {
                used.extend(names(&r.policies, &r.tiers));
                continue;
            }
            let ignored = [
                (
                    "policies",
                    !r.policies.is_empty(),
                    format!("{:?}", r.policies),
                ),
                ("tiers", !r.tiers.is_empty(), format!("{:?}", r.tiers)),
                (
                    "cost",
                    r.cost.is_some(),
                    format!("{:?}", r.cost.unwrap_or(0)),
                ),
            ];
            for (field, set, value) in ignored {
                if set {
                    errors.push(ConfigError::new(
                        format!("routes[{i}].{field}"),
                        value,
                        "an exempt route applies no policy: drop this setting or `exempt = true`",
                    ));
                }
            }
        }
        if let Some(login) = &self.login {
            used.extend(
                [&login.ip_username, &login.ip, &login.username]
                    .into_iter()
                    .flatten()
                    .map(String::as_str),
            );
        }
        for (i, p) in self.policies.iter().enumerate() {
            if !used.contains(p.name.as_str()) {
                errors.push(ConfigError::new(
                    format!("policies[{i}]"),
                    format_args!("{:?}", p.name),
                    "no route, [default] or [login] uses this policy, so it limits nothing: attach it or delete it",
                ));
            }
        }
        errors
    }

    /// A limiter builder configured from the plan, on `store`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field.
    ///
    /// ```
    /// use tollgate::{config::Plan, store::MemoryStore};
    ///
    /// let plan = Plan::from_toml(
    ///     "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1s\"\n[default]\npolicies = [\"api\"]",
    /// )?;
    /// let limiter = plan.builder_with_store(MemoryStore::new())?.build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn builder_with_store<S: Store>(&self, store: S) -> Result<LimiterBuilder<S>, ConfigError> {
        let builder = self.limiter_builder(store)?;
        match self.unused().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(builder),
        }
    }

    fn limiter_builder<S: Store>(&self, store: S) -> Result<LimiterBuilder<S>, ConfigError> {
        let policies = self.build_policies()?;
        let default = if self.default.exempt {
            if !self.default.policies.is_empty() || !self.default.tiers.is_empty() {
                return Err(ConfigError::new(
                    "default.exempt",
                    "true",
                    "the default route is exempt and also has policies; it can be one or the other",
                ));
            }
            Route::exempt()
        } else {
            Self::route(
                &policies,
                "default",
                &self.default.policies,
                &self.default.tiers,
            )?
        };
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
            let name = header_name("tier.header", header)?;
            b = b.tier_fn(move |req| req.headers().get(&name).and_then(|v| v.to_str().ok()));
        }
        Ok(b)
    }

    /// Store settings that the store kind would not read.
    fn store_settings(&self) -> Result<(), ConfigError> {
        if self.replicas == Some(0) {
            return Err(ConfigError::new(
                "replicas",
                0,
                "must be at least 1: the number of instances that enforce this plan",
            ));
        }
        let s = &self.store;
        let (kind, ignored) = match s.kind {
            StoreKind::Memory => (
                "memory",
                [
                    ("url", s.url.is_some(), format!("{:?}", s.url)),
                    ("urls", !s.urls.is_empty(), format!("{:?}", s.urls)),
                    ("prefix", s.prefix.is_some(), format!("{:?}", s.prefix)),
                ],
            ),
            StoreKind::Redis => (
                "redis",
                [
                    ("urls", !s.urls.is_empty(), format!("{:?}", s.urls)),
                    (
                        "max_keys",
                        s.max_keys.is_some(),
                        format!("{:?}", s.max_keys),
                    ),
                    ("", false, String::new()),
                ],
            ),
            StoreKind::RedisCluster => (
                "redis_cluster",
                [
                    ("url", s.url.is_some(), format!("{:?}", s.url)),
                    (
                        "max_keys",
                        s.max_keys.is_some(),
                        format!("{:?}", s.max_keys),
                    ),
                    ("", false, String::new()),
                ],
            ),
        };
        match ignored.into_iter().find(|(_, set, _)| *set) {
            Some((field, _, value)) => Err(ConfigError::new(
                format!("store.{field}"),
                value.trim_start_matches("Some(").trim_end_matches(')'),
                format!(
                    "a {kind} store does not read this setting: delete it or change store.kind"
                ),
            )),
            None => Ok(()),
        }
    }

    /// The store the plan names. Building a Redis store does not connect: its first decision
    /// does.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `store.*` when the store is not available in this build, its
    /// settings are incomplete, or it is given a setting it does not read.
    ///
    /// ```
    /// let plan = tollgate::config::Plan::from_toml("[store]\nkind = \"memory\"\nurl = \"redis://x\"")?;
    /// assert_eq!(plan.store().unwrap_err().field(), "store.url");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn store(&self) -> Result<DynStore, ConfigError> {
        self.store_settings()?;
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
    fn resilient<S: Store>(
        &self,
        store: S,
    ) -> Result<crate::store::ResilientStore<S>, ConfigError> {
        use super::schema::FailureModeName;
        use crate::store::{FailureMode, ResilientStore};
        let mode =
            match self.failure_mode {
                Some(FailureModeName::FailOpen) => FailureMode::FailOpen,
                Some(FailureModeName::FailClosed) => FailureMode::FailClosed,
                Some(FailureModeName::LocalFallback) => FailureMode::LocalFallback {
                    replicas: self.replicas.unwrap_or(1),
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

    /// The login guard and its layer that `[login]` describes, on `store`.
    pub(crate) fn login<S: Store + Clone>(
        &self,
        store: S,
    ) -> Result<Option<Login<S>>, ConfigError> {
        let Some(l) = &self.login else {
            return Ok(None);
        };
        if l.routes.is_empty() {
            return Err(ConfigError::new(
                "login.routes",
                "[]",
                "name the login routes the guard checks, e.g. [\"POST /login\"]",
            ));
        }
        // The three limits, by policy name.
        let mut limits = vec![];
        for (field, name) in [
            ("ip_username", &l.ip_username),
            ("ip", &l.ip),
            ("username", &l.username),
        ] {
            let at = format!("login.{field}");
            let name = name.as_deref().ok_or_else(|| {
                ConfigError::new(&at, "(missing)", "name the policy of this login limit")
            })?;
            let i = self
                .policies
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| {
                    ConfigError::new(&at, format_args!("{name:?}"), "no policy has this name")
                })?;
            let p = &self.policies[i];
            let ignored = [
                ("cost", p.cost.map(|c| c.to_string())),
                ("penalty", p.penalty.as_ref().map(|d| format!("{d:?}"))),
                ("max_delay", p.max_delay.as_ref().map(|d| format!("{d:?}"))),
                ("shadow", p.shadow.then(|| "true".to_owned())),
            ];
            if let Some((setting, value)) = ignored.into_iter().find_map(|(s, v)| v.map(|v| (s, v)))
            {
                return Err(ConfigError::new(
                    format!("policies[{i}].{setting}"),
                    value,
                    format!("policy {name:?} limits logins ({at}), and the login guard does not apply this setting: give routes their own policy"),
                ));
            }
            limits.push((at, i, self.rate(i)?, self.policy(i)?.algorithm()));
        }
        let algorithm = limits[0].3;
        if let Some((at, i, _, other)) = limits.iter().find(|(.., a)| *a != algorithm) {
            return Err(ConfigError::new(
                at,
                format_args!("{:?}", self.policies[*i].name),
                format!(
                    "the login guard's three limits share one algorithm: this policy uses {other:?}, login.ip_username's uses {algorithm:?}"
                ),
            ));
        }
        let mut b = LoginGuard::builder()
            .store(store)
            .ip_user_rate(limits[0].2)
            .ip_rate(limits[1].2)
            .user_rate(limits[2].2)
            .algorithm(algorithm)
            .mode(l.mode);
        if let Some(name) = &l.name {
            b = b.name(name.clone());
        }
        if let Some(var) = &l.username_secret_env {
            b = b.username_secret(env_secret("login.username_secret_env", var)?);
        }
        let (ip_key, path) = match &l.ip_key {
            Some(k) => (k, "login.ip_key"),
            None if self.key.kind.is_ip_only() => (&self.key, "key"),
            None => {
                return Err(ConfigError::new(
                    "login.ip_key",
                    "(missing)",
                    format!(
                        "the login guard needs the client address, and [key] is {:?}: set [login.ip_key] with kind = \"peer_ip\" or \"client_ip\"",
                        self.key.kind
                    ),
                ))
            }
        };
        if !ip_key.kind.is_ip_only() {
            return Err(ConfigError::new(
                format!("{path}.kind"),
                format_args!("{:?}", ip_key.kind),
                "the login guard's client address needs kind = \"peer_ip\" or \"client_ip\"",
            ));
        }
        b = b.ip_source(ip_key.build(path)?);
        let guard = b.build().map_err(|e| {
            let field = e.field();
            let mapped = [("ip_user_rate", 0), ("ip_rate", 1), ("user_rate", 2)]
                .into_iter()
                .find_map(|(prefix, n)| {
                    field
                        .strip_prefix(prefix)
                        .map(|rest| format!("policies[{}]{rest}", limits[n].1))
                });
            let field = match (mapped, field) {
                (Some(f), _) => f,
                (None, "username_secret") => "login.username_secret_env".to_owned(),
                (None, other) => format!("login.{other}"),
            };
            ConfigError::new(field, e.value(), e.reason())
        })?;
        let layer = match (&l.username_header, &l.username_field) {
            (Some(header), None) => {
                if let Some(max) = l.max_body_bytes {
                    return Err(ConfigError::new(
                        "login.max_body_bytes",
                        max,
                        "only username_field reads the body: delete this setting",
                    ));
                }
                LoginLayer::header(guard.clone(), header_name("login.username_header", header)?)
            }
            (None, Some(field)) => {
                let layer = LoginLayer::json_field(guard.clone(), field.clone());
                match l.max_body_bytes {
                    Some(max) => layer.max_body_bytes(max),
                    None => layer,
                }
            }
            (header, _) => {
                return Err(ConfigError::new(
                    "login.username_header",
                    format_args!("{header:?}"),
                    "set exactly one of username_header (a request header) and username_field (a field of a JSON body)",
                ))
            }
        };
        let layer = layer
            .routes(l.routes.iter().cloned())
            .map_err(|e| e.within("login"))?;
        Ok(Some((guard, layer)))
    }

    /// Builds everything the plan describes, sharing one store: the limiter and, with
    /// `[login]`, the login guard. This is what [`Limiter::from_config`],
    /// [`RateLimitLayer::from_config`](crate::RateLimitLayer::from_config) and the
    /// [audit](crate::audit()) build. Nothing connects yet: a Redis store connects on its first
    /// decision.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`], naming the field and its value; see
    /// [`build_errors`](Self::build_errors) for all of them.
    ///
    /// See [`BuiltPlan`] for an example.
    pub fn build(&self) -> Result<BuiltPlan, ConfigError> {
        let store = self.store()?;
        let builder = self.limiter_builder(store.clone())?;
        let login = self.login(store.clone())?;
        // A policy nothing uses is reported after the references that might have used it.
        if let Some(e) = self.unused().into_iter().next() {
            return Err(e);
        }
        let limiter = builder.build().map_err(plan_field)?;
        Ok(BuiltPlan {
            store,
            limiter,
            login,
            header_style: self.header_style,
            retry_after: self.retry_after.unwrap_or(true),
            quota_headers: self.quota_headers.unwrap_or(true),
        })
    }

    /// Every reason the plan does not build, as far as they can be told apart: each invalid
    /// or unused policy, the store, then the limiter and the login guard (built on a memory
    /// store when the plan's store does not build). Empty when [`build`](Self::build)
    /// succeeds. Connects nowhere.
    ///
    /// ```
    /// use tollgate::config::Plan;
    ///
    /// let plan = Plan::from_toml(r#"
    ///     [[policies]]
    ///     name = "api"
    ///     limit = 100
    ///     window = "1m"
    ///     [[policies]]
    ///     name = "spare"
    ///     limit = 1
    ///     window = "1m"
    ///     [[routes]]
    ///     pattern = "/a"
    ///     policies = ["nope"]
    /// "#)?;
    /// let fields: Vec<String> = plan.build_errors().iter().map(|e| e.field().to_owned()).collect();
    /// assert_eq!(fields, ["policies[0]", "policies[1]", "routes[0].policies[0]"]);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn build_errors(&self) -> Vec<ConfigError> {
        let mut errors: Vec<ConfigError> = vec![];
        if let Err(e) = self.build_policies() {
            errors.push(e);
            return errors;
        }
        errors.extend(self.unused());
        let store = self.store().unwrap_or_else(|e| {
            errors.push(e);
            DynStore::new(MemoryStore::new())
        });
        if let Err(e) = self
            .limiter_builder(store.clone())
            .and_then(|b| b.build().map_err(plan_field))
        {
            errors.push(e);
        }
        if let Err(e) = self.login(store) {
            if !errors.contains(&e) {
                errors.push(e);
            }
        }
        errors
    }
}

/// A limiter builder's error in the plan's terms: the builder's own fields for the default
/// route (`policies`, `tiers`, `cost`) are the plan's `[default]` section.
fn plan_field(e: ConfigError) -> ConfigError {
    let field = e.field();
    let default_route = ["policies", "tiers", "cost", "exempt"].iter().any(|f| {
        field == *f || field.starts_with(&format!("{f}.")) || field.starts_with(&format!("{f}["))
    });
    if !default_route {
        return e;
    }
    let reason = e.reason().replace(
        "LimiterBuilder::default_route(Route::exempt())",
        "[default] exempt = true",
    );
    let reason = reason.replace("LimiterBuilder::policy", "[default] policies");
    ConfigError::new(format!("default.{field}"), e.value(), reason)
}

impl Limiter<DynStore> {
    /// Builds the limiter a [`Plan`] describes (through [`Plan::build`], so a broken
    /// `[login]` section is refused too; use [`BuiltPlan::login_layer`] to apply it).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field.
    ///
    /// See the [module docs](crate::config) for an example.
    pub fn from_config(plan: &Plan) -> Result<Self, ConfigError> {
        let built = plan.build()?;
        warn_unapplied_login(plan);
        Ok(built.limiter)
    }
}

/// `from_config` builds one layer; a plan's `[login]` needs the second one.
fn warn_unapplied_login(plan: &Plan) {
    if plan.login.is_some() {
        tracing::warn!(
            "tollgate: the plan's [login] guard is built but not applied by from_config; build with Plan::build() and add BuiltPlan::login_layer()"
        );
    }
}

/// What [`RateLimitLayer::from_config_audited`](crate::RateLimitLayer::from_config_audited)
/// does with a plan that fails the [audit](crate::audit()).
///
/// See [`RateLimitLayer::from_config_audited`](crate::RateLimitLayer::from_config_audited)
/// for an example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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

    /// Builds the layer a [`Plan`] describes (limiter, header style, `Retry-After`), through
    /// [`Plan::build`]; see [`BuiltPlan`] for the login layer of `[login]`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field.
    ///
    /// See the [module docs](crate::config) for an example.
    pub fn from_config(plan: &Plan) -> Result<Self, ConfigError> {
        let built = plan.build()?;
        warn_unapplied_login(plan);
        Ok(built.layer())
    }
}
