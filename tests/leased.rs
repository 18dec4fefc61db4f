//! Leased quotas against real redis-servers: several limiter instances share one limit
//! through the lease ledger, and the admitted requests satisfy each algorithm's exact-mode
//! bound in every interval; chaos (a killed instance, a restarted or stopped Redis); a
//! three-master cluster; a proptest over the in-process ledger.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tollgate::store::StoreExt;

use axum::routing::get;
use axum::Router;
use proptest::prelude::*;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::leased::{LeaseBackend, LeasedStore, MemoryLedger};
use tollgate::store::{FailureMode, RedisStore, ResilientStore, Store};
use tollgate::{Algorithm, Limiter, Policy, Rate, RateLimitLayer};

use support::{RedisCluster, RedisServer};

/// Microseconds since the epoch (the clock Redis `TIME` reads on this machine).
fn micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One admitted request: which key, and the interval (µs) its decision was made in.
#[derive(Debug, Clone, Copy)]
struct Admit {
    key: usize,
    start: u64,
    end: u64,
}

/// The heavy tests run one at a time: each saturates both cores on its own.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Requests asked per key and aligned window (µs start times), to tell a window the clients
/// saturated from one they could not fill.
static ASKED: std::sync::Mutex<Vec<(usize, u64)>> = std::sync::Mutex::new(Vec::new());

const W: u64 = 500;
const N: u64 = 500;
const INSTANCES: usize = 4;
const CLIENTS: usize = 64;

fn policy(a: Algorithm, n: u64) -> Policy {
    Policy::builder(
        format!("p-{}", a.as_str()),
        Rate::new(n, Duration::from_millis(W)),
    )
    .algorithm(a)
    .build()
    .unwrap()
}

const LEASED: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

