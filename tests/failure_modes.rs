//! Each failure mode holds on every path while the store is down: a plan with penalties,
//! the login guard, a policy with a long name, a request costing more than an instance's
//! share, through the direct API and through HTTP. The store is a Redis store pointed at a
//! loopback port where nothing listens, so every call fails at once.

mod support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::clock::ManualClock;
use tollgate::config::Plan;
use tollgate::key::{Global, Key};
use tollgate::login::LoginGuard;
use tollgate::store::{FailureMode, MemoryStore, RedisStore, ResilientStore};
use tollgate::{DecidedBy, Limiter, Policy, Rate};

use support::{free_port, serve};

/// A Redis store whose every call is refused.
fn dead_redis() -> RedisStore {
    RedisStore::builder()
        .timeout(Duration::from_millis(100))
        .build_with_url(&format!("redis://127.0.0.1:{}", free_port()))
        .unwrap()
}

fn resilient(mode: FailureMode) -> ResilientStore<RedisStore> {
    ResilientStore::builder(dead_redis(), mode).build().unwrap()
}

fn plan_with_penalty(mode: &str, penalty: bool) -> String {
    format!(
        r#"
failure_mode = "{mode}"
replicas = 1
[store]
kind = "redis"
url = "redis://127.0.0.1:{port}"
[key]
kind = "global"
[[policies]]
name = "api"
limit = 3
window = "1m"
{penalty}
[default]
policies = ["api"]
"#,
        port = free_port(),
        penalty = if penalty { "penalty = \"10m\"" } else { "" },
    )
}

/// A policy with a penalty looks for a running block before each check; that look went to
/// the dead store and its error became every request's answer (503), whatever the mode.
#[tokio::test]
async fn a_penalty_keeps_the_failure_mode_through_http_and_the_direct_api() {
    for penalty in [false, true] {
        let built = Plan::from_toml(&plan_with_penalty("fail_open", penalty))
            .unwrap()
            .build()
            .unwrap();
        let d = built.limiter().check(&Key::new("user", "1"), 1).await;
        assert!(
            d.as_ref()
                .is_ok_and(|d| d.is_allowed() && d.decided_by() == DecidedBy::FailOpen),
            "penalty {penalty}: fail open, direct API: {d:?}"
        );
        let addr = serve(
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(built.layer()),
        )
        .await;
        let client = reqwest::Client::new();
        for _ in 0..5 {
            let status = client
                .get(format!("http://{addr}/"))
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(status, 200, "penalty {penalty}: fail open, HTTP");
        }
    }
    // The local fallback limits, and its refusal starts the penalty locally.
    let built = Plan::from_toml(&plan_with_penalty("local_fallback", true))
        .unwrap()
        .build()
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(built.layer()),
    )
    .await;
    let client = reqwest::Client::new();
    let mut statuses = vec![];
    for _ in 0..5 {
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "local fallback with a penalty, limit 3"
    );
    // Fail closed still refuses (a refusal, not an error).
    let built = Plan::from_toml(&plan_with_penalty("fail_closed", true))
        .unwrap()
        .build()
        .unwrap();
    let d = built.limiter().check(&Key::new("user", "1"), 1).await;
    assert!(
        d.as_ref().is_ok_and(|d| !d.is_allowed()),
        "fail closed with a penalty: {d:?}"
    );
}

