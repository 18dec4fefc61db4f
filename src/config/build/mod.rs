//! What a plan builds: the store, the key, the policies, the limiter and the login guard, all
//! through the same builders the code API uses.

use super::schema::Plan;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::login::{LoginGuard, LoginLayer};
use crate::response::HeaderStyle;
use crate::store::{DynStore, MemoryStore};

mod key;
mod login;
mod policies;
mod store;

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
    quota_headers: crate::QuotaHeaders,
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
            .quota_headers(self.quota_headers)
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
        // Kept for `reload_plan`, which compares what a reload cannot change with it.
        limiter.set_source(Some(std::sync::Arc::new(self.clone())));
        // For the layers made from the limiter alone (`RateLimitLayer::new`).
        limiter.set_layer_headers(crate::response::LayerHeaders {
            style: self.header_style,
            quota_headers: self.quota_headers.unwrap_or_default(),
            retry_after: self.retry_after.unwrap_or(true),
        });
        Ok(BuiltPlan {
            store,
            limiter,
            login,
            header_style: self.header_style,
            retry_after: self.retry_after.unwrap_or(true),
            quota_headers: self.quota_headers.unwrap_or_default(),
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
