//! In-flight slots through the `Store` API, as a caller of the trait sees them: one slot per
//! request whatever its cost, settlements that never free a slot, a slot's lease never cut
//! short by a slot taken under a shorter one, and refusals a deny cache does not keep — the
//! memory store and a real Redis answering alike.

mod support;

use std::time::Duration;

use tollgate::key::Key;
use tollgate::store::{FailureMode, MemoryStore, RedisStore, ResilientStore, Store, StoreExt};
use tollgate::{Algorithm, Policy, Rate};

use support::RedisServer;

fn redis_store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .build_with_url(&server.url())
        .unwrap()
}

fn slots(n: u64, lease: Duration) -> Policy {
    Policy::builder("slots", Rate::new(n, lease))
        .algorithm(Algorithm::InFlight)
        .build()
        .unwrap()
}

/// Whether a request of cost 1 is admitted now, and the slot it took.
async fn admitted<S: Store>(store: &S, key: &Key, policies: &[Policy]) -> (bool, u64) {
    let d = store.check(key, policies, &[1]).await.unwrap();
    (d.is_allowed(), d.slot())
}

/// A request takes one slot whatever cost it names: 3 and 0 both take one (a look with cost 0
/// asks for none), so a limit of 3 admits three requests of cost 3.
async fn one_slot_whatever_the_cost<S: Store>(store: S) -> Vec<(bool, u64)> {
    let p = [slots(3, Duration::from_secs(30))];
    let key = Key::new("t", "cost");
    let mut seen = vec![];
    let first = store.check(&key, &p, &[3]).await.unwrap();
    seen.push((first.is_allowed(), first.remaining()));
    let zero = store.check(&key, &p, &[0]).await.unwrap();
    seen.push((zero.is_allowed(), zero.remaining()));
    assert_ne!(
        zero.slot(),
        0,
        "a request of cost 0 holds a slot of its own"
    );
    let look = store.peek(&key, &p, &[0]).await.unwrap();
    seen.push((look.is_allowed(), look.remaining()));
    let third = store.check(&key, &p, &[7]).await.unwrap();
    seen.push((third.is_allowed(), third.remaining()));
    let fourth = store.check(&key, &p, &[1]).await.unwrap();
    seen.push((fourth.is_allowed(), fourth.remaining()));
    // Releasing the cost-0 request's slot frees exactly one.
    store.release(&key, &p, zero.slot()).await.unwrap();
    let after = store.peek(&key, &p, &[1]).await.unwrap();
    seen.push((after.is_allowed(), after.remaining()));
    seen
}

#[tokio::test]
async fn a_request_holds_one_slot_whatever_its_cost() {
    let server = RedisServer::start();
    let expected = vec![
        (true, 2),
        (true, 1),
        (true, 1),
        (true, 0),
        (false, 0),
        (true, 0),
    ];
    assert_eq!(
        one_slot_whatever_the_cost(MemoryStore::new()).await,
        expected
    );
    assert_eq!(
        one_slot_whatever_the_cost(redis_store(&server, "cost")).await,
        expected
    );
}

/// A settlement, above or below its reservation, is about units: it never gives a slot back.
async fn a_settlement_keeps_the_slot<S: Store>(store: S) -> (bool, bool) {
    let p = [slots(1, Duration::from_secs(30))];
    let key = Key::new("t", "settle");
    let (taken, slot) = admitted(&store, &key, &p).await;
    assert!(taken);
    store.settle(&key, &p, &[5], &[0]).await.unwrap();
    // Even when what it gives back happens to be the slot's name.
    store
        .settle(&key, &p, &[slot.saturating_add(1)], &[1])
        .await
        .unwrap();
    let after_below = admitted(&store, &key, &p).await.0;
    store.settle(&key, &p, &[0], &[5]).await.unwrap();
    store.refund(&key, &p, &[1]).await.unwrap();
    let after_refund = admitted(&store, &key, &p).await.0;
    (after_below, after_refund)
}

#[tokio::test]
async fn a_settlement_never_frees_a_slot() {
    let server = RedisServer::start();
    assert_eq!(
        a_settlement_keeps_the_slot(MemoryStore::new()).await,
        (false, false)
    );
    assert_eq!(
        a_settlement_keeps_the_slot(redis_store(&server, "settle")).await,
        (false, false)
    );
}

