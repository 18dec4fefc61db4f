//! The operator tools end to end: two axum servers built from one plan share a Redis the
//! test starts; a key pushed over its limit shows
//! as refused in `tollgate inspect` and in `top` (the admin API and `tollgate top`), and
//! `tollgate reset` lets its next request through on both servers.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use axum::{routing::get, Router};
use reqwest::StatusCode;
use tollgate::admin::Admin;
use tollgate::config::Plan;
use tollgate::key::Key;
use tollgate::KeyState;

fn plan_text(prefix: &str, redis: &str) -> String {
    format!(
        r#"
replicas = 2
failure_mode = "fail_closed"

[store]
kind = "redis"
url = "{redis}"
prefix = "{prefix}"

[key]
kind = "header"
header = "x-tenant"

[[policies]]
name = "search"
limit = 2
window = "1h"

[[policies]]
name = "api"
limit = 100
window = "1h"

[[routes]]
pattern = "GET /search"
policies = ["search"]

[default]
policies = ["api"]
"#
    )
}

/// One instance: the plan's layer on two routes, the admin API under `/admin`.
async fn instance(plan: &Plan) -> SocketAddr {
    let built = plan.build().unwrap();
    let app = Router::new()
        .route("/", get(|| async { "home" }))
        .route("/search", get(|| async { "results" }))
        .layer(built.layer())
        .nest(
            "/admin",
            Admin::new(built.limiter().clone()).plan(plan).router(),
        );
    support::serve(app).await
}

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn search(client: &reqwest::Client, addr: SocketAddr, tenant: &str) -> StatusCode {
    client
        .get(format!("http://{addr}/search"))
        .header("x-tenant", tenant)
        .send()
        .await
        .unwrap()
        .status()
}

/// The admin API's JSON answer. A peek goes through the plan's `ResilientStore`, whose 50 ms
/// timeout a loaded machine can exceed: the API then answers 503 and an operator asks again.
async fn get_json(client: &reqwest::Client, url: String) -> serde_json::Value {
    for _ in 0..5 {
        let res = client.get(&url).send().await.unwrap();
        let status = res.status();
        let body: serde_json::Value = res.json().await.unwrap();
        if status != StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(status, StatusCode::OK, "{url}: {body}");
            return body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url}: 503 five times");
}

fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("admin-e2e-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_shows_in_inspect_and_top_and_reset_frees_it_everywhere() {
    let server = support::RedisServer::start();
    let redis = server.url();
    let prefix = unique_prefix();
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).unwrap();
    let plan_path: PathBuf = dir.join("plan.toml");
    std::fs::write(&plan_path, plan_text(&prefix, &redis)).unwrap();
    let plan_arg = plan_path.to_str().unwrap();
    let plan = Plan::from_file(&plan_path).unwrap();
    let (a, b) = (instance(&plan).await, instance(&plan).await);
    let client = reqwest::Client::new();
    let key = Key::new("header.x-tenant", "acme");
    let digest = tollgate::key::digest(&key);

    // Nothing charged yet: inspect shows the full quota and charges nothing itself.
    for _ in 0..2 {
        let out = tollgate(&[
            "inspect",
            plan_arg,
            "header.x-tenant:acme",
            "--route",
            "/search",
            "--json",
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let state: KeyState = serde_json::from_slice(&out.stdout).unwrap();
        assert!(state.allowed);
        assert_eq!(state.route.as_deref(), Some("GET /search"));
        assert_eq!(
            (
                state.policies[0].policy.as_str(),
                state.policies[0].remaining
            ),
            ("search", 2)
        );
    }

    // Two searches through A, then the shared limit refuses on B and on A.
    assert_eq!(search(&client, a, "acme").await, StatusCode::OK);
    assert_eq!(search(&client, a, "acme").await, StatusCode::OK);
    assert_eq!(
        search(&client, b, "acme").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        search(&client, a, "acme").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        search(&client, a, "acme").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another tenant is refused too, but less often.
    for _ in 0..3 {
        search(&client, a, "globex").await;
    }

    // inspect: refused under the search policy, in JSON and in text.
    let out = tollgate(&[
        "inspect",
        plan_arg,
        "header.x-tenant:acme",
        "--route",
        "/search",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let state: KeyState = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!state.allowed);
    assert_eq!(state.digest, digest);
    assert_eq!(state.policies[0].remaining, 0);
    assert!(state.policies[0].retry_after_ms > 0);
    let out = tollgate(&[
        "inspect",
        plan_arg,
        "header.x-tenant:acme",
        "--route",
        "/search",
        "--redis",
        &redis,
    ]);
    let shown = text(&out);
    assert!(
        out.status.success() && shown.contains("REFUSED") && shown.contains("search"),
        "{shown}"
    );
    // The default route's policy is untouched.
    let out = tollgate(&["inspect", plan_arg, "header.x-tenant:acme", "--json"]);
    let state: KeyState = serde_json::from_slice(&out.stdout).unwrap();
    assert!(state.allowed);
    assert_eq!(
        (
            state.policies[0].policy.as_str(),
            state.policies[0].remaining
        ),
        ("api", 100)
    );

    // The admin API agrees with the CLI.
    let state = get_json(
        &client,
        format!("http://{a}/admin/keys/header.x-tenant/acme?route=/search"),
    )
    .await;
    assert_eq!(state["allowed"], false);

    // top: each instance counts its own refusals; acme leads on A.
    let top = get_json(&client, format!("http://{a}/admin/top")).await;
    assert_eq!(top["keys"][0]["digest"], digest.as_str(), "{top}");
    assert_eq!(top["keys"][0]["key"], "header.x-tenant:acme");
    assert_eq!(top["keys"][0]["count"], 2);
    let top_b = get_json(&client, format!("http://{b}/admin/top")).await;
    assert_eq!(top_b["keys"][0]["digest"], digest.as_str());
    let out = tollgate(&["top", &format!("http://{a}/admin"), "-n", "5"]);
    let shown = text(&out);
    assert!(
        out.status.success() && shown.contains("header.x-tenant:acme") && shown.contains(&digest),
        "{shown}"
    );
    let out = tollgate(&["top", &format!("http://{a}/admin/"), "--json"]);
    let top: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(top["keys"][0]["digest"], digest.as_str());

    // The effective plan.
    let plan_json = get_json(&client, format!("http://{b}/admin/plan")).await;
    assert_eq!(plan_json["limiter"]["routes"][0]["route"], "GET /search");
    assert_eq!(plan_json["plan"]["store"]["prefix"], prefix.as_str());

    // reset from the command line, against the Redis both instances share.
    let out = tollgate(&["reset", plan_arg, "header.x-tenant:acme"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&digest));
    // A plan-built Redis store keeps a deny cache: each instance may go on refusing a key it
    // saw refused for at most deny_cache_max_age (1 s) after a reset made elsewhere.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(search(&client, a, "acme").await, StatusCode::OK);
    assert_eq!(search(&client, b, "acme").await, StatusCode::OK);
    assert_eq!(
        search(&client, b, "acme").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // reset through the admin API: this instance's deny cache goes at once.
    let res = client
        .delete(format!("http://{b}/admin/keys/header.x-tenant/acme"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(search(&client, b, "acme").await, StatusCode::OK);

    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_admin_api_names_bad_parameters() {
    let limiter = tollgate::Limiter::builder()
        .policy(tollgate::Policy::new("api", tollgate::Rate::per_minute(1)).unwrap())
        .build()
        .unwrap();
    let addr = support::serve(Admin::new(limiter).router()).await;
    let client = reqwest::Client::new();
    for (url, parameter) in [
        (format!("http://{addr}/top?n=0"), "n = \"0\""),
        // A parameter the endpoint does not read (a misspelt one) is refused, not ignored.
        (format!("http://{addr}/top?count=5"), "count = \"5\""),
        (
            format!("http://{addr}/keys/ip/1.2.3.4?path=/search"),
            "path = \"/search\"",
        ),
        (format!("http://{addr}/top?n=lots"), "n = \"lots\""),
        (
            format!("http://{addr}/keys/ip/1.2.3.4?method=G%20T"),
            "method = \"G T\"",
        ),
        (
            format!("http://{addr}/keys/ip/1.2.3.4?route=search"),
            "route = \"search\"",
        ),
    ] {
        let res = client.get(&url).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{url}");
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["error"], "bad_request");
        assert!(
            body["message"].as_str().unwrap().contains(parameter),
            "{body}"
        );
    }
    // A misspelt expiry on an override is refused: ignored, the override would never end.
    let res = client
        .put(format!(
            "http://{addr}/overrides/user/1?policy=api&limit=5&ttl=60000"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // Material may hold slashes and anything else: it is escaped into the key.
    let res = client
        .get(format!("http://{addr}/keys/user/a%2Fb/c%20d"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// An app limited to one request a minute per key of `extractor`, with the admin API at
/// `/admin`.
async fn one_a_minute_with_admin(
    extractor: impl tollgate::key::KeyExtractor,
) -> (tollgate::Limiter, SocketAddr) {
    let limiter = tollgate::Limiter::builder()
        .policy(tollgate::Policy::new("api", tollgate::Rate::per_minute(1)).unwrap())
        .extractor(extractor)
        .top_refused(100)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(tollgate::RateLimitLayer::new(limiter.clone()))
        .nest("/admin", Admin::new(limiter.clone()).router());
    (limiter.clone(), support::serve(app).await)
}

/// A key whose material is not UTF-8 (a header value with a byte above 0x7F) is reached at
/// the path its shown form gives: `top` lists it, a reset through that path frees it, an
/// override set through it applies to it. A query parameter given twice is refused.
#[tokio::test]
async fn a_key_that_is_not_utf8_is_reached_by_the_path_top_shows() {
    // As a plan's `key = "header"` builds it: the header value's raw bytes.
    let tenant = |req: &tollgate::key::RequestView<'_>| {
        let value = req.headers().get("x-tenant")?;
        Some(Key::new("header.x-tenant", value.as_bytes()))
    };
    let (limiter, addr) = one_a_minute_with_admin(tollgate::key::from_fn(tenant)).await;
    let client = reqwest::Client::new();
    let value = reqwest::header::HeaderValue::from_bytes(b"acme\xff").unwrap();
    let call = || {
        client
            .get(format!("http://{addr}/"))
            .header("x-tenant", value.clone())
            .send()
    };
    assert_eq!(call().await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let top = get_json(&client, format!("http://{addr}/admin/top")).await;
    let shown = top["keys"][0]["key"].as_str().unwrap().to_owned();
    let key = Key::new("header.x-tenant", b"acme\xff");
    assert_eq!(shown, key.as_str(), "top shows the whole key");
    assert_eq!(shown, "header.x-tenant:acme%FF");
    let (source, material) = shown.split_once(':').unwrap();
    let res = client
        .delete(format!("http://{addr}/admin/keys/{source}/{material}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{:?}", res.text().await);
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::OK,
        "the reset freed it"
    );
    let res = client
        .put(format!(
            "http://{addr}/admin/overrides/{source}/{material}?policy=api&limit=5"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{:?}", res.text().await);
    assert_eq!(limiter.overrides(&key).await.unwrap().len(), 1);
    for _ in 0..4 {
        assert_eq!(
            call().await.unwrap().status(),
            StatusCode::OK,
            "the override applies"
        );
    }
    let res = client
        .put(format!(
            "http://{addr}/admin/overrides/{source}/{material}?policy=api&limit=5&policy=other"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = res.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("more than once"),
        "{body}"
    );
}

#[tokio::test]
async fn tuples_and_digested_keys_are_reached_as_shown_or_by_their_digest() {
    let extractor = tollgate::key::IpUserAgent::new(tollgate::key::ClientIp::default());
    let (limiter, addr) = one_a_minute_with_admin(extractor).await;
    let client = reqwest::Client::new();
    let browser = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0)";
    // Long enough that the key holds a digest of the tuple, not the tuple.
    let long = format!("{browser}{}", " Gecko/20100101".repeat(8));
    let status = |ua: &str| {
        let request = client
            .get(format!("http://{addr}/"))
            .header("user-agent", ua.to_owned());
        async move { request.send().await.unwrap().status() }
    };
    for ua in [browser, long.as_str(), "curl/8.0"] {
        assert_eq!(status(ua).await, StatusCode::OK);
        assert_eq!(status(ua).await, StatusCode::TOO_MANY_REQUESTS);
    }
    let shown = Key::from_materials("ip+ua", &["127.0.0.1", browser]);
    assert_eq!(
        shown.as_str(),
        "ip+ua:127.0.0.1|Mozilla/5.0%20%28X11%3B%20Linux%20x86_64%3B%20rv:128.0%29"
    );
    let long_key = Key::from_materials("ip+ua", &["127.0.0.1", long.as_str()]);
    assert!(long_key.as_str().starts_with("ip+ua:!"), "{long_key}");

    // As shown, through a client that form-encodes its query (`+` as %2B).
    let by_key = reqwest::Url::parse_with_params(
        &format!("http://{addr}/admin/keys"),
        &[("key", shown.as_str())],
    )
    .unwrap();
    assert!(by_key.as_str().contains("ip%2Bua"), "{by_key}");
    let state = client.get(by_key.clone()).send().await.unwrap();
    assert_eq!(state.status(), StatusCode::OK);
    let state: KeyState = state.json().await.unwrap();
    assert!(
        !state.allowed,
        "the refused tuple, not a fresh key: {state:?}"
    );
    answered_ok(client.delete(by_key)).await;
    assert_eq!(status(browser).await, StatusCode::OK);

    // Typed by hand: `+` and `|` as themselves.
    answered_ok(client.delete(format!(
        "http://{addr}/admin/keys?key=ip+ua:127.0.0.1|curl/8.0"
    )))
    .await;
    assert_eq!(status("curl/8.0").await, StatusCode::OK);

    // The digested tuple, by the digest `GET /top` shows.
    let top = get_json(&client, format!("http://{addr}/admin/top")).await;
    let digest = tollgate::key::digest(&long_key);
    assert!(
        top["keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["digest"] == digest.as_str()),
        "{top}"
    );
    assert_eq!(status(&long).await, StatusCode::TOO_MANY_REQUESTS);
    answered_ok(client.put(format!(
        "http://{addr}/admin/overrides?digest={digest}&policy=api&limit=3"
    )))
    .await;
    assert_eq!(limiter.overrides(&long_key).await.unwrap().len(), 1);
    answered_ok(client.delete(format!("http://{addr}/admin/keys?digest={digest}"))).await;
    assert_eq!(status(&long).await, StatusCode::OK);

    // A key with escapes of its own, pasted as shown, names that key and no other (read
    // twice, `50%2520off` would be `50 off`); a digested key travels encoded (its `#` as
    // `%23`, its `:` as `%3A`); a key with no material, encoded too.
    let escaped = Key::new("tenant", "50%20off");
    let digested = Key::new("tenant", "x".repeat(200));
    let anonymous = Key::new("anonymous", "");
    assert_eq!(escaped.as_str(), "tenant:50%2520off");
    assert!(digested.as_str().starts_with("tenant:#"));
    for (key, sent) in [
        (&escaped, escaped.as_str().to_owned()),
        (
            &digested,
            digested.as_str().replace(':', "%3A").replace('#', "%23"),
        ),
        (&anonymous, "anonymous%3A".to_owned()),
    ] {
        limiter.check(key, 1).await.unwrap();
        assert!(!limiter.check(key, 1).await.unwrap().is_allowed());
        answered_ok(client.delete(format!("http://{addr}/admin/keys?key={sent}"))).await;
        assert!(
            limiter.check(key, 1).await.unwrap().is_allowed(),
            "{key} was not the key reset"
        );
    }
    // A client's material that looks like a digest, pasted as shown (`%23…`), names that
    // client's key, never the digested key it imitates.
    let hex = digested.as_str().trim_start_matches("tenant:#").to_owned();
    let imitation = Key::new("tenant", format!("#{hex}"));
    assert_eq!(imitation.as_str(), format!("tenant:%23{hex}"));
    for key in [&imitation, &digested] {
        limiter.check(key, 1).await.unwrap();
        assert!(!limiter.check(key, 1).await.unwrap().is_allowed());
    }
    answered_ok(client.delete(format!(
        "http://{addr}/admin/keys?key={}",
        imitation.as_str()
    )))
    .await;
    assert!(limiter.check(&imitation, 1).await.unwrap().is_allowed());
    assert!(
        !limiter.check(&digested, 1).await.unwrap().is_allowed(),
        "the digested key was reset in the imitation's place"
    );

    // What names no key, or names it twice, is refused and changes nothing.
    for (url, status, field) in [
        (
            "keys?digest=0123456789abcdef",
            StatusCode::NOT_FOUND,
            "digest",
        ),
        (
            "keys?key=ip+ua:127.0.0.1|x&key=user:1",
            StatusCode::BAD_REQUEST,
            "key",
        ),
        ("keys?key=user:%2", StatusCode::BAD_REQUEST, "key"),
        // An escape no key shows: not a key's text.
        ("keys?key=user:%61b", StatusCode::BAD_REQUEST, "key"),
        // A `#` left unencoded ends the URL there.
        (
            "keys?key=user:#0123456789abcdef0123456789abcdef",
            StatusCode::BAD_REQUEST,
            "key",
        ),
        ("keys?key=user%3A50%2525%25", StatusCode::BAD_REQUEST, "key"),
        ("keys?key=nocolon", StatusCode::BAD_REQUEST, "key"),
        ("keys", StatusCode::BAD_REQUEST, "key"),
        ("keys/user/1?key=user:1", StatusCode::BAD_REQUEST, "key"),
        (
            "keys?key=user:1&digest=0123456789abcdef",
            StatusCode::BAD_REQUEST,
            "digest",
        ),
        (
            "overrides?key=user:1&policy=api&digets=1",
            StatusCode::BAD_REQUEST,
            "digets",
        ),
    ] {
        let res = client
            .delete(format!("http://{addr}/admin/{url}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), status, "{url}");
        let body: serde_json::Value = res.json().await.unwrap();
        assert!(
            body["message"].as_str().unwrap().starts_with(field),
            "{url}: {body}"
        );
    }
}

async fn answered_ok(request: reqwest::RequestBuilder) {
    let res = request.send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{:?}", res.text().await);
}

#[test]
fn the_cli_refuses_what_it_cannot_act_on() {
    let dir = std::env::temp_dir().join(unique_prefix());
    std::fs::create_dir_all(&dir).unwrap();
    let memory = dir.join("memory.toml");
    std::fs::write(
        &memory,
        "[[policies]]\nname = \"api\"\nlimit = 1\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]\n",
    )
    .unwrap();
    let memory = memory.to_str().unwrap();
    // Each call is refused before it connects: nothing listens at this address.
    let nowhere = format!("redis://127.0.0.1:{}", support::free_port());
    let nowhere = nowhere.as_str();

    let out = tollgate(&["inspect", memory, "user:42"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("store.kind = \"memory\""),
        "{}",
        text(&out)
    );
    let out = tollgate(&["reset", memory, "no-colon", "--redis", nowhere]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("KEY = \"no-colon\""), "{}", text(&out));
    let out = tollgate(&["inspect", memory, "user:42", "--redis", "nope://x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("--redis"), "{}", text(&out));
    let out = tollgate(&[
        "inspect", memory, "user:42", "--redis", nowhere, "--method", "G T",
    ]);
    assert_eq!(out.status.code(), Some(2));
    // Nothing listens there: the admin API cannot be reached.
    let port = support::free_port();
    let out = tollgate(&["top", &format!("http://127.0.0.1:{port}/admin")]);
    assert_eq!(out.status.code(), Some(1));
    // A URL that is not the admin API's kind is a usage mistake, not a failure to reach it.
    let out = tollgate(&["top", "ftp://127.0.0.1/admin"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("http://"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Limits attached through axum's router with `for_route` are the parent's too: the admin
/// API's reset, overrides and plan reached only the parent's own routes, so a key refused by
/// an attached route stayed refused after `DELETE /keys`.
#[tokio::test]
async fn the_admin_api_covers_limits_attached_with_for_route() {
    use tollgate::route::Route;
    use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
    let limiter = Limiter::builder()
        .default_route(Route::exempt())
        .extractor(tollgate::key::from_fn(|req| {
            let tenant = req.headers().get("x-tenant")?;
            Some(Key::new("tenant", tenant.as_bytes()))
        }))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(limiter.clone());
    let attached = layer
        .for_route(Route::new().policy(Policy::new("search", Rate::per_minute(2)).unwrap()))
        .unwrap();
    let app = Router::new()
        .route("/search", get(|| async { "results" }).route_layer(attached))
        .nest("/admin", Admin::new(limiter).router());
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    for expected in [200, 200, 429] {
        assert_eq!(search(&client, addr, "t1").await.as_u16(), expected);
    }
    let res = client
        .delete(format!("http://{addr}/admin/keys/tenant/t1"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(search(&client, addr, "t1").await, StatusCode::OK);

    let res = client
        .put(format!(
            "http://{addr}/admin/overrides/tenant/t2?policy=search&limit=5"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "{}",
        res.text().await.unwrap()
    );
    for _ in 0..5 {
        assert_eq!(search(&client, addr, "t2").await, StatusCode::OK);
    }
    assert_eq!(search(&client, addr, "t2").await.as_u16(), 429);

    let plan = get_json(&client, format!("http://{addr}/admin/plan")).await;
    let routes = plan["limiter"]["routes"].as_array().unwrap();
    assert!(
        routes.iter().any(|r| r["policies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "search")),
        "{plan}"
    );
}

/// A limiter made with `for_route` and dropped leaves nothing in the one it was made from.
#[test]
fn limiters_made_with_for_route_and_dropped_are_forgotten() {
    use tollgate::route::Route;
    use tollgate::{Limiter, Policy, Rate};
    let limiter = Limiter::builder()
        .policy(Policy::new("api", Rate::per_minute(10)).unwrap())
        .build()
        .unwrap();
    let route = || Route::new().policy(Policy::new("search", Rate::per_minute(2)).unwrap());
    let kept = limiter.for_route(route()).unwrap();
    for _ in 0..1_000 {
        drop(limiter.for_route(route()).unwrap());
    }
    assert_eq!(limiter.effective_plan().routes.len(), 2);
    drop(kept);
    assert_eq!(limiter.effective_plan().routes.len(), 1);
}

// `GET /plan` shows the plan it was given: without the password of its store's URL, which
// would hand whoever reads the admin API the whole store.
#[tokio::test]
async fn the_plan_is_shown_without_the_stores_password() {
    let plan = Plan::from_toml(
        "[store]\nkind = \"redis\"\nurl = \"redis://:hunter2@127.0.0.1:1\"\n\
         [[policies]]\nname = \"api\"\nlimit = 10\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]\n",
    )
    .unwrap();
    let limiter = tollgate::Limiter::builder()
        .policy(tollgate::Policy::new("api", tollgate::Rate::per_minute(10)).unwrap())
        .build()
        .unwrap();
    let addr = support::serve(Admin::new(limiter).plan(&plan).router()).await;
    let shown = get_json(&reqwest::Client::new(), format!("http://{addr}/plan")).await;
    assert_eq!(
        shown["plan"]["store"]["url"], "redis://***@127.0.0.1:1",
        "{shown}"
    );
    assert!(!shown.to_string().contains("hunter2"), "{shown}");
}

/// An account locked by failed guesses is unlocked from outside the application with
/// `tollgate unlock --user` (on the shared Redis, the username read as the guard reads it),
/// and a client blocked by its IP limit through the admin API's `DELETE /login/ips`; `GET
/// /login/top` lists the login keys refused. An admin API without a guard answers 404 there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_account_and_client_are_unlocked_by_the_cli_and_the_admin_api() {
    let server = support::RedisServer::start();
    let prefix = unique_prefix();
    let plan_toml = format!(
        "failure_mode = \"fail_closed\"\n[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"{prefix}\"\n\
         [[policies]]\nname = \"login-ip-user\"\nlimit = 100\nwindow = \"15m\"\n\
         [[policies]]\nname = \"login-ip\"\nlimit = 4\nwindow = \"15m\"\n\
         [[policies]]\nname = \"login-user\"\nlimit = 2\nwindow = \"1h\"\n\
         [[policies]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\n\
         [default]\npolicies = [\"api\"]\n\
         [login]\nroutes = [\"POST /login\"]\nusername_header = \"x-user\"\n\
         ip_username = \"login-ip-user\"\nip = \"login-ip\"\nusername = \"login-user\"\n",
        server.url()
    );
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).unwrap();
    let plan_path: PathBuf = dir.join("plan.toml");
    std::fs::write(&plan_path, &plan_toml).unwrap();
    let plan = Plan::from_file(&plan_path).unwrap();
    let built = plan.build().unwrap();
    let admin = Admin::new(built.limiter().clone()).login(built.login_guard().unwrap().clone());
    let app = Router::new()
        .route(
            "/login",
            axum::routing::post(|| async { StatusCode::UNAUTHORIZED }),
        )
        .layer(built.login_layer().unwrap())
        .nest("/admin", admin.router());
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let login = |user: &'static str| {
        let client = client.clone();
        async move {
            client
                .post(format!("http://{addr}/login"))
                .header("x-user", user)
                .send()
                .await
                .unwrap()
                .status()
        }
    };

    // Two wrong passwords lock alice's account.
    assert_eq!(login("alice").await, StatusCode::UNAUTHORIZED);
    assert_eq!(login("alice").await, StatusCode::UNAUTHORIZED);
    assert_eq!(login("alice").await, StatusCode::TOO_MANY_REQUESTS);
    let out = tollgate(&[
        "unlock",
        plan_path.to_str().unwrap(),
        "--user",
        "Alice",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["unlocked"], "user");
    // This instance's deny cache may hold the refusal until its store confirms it no more
    // (the admin module's docs give the bound: `deny_cache_recheck` plus one call).
    let mut after_unlock = login("alice").await;
    for _ in 0..20 {
        if after_unlock != StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        after_unlock = login("alice").await;
    }
    assert_eq!(after_unlock, StatusCode::UNAUTHORIZED, "unlocked");

    // Three failures so far from this client; one more fills its IP limit of 4.
    assert_eq!(login("bob").await, StatusCode::UNAUTHORIZED);
    assert_eq!(login("carol").await, StatusCode::TOO_MANY_REQUESTS);
    let top = get_json(&client, format!("http://{addr}/admin/login/top")).await;
    let shown: Vec<&str> = top["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert!(
        shown.iter().any(|k| k.starts_with("login-user:"))
            && shown.iter().any(|k| k.starts_with("login-ip:")),
        "{top}"
    );
    let res = client
        .delete(format!("http://{addr}/admin/login/ips?key=ip:127.0.0.1"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(login("carol").await, StatusCode::UNAUTHORIZED, "unblocked");

    for (url, status) in [
        ("/admin/login/users", StatusCode::BAD_REQUEST),
        ("/admin/login/users?username=", StatusCode::BAD_REQUEST),
        ("/admin/login/users?user=alice", StatusCode::BAD_REQUEST),
        ("/admin/login/ips?key=nocolon", StatusCode::BAD_REQUEST),
    ] {
        let res = client
            .delete(format!("http://{addr}{url}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), status, "{url}");
    }
    let out = tollgate(&["unlock", plan_path.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "neither --user nor --ip: {}",
        text(&out)
    );

    // Without a guard, the login endpoints are not there.
    let limiter = tollgate::Limiter::builder()
        .policy(tollgate::Policy::new("api", tollgate::Rate::per_minute(1)).unwrap())
        .build()
        .unwrap();
    let bare = support::serve(Admin::new(limiter).router()).await;
    let res = client
        .get(format!("http://{bare}/login/top"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    std::fs::remove_dir_all(dir).ok();
}

/// `GET /plan` shows the plan in force: after a reload, the new one. It once kept showing the
/// plan given when the router was made, beside the new limits in `limiter`.
#[tokio::test]
async fn the_plan_shown_is_the_plan_in_force_after_a_reload() {
    let plan = |limit: u64| {
        Plan::from_toml(&format!(
            "[[policies]]\nname = \"api\"\nlimit = {limit}\nwindow = \"1m\"\n\
             [default]\npolicies = [\"api\"]\n"
        ))
        .unwrap()
    };
    let v1 = plan(100);
    let built = v1.build().unwrap();
    let limiter = built.limiter().clone();
    let addr = support::serve(Admin::new(limiter.clone()).plan(&v1).router()).await;
    let client = reqwest::Client::new();
    let shown = get_json(&client, format!("http://{addr}/plan")).await;
    assert_eq!(shown["plan"]["policies"][0]["limit"], 100, "{shown}");
    limiter.reload_plan(&plan(500)).unwrap();
    let shown = get_json(&client, format!("http://{addr}/plan")).await;
    assert_eq!(shown["plan"]["policies"][0]["limit"], 500, "{shown}");
    assert!(shown["limiter"].to_string().contains("500"), "{shown}");
}

/// `--redis` points the command at a Redis whatever kind of store the plan names: the settings
/// that say where the plan's own store is (a Sentinel's, a cluster's, the memory store's key
/// cap) give way to the flag rather than refuse it.
#[test]
fn the_redis_flag_replaces_a_store_of_any_kind() {
    let server = support::RedisServer::start();
    let dir = std::env::temp_dir().join(unique_prefix());
    std::fs::create_dir_all(&dir).unwrap();
    let policies =
        "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]\n";
    for (kind, store) in [
        (
            "sentinel",
            "[store]\nkind = \"sentinel\"\nsentinels = [\"redis://127.0.0.1:1\"]\nmaster = \"m\"\n",
        ),
        (
            "cluster",
            "[store]\nkind = \"redis_cluster\"\nurls = [\"redis://127.0.0.1:1\"]\n",
        ),
        ("memory", "[store]\nkind = \"memory\"\nmax_keys = 1000\n"),
    ] {
        let path = dir.join(format!("{kind}.toml"));
        std::fs::write(&path, format!("{store}{policies}")).unwrap();
        let out = tollgate(&[
            "inspect",
            path.to_str().unwrap(),
            "user:42",
            "--redis",
            &server.url(),
            "--json",
        ]);
        assert!(out.status.success(), "{kind}: {}", text(&out));
        let state: KeyState = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(state.policies[0].remaining, 5, "{kind}");
    }
    // A regional plan's store is its region's Redis: `--cluster` cannot stand for it, and
    // the refusal names the flag.
    let path = dir.join("regional.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nregion = \"eu\"\nhome = \"redis://127.0.0.1:2\"\n{policies}"
        ),
    )
    .unwrap();
    let out = tollgate(&[
        "inspect",
        path.to_str().unwrap(),
        "user:42",
        "--cluster",
        &server.url(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--cluster"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
