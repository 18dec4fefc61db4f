//! An admin API for operators (feature `admin`): an axum [`Router`] that shows a key's state,
//! resets a key, lists the keys refused most often and shows the effective plan.
//!
//! **It has no authentication of its own.** Resetting a key lifts its limits, and the
//! answers describe your limits and who hits them: mount it behind your application's own
//! authentication and authorisation (an auth layer on the nested router, an internal-only
//! listener), never on a public route.
//!
//! | request | answer |
//! |---|---|
//! | `GET /keys/{source}/{material}?route=/search&method=GET` (or `/keys?key=…&route=…`) | the key's state under each policy of the request's route ([`KeyState`]); nothing is charged. `route` (a request path, default `/`) and `method` (default `GET`) pick the route and its policies as the route table would (a route attached with [`Limiter::for_route`] is axum's to match, not the table's: its policies are not shown here) |
//! | `DELETE /keys/{source}/{material}` (or `?key=…`, `?digest=…`) | forgets the key's state under every policy of the limiter and of the limiters made from it with [`Limiter::for_route`] ([`Limiter::reset`]): its next request starts afresh |
//! | `GET /overrides/{source}/{material}` | the key's per-key [overrides](crate::overrides) in force: `{"overrides": [{"policy", "limit", "capacity", "expires_in_ms"}, …]}` |
//! | `PUT /overrides/{source}/{material}?policy=api&limit=5000[&burst=…][&ttl_ms=…]` | sets an override ([`Limiter::set_override`]), answering the overrides in force; an invalid one is a 400 naming the field |
//! | `DELETE /overrides/{source}/{material}?policy=api` | removes it: the plan's limit applies again |
//! | `GET /top?n=20` | the keys refused most often lately, the most refused first ([`Limiter::top_refused`]; `n` defaults to 20, at most 1000): `{"keys": [RefusedKey, …]}` |
//! | `GET /plan` | the policies enforced, route by route, with the key each route's requests are keyed by (`limiter`: [`EffectivePlan`]; the routes of limiters made with [`Limiter::for_route`] under their metrics label, `for_route`), and the plan in force (`plan`, when asked for with [`Admin::plan`]; a reload replaces it) |
//!
//! With a login guard ([`Admin::login`]), `DELETE /login/users?username=…` and `DELETE
//! /login/ips?key=…` clear a username's or a client's login limit, and `GET /login/top` lists
//! the login keys refused most often.
//!
//! Every `/keys` and `/overrides` endpoint names its key one of three ways:
//!
//! - **In the path**, its source and raw material, as [`Key::new`] builds it:
//!   `/keys/ip/203.0.113.5`, `/keys/user/42`, `/keys/apikey/<hash>` for the hashed API key
//!   that [`ApiKey`](crate::key::ApiKey) makes. The material may contain `/`; each byte of it
//!   that is not a letter, a digit or one of `- . _ ~ : / @ + = ,` is written `%XX`, as a key
//!   shows it (`header.x-tenant:acme%FF`, material that is not UTF-8, is reached at
//!   `/keys/header.x-tenant/acme%FF`).
//! - **As the key is shown**, `?key=source:material`, pasted as it stands or
//!   percent-encoded by a client library (its `:` arriving as `%3A`, the value is decoded
//!   once); the key's own `%XX` escapes are read once either way (see [`Key`]'s `FromStr`).
//!   The one way to reach a tuple such as [`IpUserAgent`](crate::key::IpUserAgent)'s
//!   `ip+ua:10.0.0.1|curl/8.0` (`|` separates the parts), a digested key (`user:#<32 hex
//!   digits>`, which a URL carries only encoded: `user%3A%23<32 hex digits>`; pasted,
//!   `user:%23…` is the key whose material begins with `#`, as it is shown) or a key with
//!   no material (`anonymous%3A`).
//! - **By the digest `GET /top` shows**, `?digest=<16 hex digits>`, for a key counted among
//!   the refused keys still (404 otherwise): `GET /top` shows a key only as a prefix and a
//!   digest, and this reaches it whatever its length.
//!
//! A query parameter given twice, or one the endpoint does not read, is a 400. Keys are shown back only as a short prefix and a
//! digest, as in logs and spans. Errors are JSON `{"error": code, "message": text}`: 400 for
//! a bad parameter (naming it and its value), 404 for a digest no refused key has, 503 when
//! the store fails. A reset is logged at
//! `INFO` on target `tollgate::admin` with the key's digest.
//!
//! The data lives where the limiter runs: `top` counts the refusals of this process only
//! (ask each instance), while key state and resets go to the store every instance shares.
//! A reset also empties this instance's deny cache for the key (see
//! [`ResilientStore`](crate::store::ResilientStore)); other instances' caches hold their
//! denials until their store confirms them no more: at most their `deny_cache_recheck` (250 ms
//! by default) plus one store call, and never past their `deny_cache_max_age` (1 s by default).
//!
//! # Examples
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use axum::{body::Body, http::{Request, StatusCode}, Router};
//! use tower::ServiceExt;
//! use tollgate::{admin::Admin, key::Key, Limiter, Policy, Rate};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("api", Rate::per_minute(1))?)
//!     .build()?;
//! let key = Key::new("user", "42");
//! limiter.check(&key, 1).await?;
//! limiter.check(&key, 1).await?; // refused
//!
//! // Nest it where only operators reach it (add your auth layer to this router).
//! let app: Router = Router::new().nest("/admin/ratelimit", Admin::new(limiter.clone()).router());
//!
//! let res = app.clone().oneshot(Request::get("/admin/ratelimit/keys/user/42").body(Body::empty())?).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! let body = axum::body::to_bytes(res.into_body(), 1 << 20).await?;
//! let state: tollgate::KeyState = serde_json::from_slice(&body)?;
//! assert!(!state.allowed);
//! assert_eq!(state.policies[0].remaining, 0);
//!
//! let res = app.clone().oneshot(Request::get("/admin/ratelimit/top").body(Body::empty())?).await?;
//! let body = axum::body::to_bytes(res.into_body(), 1 << 20).await?;
//! let top: serde_json::Value = serde_json::from_slice(&body)?;
//! assert_eq!(top["keys"][0]["key"], "user:42");
//!
//! let res = app.oneshot(Request::delete("/admin/ratelimit/keys/user/42").body(Body::empty())?).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert!(limiter.check(&key, 1).await?.is_allowed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! With the plan the limiter was built from (feature `config`), `GET /plan` shows it too:
//!
//! ```
//! # #[cfg(feature = "config")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::{admin::Admin, config::Plan};
//!
//! let plan = Plan::from_toml(
//!     "[[policies]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]",
//! )?;
//! let built = plan.build()?;
//! let admin: axum::Router = Admin::new(built.limiter().clone()).plan(&plan).router();
//! # let _ = admin;
//! # Ok(()) }
//! # #[cfg(not(feature = "config"))]
//! # fn main() {}
//! ```

