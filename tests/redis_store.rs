//! The Redis store against a real `redis-server` spawned per test.

mod support;

use std::time::Duration;
use tollgate::store::StoreExt;

use proptest::test_runner::{Config, TestRunner};
use support::scenarios::{self, Step, ALGORITHMS};
use support::RedisServer;
use tollgate::clock::{Clock, ManualClock, SystemClock};
use tollgate::key::Key;
use tollgate::store::{DynStore, MemoryStore, RedisStore, Store};
use tollgate::{Algorithm, Policy, Rate, StoreError};

const T0: u64 = 1_700_000_000_123;

fn manual_store(server: &RedisServer, clock: &ManualClock, tag: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(scenarios::unique_prefix(tag))
        .clock(clock.clone())
        .build_with_url(&server.url())
        .unwrap()
}

/// Random traces through the memory store and the Redis store give the same decisions.
fn differential(policies: Vec<Policy>, cases: u32) {
    let server = RedisServer::start();
    let rt = support::runtime();
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&scenarios::trace(1_000..1_600, 3), |steps: Vec<Step>| {
        let clock = ManualClock::new(T0);
        let store = manual_store(&server, &clock, "diff");
        rt.block_on(scenarios::run_differential(
            &store, &clock, &policies, &steps,
        ))
    });
    if let Err(e) = result {
        // The failing step comes first; the whole trace would drown it.
        panic!("{}", e.to_string().chars().take(3_000).collect::<String>());
    }
}

#[test]
fn differential_sliding_window_counter() {
    differential(
        scenarios::differential_policies(Algorithm::SlidingWindowCounter),
        3,
    );
}

#[test]
fn differential_sliding_window_log() {
    differential(
        scenarios::differential_policies(Algorithm::SlidingWindowLog),
        3,
    );
}

#[test]
fn differential_token_bucket() {
    differential(scenarios::differential_policies(Algorithm::TokenBucket), 3);
}

#[test]
fn differential_fixed_window() {
    differential(scenarios::differential_policies(Algorithm::FixedWindow), 3);
}

#[test]
fn differential_gcra_with_shaping() {
    differential(scenarios::differential_policies(Algorithm::Gcra), 3);
}

#[test]
fn differential_mixed_policies_all_or_nothing() {
    differential(scenarios::mixed_policies(), 3);
}

#[test]
fn aggregate_enforcement_four_instances_sixty_four_tasks_each() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let prefix = scenarios::unique_prefix("aggregate");
    // Four independent stores: two on their own pools, two on their own multiplexed
    // connections.
    let stores: Vec<RedisStore> = (0..4)
        .map(|i| {
            let b = RedisStore::builder().prefix(prefix.clone());
            if i % 2 == 0 {
                b.build_with_pool(server.pool(16)).unwrap()
            } else {
                b.build_with_url(&server.url()).unwrap()
            }
        })
        .collect();
    let keys: Vec<Key> = (0..5)
        .map(|i| Key::new("tenant", format!("t{i}")))
        .collect();
    rt.block_on(scenarios::exactly_the_limit_in_aggregate(
        &stores, &keys, 64, &server,
    ));
}

async fn admitted_at(
    store: &impl Store,
    clock: &ManualClock,
    policy: &Policy,
    times: &[u64],
) -> u64 {
    let key = Key::new("user", "flip");
    let mut admitted = 0;
    for &t in times {
        clock.set_millis(t);
        let d = store
            .check(&key, std::slice::from_ref(policy), &[1])
            .await
            .unwrap();
        admitted += u64::from(d.is_allowed());
    }
    admitted
}

#[test]
fn no_double_burst_at_a_window_flip() {
    let server = RedisServer::start();
    let rt = support::runtime();
    rt.block_on(async {
        // Ten at the last millisecond of a window, then ten at each of the next two.
        let flip = 1_700_000_001_000;
        let times: Vec<u64> = [flip - 1, flip, flip + 1]
            .iter()
            .flat_map(|&t| std::iter::repeat_n(t, 10))
            .collect();
        let rate = Rate::new(10, Duration::from_secs(1));
        let clock = ManualClock::new(flip - 1);
        let counter = scenarios::policy("c", rate, Algorithm::SlidingWindowCounter);
        let store = manual_store(&server, &clock, "flip");
        assert_eq!(admitted_at(&store, &clock, &counter, &times).await, 10);
        let log = scenarios::policy("l", rate, Algorithm::SlidingWindowLog);
        assert_eq!(admitted_at(&store, &clock, &log, &times).await, 10);
        // The fixed window's documented weakness shows through Redis too: 2N within 2 ms.
        let fixed = scenarios::policy("f", rate, Algorithm::FixedWindow);
        assert_eq!(admitted_at(&store, &clock, &fixed, &times).await, 20);
    });
}

