//! The login guard end to end: the `login` example's axum app on loopback, real HTTP clients
//! bound to different loopback addresses (127.0.0.0/8) so the server sees different peers.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use reqwest::StatusCode;
use support::serve;
use tollgate::clock::ManualClock;
use tollgate::login::LoginGuard;
use tollgate::store::MemoryStore;
use tollgate::Rate;

mod support;

#[allow(dead_code)]
#[path = "../examples/login.rs"]
mod example;

const T0: u64 = 1_796_205_603_250;
const WINDOW: Duration = Duration::from_secs(600);
const PASSWORD: &str = "correct horse battery staple";

/// A client whose connections come from 127.0.0.`n`.
fn client_from(n: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)))
        .build()
        .unwrap()
}

/// 3 failures per (IP, user), 10 per IP, 6 per user, every window 10 minutes.
fn guard(clock: &ManualClock) -> LoginGuard {
    LoginGuard::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .ip_user_rate(Rate::new(3, WINDOW))
        .ip_rate(Rate::new(10, WINDOW))
        .user_rate(Rate::new(6, WINDOW))
        .build()
        .unwrap()
}

struct Server {
    addr: SocketAddr,
    clock: ManualClock,
}

async fn server() -> Server {
    let clock = ManualClock::new(T0);
    let addr = serve(example::app(guard(&clock))).await;
    Server { addr, clock }
}

impl Server {
    async fn login(&self, from: u8, path: &str, user: &str, password: &str) -> reqwest::Response {
        client_from(from)
            .post(format!("http://{}{path}", self.addr))
            .json(&serde_json::json!({ "username": user, "password": password }))
            .send()
            .await
            .unwrap()
    }
}

/// The refusal says nothing about counts or which limit tripped.
async fn assert_generic_429(res: reqwest::Response) {
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    for h in res.headers().keys() {
        assert!(!h.as_str().contains("ratelimit"), "leaks {h}");
    }
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({
            "error": "rate_limit_exceeded",
            "message": "Too many requests. Please try again later.",
            "retry_after": body["retry_after"],
        })
    );
}

