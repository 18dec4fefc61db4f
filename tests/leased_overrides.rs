//! Per-key overrides on leased policies: two `LeasedStore` instances share one ledger (the
//! in-process `MemoryLedger`, and a real `redis-server`); after one of them sets an override
//! (through `Limiter::set_override` or the admin API over HTTP), every unit admitted from one
//! lease time on respects the override's limit across both, and after it is removed the
//! plan's limit comes back. Manual clocks throughout (the Redis stores pass the clock's time
//! to the ledger script), so every bound is checked at exact instants.

mod support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::leased::{LeaseBackend, LeasedStore, MemoryLedger};
use tollgate::store::{RedisStore, Store};
use tollgate::{Algorithm, Limiter, Override, Policy, Rate, RateLimitLayer};

use support::RedisServer;

/// The plan's limit per window, the window, the lease time.
const N: u64 = 1_000;
const W: u64 = 1_000;
const LEASE: u64 = 100;
/// The override's limit.
const LOW: u64 = 50;

const LEASED: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

fn policy(a: Algorithm, name: &str) -> Policy {
    Policy::builder(name, Rate::new(N, Duration::from_millis(W)))
        .algorithm(a)
        .build()
        .unwrap()
}

fn leased<S: LeaseBackend>(inner: S, clock: &ManualClock) -> LeasedStore<S> {
    LeasedStore::builder(inner)
        .clock(clock.clone())
        .lease_time(Duration::from_millis(LEASE))
        .build()
        .unwrap()
}

fn limiter<S: Store>(store: S, p: &Policy) -> Limiter<S> {
    Limiter::builder()
        .store(store)
        .policy(p.clone())
        .build()
        .unwrap()
}

/// One request a millisecond for `ms` ms, the instances taking turns; the admitted ones'
/// times and reported limits.
async fn drive<S: Store>(
    limiters: &[Limiter<S>],
    clock: &ManualClock,
    key: &Key,
    ms: u64,
) -> Vec<(u64, u64)> {
    let mut admitted = Vec::new();
    for i in 0..ms {
        clock.advance(Duration::from_millis(1));
        let d = limiters[i as usize % limiters.len()]
            .check(key, 1)
            .await
            .unwrap();
        if d.is_allowed() {
            admitted.push((clock.now_millis(), d.limit()));
        }
        // Lets the blocks' returns, spawned on this runtime, run.
        tokio::task::yield_now().await;
    }
    admitted
}

/// Whether `admitted` (times in ms, one unit each) satisfy `a`'s exact-mode bound for limit
/// and capacity `n` per `W`: per aligned window (fixed window), per window of `W` (log),
/// `n + n·L/W` within any span `L` (the others; the counter's only for `L ≤ W`).
fn check_bound(a: Algorithm, n: u64, admitted: &[u64]) -> Result<(), String> {
    if a == Algorithm::FixedWindow {
        let mut per = std::collections::BTreeMap::new();
        for t in admitted {
            *per.entry(t / W).or_insert(0u64) += 1;
        }
        return match per.into_iter().find(|&(_, total)| total > n) {
            Some((w, total)) => Err(format!("{total} > {n} in fixed window {w}")),
            None => Ok(()),
        };
    }
    for i in 0..admitted.len() {
        for (j, t) in admitted[i..].iter().enumerate() {
            let (total, span) = (j as u64 + 1, t - admitted[i]);
            let ok = match a {
                Algorithm::SlidingWindowLog => span >= W || total <= n,
                Algorithm::SlidingWindowCounter => {
                    span > W || total.saturating_sub(n) * W <= n * span
                }
                _ => total.saturating_sub(n) * W <= n * span,
            };
            if !ok {
                return Err(format!(
                    "{a:?}: {total} admitted within {span} ms, over {n} per {W} ms"
                ));
            }
        }
    }
    Ok(())
}

