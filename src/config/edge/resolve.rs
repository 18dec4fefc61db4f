//! An `[edge]` rule checked and resolved against the plan: its routes as path and method
//! matches, its key, and its numbers in milliseconds. The exporters read only this.

use std::collections::BTreeSet;

use super::{EdgeAction, EdgeKeyKind, EdgeRuleConfig, EdgeTarget};
use crate::config::schema::parse_duration;
use crate::config::Plan;
use crate::error::ConfigError;

/// What the rule counts by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Key {
    Ip,
    /// A lower-case header name of letters, digits and `-`.
    Header(String),
    Global,
}

/// How a route's path is matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum PathMatch {
    Exact(String),
    /// Everything under this prefix (a trailing `{*rest}`).
    Prefix(String),
    /// An anchored regular expression (path parameters).
    Regex(String),
}

/// One of the rule's routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteMatch {
    pub(crate) pattern: String,
    /// `None`: every method. `GET` also covers `HEAD`, as in the route table.
    pub(crate) methods: Option<Vec<String>>,
    pub(crate) path: PathMatch,
}

/// A checked `[[edge.rules]]` entry.
#[derive(Debug, Clone)]
pub(crate) struct EdgeRule {
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) routes: Vec<RouteMatch>,
    pub(crate) key: Key,
    pub(crate) limit: u64,
    pub(crate) window_ms: u64,
    pub(crate) window_text: String,
    pub(crate) burst: u64,
    pub(crate) burst_set: bool,
    pub(crate) max_delay_ms: Option<u64>,
    pub(crate) action: EdgeAction,
    pub(crate) targets: Vec<EdgeTarget>,
}

impl EdgeRule {
    /// `edge.rules[i].<name>`.
    pub(crate) fn field(&self, name: &str) -> String {
        format!("edge.rules[{}].{name}", self.index)
    }

    /// `300 requests per 1m per client IP, at most 300 at once`.
    pub(crate) fn describe(&self) -> String {
        let key = match &self.key {
            Key::Ip => "client IP".to_owned(),
            Key::Header(h) => format!("{h} header value"),
            Key::Global => "everyone together".to_owned(),
        };
        let per = if self.key == Key::Global {
            "for"
        } else {
            "per"
        };
        format!(
            "{} requests per {} {per} {key}, at most {} at once",
            self.limit, self.window_text, self.burst
        )
    }

    /// An error on `field` saying what `target` cannot express.
    pub(crate) fn refuse(
        &self,
        field: &str,
        value: impl std::fmt::Display,
        target: EdgeTarget,
        why: impl std::fmt::Display,
    ) -> ConfigError {
        ConfigError::new(self.field(field), value, format!("{target}: {why}"))
    }

    /// A request that `target` cannot express and that rounds only toward a stricter limit:
    /// fine (with `note`) when the user asked for rounding, else the error.
    pub(crate) fn stricter_or_refuse(
        &self,
        round_stricter: bool,
        notes: &mut Vec<String>,
        refusal: ConfigError,
        note: String,
    ) -> Result<(), ConfigError> {
        if round_stricter {
            notes.push(format!(
                "edge.rules[{}] {:?}: {note}",
                self.index, self.name
            ));
            Ok(())
        } else {
            Err(ConfigError::new(
                refusal.field(),
                refusal.value(),
                format!(
                    "{} (ask for rounding toward the stricter limit to accept: {note})",
                    refusal.reason()
                ),
            ))
        }
    }

