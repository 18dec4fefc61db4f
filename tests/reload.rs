//! Changing limits while the service runs: plan swaps under load through a real axum server,
//! and a plan file watched and reloaded, with broken versions refused.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::store::StoreExt;

use axum::routing::get;
use axum::Router;
use tollgate::clock::ManualClock;
use tollgate::config::{Plan, PlanWatcher};
use tollgate::key::{Global, Key};
use tollgate::store::MemoryStore;
use tollgate::{HeaderStyle, Limiter, Policy, Rate, RateLimitLayer};

fn plan(store: &MemoryStore, varying: u64) -> Limiter<MemoryStore> {
    Limiter::builder()
        .store(store.clone())
        .policy(Policy::new("steady", Rate::per_hour(1_000_000)).unwrap())
        .policy(Policy::new("varying", Rate::per_minute(varying)).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_swaps_under_load_lose_no_request_and_no_count() {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let a = plan(&store, 100_000);
    let b = plan(&store, 200_000);
    let limiter = plan(&store, 100_000);
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::new(limiter.clone())
            .header_style(HeaderStyle::Structured)
            .quota_headers_on_success(true),
    );
    let addr = support::serve(app).await;
    let expected = [
        "\"steady\";q=1000000;w=3600, \"varying\";q=100000;w=60",
        "\"steady\";q=1000000;w=3600, \"varying\";q=200000;w=60",
    ];

    let done = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (limiter, done) = (limiter.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            for i in 0..100 {
                limiter.reload(if i % 2 == 0 { &b } else { &a });
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let client = reqwest::Client::new();
    let mut workers = vec![];
    for _ in 0..4 {
        let (client, done) = (client.clone(), Arc::clone(&done));
        workers.push(tokio::spawn(async move {
            let mut seen = vec![];
            let mut sent = 0u64;
            while !done.load(Ordering::SeqCst) || sent < 50 {
                let res = client.get(format!("http://{addr}/")).send().await.unwrap();
                assert_eq!(res.status(), 200, "no request fails because of a swap");
                seen.push(
                    res.headers()["ratelimit-policy"]
                        .to_str()
                        .unwrap()
                        .to_owned(),
                );
                sent += 1;
            }
            (sent, seen)
        }));
    }
    swapper.await.unwrap();
    let mut total = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for w in workers {
        let (sent, seen) = w.await.unwrap();
        total += sent;
        for s in seen {
            assert!(
                expected.contains(&s.as_str()),
                "a header of neither plan: {s}"
            );
            kinds.insert(s);
        }
    }
    assert_eq!(kinds.len(), 2, "both plans answered requests");
    // The clock never moved: every admitted request is still counted, by both policies.
    let key = Key::global("all");
    for (name, policy) in [
        (
            "steady",
            Policy::new("steady", Rate::per_hour(1_000_000)).unwrap(),
        ),
        (
            "varying",
            Policy::new("varying", Rate::per_minute(200_000)).unwrap(),
        ),
    ] {
        let d = store
            .peek(&key, std::slice::from_ref(&policy), &[0])
            .await
            .unwrap();
        assert_eq!(
            policy.limit() - d.remaining(),
            total,
            "{name}: no count lost across 100 swaps"
        );
    }
}

fn toml(limit: u64) -> String {
    format!(
        "[key]\nkind = \"global\"\n\n[[policies]]\nname = \"api\"\nlimit = {limit}\nwindow = \"1m\"\n\n[default]\npolicies = [\"api\"]\n"
    )
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_plan_file_reloads_and_a_broken_one_is_refused() {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.toml");
    std::fs::write(&path, toml(3)).unwrap();
    let limiter = Limiter::from_config(&Plan::from_file(&path).unwrap()).unwrap();
    let watcher = PlanWatcher::spawn(&path, limiter.clone()).unwrap();
    let key = Key::global("all");
    assert_eq!(limiter.check(&key, 1).await.unwrap().remaining(), 2);

    // A new limit, written in place: in force, and the request already counted stays.
    std::fs::write(&path, toml(5)).unwrap();
    wait_for("the new plan", || limiter.policies()[0].limit() == 5);
    assert_eq!(limiter.check(&key, 1).await.unwrap().remaining(), 3);
    // The plan is in force a moment before the watcher counts it.
    wait_for("the reload counted", || watcher.reloaded() == 1);

    // A broken file (as an editor might leave it half-written): refused, old limits enforced.
    std::fs::write(&path, "[[policies]]\nname = \"api\"\nlimit = ").unwrap();
    wait_for("the refusal", || watcher.refused() >= 1);
    assert!(watcher.last_error().is_some());
    assert_eq!(limiter.policies()[0].limit(), 5);
    for _ in 0..3 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    assert!(!limiter.check(&key, 1).await.unwrap().is_allowed());

    // One that parses but would not be enforced as written: refused too.
    std::fs::write(&path, toml(0)).unwrap();
    wait_for("the second refusal", || watcher.refused() >= 2);
    assert_eq!(limiter.policies()[0].limit(), 5);

    // Replaced by a rename, as deployment tools do: seen and applied.
    let next = dir.join("plan.toml.new");
    std::fs::write(&next, toml(50)).unwrap();
    std::fs::rename(&next, &path).unwrap();
    wait_for("the renamed plan", || limiter.policies()[0].limit() == 50);
    drop(watcher);
    let _ = std::fs::remove_dir_all(&dir);
}

const RESPONSES_PLAN: &str = r#"
retry_after = false
[key]
kind = "global"
[[policies]]
name = "api"
limit = 5
window = "1m"
[default]
policies = ["api"]
"#;

/// A reload puts limits in force; a setting read once, at start (what the layer's responses
/// carry, the store, the failure mode, the login guard), is refused naming the field rather
/// than accepted and left unread. The plan in force stays.
#[tokio::test]
async fn a_reload_refuses_what_is_read_at_start_and_keeps_the_plan_in_force() {
    let v1 = Plan::from_toml(RESPONSES_PLAN).unwrap();
    let built = v1.build().unwrap();
    let limiter = built.limiter().clone();
    for (field, edit) in [
        ("header_style", "header_style = \"structured\"\n"),
        ("quota_headers", "quota_headers = false\n"),
        ("retry_after", "retry_after = true\n"),
        ("failure_mode", "failure_mode = \"fail_open\"\n"),
        ("replicas", "replicas = 2\n"),
        ("store", "[store]\nkind = \"memory\"\nmax_keys = 10\n"),
    ] {
        let base = RESPONSES_PLAN.replace("limit = 5", "limit = 50");
        let base = if field == "retry_after" {
            base.replace("retry_after = false\n", "")
        } else {
            base
        };
        // Top-level settings go first, a table last.
        let text = if edit.starts_with('[') {
            format!("{base}{edit}")
        } else {
            format!("{edit}{base}")
        };
        let next = Plan::from_toml(&text).unwrap();
        let error = limiter.reload_plan(&next).expect_err(field);
        assert_eq!(error.field(), field, "{error}");
        assert!(error.to_string().contains("restart"), "{error}");
        assert_eq!(limiter.policies()[0].limit(), 5, "the plan in force stays");
    }
    // A default written out is the same setting: accepted.
    let explicit = Plan::from_toml(&format!(
        "quota_headers = true\nreplicas = 1\n{RESPONSES_PLAN}"
    ))
    .unwrap();
    limiter
        .reload_plan(&explicit)
        .expect("defaults written out change nothing");
    // A store section is not repeated in the message: its URL may carry a password.
    let secret = Plan::from_toml(&format!(
        "{RESPONSES_PLAN}[store]\nkind = \"memory\"\nmax_keys = 7\n"
    ))
    .unwrap();
    let error = limiter.reload_plan(&secret).unwrap_err();
    assert_eq!(error.field(), "store");
    assert!(!error.to_string().contains("max_keys"), "{error}");
    // The same plan with only its limits changed goes in force, and the layer built at start
    // keeps answering as the plan says (no Retry-After).
    let next = Plan::from_toml(&RESPONSES_PLAN.replace("limit = 5", "limit = 1")).unwrap();
    limiter.reload_plan(&next).unwrap();
    assert_eq!(limiter.policies()[0].limit(), 1);
    let addr = support::serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(built.layer()),
    )
    .await;
    let client = reqwest::Client::new();
    assert_eq!(
        client
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let refused = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().get("retry-after").is_none());
}

/// A plan that starts with an audit error (here `retry_after = false`, TG005) can be reloaded
/// — unchanged, or to change its limits — but a reload that brings a new audit error (a
/// fixed window on a customer-facing route, TG001) is refused.
#[tokio::test]
async fn a_reload_refuses_only_audit_errors_the_plan_in_force_did_not_have() {
    let v1 = Plan::from_toml(RESPONSES_PLAN).unwrap();
    let limiter = Limiter::from_config(&v1).unwrap();
    limiter
        .reload_plan(&v1)
        .expect("the plan in force reloads unchanged");
    let fixed = Plan::from_toml(&RESPONSES_PLAN.replace(
        "window = \"1m\"",
        "window = \"1m\"\nalgorithm = \"fixed_window\"",
    ))
    .unwrap();
    assert!(tollgate::audit(&fixed)
        .findings
        .iter()
        .any(|f| f.rule == "TG001"));
    let error = limiter.reload_plan(&fixed).expect_err("a new audit error");
    assert!(error.to_string().contains("TG001"), "{error}");
}

/// The login guard keys client addresses by `[key]` when `[login]` has no `ip_key` of its
/// own, once, at start: a reload that changes `[key]` (an operator who stops trusting a
/// proxy) would leave the guard believing `X-Forwarded-For`, and is refused naming `key`.
/// With an `ip_key` of its own, `[key]` changes by reload.
#[tokio::test]
async fn a_reload_that_changes_the_key_the_login_guard_reads_is_refused() {
    let plan = |key: &str, ip_key: &str| {
        Plan::from_toml(&format!(
            r#"
{key}
[[policies]]
name = "api"
limit = 100
window = "1m"

[[policies]]
name = "login"
limit = 2
window = "15m"
algorithm = "sliding_window_log"

[default]
policies = ["api"]

[login]
routes = ["POST /login"]
username_field = "username"
ip_username = "login"
ip = "login"
username = "login"
{ip_key}
"#
        ))
        .unwrap()
    };
    let trusting = "[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"127.0.0.0/8\"]\n";
    let peer = "[key]\nkind = \"peer_ip\"\n";
    let limiter = Limiter::from_config(&plan(trusting, "")).unwrap();
    let error = limiter
        .reload_plan(&plan(peer, ""))
        .expect_err("the guard reads [key]");
    assert_eq!(error.field(), "key", "{error}");
    assert!(error.to_string().contains("restart"), "{error}");

    let own = "[login.ip_key]\nkind = \"peer_ip\"\n";
    let limiter = Limiter::from_config(&plan(trusting, own)).unwrap();
    limiter
        .reload_plan(&plan(peer, own))
        .expect("the guard has a key of its own");
}

/// A fresh directory under the system's temporary one, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tollgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Publishes `text` the way the kubelet updates a ConfigMap volume: a new timestamped
/// directory, a `..data_tmp` symlink to it renamed over `..data`, the old directory removed.
/// The plan's own name (`plan.toml -> ..data/plan.toml`) is never touched.
#[cfg(unix)]
fn publish_config_map(dir: &std::path::Path, version: u32, text: &str) {
    use std::os::unix::fs::symlink;
    let versioned = format!("..2026_12_07_{version:02}");
    std::fs::create_dir(dir.join(&versioned)).unwrap();
    std::fs::write(dir.join(&versioned).join("plan.toml"), text).unwrap();
    symlink(&versioned, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if version > 1 {
        let old = format!("..2026_12_07_{:02}", version - 1);
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    } else {
        symlink("..data/plan.toml", dir.join("plan.toml")).unwrap();
    }
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_map_update_reloads_the_plan() {
    let dir = TempDir::new("configmap");
    publish_config_map(&dir.0, 1, &toml(3));
    let path = dir.0.join("plan.toml");
    let limiter = Limiter::from_config(&Plan::from_file(&path).unwrap()).unwrap();
    let watcher = PlanWatcher::spawn(&path, limiter.clone()).unwrap();
    publish_config_map(&dir.0, 2, &toml(7));
    wait_for("the ConfigMap's new plan", || {
        limiter.policies()[0].limit() == 7
    });
    publish_config_map(&dir.0, 3, &toml(9));
    wait_for("the next one", || limiter.policies()[0].limit() == 9);
    wait_for("both reloads counted", || watcher.reloaded() == 2);
    assert_eq!(watcher.refused(), 0);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_plan_reloads_when_its_target_is_edited() {
    let served = TempDir::new("symlinked-served");
    let kept = TempDir::new("symlinked-kept");
    let target = kept.0.join("limits.toml");
    std::fs::write(&target, toml(3)).unwrap();
    let path = served.0.join("plan.toml");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let limiter = Limiter::from_config(&Plan::from_file(&path).unwrap()).unwrap();
    let watcher = PlanWatcher::spawn(&path, limiter.clone()).unwrap();
    std::fs::write(&target, toml(6)).unwrap();
    wait_for("the edited target", || limiter.policies()[0].limit() == 6);
    // Other files changing beside the plan reload nothing.
    for i in 0..3 {
        std::fs::write(served.0.join(format!("other-{i}")), "x").unwrap();
    }
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(watcher.reloaded(), 1);
}

// The file changed between the limiter's build and the watcher's start: the first change seen
// reloads what the file says, even when it writes the same text again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_changed_before_the_watcher_started_is_reloaded_on_the_next_change() {
    let dir = TempDir::new("changed-before-spawn");
    let path = dir.0.join("plan.toml");
    std::fs::write(&path, toml(3)).unwrap();
    let limiter = Limiter::from_config(&Plan::from_file(&path).unwrap()).unwrap();
    std::fs::write(&path, toml(7)).unwrap();
    let _watcher = PlanWatcher::spawn(&path, limiter.clone()).unwrap();
    std::fs::write(&path, toml(7)).unwrap();
    wait_for("the plan written before the watcher", || {
        limiter.policies()[0].limit() == 7
    });
}

/// A reload reaches the limiters made with `for_route` (the policies of routes attached
/// through axum's router): a key denied under attack is denied on those routes too, over
/// HTTP and through the direct API, while each keeps its route's policies. They once kept
/// the lists they were made with, so a deny list added by a reload left them open.
#[tokio::test]
async fn a_reload_reaches_the_lists_of_limiters_made_for_routes() {
    use tollgate::route::Route;
    let store = tollgate::store::MemoryStore::new();
    let tenant = || {
        tollgate::key::from_fn(|req: &tollgate::key::RequestView<'_>| {
            req.headers()
                .get("x-tenant")
                .map(|v| Key::new("tenant", v.as_bytes()))
        })
    };
    let base = Limiter::builder()
        .store(store.clone())
        .default_route(Route::exempt())
        .extractor(tenant())
        .build()
        .unwrap();
    let uploads = || Route::new().policy(Policy::new("uploads", Rate::per_minute(3)).unwrap());
    let attached = base.for_route(uploads()).unwrap();
    let layer = tollgate::RateLimitLayer::new(base.clone());
    let app = Router::new().route(
        "/upload",
        axum::routing::post(|| async { "stored" }).route_layer(layer.for_route(uploads()).unwrap()),
    );
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let upload = |tenant: &'static str| {
        client
            .post(format!("http://{addr}/upload"))
            .header("x-tenant", tenant)
            .send()
    };
    let mallory = Key::new("tenant", "mallory");
    assert!(attached.check(&mallory, 1).await.unwrap().is_allowed());
    assert_eq!(upload("mallory").await.unwrap().status(), 200);

    base.reload(
        &Limiter::builder()
            .store(store.clone())
            .default_route(Route::exempt())
            .extractor(tenant())
            .deny_key(mallory.clone())
            .build()
            .unwrap(),
    );
    assert!(matches!(
        attached.check(&mallory, 1).await,
        Err(tollgate::CheckError::Forbidden)
    ));
    assert_eq!(upload("mallory").await.unwrap().status(), 403);
    // Others keep the route's own policy.
    let alice = Key::new("tenant", "alice");
    for _ in 0..3 {
        assert!(attached.check(&alice, 1).await.unwrap().is_allowed());
    }
    let d = attached.check(&alice, 1).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(
        d.limit(),
        3,
        "the route's policy stays the one it was made with"
    );
}

/// A reservation made before a reload and given back after it gives back nothing to a policy
/// the reload changed: its units were counted under the old window, and giving them back
/// under the old definition rewrote or expired the key's state, so a key refused under the
/// new limit got the whole new limit again. On the memory store and on Redis.
async fn a_give_back_after_a_reload_leaves_a_changed_policy_alone<
    S: tollgate::store::Store + Clone,
>(
    store: S,
) {
    let build = |policy: Policy| {
        Limiter::builder()
            .store(store.clone())
            .policy(policy)
            .build()
            .unwrap()
    };
    let window = |limit: u64, per: Duration| {
        Policy::builder("api", Rate::new(limit, per))
            .algorithm(tollgate::Algorithm::FixedWindow)
            .build()
            .unwrap()
    };
    let limiter = build(window(100, Duration::from_secs(60)));
    let key = Key::new("user", "reloaded");
    let early = limiter.reserve(&key, 10).await.unwrap();
    assert!(early.decision().is_allowed());
    let refunded = limiter.reserve(&key, 10).await.unwrap();
    assert!(refunded.decision().is_allowed());
    let over = limiter.reserve(&key, 10).await.unwrap();
    assert!(over.decision().is_allowed());
    limiter.reload(&build(window(50, Duration::from_secs(3_600))));
    // The key spends the new limit and is refused.
    let mut admitted = 0;
    while limiter.check(&key, 1).await.unwrap().is_allowed() {
        admitted += 1;
        assert!(admitted <= 50, "past the new limit");
    }
    // The requests admitted before the reload end: one settles below its reservation,
    // one is refunded whole, and one settles above it.
    early.settle(0).await.unwrap();
    refunded.refund().await.unwrap();
    over.settle(20).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after = limiter.check(&key, 1).await.unwrap();
    assert!(
        !after.is_allowed(),
        "the key got its new limit again after a give-back under the old policy: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_after_a_reload_leaves_a_changed_policy_alone_memory() {
    a_give_back_after_a_reload_leaves_a_changed_policy_alone(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_after_a_reload_leaves_a_changed_policy_alone_redis() {
    let server = support::RedisServer::start();
    let store = tollgate::store::RedisStore::builder()
        .prefix("reloaded")
        .build_with_url(&server.url())
        .unwrap();
    a_give_back_after_a_reload_leaves_a_changed_policy_alone(store).await;
}

/// A request of a tier ending after a reload is given back under its own tier's policy: a
/// name several tiers define (`share_usage`) is matched by its whole definition, never by
/// the first tier that has the name. Here the reload is of the same plan, so the success the
/// counting rule does not count is refunded as without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiers_request_ending_after_a_reload_is_refunded_under_its_own_tier() {
    use std::convert::Infallible;
    use tollgate::route::{CountWhen, Route};
    use tower::{ServiceBuilder, ServiceExt};

    let store = MemoryStore::new();
    let free = Policy::new("api", Rate::per_minute(2)).unwrap();
    let pro = Policy::new("api", Rate::per_minute(100)).unwrap();
    let build = || {
        Limiter::builder()
            .store(store.clone())
            .default_route(
                Route::new()
                    .policy(free.clone())
                    .tier("pro", [pro.clone()])
                    .count_when(CountWhen::failures()),
            )
            .tier_fn(|req| req.headers().get("x-plan").and_then(|v| v.to_str().ok()))
            .share_usage("api")
            .extractor(tollgate::key::from_fn(|_| Some(Key::new("tenant", "pro"))))
            .build()
            .unwrap()
    };
    let limiter = build();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = Arc::new(std::sync::Mutex::new(Some(released)));
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter.clone()))
        .service_fn(move |_req: http::Request<String>| {
            let wait = released.lock().unwrap().take();
            async move {
                if let Some(wait) = wait {
                    let _ = wait.await;
                }
                Ok::<_, Infallible>(http::Response::new(String::new()))
            }
        });
    let request = http::Request::get("/")
        .header("x-plan", "pro")
        .body(String::new())
        .unwrap();
    let call = tokio::spawn(service.oneshot(request));
    // Admitted and in the handler; the plan is reloaded meanwhile.
    tokio::time::sleep(Duration::from_millis(100)).await;
    limiter.reload(&build());
    release.send(()).unwrap();
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let key = Key::new("tenant", "pro");
    let left = store
        .peek(&key, std::slice::from_ref(&pro), &[1])
        .await
        .unwrap();
    assert_eq!(
        left.remaining(),
        99,
        "the success was not refunded under the pro tier: {left:?}"
    );
}

/// A route attached with `for_route` keeps its policies across a reload, so their names stay
/// taken: a route attached after the reload cannot define one of them differently (two
/// definitions would count under one name). The reload once replaced the names with the new
/// plan's alone, and such a route was accepted.
#[tokio::test]
async fn an_attached_routes_policy_names_stay_taken_after_a_reload() {
    use tollgate::route::Route;
    let store = MemoryStore::new();
    let base = || {
        Limiter::builder()
            .store(store.clone())
            .default_route(Route::exempt())
            .extractor(Global::new())
            .build()
            .unwrap()
    };
    let limiter = base();
    let uploads = |per_minute| {
        Route::new().policy(Policy::new("uploads", Rate::per_minute(per_minute)).unwrap())
    };
    let _attached = limiter.for_route(uploads(3)).unwrap();
    limiter.reload(&base());
    let err = limiter
        .for_route(uploads(300))
        .expect_err("a second definition of \"uploads\" is refused after the reload too");
    assert!(err.to_string().contains("uploads"), "{err}");
    // The same definition is the same policy: still accepted.
    limiter.for_route(uploads(3)).unwrap();
}
