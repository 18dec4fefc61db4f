//! The `[login]` section: the login guard and the layer that applies it.

use super::key::{env_secret, header_name};
use super::Login;
use crate::config::schema::{KeyConfig, LoginConfig, Plan};
use crate::error::ConfigError;
use crate::login::{LoginGuard, LoginLayer};
use crate::policy::{Algorithm, Rate};
use crate::store::Store;

/// One of the login guard's three limits: the field naming its policy (`login.ip`), the
/// policy's index in `policies`, and its rate.
struct LoginLimit {
    at: String,
    index: usize,
    rate: Rate,
}

impl Plan {
    /// The login guard that `[login]` describes, on `store` (`None` without `[login]`): for
    /// a tool that shares the application's store, such as an operator unlocking a username
    /// ([`LoginGuard::unlock_user`]) from outside the application.
    ///
    /// ```
    /// use tollgate::{config::Plan, store::MemoryStore};
    ///
    /// let plan = Plan::from_toml(r#"
    ///     [[policies]]
    ///     name = "login-pair"
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
    ///     [login]
    ///     routes = ["POST /login"]
    ///     username_form_field = "username"
    ///     ip_username = "login-pair"
    ///     ip = "login-ip"
    ///     username = "login-user"
    /// "#)?;
    /// let guard = plan.login_guard_with_store(MemoryStore::new())?.expect("[login] is there");
    /// assert_eq!(guard.policies()[2].limit(), 20); // per username
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `[login]` does not build.
    pub fn login_guard_with_store<S: Store + Clone>(
        &self,
        store: S,
    ) -> Result<Option<LoginGuard<S>>, ConfigError> {
        Ok(self.login(store)?.map(|(guard, _)| guard))
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
        let (limits, algorithm) = self.login_limits(l)?;
        let store_fails_by_mode = store.applies_failure_modes();
        let mut b = LoginGuard::builder()
            .store(store)
            .ip_user_rate(limits[0].rate)
            .ip_rate(limits[1].rate)
            .user_rate(limits[2].rate)
            .algorithm(algorithm)
            .mode(l.mode);
        if let Some(name) = &l.name {
            b = b.name(name.clone());
        }
        if let Some(var) = &l.username_secret_env {
            b = b.username_secret(env_secret("login.username_secret_env", var)?);
        }
        if let Some(mode) = self.login_failure_mode(l, store_fails_by_mode)? {
            b = b.failure_mode(mode);
        }
        let (ip_key, path) = self.login_ip_key(l)?;
        b = b.ip_source(ip_key.build(path)?);
        let guard = b.build().map_err(|e| guard_error(e, &limits))?;
        // The plan's response settings hold on the login layer's refusals too.
        let layer = login_layer(l, guard.clone())?
            .retry_after_header(self.retry_after.unwrap_or(true))
            .routes(l.routes.iter().cloned())
            .map_err(|e| e.within("login"))?;
        Ok(Some((guard, layer)))
    }

    /// The failure mode of the login limits: `login.failure_mode`, else fail closed where the
    /// plan fails open (an outage must not open logins to brute force), else the store's.
    fn login_failure_mode(
        &self,
        l: &LoginConfig,
        store_fails_by_mode: bool,
    ) -> Result<Option<crate::store::FailureMode>, ConfigError> {
        use crate::config::schema::FailureModeName;
        use crate::store::FailureMode;
        if !store_fails_by_mode {
            return match l.failure_mode {
                Some(mode) => Err(ConfigError::new(
                    "login.failure_mode",
                    format_args!("{mode:?}"),
                    "only a shared store can be unavailable: delete this setting",
                )),
                None => Ok(None),
            };
        }
        Ok(match (l.failure_mode, self.failure_mode) {
            (Some(FailureModeName::FailOpen), _) => Some(FailureMode::FailOpen),
            (Some(FailureModeName::FailClosed), _) | (None, Some(FailureModeName::FailOpen)) => {
                Some(FailureMode::FailClosed)
            }
            (Some(FailureModeName::LocalFallback), _) => Some(FailureMode::LocalFallback {
                replicas: self.replicas.unwrap_or(1),
            }),
            (None, _) => None,
        })
    }