/// Admitted times from a long random trace through Redis; every span must respect the
/// algorithm's documented bound.
#[test]
fn interval_bounds_hold_through_redis() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let w = 1_000u64;
    let n = 10u64;
    let cases = [
        (Algorithm::SlidingWindowCounter, n),
        (Algorithm::SlidingWindowLog, n),
        (Algorithm::TokenBucket, n),
        (Algorithm::Gcra, n),
    ];
    rt.block_on(async {
        for (algorithm, capacity) in cases {
            let clock = ManualClock::new(T0);
            let store = manual_store(&server, &clock, "bounds");
            let p = scenarios::policy("b", Rate::new(n, Duration::from_millis(w)), algorithm);
            let key = Key::new("user", "bounds");
            let mut admitted = Vec::new();
            let mut x: u64 = 12345;
            for _ in 0..2_000 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                clock.advance(Duration::from_millis((x >> 33) % 40));
                let d = store
                    .check(&key, std::slice::from_ref(&p), &[1])
                    .await
                    .unwrap();
                if d.is_allowed() {
                    admitted.push(clock.now_millis());
                }
            }
            assert!(
                admitted.len() > 200,
                "{algorithm}: too few admissions to mean anything"
            );
            for (i, &start) in admitted.iter().enumerate() {
                for (j, &end) in admitted.iter().enumerate().skip(i) {
                    let span = end - start; // admissions in [start, end]
                    if span >= w {
                        break;
                    }
                    let count = (j - i + 1) as u64;
                    let bound = match algorithm {
                        Algorithm::SlidingWindowLog => n,
                        // N + N·L/W (counter) and C + N·L/W (buckets), L = span + 1 ms.
                        _ => capacity + (n * (span + 1)).div_ceil(w),
                    };
                    assert!(
                        count <= bound,
                        "{algorithm}: {count} admitted in {span} ms, bound {bound}"
                    );
                }
            }
        }
    });
}

#[test]
fn noscript_after_script_flush_is_reloaded_transparently() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let cached = || -> String {
        let info: String = server.query(&["INFO", "memory"]).unwrap();
        info.lines()
            .find(|l| l.starts_with("number_of_cached_scripts:"))
            .unwrap()
            .trim()
            .to_owned()
    };
    rt.block_on(async {
        let clock = ManualClock::new(T0);
        let store = manual_store(&server, &clock, "noscript");
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let policies = scenarios::mixed_policies();
        let costs = vec![1; policies.len()];
        let key = Key::new("user", "noscript");
        for i in 0..600u64 {
            if i % 150 == 75 {
                let _: String = server.query(&["SCRIPT", "FLUSH"]).unwrap();
                assert_eq!(cached(), "number_of_cached_scripts:0");
            }
            clock.advance(Duration::from_millis(i % 7 * 13));
            let m = memory.check(&key, &policies, &costs).await.unwrap();
            let r = store.check(&key, &policies, &costs).await.unwrap();
            assert_eq!(m, r, "step {i}");
        }
        assert_eq!(cached(), "number_of_cached_scripts:1");
    });
}

