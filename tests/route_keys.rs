//! A key per route, over a real axum server and a real HTTP client: one limiter keys `/` by
//! client address, `/api/*` by API key and `POST /login` by (address, username), on the
//! memory store and on a Redis server the test starts; the same through the direct API and
//! through a plan; build errors naming the field; the admin API's route view, the audit and
//! the nginx export reading each route's key; the metrics label of an axum-attached route.

mod support;

use std::net::{IpAddr, SocketAddr};

use axum::routing::{get, post};
use axum::Router;
use tollgate::config::edge::{EdgeTarget, ExportOptions};
use tollgate::config::Plan;
use tollgate::key::{from_fn, ApiKey, Composite, Key, KeyExtractor, PeerIp, RequestView};
use tollgate::route::Route;
use tollgate::store::{RedisStore, Store};
use tollgate::{Algorithm, Limiter, Policy, Rate, RateLimitLayer, RefusalKind};

use support::RedisServer;

/// `n` requests an hour, at most `n` at once: nothing refills within a test, so the counts
/// do not depend on how long it runs.
fn hourly(name: &str, n: u64) -> Policy {
    Policy::builder(name, Rate::per_hour(n))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap()
}

/// The username a login form would carry, from the `x-username` header.
fn username() -> impl KeyExtractor {
    from_fn(|req: &RequestView<'_>| {
        Some(Key::new(
            "user",
            req.headers().get("x-username")?.as_bytes(),
        ))
    })
}

/// `/` per client address (the limiter's key), `/api/*` per API key, `POST /login` per
/// (address, username).
fn limiter<S: Store>(store: S) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .policy(hourly("pages", 3))
        .route(
            "/api/{*rest}",
            Route::new().policy(hourly("api", 2)).key(ApiKey::new()),
        )
        .route(
            "POST /login",
            Route::new()
                .policy(hourly("login", 1))
                .key(Composite::new(PeerIp::new()).and(username())),
        )
        .build()
        .unwrap()
}

fn app(layer: RateLimitLayer<impl Store>) -> Router {
    Router::new()
        .route("/", get(|| async { "home" }))
        .route("/api/{*rest}", get(|| async { "items" }))
        .route("/login", post(|| async { "welcome" }))
        .layer(layer)
}

/// A client whose connections come from `ip` (any address of 127.0.0.0/8 is loopback).
fn client_from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::from(ip))
        .build()
        .unwrap()
}

async fn get_status(client: &reqwest::Client, url: &str, api_key: Option<&str>) -> u16 {
    let mut req = client.get(url);
    if let Some(k) = api_key {
        req = req.header("x-api-key", k);
    }
    req.send().await.unwrap().status().as_u16()
}

async fn login(client: &reqwest::Client, base: &str, user: &str) -> u16 {
    client
        .post(format!("{base}/login"))
        .header("x-username", user)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Two clients with different API keys from one address: each has its own `/api` budget,
/// and they share the address's budget on `/`. Logins count per (address, username).
async fn each_route_counts_by_its_own_key(addr: SocketAddr) {
    let base = format!("http://{addr}");
    let api = format!("{base}/api/items");
    let (a, b) = (client_from([127, 0, 0, 1]), client_from([127, 0, 0, 1]));
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(get_status(&a, &api, Some("key-a")).await);
    }
    for _ in 0..3 {
        statuses.push(get_status(&b, &api, Some("key-b")).await);
    }
    assert_eq!(statuses, [200, 200, 429, 200, 200, 429], "/api per API key");
    // The API key is the route's key: without one the request has none (400), and the
    // address is not used instead.
    assert_eq!(get_status(&a, &api, None).await, 400);

    let home = format!("{base}/");
    let mut statuses = vec![];
    for client in [&a, &b, &a, &b] {
        statuses.push(get_status(client, &home, Some("key-a")).await);
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429],
        "/ per address, shared by both"
    );
    let elsewhere = client_from([127, 0, 0, 2]);
    assert_eq!(get_status(&elsewhere, &home, None).await, 200);

    assert_eq!(login(&a, &base, "alice").await, 200);
    assert_eq!(login(&a, &base, "alice").await, 429);
    assert_eq!(login(&b, &base, "bob").await, 200, "another username");
    assert_eq!(
        login(&elsewhere, &base, "alice").await,
        200,
        "another address"
    );
}