/// Runs `INSTANCES × CLIENTS` clients for `run`: client `c` of every instance asks for key
/// `c % keys`, one request every 10 ms. Returns the admissions.
async fn hammer<S: LeaseBackend + Clone>(
    stores: &[LeasedStore<S>],
    p: &Policy,
    keys: usize,
    tag: &str,
    run: Duration,
) -> Vec<Admit> {
    let limiters: Vec<_> = stores
        .iter()
        .map(|s| {
            Limiter::builder()
                .store(s.clone())
                .policy(p.clone())
                .build()
                .unwrap()
        })
        .collect();
    let deadline = tokio::time::Instant::now() + run;
    let mut tasks = Vec::new();
    for limiter in &limiters {
        for c in 0..CLIENTS {
            let limiter = limiter.clone();
            let k = c % keys;
            let key = Key::new("lease", format!("{tag}-{k}"));
            tasks.push(tokio::spawn(async move {
                let mut admits = Vec::new();
                let mut asked = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                while tokio::time::Instant::now() < deadline {
                    tick.tick().await;
                    let start = micros();
                    asked.push((k, start));
                    if let Ok(d) = limiter.check(&key, 1).await {
                        if d.is_allowed() {
                            admits.push(Admit {
                                key: k,
                                start,
                                end: micros(),
                            });
                        }
                    }
                }
                if let Ok(mut all) = ASKED.lock() {
                    all.extend(asked);
                }
                admits
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// The exact-mode bound of `a`: whether `total` units may be admitted within a span of
/// `span_us` (first to last admission), for limit `n` per `W` (capacity `n`).
fn within(a: Algorithm, n: u64, total: u64, span_us: u64) -> bool {
    let w_us = W * 1000;
    match a {
        Algorithm::SlidingWindowLog => span_us >= w_us || total <= n,
        Algorithm::SlidingWindowCounter => {
            span_us > w_us || total.saturating_sub(n) * w_us <= n * span_us
        }
        _ => total.saturating_sub(n) * w_us <= n * span_us,
    }
}

/// Checks every interval of one key's admissions against the bound, soundly: an admission
/// is only known to lie in its `[start, end]`, so a set of admissions is checked with the
/// longest span they could have.
fn check_bound(a: Algorithm, n: u64, admits: &[Admit]) -> Result<(), String> {
    let mut v: Vec<Admit> = admits.to_vec();
    v.sort_by_key(|x| x.start);
    if a == Algorithm::FixedWindow {
        let mut per = std::collections::BTreeMap::new();
        for x in &v {
            let (ws, we) = (x.start / 1000 / W, x.end / 1000 / W);
            if ws == we {
                *per.entry(ws).or_insert(0u64) += 1;
            }
        }
        for (w, total) in per {
            if total > n {
                return Err(format!("{total} > {n} in fixed window {w}"));
            }
        }
        return Ok(());
    }
    for i in 0..v.len() {
        let mut total = 0;
        let mut last_end = 0;
        for x in &v[i..] {
            if x.start.saturating_sub(v[i].start) > 4 * W * 1000 {
                break;
            }
            total += 1;
            last_end = last_end.max(x.end);
            let span = last_end - v[i].start;
            if !within(a, n, total, span) {
                return Err(format!(
                    "{a:?}: {total} admitted within {span} µs > the bound of {n} per {W} ms"
                ));
            }
        }
    }
    Ok(())
}

/// Admissions per aligned window, for the windows entirely inside the steady part of the
/// run (the first window, which also holds the bucket's initial burst, is skipped) that the
/// clients saturated (asked at least twice the limit of key `key`).
fn steady_windows(admits: &[Admit], key: usize, n: u64, from_us: u64, to_us: u64) -> Vec<u64> {
    let first = from_us / 1000 / W + 2;
    let last = to_us / 1000 / W;
    let asked = ASKED.lock().map(|a| a.clone()).unwrap_or_default();
    (first..last)
        .filter(|&w| {
            asked
                .iter()
                .filter(|(k, t)| *k == key && t / 1000 / W == w)
                .count() as u64
                >= 2 * n
        })
        .map(|w| admits.iter().filter(|x| x.start / 1000 / W == w).count() as u64)
        .collect()
}

/// The stated under-admission for `a` with `instances`: instances × (largest block +
/// margin), the block at most a tenth of the limit; the margin is the refill reserved over
/// a block's period (token bucket, GCRA) or the units whose log entries count up to a
/// period longer (log), both kept within one block's worth.
fn under_bound(a: Algorithm, n: u64, instances: u64) -> u64 {
    let block = n / 10;
    let margin = match a {
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::SlidingWindowLog => block,
        _ => 0,
    };
    instances * (block + margin)
}

/// One aggregate run; returns the largest under-admission seen in a steady window.
async fn aggregate<S: LeaseBackend + Clone>(
    stores: &[LeasedStore<S>],
    a: Algorithm,
    keys: usize,
    n: u64,
    tag: &str,
) -> u64 {
    let p = policy(a, n);
    if let Ok(mut a) = ASKED.lock() {
        a.clear();
    }
    let from = micros();
    let admits = hammer(stores, &p, keys, tag, Duration::from_millis(2_200)).await;
    let to = micros();
    let mut worst = 0;
    for k in 0..keys {
        let mine: Vec<Admit> = admits.iter().copied().filter(|x| x.key == k).collect();
        if let Err(e) = check_bound(a, n, &mine) {
            panic!("{tag} key {k}: {e}");
        }
        for got in steady_windows(&mine, k, n, from, to) {
            let under = n.saturating_sub(got);
            worst = worst.max(under);
            assert!(
                under <= under_bound(a, n, stores.len() as u64),
                "{tag} key {k}: only {got} of {n} admitted in a steady window (bound {})",
                under_bound(a, n, stores.len() as u64)
            );
        }
    }
    worst
}

fn redis_stores(server: &RedisServer, prefix: &str) -> Vec<LeasedStore<RedisStore>> {
    (0..INSTANCES)
        .map(|_| {
            LeasedStore::new(
                RedisStore::builder()
                    .prefix(prefix)
                    .build_with_url(&server.url())
                    .unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregate_on_one_hot_key_and_on_64_keys_never_exceeds_the_bound() {
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    for a in LEASED {
        let stores = redis_stores(&server, &format!("hot-{}", a.as_str()));
        let hot = aggregate(&stores, a, 1, N, &format!("hot-{}", a.as_str())).await;
        let stats = stores
            .iter()
            .map(LeasedStore::stats)
            .fold((0, 0, 0), |acc, s| {
                (
                    acc.0 + s.grants,
                    acc.1 + s.local_admits,
                    acc.2 + s.exact_calls,
                )
            });
        assert!(stats.0 > 0, "{a:?}: the hot key was never leased");
        assert!(stats.1 > 0, "{a:?}: nothing was admitted locally");
        for s in &stores {
            s.shutdown().await;
        }
        let stores = redis_stores(&server, &format!("many-{}", a.as_str()));
        let many = aggregate(&stores, a, 64, N / 10, &format!("many-{}", a.as_str())).await;
        println!(
            "{a:?}: under-admission hot {hot} of {N} (bound {}), 64 keys {many} of {} (bound {}); \
             grants {} local admits {} exact calls {}",
            under_bound(a, N, 4),
            N / 10,
            under_bound(a, N / 10, 4),
            stats.0,
            stats.1,
            stats.2
        );
        for s in &stores {
            s.shutdown().await;
            assert_eq!(s.stats().units_held, 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_per_decision_fall_with_leases() {
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    let stores = redis_stores(&server, "cmds");
    // A limit no client reaches: every decision is an admission, from blocks once hot.
    let p = Policy::new("cmds", Rate::per_minute(10_000_000)).unwrap();
    let before = server.command_calls("evalsha") + server.command_calls("eval");
    let admits = hammer(&stores, &p, 1, "cmds", Duration::from_millis(1_500)).await;
    let calls = server.command_calls("evalsha") + server.command_calls("eval") - before;
    let per = calls as f64 / admits.len() as f64;
    for s in &stores {
        println!("{:?}", s.stats());
    }
    println!(
        "{} decisions, {calls} script calls: {per:.4} per decision",
        admits.len()
    );
    assert!(per <= 0.05, "{per} script calls per decision");
}

/// Cold keys are decided exactly by the ledger, one call each; calls that queue behind a
/// busy connection leave together as one script call, and each is still decided exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_keys_share_script_calls_and_stay_exact() {
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    let store = LeasedStore::new(
        RedisStore::builder()
            .prefix("cold")
            .build_with_url(&server.url())
            .unwrap(),
    );
    // Limit 3: too small to lease (a block would be under two requests), so every decision
    // is one exact ledger call.
    let p = Policy::new("cold", Rate::per_minute(3)).unwrap();
    let before = server.command_calls("evalsha") + server.command_calls("eval");
    let mut tasks = Vec::new();
    for k in 0..200 {
        for _ in 0..5 {
            let (store, p) = (store.clone(), p.clone());
            tasks.push(tokio::spawn(async move {
                let key = Key::new("ip", k.to_string());
                let d = store.check(&key, &[p], &[1]).await.unwrap();
                (k, d.is_allowed())
            }));
        }
    }
    let mut admitted = vec![0u32; 200];
    for t in tasks {
        let (k, ok) = t.await.unwrap();
        admitted[k] += u32::from(ok);
    }
    let calls = server.command_calls("evalsha") + server.command_calls("eval") - before;
    println!(
        "1000 cold decisions, {calls} script calls; {:?}",
        store.stats()
    );
    assert!(
        admitted.iter().all(|&a| a == 3),
        "every key admits exactly its limit: {admitted:?}"
    );
    assert_eq!(store.stats().grants, 0, "no key is leased at limit 3");
    assert!(
        calls < 500,
        "{calls} script calls for 1000 concurrent decisions: queued calls were not batched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_loses_at_most_its_block_and_the_bound_holds() {
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    let a = Algorithm::FixedWindow;
    let p = policy(a, N);
    let stores = redis_stores(&server, "kill");
    let victim = vec![stores[0].clone()];
    let survivors = stores[1..].to_vec();
    let (victim_admits, survivor_admits) = tokio::join!(
        hammer(&victim, &p, 1, "kill", Duration::from_millis(700)),
        hammer(&survivors, &p, 1, "kill", Duration::from_millis(2_000)),
    );
    // The victim is dropped with its block in hand, without a shutdown.
    let held = victim[0].stats().units_held;
    drop(victim);
    drop(stores);
    assert!(held <= N / 10, "a block holds at most a tenth of the limit");
    let mut all = victim_admits;
    all.extend(survivor_admits);
    check_bound(a, N, &all).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_drops_the_blocks_it_granted() {
    let _heavy = HEAVY.lock().await;
    let mut server = RedisServer::start();
    let a = Algorithm::FixedWindow;
    let p = policy(a, N);
    let stores = redis_stores(&server, "restart");
    let before = hammer(&stores, &p, 1, "restart", Duration::from_millis(600)).await;
    check_bound(a, N, &before).unwrap();
    server.kill();
    server.restart();
    let restarted = micros();
    let after = hammer(&stores, &p, 1, "restart", Duration::from_millis(1_500)).await;
    assert!(!after.is_empty(), "decisions resume after the restart");
    // Windows that start a lease time after the restart hold no unit of the old ledger.
    let late: Vec<Admit> = after
        .iter()
        .copied()
        .filter(|x| x.start / 1000 / W > (restarted / 1000 + 300) / W)
        .collect();
    check_bound(a, N, &late).unwrap();
    let dropped: u64 = stores.iter().map(|s| s.stats().units_dropped).sum();
    println!("units dropped at the restart: {dropped}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_leaves_the_blocks_in_hand_then_the_failure_mode() {
    let _heavy = HEAVY.lock().await;
    let server = RedisServer::start();
    let p = Policy::builder("stop", Rate::new(1_000_000, Duration::from_secs(10)))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    let leased: Vec<LeasedStore<RedisStore>> = (0..2)
        .map(|_| {
            LeasedStore::builder(
                RedisStore::builder()
                    .prefix("stop")
                    .timeout(Duration::from_millis(150))
                    .build_with_url(&server.url())
                    .unwrap(),
            )
            .lease_time(Duration::from_millis(400))
            .build()
            .unwrap()
        })
        .collect();
    let limiters: Vec<_> = leased
        .iter()
        .map(|s| {
            let store = ResilientStore::builder(s.clone(), FailureMode::FailClosed)
                .timeout(Duration::from_millis(150))
                .build()
                .unwrap();
            Limiter::builder()
                .store(store)
                .policy(p.clone())
                .build()
                .unwrap()
        })
        .collect();
    let key = Key::new("lease", "stop");
    // Warm up: the key is hot and leased.
    for _ in 0..200 {
        for l in &limiters {
            assert!(l.check(&key, 1).await.is_ok_and(|d| d.is_allowed()));
        }
    }
    server.signal("STOP");
    let stopped = tokio::time::Instant::now();
    let local_before: u64 = leased.iter().map(|s| s.stats().local_admits).sum();
    let mut admitted_while_stopped = 0;
    let mut refused = 0;
    while stopped.elapsed() < Duration::from_millis(900) {
        for l in &limiters {
            let t = tokio::time::Instant::now();
            let d = l.check(&key, 1).await;
            assert!(t.elapsed() < Duration::from_millis(400), "a decision hung");
            if d.is_ok_and(|d| d.is_allowed()) {
                admitted_while_stopped += 1;
            } else {
                refused += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.signal("CONT");
    let local_after: u64 = leased.iter().map(|s| s.stats().local_admits).sum();
    assert!(
        local_after > local_before,
        "blocks in hand kept deciding while Redis was stopped"
    );
    assert!(admitted_while_stopped > 0);
    assert!(refused > 0, "then the failure mode (closed) applied");
    // Redis is back: the key is decided (and leased) again.
    let mut back = false;
    for _ in 0..200 {
        if limiters[0]
            .check(&key, 1)
            .await
            .is_ok_and(|d| d.is_allowed())
        {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back, "decisions resume after SIGCONT");
}

#[test]
fn aggregate_on_a_three_master_cluster() {
    let _heavy = HEAVY.blocking_lock();
    let cluster = RedisCluster::start();
    let rt = support::runtime();
    rt.block_on(async {
        for a in [Algorithm::FixedWindow, Algorithm::TokenBucket] {
            let stores: Vec<_> = (0..INSTANCES)
                .map(|_| {
                    LeasedStore::new(
                        RedisStore::builder()
                            .prefix(format!("cl-{}", a.as_str()))
                            .build_cluster_with_urls(cluster.urls())
                            .unwrap(),
                    )
                })
                .collect();
            let hot = aggregate(&stores, a, 1, N, &format!("cl-hot-{}", a.as_str())).await;
            let many = aggregate(&stores, a, 64, N / 10, &format!("cl-many-{}", a.as_str())).await;
            println!("cluster {a:?}: under-admission hot {hot}, 64 keys {many}");
        }
    });
}

#[tokio::test]
async fn leased_decisions_through_http_and_the_limiter_share_one_limit() {
    let server = RedisServer::start();
    let p = Policy::builder("http", Rate::per_minute(40))
        .algorithm(Algorithm::SlidingWindowLog)
        .build()
        .unwrap();
    let store = || {
        LeasedStore::new(
            RedisStore::builder()
                .prefix("http")
                .build_with_url(&server.url())
                .unwrap(),
        )
    };
    let (a, b) = (store(), store());
    let limiter = Limiter::builder()
        .store(a)
        .policy(p.clone())
        .build()
        .unwrap();
    let addr = support::serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter)),
    )
    .await;
    let client = reqwest::Client::new();
    let mut ok = 0;
    let mut limit_header = String::new();
    for _ in 0..60 {
        let res = client.get(format!("http://{addr}/")).send().await.unwrap();
        if res.status() == 200 {
            ok += 1;
            limit_header = res.headers()["ratelimit-limit"]
                .to_str()
                .unwrap()
                .to_owned();
        } else {
            assert_eq!(res.status(), 429);
            assert!(res.headers().contains_key("retry-after"));
        }
    }
    assert_eq!(limit_header, "40");
    assert!(ok <= 40, "{ok} admitted over HTTP");
    assert!(
        ok >= 40 - 4,
        "{ok} admitted over HTTP: more than a block lost"
    );
    // Another instance, through the direct API, shares the ledger: its own key has the
    // whole limit, and the two instances together never pass it.
    let direct = Limiter::builder().store(b).policy(p).build().unwrap();
    let key = Key::new("user", "direct");
    let mut n = 0;
    for _ in 0..50 {
        if direct.check(&key, 1).await.unwrap().is_allowed() {
            n += 1;
        }
    }
    assert_eq!(n, 40);
}

/// Drives `instances` leased stores on one in-process ledger through a trace, on a manual
/// clock; returns the admitted `(time, cost)`.
fn simulate(
    a: Algorithm,
    limit: u64,
    window: u64,
    lease_ms: u64,
    fraction: f64,
    instances: usize,
    steps: &[(u64, usize, u64)],
) -> Vec<(u64, u64)> {
    let clock = ManualClock::new(1_000_000);
    let ledger = MemoryLedger::with_clock(clock.clone());
    let stores: Vec<_> = (0..instances)
        .map(|_| {
            LeasedStore::builder(ledger.clone())
                .clock(clock.clone())
                .lease_time(Duration::from_millis(lease_ms))
                .max_block_fraction(fraction)
                .build()
                .unwrap()
        })
        .collect();
    let p = Policy::builder("prop", Rate::new(limit, Duration::from_millis(window)))
        .algorithm(a)
        .build()
        .unwrap();
    let policies = [p];
    let key = Key::new("prop", "k");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut admitted = Vec::new();
    rt.block_on(async {
        for &(gap, who, cost) in steps {
            clock.advance(Duration::from_millis(gap));
            let store = &stores[who % instances];
            let cost = cost.min(limit);
            let d = store.check(&key, &policies, &[cost]).await.unwrap();
            if d.is_allowed() {
                admitted.push((clock.now_millis(), cost));
            }
            tokio::task::yield_now().await;
        }
    });
    admitted
}

fn prop_within(a: Algorithm, limit: u64, window: u64, total: u64, span: u64) -> bool {
    match a {
        Algorithm::SlidingWindowLog => span >= window || total <= limit,
        Algorithm::SlidingWindowCounter => {
            span > window || total.saturating_sub(limit) * window <= limit * span
        }
        _ => total.saturating_sub(limit) * window <= limit * span,
    }
}

use tollgate::clock::Clock;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn leased_admissions_stay_within_every_interval_bound(
        a in prop_oneof![
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindowCounter),
            Just(Algorithm::SlidingWindowLog),
            Just(Algorithm::TokenBucket),
            Just(Algorithm::Gcra),
        ],
        limit in 1u64..200,
        window in 50u64..2_000,
        lease_ms in 10u64..1_000,
        fraction in prop_oneof![Just(0.1), Just(0.25), Just(0.5)],
        instances in 1usize..5,
        steps in proptest::collection::vec(
            (
                prop_oneof![6 => 0u64..3, 3 => 0u64..60, 1 => 0u64..1_500],
                0usize..4,
                prop_oneof![6 => Just(1u64), 1 => 1u64..4],
            ),
            1..500,
        ),
    ) {
        let admitted = simulate(a, limit, window, lease_ms, fraction, instances, &steps);
        if a == Algorithm::FixedWindow {
            let mut per = std::collections::BTreeMap::new();
            for (t, c) in &admitted {
                *per.entry(t / window).or_insert(0u64) += c;
            }
            for (w, total) in per {
                prop_assert!(total <= limit, "{total} > {limit} in window {w}");
            }
        } else {
            for i in 0..admitted.len() {
                let mut total = 0;
                for &(t, c) in &admitted[i..] {
                    total += c;
                    let span = t - admitted[i].0;
                    prop_assert!(
                        prop_within(a, limit, window, total, span),
                        "{a:?}: {total} in {span} ms > the bound of {limit} per {window} ms"
                    );
                }
            }
        }
    }
}

#[test]
fn unleasable_policies_are_decided_exactly_and_all_or_nothing() {
    let rt = support::runtime();
    rt.block_on(async {
        let ledger = MemoryLedger::new();
        let store = LeasedStore::new(ledger);
        let slots = Policy::in_flight("slots", 1).unwrap();
        let rate = Policy::new("rate", Rate::per_minute(5)).unwrap();
        let both = [rate.clone(), slots.clone()];
        let key = Key::new("user", "mixed");
        let first = store.check(&key, &both, &[1, 1]).await.unwrap();
        assert!(first.is_allowed());
        // The slot is held: refused, and the rate policy's unit is given back.
        let second = store.check(&key, &both, &[1, 1]).await.unwrap();
        assert!(!second.is_allowed());
        let peek = store
            .peek(&key, std::slice::from_ref(&rate), &[0])
            .await
            .unwrap();
        assert_eq!(peek.remaining(), 4, "only the admitted request is charged");
        store.release(&key, &both, first.slot()).await.unwrap();
        assert!(store
            .check(&key, &both, &[1, 1])
            .await
            .unwrap()
            .is_allowed());
    });
}

#[test]
fn an_exhausted_key_costs_no_call_per_refusal() {
    let server = RedisServer::start();
    let rt = support::runtime();
    rt.block_on(async {
        let store = LeasedStore::new(
            RedisStore::builder()
                .prefix("exhausted")
                .build_with_url(&server.url())
                .unwrap(),
        );
        let p = [Policy::builder("fw", Rate::per_minute(3))
            .algorithm(Algorithm::FixedWindow)
            .build()
            .unwrap()];
        let key = Key::new("user", "x");
        for _ in 0..3 {
            assert!(store.check(&key, &p, &[1]).await.unwrap().is_allowed());
        }
        let before = server.command_calls("evalsha") + server.command_calls("eval");
        for _ in 0..100 {
            let d = store.check(&key, &p, &[1]).await.unwrap();
            assert!(!d.is_allowed());
            assert!(d.retry_after().is_some());
        }
        let after = server.command_calls("evalsha") + server.command_calls("eval");
        assert!(
            after - before <= 1,
            "{} calls for 100 refusals",
            after - before
        );
    });
}

#[test]
fn a_plan_leases_its_shared_store_and_refuses_lease_mistakes() {
    use tollgate::config::Plan;
    let plan = |store: &str| {
        Plan::from_toml(&format!(
            "failure_mode = \"fail_closed\"\n[store]\n{store}\n\
             [[policies]]\nname = \"api\"\nlimit = 100\nwindow = \"1s\""
        ))
        .unwrap()
    };
    let ok = plan("kind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nlease_time = \"300ms\"\nlease_max_block_percent = 20\nlease_max_keys = 5000");
    let built = format!("{:?}", ok.store().unwrap());
    for read in ["lease_ms: 300", "max_block_fraction: 0.2", "max_keys: 5000"] {
        assert!(built.contains(read), "{read} not in {built}");
    }
    let err = plan(
        "kind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nlease_time = \"1s\"\nlease_max_keys = 0",
    )
    .store()
    .unwrap_err();
    assert_eq!((err.field(), err.value()), ("store.lease_max_keys", "0"));
    let err = plan("kind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nlease_max_keys = 10")
        .store()
        .unwrap_err();
    assert_eq!(err.field(), "store.lease_max_keys");
    let err = plan("kind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nlease_time = \"1ms\"")
        .store()
        .unwrap_err();
    assert_eq!(err.field(), "store.lease_time");
    let err = plan("kind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nlease_time = \"1s\"\nlease_max_block_percent = 90")
        .store()
        .unwrap_err();
    assert_eq!(
        (err.field(), err.value()),
        ("store.lease_max_block_percent", "90")
    );
    let err = plan("kind = \"memory\"\nlease_time = \"1s\"")
        .store()
        .unwrap_err();
    assert_eq!(err.field(), "store.lease_time");
    let err = plan("kind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\nlease_max_block_percent = 5")
        .store()
        .unwrap_err();
    assert_eq!(err.field(), "store.lease_max_block_percent");
}

#[test]
fn a_flood_of_distinct_keys_costs_calls_never_memory() {
    let rt = support::runtime();
    rt.block_on(async {
        let store = LeasedStore::builder(MemoryLedger::new())
            .max_keys(8)
            .build()
            .unwrap();
        let p = [Policy::new("api", Rate::per_minute(1_000)).unwrap()];
        // A hot key tracked before the flood keeps leasing.
        let hot = Key::new("user", "hot");
        for _ in 0..200 {
            assert!(store.check(&hot, &p, &[1]).await.unwrap().is_allowed());
        }
        let flood = |i: u32| Key::new("ip", format!("10.0.{}.{}", i / 256, i % 256));
        for i in 0..2_000u32 {
            let d = store.check(&flood(i), &p, &[1]).await.unwrap();
            assert!(d.is_allowed(), "new key {i} refused");
            assert_eq!(d.limit(), 1_000);
        }
        // Keys seen once are not tracked at all.
        let stats = store.stats();
        assert_eq!(stats.tracked_keys, 1, "{stats:?}");
        assert!(stats.first_sightings >= 2_000, "{stats:?}");
        // Keys that come back are tracked, up to the cap.
        for i in 0..2_000u32 {
            for _ in 0..2 {
                assert!(store.check(&flood(i), &p, &[1]).await.unwrap().is_allowed());
            }
        }
        let stats = store.stats();
        assert!(stats.tracked_keys <= 8, "{stats:?}");
        assert!(stats.untracked >= 2_000 - 8, "{stats:?}");
        assert!(stats.grants >= 1, "the hot key leased: {stats:?}");
        // Past the cap, each new key is still decided against the shared limit.
        let flooded = Key::new("ip", "10.0.0.1");
        for _ in 0..997 {
            store.check(&flooded, &p, &[1]).await.unwrap();
        }
        assert!(!store.check(&flooded, &p, &[1]).await.unwrap().is_allowed());
    });
    let err = LeasedStore::builder(MemoryLedger::new())
        .max_keys(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "max_keys");
}