    /// For the window-counter targets (Cloudflare, AWS WAF): the requests allowed per
    /// `period` seconds, where `period` is the rule's window when the target has it, else
    /// (only if asked) the longest allowed period shorter than the window with proportionally
    /// fewer requests (rounded down), which is stricter at every scale. `min_limit` is the
    /// target's smallest limit.
    pub(crate) fn window_counter(
        &self,
        target: EdgeTarget,
        periods: &[u64],
        min_limit: u64,
        round_stricter: bool,
        notes: &mut Vec<String>,
    ) -> Result<(u64, u64), ConfigError> {
        let listed = periods
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let listed = match listed.rsplit_once(", ") {
            Some((a, b)) => format!("{a} or {b}"),
            None => listed,
        };
        let mut limit = self.limit;
        if self.burst_set && self.burst != self.limit {
            let refusal = self.refuse(
                "burst",
                self.burst,
                target,
                "counts requests per period and has no separate burst: leave burst unset or equal to limit",
            );
            limit = self.limit.min(self.burst);
            self.stricter_or_refuse(
                round_stricter,
                notes,
                refusal,
                format!("no separate burst on {target}: {limit} per period, the smaller of limit and burst"),
            )?;
        }
        if let Some(ms) = self.max_delay_ms {
            let refusal = self.refuse(
                "max_delay",
                format_args!("{ms}ms"),
                target,
                "cannot delay requests, only act on them",
            );
            self.stricter_or_refuse(
                round_stricter,
                notes,
                refusal,
                "requests beyond the limit are refused instead of delayed".to_owned(),
            )?;
        }
        let exact =
            self.window_ms.is_multiple_of(1000) && periods.contains(&(self.window_ms / 1000));
        let (period, requests) = if exact {
            (self.window_ms / 1000, limit)
        } else {
            let refusal = self.refuse(
                "window",
                format_args!("{:?}", self.window_text),
                target,
                format!("the period must be {listed} seconds"),
            );
            let best = periods
                .iter()
                .rev()
                .filter(|p| **p * 1000 <= self.window_ms)
                .map(|p| {
                    let n = u128::from(limit) * u128::from(*p) * 1000 / u128::from(self.window_ms);
                    (*p, u64::try_from(n).unwrap_or(u64::MAX))
                })
                .find(|(_, n)| *n >= min_limit);
            let Some((p, n)) = best else {
                return Err(ConfigError::new(
                    refusal.field(),
                    refusal.value(),
                    format!(
                        "{}, and no period up to the window allows at least {min_limit} request(s) for {limit} per {}: no stricter equivalent exists",
                        refusal.reason(),
                        self.window_text
                    ),
                ));
            };
            self.stricter_or_refuse(
                round_stricter,
                notes,
                refusal,
                format!(
                    "rounded toward the stricter limit: {n} per {p} s instead of {limit} per {}",
                    self.window_text
                ),
            )?;
            (p, n)
        };
        if requests < min_limit {
            return Err(self.refuse(
                "limit",
                limit,
                target,
                format!("the limit must be at least {min_limit} per period"),
            ));
        }
        Ok((period, requests))
    }

    /// For targets that can only refuse: a challenge becomes a block only if asked.
    pub(crate) fn block_only(
        &self,
        target: EdgeTarget,
        round_stricter: bool,
        notes: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        if self.action == EdgeAction::Challenge {
            let refusal = self.refuse(
                "action",
                "\"challenge\"",
                target,
                "has no challenge: it can only refuse with 429",
            );
            self.stricter_or_refuse(
                round_stricter,
                notes,
                refusal,
                "blocks with 429 instead of challenging".to_owned(),
            )?;
        }
        Ok(())
    }
}

/// Whether every character of `s` is allowed in an edge path (no quoting needed anywhere).
fn plain_path(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/-._~%".contains(c))
}

