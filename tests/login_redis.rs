//! The login guard on the Redis store: two instances of the `login` example's app share one
//! real `redis-server`, and the limits hold across them.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use reqwest::StatusCode;
use support::RedisServer;
use tollgate::login::LoginGuard;
use tollgate::store::RedisStore;
use tollgate::Rate;

#[allow(dead_code)]
#[path = "../examples/login.rs"]
mod example;

const WINDOW: Duration = Duration::from_secs(600);

async fn instance(redis: &RedisServer, prefix: &str) -> SocketAddr {
    let store = RedisStore::builder()
        .prefix(prefix)
        .build_with_url(&redis.url())
        .unwrap();
    let guard = LoginGuard::builder()
        .store(store)
        .ip_user_rate(Rate::new(3, WINDOW))
        .ip_rate(Rate::new(10, WINDOW))
        .user_rate(Rate::new(6, WINDOW))
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            example::app(guard).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

async fn login(server: SocketAddr, from: u8, user: &str, password: &str) -> StatusCode {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, from)))
        .build()
        .unwrap()
        .post(format!("http://{server}/login"))
        .json(&serde_json::json!({ "username": user, "password": password }))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn limits_hold_across_instances_and_usernames_stay_out_of_redis() {
    let redis = RedisServer::start();
    let prefix = support::scenarios::unique_prefix("login");
    let a = instance(&redis, &prefix).await;
    let b = instance(&redis, &prefix).await;

    // A botnet spreads six guesses for one user over three addresses and both instances.
    for (i, ip) in [2u8, 3, 4, 2, 3, 4].into_iter().enumerate() {
        let server = if i % 2 == 0 { a } else { b };
        assert_eq!(
            login(server, ip, "Alice@Example.com", "guess").await,
            StatusCode::UNAUTHORIZED
        );
    }
    // Either instance now refuses that user, from anywhere.
    assert_eq!(
        login(a, 9, "alice@example.com", "guess").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        login(b, 10, " ALICE@example.com", "guess").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // One address spraying users across both instances hits the IP limit (10).
    for i in 0..10 {
        let server = if i % 2 == 0 { a } else { b };
        assert_eq!(
            login(server, 20, &format!("user{i}@example.com"), "Password1").await,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        login(b, 20, "someone@example.com", "Password1").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    // The store holds state for all three tuples, and no username in clear.
    let keys = redis.scan(&format!("{prefix}*"));
    for source in ["login-ip+user", "login-ip:", "login-user:"] {
        assert!(
            keys.iter().any(|k| k.contains(source)),
            "no {source} key in {keys:?}"
        );
    }
    for k in &keys {
        assert!(!k.to_lowercase().contains("example.com"), "username in {k}");
        assert!(!k.to_lowercase().contains("alice"), "username in {k}");
    }
}