/// The scenario on two instances sharing one ledger: hot, override lowered, removed.
async fn lower_then_remove<S: LeaseBackend>(
    a: Algorithm,
    stores: [LeasedStore<S>; 2],
    clock: &ManualClock,
    tag: &str,
) {
    let p = policy(a, "api");
    let limiters = [
        limiter(stores[0].clone(), &p),
        limiter(stores[1].clone(), &p),
    ];
    let key = Key::new("tenant", format!("{tag}-{}", a.as_str()));

    // Hot on both instances: both lease blocks.
    let warm = drive(&limiters, clock, &key, 300).await;
    assert!(warm.iter().all(|&(_, limit)| limit == N));
    for s in &stores {
        assert!(s.stats().grants > 0, "{a:?}: not leased: {:?}", s.stats());
    }

    // Instance 0 lowers the key's limit: its own blocks go back at once.
    limiters[0]
        .set_override(&key, Override::new("api", LOW))
        .await
        .unwrap();
    let set_at = clock.now_millis();
    tokio::task::yield_now().await;
    assert_eq!(
        stores[0].stats().units_held,
        0,
        "{a:?}: the setter's block is given back"
    );
    // Both instances list it: it lives in the shared store.
    for l in &limiters {
        let listed = l.overrides(&key).await.unwrap();
        assert_eq!(listed.len(), 1, "{a:?}");
        assert_eq!((listed[0].policy(), listed[0].limit()), ("api", LOW));
    }

    // The units already charged count against the smaller limit, as on the exact stores:
    // a bucket carries the tokens taken (at 50 a second it takes about 15 s to refill the
    // 750 the warm-up took under the plan's rate), and a window its count past the
    // override's limit, paid back at 50 a window (the warm-up and the blocks charged up to
    // 500 units: 10 windows).
    let run = if a == Algorithm::SlidingWindowLog {
        3 * W
    } else {
        20 * W
    };
    let after = drive(&limiters, clock, &key, run).await;
    let settled: Vec<u64> = after
        .iter()
        .filter(|&&(t, _)| t >= set_at + LEASE)
        .map(|&(t, _)| t)
        .collect();
    if let Err(e) = check_bound(a, LOW, &settled) {
        panic!("{a:?} one lease time after the override: {e}");
    }
    assert!(
        after
            .iter()
            .filter(|&&(t, _)| t >= set_at + LEASE)
            .all(|&(_, limit)| limit == LOW),
        "{a:?}: decisions report the override's limit"
    );
    // And it is still served: the last full window admits close to the override's limit
    // (less at most two instances' blocks of a tenth of it, and their margins).
    let last = (set_at + run) / W - 1;
    let in_last = settled.iter().filter(|&&t| t / W == last).count() as u64;
    assert!(
        (LOW - 2 * (2 * LOW / 10)..=LOW).contains(&in_last),
        "{a:?}: {in_last} of {LOW} admitted in a window under the override"
    );

    // Removed by the other instance: the plan's limit is back within a lease time.
    limiters[1].remove_override(&key, "api").await.unwrap();
    let removed_at = clock.now_millis();
    for l in &limiters {
        assert!(l.overrides(&key).await.unwrap().is_empty());
    }
    let back = drive(&limiters, clock, &key, 2 * W).await;
    let window = (removed_at + W) / W + 1;
    let in_window: Vec<&(u64, u64)> = back.iter().filter(|&&(t, _)| t / W == window).collect();
    assert!(
        in_window.len() as u64 > 4 * LOW,
        "{a:?}: only {} admitted in a window after the override was removed",
        in_window.len()
    );
    assert!(in_window.iter().all(|&&(_, limit)| limit == N));
    let all: Vec<u64> = back
        .iter()
        .filter(|&&(t, _)| t >= removed_at + LEASE)
        .map(|&(t, _)| t)
        .collect();
    check_bound(a, N, &all).unwrap();
}

#[tokio::test]
async fn an_override_on_a_memory_ledger_binds_both_instances_within_one_lease_time() {
    for a in LEASED {
        let clock = ManualClock::new(1_000_000);
        let ledger = MemoryLedger::with_clock(clock.clone());
        let stores = [leased(ledger.clone(), &clock), leased(ledger, &clock)];
        lower_then_remove(a, stores, &clock, "memory").await;
    }
}

