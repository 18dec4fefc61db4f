//! A Redis store on one server sees a restart however its connection came back: from a URL
//! (the call on the dead connection fails), from a `deadpool-redis` pool (which replaces a
//! dead connection while recycling it, without failing a call) and from a RESP3 URL (whose
//! connection reconnects on the server's disconnect notice). Another instance reloads the
//! script first, so the store under test gets no `NOSCRIPT` either: only the once-a-second
//! `run_id` read can see it. Its [`Store::generation`] moves within a second of calls (what a
//! deny cache's denials and a `LeasedStore`'s blocks are dropped by).

mod support;

use std::time::{Duration, Instant};

use tollgate::key::Key;
use tollgate::store::{RedisStore, Store};
use tollgate::{Algorithm, Policy, Rate};

use support::RedisServer;

/// The stated interval (a second of calls) and slack for a loaded test machine.
const WITHIN: Duration = Duration::from_secs(3);

fn policy() -> Policy {
    Policy::builder("restart", Rate::per_minute(1_000_000))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap()
}

/// Restarts the server, has another store load the script again, then checks through
/// `store` every 20 ms until its generation moves: how long that took.
async fn seen_after_restart<S: Store>(
    server: &mut RedisServer,
    store: &S,
    other: &RedisStore,
) -> Duration {
    let p = policy();
    let key = Key::new("user", "restart");
    for _ in 0..3 {
        store
            .check(&key, std::slice::from_ref(&p), &[1])
            .await
            .unwrap();
    }
    let before = store.generation();
    server.kill();
    server.restart();
    let restarted = Instant::now();
    // The other instance's first call fails on its dead connection; its second loads the
    // script (`NOSCRIPT`) on the new server.
    let _ = other.check(&key, std::slice::from_ref(&p), &[1]).await;
    other
        .check(&key, std::slice::from_ref(&p), &[1])
        .await
        .unwrap();
    while store.generation() == before {
        assert!(
            restarted.elapsed() < WITHIN,
            "the restart was not seen within {WITHIN:?}"
        );
        let _ = store.check(&key, std::slice::from_ref(&p), &[1]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    restarted.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_is_seen_within_a_second_of_calls_on_every_connection() {
    let mut server = RedisServer::start();
    let url = server.url();
    let other = || {
        RedisStore::builder()
            .prefix("other")
            .build_with_url(&url)
            .unwrap()
    };
    let pooled = RedisStore::builder()
        .prefix("pool")
        .build_with_pool(server.pool(4))
        .unwrap();
    let other_pool = other();
    let took = seen_after_restart(&mut server, &pooled, &other_pool).await;
    eprintln!("a pool saw the restart after {} ms", took.as_millis());
    let resp3 = RedisStore::builder()
        .prefix("resp3")
        .build_with_url(&format!("{url}?protocol=resp3"))
        .unwrap();
    let other_resp3 = other();
    let took = seen_after_restart(&mut server, &resp3, &other_resp3).await;
    eprintln!(
        "a RESP3 connection saw the restart after {} ms",
        took.as_millis()
    );
    let plain = RedisStore::builder()
        .prefix("url")
        .build_with_url(&url)
        .unwrap();
    let other_plain = other();
    let took = seen_after_restart(&mut server, &plain, &other_plain).await;
    eprintln!("a URL store saw the restart after {} ms", took.as_millis());
}