/// The same through the direct API on a store built in code.
#[tokio::test]
async fn a_penalised_policy_is_limited_by_the_local_fallback() {
    let limiter = Limiter::builder()
        .store(resilient(FailureMode::LocalFallback { replicas: 1 }))
        .policy(
            Policy::builder("api", Rate::per_minute(3))
                .penalty(Duration::from_secs(600))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let mut allowed = vec![];
    for _ in 0..5 {
        allowed.push(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    assert_eq!(allowed, [true, true, true, false, false]);
}

/// The local fallback follows a reload: it divides the policy in force, not the first
/// definition it saw under the name (it kept a share of 100 a minute after a reload to 2).
#[tokio::test]
async fn the_local_fallback_follows_a_reload() {
    let store = resilient(FailureMode::LocalFallback { replicas: 1 });
    let plan = |per_minute| {
        Limiter::builder()
            .store(store.clone())
            .policy(Policy::new("api", Rate::per_minute(per_minute)).unwrap())
            .build()
            .unwrap()
    };
    let limiter = plan(100);
    assert!(limiter
        .check(&Key::new("user", "0"), 1)
        .await
        .unwrap()
        .is_allowed());
    limiter.reload(&plan(2));
    let key = Key::new("user", "1");
    let mut allowed = vec![];
    for _ in 0..3 {
        allowed.push(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    assert_eq!(allowed, [true, true, false]);
}

/// The login guard looks at its other limits after a refusal; that look reached the dead
/// store and the refusal came back as a store error.
#[tokio::test]
async fn the_login_guard_refuses_in_local_fallback_rather_than_failing() {
    let guard = LoginGuard::builder()
        .store(resilient(FailureMode::LocalFallback { replicas: 1 }))
        .ip_user_rate(Rate::per_minute(2))
        .build()
        .unwrap();
    let mut results = vec![];
    for _ in 0..3 {
        let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "alice");
        results.push(guard.check(&attempt).await.map(|d| d.is_allowed()));
    }
    assert!(
        matches!(results[..], [Ok(true), Ok(true), Ok(false)]),
        "three attempts over a limit of 2 in local fallback: {results:?}"
    );
}

/// During an outage the login guard says how its attempts were decided (the failure mode,
/// not `Decided`), a fail-closed refusal is the store's 503 (not a lockout the user did not
/// earn), and once the circuit is open `record_success` fails at once instead of waiting
/// out the store's timeout on every successful login.
#[tokio::test]
async fn the_login_guard_reports_the_failure_mode_and_skips_an_open_circuit() {
    // A store that fails open: the guard fails closed unless told otherwise.
    for (mode, guard_mode, outcome) in [
        (
            FailureMode::FailOpen,
            Some(FailureMode::FailOpen),
            DecidedBy::FailOpen,
        ),
        (FailureMode::FailOpen, None, DecidedBy::FailClosed),
        (
            FailureMode::LocalFallback { replicas: 1 },
            None,
            DecidedBy::Fallback,
        ),
        (FailureMode::FailClosed, None, DecidedBy::FailClosed),
    ] {
        let store = ResilientStore::builder(dead_redis(), mode)
            .circuit_breaker(1, Duration::from_secs(60))
            .build()
            .unwrap();
        let mut builder = LoginGuard::builder().store(store);
        if let Some(guard_mode) = guard_mode {
            builder = builder.failure_mode(guard_mode);
        }
        let guard = builder.build().unwrap();
        let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.7"), "alice");
        let decision = guard.check(&attempt).await.unwrap();
        assert_eq!(
            decision.decision().decided_by(),
            outcome,
            "{mode:?}, {guard_mode:?}"
        );
        if outcome == DecidedBy::FailClosed {
            let refusal = decision.refusal().expect("fail closed refuses");
            assert_eq!(refusal.status(), 503, "{mode:?}");
            assert_eq!(refusal.kind(), tollgate::RefusalKind::StoreUnavailable);
        } else {
            assert!(decision.is_allowed(), "{mode:?}");
        }
        // The circuit opened at the first failure: the success's reset is not attempted.
        let error = guard.record_success(&attempt).await.unwrap_err();
        assert!(
            matches!(
                error,
                tollgate::CheckError::Store(tollgate::StoreError::CircuitOpen)
            ),
            "{mode:?}: {error:?}"
        );
    }
}

/// A store whose looks fail while its checks answer: one node of a partial outage.
#[derive(Debug)]
struct PeeksFail(MemoryStore);

impl tollgate::store::Store for PeeksFail {
    type CheckFuture = <MemoryStore as tollgate::store::Store>::CheckFuture;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        self.0.check(key, policies, costs)
    }

    fn apply(
        &self,
        key: &Key,
        policies: &[Policy],
        op: tollgate::store::Op,
    ) -> tollgate::store::ApplyFuture {
        if matches!(op, tollgate::store::Op::Peek { .. }) {
            return Box::pin(std::future::ready(Err(tollgate::StoreError::Timeout)));
        }
        self.0.apply(key, policies, op)
    }

    fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }

    fn name(&self) -> &'static str {
        "peeks_fail"
    }
}

/// A login refused by the store for an earned lockout stays that lockout when the looks at
/// the other limits (only there to make `Retry-After` cover every exhausted one) fail or
/// are answered by a failure mode: it was an error, or a 503 under `FailClosed`.
#[tokio::test]
async fn an_earned_login_lockout_stands_when_looking_at_the_other_limits_fails() {
    async fn locked_out<S: tollgate::store::Store>(store: S) -> tollgate::login::LoginDecision {
        let guard = LoginGuard::builder()
            .store(store)
            .ip_user_rate(Rate::per_minute(1))
            .build()
            .unwrap();
        let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.9"), "alice");
        assert!(guard.check(&attempt).await.unwrap().is_allowed());
        guard.record_failure(&attempt).await.unwrap();
        guard
            .check(&attempt)
            .await
            .expect("the store decided the refusal")
    }
    let plain = locked_out(PeeksFail(MemoryStore::new())).await;
    let closed = locked_out(
        ResilientStore::builder(PeeksFail(MemoryStore::new()), FailureMode::FailClosed)
            .circuit_breaker(100, Duration::from_secs(60))
            .build()
            .unwrap(),
    )
    .await;
    for decision in [plain, closed] {
        assert_eq!(decision.decision().decided_by(), DecidedBy::Decided);
        let refusal = decision.refusal().expect("locked out");
        assert_eq!(refusal.status(), 429);
        assert_eq!(refusal.kind(), tollgate::RefusalKind::LoginRefused);
        let retry = decision.retry_after().unwrap();
        assert!(
            retry > Duration::from_secs(50) && retry <= Duration::from_secs(60),
            "{retry:?}"
        );
    }
}

/// A fallback policy is named after its policy with a suffix; for a name near the 64
/// characters a user's may have, building it failed and the fallback silently used the
/// whole limit instead of each instance's share.
#[tokio::test]
async fn the_local_fallback_divides_the_limit_whatever_the_policy_name() {
    for name in ["api".to_owned(), "a".repeat(64)] {
        let limiter = Limiter::builder()
            .store(resilient(FailureMode::LocalFallback { replicas: 4 }))
            .policy(Policy::new(name.clone(), Rate::per_minute(8)).unwrap())
            .extractor(Global::new())
            .build()
            .unwrap();
        let key = Key::new("user", "1");
        let mut admitted = 0;
        for _ in 0..10 {
            if limiter.check(&key, 1).await.unwrap().is_allowed() {
                admitted += 1;
            }
        }
        assert_eq!(
            admitted,
            2,
            "a name of {} characters: 8 / 4 replicas",
            name.len()
        );
    }
    // And the login guard's (its names carry a suffix too).
    for name in ["login".to_owned(), "g".repeat(48)] {
        let guard = LoginGuard::builder()
            .store(resilient(FailureMode::LocalFallback { replicas: 4 }))
            .name(name.clone())
            .ip_user_rate(Rate::per_minute(8))
            .ip_rate(Rate::per_minute(100))
            .user_rate(Rate::per_minute(100))
            .build()
            .unwrap();
        let mut admitted = 0;
        for _ in 0..10 {
            let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "alice");
            if guard.check(&attempt).await.unwrap().is_allowed() {
                admitted += 1;
                guard.record_failure(&attempt).await.unwrap();
            }
        }
        assert_eq!(admitted, 2, "a guard named with {} characters", name.len());
    }
}