mod login;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::key::{Key, RequestView};
use crate::store::Store;
use crate::{CheckError, EffectivePlan, KeyState, Limiter, RefusedKey};

/// How many keys `GET /top` lists unless asked.
const DEFAULT_TOP: usize = 20;
/// The most keys `GET /top` lists.
const MAX_TOP: usize = 1000;

/// Builds the admin [`Router`] for a limiter. See the [module docs](self) for the endpoints
/// and examples.
#[must_use]
pub struct Admin<S> {
    limiter: Limiter<S>,
    plan: Option<serde_json::Value>,
    login: Option<crate::login::LoginGuard<S>>,
}

impl<S: fmt::Debug> fmt::Debug for Admin<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("limiter", &self.limiter)
            .field("plan", &self.plan.is_some())
            .field("login", &self.login.is_some())
            .finish()
    }
}

impl<S: Store> Admin<S> {
    /// The admin API of `limiter` (and of every limiter made from it with
    /// [`Limiter::for_route`], which share its store and its top refused keys).
    ///
    /// See the [module docs](self) for an example.
    pub fn new(limiter: Limiter<S>) -> Self {
        Self {
            limiter,
            plan: None,
            login: None,
        }
    }

    /// Shows the plan in `GET /plan`, next to what the limiter enforces (any URL in it without
    /// its user and password): the plan in force, which a reload
    /// ([`Limiter::reload_plan`], a [`PlanWatcher`](crate::config::PlanWatcher)) replaces, or
    /// `plan` while the limiter was not built from one.
    ///
    /// See the [module docs](self) for an example.
    #[cfg(feature = "config")]
    pub fn plan(mut self, plan: &crate::config::Plan) -> Self {
        self.plan = shown(plan);
        self
    }

    /// The router: nest it under a path of your choice, behind your own authentication.
    ///
    /// See the [module docs](self) for an example.
    pub fn router(self) -> Router {
        let state = Arc::new(self);
        let router = Router::new()
            .route("/keys", get(key_state::<S>).delete(reset::<S>))
            .route(
                "/keys/{source}/{*material}",
                get(key_state::<S>).delete(reset::<S>),
            )
            .route(
                "/overrides",
                get(list_overrides::<S>)
                    .put(set_override::<S>)
                    .delete(remove_override::<S>),
            )
            .route(
                "/overrides/{source}/{*material}",
                get(list_overrides::<S>)
                    .put(set_override::<S>)
                    .delete(remove_override::<S>),
            )
            .route("/top", get(top::<S>))
            .route("/plan", get(plan::<S>));
        login::routes(router).with_state(state)
    }
}

