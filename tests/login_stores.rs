//! The login guard's promises on every store a plan can give it: the memory store, Redis,
//! and leased quotas from either (a plan that leases puts the guard on the leased store).
//! The guard's limits are small, so a leased store decides its attempts exactly at the
//! ledger, and the successes' refunds and the refused attempts' give-backs go there.

mod support;

use std::time::Duration;

use support::scenarios::unique_prefix;
use support::RedisServer;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::login::LoginGuard;
use tollgate::store::leased::{LeasedStore, MemoryLedger};
use tollgate::store::{MemoryStore, RedisStore, Store};
use tollgate::Rate;

/// An office behind one address: 60 people log in right, one after the other, each once;
/// then one person logs in 30 times. Successes are refunded, so neither the address limit
/// nor the username limit ever refuses them ("a busy office behind one NAT address does
/// not use up its IP limit by logging in").
async fn office<S: Store + Clone>(guard: LoginGuard<S>, label: &str) -> Vec<String> {
    let mut failures = Vec::new();
    let ip = Key::new("ip", "198.51.100.20");
    for i in 0..60 {
        let a = guard.attempt_with_ip_key(ip.clone(), &format!("employee{i}"));
        let d = guard.check(&a).await.unwrap();
        if !d.is_allowed() {
            failures.push(format!("{label}: employee {i}'s correct login refused"));
            break;
        }
        guard.record_success(&a).await.unwrap();
    }
    for j in 0..30 {
        let a = guard.attempt_with_ip_key(Key::new("ip", format!("203.0.113.{j}")), "boss");
        let d = guard.check(&a).await.unwrap();
        if !d.is_allowed() {
            failures.push(format!(
                "{label}: the boss's correct login number {j} refused"
            ));
            break;
        }
        guard.record_success(&a).await.unwrap();
    }
    failures
}

