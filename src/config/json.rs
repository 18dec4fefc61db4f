//! The plan as JSON, for tools: the same schema as the TOML file.

use super::Plan;
use crate::error::ConfigError;

impl Plan {
    /// Parses a plan written as JSON (the same fields as TOML: `{"policies": [{"name": …}]}`).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field (`policies[0].limit`) and, for a syntax or type
    /// error, the line and column.
    ///
    /// ```
    /// use tollgate::config::Plan;
    ///
    /// let plan = Plan::from_json(r#"{
    ///     "policies": [{"name": "api", "limit": 100, "window": "1m"}],
    ///     "default": {"policies": ["api"]},
    ///     "edge": {"rules": [{"name": "all", "unauthenticated": true, "limit": 600, "window": "1m"}]}
    /// }"#)?;
    /// assert_eq!(plan.edge.unwrap().rules[0].limit, 600);
    ///
    /// let err = Plan::from_json(r#"{"policies": [{"name": "api", "limit": "ten", "window": "1m"}]}"#).unwrap_err();
    /// assert_eq!(err.field(), "policies[0].limit");
    /// assert!(err.reason().contains("line 1"));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let plan: Plan = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let field = if path == "." {
                "(file)".to_owned()
            } else {
                path
            };
            let at = format!("line {}, column {}", inner.line(), inner.column());
            let mut reason = inner.to_string();
            if !reason.contains(&at) {
                reason = format!("{reason} ({at})");
            }
            ConfigError::new(field, "", reason)
        })?;
        de.end().map_err(|e| {
            ConfigError::new(
                "(file)",
                format_args!("line {}, column {}", e.line(), e.column()),
                e.to_string(),
            )
        })?;
        plan.build_policies()?;
        Ok(plan)
    }
}