/// An error answer: `{"error": code, "message": text}`.
struct Failure {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Failure {
    fn bad(parameter: &str, value: &str, why: &str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: format!("{parameter} = {value:?}: {why}"),
        }
    }
}

impl Failure {
    fn from_config(e: crate::ConfigError) -> Self {
        Self::bad(e.field(), e.value(), e.reason())
    }
}

impl From<CheckError> for Failure {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Invalid(e) => Self::from_config(e),
            e => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: "store_unavailable",
                message: e.to_string(),
            },
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Body<'a> {
            error: &'a str,
            message: &'a str,
        }
        let body = Body {
            error: self.code,
            message: &self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

type Shared<S> = State<Arc<Admin<S>>>;

/// The key a request names: in its path, `/{route}/{source}/{material}` (the material may
/// hold `/`), each part percent-decoded to bytes as [`Key::new`] takes them (a key whose
/// material is not UTF-8, shown as `header.x-tenant:acme%FF`, is reached at
/// `/keys/header.x-tenant/acme%FF`);
/// at `/{route}?key=…`, the key as it is shown ([`Key`]'s `FromStr`), which also reaches
/// tuples (`ip+ua:10.0.0.1|curl/8.0`) and digested keys (`user:#…`); or at
/// `/{route}?digest=…`, a key `GET /top` lists, by the digest it shows.
struct AddressedKey(Key);

impl<S: Store> FromRequestParts<Arc<Admin<S>>> for AddressedKey {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, admin: &Arc<Admin<S>>) -> Result<Self, Failure> {
        let query = parts.uri.query().unwrap_or("");
        let shown = raw_param(query, "key")?;
        let digest = raw_param(query, "digest")?;
        // Nested (as `Admin::router` says to mount it), this router sees its own path:
        // `/keys…` or `/overrides…`.
        let in_path = parts.uri.path().trim_start_matches('/').contains('/');
        match (in_path, shown, digest) {
            (false, Some(text), None) => text.parse().map(Self).map_err(Failure::from_config),
            (false, None, Some(digest)) => admin.limiter.refused_key(&digest).map(Self).ok_or_else(|| Failure {
                status: StatusCode::NOT_FOUND,
                code: "not_found",
                message: format!(
                    "digest = {digest:?}: no key with this digest among the keys refused lately (GET /top lists them)"
                ),
            }),
            (false, None, None) => Err(Failure::bad(
                "key",
                "",
                "name the key: in the path, /{source}/{material}; as shown, ?key=source:material; or by the digest GET /top shows, ?digest=…",
            )),
            (false, Some(_), Some(digest)) | (true, _, Some(digest)) => Err(Failure::bad(
                "digest",
                &digest,
                "the key is named already: name it one way",
            )),
            (true, Some(text), None) => Err(Failure::bad(
                "key",
                &text,
                "the key is named in the path already: name it one way",
            )),
            (true, None, None) => Self::from_path(parts, admin).await,
        }
    }
}

impl AddressedKey {
    async fn from_path<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<Self, Failure> {
        if let Ok(Path((source, material))) =
            Path::<(String, String)>::from_request_parts(parts, state).await
        {
            return Ok(Self(Key::new(&source, &material)));
        }
        // Material that is not UTF-8, which axum's `Path` refuses: from the path itself.
        let path = parts.uri.path();
        let mut segments = path.trim_start_matches('/').splitn(3, '/').skip(1);
        let (Some(source), Some(material)) = (segments.next(), segments.next()) else {
            return Err(Failure::bad("key", path, "a key is /{source}/{material}"));
        };
        let source_bytes: Vec<u8> = percent_decode_str(source).collect();
        let Ok(source) = std::str::from_utf8(&source_bytes) else {
            return Err(Failure::bad("source", source, "a key's source is UTF-8"));
        };
        let material: Vec<u8> = percent_decode_str(material).collect();
        Ok(Self(Key::new(source, material)))
    }
}

