//! The key a plan names: `[key]`, its fallbacks and `[login.ip_key]`, as extractors.

use http::HeaderName;

use crate::config::schema::{KeyConfig, KeyKind, Plan};
use crate::error::ConfigError;
use crate::key::{Global, Key, KeyExtractor, PeerIp};

/// A header name from the plan, or an error on `field`.
pub(super) fn header_name(field: &str, value: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(value.as_bytes())
        .map_err(|_| ConfigError::new(field, format_args!("{value:?}"), "not a header name"))
}

/// The value of the environment variable `var`, or an error on `field`.
pub(super) fn env_secret(field: &str, var: &str) -> Result<String, ConfigError> {
    match std::env::var(var) {
        Ok(secret) if secret.is_empty() => Err(ConfigError::new(
            field,
            format_args!("{var:?}"),
            "the environment variable is empty: an empty secret keys nothing (is the secret missing from the deployment?)",
        )),
        Ok(secret) => Ok(secret),
        Err(_) => Err(ConfigError::new(
            field,
            format_args!("{var:?}"),
            "the environment variable is not set",
        )),
    }
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
                // The header's name is part of the key: `x-org-id: 42` and `x-user-id: 42`
                // name two principals, not one (a fallback, another route's key, a tier's).
                let source = format!("header.{}", name.as_str());
                Box::new(crate::key::from_fn(move |req| {
                    req.headers()
                        .get(&name)
                        .map(|v| Key::new(&source, v.as_bytes()))
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
        if let Some((setting, value, _)) = settings
            .into_iter()
            .find(|(_, set, read)| set.is_some() && !*read)
        {
            return Err(ConfigError::new(
                format!("{path}.{setting}"),
                value.unwrap_or_default(),
                format!("a key of kind {kind:?} does not read {setting}: delete it or change {path}.kind"),
            ));
        }
        if kind == Global && self.fallback.is_some() {
            return Err(ConfigError::new(
                format!("{path}.fallback"),
                "(set)",
                "a global key is always there, so its fallback would never be used: delete it",
            ));
        }
        Ok(())
    }

    fn client_ip(&self, path: &str, ipv6_prefix: u8) -> Result<crate::key::ClientIp, ConfigError> {
        let trusted =
            crate::key::TrustedProxies::parse(self.trusted_proxies.iter().map(String::as_str))
                .map_err(|e| e.within(path))?;
        let mut ip = crate::key::ClientIp::new(trusted)
            .ipv6_prefix(ipv6_prefix)
            .map_err(|e| e.within(path))?;
        if let Some(h) = &self.header {
            // Named as the plan names it (the builder's own name is `forwarded_header`).
            let header = crate::key::ForwardedHeader::from_name(h)
                .map_err(|e| ConfigError::new(format!("{path}.header"), e.value(), e.reason()))?;
            ip = ip.header(header);
            // Read only from a trusted proxy's request: with none trusted, never.
            if self.trusted_proxies.is_empty() {
                return Err(ConfigError::new(
                    format!("{path}.header"),
                    format_args!("{h:?}"),
                    format!(
                        "a key of kind {:?} reads its header only from the proxies it trusts, \
                         and {path}.trusted_proxies lists none: list your proxies, or delete the \
                         header (every client would be keyed by the proxy's address)",
                        self.kind
                    ),
                ));
            }
        }
        Ok(ip)
    }
}

impl Plan {
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
}