fn redis_store(server: &RedisServer, prefix: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .clock(clock.clone())
        .build_with_url(&server.url())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_on_redis_binds_both_instances_within_one_lease_time() {
    let server = RedisServer::start();
    for a in LEASED {
        let clock = ManualClock::new(1_700_000_000_000);
        let prefix = format!("ovr-{}", a.as_str());
        let stores = [
            leased(redis_store(&server, &prefix, &clock), &clock),
            leased(redis_store(&server, &prefix, &clock), &clock),
        ];
        lower_then_remove(a, stores, &clock, "redis").await;
    }
}

/// An override that raises the limit reaches an instance that holds a refusal of the key
/// within a lease time, not at the end of the refusal's `retry_after`.
#[tokio::test]
async fn a_raised_limit_reaches_an_instance_holding_a_refusal_within_a_lease_time() {
    let clock = ManualClock::new(1_000_000);
    let ledger = MemoryLedger::with_clock(clock.clone());
    let p = Policy::builder("api", Rate::per_hour(3))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    let a = limiter(leased(ledger.clone(), &clock), &p);
    let b = limiter(leased(ledger, &clock), &p);
    let key = Key::new("tenant", "raised");
    for _ in 0..3 {
        assert!(b.check(&key, 1).await.unwrap().is_allowed());
    }
    let refused = b.check(&key, 1).await.unwrap();
    assert!(!refused.is_allowed());
    assert!(refused.retry_after_millis() > 60_000);
    a.set_override(&key, Override::new("api", 10))
        .await
        .unwrap();
    clock.advance(Duration::from_millis(LEASE));
    let d = b.check(&key, 1).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.limit(), 10);
}