    /// The three limits `login.ip_username`, `login.ip` and `login.username` name, and the
    /// one algorithm they share.
    fn login_limits(&self, l: &LoginConfig) -> Result<([LoginLimit; 3], Algorithm), ConfigError> {
        let limit = |field: &str, name: &Option<String>| {
            let at = format!("login.{field}");
            let name = name.as_deref().ok_or_else(|| {
                ConfigError::new(&at, "(missing)", "name the policy of this login limit")
            })?;
            let index = self
                .policies
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| {
                    ConfigError::new(&at, format_args!("{name:?}"), "no policy has this name")
                })?;
            self.no_route_only_settings(index, &at)?;
            let rate = self.rate(index)?;
            let algorithm = self.policy(index)?.algorithm();
            Ok::<_, ConfigError>((LoginLimit { at, index, rate }, algorithm))
        };
        let (ip_username, algorithm) = limit("ip_username", &l.ip_username)?;
        let ip = limit("ip", &l.ip)?;
        let username = limit("username", &l.username)?;
        for (other, other_algorithm) in [&ip, &username] {
            if *other_algorithm != algorithm {
                return Err(ConfigError::new(
                    &other.at,
                    format_args!("{:?}", self.policies[other.index].name),
                    format!(
                        "the login guard's three limits share one algorithm: this policy uses {other_algorithm:?}, login.ip_username's uses {algorithm:?}"
                    ),
                ));
            }
        }
        Ok(([ip_username, ip.0, username.0], algorithm))
    }

    /// Refuses a login limit's policy `index` (named at `at`) that sets what only routes
    /// apply: the guard would ignore it.
    fn no_route_only_settings(&self, index: usize, at: &str) -> Result<(), ConfigError> {
        let p = &self.policies[index];
        let ignored = [
            ("cost", p.cost.map(|c| c.to_string())),
            ("penalty", p.penalty.as_ref().map(|d| format!("{d:?}"))),
            ("max_delay", p.max_delay.as_ref().map(|d| format!("{d:?}"))),
            ("shadow", p.shadow.then(|| "true".to_owned())),
        ];
        match ignored.into_iter().find_map(|(s, v)| v.map(|v| (s, v))) {
            Some((setting, value)) => Err(ConfigError::new(
                format!("policies[{index}].{setting}"),
                value,
                format!("policy {:?} limits logins ({at}), and the login guard does not apply this setting: give routes their own policy", p.name),
            )),
            None => Ok(()),
        }
    }

    /// The key section the guard reads the client address from, and its field path:
    /// `[login.ip_key]`, else `[key]` when it keys by address.
    fn login_ip_key<'a>(
        &'a self,
        l: &'a LoginConfig,
    ) -> Result<(&'a KeyConfig, &'static str), ConfigError> {
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
        Ok((ip_key, path))
    }
}

/// A login guard builder's error, on the plan's field: a rate's on its policy, a setting's
/// on `login.<setting>`.
fn guard_error(e: ConfigError, limits: &[LoginLimit; 3]) -> ConfigError {
    let field = e.field();
    let mapped = [("ip_user_rate", 0), ("ip_rate", 1), ("user_rate", 2)]
        .into_iter()
        .find_map(|(prefix, n)| {
            field
                .strip_prefix(prefix)
                .map(|rest| format!("policies[{}]{rest}", limits[n].index))
        });
    let field = match (mapped, field) {
        (Some(f), _) => f,
        (None, "username_secret") => "login.username_secret_env".to_owned(),
        (None, other) => format!("login.{other}"),
    };
    ConfigError::new(field, e.value(), e.reason())
}

/// The largest `login.max_body_bytes` a plan accepts: a login form or JSON body is far
/// smaller, and every attempt's body is buffered before the guard decides.
const MAX_LOGIN_BODY: usize = 1 << 20;

/// The layer applying `guard`, reading the username from `login.username_header`,
/// `login.username_field` or `login.username_form_field` (exactly one of them).
fn login_layer<S: Store + Clone>(
    l: &LoginConfig,
    guard: LoginGuard<S>,
) -> Result<LoginLayer<S>, ConfigError> {
    let body = |layer: LoginLayer<S>| match l.max_body_bytes {
        Some(0) => Err(ConfigError::new(
            "login.max_body_bytes",
            0,
            "no body fits in 0 bytes: every login would be refused (413); give the \
             largest login body to read (the default is 16384)",
        )),
        Some(max) if max > MAX_LOGIN_BODY => Err(ConfigError::new(
            "login.max_body_bytes",
            max,
            format!(
                "at most {MAX_LOGIN_BODY} (1 MiB): every login body, refused ones included, \
                 is buffered up to this size before the guard is asked (the default is 16384)"
            ),
        )),
        Some(max) => Ok(layer.max_body_bytes(max)),
        None => Ok(layer),
    };
    match (&l.username_header, &l.username_field, &l.username_form_field) {
        (Some(header), None, None) => {
            if let Some(max) = l.max_body_bytes {
                return Err(ConfigError::new(
                    "login.max_body_bytes",
                    max,
                    "only username_field and username_form_field read the body: delete this setting",
                ));
            }
            Ok(LoginLayer::header(
                guard,
                header_name("login.username_header", header)?,
            ))
        }
        (None, Some(field), None) => body(LoginLayer::json_field(guard, field.clone())),
        (None, None, Some(field)) => body(LoginLayer::form_field(guard, field.clone())),
        (header, ..) => Err(ConfigError::new(
            "login.username_header",
            format_args!("{header:?}"),
            "set exactly one of username_header (a request header), username_field (a field of a JSON body) and username_form_field (a field of a form body)",
        )),
    }
}
