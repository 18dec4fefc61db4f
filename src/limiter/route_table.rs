//! Which route a request belongs to, matched the way axum's router matches it.

use std::collections::BTreeMap;
use std::fmt;

use http::{Extensions, HeaderMap, Method, Uri};

use crate::error::ConfigError;

/// A compiled pattern → route lookup over [`matchit`], the router axum uses.
#[derive(Clone)]
pub(crate) struct RouteTable {
    router: matchit::Router<Vec<(Option<Method>, usize)>>,
}

impl fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable").finish_non_exhaustive()
    }
}

/// Splits `"POST /login"` into its method and path; a bare path applies to every method.
/// Refuses the path syntax of axum 0.7 (`:id`, `*rest`), which matchit would take literally
/// (and axum 0.8 itself refuses), naming the `{id}` / `{*rest}` form instead.
pub(crate) fn parse_pattern(pattern: &str) -> Result<(Option<Method>, &str), String> {
    let pattern = pattern.trim();
    let (method, path) = match pattern.split_once(char::is_whitespace) {
        Some((m, p)) => (Some(m), p.trim()),
        None => (None, pattern),
    };
    let method = match method {
        Some(m) => Some(
            Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| format!("`{m}` is not an HTTP method"))?,
        ),
        None => None,
    };
    if !path.starts_with('/') {
        return Err("the path must start with '/'".to_owned());
    }
    for segment in path.split('/') {
        if let Some(name) = segment.strip_prefix(':') {
            return Err(format!(
                "`{segment}` is axum 0.7 syntax, matched literally here (and refused by axum \
                 0.8): write `{{{name}}}`"
            ));
        }
        if let Some(name) = segment.strip_prefix('*') {
            return Err(format!(
                "`{segment}` is axum 0.7 syntax, matched literally here (and refused by axum \
                 0.8): write `{{*{name}}}`"
            ));
        }
    }
    Ok((method, path))
}

impl RouteTable {
    /// Builds the table from `(pattern, route index)` pairs; errors name `routes[i].pattern`.
    pub(crate) fn build(patterns: &[(String, usize)]) -> Result<Self, ConfigError> {
        let mut by_path: BTreeMap<&str, Vec<(Option<Method>, usize)>> = BTreeMap::new();
        let mut order: Vec<(&str, usize)> = vec![];
        for (i, (pattern, idx)) in patterns.iter().enumerate() {
            let field = format!("routes[{i}].pattern");
            let (method, path) = parse_pattern(pattern)
                .map_err(|reason| ConfigError::new(&field, format_args!("{pattern:?}"), reason))?;
            let entry = by_path.entry(path).or_insert_with(|| {
                order.push((path, i));
                vec![]
            });
            if entry.iter().any(|(m, _)| *m == method) {
                return Err(ConfigError::new(
                    field,
                    format_args!("{pattern:?}"),
                    "the same method and path appear twice",
                ));
            }
            entry.push((method, *idx));
        }
        let mut router = matchit::Router::new();
        for (path, i) in order {
            let routes = by_path.remove(path).unwrap_or_default();
            router.insert(path, routes).map_err(|e| {
                ConfigError::new(
                    format!("routes[{i}].pattern"),
                    format_args!("{:?}", patterns[i].0),
                    e.to_string(),
                )
            })?;
        }
        Ok(Self { router })
    }

    /// The route index for a request, if a pattern matches: the route for the request's
    /// method, else (for `HEAD`, which axum serves with `GET` handlers) the `GET` route, else
    /// the route for any method, else, for a gRPC call (`grpc`, or a path of a gRPC method's
    /// shape), the `POST` route: a gRPC server serves a call whatever its HTTP method (tonic's
    /// router and generated services match the path alone), so a `PUT` or `post` must not
    /// step around a route declared as `POST /pkg.Service/Method`.
    pub(crate) fn lookup(&self, method: &Method, path: &str, grpc: bool) -> Option<usize> {
        let routes = self.router.at(path).ok()?.value;
        let for_method = |wanted: &Method| {
            routes
                .iter()
                .find(|(m, _)| m.as_ref() == Some(wanted))
                .map(|(_, i)| *i)
        };
        for_method(method)
            .or_else(|| (method == Method::HEAD).then(|| for_method(&Method::GET))?)
            .or_else(|| routes.iter().find(|(m, _)| m.is_none()).map(|(_, i)| *i))
            .or_else(|| (grpc || is_grpc_method_path(path)).then(|| for_method(&Method::POST))?)
    }

    /// Whether a pattern matching the request names its method itself (`GET /login`), not
    /// one for any method: the login guard takes a safe method (a page load) for an attempt
    /// only then.
    pub(crate) fn names_method(&self, method: &Method, uri: &Uri, extensions: &Extensions) -> bool {
        let names = |path: &str| {
            self.router.at(path).is_ok_and(|found| {
                found.value.iter().any(|(m, _)| {
                    m.as_ref() == Some(method)
                        || (method == Method::HEAD && m.as_ref() == Some(&Method::GET))
                })
            })
        };
        if names(uri.path()) {
            return true;
        }
        #[cfg(feature = "axum")]
        if let Some(axum::extract::OriginalUri(original)) = extensions.get() {
            return original.path() != uri.path() && names(original.path());
        }
        #[cfg(not(feature = "axum"))]
        let _ = extensions;
        false
    }