/// An override with an expiry ends by itself: the plan's limit is back within a lease time
/// of its end (the memory ledger on its clock; Redis by the override key's TTL, a real one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_override_ends_by_itself() {
    let p = policy(Algorithm::SlidingWindowCounter, "api");
    let key = Key::new("tenant", "expiring");
    let clock = ManualClock::new(1_000_000);
    let memory = limiter(leased(MemoryLedger::with_clock(clock.clone()), &clock), &p);
    memory
        .set_override(
            &key,
            Override::new("api", 7).expires_in(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    assert_eq!(memory.check(&key, 1).await.unwrap().limit(), 7);
    let left = memory.overrides(&key).await.unwrap()[0].expires_in();
    assert_eq!(left, Some(Duration::from_millis(500)));
    clock.advance(Duration::from_millis(500 + LEASE));
    assert!(memory.overrides(&key).await.unwrap().is_empty());
    assert_eq!(memory.check(&key, 1).await.unwrap().limit(), N);

    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000);
    let redis = limiter(leased(redis_store(&server, "expiring", &clock), &clock), &p);
    redis
        .set_override(
            &key,
            Override::new("api", 7).expires_in(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert_eq!(redis.check(&key, 1).await.unwrap().limit(), 7);
    // The override key's TTL runs on Redis's own clock.
    tokio::time::sleep(Duration::from_millis(400)).await;
    clock.advance(Duration::from_millis(LEASE));
    assert!(redis.overrides(&key).await.unwrap().is_empty());
    assert_eq!(redis.check(&key, 1).await.unwrap().limit(), N);
}

/// A request with a leased policy and an unleasable one (in-flight slots): each keeps its
/// override where it is decided, and a bad override is refused naming the field.
#[tokio::test]
async fn overrides_of_leased_and_exact_policies_side_by_side() {
    let clock = ManualClock::new(1_000_000);
    let store = leased(MemoryLedger::with_clock(clock.clone()), &clock);
    let rate = Policy::new("rate", Rate::per_minute(100)).unwrap();
    let slots = Policy::in_flight("slots", 4).unwrap();
    let l = Limiter::builder()
        .store(store)
        .policy(rate)
        .policy(slots)
        .build()
        .unwrap();
    let key = Key::new("tenant", "mixed");
    l.set_override(&key, Override::new("rate", 2))
        .await
        .unwrap();
    l.set_override(&key, Override::new("slots", 1))
        .await
        .unwrap();
    let listed = l.overrides(&key).await.unwrap();
    let names: Vec<(&str, u64)> = listed.iter().map(|o| (o.policy(), o.limit())).collect();
    assert_eq!(names, [("rate", 2), ("slots", 1)]);
    let first = l.acquire(&key).await.unwrap();
    assert!(first.decision().is_allowed());
    // One slot under the override: the second is refused, and charges nothing.
    assert!(!l.acquire(&key).await.unwrap().decision().is_allowed());
    drop(first);
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let second = l.acquire(&key).await.unwrap();
    assert!(second.decision().is_allowed());
    drop(second);
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    // Two units a minute under the rate's override: the third request is refused.
    let third = l.acquire(&key).await.unwrap();
    assert!(!third.decision().is_allowed(), "{:?}", third.decision());
    let err = l
        .set_override(&key, Override::new("rate", 0))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
}

/// Over HTTP: instance A serves an axum app behind the layer and the admin API; instance B
/// decides the same key through the direct API. `PUT /admin/overrides/…` on A lowers the
/// key's limit for both within a lease time; `DELETE` brings the plan's limit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_sets_and_removes_a_leased_override_over_http() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000);
    let p = Policy::builder("api", Rate::new(N, Duration::from_millis(W)))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    let a = Limiter::builder()
        .store(leased(redis_store(&server, "http-ovr", &clock), &clock))
        .policy(p.clone())
        .extractor(support::by_tenant())
        .build()
        .unwrap();
    let b = limiter(leased(redis_store(&server, "http-ovr", &clock), &clock), &p);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(a.clone()))
        .nest("/admin", tollgate::admin::Admin::new(a).router());
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let key = Key::new("tenant", "acme");

    // Through HTTP on A and directly on B, a request a millisecond: the admitted requests'
    // times and the limits reported.
    let run = |ms: u64| {
        let (client, clock, b, key) = (client.clone(), clock.clone(), b.clone(), key.clone());
        async move {
            let mut admitted = Vec::new();
            for i in 0..ms {
                clock.advance(Duration::from_millis(1));
                if i % 2 == 0 {
                    let res = client
                        .get(format!("http://{addr}/"))
                        .header("x-tenant", "acme")
                        .send()
                        .await
                        .unwrap();
                    if res.status() == 200 {
                        let limit: u64 = res.headers()["ratelimit-limit"]
                            .to_str()
                            .unwrap()
                            .parse()
                            .unwrap();
                        admitted.push((clock.now_millis(), limit));
                    } else {
                        assert_eq!(res.status(), 429);
                    }
                } else {
                    let d = b.check(&key, 1).await.unwrap();
                    if d.is_allowed() {
                        admitted.push((clock.now_millis(), d.limit()));
                    }
                }
            }
            admitted
        }
    };
    run(300).await;

    let res = client
        .put(format!(
            "http://{addr}/admin/overrides/tenant/acme?policy=api&limit={LOW}"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let listed: serde_json::Value = res.json().await.unwrap();
    assert_eq!(listed["overrides"][0]["limit"], LOW);
    let set_at = clock.now_millis();
    // The window's count past the override's limit (the warm-up's units and the blocks, up
    // to 500) is carried into the next windows and paid back at 50 a window, as the exact
    // stores carry it.
    let after = run(14 * W).await;
    let settled: Vec<(u64, u64)> = after
        .into_iter()
        .filter(|&(t, _)| t >= set_at + LEASE)
        .collect();
    let times: Vec<u64> = settled.iter().map(|&(t, _)| t).collect();
    check_bound(Algorithm::FixedWindow, LOW, &times).unwrap();
    assert!(settled.iter().all(|&(_, limit)| limit == LOW));
    let full = (set_at + 14 * W) / W - 1;
    let in_full = times.iter().filter(|&&t| t / W == full).count() as u64;
    assert!(in_full >= LOW - 2 * (LOW / 10), "{in_full} of {LOW}");

    let res = client
        .delete(format!(
            "http://{addr}/admin/overrides/tenant/acme?policy=api"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let listed: serde_json::Value = res.json().await.unwrap();
    assert_eq!(listed["overrides"].as_array().map(Vec::len), Some(0));
    let removed_at = clock.now_millis();
    let back = run(2 * W).await;
    let window = (removed_at + W) / W;
    let in_window = back.iter().filter(|&&(t, _)| t / W == window).count() as u64;
    assert!(
        in_window > 4 * LOW,
        "{in_window} admitted after the removal"
    );
    assert!(back
        .iter()
        .filter(|&&(t, _)| t >= removed_at + LEASE)
        .all(|&(_, limit)| limit == N));
}

/// The command line on a leased plan goes through the lease ledger as the application does:
/// `tollgate reset` forgets a leased key's ledger state, and `tollgate override set` on a
/// token bucket keeps the ledger's state for the override's slower refill.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_resets_and_overrides_a_leased_plan() {
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("tollgate-lease-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("plan.toml");
    std::fs::write(
        &plan,
        "[store]\nkind = \"redis\"\nprefix = \"clilease\"\nlease_time = \"250ms\"\n\n\
         [[policies]]\nname = \"api\"\nlimit = 20\nwindow = \"1m\"\nalgorithm = \"token_bucket\"\n\n\
         [default]\npolicies = [\"api\"]\n",
    )
    .unwrap();
    let (url, plan) = (server.url(), plan.to_str().unwrap().to_owned());
    let tollgate = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .args(["--redis", &url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = Policy::builder("api", Rate::per_minute(20))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    let app = limiter(
        LeasedStore::builder(
            RedisStore::builder()
                .prefix("clilease")
                .build_with_url(&server.url())
                .unwrap(),
        )
        .lease_time(Duration::from_millis(10))
        .build()
        .unwrap(),
        &p,
    );
    let key = Key::new("tenant", "acme");
    while app.check(&key, 1).await.unwrap().is_allowed() {}

    tollgate(&["reset", &plan, "tenant:acme"]);
    // The app's own refusal of the key lasts at most its lease time.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 0..10 {
        assert!(app.check(&key, 1).await.unwrap().is_allowed(), "reset");
    }
    let ledger = server.scan("clilease:*lease-tb*");
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let pttl = || -> i64 { server.query(&["PTTL", &ledger[0]]).unwrap() };
    // About 10 tokens missing (and a block's reserved refill) at 20 a minute: about 30 s.
    assert!(pttl() <= 60_000, "{}", pttl());
    tollgate(&[
        "override",
        "set",
        &plan,
        "tenant:acme",
        "api",
        "2",
        "--burst",
        "20",
    ]);
    // At 2 a minute the same 10 tokens take 300 s: the ledger's state is kept that long (less
    // the seconds a loaded machine takes to end the CLI and ask; 60 s under the plan's rate).
    assert!(pttl() >= 280_000, "{}", pttl());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let d = app.check(&key, 1).await.unwrap();
    assert_eq!(d.limit(), 20, "the override's capacity (its burst)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cost is measured against the capacity in force on a leased policy too: above the plan's
/// it is refused as `CostExceedsCapacity` naming the plan's capacity, charging nothing; with
/// an override raising the capacity it is decided (and charged) like any other; above the
/// override's it is refused naming that. The ledger in process and in Redis.
async fn costs_meet_the_capacity_in_force<S: LeaseBackend + Clone>(
    inner: S,
    clock: &ManualClock,
    label: &str,
) {
    for a in LEASED {
        let p = policy(a, "units");
        let limiter = limiter(leased(inner.clone(), clock), &p);
        let key = Key::new("k", format!("cost-{label}-{a}"));
        let refused = |r: Result<tollgate::Decision, tollgate::CheckError>| match r {
            Err(tollgate::CheckError::CostExceedsCapacity { capacity, .. }) => capacity,
            other => panic!("{label} {a}: {other:?}"),
        };
        // Asked again (the key is tracked from its second sighting): refused as such each
        // time, never from a refusal the instance saved as a rate-limit denial.
        for _ in 0..4 {
            assert_eq!(refused(limiter.check(&key, N + 1).await), N, "{label} {a}");
        }
        assert_eq!(
            limiter.peek(&key).await.unwrap().remaining(),
            N - 1,
            "{label} {a}: the refused cost charged nothing"
        );
        limiter
            .set_override(&key, Override::new("units", 5 * N))
            .await
            .unwrap();
        let d = limiter.check(&key, 3 * N).await.unwrap();
        assert!(d.is_allowed(), "{label} {a}: {d:?}");
        assert_eq!(
            refused(limiter.check(&key, 5 * N + 1).await),
            5 * N,
            "{label} {a}"
        );
        assert!(
            !limiter.check(&key, 2 * N + 1).await.unwrap().is_allowed(),
            "{label} {a}: 3 000 of 5 000 charged, 2 001 more do not fit"
        );
    }
}

#[tokio::test]
async fn costs_meet_the_capacity_in_force_on_a_memory_ledger() {
    let clock = ManualClock::new(1_000_000);
    let ledger = MemoryLedger::with_clock(clock.clone());
    costs_meet_the_capacity_in_force(ledger, &clock, "memory").await;
}

#[tokio::test]
async fn costs_meet_the_capacity_in_force_on_a_redis_ledger() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let store = redis_store(&server, "cost", &clock);
    costs_meet_the_capacity_in_force(store, &clock, "redis").await;
}

/// A token bucket's refill before an override changes is at the rate in force then, on the
/// lease ledger as in the memory store: a slower override set, then removed 30 s later, leaves
/// 30 s of its slow refill (3 tokens), not 30 s at the plan's rate; a faster one set after
/// 30 s at the plan's slow rate does not refill those 30 s at its own. Once the ledger
/// refilled the whole time at the new rate: up to a bucket's capacity over the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buckets_refill_before_an_override_change_is_at_the_old_rate() {
    let server = RedisServer::start();
    // GCRA on the ledger carries its backlog as units, not as the time until its TAT: its
    // answers differ here from the memory store's, as the leased module docs state.
    for a in [Algorithm::TokenBucket] {
        let p = |per_minute: u64| {
            Policy::builder("api", Rate::per_minute(per_minute).with_burst(60))
                .algorithm(a)
                .build()
                .unwrap()
        };
        for (plan, over, tag) in [(60, 6, "slower"), (6, 600, "faster")] {
            let clock = ManualClock::new(1_700_000_000_000);
            let stores: Vec<(&str, Limiter<tollgate::store::DynStore>)> = vec![
                (
                    "memory",
                    limiter(
                        tollgate::store::DynStore::new(
                            tollgate::store::MemoryStore::builder()
                                .clock(clock.clone())
                                .build()
                                .unwrap(),
                        ),
                        &p(plan),
                    ),
                ),
                (
                    "leased memory ledger",
                    limiter(
                        tollgate::store::DynStore::new(leased(
                            MemoryLedger::with_clock(clock.clone()),
                            &clock,
                        )),
                        &p(plan),
                    ),
                ),
                (
                    "leased redis ledger",
                    limiter(
                        tollgate::store::DynStore::new(leased(
                            redis_store(&server, &format!("refill-{tag}-{}", a.as_str()), &clock),
                            &clock,
                        )),
                        &p(plan),
                    ),
                ),
            ];
            let key = Key::new("tenant", format!("refill-{tag}-{}", a.as_str()));
            let start = clock.now_millis();
            for (store, l) in &stores {
                assert!(l.check(&key, 60).await.unwrap().is_allowed(), "{store}");
            }
            let o = Override::new("api", over).burst(60);
            let mut answers = vec![];
            if tag == "slower" {
                for (_, l) in &stores {
                    l.set_override(&key, o.clone()).await.unwrap();
                }
                clock.advance(Duration::from_secs(30));
                for (_, l) in &stores {
                    l.remove_override(&key, "api").await.unwrap();
                }
            } else {
                clock.advance(Duration::from_secs(30));
                for (_, l) in &stores {
                    l.set_override(&key, o.clone()).await.unwrap();
                }
            }
            clock.advance(Duration::from_millis(LEASE));
            for (store, l) in &stores {
                let d = l.check(&key, 30).await.unwrap();
                answers.push((*store, d.is_allowed()));
            }
            // Every store answers as the memory store: 30 s at 6 a minute is 3 tokens, so 30
            // cannot pass.
            let model = answers[0].1;
            assert!(
                answers.iter().all(|&(_, allowed)| allowed == model),
                "{a:?}, {tag} override: {answers:?} ({} ms)",
                clock.now_millis() - start
            );
            assert!(!model, "{tag}: {answers:?}");
        }
    }
}

/// A raised override set and removed at once on a spent bucket leaves the ledger's key for as
/// long as the plan's slower rate needs to refill it: the override's faster rate used to size
/// its expiry (setting an override writes the state again), so the key vanished within two
/// seconds and the whole burst came back, where the memory store refills 2 tokens. Real time
/// here: Redis expires keys on its own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_override_removed_at_once_does_not_shorten_the_ledgers_memory() {
    let server = RedisServer::start();
    for a in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let p = Policy::builder("api", Rate::per_minute(60).with_burst(60))
            .algorithm(a)
            .build()
            .unwrap();
        let exact = limiter(tollgate::store::MemoryStore::new(), &p);
        let leased_redis = limiter(
            LeasedStore::builder(
                RedisStore::builder()
                    .prefix(format!("raised-{}", a.as_str()))
                    .build_with_url(&server.url())
                    .unwrap(),
            )
            .lease_time(Duration::from_millis(LEASE))
            .build()
            .unwrap(),
            &p,
        );
        let key = Key::new("tenant", format!("raised-{}", a.as_str()));
        assert!(exact.check(&key, 60).await.unwrap().is_allowed());
        assert!(leased_redis.check(&key, 60).await.unwrap().is_allowed());
        let raised = Override::new("api", 6_000).burst(60);
        exact.set_override(&key, raised.clone()).await.unwrap();
        leased_redis.set_override(&key, raised).await.unwrap();
        exact.remove_override(&key, "api").await.unwrap();
        leased_redis.remove_override(&key, "api").await.unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let model = exact.check(&key, 30).await.unwrap();
        let ledger = leased_redis.check(&key, 30).await.unwrap();
        assert!(!model.is_allowed(), "{a:?}: {model:?}");
        assert!(
            !ledger.is_allowed(),
            "{a:?}: the ledger forgot the spent bucket: {ledger:?}"
        );
    }
}