#[test]
fn every_key_has_a_ttl_and_none_is_left_after_the_windows() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let prefix = scenarios::unique_prefix("leak");
    let store = RedisStore::builder()
        .prefix(prefix.clone())
        .build_with_url(&server.url())
        .unwrap();
    let w = Duration::from_millis(200);
    let policies: Vec<Policy> = ALGORITHMS
        .iter()
        .map(|&a| scenarios::policy(&format!("p{}", a as u8), Rate::new(5, w), a))
        .collect();
    let pattern = format!("{prefix}:*");
    rt.block_on(async {
        for round in 0..30u32 {
            for k in 0..8 {
                let key = Key::new("user", format!("{k}"));
                for p in &policies {
                    store
                        .check(&key, std::slice::from_ref(p), &[1])
                        .await
                        .unwrap();
                }
            }
            if round % 10 == 5 {
                let keys = server.scan(&pattern);
                assert_eq!(keys.len(), 8 * policies.len(), "{keys:?}");
                for k in &keys {
                    let pttl: i64 = server.query(&["PTTL", k]).unwrap();
                    // The counter's state matters for up to two windows; its key's expiry
                    // is rounded up to the grid after the margin.
                    let longest = 2 * 200
                        + tollgate::store::redis::TTL_MARGIN_MS as i64
                        + tollgate::store::redis::TTL_GRID_MS as i64;
                    assert!(pttl > 0 && pttl <= longest, "{k}: PTTL {pttl}");
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    // The longest-lived state (the counter's) matters until two windows after its last
    // charge, plus the margin and at most one step of the grid.
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    loop {
        let left = server.scan(&pattern);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "keys left behind: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A clock that is real but off by `offset` ms, as on a pod with a skewed clock. It leaves
/// `is_injected` at its default, as a user's own production clock would: Redis must keep
/// deciding on its own `TIME`.
#[derive(Debug)]
struct Skewed {
    offset: u64,
    inner: SystemClock,
}

impl Clock for Skewed {
    fn now_millis(&self) -> u64 {
        self.inner.now_millis() + self.offset
    }
}

#[test]
fn instances_with_skewed_clocks_share_one_limit() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let prefix = scenarios::unique_prefix("skew");
    let store = |offset: u64| {
        RedisStore::builder()
            .prefix(prefix.clone())
            .clock(Skewed {
                offset,
                inner: SystemClock::new(),
            })
            .build_with_url(&server.url())
            .unwrap()
    };
    let (a, b) = (store(0), store(5_000));
    assert!(b.now_millis() >= a.now_millis() + 4_990);
    // With local clocks 5 s apart, a 5 s fixed window would be two windows (2N) and GCRA's
    // backlog would have drained for the later pod (2N again). The server clock gives N.
    let w = Duration::from_secs(5);
    let policies = [
        scenarios::policy("fixed", Rate::new(10, w), Algorithm::FixedWindow),
        scenarios::policy("gcra", Rate::new(10, w), Algorithm::Gcra),
        scenarios::policy("counter", Rate::new(10, w), Algorithm::SlidingWindowCounter),
    ];
    rt.block_on(async {
        scenarios::avoid_window_flip(|| server.now_millis(), w, Duration::from_secs(1)).await;
        for p in &policies {
            let key = Key::new("user", "skew");
            let mut admitted = 0;
            for i in 0..40 {
                let s = if i % 2 == 0 { &a } else { &b };
                let d = s.check(&key, std::slice::from_ref(p), &[1]).await.unwrap();
                admitted += u32::from(d.is_allowed());
            }
            assert_eq!(admitted, 10, "{}", p.name());
        }
    });
}

#[test]
fn multi_policy_denial_charges_nothing_and_peek_and_reset_work() {
    let server = RedisServer::start();
    let rt = support::runtime();
    rt.block_on(async {
        let clock = ManualClock::new(T0);
        let store = manual_store(&server, &clock, "multi");
        let burst = scenarios::policy(
            "burst",
            Rate::per_second(2),
            Algorithm::SlidingWindowCounter,
        );
        let daily = scenarios::policy("daily", Rate::per_day(1_000), Algorithm::SlidingWindowLog);
        let both = [burst, daily];
        let key = Key::new("user", "42");
        for _ in 0..2 {
            assert!(store
                .check(&key, &both, &[1, 1])
                .await
                .unwrap()
                .is_allowed());
        }
        for _ in 0..5 {
            let d = store.check(&key, &both, &[1, 1]).await.unwrap();
            assert!(!d.is_allowed());
            assert_eq!(d.governing_index(), 0);
            // The daily policy alone would allow, but it was not charged for the denied
            // requests: it reports its state as it stands, 998 left.
            assert!(d.policies()[1].is_allowed());
            assert_eq!(d.policies()[1].remaining(), 998);
        }
        let peeked = store.peek(&key, &both, &[1, 1]).await.unwrap();
        assert!(!peeked.is_allowed());
        store.reset(&key, &both).await.unwrap();
        let d = store.check(&key, &both, &[1, 1]).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.policies()[1].remaining(), 999);
        assert_eq!(store.name(), "redis");
    });
}

#[test]
fn log_requests_in_one_millisecond_all_count() {
    let server = RedisServer::start();
    let rt = support::runtime();
    rt.block_on(async {
        let clock = ManualClock::new(T0);
        let store = manual_store(&server, &clock, "samems");
        let p = scenarios::policy("log", Rate::per_second(5), Algorithm::SlidingWindowLog);
        let key = Key::new("user", "same-ms");
        for i in 0..5 {
            let d = store
                .check(&key, std::slice::from_ref(&p), &[1])
                .await
                .unwrap();
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), 4 - i);
        }
        assert!(!store
            .check(&key, std::slice::from_ref(&p), &[1])
            .await
            .unwrap()
            .is_allowed());
        let k = format!("{}:{{user:same-ms}}:log:swl", store.prefix());
        let members: Vec<String> = server.query(&["ZRANGE", &k, "0", "-1"]).unwrap();
        assert_eq!(members, vec![format!("{T0}:5")]);
    });
}

#[test]
fn failures_are_typed_store_errors() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let p = [Policy::new("p", Rate::per_second(5)).unwrap()];
    let key = Key::new("user", "err");
    rt.block_on(async {
        // Nothing listens: connection errors, from a URL and from a pool.
        let dead = RedisServer::start();
        let dead_url = dead.url();
        let dead_pool = dead.pool(2);
        drop(dead);
        let store = RedisStore::builder()
            .timeout(Duration::from_millis(300))
            .build_with_url(&dead_url)
            .unwrap();
        let e = store.check(&key, &p, &[1]).await.unwrap_err();
        assert!(matches!(e, StoreError::Connection(_)), "{e:?}");
        let store = RedisStore::from_pool(dead_pool);
        let e = store.check(&key, &p, &[1]).await.unwrap_err();
        assert!(matches!(e, StoreError::Connection(_)), "{e:?}");

        // A key of the wrong type: the script fails, as a backend error.
        let store = RedisStore::builder()
            .prefix(scenarios::unique_prefix("err"))
            .timeout(Duration::from_millis(300))
            .build_with_url(&server.url())
            .unwrap();
        let k = format!("{}:{{user:err}}:p:swc", store.prefix());
        let _: () = server.query(&["SET", &k, "not a hash"]).unwrap();
        let e = store.check(&key, &p, &[1]).await.unwrap_err();
        assert!(matches!(e, StoreError::Backend(_)), "{e:?}");
        store.reset(&key, &p).await.unwrap();
        assert!(store.check(&key, &p, &[1]).await.unwrap().is_allowed());

        // A stalled server: a timeout, then service again once it is back.
        server.signal("STOP");
        let e = store.check(&key, &p, &[1]).await.unwrap_err();
        server.signal("CONT");
        assert_eq!(e, StoreError::Timeout);
        let mut ok = false;
        for _ in 0..50 {
            if store.check(&key, &p, &[1]).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ok, "the store did not recover after the server came back");
    });
}

#[test]
fn builder_refuses_bad_prefixes_and_urls() {
    for prefix in ["", "a{b", "a}b", "a b"] {
        let err = RedisStore::builder()
            .prefix(prefix)
            .build_with_url("redis://127.0.0.1:1")
            .unwrap_err();
        assert_eq!(err.field(), "prefix");
    }
    let err = RedisStore::from_url("not a url").unwrap_err();
    assert_eq!(err.field(), "url");
    assert_eq!(
        RedisStore::from_url("redis://127.0.0.1:1")
            .unwrap()
            .prefix(),
        "tollgate"
    );
}

/// A tiny deterministic generator, so a failing round can be replayed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (self.0 >> 33) % n
    }
}