    /// The route index for a request as the layer sees it, or, when no pattern matches that
    /// path and the request went through axum's `Router::nest` (which strips the prefix
    /// from what its layers see and keeps the whole path as `OriginalUri`), for the whole
    /// path: a pattern written with the prefix (`POST /auth/login` for a layer inside
    /// `nest("/auth", …)`) still guards its route.
    pub(crate) fn lookup_request(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Option<usize> {
        let grpc = crate::grpc::content_type(headers).is_some();
        let found = self.lookup(method, uri.path(), grpc);
        #[cfg(feature = "axum")]
        if found.is_none() {
            if let Some(axum::extract::OriginalUri(original)) = extensions.get() {
                if original.path() != uri.path() {
                    return self.lookup(method, original.path(), grpc);
                }
            }
        }
        #[cfg(not(feature = "axum"))]
        let _ = extensions;
        found
    }
}

/// Whether `path` has the shape of a gRPC method's: `/package.Service/Method`, two segments,
/// the first naming a service in a package.
fn is_grpc_method_path(path: &str) -> bool {
    let Some((service, method)) = path.strip_prefix('/').and_then(|rest| rest.split_once('/'))
    else {
        return false;
    };
    service.contains('.')
        && !service.starts_with('.')
        && !service.ends_with('.')
        && !method.is_empty()
        && !method.contains('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse() {
        assert_eq!(
            parse_pattern("POST /login").unwrap(),
            (Some(Method::POST), "/login")
        );
        assert_eq!(parse_pattern("/x").unwrap(), (None, "/x"));
        assert_eq!(parse_pattern("get  /x").unwrap(), (Some(Method::GET), "/x"));
        assert!(parse_pattern("login").is_err());
        assert!(parse_pattern("P{ST /x").is_err());
    }

    #[test]
    fn axum_07_syntax_is_refused_with_the_08_form() {
        let err = parse_pattern("/api/:id").unwrap_err();
        assert!(err.contains("`{id}`"), "{err}");
        let err = parse_pattern("GET /files/*rest").unwrap_err();
        assert!(err.contains("`{*rest}`"), "{err}");
        let err = RouteTable::build(&[("/a".into(), 0), ("/api/:id".into(), 1)]).unwrap_err();
        assert_eq!(err.field(), "routes[1].pattern");
    }

    #[test]
    fn most_specific_wins_and_method_beats_any() {
        let t = RouteTable::build(&[
            ("/api/{*rest}".into(), 0),
            ("/api/search".into(), 1),
            ("POST /api/search".into(), 2),
            ("/users/{id}".into(), 3),
        ])
        .unwrap();
        assert_eq!(t.lookup(&Method::GET, "/api/x/y", false), Some(0));
        assert_eq!(t.lookup(&Method::GET, "/api/search", false), Some(1));
        assert_eq!(t.lookup(&Method::POST, "/api/search", false), Some(2));
        assert_eq!(t.lookup(&Method::GET, "/users/7", false), Some(3));
        assert_eq!(t.lookup(&Method::GET, "/other", false), None);
    }

    #[test]
    fn head_takes_the_get_route_unless_it_has_its_own() {
        let t = RouteTable::build(&[("GET /search".into(), 0), ("/any".into(), 1)]).unwrap();
        assert_eq!(t.lookup(&Method::HEAD, "/search", false), Some(0));
        assert_eq!(t.lookup(&Method::POST, "/search", false), None);
        assert_eq!(t.lookup(&Method::HEAD, "/any", false), Some(1));
        let t = RouteTable::build(&[("GET /s".into(), 0), ("HEAD /s".into(), 1)]).unwrap();
        assert_eq!(t.lookup(&Method::HEAD, "/s", false), Some(1));
    }

    #[test]
    fn a_grpc_call_takes_the_post_route_whatever_its_method() {
        let t = RouteTable::build(&[
            ("POST /auth.v1.Auth/Login".into(), 0),
            ("POST /Greeter/SayHello".into(), 1),
            ("POST /v1/items".into(), 2),
        ])
        .unwrap();
        let put = Method::PUT;
        let lower = Method::from_bytes(b"post").unwrap();
        for m in [&put, &lower, &Method::GET, &Method::DELETE] {
            assert_eq!(t.lookup(m, "/auth.v1.Auth/Login", false), Some(0), "{m}");
        }
        // A service without a package is known by its content type alone.
        assert_eq!(t.lookup(&put, "/Greeter/SayHello", false), None);
        assert_eq!(t.lookup(&put, "/Greeter/SayHello", true), Some(1));
        // Plain HTTP paths keep axum's rule: another method is another route.
        assert_eq!(t.lookup(&put, "/v1/items", false), None);
        assert!(!is_grpc_method_path("/a.b/c/d"));
        assert!(!is_grpc_method_path("/./c"));
        assert!(!is_grpc_method_path("/a.b/"));
    }

    #[test]
    fn bad_patterns_name_the_route() {
        let err = RouteTable::build(&[("/a".into(), 0), ("nope".into(), 1)]).unwrap_err();
        assert_eq!(err.field(), "routes[1].pattern");
        let err = RouteTable::build(&[("/a/{*x}/b".into(), 0)]).unwrap_err();
        assert_eq!(err.field(), "routes[0].pattern");
        let err = RouteTable::build(&[("/x/{".into(), 0)]).unwrap_err();
        assert_eq!(err.field(), "routes[0].pattern");
        let err = RouteTable::build(&[("GET /a".into(), 0), ("GET /a".into(), 1)]).unwrap_err();
        assert_eq!(err.field(), "routes[1].pattern");
    }
}
