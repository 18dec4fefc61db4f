//! Concurrent login attempts in the default mode (failures only): attempts beyond a limit
//! never reach password verification, however many arrive at once, on the memory store, on a
//! real `redis-server` and through `LoginLayer` on a real axum server; and successful logins
//! still do not use up the IP and username limits.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate::store::StoreExt;

use axum::routing::post;
use axum::{Json, Router};
use http::StatusCode;
use support::scenarios::unique_prefix;
use support::RedisServer;
use tokio::sync::Barrier;
use tollgate::key::Key;
use tollgate::login::{LoginGuard, LoginLayer, LoginMode};
use tollgate::store::{MemoryStore, RedisStore, Store};
use tollgate::Rate;

const ATTEMPTS: usize = 100;
/// The default (IP, username) limit: 5 per 15 minutes.
const LIMIT: usize = 5;
/// How long a password verification takes (a password hash is slow on purpose).
const VERIFY: Duration = Duration::from_millis(30);

/// `ATTEMPTS` wrong passwords for one user from one address, all at once, through the guard
/// as a handler would use it; returns how many reached verification.
async fn parallel_wrong_passwords<S: Store + Clone>(guard: LoginGuard<S>) -> usize {
    let verified = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(ATTEMPTS));
    let tasks: Vec<_> = (0..ATTEMPTS)
        .map(|_| {
            let (guard, verified, start) = (guard.clone(), verified.clone(), start.clone());
            tokio::spawn(async move {
                let attempt = guard.attempt_with_ip_key(Key::new("ip", "198.51.100.7"), "alice");
                start.wait().await;
                if !guard.check(&attempt).await.unwrap().is_allowed() {
                    return;
                }
                verified.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(VERIFY).await; // the password is wrong
                guard.record_failure(&attempt).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    verified.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_wrong_passwords_reach_verification_at_most_the_limit_on_the_memory_store() {
    let guard = LoginGuard::builder().build().unwrap();
    assert_eq!(guard.mode(), LoginMode::FailuresOnly);
    assert_eq!(parallel_wrong_passwords(guard).await, LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_wrong_passwords_reach_verification_at_most_the_limit_on_redis() {
    let redis = RedisServer::start();
    let store = RedisStore::builder()
        .prefix(unique_prefix("login-race"))
        .build_with_url(&redis.url())
        .unwrap();
    let guard = LoginGuard::builder().store(store).build().unwrap();
    assert_eq!(parallel_wrong_passwords(guard).await, LIMIT);
}

/// A login route behind `LoginLayer`: the handler counts its calls, takes `VERIFY` to check
/// the password, and accepts only "right".
async fn login_server<S: Store>(guard: LoginGuard<S>) -> (SocketAddr, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = move |Json(body): Json<serde_json::Value>| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(VERIFY).await;
            if body["password"] == "right" {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }
    };
    let app = Router::new().route(
        "/login",
        post(handler).layer(LoginLayer::json_field(guard, "username")),
    );
    (support::serve(app).await, calls)
}

async fn post_login(
    client: &reqwest::Client,
    addr: SocketAddr,
    user: &str,
    password: &str,
) -> StatusCode {
    let res = client
        .post(format!("http://{addr}/login"))
        .json(&serde_json::json!({ "username": user, "password": password }))
        .send()
        .await
        .unwrap();
    StatusCode::from_u16(res.status().as_u16()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_wrong_passwords_through_the_layer_reach_the_handler_at_most_the_limit() {
    let (addr, calls) = login_server(LoginGuard::builder().build().unwrap()).await;
    let client = reqwest::Client::new();
    let start = Arc::new(Barrier::new(ATTEMPTS));
    let tasks: Vec<_> = (0..ATTEMPTS)
        .map(|_| {
            let (client, start) = (client.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                post_login(&client, addr, "alice", "guess").await
            })
        })
        .collect();
    let mut statuses = Vec::with_capacity(ATTEMPTS);
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    let unauthorized = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    assert_eq!(calls.load(Ordering::SeqCst), LIMIT, "handler invocations");
    assert_eq!((unauthorized, refused), (LIMIT, ATTEMPTS - LIMIT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_office_behind_one_address_is_never_refused_for_logging_in() {
    // An office of 40 people behind one NAT address, each mistyping once and then logging
    // in, at the same time, twice over, and then one of them 20 times more: 180 attempts
    // against an address limit of 150 and 24 for one user against a username limit of 4,
    // but only the 80 typos count. (While they are verified, concurrent successes hold
    // places too: 80 typos and 40 logins in flight fit in 150.)
    let guard = LoginGuard::builder()
        .ip_user_rate(Rate::per_hour(3))
        .ip_rate(Rate::per_hour(150))
        .user_rate(Rate::per_hour(4))
        .build()
        .unwrap();
    let (addr, calls) = login_server(guard.clone()).await;
    let client = reqwest::Client::new();
    for round in 0..2 {
        let logins: Vec<_> = (0..40)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let user = format!("employee{i}");
                    let typo = post_login(&client, addr, &user, "wrong").await;
                    let ok = post_login(&client, addr, &user, "right").await;
                    (typo, ok)
                })
            })
            .collect();
        for (i, login) in logins.into_iter().enumerate() {
            let (typo, ok) = login.await.unwrap();
            assert_eq!(typo, StatusCode::UNAUTHORIZED, "round {round} employee {i}");
            assert_eq!(ok, StatusCode::OK, "round {round} employee {i}");
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 160);
    // 80 typos counted against the address, the 80 successes not: 70 of 150 left, 69 after
    // this attempt.
    let a = guard.attempt_with_ip_key(Key::new("ip", "127.0.0.1"), "newcomer");
    let d = guard.check(&a).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.decision().policies()[1].remaining(), 69);
    // One person logging in again and again never meets the username limit of 4 (nor the
    // address limit).
    for _ in 0..20 {
        assert_eq!(
            post_login(&client, addr, "employee0", "right").await,
            StatusCode::OK
        );
    }
}

#[tokio::test]
async fn a_success_after_failures_refunds_its_own_reservation_only() {
    let guard = LoginGuard::builder()
        .ip_rate(Rate::per_hour(4))
        .user_rate(Rate::per_hour(4))
        .build()
        .unwrap();
    let ip = Key::new("ip", "203.0.113.5");
    let attempt = guard.attempt_with_ip_key(ip.clone(), "bob");
    for _ in 0..2 {
        assert!(guard.check(&attempt).await.unwrap().is_allowed());
        guard.record_failure(&attempt).await.unwrap();
    }
    for _ in 0..10 {
        assert!(guard.check(&attempt).await.unwrap().is_allowed());
        guard.record_success(&attempt).await.unwrap();
    }
    // The two failures still count against the address and the user: two attempts left.
    let d = guard.check(&attempt).await.unwrap();
    let remaining: Vec<u64> = d
        .decision()
        .policies()
        .iter()
        .map(|p| p.remaining())
        .collect();
    assert_eq!(remaining[1..], [1, 1]);
}

#[tokio::test]
async fn an_attempt_never_recorded_counts_as_a_failure() {
    let guard = LoginGuard::builder()
        .ip_user_rate(Rate::per_hour(2))
        .build()
        .unwrap();
    let attempt = guard.attempt_with_ip_key(Key::new("ip", "203.0.113.6"), "carol");
    // Two attempts whose handlers never record an outcome (a crash, an unknown status).
    assert!(guard.check(&attempt).await.unwrap().is_allowed());
    assert!(guard.check(&attempt).await.unwrap().is_allowed());
    assert!(!guard.check(&attempt).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_refused_attempt_charges_no_tuple() {
    let store = MemoryStore::new();
    let guard = LoginGuard::builder()
        .store(store.clone())
        .ip_rate(Rate::per_hour(1))
        .build()
        .unwrap();
    let ip = Key::new("ip", "203.0.113.7");
    let first = guard.attempt_with_ip_key(ip.clone(), "dave");
    assert!(guard.check(&first).await.unwrap().is_allowed());
    // The address is spent: the next user's attempt passes its (IP, username) limit, then the
    // IP limit refuses it; the (IP, username) and username tuples keep nothing of it.
    let second = guard.attempt_with_ip_key(ip, "erin");
    let refused = guard.check(&second).await.unwrap();
    assert!(!refused.is_allowed());
    let policies = guard.policies();
    for (key, policy) in [
        (second.ip_user_key(), &policies[0]),
        (second.user_key(), &policies[2]),
    ] {
        let now = store
            .peek(key, std::slice::from_ref(policy), &[0])
            .await
            .unwrap();
        assert_eq!(now.remaining(), policy.limit(), "{}", policy.name());
    }
}
