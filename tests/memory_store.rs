//! The memory store and the direct `Limiter` API.

use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, CheckError, Limiter, Policy, Rate, StoreError};

fn all_algorithms() -> [Algorithm; 5] {
    [
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_key_admit_exactly_the_limit() {
    for algorithm in all_algorithms() {
        let limiter = Limiter::builder()
            .policy(
                Policy::builder("hot", Rate::per_hour(500))
                    .algorithm(algorithm)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let key = Key::new("user", "hot");
        let mut tasks = vec![];
        for _ in 0..64 {
            let limiter = limiter.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u32;
                for _ in 0..20 {
                    ok += u32::from(limiter.check(&key, 1).await.unwrap().is_allowed());
                }
                ok
            }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += t.await.unwrap();
        }
        assert_eq!(ok, 500, "{algorithm:?}");
    }
}

#[test]
fn expired_keys_are_reclaimed() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .background_sweep(false)
        .build();
    let policies = [Policy::new("p", Rate::per_second(10)).unwrap()];
    for i in 0..100_000u32 {
        let d = store
            .decide(&Key::new("ip", i.to_string()), &policies, &[1], true)
            .unwrap();
        assert!(d.is_allowed());
    }
    assert_eq!(store.len(), 100_000);
    // The counter's state matters until the end of the window after its own.
    clock.advance(Duration::from_millis(1_999));
    store.sweep();
    assert_eq!(store.len(), 100_000);
    clock.advance(Duration::from_millis(1));
    store.sweep();
    assert_eq!(store.len(), 0);
}

/// A sweep that reclaims a few keys and one that reclaims most of them take different paths;
/// either way the survivors keep their state and stay findable, and so do they after a reset
/// removes a key from the middle.
#[tokio::test]
async fn survivors_of_a_sweep_or_reset_keep_their_state() {
    for (long_lived, short_lived) in [(1_000u32, 100u32), (100, 1_000)] {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(1)
            .background_sweep(false)
            .build();
        let long = [Policy::new("long", Rate::per_minute(2)).unwrap()];
        let short = [Policy::new("short", Rate::per_second(2)).unwrap()];
        let key = |i: u32| Key::new("ip", i.to_string());
        // Interleaved, so the expiring keys sit between the survivors.
        for i in 0..long_lived.max(short_lived) {
            if i < long_lived {
                for _ in 0..2 {
                    assert!(store
                        .decide(&key(i), &long, &[1], true)
                        .unwrap()
                        .is_allowed());
                }
            }
            if i < short_lived {
                let k = key(1_000_000 + i);
                assert!(store.decide(&k, &short, &[1], true).unwrap().is_allowed());
            }
        }
        clock.advance(Duration::from_secs(3));
        store.sweep();
        assert_eq!(store.len(), long_lived as usize);
        for i in 0..long_lived {
            let d = store.decide(&key(i), &long, &[1], false).unwrap();
            assert!(!d.is_allowed(), "key {i} lost its state");
        }
        store.reset(&key(0), &long).await.unwrap();
        assert_eq!(store.len(), long_lived as usize - 1);
        assert!(store
            .decide(&key(0), &long, &[1], false)
            .unwrap()
            .is_allowed());
        for i in 1..long_lived {
            let d = store.decide(&key(i), &long, &[1], false).unwrap();
            assert!(!d.is_allowed(), "key {i} lost its state after a reset");
        }
    }
}

#[test]
fn the_background_sweeper_reclaims_idle_stores() {
    let store = MemoryStore::builder()
        .sweep_interval(Duration::from_millis(20))
        .build();
    let policies = [
        Policy::builder("p", Rate::new(5, Duration::from_millis(10)))
            .algorithm(Algorithm::FixedWindow)
            .build()
            .unwrap(),
    ];
    for i in 0..1_000u32 {
        store
            .decide(&Key::new("ip", i.to_string()), &policies, &[1], true)
            .unwrap();
    }
    assert!(!store.is_empty());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !store.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "sweeper left {} keys",
            store.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn at_the_key_cap_new_keys_fail_and_old_keys_keep_their_state() {
    let clock = ManualClock::new(0);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(3)
        .background_sweep(false)
        .build();
    let policies = [Policy::new("p", Rate::per_second(1)).unwrap()];
    for i in 0..3 {
        store
            .decide(&Key::new("ip", format!("{i}")), &policies, &[1], true)
            .unwrap();
    }
    let err = store
        .decide(&Key::new("ip", "new"), &policies, &[1], true)
        .unwrap_err();
    assert_eq!(err, StoreError::Capacity);
    // An existing key is still limited: no eviction reset it.
    let d = store
        .decide(&Key::new("ip", "0"), &policies, &[1], true)
        .unwrap();
    assert!(!d.is_allowed());
    // Once state expires, room is made.
    clock.advance(Duration::from_secs(2));
    assert!(store
        .decide(&Key::new("ip", "new"), &policies, &[1], true)
        .unwrap()
        .is_allowed());
    assert_eq!(store.len(), 1);
}

#[tokio::test]
async fn several_policies_are_all_or_nothing() {
    let clock = ManualClock::new(0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build())
        .policy(
            Policy::builder("burst", Rate::per_second(2))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .policy(
            Policy::builder("daily", Rate::per_day(3))
                .algorithm(Algorithm::FixedWindow)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    // The burst policy denies: the daily policy must not be charged.
    for _ in 0..10 {
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.governing_index(), 0);
        assert_eq!(d.policies()[1].remaining(), 1);
    }
    clock.advance(Duration::from_secs(1));
    let d = limiter.check(&key, 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.policies()[1].remaining(), 0);
    assert_eq!(
        d.governing_index(),
        1,
        "the daily policy is now the tighter one"
    );
    clock.advance(Duration::from_secs(1));
    let d = limiter.check(&key, 1).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.governing_index(), 1);
    assert_eq!(d.policies()[0].remaining(), 2, "burst not charged either");
}

#[tokio::test]
async fn a_cost_above_capacity_is_an_error_not_a_lockout() {
    let limiter = Limiter::builder()
        .policy(
            Policy::builder("bucket", Rate::per_minute(10))
                .algorithm(Algorithm::TokenBucket)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let err = limiter.check(&key, 1_000_000).await.unwrap_err();
    assert!(matches!(
        err,
        CheckError::CostExceedsCapacity {
            cost: 1_000_000,
            capacity: 10,
            ..
        }
    ));
    let d = limiter.check(&key, 10).await.unwrap();
    assert!(d.is_allowed(), "the huge request took nothing");
}

#[tokio::test]
async fn peek_consumes_nothing_and_reset_forgets() {
    let limiter = Limiter::builder()
        .policy(Policy::new("p", Rate::per_minute(2)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    for _ in 0..5 {
        let d = limiter.peek(&key).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
    }
    assert_eq!(limiter.store().len(), 0, "peek inserts nothing");
    limiter.check(&key, 2).await.unwrap();
    assert!(!limiter.peek(&key).await.unwrap().is_allowed());
    limiter.reset(&key).await.unwrap();
    assert!(limiter.check(&key, 2).await.unwrap().is_allowed());
}

#[tokio::test]
async fn policies_with_one_name_share_state_across_limiters() {
    let store = MemoryStore::new();
    let policy = Policy::new("shared", Rate::per_minute(3)).unwrap();
    let a = Limiter::builder()
        .store(store.clone())
        .policy(policy.clone())
        .build()
        .unwrap();
    let b = Limiter::builder()
        .store(store.clone())
        .policy(policy)
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    assert!(a.check(&key, 2).await.unwrap().is_allowed());
    assert!(!b.check(&key, 2).await.unwrap().is_allowed());
    assert!(b.check(&key, 1).await.unwrap().is_allowed());
    assert_eq!(store.name(), "memory");
}

#[test]
fn limiter_config_errors_name_the_field() {
    let err = Limiter::builder().build().unwrap_err();
    assert_eq!(err.field(), "policies");
    let p = Policy::new("dup", Rate::per_second(1)).unwrap();
    let err = Limiter::builder()
        .policy(p.clone())
        .policy(p)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "policies[1].name");
}