/// Decisions queued behind a call in flight leave together as one script call, and each
/// caller gets what the memory store answers for the same requests made one after another:
/// batching changes the number of calls, never an answer.
#[test]
fn batched_decisions_equal_the_same_decisions_one_by_one() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = ManualClock::new(T0);
        let store = RedisStore::builder()
            .prefix(scenarios::unique_prefix("batch"))
            .clock(clock.clone())
            .max_in_flight(1)
            .build_with_url(&server.url())
            .unwrap();
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let all = scenarios::mixed_policies();
        let keys: Vec<Key> = (0..3).map(|i| Key::new("user", i.to_string())).collect();
        let mut rng = Lcg(7);
        let mut decisions = 0u64;
        let calls_before = server.command_calls("evalsha");
        for round in 0..40 {
            clock.advance(Duration::from_millis(rng.below(700)));
            let n = 1 + rng.below(40) as usize;
            let mut requests = Vec::new();
            for _ in 0..n {
                let key = keys[rng.below(3) as usize].clone();
                // One policy, or two or three decided together.
                let count = 1 + rng.below(3) as usize;
                let first = rng.below(all.len() as u64) as usize;
                let policies: Vec<Policy> = (0..count)
                    .map(|j| all[(first + j * 2) % all.len()].clone())
                    .collect();
                let costs: Vec<u64> = policies.iter().map(|_| 1 + rng.below(3)).collect();
                let peek = rng.below(10) == 0;
                requests.push((key, policies, costs, peek));
            }
            // Made in order before any runs: the first is sent, the rest queue behind it.
            let pending: Vec<_> = requests
                .iter()
                .map(|(key, policies, costs, peek)| {
                    if *peek {
                        store.peek(key, policies, costs)
                    } else {
                        store.check(key, policies, costs)
                    }
                })
                .collect();
            let handles: Vec<_> = pending.into_iter().map(tokio::spawn).collect();
            for (i, ((key, policies, costs, peek), handle)) in
                requests.iter().zip(handles).enumerate()
            {
                let got = handle.await.unwrap().unwrap();
                let want = if *peek {
                    memory.peek(key, policies, costs).await.unwrap()
                } else {
                    memory.check(key, policies, costs).await.unwrap()
                };
                assert_eq!(got, want, "round {round}, request {i} of {n}");
                decisions += 1;
            }
        }
        let calls = server.command_calls("evalsha") - calls_before;
        // Two calls a round at most (the first request, then the rest), never one each.
        assert!(calls <= 80, "{calls} calls for {decisions} decisions");
    });
}

/// Many callers on one hot key: exactly the limit passes, every allowed caller sees its own
/// remaining count (each value once), and the decisions took far fewer script calls.
#[test]
fn a_hot_key_is_decided_in_batches_with_each_caller_its_own_answer() {
    let server = RedisServer::start();
    support::runtime().block_on(async {
        for algorithm in ALGORITHMS {
            let store = RedisStore::builder()
                .prefix(scenarios::unique_prefix("hot"))
                .build_with_url(&server.url())
                .unwrap();
            let policies = vec![scenarios::policy("hot", Rate::per_hour(300), algorithm)];
            let key = Key::new("user", "hot");
            store.check(&key, &policies, &[0]).await.unwrap(); // connect
            let calls_before = server.command_calls("evalsha");
            let tasks: Vec<_> = (0..600)
                .map(|_| {
                    let (store, policies, key) = (store.clone(), policies.clone(), key.clone());
                    tokio::spawn(async move { store.check(&key, &policies, &[1]).await })
                })
                .collect();
            let mut remaining = Vec::new();
            let mut denied = 0;
            for t in tasks {
                let d = t.await.unwrap().unwrap();
                if d.is_allowed() {
                    remaining.push(d.remaining());
                } else {
                    assert!(d.retry_after_millis() > 0);
                    denied += 1;
                }
            }
            remaining.sort_unstable();
            assert_eq!(remaining, (0..300).collect::<Vec<u64>>(), "{algorithm}");
            assert_eq!(denied, 300, "{algorithm}");
            let calls = server.command_calls("evalsha") - calls_before;
            assert!(
                calls < 600,
                "{algorithm}: {calls} script calls for 600 decisions"
            );
        }
    });
}

/// A key holding somebody else's value fails its own requests only: the rest of the batch
/// is decided and charged as usual.
#[test]
fn a_bad_key_fails_only_its_own_requests_in_a_batch() {
    let server = RedisServer::start();
    support::runtime().block_on(async {
        for algorithm in ALGORITHMS {
            let store = RedisStore::builder()
                .prefix(scenarios::unique_prefix("badkey"))
                .max_in_flight(1)
                .build_with_url(&server.url())
                .unwrap();
            let policies = vec![scenarios::policy("p", Rate::per_hour(10), algorithm)];
            let good = Key::new("user", "good");
            let bad = Key::new("user", "bad");
            store.check(&good, &policies, &[1]).await.unwrap();
            store.check(&bad, &policies, &[1]).await.unwrap();
            for k in server.scan(&format!("{}:{{user:bad}}:*", store.prefix())) {
                let _: () = server.query(&["DEL", &k]).unwrap();
                let _: () = server.query(&["SADD", &k, "not-a-limiter"]).unwrap();
            }
            let pending: Vec<_> = (0..6)
                .map(|i| {
                    let key = if i % 2 == 0 { &good } else { &bad };
                    tokio::spawn(store.check(key, &policies, &[1]))
                })
                .collect();
            for (i, p) in pending.into_iter().enumerate() {
                let r = p.await.unwrap();
                if i % 2 == 0 {
                    let d = r.unwrap();
                    assert!(d.is_allowed(), "{algorithm}");
                    assert_eq!(d.remaining(), 8 - i as u64 / 2, "{algorithm}");
                } else {
                    assert!(
                        matches!(r, Err(StoreError::Backend(_))),
                        "{algorithm}: {r:?}"
                    );
                }
            }
        }
    });
}