/// A request costing more than an instance's share was clamped to the share and charged
/// that much: with a limit of 8 over 4 replicas (a share of 2), every window admitted a
/// request of 5. It is now admitted only while the share is untouched and the rest is a
/// debt paid back at the share's rate: over any span an instance serves at most its share
/// per window plus one window's (the sliding window counter's bound) and one overshoot.
#[tokio::test]
async fn a_request_costing_more_than_the_share_is_paid_back_at_the_share_rate() {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = ResilientStore::builder(dead_redis(), FailureMode::LocalFallback { replicas: 4 })
        .clock(clock.clone())
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::new("api", Rate::per_minute(8)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let minutes = 10;
    let mut served = 0;
    let mut admissions = 0;
    for _ in 0..minutes * 6 {
        if limiter.check(&key, 5).await.unwrap().is_allowed() {
            served += 5;
            admissions += 1;
        }
        clock.advance(Duration::from_secs(10));
    }
    // Share 2 a minute: (10 + 1) * 2 + 3 = 25 at most; the debt of 3 takes 1.5 minutes to
    // pay, so a request of 5 passes about every 2.5 minutes.
    assert!(
        served <= (minutes + 1) * 2 + 3,
        "{served} units served in {minutes} minutes at a share of 2 a minute"
    );
    assert!(
        admissions >= 3,
        "a costly request still passes once its debt is paid: {admissions} admissions"
    );
}

/// A local fallback of 0 replicas is refused when built, in code as in a plan.
#[test]
fn a_local_fallback_of_no_replicas_is_refused_when_built() {
    let store = ResilientStore::builder(
        MemoryStore::new(),
        FailureMode::LocalFallback { replicas: 0 },
    )
    .build();
    let error = store.expect_err("replicas 0 is refused").to_string();
    assert!(error.contains("failure_mode"), "{error}");
    let policy = Policy::builder("api", Rate::per_minute(10))
        .failure_mode(FailureMode::LocalFallback { replicas: 0 })
        .build();
    let error = policy.expect_err("replicas 0 is refused").to_string();
    assert!(error.contains("failure_mode"), "{error}");
}

/// While the store is down, the local fallback charges what it admits and takes back what
/// is given back: a reservation settled below its estimate, a login attempt that succeeded
/// or that a later limit refused. (Sending no give-back at all for a request the fallback
/// admitted turned an outage into every estimate charged in full, and an office's logins
/// into failures.)
#[tokio::test]
async fn the_local_fallback_takes_back_what_is_given_back_during_an_outage() {
    let limiter = Limiter::builder()
        .store(resilient(FailureMode::LocalFallback { replicas: 1 }))
        .policy(Policy::new("tokens", Rate::per_minute(1_000)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", "acme");
    for round in 0..3 {
        let r = limiter.reserve(&key, 600).await.unwrap();
        assert!(
            r.decision().is_allowed(),
            "round {round}: {:?}",
            r.decision()
        );
        assert_eq!(r.decision().decided_by(), DecidedBy::Fallback);
        r.settle(1).await.unwrap();
    }

    // Six people behind one address log in (only failures count: three an address).
    let guard = LoginGuard::builder()
        .store(resilient(FailureMode::LocalFallback { replicas: 1 }))
        .ip_rate(Rate::per_minute(3))
        .build()
        .unwrap();
    for i in 0..6 {
        let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.7"), &format!("user{i}"));
        assert!(
            guard.check(&attempt).await.unwrap().is_allowed(),
            "user {i}"
        );
        guard.record_success(&attempt).await.ok();
    }

    // Attempts a later limit refused charge none of the earlier ones.
    let guard = LoginGuard::builder()
        .store(resilient(FailureMode::LocalFallback { replicas: 1 }))
        .ip_rate(Rate::per_minute(3))
        .user_rate(Rate::per_minute(1))
        .build()
        .unwrap();
    let ip = || Key::new("ip", "192.0.2.8");
    let answers: Vec<bool> = {
        let mut out = vec![];
        for _ in 0..3 {
            let bob = guard.attempt_with_ip_key(ip(), "bob");
            out.push(guard.check(&bob).await.unwrap().is_allowed());
        }
        out
    };
    assert_eq!(answers, [true, false, false], "bob's user limit is 1");
    let carol = guard.attempt_with_ip_key(ip(), "carol");
    assert!(
        guard.check(&carol).await.unwrap().is_allowed(),
        "the address was charged once, by bob's first attempt"
    );
}

/// A store that answers looks but fails every charge (full, or a read-only replica after a
/// failover).
#[derive(Debug, Clone)]
struct LooksOnly(MemoryStore);

impl tollgate::store::Store for LooksOnly {
    type CheckFuture =
        tollgate::store::BoxFuture<Result<tollgate::Decision, tollgate::error::StoreError>>;

    fn check(&self, _: &Key, _: &[Policy], _: &[u64]) -> Self::CheckFuture {
        Box::pin(std::future::ready(Err(
            tollgate::error::StoreError::Timeout,
        )))
    }

    fn apply(
        &self,
        key: &Key,
        policies: &[Policy],
        op: tollgate::store::Op,
    ) -> tollgate::store::ApplyFuture {
        match op {
            op @ tollgate::store::Op::Peek { .. } => self.0.apply(key, policies, op),
            _ => Box::pin(std::future::ready(Err(
                tollgate::error::StoreError::Timeout,
            ))),
        }
    }

    fn now_millis(&self) -> u64 {
        tollgate::store::Store::now_millis(&self.0)
    }

    fn name(&self) -> &'static str {
        "looks-only"
    }
}

/// The look a penalty makes before each check succeeds while every check fails: the looks
/// must not keep the circuit closed (each request would pay a failing call for ever).
#[tokio::test]
async fn looks_that_succeed_do_not_keep_the_circuit_closed() {
    let store = ResilientStore::builder(LooksOnly(MemoryStore::new()), FailureMode::FailOpen)
        .circuit_breaker(3, Duration::from_secs(60))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(
            Policy::builder("api", Rate::per_minute(100))
                .penalty(Duration::from_secs(60))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let mut outcomes = vec![];
    for _ in 0..10 {
        outcomes.push(limiter.check(&key, 1).await.unwrap().decided_by());
    }
    assert!(
        outcomes.iter().all(|o| *o == DecidedBy::FailOpen),
        "{outcomes:?}"
    );
    // Three failed checks open the circuit: the store is no longer asked.
    assert!(limiter.store().is_circuit_open());
}

// A policy's own failure mode is read by `ResilientStore` alone: on any other store nothing
// would read it, and a payments policy declared fail-closed (or fail-open) would answer 503
// whatever it says. Refused when built, through the builder and `for_route`.
#[tokio::test]
async fn a_policy_failure_mode_no_store_reads_is_refused_when_built() {
    let payments = || {
        Policy::builder("payments", Rate::per_minute(10))
            .failure_mode(FailureMode::FailOpen)
            .build()
            .unwrap()
    };
    for built in [
        Limiter::builder()
            .store(MemoryStore::new())
            .policy(payments())
            .build()
            .map(|_| ()),
        Limiter::builder()
            .store(dead_redis())
            .policy(payments())
            .build()
            .map(|_| ()),
    ] {
        let err = built.expect_err("nothing reads the failure mode");
        assert_eq!(err.field(), "policies[\"payments\"].failure_mode", "{err}");
        assert!(err.to_string().contains("ResilientStore"), "{err}");
    }
    // On a route attached later too.
    let plain = Limiter::builder()
        .store(MemoryStore::new())
        .policy(Policy::new("api", Rate::per_minute(10)).unwrap())
        .build()
        .unwrap();
    let err = plain
        .for_route(tollgate::route::Route::new().policy(payments()))
        .expect_err("nothing reads the failure mode");
    assert_eq!(err.field(), "policies[\"payments\"].failure_mode");

    // A store that applies failure modes reads it, also behind `DynStore`.
    let limiter = Limiter::builder()
        .store(resilient(FailureMode::FailClosed))
        .policy(payments())
        .build()
        .unwrap();
    let answer = limiter.check(&Key::new("user", "1"), 1).await.unwrap();
    assert!(answer.is_allowed(), "the policy's own fail-open applies");
    assert_eq!(answer.decided_by(), DecidedBy::FailOpen);
    let erased = tollgate::store::DynStore::new(resilient(FailureMode::FailClosed));
    assert!(Limiter::builder()
        .store(erased)
        .policy(payments())
        .build()
        .is_ok());
    // So does a wrapper of the user's own that forwards nothing but the trait's required
    // methods, around a `ResilientStore`: the mode stays its policy's.
    let wrapped = Limiter::builder()
        .store(Wrapper(resilient(FailureMode::FailClosed)))
        .policy(payments())
        .build()
        .unwrap();
    let answer = wrapped.check(&Key::new("user", "2"), 1).await.unwrap();
    assert_eq!(answer.decided_by(), DecidedBy::FailOpen);
}

/// A store of the user's own around another, written as the `store` module's example is.
#[derive(Debug, Clone)]
struct Wrapper<S>(S);

impl<S: tollgate::store::Store> tollgate::store::Store for Wrapper<S> {
    type CheckFuture = S::CheckFuture;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        self.0.check(key, policies, costs)
    }

    fn apply(
        &self,
        key: &Key,
        policies: &[Policy],
        op: tollgate::store::Op,
    ) -> tollgate::store::ApplyFuture {
        self.0.apply(key, policies, op)
    }

    fn override_store(&self) -> Option<&dyn tollgate::store::OverrideStore> {
        self.0.override_store()
    }

    fn now_millis(&self) -> u64 {
        self.0.now_millis()
    }

    fn name(&self) -> &'static str {
        "wrapper"
    }
}

/// Instance `a` behind a proxy that can be cut, in local fallback with `replicas`; instance
/// `b` straight to the same Redis (an operator's admin API elsewhere).
async fn two_instances(
    server: &support::RedisServer,
    replicas: u32,
    policy: Policy,
) -> (
    support::proxy::Proxy,
    Limiter<ResilientStore<RedisStore>>,
    Limiter<RedisStore>,
) {
    let proxy = support::proxy::Proxy::start(server.port()).await;
    let via_proxy = RedisStore::builder()
        .prefix("ovr")
        .build_with_url(&proxy.url())
        .unwrap();
    let store = ResilientStore::builder(via_proxy, FailureMode::LocalFallback { replicas })
        .timeout(Duration::from_millis(300))
        .circuit_breaker(1_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let a = Limiter::builder()
        .store(store)
        .policy(policy.clone())
        .build()
        .unwrap();
    let direct = RedisStore::builder()
        .prefix("ovr")
        .build_with_url(&server.url())
        .unwrap();
    let b = Limiter::builder()
        .store(direct)
        .policy(policy)
        .build()
        .unwrap();
    (proxy, a, b)
}

/// Checks `key` on `limiter` until it is answered by the store again (or gives up).
async fn until_decided(limiter: &Limiter<ResilientStore<RedisStore>>, key: &Key) {
    for _ in 0..100 {
        if limiter
            .peek(key)
            .await
            .is_ok_and(|d| d.decided_by() == DecidedBy::Decided)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the store never answered again");
}

// An abusive tenant lowered from the plan's 1 000 an hour to 5 by an override set on another
// instance. Once this instance's store answered one of its requests (showing the limit in
// force), an outage must not give the tenant the plan's limit back: the local fallback keeps
// the override, at its share.
#[tokio::test]
async fn the_local_fallback_keeps_an_override_set_on_another_instance() {
    let server = support::RedisServer::start();
    let api = Policy::new("api", Rate::per_hour(1_000)).unwrap();
    let (proxy, a, b) = two_instances(&server, 1, api).await;
    let key = Key::new("tenant", "abusive");
    assert!(a.check(&key, 1).await.unwrap().is_allowed()); // before the override
    b.set_override(&key, tollgate::Override::new("api", 5))
        .await
        .unwrap();
    let seen = a.check(&key, 1).await.unwrap();
    assert_eq!((seen.limit(), seen.decided_by()), (5, DecidedBy::Decided));
    // The fallback reads the override off the request path.
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut();
    let mut admitted = 0;
    let mut last = None;
    for _ in 0..50 {
        let d = a.check(&key, 1).await.unwrap();
        assert_eq!(d.decided_by(), DecidedBy::Fallback);
        admitted += u32::from(d.is_allowed());
        last = Some(d);
    }
    assert_eq!(
        last.unwrap().limit(),
        5,
        "the fallback shows the limit in force"
    );
    // The fallback counts from the outage on: at most the override's 5 in its window.
    assert!(
        admitted <= 5,
        "{admitted} admitted during the outage past an override of 5"
    );

    // Removed elsewhere and seen by an answer: the next outage limits at the plan's again.
    proxy.heal();
    until_decided(&a, &key).await;
    b.remove_override(&key, "api").await.unwrap();
    let seen = a.check(&key, 1).await.unwrap();
    assert_eq!(seen.limit(), 1_000);
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut();
    let d = a.check(&key, 1).await.unwrap();
    assert_eq!((d.limit(), d.decided_by()), (1_000, DecidedBy::Fallback));
    assert!(d.is_allowed());
}

// With replicas, the fallback keeps the override's share, as it does the plan's limits; an
// override set through the instance itself is followed from its next answer.
#[tokio::test]
async fn the_local_fallback_divides_an_override_among_replicas() {
    let server = support::RedisServer::start();
    let api = Policy::new("api", Rate::per_hour(1_000)).unwrap();
    let (proxy, a, _b) = two_instances(&server, 4, api).await;
    let key = Key::new("tenant", "big");
    a.set_override(&key, tollgate::Override::new("api", 40))
        .await
        .unwrap();
    assert_eq!(a.check(&key, 1).await.unwrap().limit(), 40);
    let admitted = admitted_in_outage(&proxy, &a, &key, 30, 10).await;
    // The request the store admitted was counted by the fallback too.
    assert_eq!(
        admitted, 9,
        "the instance's share of an override of 40 among 4"
    );
}

// A policy name near the 64-character limit: the fallback's share is named longer than a
// user's name may be, and its override's share must be too.
#[tokio::test]
async fn the_local_fallback_keeps_an_override_of_a_long_named_policy() {
    let server = support::RedisServer::start();
    let name = "p".repeat(60);
    let policy = Policy::new(name.as_str(), Rate::per_hour(1_000)).unwrap();
    let (proxy, a, b) = two_instances(&server, 1, policy).await;
    let key = Key::new("tenant", "abusive");
    b.set_override(&key, tollgate::Override::new(name.as_str(), 5))
        .await
        .unwrap();
    assert_eq!(a.check(&key, 1).await.unwrap().limit(), 5);
    let admitted = admitted_in_outage(&proxy, &a, &key, 20, 5).await;
    assert_eq!(admitted, 4, "the override's 5, one used before the outage");
}

/// Lets the fallback read the key's overrides, cuts the link, and checks `key` `n` times:
/// each decided by the fallback at `limit`. Answers how many were admitted.
async fn admitted_in_outage(
    proxy: &support::proxy::Proxy,
    a: &Limiter<ResilientStore<RedisStore>>,
    key: &Key,
    n: usize,
    limit: u64,
) -> u32 {
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut();
    let mut admitted = 0;
    for _ in 0..n {
        let d = a.check(key, 1).await.unwrap();
        assert_eq!((d.limit(), d.decided_by()), (limit, DecidedBy::Fallback));
        admitted += u32::from(d.is_allowed());
    }
    admitted
}

// An override that slows a token bucket's refill and keeps its burst shows in no answer's
// limit (the burst): set through the instance, it is read at the key's next answer anyway.
#[tokio::test]
async fn the_local_fallback_keeps_a_rate_only_override_set_through_it() {
    let server = support::RedisServer::start();
    let bucket = Policy::builder("bucket", Rate::per_minute(600).with_burst(10))
        .algorithm(tollgate::Algorithm::TokenBucket)
        .build()
        .unwrap();
    let (proxy, a, _b) = two_instances(&server, 1, bucket).await;
    let key = Key::new("tenant", "slow");
    a.set_override(&key, tollgate::Override::new("bucket", 6).burst(10))
        .await
        .unwrap();
    assert_eq!(a.check(&key, 1).await.unwrap().limit(), 10);
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut();
    // Drained during the outage, then one second: 6 a minute refills 0.1 of a request.
    while a.check(&key, 1).await.unwrap().is_allowed() {}
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut admitted = 0;
    for _ in 0..10 {
        let d = a.check(&key, 1).await.unwrap();
        assert_eq!(d.decided_by(), DecidedBy::Fallback);
        admitted += u32::from(d.is_allowed());
    }
    assert!(
        admitted <= 1,
        "{admitted} admitted in a second at an override of 6 a minute"
    );
}

// A charge that times out during a stall may still reach Redis when it heals and take its
// slot; nobody holds it (the request was decided by the failure mode and has ended), so it
// must be released rather than block the key for the whole lease (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_taken_by_a_charge_that_timed_out_in_a_stall_is_released() {
    for mode in [
        FailureMode::FailOpen,
        FailureMode::FailClosed,
        FailureMode::LocalFallback { replicas: 1 },
    ] {
        let server = support::RedisServer::start();
        let proxy = support::proxy::Proxy::start(server.port()).await;
        let store = behind_proxy(&proxy, mode);
        let limiter = Limiter::builder()
            .store(store)
            .policy(Policy::in_flight("running", 1).unwrap())
            .build()
            .unwrap();
        let key = Key::new("job", "k");
        drop(limiter.acquire(&Key::new("job", "warm")).await.unwrap());
        proxy.hold();
        let permit = limiter.acquire(&key).await.unwrap();
        assert_ne!(permit.decided_by(), DecidedBy::Decided, "{mode:?}");
        drop(permit);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        proxy.release();
        // The stalled charge lands, then its release (retried until the store answers).
        let mut held = u64::MAX;
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            held = server
                .query(&["ZCARD", "tollgate:{job:k}:running:inf"])
                .unwrap();
            if held == 0 {
                break;
            }
        }
        assert_eq!(held, 0, "{mode:?}: a slot nobody holds is left in Redis");
    }
}

/// Every call of `cmd` that reached Redis: executed (failed or not) or rejected (OOM).
fn all_calls(server: &support::RedisServer, cmd: &str) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]).unwrap();
    let prefix = format!("cmdstat_{cmd}:");
    let Some(line) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else {
        return 0;
    };
    line.split(',')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| matches!(*k, "calls" | "rejected_calls"))
        .map(|(_, v)| v.trim().parse::<u64>().unwrap())
        .sum()
}