#[tokio::test]
async fn memory_store_keys_each_route_its_own_way() {
    let addr = support::serve(app(RateLimitLayer::new(limiter(
        tollgate::store::MemoryStore::new(),
    ))))
    .await;
    each_route_counts_by_its_own_key(addr).await;
}

#[tokio::test]
async fn redis_store_keys_each_route_its_own_way() {
    let server = RedisServer::start();
    let prefix = support::scenarios::unique_prefix("route-keys");
    let store = RedisStore::builder()
        .prefix(prefix.clone())
        .build_with_url(&server.url())
        .unwrap();
    let addr = support::serve(app(RateLimitLayer::new(limiter(store)))).await;
    each_route_counts_by_its_own_key(addr).await;
    // The API keys are keys of their own in Redis, stored hashed, never raw.
    let keys = server.scan(&format!("{prefix}*"));
    let api: Vec<&String> = keys.iter().filter(|k| k.contains(":api:")).collect();
    assert!(
        api.len() >= 2 && api.iter().all(|k| k.contains("apikey")),
        "{keys:?}"
    );
    assert!(
        !keys
            .iter()
            .any(|k| k.contains("key-a") || k.contains("key-b")),
        "{keys:?}"
    );
}

fn request(path: &str, peer: &str, api_key: Option<&str>) -> http::Request<()> {
    let mut req = http::Request::get(path);
    if let Some(k) = api_key {
        req = req.header("x-api-key", k);
    }
    let mut req = req.body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

#[tokio::test]
async fn the_direct_api_decides_by_the_route_key() {
    let limiter = limiter(tollgate::store::MemoryStore::new());
    let a = request("/api/items", "192.0.2.1:1000", Some("key-a"));
    let b = request("/api/items", "192.0.2.1:1001", Some("key-b"));
    let (a, b) = (RequestView::new(&a), RequestView::new(&b));
    assert_eq!(limiter.key_for(&a).unwrap().source(), "apikey");
    assert_ne!(limiter.key_for(&a), limiter.key_for(&b));
    for _ in 0..2 {
        assert!(limiter.decide(&a).await.is_ok());
    }
    let refusal = limiter.decide(&a).await.unwrap_err();
    assert_eq!(refusal.kind(), RefusalKind::RateLimited);
    assert_eq!(refusal.policy().unwrap().name(), "api");
    assert!(limiter.decide(&b).await.is_ok(), "key-b has its own budget");

    let home = request("/", "192.0.2.1:1000", Some("key-a"));
    let home = RequestView::new(&home);
    assert_eq!(limiter.key_for(&home).unwrap().as_str(), "ip:192.0.2.1");
    // The direct API and the layer count the same key: `check` on the default route spends
    // the address's budget that `decide` on `/` then finds spent.
    let ip = limiter.key_for(&home).unwrap();
    for _ in 0..3 {
        assert!(limiter.check(&ip, 1).await.unwrap().is_allowed());
    }
    assert!(limiter.decide(&home).await.is_err());
}

#[tokio::test]
async fn a_tier_can_have_its_own_key() {
    let limiter = Limiter::builder()
        .route(
            "/api/{*rest}",
            Route::new()
                .policy(hourly("anonymous", 1))
                .tier("partner", [hourly("partner", 5)])
                .tier_key("partner", ApiKey::new()),
        )
        .default_route(Route::exempt())
        .tier_fn(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
        .build()
        .unwrap();
    let mut partner = request("/api/x", "192.0.2.1:1", Some("k"));
    partner
        .headers_mut()
        .insert("x-plan", "partner".parse().unwrap());
    let anonymous = request("/api/x", "192.0.2.1:1", Some("k"));
    assert_eq!(
        limiter
            .key_for(&RequestView::new(&partner))
            .unwrap()
            .source(),
        "apikey"
    );
    assert_eq!(
        limiter
            .key_for(&RequestView::new(&anonymous))
            .unwrap()
            .source(),
        "ip"
    );
    let plan = limiter.effective_plan();
    let tiers: Vec<(Option<&str>, bool)> = plan
        .routes
        .iter()
        .map(|r| (r.tier.as_deref(), r.own_key))
        .collect();
    assert_eq!(tiers, [(None, false), (Some("partner"), true)]);
}

const PLAN: &str = r#"
[key]
kind = "peer_ip"

[[policies]]
name = "pages"
limit = 3
window = "1h"
algorithm = "token_bucket"

[[policies]]
name = "api"
limit = 2
window = "1h"
algorithm = "token_bucket"

[[routes]]
pattern = "/api/{*rest}"
policies = ["api"]
key = { kind = "api_key", header = "x-api-key" }

[default]
policies = ["pages"]
"#;

#[tokio::test]
async fn a_plan_names_a_key_per_route() {
    let plan = Plan::from_toml(PLAN).unwrap();
    let built = plan.build().unwrap();
    let view = built.limiter().effective_plan();
    assert_eq!(view.routes[0].route, "/api/{*rest}");
    assert!(view.routes[0].own_key && view.routes[0].key.starts_with("ApiKey"));
    assert!(!view.routes[1].own_key && view.routes[1].key.starts_with("PeerIp"));

    let addr = support::serve(app(built.layer())).await;
    let base = format!("http://{addr}");
    let api = format!("{base}/api/items");
    let client = reqwest::Client::new();
    let mut statuses = vec![];
    for key in ["key-a", "key-a", "key-a", "key-b", "key-b", "key-b"] {
        statuses.push(get_status(&client, &api, Some(key)).await);
    }
    assert_eq!(statuses, [200, 200, 429, 200, 200, 429]);
    let home = format!("{base}/");
    let mut statuses = vec![];
    for key in ["key-a", "key-b", "key-a", "key-b"] {
        statuses.push(get_status(&client, &home, Some(key)).await);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
}

#[test]
fn a_plan_names_a_key_per_tier() {
    let text = PLAN.replace(
        "key = { kind = \"api_key\", header = \"x-api-key\" }",
        "key = { kind = \"api_key\", header = \"x-api-key\" }\n\
         tiers.partner = [\"partner-api\"]\n\
         tier_keys.partner = { kind = \"header\", header = \"x-partner-id\" }\n\
         [tier]\nheader = \"x-plan\"\n\
         [[policies]]\nname = \"partner-api\"\nlimit = 100\nwindow = \"1h\"\n",
    );
    let built = Plan::from_toml(&text).unwrap().build().unwrap();
    let mut req = request("/api/x", "192.0.2.1:1", Some("k"));
    req.headers_mut()
        .insert("x-plan", "partner".parse().unwrap());
    req.headers_mut()
        .insert("x-partner-id", "acme".parse().unwrap());
    let key = built.limiter().key_for(&RequestView::new(&req)).unwrap();
    assert_eq!(key.as_str(), "header.x-partner-id:acme");
    // A tier key for a tier the route does not have keys nothing.
    let text = text.replace("tier_keys.partner", "tier_keys.gold");
    let err = Plan::from_toml(&text).unwrap().build().unwrap_err();
    assert_eq!(err.field(), "routes[0].tier_keys.gold");
}

/// Header keys carry the header's name: an organisation and a user that happen to share an
/// id are two principals with a budget each, never one.
#[tokio::test]
async fn two_headers_with_one_value_are_two_keys() {
    let plan = Plan::from_toml(
        "[[policies]]\nname = \"api\"\nlimit = 1\nwindow = \"1m\"\n\
         [default]\npolicies = [\"api\"]\n\
         [key]\nkind = \"header\"\nheader = \"x-org-id\"\n\
         [key.fallback]\nkind = \"header\"\nheader = \"X-User-Id\"\n",
    )
    .unwrap();
    let built = plan.build().unwrap();
    let limiter = built.limiter();
    let org = http::Request::get("/")
        .header("x-org-id", "42")
        .body(())
        .unwrap();
    let user = http::Request::get("/")
        .header("x-user-id", "42")
        .body(())
        .unwrap();
    let (org_key, user_key) = (
        limiter.key_for(&RequestView::new(&org)).unwrap(),
        limiter.key_for(&RequestView::new(&user)).unwrap(),
    );
    assert_eq!(org_key.as_str(), "header.x-org-id:42");
    assert_eq!(user_key.as_str(), "header.x-user-id:42");
    for req in [&org, &user] {
        let decision = limiter.decide(&RequestView::new(req)).await.unwrap();
        assert!(decision.is_allowed(), "{req:?} was charged for the other");
    }
    assert!(limiter.decide(&RequestView::new(&org)).await.is_err());
}

/// A leased store hands out blocks per key and policy: a route's own key is just another
/// key, so each API key gets its limit, exactly, through leases too.
#[tokio::test]
async fn leased_plans_count_a_route_key_like_any_key() {
    let server = RedisServer::start();
    let text = PLAN.replace("limit = 2", "limit = 20").replace(
        "[key]",
        &format!(
            "failure_mode = \"fail_closed\"\n[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"{}\"\nlease_time = \"60s\"\nlease_max_block_percent = 50\n\n[key]",
            server.url(),
            support::scenarios::unique_prefix("route-keys-leased")
        ),
    );
    let built = Plan::from_toml(&text).unwrap().build().unwrap();
    let addr = support::serve(app(built.layer())).await;
    let api = format!("http://{addr}/api/items");
    let client = reqwest::Client::new();
    for key in ["key-a", "key-b"] {
        let mut allowed = 0;
        for _ in 0..25 {
            if get_status(&client, &api, Some(key)).await == 200 {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 20, "{key}");
    }
}

#[test]
fn plan_key_mistakes_name_the_field() {
    let route = |key: &str| {
        format!(
            "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n\
             [[routes]]\npattern = \"/api/{{*rest}}\"\npolicies = [\"api\"]\nkey = {key}\n\
             [default]\npolicies = [\"api\"]\n"
        )
    };
    let err = Plan::from_toml(&route("{ kind = \"telepathy\" }")).unwrap_err();
    assert_eq!(err.field(), "routes[0].key.kind");
    assert!(err.to_string().contains("telepathy"), "{err}");

    let plan = Plan::from_toml(&route("{ kind = \"header\" }")).unwrap();
    assert_eq!(plan.build().unwrap_err().field(), "routes[0].key.header");
    let plan = Plan::from_toml(&route("{ kind = \"peer_ip\", header = \"x-api-key\" }")).unwrap();
    let err = plan.build().unwrap_err();
    assert_eq!(
        (err.field(), err.value()),
        ("routes[0].key.header", "\"x-api-key\"")
    );
    let plan = Plan::from_toml(&route("{ kind = \"user\" }")).unwrap();
    assert_eq!(plan.build().unwrap_err().field(), "routes[0].key.kind");

    let exempt = "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n\
                  [[routes]]\npattern = \"/health\"\nexempt = true\nkey = { kind = \"global\" }\n\
                  [default]\npolicies = [\"api\"]\n";
    let err = Plan::from_toml(exempt).unwrap().build().unwrap_err();
    assert_eq!(err.field(), "routes[0].key");
}

#[test]
fn builder_key_mistakes_name_the_field() {
    let err = Limiter::builder()
        .policy(hourly("pages", 3))
        .route("/health", Route::exempt().key(ApiKey::new()))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[0].key");
    let err = Limiter::builder()
        .policy(hourly("pages", 3))
        .route(
            "/api/{*rest}",
            Route::new()
                .policy(hourly("api", 2))
                .tier("silver", [hourly("silver", 5)])
                .tier_key("gold", ApiKey::new()),
        )
        .tier_fn(|_| None)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "routes[0].tier_keys.gold");
    assert!(err.to_string().contains("ApiKey"), "{err}");
    let limits = Limiter::builder()
        .policy(hourly("pages", 3))
        .build()
        .unwrap();
    let err = limits
        .for_route(Route::exempt().key(ApiKey::new()))
        .unwrap_err();
    assert_eq!(err.field(), "route.key");
}

#[tokio::test]
async fn the_admin_plan_shows_each_routes_key() {
    let admin = tollgate::admin::Admin::new(limiter(tollgate::store::MemoryStore::new()));
    let addr = support::serve(admin.router()).await;
    let plan: serde_json::Value = reqwest::get(format!("http://{addr}/plan"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let routes = plan["limiter"]["routes"].as_array().unwrap();
    let keyed: Vec<(&str, bool, bool)> = routes
        .iter()
        .map(|r| {
            (
                r["route"].as_str().unwrap(),
                r["own_key"].as_bool().unwrap(),
                r["key"].as_str().unwrap().starts_with("PeerIp"),
            )
        })
        .collect();
    assert_eq!(
        keyed,
        [
            ("/api/{*rest}", true, false),
            ("POST /login", true, false),
            ("default", false, true)
        ]
    );
    assert!(routes[1]["key"].as_str().unwrap().starts_with("Composite"));
}

#[test]
fn the_audit_reads_each_routes_key() {
    let plan = |route_key: &str| {
        Plan::from_toml(&format!(
            "[key]\nkind = \"api_key\"\n\
             [[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n\
             [[routes]]\npattern = \"/account\"\npolicies = [\"api\"]\nauthenticated = true\n{route_key}\n\
             [default]\npolicies = [\"api\"]\n"
        ))
        .unwrap()
    };
    let tg008 = |plan: &Plan| {
        tollgate::audit(plan)
            .findings
            .into_iter()
            .filter(|f| f.rule == "TG008")
            .map(|f| f.message)
            .collect::<Vec<_>>()
    };
    assert!(tg008(&plan("")).is_empty());
    let by_ip = tg008(&plan("key = { kind = \"peer_ip\" }"));
    assert_eq!(by_ip.len(), 1);
    assert!(by_ip[0].contains("routes[0].key.kind"), "{by_ip:?}");
    // A route's own trusted proxies are reviewed like [key]'s.
    let wide = plan("key = { kind = \"client_ip\", trusted_proxies = [\"0.0.0.0/0\"] }");
    let tg011: Vec<_> = tollgate::audit(&wide)
        .findings
        .into_iter()
        .filter(|f| f.rule == "TG011")
        .collect();
    assert_eq!(
        tg011[0].field.as_deref(),
        Some("routes[0].key.trusted_proxies[0]")
    );
}

#[test]
fn nginx_refuses_a_route_key_it_cannot_carry() {
    let plan = |route_key: &str| {
        Plan::from_toml(&format!(
            "[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n\
             [[policies]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\n\
             [[routes]]\npattern = \"/api/{{*rest}}\"\npolicies = [\"api\"]\n{route_key}\n\
             [default]\npolicies = [\"api\"]\n\
             [[edge.rules]]\nname = \"api-ip\"\nroutes = [\"/api/{{*rest}}\"]\nlimit = 600\nwindow = \"1m\"\n"
        ))
        .unwrap()
    };
    let nginx = |plan: &Plan| plan.export_edge(EdgeTarget::Nginx, &ExportOptions::new());
    // nginx reads one client address for the server, from [key]: a route reading it past
    // other proxies cannot be carried.
    let other = plan("key = { kind = \"client_ip\", trusted_proxies = [\"192.168.0.0/16\"] }");
    let err = nginx(&other).unwrap_err();
    assert_eq!(err.field(), "routes[0].key.trusted_proxies");
    assert_eq!(err.value(), "[\"192.168.0.0/16\"]");
    assert!(err.reason().contains("edge.rules[0].routes"), "{err}");
    // The same reading, or a key that reads no address (the edge counts addresses, the
    // origin API keys), exports.
    assert!(nginx(&plan(
        "key = { kind = \"client_ip\", trusted_proxies = [\"10.0.0.0/8\"] }"
    ))
    .is_ok());
    assert!(nginx(&plan("key = { kind = \"api_key\" }")).is_ok());
    // Cloudflare counts by its own view of the client; nothing of the origin's is written.
    assert!(other
        .export_edge(EdgeTarget::Cloudflare, &ExportOptions::new())
        .is_ok());
}

/// The one test of this binary that installs a metrics recorder (it is global).
#[tokio::test]
async fn an_attached_route_is_labelled_with_its_pattern() {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let limits = RateLimitLayer::new(
        Limiter::builder()
            .default_route(Route::exempt())
            .build()
            .unwrap(),
    );
    let reports = limits
        .for_route(
            Route::new()
                .policy(hourly("rk_reports", 100))
                .key(ApiKey::new()),
        )
        .unwrap();
    let app = Router::new()
        .route(
            "/reports/{id}",
            get(|| async { "report" }).route_layer(reports.clone()),
        )
        .nest(
            "/teams/{team}",
            Router::new()
                .route("/reports", get(|| async { "reports" }))
                .route_layer(reports),
        );
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    for path in ["/reports/1", "/reports/2", "/teams/a/reports"] {
        let status = get_status(&client, &format!("http://{addr}{path}"), Some("k")).await;
        assert_eq!(status, 200, "{path}");
    }
    let text = handle.render();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total") && l.contains("rk_reports"))
        .collect();
    let count = |route: &str| -> f64 {
        series
            .iter()
            .filter(|l| l.contains(&format!("route=\"{route}\"")))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(count("/reports/{id}"), 2.0, "{series:?}");
    assert_eq!(count("/teams/{team}/reports"), 1.0, "{series:?}");
    assert_eq!(count("for_route"), 0.0, "{series:?}");
    assert!(
        !text.contains("/reports/1"),
        "a raw path leaked into a label"
    );
}