#[test]
fn batch_settings_are_checked_when_the_store_is_built() {
    for (batch, in_flight, field) in [
        (0, 2, "max_batch"),
        (5_000, 2, "max_batch"),
        (8, 0, "max_in_flight"),
    ] {
        let err = RedisStore::builder()
            .max_batch(batch)
            .max_in_flight(in_flight)
            .build_with_url("redis://127.0.0.1:1")
            .unwrap_err();
        assert_eq!(err.field(), field);
    }
}

#[test]
fn no_policies_allow_without_a_call_like_the_memory_store() {
    let server = RedisServer::start();
    let rt = support::runtime();
    rt.block_on(async {
        let clock = ManualClock::new(T0);
        let redis = manual_store(&server, &clock, "empty");
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let key = Key::new("user", "nobody");
        let from_memory = memory.check(&key, &[], &[]).await.unwrap();
        let checked = redis.check(&key, &[], &[]).await.unwrap();
        let peeked = redis.peek(&key, &[], &[]).await.unwrap();
        assert!(checked.is_allowed() && peeked.is_allowed());
        assert!(checked.policies().is_empty());
        assert_eq!(checked, from_memory);
        redis.reset(&key, &[]).await.unwrap();
        // A real request still works after them (one policy, read in the one-unpack path).
        let policy = Policy::new("api", Rate::per_second(1)).unwrap();
        let one = std::slice::from_ref(&policy);
        assert!(redis.check(&key, one, &[1]).await.unwrap().is_allowed());
        assert!(!redis.check(&key, one, &[1]).await.unwrap().is_allowed());
    });
}

/// When Redis will expire a GCRA or token bucket state key (ms on the server's clock), and
/// when the state it holds stops mattering (`expires_at` in lua/, on the same clock, since
/// the script read the server's `TIME`). `limit` is the limit the state is decided with (the
/// bucket refills `limit` tokens per window).
fn expiry_and_relevance(
    server: &RedisServer,
    key: &str,
    algorithm: Algorithm,
    limit: u64,
) -> (i64, i64) {
    // PEXPIRETIME, but also on Redis 6 (PEXPIRETIME is 7.0): TIME plus PTTL, in one script.
    let expires: i64 = server
        .query(&[
            "EVAL",
            "local t = redis.call('TIME') \
             return t[1] * 1000 + math.floor(t[2] / 1000) + redis.call('PTTL', KEYS[1])",
            "1",
            key,
        ])
        .unwrap();
    let v: Vec<u8> = server.query(&["GET", key]).unwrap();
    // Two doubles, then the override mark (`N`) when no override was in force.
    assert!(
        v.len() == 16 || v.len() == 17 && v[16] == b'N',
        "{key}: {v:?}"
    );
    let a = f64::from_le_bytes(v[..8].try_into().unwrap());
    let b = f64::from_le_bytes(v[8..16].try_into().unwrap());
    let stops = match algorithm {
        // {tat, remainder in 1/N ms}
        Algorithm::Gcra => a + if b > 0.0 { 1.0 } else { 0.0 },
        // {deficit in tokens x W, updated_at}, refilled by N per ms
        Algorithm::TokenBucket => b + (a / limit as f64).ceil(),
        other => panic!("{other:?} has no string state here"),
    };
    (expires, stops as i64)
}

/// The key outlives its state, by at least the margin less one step of the grid, and by at
/// most the margin plus one step (give or take Redis's time for the write against the
/// script's `TIME`).
fn assert_expiry_bounds(key: &str, expires: i64, stops: i64, step: usize) {
    let margin = tollgate::store::redis::TTL_MARGIN_MS as i64;
    let grid = tollgate::store::redis::TTL_GRID_MS as i64;
    // Redis counts `PX` from its own time at the write, a little after the script's `TIME`
    // (more on a busy machine).
    const CLOCK_MS: i64 = 20;
    assert!(
        expires >= stops + margin - grid - CLOCK_MS && expires <= stops + margin + grid + CLOCK_MS,
        "step {step}, {key}: expires at {expires}, its state stops mattering at {stops} \
         ({} ms after it)",
        expires - stops
    );
}

/// Follows one state key through decisions: checks the bounds after each, counts the writes
/// that kept the TTL (the state's expiry moved, the key's did not), and with `as_before`
/// now and then gives the key the exact TTL an earlier version of the script wrote
/// (`expires_at + margin`).
struct Watched<'a> {
    server: &'a RedisServer,
    key: String,
    algorithm: Algorithm,
    limit: u64,
    last: Option<(i64, i64)>,
    kept: u32,
    as_before: bool,
}

impl<'a> Watched<'a> {
    fn new(
        server: &'a RedisServer,
        store: &RedisStore,
        user: &Key,
        p: &Policy,
        limit: u64,
    ) -> Self {
        let key = format!(
            "{}:{{{}}}:{}:{}",
            store.prefix(),
            user.as_str(),
            p.name(),
            if p.algorithm() == Algorithm::Gcra {
                "gcra"
            } else {
                "tb"
            }
        );
        Watched {
            server,
            key,
            algorithm: p.algorithm(),
            limit,
            last: None,
            kept: 0,
            as_before: false,
        }
    }