/// Escapes the regex metacharacters a plain path can hold.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.^$|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Parses a route pattern into what the edge matches; `field` names it in errors.
pub(crate) fn route_match(field: &str, pattern: &str) -> Result<RouteMatch, ConfigError> {
    let bad = |why: String| ConfigError::new(field, format_args!("{pattern:?}"), why);
    let (method, path) = crate::limiter::parse_pattern(pattern).map_err(bad)?;
    // A method reaches nginx `map` keys and AWS WAF regexes as written: letters, digits, `-`
    // and `_` only (an HTTP token may hold `~`, `#`, `'`, `|`, `*`, which those read as
    // syntax).
    if let Some(m) = &method {
        if !m
            .as_str()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad(format!(
                "the edge cannot match the method {:?}: use letters, digits, `-` and `_`",
                m.as_str()
            )));
        }
    }
    let methods = method.map(|m| {
        let mut v = vec![m.as_str().to_owned()];
        if m == http::Method::GET {
            v.push("HEAD".to_owned());
        }
        v
    });
    let mut regex = String::from("^");
    let mut static_only = true;
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let (before, after) = rest.split_at(open);
        let close = after
            .find('}')
            .ok_or_else(|| bad("an unclosed `{` in the path".to_owned()))?;
        if !plain_path(before) {
            return Err(bad(
                "edge paths may hold only letters, digits, `/`, `-`, `.`, `_`, `~` and `%` besides {parameters}".to_owned(),
            ));
        }
        regex.push_str(&regex_escape(before));
        let param = &after[1..close];
        rest = &after[close + 1..];
        if param.starts_with('*') {
            if !rest.is_empty() {
                return Err(bad("a catch-all must end the path".to_owned()));
            }
            if static_only && before.ends_with('/') {
                return Ok(RouteMatch {
                    pattern: pattern.trim().to_owned(),
                    methods,
                    path: PathMatch::Prefix(before.to_owned()),
                });
            }
            regex.push_str(".+");
        } else {
            regex.push_str("[^/]+");
        }
        static_only = false;
    }
    if !plain_path(rest) {
        return Err(bad(
            "edge paths may hold only letters, digits, `/`, `-`, `.`, `_`, `~` and `%` besides {parameters}".to_owned(),
        ));
    }
    let path = if static_only {
        PathMatch::Exact(rest.to_owned())
    } else {
        regex.push_str(&regex_escape(rest));
        regex.push('$');
        PathMatch::Regex(regex)
    };
    Ok(RouteMatch {
        pattern: pattern.trim().to_owned(),
        methods,
        path,
    })
}

/// `1m` for 60 000 ms, `90s`, `500ms`.
fn window_text(ms: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Milliseconds of a duration field, at least 1.
fn millis(field: &str, text: &str) -> Result<u64, ConfigError> {
    let d = parse_duration(field, text)?;
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || !d.as_nanos().is_multiple_of(1_000_000) || ms > 366 * 86_400_000 {
        return Err(ConfigError::new(
            field,
            format_args!("{text:?}"),
            "must be whole milliseconds, from 1ms to 366 days",
        ));
    }
    Ok(ms)
}

/// Every `[[edge.rules]]` entry, checked against the plan.
pub(crate) fn rules(plan: &Plan) -> Result<Vec<EdgeRule>, ConfigError> {
    let Some(edge) = &plan.edge else {
        return Ok(vec![]);
    };
    let mut names = BTreeSet::new();
    let mut out = vec![];
    for (i, r) in edge.rules.iter().enumerate() {
        let rule = format!("edge.rules[{i}]");
        let at = |f: &str| format!("{rule}.{f}");
        check_name(r, &rule)?;
        if !names.insert(r.name.as_str()) {
            return Err(ConfigError::new(
                at("name"),
                format_args!("{:?}", r.name),
                "two edge rules share this name",
            ));
        }
        if r.limit == 0 || r.limit > u64::from(u32::MAX) {
            return Err(ConfigError::new(
                at("limit"),
                r.limit,
                "must be between 1 and 4294967295",
            ));
        }
        let window_ms = millis(&at("window"), &r.window)?;
        let burst = r.burst.unwrap_or(r.limit);
        if burst == 0 || burst > u64::from(u32::MAX) {
            return Err(ConfigError::new(
                at("burst"),
                burst,
                "must be between 1 and 4294967295",
            ));
        }
        let max_delay_ms = match &r.max_delay {
            Some(text) => Some(millis(&at("max_delay"), text)?),
            None => None,
        };
        let key = key(r, &rule)?;
        let routes = routes(plan, r, &rule)?;
        out.push(EdgeRule {
            index: i,
            name: r.name.clone(),
            routes,
            key,
            limit: r.limit,
            window_ms,
            window_text: window_text(window_ms),
            burst,
            burst_set: r.burst.is_some(),
            max_delay_ms,
            action: r.action,
            targets: r.targets.clone(),
        });
    }
    Ok(out)
}

/// A rule's name: 1 to 64 letters, digits, `-` or `_` (every target accepts those).
fn check_name(r: &EdgeRuleConfig, at: &str) -> Result<(), ConfigError> {
    let ok = !r.name.is_empty()
        && r.name.len() <= 64
        && r.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        return Ok(());
    }
    Err(ConfigError::new(
        format!("{at}.name"),
        format_args!("{:?}", r.name),
        "1 to 64 letters, digits, `-` or `_`",
    ))
}