fn charges(server: &support::RedisServer) -> u64 {
    all_calls(server, "evalsha") + all_calls(server, "eval")
}

/// A full Redis (maxmemory, noeviction) refuses every charge (the script's writes are
/// OOM) but runs `UNLINK`: resets that succeed (the login guard's `record_success` ends with
/// one) must not keep the circuit closed while every check fails.
#[tokio::test]
async fn resets_that_succeed_do_not_keep_the_circuit_closed() {
    let server = support::RedisServer::start();
    let redis = RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .build_with_url(&server.url())
        .unwrap();
    let store = ResilientStore::builder(redis, FailureMode::FailOpen)
        .circuit_breaker(3, Duration::from_secs(60))
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(
            Policy::builder("api", Rate::per_minute(1_000))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let d = limiter.check(&key, 1).await.unwrap();
    assert_eq!(d.decided_by(), DecidedBy::Decided, "healthy at first");
    let _: () = server.query(&["CONFIG", "SET", "maxmemory", "1"]).unwrap();
    let _: () = server
        .query(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .unwrap();
    let before = charges(&server);
    let mut resets_ok = 0;
    for _ in 0..10 {
        let d = limiter.check(&key, 1).await.unwrap();
        assert_eq!(
            d.decided_by(),
            DecidedBy::FailOpen,
            "the full store fails charges"
        );
        if limiter.reset(&key).await.is_ok() {
            resets_ok += 1;
        }
    }
    let reached = charges(&server) - before;
    eprintln!(
        "resets that succeeded: {resets_ok}/10; charges that reached the full Redis: {reached}"
    );
    assert!(
        reached <= 3,
        "threshold 3: the circuit should open after 3 consecutive failed charges, yet {reached} charges reached Redis ({resets_ok} resets succeeded in between)"
    );
}

// The stated bound for an outage longer than an in-flight lease: the slot of a request that
// runs through it expires, so after the outage one limit's worth more may start, and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_slot_lease_lets_at_most_one_limit_more_start() {
    let server = support::RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port()).await;
    let store = behind_proxy(&proxy, FailureMode::FailClosed);
    let running = Policy::builder("running", Rate::new(1, Duration::from_millis(300)))
        .algorithm(tollgate::Algorithm::InFlight)
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(running)
        .build()
        .unwrap();
    let key = Key::new("job", "long");
    let first = limiter.acquire(&key).await.unwrap();
    assert_eq!(first.decided_by(), DecidedBy::Decided);
    assert!(
        !limiter.acquire(&key).await.unwrap().is_allowed(),
        "one at a time"
    );
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    proxy.heal();
    // The first request still runs; its slot expired during the outage.
    let mut second = None;
    for _ in 0..100 {
        let p = limiter.acquire(&key).await.unwrap();
        if p.decided_by() == DecidedBy::Decided {
            second = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = second.expect("the store answers again");
    assert!(
        second.is_allowed(),
        "the bound: one limit's worth more may start"
    );
    let third = limiter.acquire(&key).await.unwrap();
    assert!(!third.is_allowed(), "and no more than one limit's worth");
    drop((first, second));
}

/// A Redis store behind `proxy` (which can cut or hold the link) in `mode`, with short
/// timeouts and a breaker that opens after two failures for 300 ms.
fn behind_proxy(proxy: &support::proxy::Proxy, mode: FailureMode) -> ResilientStore<RedisStore> {
    let redis = RedisStore::builder()
        .timeout(Duration::from_millis(100))
        .build_with_url(&proxy.url())
        .unwrap();
    ResilientStore::builder(redis, mode)
        .timeout(Duration::from_millis(50))
        .circuit_breaker(2, Duration::from_millis(300))
        .build()
        .unwrap()
}

// Over HTTP, through the login layer: a fail-closed outage answers the store's 503 (not a
// lockout); so does a store that fails open, unless the guard opts in to failing open (an
// outage an attacker causes must not open logins to guessing); a guard that opts in lets the
// attempt reach the handler.
#[tokio::test]
async fn the_login_layer_answers_a_fail_closed_outage_with_503() {
    for (mode, guard_mode, status) in [
        (FailureMode::FailClosed, None, 503),
        (FailureMode::FailOpen, None, 503),
        (FailureMode::FailOpen, Some(FailureMode::FailOpen), 200),
    ] {
        let mut builder = LoginGuard::builder().store(resilient(mode));
        if let Some(guard_mode) = guard_mode {
            builder = builder.failure_mode(guard_mode);
        }
        let guard = builder.build().unwrap();
        let app = Router::new().route(
            "/login",
            axum::routing::post(|| async { "welcome" })
                .layer(tollgate::login::LoginLayer::json_field(guard, "username")),
        );
        let addr = serve(app).await;
        let res = reqwest::Client::new()
            .post(format!("http://{addr}/login"))
            .json(&serde_json::json!({ "username": "alice", "password": "x" }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), status, "{mode:?}, the guard's {guard_mode:?}");
        if status == 503 {
            let body: serde_json::Value = res.json().await.unwrap();
            assert_eq!(body["error"], "rate_limiter_unavailable", "{body}");
        }
    }
}

/// Two definitions of one name that differ in their failure mode alone are two policies, and
/// one name is one policy: refused when built. They once counted as the same, and during an
/// outage one route failed closed and the other open for the same key and counter.
#[test]
fn one_name_with_two_failure_modes_is_refused() {
    use tollgate::route::Route;
    let api = |mode| {
        Policy::builder("api", Rate::per_minute(10))
            .failure_mode(mode)
            .build()
            .unwrap()
    };
    let err = Limiter::builder()
        .store(resilient(FailureMode::FailOpen))
        .policy(api(FailureMode::FailClosed))
        .route("/open", Route::new().policy(api(FailureMode::FailOpen)))
        .build()
        .expect_err("one name, two failure modes");
    assert!(err.field().ends_with(".name"), "{err}");
    assert!(err.to_string().contains("FailOpen"), "{err}");
}

/// A cost above a policy's whole capacity is refused as such during an outage too, charging
/// nothing: the local fallback clamps only a cost above this instance's share. Through the
/// direct API, with a penalty that a rate-limit denial would start.
#[tokio::test]
async fn a_cost_above_the_capacity_is_refused_as_such_by_the_local_fallback() {
    let limiter = Limiter::builder()
        .store(resilient(FailureMode::LocalFallback { replicas: 2 }))
        .policy(
            Policy::builder("api", Rate::per_minute(100))
                .penalty(Duration::from_secs(600))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    for cost in [101, u64::MAX] {
        match limiter.check(&key, cost).await {
            Err(tollgate::CheckError::CostExceedsCapacity { capacity, .. }) => {
                assert_eq!(capacity, 100)
            }
            other => panic!("cost {cost}: {other:?}"),
        }
    }
    // Nothing charged, no penalty: the instance's share (50) is whole.
    let d = limiter.check(&key, 50).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.decided_by(), DecidedBy::Fallback);
}

/// A denial for a cost above the capacity is never cached: the same cost asked again within
/// the deny cache's life is refused as `CostExceedsCapacity` again, not as a rate-limit
/// denial that a penalty would punish with a lockout.
#[tokio::test]
async fn a_cost_above_the_capacity_is_not_answered_from_the_deny_cache() {
    let store = ResilientStore::builder(MemoryStore::new(), FailureMode::FailClosed)
        .deny_cache(100)
        .build()
        .unwrap();
    let limiter = Limiter::builder()
        .store(store)
        .policy(
            Policy::builder("api", Rate::per_minute(3))
                .penalty(Duration::from_secs(600))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    for _ in 0..3 {
        match limiter.check(&key, 4).await {
            Err(tollgate::CheckError::CostExceedsCapacity { capacity: 3, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    let d = limiter.check(&key, 1).await.unwrap();
    assert!(d.is_allowed(), "no penalty started: {d:?}");
}

/// An in-flight refusal the store answers because other instances hold the slots takes
/// nothing from this instance's fallback share: once the store is down, the fallback admits
/// up to its share.
#[tokio::test]
async fn slots_held_elsewhere_leave_the_fallback_share_whole() {
    let mut server = support::RedisServer::start();
    let redis = || {
        RedisStore::builder()
            .prefix("slots-elsewhere")
            .timeout(Duration::from_millis(200))
            .build_with_url(&server.url())
            .unwrap()
    };
    let running = Policy::in_flight("running", 2).unwrap();
    let other = Limiter::builder()
        .store(redis())
        .policy(running.clone())
        .build()
        .unwrap();
    let this = Limiter::builder()
        .store(
            ResilientStore::builder(redis(), FailureMode::LocalFallback { replicas: 2 })
                .build()
                .unwrap(),
        )
        .policy(running)
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let held = [
        other.acquire(&key).await.unwrap(),
        other.acquire(&key).await.unwrap(),
    ];
    for _ in 0..3 {
        let refused = this.acquire(&key).await.unwrap();
        assert!(!refused.is_allowed());
        assert_eq!(refused.decided_by(), DecidedBy::Decided);
    }
    server.kill();
    let permit = this.acquire(&key).await.unwrap();
    assert!(
        permit.is_allowed(),
        "the fallback's share of one: {:?}",
        *permit
    );
    assert_eq!(permit.decided_by(), DecidedBy::Fallback);
    drop(held);
}

/// With the circuit open, a check answered by the local fallback takes its slot when first
/// polled: one dropped before that (a caller that gave up, a `select!` another branch won)
/// holds nothing, and the instance's share stays whole.
#[tokio::test]
async fn a_fallback_check_dropped_before_its_first_poll_holds_no_slot() {
    use tollgate::store::Store;
    let store = ResilientStore::builder(dead_redis(), FailureMode::LocalFallback { replicas: 1 })
        .circuit_breaker(1, Duration::from_secs(600))
        .build()
        .unwrap();
    let running = Policy::in_flight("running", 1).unwrap();
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(running.clone())
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    // The first call fails and opens the circuit; its slot is given back with the permit.
    drop(limiter.acquire(&key).await.unwrap());
    for _ in 0..3 {
        drop(store.check(&key, std::slice::from_ref(&running), &[1]));
    }
    let permit = limiter.acquire(&key).await.unwrap();
    assert!(permit.is_allowed(), "{:?}", *permit);
    assert_eq!(permit.decided_by(), DecidedBy::Fallback);
}

/// A shaping policy admits a cost beyond its capacity by waiting, and the local fallback
/// does too: only a cost past what shaping admits is refused as never fitting.
#[tokio::test]
async fn the_local_fallback_admits_what_shaping_admits_beyond_the_capacity() {
    let limiter = Limiter::builder()
        .store(resilient(FailureMode::LocalFallback { replicas: 1 }))
        .policy(
            Policy::builder("smooth", Rate::per_second(10))
                .algorithm(tollgate::Algorithm::Gcra)
                .shape(Duration::from_secs(5))
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let d = limiter.check(&key, 20).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.decided_by(), DecidedBy::Fallback);
    match limiter.check(&Key::new("user", "2"), 100).await {
        Err(tollgate::CheckError::CostExceedsCapacity { .. }) => {}
        other => panic!("{other:?}"),
    }
}