/// Redis: a slot taken (and given back) under a lease of 200 ms, next to one held under a
/// lease of 60 s, must not take the key's expiry down to 200 ms, which would forget the long
/// request's slot and admit one request too many.
#[tokio::test]
async fn a_shorter_lease_never_cuts_a_held_slot_short() {
    let server = RedisServer::start();
    let store = redis_store(&server, "lease");
    let long = [slots(2, Duration::from_secs(60))];
    let short = [slots(2, Duration::from_millis(200))];
    let key = Key::new("t", "lease");
    let (held, _) = admitted(&store, &key, &long).await;
    let (brief, slot) = admitted(&store, &key, &short).await;
    assert!(held && brief);
    store.release(&key, &short, slot).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    let keys = server.scan("*");
    let again = admitted(&store, &key, &long).await.0;
    let beyond = admitted(&store, &key, &long).await.0;
    assert!(
        again && !beyond,
        "limit 2 with the 60 s slot still held: one more admitted, not two (keys: {keys:?})"
    );
}

/// A resilient store's deny cache does not keep an in-flight refusal: a slot another
/// instance gives back is free at once here too.
#[tokio::test]
async fn a_deny_cache_keeps_no_in_flight_refusal() {
    let server = RedisServer::start();
    let cached = |prefix: &str| {
        ResilientStore::builder(redis_store(&server, prefix), FailureMode::FailClosed)
            .deny_cache(1_000)
            .deny_cache_max_age(Duration::from_secs(60))
            .deny_cache_recheck(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let here = cached("shared");
    let there = cached("shared");
    let p = [slots(1, Duration::from_secs(30))];
    let key = Key::new("t", "cached");
    let (taken, slot) = admitted(&there, &key, &p).await;
    assert!(taken);
    assert!(
        !admitted(&here, &key, &p).await.0,
        "the key's one slot is held"
    );
    there.release(&key, &p, slot).await.unwrap();
    assert!(
        admitted(&here, &key, &p).await.0,
        "the slot given back on the other instance is free here at once"
    );
}

/// A look at an in-flight policy whose limit an override lowered, with a slot held and a
/// cost above the overridden limit: the memory store and Redis answer alike, to the field.
async fn a_look_under_a_lowered_limit<S: Store>(
    store: S,
) -> Vec<tollgate::algorithm::PolicyDecision> {
    let plan = [slots(2, Duration::from_secs(30))];
    let key = Key::new("t", "look");
    let lowered = slots(1, Duration::from_secs(30));
    store
        .override_store()
        .expect("the store keeps overrides")
        .set(&key, &lowered, None)
        .await
        .unwrap();
    let mut seen = vec![];
    for cost in [0, 1, 2, 5] {
        seen.extend(
            store
                .peek(&key, &plan, &[cost])
                .await
                .unwrap()
                .policies()
                .to_vec(),
        );
    }
    let (taken, _) = admitted(&store, &key, &plan).await;
    assert!(taken);
    for cost in [0, 1, 2, 5] {
        seen.extend(
            store
                .peek(&key, &plan, &[cost])
                .await
                .unwrap()
                .policies()
                .to_vec(),
        );
    }
    seen
}

#[tokio::test]
async fn a_look_under_a_lowered_limit_answers_alike() {
    let server = RedisServer::start();
    let memory = a_look_under_a_lowered_limit(MemoryStore::new()).await;
    let redis = a_look_under_a_lowered_limit(redis_store(&server, "look")).await;
    assert_eq!(memory, redis);
}

/// A route cost that nothing reads is refused when the limiter is built, naming the field: an
/// in-flight policy takes one slot a request whatever the cost, so `cost(5)` beside in-flight
/// policies alone said something the limiter never did. It was accepted (and `cost(0)` too).
#[test]
fn a_route_cost_beside_in_flight_policies_alone_is_refused() {
    use tollgate::route::Route;
    for cost in [5, 0] {
        let err = tollgate::Limiter::builder()
            .default_route(Route::exempt())
            .route(
                "/uploads",
                Route::new()
                    .policy(tollgate::Policy::in_flight("uploads", 3).unwrap())
                    .cost(cost),
            )
            .build()
            .expect_err("a cost nothing reads");
        assert_eq!(err.field(), "routes[0].cost", "{err}");
    }
    // Beside a rate policy the cost is read (by that policy).
    tollgate::Limiter::builder()
        .default_route(Route::exempt())
        .route(
            "/uploads",
            Route::new()
                .policy(tollgate::Policy::in_flight("uploads", 3).unwrap())
                .policy(tollgate::Policy::new("bytes", tollgate::Rate::per_minute(100)).unwrap())
                .cost(5),
        )
        .build()
        .unwrap();
}