    fn after_decision(&mut self, step: usize) {
        let (expires, stops) =
            expiry_and_relevance(self.server, &self.key, self.algorithm, self.limit);
        assert_expiry_bounds(&self.key, expires, stops, step);
        if self.last.is_some_and(|(e, s)| e == expires && s != stops) {
            self.kept += 1;
        }
        self.last = Some((expires, stops));
        if self.as_before && step % 30 == 15 {
            let old = (stops + tollgate::store::redis::TTL_MARGIN_MS as i64).to_string();
            let set: i64 = self.server.query(&["PEXPIREAT", &self.key, &old]).unwrap();
            assert_eq!(set, 1);
            self.last = None;
        }
    }
}

#[test]
fn gcra_and_bucket_keys_expire_on_the_grid_and_never_before_their_state() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let store = RedisStore::builder()
        .prefix(scenarios::unique_prefix("grid"))
        .build_with_url(&server.url())
        .unwrap();
    // GCRA: one request every 25 ms, a burst of 80. Bucket: 10 000 tokens per second,
    // refilled 1 per 0.1 ms, so its expiry stays within a few ms of now.
    let gcra = scenarios::policy("g", Rate::new(80, Duration::from_secs(2)), Algorithm::Gcra);
    let bucket = scenarios::policy(
        "b",
        Rate::new(10_000, Duration::from_secs(1)),
        Algorithm::TokenBucket,
    );
    rt.block_on(async {
        // Lone decisions (lua/single.lua).
        // The bucket's expiry moves only when the ms turns between two requests, so fewer of
        // its writes count as kept (its key kept its TTL while its state's expiry moved).
        for (p, limit, requests, kept) in [(&gcra, 80, 80, 40), (&bucket, 10_000, 200, 25)] {
            let user = Key::new("user", "single");
            let mut w = Watched::new(&server, &store, &user, p, limit);
            w.as_before = true;
            for step in 0..requests {
                let d = store
                    .check(&user, std::slice::from_ref(p), &[1])
                    .await
                    .unwrap();
                assert!(d.is_allowed(), "{}: step {step}", p.name());
                w.after_decision(step);
            }
            assert!(
                w.kept >= kept,
                "{}: {} writes kept the TTL",
                p.name(),
                w.kept
            );
        }
        // Two policies in one request (lua/decide.lua, the path of batches).
        let user = Key::new("user", "general");
        let both = [gcra.clone(), bucket.clone()];
        let mut g = Watched::new(&server, &store, &user, &gcra, 80);
        let mut b = Watched::new(&server, &store, &user, &bucket, 10_000);
        g.as_before = true;
        b.as_before = true;
        for step in 0..80 {
            let d = store.check(&user, &both, &[1, 1]).await.unwrap();
            assert!(d.is_allowed(), "step {step}");
            g.after_decision(step);
            b.after_decision(step);
        }
        assert!(
            g.kept >= 40 && b.kept >= 10,
            "kept the TTL: {} and {}",
            g.kept,
            b.kept
        );
    });
}

#[test]
fn a_gcra_key_stays_refused_until_its_retry_time_through_kept_ttls() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let store = RedisStore::builder()
        .prefix(scenarios::unique_prefix("retry"))
        .build_with_url(&server.url())
        .unwrap();
    let gcra = scenarios::policy("g", Rate::new(80, Duration::from_secs(2)), Algorithm::Gcra);
    let one = std::slice::from_ref(&gcra);
    let user = Key::new("user", "burst");
    rt.block_on(async {
        // A burst of 80 moves the TAT 2 s ahead, 25 ms per request: most writes keep the TTL
        // the first ones set, which alone would end about 1.5 s after the burst.
        let start = server.now_millis();
        let mut w = Watched::new(&server, &store, &user, &gcra, 80);
        for step in 0..80 {
            assert!(store.check(&user, one, &[1]).await.unwrap().is_allowed());
            w.after_decision(step);
        }
        assert!(w.kept >= 40, "{} writes kept the TTL", w.kept);
        // A whole burst must wait until the TAT: 2 s after the burst began, less however
        // long the burst took (a busy machine makes it slower).
        let d = store.check(&user, one, &[80]).await.unwrap();
        let elapsed = (server.now_millis() - start) as i64;
        assert!(!d.is_allowed());
        let retry = d.retry_after().unwrap();
        let least = (2_000 - elapsed - 50).max(1);
        assert!(
            retry.as_millis() as i64 >= least,
            "{retry:?} after {elapsed} ms"
        );
        // Past the end of the TTL the first writes set, the state still refuses.
        while server.now_millis() < start + 1_700 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let d = store.check(&user, one, &[80]).await.unwrap();
        assert!(!d.is_allowed(), "the state vanished before its retry time");
        let left = d.retry_after().unwrap();
        assert!(left > Duration::ZERO && left < retry, "{left:?}");
        let (expires, stops) = expiry_and_relevance(&server, &w.key, Algorithm::Gcra, 80);
        assert_expiry_bounds(&w.key, expires, stops, 80);
        tokio::time::sleep(left).await;
        assert!(store.check(&user, one, &[80]).await.unwrap().is_allowed());
    });
}

