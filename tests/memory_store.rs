//! The memory store and the direct `Limiter` API.

mod support;

use std::time::Duration;
use tollgate::store::StoreExt;

use support::scenarios::ALGORITHMS;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, CheckError, Limiter, Policy, Rate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_key_admit_exactly_the_limit() {
    for algorithm in ALGORITHMS {
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
        .build()
        .unwrap();
    let policies = [Policy::new("p", Rate::per_second(10)).unwrap()];
    for i in 0..100_000u32 {
        let d = store
            .check_now(&Key::new("ip", i.to_string()), &policies, &[1])
            .expect("answers at once")
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
            .build()
            .unwrap();
        let long = [Policy::new("long", Rate::per_minute(2)).unwrap()];
        let short = [Policy::new("short", Rate::per_second(2)).unwrap()];
        let key = |i: u32| Key::new("ip", i.to_string());
        // Interleaved, so the expiring keys sit between the survivors.
        for i in 0..long_lived.max(short_lived) {
            if i < long_lived {
                for _ in 0..2 {
                    assert!(store
                        .check_now(&key(i), &long, &[1])
                        .expect("the memory store answers at once")
                        .unwrap()
                        .is_allowed());
                }
            }
            if i < short_lived {
                let k = key(1_000_000 + i);
                assert!(store
                    .check_now(&k, &short, &[1])
                    .expect("the memory store answers at once")
                    .unwrap()
                    .is_allowed());
            }
        }
        clock.advance(Duration::from_secs(3));
        store.sweep();
        assert_eq!(store.len(), long_lived as usize);
        for i in 0..long_lived {
            let d = support::peek_now(&store, &key(i), &long, &[1]).unwrap();
            assert!(!d.is_allowed(), "key {i} lost its state");
        }
        store.reset(&key(0), &long).await.unwrap();
        assert_eq!(store.len(), long_lived as usize - 1);
        assert!(support::peek_now(&store, &key(0), &long, &[1])
            .unwrap()
            .is_allowed());
        for i in 1..long_lived {
            let d = support::peek_now(&store, &key(i), &long, &[1]).unwrap();
            assert!(!d.is_allowed(), "key {i} lost its state after a reset");
        }
    }
}

#[test]
fn the_background_sweeper_reclaims_idle_stores() {
    let store = MemoryStore::builder()
        .sweep_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let policies = [
        Policy::builder("p", Rate::new(5, Duration::from_millis(10)))
            .algorithm(Algorithm::FixedWindow)
            .build()
            .unwrap(),
    ];
    for i in 0..1_000u32 {
        store
            .check_now(&Key::new("ip", i.to_string()), &policies, &[1])
            .expect("answers at once")
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

/// Charges `units` to `key`, one unit at a time.
fn charge(store: &MemoryStore, key: &Key, policies: &[Policy], units: u64) {
    for _ in 0..units {
        assert!(store
            .check_now(key, policies, &[1])
            .expect("the memory store answers at once")
            .unwrap()
            .is_allowed());
    }
}

#[test]
fn at_the_key_cap_a_flood_admits_new_clients_and_heavy_users_keep_their_state() {
    for algorithm in ALGORITHMS {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .shards(1)
            .max_keys(100)
            .background_sweep(false)
            .build()
            .unwrap();
        let policies = [Policy::builder("p", Rate::per_minute(10))
            .algorithm(algorithm)
            .build()
            .unwrap()];
        let heavy: Vec<Key> = (0..5)
            .map(|i| Key::new("user", format!("heavy{i}")))
            .collect();
        for k in &heavy {
            charge(&store, k, &policies, 8);
        }
        // 10 000 distinct one-request clients, 100 times the cap, within one window.
        for i in 0..10_000 {
            if i % 100 == 0 {
                clock.advance(Duration::from_millis(1));
            }
            let d = store
                .check_now(&Key::new("ip", format!("flood{i}")), &policies, &[1])
                .expect("answers at once")
                .unwrap();
            assert!(d.is_allowed(), "{algorithm:?}: new client {i} refused");
            assert!(store.len() <= 100, "{algorithm:?}: {} keys", store.len());
        }
        // Every heavy user still has only what it had left.
        for k in &heavy {
            let left = support::peek_now(&store, k, &policies, &[0])
                .unwrap()
                .remaining();
            assert!(left <= 2, "{algorithm:?}: {k} was reset ({left} left)");
        }
    }
}

/// Eviction measures a client's usage against the plan's limits, not against an override's
/// that happened to be the first a shard saw: with a limit-1 override charged first, every
/// flood key counted as full, eviction turned uniform, and a refused client was soon
/// forgotten (its limit afresh). The same after a reload that changes the limit.
#[tokio::test]
async fn eviction_measures_usage_by_the_plans_limits_not_an_overrides() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(100)
        .background_sweep(false)
        .build()
        .unwrap();
    let plan = |limit| {
        Limiter::builder()
            .store(store.clone())
            .policy(
                Policy::builder("p", Rate::per_hour(limit))
                    .algorithm(Algorithm::FixedWindow)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap()
    };
    let limiter = plan(10);
    let vip = Key::new("user", "vip");
    limiter
        .set_override(&vip, tollgate::overrides::Override::new("p", 1))
        .await
        .unwrap();
    assert!(limiter.check(&vip, 1).await.unwrap().is_allowed());
    let victim = Key::new("user", "victim");
    for _ in 0..10 {
        assert!(limiter.check(&victim, 1).await.unwrap().is_allowed());
    }
    assert!(!limiter.check(&victim, 1).await.unwrap().is_allowed());
    for i in 0..2_000 {
        let d = limiter
            .check(&Key::new("ip", format!("flood{i}")), 1)
            .await
            .unwrap();
        assert!(d.is_allowed());
    }
    assert!(
        !limiter.check(&victim, 1).await.unwrap().is_allowed(),
        "the refused client was evicted and starts afresh"
    );
    // A reload to a limit of 20: the victim (10 of 20) still outweighs one-request keys.
    limiter.reload(&plan(20));
    for _ in 0..10 {
        assert!(limiter.check(&victim, 1).await.unwrap().is_allowed());
    }
    for i in 0..2_000 {
        let d = limiter
            .check(&Key::new("ip", format!("again{i}")), 1)
            .await
            .unwrap();
        assert!(d.is_allowed());
    }
    assert!(!limiter.check(&victim, 1).await.unwrap().is_allowed());
}

/// The stated bound, measured: the entry evicted is the least used of a random sample, so
/// entries above the median usage are evicted with probability at most 0.5^8 each time.
#[test]
fn evictions_take_the_least_used_entries() {
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(1)
        .max_keys(1_000)
        .background_sweep(false)
        .build()
        .unwrap();
    let policies = [Policy::builder("p", Rate::per_hour(10))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap()];
    // Usage 1 to 10 units of 10, a hundred clients each.
    let clients: Vec<(Key, u64)> = (0..1_000)
        .map(|i| (Key::new("user", format!("u{i}")), i % 10 + 1))
        .collect();
    for (k, units) in &clients {
        charge(&store, k, &policies, *units);
    }
    for i in 0..100 {
        charge(&store, &Key::new("ip", format!("new{i}")), &policies, 1);
    }
    assert_eq!(store.len(), 1_000);
    // An evicted client reads as fresh: all 10 units left.
    let mut evicted_by_usage = [0u32; 11];
    for (k, units) in &clients {
        let d = support::peek_now(&store, k, &policies, &[0]).unwrap();
        if d.remaining() == 10 {
            evicted_by_usage[*units as usize] += 1;
        }
    }
    let evicted: u32 = evicted_by_usage.iter().sum();
    let above_median: u32 = evicted_by_usage[6..].iter().sum();
    eprintln!("evicted by units used (of 10): {evicted_by_usage:?}");
    assert!(
        evicted >= 50,
        "the new keys displaced mostly old ones: {evicted}"
    );
    // Expected 100 × 0.5^8 ≈ 0.4; four or more happens about once in a thousand runs.
    assert!(
        above_median <= 3,
        "{above_median} clients above the median usage were evicted"
    );
    // The smallest of 8 draws is at most 2 units with probability 1 − 0.8^8 ≈ 0.83.
    assert!(
        (evicted_by_usage[1] + evicted_by_usage[2]) * 10 >= evicted * 6,
        "most evictions take clients of one or two units: {evicted_by_usage:?}"
    );
}

/// Each eviction is counted, with the usage it dropped.
#[cfg(feature = "metrics")]
#[test]
fn evictions_are_counted() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let store = MemoryStore::builder()
            .shards(1)
            .max_keys(10)
            .background_sweep(false)
            .build()
            .unwrap();
        let policies = [Policy::new("p", Rate::per_minute(4)).unwrap()];
        for i in 0..25 {
            charge(&store, &Key::new("ip", format!("{i}")), &policies, 1);
        }
    });
    let text = handle.render();
    assert!(
        text.contains("tollgate_memory_evictions_total 15"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_memory_evicted_usage_ratio"),
        "{text}"
    );
}

#[tokio::test]
async fn several_policies_are_all_or_nothing() {
    let clock = ManualClock::new(0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
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

#[test]
fn settings_out_of_range_are_refused_naming_the_setting() {
    use tollgate::store::{FailureMode, ResilientStore};

    fn err<T>(result: Result<T, tollgate::ConfigError>) -> String {
        result.map(|_| ()).unwrap_err().to_string()
    }
    assert!(err(MemoryStore::builder().max_keys(0).build()).contains("max_keys"));
    assert!(err(MemoryStore::builder().shards(0).build()).contains("shards"));
    assert!(err(MemoryStore::builder().shards(1 << 17).build()).contains("131072"));
    assert!(err(MemoryStore::builder()
        .sweep_interval(Duration::ZERO)
        .build())
    .contains("sweep_interval"));
    assert!(MemoryStore::builder().shards(1).max_keys(1).build().is_ok());

    let resilient = || ResilientStore::builder(MemoryStore::new(), FailureMode::FailClosed);
    assert!(err(resilient().timeout(Duration::ZERO).build()).contains("timeout"));
    assert!(err(resilient()
        .circuit_breaker(0, Duration::from_secs(1))
        .build())
    .contains("circuit_breaker.failures"));
    assert!(err(resilient().circuit_breaker(3, Duration::ZERO).build())
        .contains("circuit_breaker.cooldown"));
    // A cooldown the clock cannot add (it once overflowed at the first failure).
    for huge in [
        Duration::MAX,
        Duration::from_secs(u64::MAX),
        Duration::from_secs(86_401),
    ] {
        assert!(
            err(resilient().circuit_breaker(3, huge).build()).contains("circuit_breaker.cooldown")
        );
        assert!(err(resilient().timeout(huge).build()).contains("timeout"));
    }
    assert!(resilient()
        .circuit_breaker(3, Duration::from_secs(86_400))
        .build()
        .is_ok());
    assert!(err(resilient()
        .deny_cache_max_age(Duration::from_micros(10))
        .build())
    .contains("deny_cache_max_age"));
    assert!(
        resilient().deny_cache(0).build().is_ok(),
        "0 entries turns the cache off"
    );
}

/// A token bucket of 100 per second with a burst of 1 000, and a per-key override of it
/// refilling a hundred times faster.
fn bucket_and_faster() -> (Policy, Policy) {
    let w = Duration::from_secs(1);
    let plan = Policy::builder("b", Rate::new(100, w).with_burst(1_000))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    let faster = Policy::builder("b", Rate::new(10_000, w).with_burst(10_000))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    (plan, faster)
}

#[tokio::test]
async fn a_bucket_keeps_its_usage_through_overrides_refunds_and_sweeps() {
    // An override that changes a bucket's refill rate must not let the sweeper forget usage
    // that the plan's slower rate still holds back, whichever call last touched the entry:
    // a charge on a new key, a charge on a known one (the single-policy fast path), or a
    // refund. Each case: 1 000 tokens taken (or left) under the fast override, the override
    // removed, 2.5 s later (about 250 tokens back at the plan's rate) 500 must not fit.
    let (plan, faster) = bucket_and_faster();
    let one = std::slice::from_ref(&plan);
    for case in ["new key", "known key", "refund"] {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let key = Key::new("user", case);
        match case {
            "new key" => {
                store.set_override(&key, &faster, None).await.unwrap();
                assert!(store.check(&key, one, &[1_000]).await.unwrap().is_allowed());
            }
            "known key" => {
                assert!(store.check(&key, one, &[1]).await.unwrap().is_allowed());
                clock.advance(Duration::from_millis(20));
                store.set_override(&key, &faster, None).await.unwrap();
                assert!(store.check(&key, one, &[1_000]).await.unwrap().is_allowed());
            }
            _ => {
                store.set_override(&key, &faster, None).await.unwrap();
                assert!(store.check(&key, one, &[1_000]).await.unwrap().is_allowed());
                store.refund(&key, one, &[1]).await.unwrap();
            }
        }
        store.remove_override(&key, &plan).await.unwrap();
        clock.advance(Duration::from_millis(2_500));
        store.sweep();
        assert!(
            !store.check(&key, one, &[500]).await.unwrap().is_allowed(),
            "{case}: the usage was forgotten"
        );
    }
}

#[tokio::test]
async fn a_bucket_slowed_by_an_override_keeps_its_usage_without_a_charge() {
    // 10 000 tokens taken at 10 000 per second: the entry is kept for a one-second refill.
    // An override then slows the refill to 100 per second and nothing is charged: three
    // seconds and a sweep later, 9 700 tokens are still missing, far more than the override's
    // bucket of 1 000 holds.
    let (slower, fast) = bucket_and_faster();
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let key = Key::new("user", "slowed");
    let one = std::slice::from_ref(&fast);
    assert!(store
        .check(&key, one, &[10_000])
        .await
        .unwrap()
        .is_allowed());
    store.set_override(&key, &slower, None).await.unwrap();
    clock.advance(Duration::from_secs(3));
    store.sweep();
    assert!(!store.check(&key, one, &[1]).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_refund_on_one_policy_keeps_an_overridden_bucket_beside_it() {
    // Two policies on one key; an override slows the bucket. A refund that names only the
    // other policy must not cut the entry's expiry to what the bucket needed before.
    let (slower, fast) = bucket_and_faster();
    let other = Policy::new("o", Rate::per_second(1_000)).unwrap();
    let clock = ManualClock::new(1_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    let key = Key::new("user", "beside");
    let both = [fast.clone(), other.clone()];
    assert!(store
        .check(&key, &both, &[10_000, 1])
        .await
        .unwrap()
        .is_allowed());
    store.set_override(&key, &slower, None).await.unwrap();
    store
        .refund(&key, std::slice::from_ref(&other), &[1])
        .await
        .unwrap();
    clock.advance(Duration::from_secs(3));
    store.sweep();
    assert!(!store
        .check(&key, std::slice::from_ref(&fast), &[1])
        .await
        .unwrap()
        .is_allowed());
}

/// A key limited by a rate and an in-flight policy is reclaimed once its slot is back and its
/// rate state has expired: the slot's "never expires" does not outlive the slot.
#[tokio::test]
async fn a_key_whose_slot_is_back_is_reclaimed_with_its_rate_state() {
    for override_limit in [None, Some(1)] {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .background_sweep(false)
            .build()
            .unwrap();
        let calls = Policy::new("calls", Rate::per_second(10)).unwrap();
        let limiter = Limiter::builder()
            .store(store.clone())
            .policy(calls.clone())
            .policy(Policy::in_flight("running", 5).unwrap())
            .build()
            .unwrap();
        let key = Key::new("ip", "203.0.113.7");
        if let Some(limit) = override_limit {
            limiter
                .set_override(&key, tollgate::Override::new("calls", limit))
                .await
                .unwrap();
        }
        let permit = limiter.acquire(&key).await.unwrap();
        assert!(permit.decision().is_allowed());
        drop(permit);
        clock.advance(Duration::from_secs(3));
        store.sweep();
        assert_eq!(
            store.len(),
            0,
            "the entry outlived its slot (override: {override_limit:?})"
        );
    }
}