/// The guard with limits small enough (a tenth of them under two units) that a leased
/// store decides each attempt at the ledger.
fn small<S: Store + Clone>(store: S) -> LoginGuard<S> {
    LoginGuard::builder()
        .store(store)
        .ip_rate(Rate::per_hour(10))
        .user_rate(Rate::per_hour(8))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successes_never_count_on_any_store() {
    let redis = RedisServer::start();
    let plain = |name: &str| {
        RedisStore::builder()
            .prefix(unique_prefix(name))
            .build_with_url(&redis.url())
            .unwrap()
    };
    let mut failures = Vec::new();
    failures.extend(office(small(MemoryStore::new()), "memory").await);
    failures.extend(office(small(plain("office-plain")), "redis").await);
    failures.extend(
        office(
            small(LeasedStore::new(MemoryLedger::new())),
            "leased memory ledger",
        )
        .await,
    );
    failures.extend(
        office(
            small(LeasedStore::new(plain("office-leased"))),
            "leased redis",
        )
        .await,
    );
    // The default limits: blocks are leased, and the refunds go into them.
    failures.extend(
        office(
            LoginGuard::builder()
                .store(LeasedStore::new(plain("office-leased-default")))
                .build()
                .unwrap(),
            "leased redis, default limits",
        )
        .await,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Through a plan: a Redis store that leases, and a `[login]` section (the plan builds the
/// guard on the plan's one store, so the guard leases without saying so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_with_a_leased_store_still_refunds_successes() {
    let redis = RedisServer::start();
    let toml = format!(
        r#"
failure_mode = "fail_closed"

[store]
kind = "redis"
url = "{url}"
prefix = "{prefix}"
lease_time = "250ms"

[key]
kind = "peer_ip"

[[policies]]
name = "reads"
limit = 1000
window = "1m"

[[policies]]
name = "login-ip-user"
limit = 5
window = "15m"
algorithm = "sliding_window_log"

[[policies]]
name = "login-ip"
limit = 10
window = "15m"
algorithm = "sliding_window_log"

[[policies]]
name = "login-user"
limit = 20
window = "15m"
algorithm = "sliding_window_log"

[default]
policies = ["reads"]

[login]
routes = ["POST /login"]
username_field = "username"
ip_username = "login-ip-user"
ip = "login-ip"
username = "login-user"
"#,
        url = redis.url(),
        prefix = unique_prefix("plan-login")
    );
    let plan = match tollgate::config::Plan::from_toml(&toml) {
        Ok(p) => p,
        Err(e) => panic!("plan: {e}"),
    };
    let built = plan.build().unwrap_or_else(|e| panic!("build: {e}"));
    let guard = built.login_guard().expect("a login guard").clone();
    let ip = Key::new("ip", "198.51.100.30");
    let mut refused = None;
    for i in 0..30 {
        let a = guard.attempt_with_ip_key(ip.clone(), &format!("employee{i}"));
        let d = guard.check(&a).await.unwrap();
        if !d.is_allowed() {
            refused = Some(i);
            break;
        }
        guard.record_success(&a).await.unwrap();
    }
    assert_eq!(
        refused, None,
        "30 correct logins from one address, address limit 10: login {refused:?} was refused"
    );
}

/// "Refused attempts are never counted, so hammering a locked account does not extend the
/// lock": an attacker spends alice's username limit; alice, from her own address, retries
/// while locked (each attempt refused); one username window after the attacker's last
/// failure she must be let in. On every store a plan can give the guard.
async fn lockout_ends_one_window_after_the_last_counted_failure<S: Store + Clone>(
    store: S,
    clock: &ManualClock,
    label: &str,
) -> Option<String> {
    let w = Duration::from_secs(600);
    let guard = LoginGuard::builder()
        .store(store)
        .ip_user_rate(Rate::new(5, w))
        .ip_rate(Rate::new(50, w))
        .user_rate(Rate::new(3, w))
        .build()
        .unwrap();
    for i in 0..3 {
        let a = guard.attempt_with_ip_key(Key::new("ip", format!("10.0.0.{i}")), "alice");
        assert!(guard.check(&a).await.unwrap().is_allowed(), "{label}");
        guard.record_failure(&a).await.unwrap();
    }
    clock.advance(Duration::from_secs(540));
    let alice = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.9"), "alice");
    for _ in 0..6 {
        assert!(
            !guard.check(&alice).await.unwrap().is_allowed(),
            "{label}: locked"
        );
        clock.advance(Duration::from_secs(1));
    }
    clock.advance(Duration::from_secs(60));
    let d = guard.check(&alice).await.unwrap();
    (!d.is_allowed()).then(|| {
        format!(
            "{label}: one username window after the attacker's last failure, alice is still refused for {:?}",
            d.retry_after()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_users_own_retries_do_not_extend_the_lock() {
    let mut failures = Vec::new();
    let clock = ManualClock::new(1_796_205_603_250);
    failures.extend(
        lockout_ends_one_window_after_the_last_counted_failure(
            MemoryStore::builder().clock(clock.clone()).build().unwrap(),
            &clock,
            "memory",
        )
        .await,
    );
    let clock = ManualClock::new(1_796_205_603_250);
    let ledger = MemoryLedger::with_clock(clock.clone());
    failures.extend(
        lockout_ends_one_window_after_the_last_counted_failure(
            LeasedStore::builder(ledger)
                .clock(clock.clone())
                .build()
                .unwrap(),
            &clock,
            "leased memory ledger",
        )
        .await,
    );
    let redis = RedisServer::start();
    let clock = ManualClock::new(1_796_205_603_250);
    let r = RedisStore::builder()
        .prefix(unique_prefix("lock-plain"))
        .clock(clock.clone())
        .build_with_url(&redis.url())
        .unwrap();
    failures
        .extend(lockout_ends_one_window_after_the_last_counted_failure(r, &clock, "redis").await);
    let clock = ManualClock::new(1_796_205_603_250);
    let r = RedisStore::builder()
        .prefix(unique_prefix("lock-leased"))
        .clock(clock.clone())
        .build_with_url(&redis.url())
        .unwrap();
    failures.extend(
        lockout_ends_one_window_after_the_last_counted_failure(
            LeasedStore::builder(r)
                .clock(clock.clone())
                .build()
                .unwrap(),
            &clock,
            "leased redis",
        )
        .await,
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