#[test]
fn a_refund_that_moves_a_state_back_moves_its_expiry_back_too() {
    // The general path (a refund is not the fast path's call) keeps a TTL only while it stays
    // within the bounds: giving back a charge moves the state's end seconds earlier, and the
    // key's expiry must follow rather than keep the later one.
    let server = RedisServer::start();
    let rt = support::runtime();
    let store = RedisStore::builder()
        .prefix(scenarios::unique_prefix("refund-ttl"))
        .build_with_url(&server.url())
        .unwrap();
    let w = Duration::from_secs(10);
    let gcra = scenarios::policy("g", Rate::new(100, w), Algorithm::Gcra);
    let bucket = scenarios::policy("b", Rate::new(100, w), Algorithm::TokenBucket);
    rt.block_on(async {
        for p in [&gcra, &bucket] {
            let one = std::slice::from_ref(p);
            let user = Key::new("user", "refund");
            let mut watched = Watched::new(&server, &store, &user, p, 100);
            // 40 requests at 100 ms each: the state matters for 4 s.
            assert!(store.check(&user, one, &[40]).await.unwrap().is_allowed());
            watched.after_decision(0);
            // All given back: 4 s less, far more than a step of the grid. (For the bucket the
            // state as read was written at about the time the refunded one is, the case where
            // only the old expiry tells the write to set a new TTL.)
            store.refund(&user, one, &[40]).await.unwrap();
            watched.after_decision(1);
            let (expires, stops) = watched.last.unwrap();
            assert!(
                expires - server.now_millis() as i64 <= 2_600,
                "{:?}: the key still expires {} ms from now, its state stops mattering {} ms \
                 from now",
                p.algorithm(),
                expires - server.now_millis() as i64,
                stops - server.now_millis() as i64
            );
        }
    });
}

/// Runs `steps` against a Redis store and the memory store side by side on the real clock,
/// and requires `expected` from both.
async fn bucket_on_both<F>(server: &RedisServer, label: &str, expected: &[bool], steps: F)
where
    F: for<'a> Fn(
        &'a DynStore,
        &'a Key,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Vec<bool>> + 'a>>,
{
    let redis = RedisStore::builder()
        .prefix(scenarios::unique_prefix(label))
        .build_with_url(&server.url())
        .unwrap();
    let (redis, memory) = (
        DynStore::new(redis),
        DynStore::new(MemoryStore::builder().build().unwrap()),
    );
    let user = Key::new("user", label);
    let (r, m) = tokio::join!(steps(&redis, &user), steps(&memory, &user));
    assert_eq!(
        r, m,
        "{label}: Redis answered {r:?}, the memory store {m:?}"
    );
    assert_eq!(r, expected, "{label}: both stores answered {r:?}");
}

#[test]
fn a_bucket_slowed_by_an_override_keeps_its_usage_with_no_write_in_between() {
    // 10 000 tokens taken at 10 000/s: the key's TTL is set for a refill of one second. An
    // override then slows the refill to 100/s, and nothing is charged until the old TTL has
    // run out: the usage must still hold (setting the override extends the TTL).
    let server = RedisServer::start();
    let rt = support::runtime();
    let w = Duration::from_secs(1);
    rt.block_on(bucket_on_both(
        &server,
        "slowed",
        &[true, false],
        |store, user| {
            Box::pin(async move {
                let plan = scenarios::policy(
                    "b",
                    Rate::new(10_000, w).with_burst(10_000),
                    Algorithm::TokenBucket,
                );
                let slower = scenarios::policy(
                    "b",
                    Rate::new(100, w).with_burst(1_000),
                    Algorithm::TokenBucket,
                );
                let one = std::slice::from_ref(&plan);
                let mut answers = vec![store
                    .check(user, one, &[10_000])
                    .await
                    .unwrap()
                    .is_allowed()];
                store.set_override(user, &slower, None).await.unwrap();
                tokio::time::sleep(Duration::from_millis(3_000)).await;
                // 300 tokens refilled of 10 000 taken: far from the 1 000 the override's bucket holds.
                answers.push(store.check(user, one, &[1]).await.unwrap().is_allowed());
                answers
            })
        },
    ));
}

#[test]
fn a_bucket_keeps_its_usage_when_an_override_that_sped_it_up_is_removed() {
    // Under an override of 10 000/s, 1 000 tokens taken would refill in 0.1 s; the plan's
    // 100/s needs 10 s. The override is removed with no write after: the usage must hold
    // under the plan's rate (the key's TTL followed the slower of the two rates). Alone
    // (lua/single.lua) and beside a second policy (lua/decide.lua), at once.
    let server = RedisServer::start();
    let rt = support::runtime();
    let w = Duration::from_secs(1);
    let run = |label: &'static str, beside: bool| {
        bucket_on_both(&server, label, &[true, false], move |store, user| {
            Box::pin(async move {
                let plan = scenarios::policy(
                    "b",
                    Rate::new(100, w).with_burst(1_000),
                    Algorithm::TokenBucket,
                );
                let faster = scenarios::policy(
                    "b",
                    Rate::new(10_000, w).with_burst(10_000),
                    Algorithm::TokenBucket,
                );
                let other = scenarios::policy("o", Rate::new(1_000_000, w), Algorithm::Gcra);
                let policies = if beside {
                    vec![plan.clone(), other]
                } else {
                    vec![plan.clone()]
                };
                let costs = |c: u64| {
                    let mut v = vec![c];
                    v.resize(policies.len(), 1);
                    v
                };
                store.set_override(user, &faster, None).await.unwrap();
                let mut answers = vec![store
                    .check(user, &policies, &costs(1_000))
                    .await
                    .unwrap()
                    .is_allowed()];
                store.remove_override(user, &plan).await.unwrap();
                tokio::time::sleep(Duration::from_millis(2_500)).await;
                // About 250 tokens back at the plan's rate (a whole bucket takes 10 s): the
                // bucket's 1 000 do not fit.
                answers.push(
                    store
                        .check(user, &policies, &costs(1_000))
                        .await
                        .unwrap()
                        .is_allowed(),
                );
                answers
            })
        })
    };
    rt.block_on(async { tokio::join!(run("sped", false), run("sped-beside", true)) });
}