/// The query parameter `name`, percent-decoded with `+` kept as itself (a key's source is
/// often `ip+ua`, and no key holds a space), `key` as [`shown_key_text`] reads it; given
/// twice, a 400.
fn raw_param(query: &str, name: &str) -> Result<Option<String>, Failure> {
    let mut found = None;
    for pair in query.split('&') {
        let (param, value) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode_str(param).decode_utf8_lossy() != name {
            continue;
        }
        let value = if name == "key" {
            shown_key_text(value)?
        } else {
            percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| Failure::bad(name, value, "UTF-8 text"))?
                .into_owned()
        };
        if found.is_some() {
            return Err(Failure::bad(name, &value, "given more than once"));
        }
        found = Some(value);
    }
    Ok(found)
}

/// The text of a `?key=` value, read once whichever way it was sent. A key's text carries
/// `%XX` escapes of its own, so decoding the URL's escapes and then the key's would read a
/// shown `50%2520off` as `50 off`, another key. Pasted as shown, the value holds its `:`:
/// it is the key's text as it stands, `%23` included (a material that begins with `#`, as
/// the key shows it: never read as a digest, which a client could otherwise pick to name
/// another key). Encoded by a client library, its `:` is `%3A`: it is decoded once, and a
/// digested key's `#` arrives as `%23`.
fn shown_key_text(raw: &str) -> Result<String, Failure> {
    if raw.contains(':') {
        if raw.ends_with(':') {
            // A `#` left unencoded ends the URL there: `user:#…` arrives as `user:`.
            return Err(Failure::bad(
                "key",
                raw,
                "a key with no material: was a # left unencoded? A URL cannot carry it: \
                 encode the whole key (`:` as %3A, `#` as %23); a key whose material is \
                 empty is `source%3A`",
            ));
        }
        return Ok(raw.to_owned());
    }
    Ok(percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| Failure::bad("key", raw, "UTF-8 text"))?
        .into_owned())
}

/// A request's query parameters; a parameter given twice is a 400 naming it, not a silent
/// choice of one of its values.
struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Failure> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| Failure::bad("query", parts.uri.query().unwrap_or(""), &e.body_text()))?;
        let mut params = HashMap::with_capacity(pairs.len());
        for (name, value) in pairs {
            if params.contains_key(&name) {
                return Err(Failure::bad(&name, &value, "given more than once"));
            }
            params.insert(name, value);
        }
        Ok(Self(params))
    }
}

