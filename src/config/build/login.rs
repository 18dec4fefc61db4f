//! The `[login]` section: the login guard and the layer that applies it.

use super::key::{env_secret, header_name};
use super::Login;
use crate::config::schema::Plan;
use crate::error::ConfigError;
use crate::login::{LoginGuard, LoginLayer};
use crate::store::Store;

impl Plan {
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
}