#[test]
fn a_bucket_key_outlives_its_state_when_an_override_slows_its_refill() {
    let server = RedisServer::start();
    let rt = support::runtime();
    let store = RedisStore::builder()
        .prefix(scenarios::unique_prefix("ovr-ttl"))
        .build_with_url(&server.url())
        .unwrap();
    let w = Duration::from_secs(1);
    let bucket = scenarios::policy("b", Rate::new(10_000, w), Algorithm::TokenBucket);
    let slower = scenarios::policy(
        "b",
        Rate::new(100, w).with_burst(1_000),
        Algorithm::TokenBucket,
    );
    // Alone (lua/single.lua), and with a second policy (lua/decide.lua).
    let other = scenarios::policy("o", Rate::new(1_000, w), Algorithm::Gcra);
    let pair = [bucket.clone(), other];
    rt.block_on(async {
        for round in 0..6 {
            let user = Key::new("user", format!("r{round}"));
            let policies = if round % 2 == 0 {
                &pair[..1]
            } else {
                &pair[..]
            };
            let costs = |c: u64| vec![c; policies.len()];
            let mut watched = Watched::new(&server, &store, &user, &bucket, 10_000);
            // 100 tokens taken: refilled in 10 ms at the plan's rate...
            let d = store.check(&user, policies, &costs(100)).await.unwrap();
            assert!(d.is_allowed());
            watched.after_decision(0);
            // ...but in a second at the override's, which the TTL must follow at the next
            // write even though the key's TTL was set for the faster refill.
            store.set_override(&user, &slower, None).await.unwrap();
            watched.limit = 100;
            watched.last = None;
            // Setting the override alone moved the key's expiry to the slower refill.
            let (expires, stops) =
                expiry_and_relevance(&server, &watched.key, Algorithm::TokenBucket, 100);
            assert_expiry_bounds(&watched.key, expires, stops, 0);
            for step in 1..6 {
                let d = store.check(&user, policies, &costs(1)).await.unwrap();
                assert!(d.is_allowed());
                watched.after_decision(step);
            }
        }
    });
}

/// `ping` loads both scripts, so the first decision after start-up is one `EVALSHA`: no
/// `NOSCRIPT` round trip, no `SCRIPT LOAD` on the request path.
#[tokio::test]
async fn ping_loads_the_scripts_so_the_first_decision_is_one_call() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("ping-loads")
        .build_with_url(&server.url())
        .unwrap();
    store.ping().await.unwrap();
    let sha = |source: &str| redis::Script::new(source).get_hash().to_owned();
    let (decide, lease) = (
        sha(tollgate::store::redis::script_source()),
        sha(tollgate::store::redis::lease_script_source()),
    );
    let loaded: Vec<i64> = server
        .query(&["SCRIPT", "EXISTS", &decide, &lease])
        .unwrap();
    assert_eq!(loaded, [1, 1]);

    let _: String = server.query(&["CONFIG", "RESETSTAT"]).unwrap();
    let p = Policy::new("api", Rate::per_minute(10)).unwrap();
    let d = store
        .check(&Key::new("t", "a"), std::slice::from_ref(&p), &[1])
        .await
        .unwrap();
    assert!(d.is_allowed());
    let stats: String = server.query(&["INFO", "commandstats"]).unwrap();
    assert!(stats.contains("cmdstat_evalsha:calls=1,"), "{stats}");
    assert!(!stats.contains("cmdstat_script"), "{stats}");
}

/// A Redis store answers over the network: `Limiter::check_now` defers to `check` and charges
/// nothing, so the key's count is what `check` alone made it.
#[tokio::test]
async fn check_now_on_redis_defers_and_charges_nothing() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix(scenarios::unique_prefix("now"))
        .build_with_url(&server.url())
        .unwrap();
    let limiter = tollgate::Limiter::builder()
        .store(store)
        .policy(Policy::new("api", Rate::per_minute(3)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "u1");
    for _ in 0..5 {
        assert!(limiter.check_now(&key, 1).is_none());
    }
    let d = limiter.check(&key, 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 2);
}

/// A full batch of many-policy requests on distinct keys (1 024 requests of 4 policies: 8 192
/// keys, past what the script can unpack at once) is split into calls that each fit: every
/// request is decided, none fails for its neighbours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_of_many_policy_requests_is_decided_whole() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix(scenarios::unique_prefix("bigbatch"))
        .max_batch(1024)
        .max_in_flight(1)
        .build_with_url(&server.url())
        .unwrap();
    let policies: Vec<Policy> = (0..4)
        .map(|i| Policy::new(format!("p{i}"), Rate::per_minute(10)).unwrap())
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1_100 {
        let store = store.clone();
        let policies = policies.clone();
        tasks.spawn(async move {
            store
                .check(&Key::new("k", i.to_string()), &policies, &[1, 1, 1, 1])
                .await
        });
    }
    let mut allowed = 0;
    while let Some(answer) = tasks.join_next().await {
        let decision = answer.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert!(decision.is_allowed());
        allowed += 1;
    }
    assert_eq!(allowed, 1_100);
}