/// What a rule counts by: `key`, and `header` exactly when the key is a header.
fn key(r: &EdgeRuleConfig, at: &str) -> Result<Key, ConfigError> {
    match (r.key, &r.header) {
        (EdgeKeyKind::Header, Some(h)) => {
            let ok = !h.is_empty()
                && h.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !ok {
                return Err(ConfigError::new(
                    format!("{at}.header"),
                    format_args!("{h:?}"),
                    "a lower-case header name of letters, digits and `-` (every edge target can read those)",
                ));
            }
            Ok(Key::Header(h.clone()))
        }
        (EdgeKeyKind::Header, None) => Err(ConfigError::new(
            format!("{at}.header"),
            "(missing)",
            "key = \"header\" needs the header's name",
        )),
        (kind, Some(h)) => Err(ConfigError::new(
            format!("{at}.header"),
            format_args!("{h:?}"),
            format!("a key of kind {kind:?} reads no header: delete it or set key = \"header\""),
        )),
        (EdgeKeyKind::Ip, None) => Ok(Key::Ip),
        (EdgeKeyKind::Global, None) => Ok(Key::Global),
    }
}

/// A rule's routes: the `[[routes]]` patterns it names, and with `unauthenticated = true`
/// every customer-facing route without `authenticated = true`; each pattern once.
fn routes(plan: &Plan, r: &EdgeRuleConfig, at: &str) -> Result<Vec<RouteMatch>, ConfigError> {
    let mut patterns: Vec<(String, &str)> = vec![];
    for (j, p) in r.routes.iter().enumerate() {
        if !plan
            .routes
            .iter()
            .any(|route| route.pattern.trim() == p.trim())
        {
            return Err(ConfigError::new(
                format!("{at}.routes[{j}]"),
                format_args!("{p:?}"),
                "no [[routes]] entry has this pattern",
            ));
        }
        patterns.push((format!("{at}.routes[{j}]"), p));
    }
    if r.unauthenticated {
        for (k, route) in plan.routes.iter().enumerate() {
            if !route.authenticated && route.is_customer_facing() {
                patterns.push((format!("routes[{k}].pattern"), &route.pattern));
            }
        }
    }
    if patterns.is_empty() {
        return Err(ConfigError::new(
            format!("{at}.routes"),
            "[]",
            if r.unauthenticated {
                "no customer-facing route lacks `authenticated = true`: name the routes"
            } else {
                "name the [[routes]] patterns the rule covers, or set unauthenticated = true"
            },
        ));
    }
    let mut routes: Vec<RouteMatch> = vec![];
    for (field, p) in patterns {
        let m = route_match(&field, p)?;
        if !routes.iter().any(|known| known.pattern == m.pattern) {
            routes.push(m);
        }
    }
    Ok(routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_become_exact_prefix_or_regex_matches() {
        let m = route_match("f", "POST /login").unwrap();
        assert_eq!(m.methods, Some(vec!["POST".to_owned()]));
        assert_eq!(m.path, PathMatch::Exact("/login".to_owned()));
        let m = route_match("f", "GET /api/{*rest}").unwrap();
        assert_eq!(m.methods, Some(vec!["GET".to_owned(), "HEAD".to_owned()]));
        assert_eq!(m.path, PathMatch::Prefix("/api/".to_owned()));
        let m = route_match("f", "/users/{id}/v1.json").unwrap();
        assert_eq!(
            m.path,
            PathMatch::Regex("^/users/[^/]+/v1\\.json$".to_owned())
        );
        let m = route_match("f", "/u/{id}/{*rest}").unwrap();
        assert_eq!(m.path, PathMatch::Regex("^/u/[^/]+/.+$".to_owned()));
        for bad in ["/a b", "/x\"y", "/a/{*r}/b", "/{x", "login", "/a;b"] {
            assert_eq!(route_match("f", bad).unwrap_err().field(), "f", "{bad}");
        }
    }

    #[test]
    fn windows_read_back_in_their_largest_unit() {
        assert_eq!(window_text(60_000), "1m");
        assert_eq!(window_text(90_000), "90s");
        assert_eq!(window_text(1500), "1500ms");
        assert_eq!(window_text(86_400_000), "1d");
    }
}