#[tokio::test]
async fn rotating_ips_on_one_user_are_stopped_by_the_username_limit() {
    let s = server().await;
    // Two guesses from each of three addresses: under the (IP, user) limit of 3 each, and
    // far under the IP limit, but six failures for the user.
    for ip in 2..5u8 {
        for _ in 0..2 {
            let res = s.login(ip, "/login", "alice", "guess").await;
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        }
    }
    // A fresh address, and another spelling of the name: refused.
    assert_generic_429(s.login(9, "/login", " Alice", "guess").await).await;
    // Even the right password is not checked now (and so cannot be confirmed by guessing).
    assert_generic_429(s.login(10, "/login", "alice", PASSWORD).await).await;
    // Other users are unaffected.
    assert_eq!(
        s.login(9, "/login", "bob", "guess").await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn one_ip_spraying_many_users_is_stopped_by_the_ip_limit() {
    let s = server().await;
    for i in 0..10 {
        let res = s
            .login(20, "/login", &format!("user{i}"), "Password1")
            .await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    // A user never tried before, from the same address: refused.
    assert_generic_429(s.login(20, "/login", "user99", "Password1").await).await;
    // The same user from another address: fine.
    assert_eq!(
        s.login(21, "/login", "user99", "Password1").await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn a_success_resets_the_users_ip_user_tuple() {
    let s = server().await;
    for _ in 0..2 {
        assert_eq!(
            s.login(30, "/login", "alice", "typo").await.status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        s.login(30, "/login", "ALICE", PASSWORD).await.status(),
        StatusCode::OK
    );
    // Without the reset the third typo would exhaust the (IP, user) limit of 3 and the fourth
    // attempt would be refused; after it, three more typos are allowed.
    for _ in 0..3 {
        assert_eq!(
            s.login(30, "/login", "alice", "typo").await.status(),
            StatusCode::UNAUTHORIZED
        );
    }
    assert_generic_429(s.login(30, "/login", "alice", PASSWORD).await).await;
}

#[tokio::test]
async fn an_attacker_cannot_lock_a_victim_out_beyond_the_username_window() {
    let s = server().await;
    // The attacker spends the username budget from rotating addresses...
    for ip in 40..46u8 {
        assert_eq!(
            s.login(ip, "/login", "alice", "guess").await.status(),
            StatusCode::UNAUTHORIZED
        );
    }
    s.clock.advance(Duration::from_secs(1));
    // ...and keeps hammering for the whole window; refused attempts are not counted.
    for step in 0..10u8 {
        assert_generic_429(s.login(46 + step, "/login", "alice", "guess").await).await;
        s.clock.advance(WINDOW / 10 - Duration::from_millis(200));
    }
    // The victim, from their own address, is locked out until one window after the last
    // counted failure, and not a moment longer.
    s.clock.set_millis(T0 + WINDOW.as_millis() as u64 - 1);
    assert_generic_429(s.login(100, "/login", "alice", PASSWORD).await).await;
    s.clock.set_millis(T0 + WINDOW.as_millis() as u64);
    assert_eq!(
        s.login(100, "/login", "alice", PASSWORD).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_layer_form_records_outcomes_from_the_status() {
    let s = server().await;
    // Same scenario as the handler form, through `/api/login` and its `LoginLayer`.
    for ip in 2..5u8 {
        for _ in 0..2 {
            let res = s.login(ip, "/api/login", "carol", "guess").await;
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        }
    }
    assert_generic_429(s.login(9, "/api/login", "CAROL ", "guess").await).await;
    // Successes clear the (IP, user) tuple through the layer too.
    for _ in 0..2 {
        let res = s.login(60, "/api/login", "alice", "typo").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = s.login(60, "/api/login", "alice", PASSWORD).await;
    assert_eq!(res.status(), StatusCode::OK);
    for _ in 0..3 {
        let res = s.login(60, "/api/login", "alice", "typo").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    assert_generic_429(s.login(60, "/api/login", "alice", "typo").await).await;
    // The two routes share the guard: the handler route refuses as well.
    assert_generic_429(s.login(60, "/login", "alice", "typo").await).await;
}

#[tokio::test]
async fn the_layer_caps_the_buffered_body() {
    let s = server().await;
    let big = "x".repeat(20 * 1024);
    let res = client_from(70)
        .post(format!("http://{}/api/login", s.addr))
        .json(&serde_json::json!({ "username": "alice", "password": big }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "payload_too_large");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("The request body is too large: at most ")
            && message.ends_with(" bytes are accepted."),
        "{message}"
    );
    // Nothing was recorded: the same client can still try.
    assert_eq!(
        s.login(70, "/api/login", "alice", PASSWORD).await.status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_duplicated_username_field_is_refused_before_anything_is_charged() {
    let s = server().await;
    let res = client_from(80)
        .post(format!("http://{}/api/login", s.addr))
        .header("content-type", "application/json")
        .body(r#"{"username":"decoy","password":"guess","username":"victim"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "ambiguous_username");
    // Neither name was charged: three failures per (IP, user) are all still there.
    for _ in 0..3 {
        let res = s.login(80, "/api/login", "victim", "guess").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    assert_generic_429(s.login(80, "/api/login", "victim", "guess").await).await;
}

/// A JSON array is read by position by the handler's derived `Deserialize` (axum's `Json`
/// takes `["victim","guess"]` as the victim's attempt), while the guard found no username in
/// it and charged the empty name: refused, like a username given twice.
#[tokio::test]
async fn a_positional_json_body_is_refused_before_anything_is_charged() {
    let s = server().await;
    let res = client_from(81)
        .post(format!("http://{}/api/login", s.addr))
        .header("content-type", "application/json")
        .body(r#"["victim","guess"]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "ambiguous_username");
}

#[tokio::test]
async fn every_spelling_of_one_user_shares_the_username_limit() {
    let s = server().await;
    // Six failures per user in all (from different IPs so only the username limit counts).
    let spellings = [
        "alice",
        "ALİCE",
        "ａｌｉｃｅ",
        "𝐚𝐥𝐢𝐜𝐞",
        "ⓐⓛⓘⓒⓔ",
        "al\u{200B}ice",
    ];
    for (i, spelling) in spellings.iter().enumerate() {
        let res = s
            .login(100 + i as u8, "/api/login", spelling, "guess")
            .await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{spelling:?}");
    }
    for (i, spelling) in ["al\u{AD}ice", "\u{FEFF}alice", "alice.", "Alice "]
        .iter()
        .enumerate()
    {
        assert_generic_429(
            s.login(120 + i as u8, "/api/login", spelling, "guess")
                .await,
        )
        .await;
    }
    // A different account is not affected.
    let res = s.login(130, "/api/login", "strasse", "guess").await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

/// A plain `RateLimitLayer` with a sensitive policy on the login route only: its 429 must be
/// as quiet as the guard's, even though the default route's policy is not sensitive.
#[tokio::test]
async fn a_sensitive_route_policy_hides_counts() {
    use tollgate::route::Route;
    use tollgate::{Limiter, Policy, RateLimitLayer};

    let limiter = Limiter::builder()
        .policy(Policy::new("pages", Rate::per_minute(100)).unwrap())
        .route(
            "POST /login",
            Route::new().policy(
                Policy::builder("login", Rate::per_minute(1))
                    .sensitive(true)
                    .build()
                    .unwrap(),
            ),
        )
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route("/login", axum::routing::post(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter));
    let addr = serve(app).await;
    let client = client_from(80);
    let res = client
        .post(format!("http://{addr}/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("ratelimit-remaining").is_none());
    let res = client
        .post(format!("http://{addr}/login"))
        .send()
        .await
        .unwrap();
    assert_generic_429(res).await;
}

/// Behind a trusted proxy the guard keys by the forwarded client address: the trusted-proxy
/// extractor plugs in as the IP source.
#[tokio::test]
async fn the_ip_source_can_read_the_client_behind_a_trusted_proxy() {
    use tollgate::key::{ClientIp, TrustedProxies};

    let guard = LoginGuard::builder()
        .ip_rate(Rate::new(3, WINDOW))
        .ip_source(ClientIp::new(TrustedProxies::parse(["127.0.0.2"]).unwrap()))
        .build()
        .unwrap();
    let addr = serve(example::app(guard)).await;
    let via_proxy = |client: &'static str, user: String| {
        client_from(2)
            .post(format!("http://{addr}/login"))
            .header("x-forwarded-for", client)
            .json(&serde_json::json!({ "username": user, "password": "guess" }))
            .send()
    };
    for i in 0..3 {
        let res = via_proxy("203.0.113.5", format!("user{i}")).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    // The spraying client is refused; another client behind the same proxy is not.
    assert_generic_429(via_proxy("203.0.113.5", "user9".into()).await.unwrap()).await;
    let res = via_proxy("198.51.100.7", "user9".into()).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    // An untrusted peer cannot choose its address with the header.
    for i in 0..3 {
        let res = client_from(3)
            .post(format!("http://{addr}/login"))
            .header("x-forwarded-for", format!("192.0.2.{i}"))
            .json(&serde_json::json!({ "username": format!("u{i}"), "password": "guess" }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = client_from(3)
        .post(format!("http://{addr}/login"))
        .header("x-forwarded-for", "192.0.2.200")
        .json(&serde_json::json!({ "username": "u9", "password": "guess" }))
        .send()
        .await
        .unwrap();
    assert_generic_429(res).await;
}

/// A plan's `retry_after` holds on the login layer's refusals as on the limiter's layer (the
/// login layer rendered every refusal with the defaults).
#[tokio::test]
async fn a_plans_response_settings_hold_on_the_login_layer() {
    let plan = tollgate::config::Plan::from_toml(&format!(
        "retry_after = false\nheader_style = \"structured\"\n{}",
        login_plan("username_header = \"x-user\"", 1, 20)
    ))
    .unwrap();
    let built = plan.build().unwrap();
    let app = axum::Router::new()
        .route(
            "/login",
            axum::routing::post(|| async { http::StatusCode::UNAUTHORIZED }),
        )
        .layer(built.login_layer().unwrap())
        .layer(built.layer());
    let addr = serve(app).await;
    let client = reqwest::Client::new();
    let send = || {
        client
            .post(format!("http://{addr}/login"))
            .header("x-user", "alice")
            .send()
    };
    assert_eq!(send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let refused = send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        refused.headers().get("retry-after").is_none(),
        "{:?}",
        refused.headers()
    );
    // A login refusal says nothing of the limits, and the limiter's layer around it (which
    // admitted the request) adds nothing to it.
    for name in [
        "ratelimit-policy",
        "ratelimit",
        "ratelimit-limit",
        "x-ratelimit-limit",
    ] {
        assert!(
            refused.headers().get(name).is_none(),
            "{name}: {:?}",
            refused.headers()
        );
    }
}

/// The username header given twice: frameworks disagree on which instance wins, so a decoy
/// before the victim's name charged the decoy's limits while the handler could check the
/// victim's password. Refused as ambiguous, as a JSON field given twice is.
#[tokio::test]
async fn a_username_header_given_twice_is_refused() {
    use axum::http::{HeaderName, StatusCode};
    use axum::routing::post;
    use tollgate::login::{LoginGuard, LoginLayer};
    let guard = LoginGuard::builder().build().unwrap();
    let app = axum::Router::new()
        .route("/login", post(|| async { StatusCode::UNAUTHORIZED }))
        .layer(LoginLayer::header(
            guard,
            HeaderName::from_static("x-username"),
        ));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let res = client
        .post(format!("http://{addr}/login"))
        .header("x-username", "decoy")
        .header("x-username", "victim")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "ambiguous_username");
    let once = client
        .post(format!("http://{addr}/login"))
        .header("x-username", "victim")
        .send()
        .await
        .unwrap();
    assert_eq!(once.status(), 401);
}

/// A form login: the layer reads the username as axum's `Form` does, so every percent-encoded
/// spelling of one username is that username's attempt, and a field given twice is refused.
#[tokio::test]
async fn a_form_login_counts_every_encoding_of_a_username_as_one() {
    use axum::routing::post;
    use tollgate::login::LoginLayer;

    #[derive(serde::Deserialize)]
    struct Credentials {
        username: String,
        #[allow(dead_code)]
        password: String,
    }
    let clock = ManualClock::new(T0);
    let app = axum::Router::new()
        .route(
            "/login",
            post(|axum::Form(c): axum::Form<Credentials>| async move {
                // One account, however the client spelled it.
                if c.username.eq_ignore_ascii_case("alice") {
                    StatusCode::UNAUTHORIZED
                } else {
                    StatusCode::IM_A_TEAPOT
                }
            }),
        )
        .layer(LoginLayer::form_field(guard(&clock), "username"));
    let addr = serve(app).await;
    let attempt = |from: u8, body: &'static str| {
        client_from(from)
            .post(format!("http://{addr}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
    };
    // Six failures per username, each spelling from its own address.
    let spellings = [
        "username=alice&password=a",
        "username=%61lice&password=b",
        "username=%61%6Cice&password=c",
        "password=d&username=al%69ce",
        "user%6Eame=alic%65&password=e",
        "username=ALICE&password=f",
    ];
    for (i, body) in spellings.into_iter().enumerate() {
        let res = attempt(100 + i as u8, body).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{body}");
    }
    assert_generic_429(attempt(120, "username=%41lice&password=g").await.unwrap()).await;
    let twice = attempt(121, "username=bob&password=x&username=alice")
        .await
        .unwrap();
    assert_eq!(twice.status(), StatusCode::BAD_REQUEST);
}

/// A plan with a `[login]` reading the username as `source` says, `ip_user` failures per
/// (IP, username) a quarter hour and `user` per username an hour.
fn login_plan(source: &str, ip_user: u64, user: u64) -> String {
    format!(
        "[[policies]]\nname = \"login-ip-user\"\nlimit = {ip_user}\nwindow = \"15m\"\n\
         [[policies]]\nname = \"login-ip\"\nlimit = 50\nwindow = \"15m\"\n\
         [[policies]]\nname = \"login-user\"\nlimit = {user}\nwindow = \"1h\"\n\
         [[policies]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\n\
         [default]\npolicies = [\"api\"]\n\
         [login]\nroutes = [\"POST /login\"]\n{source}\n\
         ip_username = \"login-ip-user\"\nip = \"login-ip\"\nusername = \"login-user\"\n"
    )
}

/// A plan reads a form login's username with `username_form_field`, decoded as a form is; a
/// plan naming two sources of the username is refused, naming the field.
#[tokio::test]
async fn a_plan_reads_the_username_of_a_form_login() {
    let text = login_plan("username_form_field = \"username\"", 5, 1);
    let built = tollgate::config::Plan::from_toml(&text)
        .unwrap()
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/login",
            axum::routing::post(|| async { http::StatusCode::UNAUTHORIZED }),
        )
        .layer(built.login_layer().unwrap());
    let addr = serve(app).await;
    let send = |from: u8, body: &'static str| {
        client_from(from)
            .post(format!("http://{addr}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
    };
    let first = send(130, "username=alice&password=x").await.unwrap();
    assert_eq!(first.status(), StatusCode::UNAUTHORIZED);
    let again = send(131, "username=%61lice&password=y").await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);

    let both = text.replace(
        "username_form_field = \"username\"",
        "username_form_field = \"username\"\nusername_field = \"username\"",
    );
    let err = tollgate::config::Plan::from_toml(&both)
        .unwrap()
        .build()
        .expect_err("two sources of the username");
    assert_eq!(err.field(), "login.username_header");
    assert!(err.reason().contains("username_form_field"), "{err}");
}

/// A plan that fails open keeps its login limits closed through an outage (its layer answers
/// 503, and no guess reaches the handler) unless `[login] failure_mode` says otherwise; a
/// memory-store plan has no outage to choose for.
#[tokio::test]
async fn a_plan_that_fails_open_keeps_logins_closed_through_an_outage() {
    // A Redis nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", dead.local_addr().unwrap());
    drop(dead);
    let plan = |login_mode: &str| {
        let text = format!(
            "failure_mode = \"fail_open\"\n[store]\nkind = \"redis\"\nurl = \"{url}\"\n\
             {}{login_mode}\n",
            login_plan("username_header = \"x-user\"", 3, 6)
        );
        tollgate::config::Plan::from_toml(&text)
            .unwrap()
            .build()
            .unwrap()
    };
    let statuses = |built: tollgate::config::BuiltPlan| async move {
        let app = axum::Router::new()
            .route(
                "/login",
                axum::routing::post(|| async { StatusCode::UNAUTHORIZED }),
            )
            .layer(built.login_layer().unwrap());
        let addr = serve(app).await;
        let mut seen = vec![];
        for _ in 0..3 {
            let res = reqwest::Client::new()
                .post(format!("http://{addr}/login"))
                .header("x-user", "alice")
                .send()
                .await
                .unwrap();
            seen.push(res.status().as_u16());
        }
        seen
    };
    assert_eq!(statuses(plan("")).await, [503, 503, 503]);
    assert_eq!(
        statuses(plan("failure_mode = \"fail_open\"")).await,
        [401, 401, 401],
        "chosen in the plan: open"
    );
    let memory = format!(
        "{}failure_mode = \"fail_closed\"\n",
        login_plan("username_header = \"x-user\"", 3, 6)
    );
    let err = tollgate::config::Plan::from_toml(&memory)
        .unwrap()
        .build()
        .expect_err("a memory store has no outage");
    assert_eq!(err.field(), "login.failure_mode");
}

/// A store whose refunds reach it 20 ms late, as over a network.
#[derive(Debug, Clone)]
struct LateRefund(MemoryStore);

impl tollgate::store::Store for LateRefund {
    type CheckFuture = <MemoryStore as tollgate::store::Store>::CheckFuture;

    fn check(
        &self,
        key: &tollgate::key::Key,
        policies: &[tollgate::Policy],
        costs: &[u64],
    ) -> Self::CheckFuture {
        self.0.check(key, policies, costs)
    }

    fn apply(
        &self,
        key: &tollgate::key::Key,
        policies: &[tollgate::Policy],
        op: tollgate::store::Op,
    ) -> tollgate::store::ApplyFuture {
        if !matches!(op, tollgate::store::Op::Refund { .. }) {
            return self.0.apply(key, policies, op);
        }
        let (inner, key, policies) = (self.0.clone(), key.clone(), policies.to_vec());
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            inner.apply(&key, &policies, op).await
        })
    }

    fn override_store(&self) -> Option<&dyn tollgate::store::OverrideStore> {
        self.0.override_store()
    }

    fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }

    fn name(&self) -> &'static str {
        "late-refund"
    }
}

/// A success recorded by a caller that stops waiting at once (a client that hangs up) still
/// gives both of its refunds: the username limit's came after the IP limit's was awaited,
/// so it was never made, and the account kept a failure it never had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_recorded_by_a_caller_that_gives_up_refunds_every_limit() {
    let guard = LoginGuard::builder()
        .store(LateRefund(MemoryStore::new()))
        .user_rate(Rate::per_hour(1))
        .build()
        .unwrap();
    let first = guard.attempt_with_ip_key(tollgate::key::Key::new("ip", "192.0.2.1"), "alice");
    assert!(guard.check(&first).await.unwrap().is_allowed());
    let cut = tokio::time::timeout(Duration::from_millis(1), guard.record_success(&first)).await;
    assert!(cut.is_err(), "the record was to be cut short");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The username limit (1 an hour) has its unit back: a login from elsewhere is allowed.
    let second = guard.attempt_with_ip_key(tollgate::key::Key::new("ip", "192.0.2.2"), "alice");
    assert!(
        guard.check(&second).await.unwrap().is_allowed(),
        "the username limit kept the success's charge"
    );
}

/// A `LoginLayer` over a route that serves the login page (`GET`) beside the login (`POST`):
/// the page load is not an attempt. Guarded, its `200` read as a success and cleared the
/// (IP, username) failures a guesser had earned, so guessing went on at four tries a page load.
#[tokio::test]
async fn the_login_page_on_the_same_path_is_not_an_attempt() {
    use axum::routing::get;
    let guard = tollgate::login::LoginGuard::builder()
        .ip_user_rate(tollgate::Rate::per_hour(3))
        .build()
        .unwrap();
    let app = axum::Router::new().route(
        "/login",
        get(|| async { "the login form" })
            .post(|| async { axum::http::StatusCode::UNAUTHORIZED })
            .route_layer(tollgate::login::LoginLayer::header(
                guard,
                http::HeaderName::from_static("x-username"),
            )),
    );
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let send = |method: reqwest::Method| {
        client
            .request(method, format!("http://{addr}/login"))
            .header("x-username", "victim")
            .send()
    };
    for _ in 0..3 {
        assert_eq!(send(reqwest::Method::POST).await.unwrap().status(), 401);
    }
    assert_eq!(send(reqwest::Method::GET).await.unwrap().status(), 200);
    assert_eq!(
        send(reqwest::Method::POST).await.unwrap().status(),
        429,
        "the page load cleared the guesser's failures"
    );
}

/// `LoginLayer::on_refusal` renders every refusal of the layer in the application's own
/// format: a login refused after three failures, and a body too large; a rate-limit layer
/// outside leaves those responses alone, as it leaves its own.
#[tokio::test]
async fn the_login_layers_refusals_take_the_applications_format() {
    use axum::routing::post;
    let guard = LoginGuard::builder()
        .ip_user_rate(Rate::per_hour(3))
        .build()
        .unwrap();
    let layer = tollgate::login::LoginLayer::json_field(guard, "username")
        .max_body_bytes(1024)
        .on_refusal(|refusal| {
            let mut res = refusal.http_response();
            *res.body_mut() = bytes::Bytes::from(format!(
                "{{\"code\":\"{}\",\"app\":\"ours\"}}",
                refusal.kind().as_str()
            ));
            res
        });
    let outer = tollgate::Limiter::builder()
        .policy(tollgate::Policy::new("api", Rate::per_minute(1_000)).unwrap())
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/login",
            post(|| async { (axum::http::StatusCode::UNAUTHORIZED, "no") }),
        )
        .layer(layer)
        .layer(tollgate::RateLimitLayer::new(outer));
    let addr = serve(app).await;
    let client = client_from(90);
    let attempt = |password: String| {
        client
            .post(format!("http://{addr}/login"))
            .json(&serde_json::json!({ "username": "alice", "password": password }))
            .send()
    };
    for _ in 0..3 {
        let res = attempt("guess".into()).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = attempt("guess".into()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    assert!(
        !res.headers().contains_key("ratelimit-remaining"),
        "the outer layer decorated the login refusal: {:?}",
        res.headers()
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body,
        serde_json::json!({"code": "login_refused", "app": "ours"})
    );
    let res = attempt("x".repeat(4096)).await.unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["app"], "ours");
}
