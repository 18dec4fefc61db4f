//! The plan as JSON, for tools: the same schema as the TOML file; plan files in either format.

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
            // An unknown field is named by its key, as in TOML (its value may be a secret
            // written under a misspelt name); a value of the wrong type is shown (without a
            // URL's credentials, as every `ConfigError` shows it).
            let value = if reason.starts_with("unknown field") {
                field.rsplit('.').next().unwrap_or(&field).to_owned()
            } else {
                value_at(text, &field).unwrap_or(at)
            };
            ConfigError::new(field, value, reason)
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

    /// Reads and parses a plan file: JSON when its name ends in `.json`, else TOML.
    ///
    /// # Errors
    ///
    /// As for [`from_toml`](Self::from_toml) (or [`from_json`](Self::from_json)), or when the
    /// file cannot be read, or (on `(file)`) when it holds a plan in the other format than its
    /// name says.
    ///
    /// ```
    /// use tollgate::config::Plan;
    ///
    /// let plan = Plan::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plan.toml"))?;
    /// assert_eq!(plan.replicas, Some(3));
    /// let err = Plan::from_file("no/such/plan.toml").unwrap_err();
    /// assert_eq!(err.field(), "(file)");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("(file)", path.display(), format!("cannot be read: {e}"))
        })?;
        Self::from_file_text(path, &text)
    }

    /// Parses `text`, read from the plan file at `path` (whose name says the format).
    pub(crate) fn from_file_text(path: &std::path::Path, text: &str) -> Result<Self, ConfigError> {
        let json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let (read, other) = if json {
            (
                Self::from_json(text),
                Self::from_toml as fn(&str) -> Result<Self, ConfigError>,
            )
        } else {
            (
                Self::from_toml(text),
                Self::from_json as fn(&str) -> Result<Self, ConfigError>,
            )
        };
        // A plan in the other format than its name says: say so, not where the parse failed.
        // Only a text that holds one (a JSON object, or TOML with a key or a table): an empty
        // or half-written file is a plan of neither.
        let holds_other = if json {
            let toml_content = text
                .lines()
                .map(str::trim)
                .any(|l| !l.starts_with('#') && (l.starts_with('[') || l.contains('=')));
            !text.trim_start().starts_with('{') && toml_content
        } else {
            text.trim_start().starts_with('{')
        };
        match read {
            Err(_) if holds_other && other(text).is_ok() => Err(ConfigError::new(
                "(file)",
                path.display(),
                if json {
                    "named .json, it holds a TOML plan: name it .toml"
                } else {
                    "it holds a JSON plan: name it .json"
                },
            )),
            read => read,
        }
    }
}

/// The JSON value at `field` (`policies[0].limit`) in `text`, written compactly and cut to
/// 80 characters, for an error about it: `None` when the text is not JSON or holds no such
/// value.
fn value_at(text: &str, field: &str) -> Option<String> {
    let mut value: &serde_json::Value = &serde_json::from_str(text).ok()?;
    for part in field.split('.') {
        let (name, indices) = part.split_once('[').map_or((part, ""), |(n, i)| (n, i));
        if !name.is_empty() {
            value = value.get(name)?;
        }
        for index in indices.split('[').filter(|i| !i.is_empty()) {
            value = value.get(index.trim_end_matches(']').parse::<usize>().ok()?)?;
        }
    }
    let owned = serde_json::to_string(value).ok()?;
    let mut shown: String = owned.chars().take(80).collect();
    if shown.len() < owned.len() {
        shown.push('…');
    }
    Some(shown)
}
