//! A reset across the instances of a leased store: the instance that resets drops its
//! blocks of the key and resets the ledger; another instance spends the block it already
//! holds (the stated bound: at most that block, `LeaseStats::units_held` when the reset
//! came). The same bound for a give-back of more than the key was charged (a refund
//! applied twice), which takes the ledger's count down to a fresh state as a reset does.
//! Measured on a memory ledger and on a Redis one.

mod support;

use std::time::Duration;

use support::RedisServer;
use tollgate::key::Key;
use tollgate::store::leased::{LeaseBackend, LeasedStore, MemoryLedger};
use tollgate::store::{Op, RedisStore, Store};
use tollgate::{Policy, Rate};

const LIMIT: u64 = 1_000;

/// Admits requests of one unit on `store` until it refuses one; the number admitted.
async fn admit_until_refused<S: Store>(store: &S, key: &Key, policy: &[Policy]) -> u64 {
    let mut admitted = 0;
    while store.check(key, policy, &[1]).await.unwrap().is_allowed() {
        admitted += 1;
        assert!(admitted <= 2 * LIMIT, "no refusal after {admitted}");
    }
    admitted
}

/// Two instances over one ledger: `b` holds a block of the key when `a` resets it. After
/// the reset, the two admit at most the limit plus what `b` held.
async fn reset_across_instances<L: LeaseBackend + Clone>(ledger: L, label: &str) {
    let a = LeasedStore::new(ledger.clone());
    let b = LeasedStore::new(ledger);
    let policy = [Policy::new("api", Rate::per_hour(LIMIT)).unwrap()];
    let key = Key::new("user", format!("reset-{label}"));
    // Enough requests that `b` tracks the key and leases it a block.
    for _ in 0..200 {
        assert!(b.check(&key, &policy, &[1]).await.unwrap().is_allowed());
    }
    let held = b.stats().units_held;
    assert!(held > 0, "{label}: b holds no block: {:?}", b.stats());
    a.apply(&key, &policy, Op::Reset).await.unwrap();
    let after =
        admit_until_refused(&b, &key, &policy).await + admit_until_refused(&a, &key, &policy).await;
    eprintln!(
        "{label}: after the reset, {after} admitted of {LIMIT}, b held {held}; {:?}",
        b.stats()
    );
    assert!(
        after <= LIMIT + held,
        "{label}: {after} admitted after a reset, more than {LIMIT} + the {held} units b held"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_leaves_other_instances_at_most_their_blocks() {
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    reset_across_instances(MemoryLedger::new(), "memory").await;
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .build_with_url(&server.url())
        .unwrap();
    reset_across_instances(redis, "redis").await;
}

/// Two instances over one ledger: `b` holds a block of the key when `a`, which holds none,
/// refunds far more than the key was charged. Afterwards the two admit at most the limit
/// plus what `b` held (the bound stated in `store::leased`, "Costs settled below their
/// reservation").
async fn over_refund_across_instances<L: LeaseBackend + Clone>(ledger: L, label: &str) {
    let a = LeasedStore::new(ledger.clone());
    let b = LeasedStore::new(ledger);
    let policy = [Policy::new("api", Rate::per_hour(LIMIT)).unwrap()];
    let key = Key::new("user", format!("over-refund-{label}"));
    for _ in 0..200 {
        assert!(b.check(&key, &policy, &[1]).await.unwrap().is_allowed());
    }
    let held = b.stats().units_held;
    assert!(held > 0, "{label}: b holds no block: {:?}", b.stats());
    assert!(a.check(&key, &policy, &[5]).await.unwrap().is_allowed());
    assert_eq!(a.stats().units_held, 0, "{label}: a holds no block");
    a.apply(&key, &policy, Op::refund([10 * LIMIT]))
        .await
        .unwrap();
    let after =
        admit_until_refused(&b, &key, &policy).await + admit_until_refused(&a, &key, &policy).await;
    eprintln!("{label}: after an over-refund, {after} admitted of {LIMIT}, b held {held}");
    assert!(
        after <= LIMIT + held,
        "{label}: {after} admitted after an over-refund, more than {LIMIT} + the {held} units b held"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_refund_leaves_other_instances_at_most_their_blocks() {
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    over_refund_across_instances(MemoryLedger::new(), "memory").await;
    let server = RedisServer::start();
    let redis = RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .build_with_url(&server.url())
        .unwrap();
    over_refund_across_instances(redis, "redis").await;
}

/// A refusal this instance remembers (it answers the key's next requests without asking the
/// ledger) is forgotten when units come back through it: after a refund the limiter admits
/// again at once, as the exact stores do, not a lease time later.
async fn a_give_back_ends_the_remembered_refusal<L: LeaseBackend + Clone>(ledger: L, label: &str) {
    let store = LeasedStore::new(ledger);
    let limiter = tollgate::Limiter::builder()
        .store(store.clone())
        .policy(Policy::new("exports", Rate::per_hour(3)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("tenant", format!("give-back-{label}"));
    for _ in 0..3 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    for _ in 0..3 {
        assert!(
            !limiter.check(&key, 1).await.unwrap().is_allowed(),
            "{label}"
        );
    }
    limiter.refund(&key, 1).await.unwrap();
    let peeked = limiter.peek(&key).await.unwrap();
    assert!(peeked.is_allowed(), "{label}: a peek after the refund");
    assert!(
        limiter.check(&key, 1).await.unwrap().is_allowed(),
        "{label}: the refunded unit is admitted at once"
    );
    assert!(
        !limiter.check(&key, 1).await.unwrap().is_allowed(),
        "{label}"
    );

    // The same for a reservation settled below what it reserved.
    let key = Key::new("tenant", format!("settle-{label}"));
    let reservation = limiter.reserve(&key, 3).await.unwrap();
    assert!(reservation.decision().is_allowed(), "{label}");
    assert!(
        !limiter.check(&key, 1).await.unwrap().is_allowed(),
        "{label}"
    );
    reservation.settle(1).await.unwrap();
    for _ in 0..2 {
        assert!(
            limiter.check(&key, 1).await.unwrap().is_allowed(),
            "{label}: a unit the settlement gave back is admitted at once"
        );
    }
    assert!(
        !limiter.check(&key, 1).await.unwrap().is_allowed(),
        "{label}"
    );
    store.shutdown().await;
}

#[tokio::test]
async fn a_refund_ends_a_remembered_refusal_on_a_memory_ledger() {
    a_give_back_ends_the_remembered_refusal(MemoryLedger::new(), "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_ends_a_remembered_refusal_on_a_redis_ledger() {
    let server = RedisServer::start();
    let ledger = RedisStore::builder()
        .prefix("give-back")
        .build_with_url(&server.url())
        .unwrap();
    a_give_back_ends_the_remembered_refusal(ledger, "redis").await;
}

/// A mixed request (a leasable policy beside one the exact store decides) admitted from the
/// block in hand, then refused by the exact store, gives its units back to that block only.
/// When this instance reset the key and took a new block meanwhile, the units once went into
/// the new block: the key got its limit and the refused request's units more.
#[tokio::test]
async fn a_refused_mixed_request_gives_back_to_its_own_block_only() {
    use std::future::Future;
    use std::task::Poll;
    use support::gated::{Gated, Stops};
    let store = LeasedStore::new(Gated::new(MemoryLedger::new(), Stops::Before));
    let api = Policy::new("api", Rate::per_hour(LIMIT)).unwrap();
    let slots = Policy::in_flight("slots", 1).unwrap();
    let key = Key::new("user", "mixed-refused");
    let rate = std::slice::from_ref(&api);
    for _ in 0..200 {
        assert!(store.check(&key, rate, &[1]).await.unwrap().is_allowed());
    }
    assert!(store.stats().units_held >= 10, "{:?}", store.stats());
    // The one slot, held: the exact store refuses the mixed request.
    let slot = store
        .check(&key, std::slice::from_ref(&slots), &[1])
        .await
        .unwrap();
    assert!(slot.is_allowed());
    let mut mixed = Box::pin(store.check(&key, &[api.clone(), slots.clone()], &[10, 1]));
    // One poll: admitted from the block, now waiting for the exact store.
    std::future::poll_fn(|cx| {
        assert!(mixed.as_mut().poll(cx).is_pending());
        Poll::Ready(())
    })
    .await;
    store.apply(&key, rate, Op::Reset).await.unwrap();
    let mut admitted = 0;
    for _ in 0..50 {
        assert!(store.check(&key, rate, &[1]).await.unwrap().is_allowed());
        admitted += 1;
    }
    assert!(
        store.stats().units_held > 0,
        "a new block: {:?}",
        store.stats()
    );
    assert!(!mixed.await.unwrap().is_allowed(), "the slot is held");
    admitted += admit_until_refused(&store, &key, rate).await;
    assert!(
        admitted <= LIMIT,
        "{admitted} admitted after the reset, more than the limit of {LIMIT}"
    );
    store.shutdown().await;
}