/// Refuses a parameter the endpoint does not read (a misspelt `ttl_ms` would otherwise make
/// an override permanent without a word).
fn only(params: &HashMap<String, String>, known: &[&str]) -> Result<(), Failure> {
    match params
        .iter()
        .find(|(name, _)| !known.contains(&name.as_str()))
    {
        Some((name, value)) => Err(Failure::bad(
            name,
            value,
            &format!(
                "not a parameter of this endpoint (it reads {})",
                known.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

async fn key_state<S: Store>(
    State(admin): Shared<S>,
    AddressedKey(key): AddressedKey,
    Params(params): Params,
) -> Result<Json<KeyState>, Failure> {
    only(&params, &["method", "route", "key", "digest"])?;
    let method = params.get("method").map_or("GET", String::as_str);
    let path = params.get("route").map_or("/", String::as_str);
    let method: axum::http::Method = method
        .parse()
        .map_err(|_| Failure::bad("method", method, "not an HTTP method"))?;
    if !path.starts_with('/') {
        return Err(Failure::bad("route", path, "a request path starts with /"));
    }
    let request = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .map_err(|e| Failure::bad("route", path, &e.to_string()))?;
    let state = admin
        .limiter
        .inspect(&RequestView::new(&request), &key)
        .await?;
    Ok(Json(state))
}

#[derive(Serialize)]
struct Reset {
    reset: bool,
    key: String,
    digest: String,
}

async fn reset<S: Store>(
    State(admin): Shared<S>,
    AddressedKey(key): AddressedKey,
    Params(params): Params,
) -> Result<Json<Reset>, Failure> {
    only(&params, &["key", "digest"])?;
    admin.limiter.reset(&key).await?;
    let state = Reset {
        reset: true,
        key: crate::limiter::shown_key(&key),
        digest: crate::key::digest(&key),
    };
    tracing::event!(
        target: "tollgate::admin",
        tracing::Level::INFO,
        ratelimit.key = state.digest.as_str(),
        "rate-limit state of a key reset through the admin API"
    );
    Ok(Json(state))
}

#[derive(Serialize)]
struct OverrideView {
    policy: String,
    limit: u64,
    capacity: u64,
    expires_in_ms: Option<u64>,
}

#[derive(Serialize)]
struct Overrides {
    key: String,
    digest: String,
    overrides: Vec<OverrideView>,
}

async fn list_overrides<S: Store>(
    State(admin): Shared<S>,
    AddressedKey(key): AddressedKey,
    Params(params): Params,
) -> Result<Json<Overrides>, Failure> {
    only(&params, &["key", "digest"])?;
    overrides_of(&admin, &key).await
}

async fn overrides_of<S: Store>(admin: &Admin<S>, key: &Key) -> Result<Json<Overrides>, Failure> {
    let overrides = admin.limiter.overrides(key).await?;
    Ok(Json(Overrides {
        key: crate::limiter::shown_key(key),
        digest: crate::key::digest(key),
        overrides: overrides
            .into_iter()
            .map(|o| OverrideView {
                policy: o.policy().to_owned(),
                limit: o.limit(),
                capacity: o.capacity(),
                expires_in_ms: o.expires_in().map(|d| d.as_millis() as u64),
            })
            .collect(),
    }))
}

fn number(params: &HashMap<String, String>, name: &str) -> Result<Option<u64>, Failure> {
    params
        .get(name)
        .map(|text| {
            text.parse::<u64>()
                .map_err(|_| Failure::bad(name, text, "a whole number"))
        })
        .transpose()
}

async fn set_override<S: Store>(
    State(admin): Shared<S>,
    AddressedKey(key): AddressedKey,
    Params(params): Params,
) -> Result<Json<Overrides>, Failure> {
    only(
        &params,
        &["policy", "limit", "burst", "ttl_ms", "key", "digest"],
    )?;
    let policy = params
        .get("policy")
        .ok_or_else(|| Failure::bad("policy", "", "the policy to override is missing"))?;
    let limit = number(&params, "limit")?
        .ok_or_else(|| Failure::bad("limit", "", "the new limit is missing"))?;
    let mut over = crate::Override::new(policy, limit);
    if let Some(burst) = number(&params, "burst")? {
        over = over.burst(burst);
    }
    if let Some(ms) = number(&params, "ttl_ms")? {
        over = over.expires_in(std::time::Duration::from_millis(ms));
    }
    admin.limiter.set_override(&key, over).await?;
    overrides_of(&admin, &key).await
}

async fn remove_override<S: Store>(
    State(admin): Shared<S>,
    AddressedKey(key): AddressedKey,
    Params(params): Params,
) -> Result<Json<Overrides>, Failure> {
    only(&params, &["policy", "key", "digest"])?;
    let policy = params
        .get("policy")
        .ok_or_else(|| Failure::bad("policy", "", "the policy whose override goes is missing"))?;
    admin.limiter.remove_override(&key, policy).await?;
    overrides_of(&admin, &key).await
}

#[derive(Serialize)]
struct Top {
    keys: Vec<RefusedKey>,
}

async fn top<S: Store>(
    State(admin): Shared<S>,
    Params(params): Params,
) -> Result<Json<Top>, Failure> {
    top_answer(&params, |n| admin.limiter.top_refused(n))
}

/// The `?n=` keys (20 unless asked, at most 1000) that `refused` lists.
fn top_answer(
    params: &HashMap<String, String>,
    refused: impl FnOnce(usize) -> Vec<RefusedKey>,
) -> Result<Json<Top>, Failure> {
    only(params, &["n"])?;
    let n = match params.get("n") {
        None => DEFAULT_TOP,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_TOP).contains(&n) => n,
            _ => return Err(Failure::bad("n", text, "a number from 1 to 1000")),
        },
    };
    Ok(Json(Top { keys: refused(n) }))
}

#[derive(Serialize)]
struct PlanAnswer {
    limiter: EffectivePlan,
    plan: Option<serde_json::Value>,
}

/// `plan` as `GET /plan` shows it: the store's URLs may carry passwords, shown without.
#[cfg(feature = "config")]
fn shown(plan: &crate::config::Plan) -> Option<serde_json::Value> {
    fn redact(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::String(s) => *s = crate::error::without_credentials(s),
            serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
            serde_json::Value::Object(map) => map.values_mut().for_each(redact),
            _ => {}
        }
    }
    serde_json::to_value(plan).ok().map(|mut v| {
        redact(&mut v);
        v
    })
}

async fn plan<S: Store>(State(admin): Shared<S>) -> Response {
    // The plan in force (a reload replaces it), when the limiter was built from one.
    #[cfg(feature = "config")]
    let in_force = admin.plan.as_ref().and_then(|_| {
        let source = admin.limiter.source()?;
        shown(source.downcast_ref::<crate::config::Plan>()?)
    });
    #[cfg(not(feature = "config"))]
    let in_force = None;
    Json(PlanAnswer {
        limiter: admin.limiter.effective_plan(),
        plan: in_force.or_else(|| admin.plan.clone()),
    })
    .into_response()
}
