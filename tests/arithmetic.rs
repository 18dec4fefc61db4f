//! Arithmetic on numbers callers and operators control — costs, reservations, settlements,
//! refunds, per-key overrides — on the memory store and a real Redis (both Lua entry points),
//! through the raw `Store` API, the direct `Limiter` API and real axum servers.
//!
//! Manual clocks throughout; the Redis stores are given the same clock (the script then
//! decides at the time it is sent), and windows are long enough that no key's TTL runs out
//! in real time while a test runs.

mod support;

use std::time::Duration;
use tollgate::store::StoreExt;

use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use tollgate::clock::ManualClock;
use tollgate::key::{Global, Key};
use tollgate::route::{ActualCost, Meter, Route};
use tollgate::store::{DynStore, MemoryStore, RedisStore, Store};
use tollgate::{
    Algorithm, CheckError, EstimateFromJsonLayer, Limiter, Override, Policy, Rate, RateLimitLayer,
};

use support::scenarios::{unique_prefix, ALGORITHMS};
use support::RedisServer;

const T0: u64 = 1_700_000_000_000;
const MINUTE: Duration = Duration::from_secs(60);

/// The numbers at which the arithmetic turns: the edges of a Lua double's exact range, of
/// `i64` and of `u64`.
const EXTREMES: [u64; 7] = [
    0,
    1,
    100, // the limit of `policy` below
    (1 << 53) - 1,
    1 << 53,
    1 << 63,
    u64::MAX,
];

fn policy(algorithm: Algorithm, limit: u64, window: Duration) -> Policy {
    Policy::builder(format!("p_{algorithm}"), Rate::new(limit, window))
        .algorithm(algorithm)
        .build()
        .unwrap()
}

fn memory(clock: &ManualClock) -> DynStore {
    DynStore::new(
        MemoryStore::builder()
            .clock(clock.clone())
            .background_sweep(false)
            .build()
            .unwrap(),
    )
}

fn redis(server: &RedisServer, clock: &ManualClock, tag: &str) -> DynStore {
    DynStore::new(
        RedisStore::builder()
            .prefix(unique_prefix(tag))
            .clock(clock.clone())
            .build_with_url(&server.url())
            .unwrap(),
    )
}

/// The memory store and a Redis store on one clock.
fn both(server: &RedisServer, clock: &ManualClock, tag: &str) -> [(&'static str, DynStore); 2] {
    [
        ("memory", memory(clock)),
        ("redis", redis(server, clock, tag)),
    ]
}

fn limiter(store: &DynStore, policy: &Policy) -> Limiter<DynStore> {
    Limiter::builder()
        .store(store.clone())
        .policy(policy.clone())
        .build()
        .unwrap()
}

/// Operations on one key with extreme numbers, through the raw `Store` API, on the memory
/// store and Redis side by side: every answer must be the same, to the millisecond. Alone
/// (`lua/single.lua` answers the checks and looks) and beside a second policy
/// (`lua/decide.lua`); settlements and refunds always take the general path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_numbers_get_the_same_answers_from_memory_and_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let [(_, mem), (_, red)] = both(&server, &clock, "extremes");
    let other = Policy::builder("other", Rate::new(1 << 30, MINUTE))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    let mut case = 0;
    for algorithm in ALGORITHMS {
        let p = policy(algorithm, 100, MINUTE);
        for beside in [false, true] {
            let policies: Vec<Policy> = if beside {
                vec![p.clone(), other.clone()]
            } else {
                vec![p.clone()]
            };
            let n = policies.len();
            for &v in &EXTREMES {
                for op in 0..5 {
                    case += 1;
                    clock.set_millis(T0 + case * 7);
                    let key = Key::new("user", format!("x{case}"));
                    let label = format!("{algorithm} beside={beside} v={v} op={op}");
                    // Some usage first: 40 units, 60 left.
                    for s in [&mem, &red] {
                        assert!(s
                            .check(&key, &policies, &vec![40; n])
                            .await
                            .unwrap()
                            .is_allowed());
                    }
                    for s in [&mem, &red] {
                        match op {
                            // Reserved 10, settled at v (a charge of v − 10, or a refund).
                            0 => s.settle(&key, &policies, &vec![10; n], &vec![v; n]).await,
                            // Reserved v, settled at 0: a refund of v.
                            1 => s.settle(&key, &policies, &vec![v; n], &vec![0; n]).await,
                            2 => s.refund(&key, &policies, &vec![v; n]).await,
                            // Reserved v, settled at v + 10 (wrapping past u64::MAX is not a
                            // refund: saturating).
                            3 => {
                                s.settle(
                                    &key,
                                    &policies,
                                    &vec![v; n],
                                    &vec![v.saturating_add(10); n],
                                )
                                .await
                            }
                            _ => s.check(&key, &policies, &vec![v; n]).await.map(drop),
                        }
                        .unwrap();
                    }
                    for (dt, cost) in [
                        (0, 0),
                        (0, 1),
                        (0, v),
                        (30_000, 1),
                        (61_000, 1),
                        (600_000, 50),
                    ] {
                        clock.advance(Duration::from_millis(dt));
                        let costs = vec![cost; n];
                        let m = mem.peek(&key, &policies, &costs).await.unwrap();
                        let r = red.peek(&key, &policies, &costs).await.unwrap();
                        assert_eq!(m, r, "{label}: a look at {cost} after {dt} ms");
                    }
                    let m = mem.check(&key, &policies, &vec![1; n]).await.unwrap();
                    let r = red.check(&key, &policies, &vec![1; n]).await.unwrap();
                    assert_eq!(m, r, "{label}: a charge of 1 at the end");
                }
            }
        }
    }
}

/// `reserve(10)` then `settle(actual)` for actual costs at the edges of `i64` and of a
/// double's exact range: each is a charge on both stores, never a refund.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_any_u64_charges_on_every_store() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for (name, store) in both(&server, &clock, "any-u64") {
        for algorithm in ALGORITHMS {
            let p = policy(algorithm, 100, MINUTE);
            let limiter = limiter(&store, &p);
            for (i, actual) in [
                1_000_000,
                (1 << 53) - 1,
                1 << 53,
                1 << 63,
                (1 << 63) + 10,
                u64::MAX,
            ]
            .into_iter()
            .enumerate()
            {
                let key = Key::new("user", format!("{algorithm}-{i}"));
                let r = limiter.reserve(&key, 10).await.unwrap();
                assert!(r.decision().is_allowed());
                r.settle(actual).await.unwrap();
                let next = limiter.check(&key, 1).await.unwrap();
                assert!(
                    !next.is_allowed(),
                    "{name} {algorithm}: settle({actual}) after reserve(10) must charge"
                );
                // Still refused a limit's worth of windows later: the charge was not capped
                // at the limit.
                clock.advance(MINUTE * 3);
                assert!(
                    !limiter.check(&key, 1).await.unwrap().is_allowed(),
                    "{name} {algorithm}: settle({actual}) is a debt, not forgiven"
                );
                clock.set_millis(T0);
            }
        }
    }
}

/// The layer of `tokens` (100 per minute) metered from `max_tokens` and settled from the
/// `x-actual` header the handler answers with (copied from the request's).
async fn metered_app(store: DynStore, tokens: &Policy) -> std::net::SocketAddr {
    let limiter = Limiter::builder()
        .store(store)
        .route(
            "POST /generate",
            Route::new().metered(
                tokens.clone(),
                Meter::from_body(1).settle_from_header("x-actual".parse().unwrap()),
            ),
        )
        .route(
            "POST /extension",
            Route::new().metered(tokens.clone(), Meter::from_body(1)),
        )
        .default_route(Route::exempt())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/generate",
            post(|headers: HeaderMap| async move {
                let actual = headers
                    .get("x-actual")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("0")
                    .to_owned();
                ([("x-actual", actual)], "generated")
            }),
        )
        .route(
            "/extension",
            post(|headers: HeaderMap| async move {
                let actual = headers
                    .get("x-actual")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(0);
                let mut res = "generated".into_response();
                res.extensions_mut().insert(ActualCost::new(actual));
                res
            }),
        )
        .layer(RateLimitLayer::new(limiter))
        .layer(EstimateFromJsonLayer::new("max_tokens"));
    support::serve(app).await
}

async fn send(
    addr: std::net::SocketAddr,
    path: &str,
    body: &str,
    actual: u64,
) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header("x-actual", actual.to_string())
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

/// A spent budget refuses every reservation, whatever its estimate: 0 included, through the
/// direct API and through `EstimateFromJsonLayer` (a field of 0, given twice too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_refuses_an_estimate_of_zero() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for (name, store) in both(&server, &clock, "zero") {
        for algorithm in ALGORITHMS {
            let p = policy(algorithm, 100, MINUTE);
            let limiter = limiter(&store, &p);
            let key = Key::new("user", format!("zero-{algorithm}"));
            let r = limiter.reserve(&key, 100).await.unwrap();
            r.settle(100).await.unwrap();
            let mut admitted = 0;
            for _ in 0..20 {
                let r = limiter.reserve(&key, 0).await.unwrap();
                admitted += u32::from(r.decision().is_allowed());
                r.settle(30).await.unwrap();
            }
            assert_eq!(
                admitted, 0,
                "{name} {algorithm}: reserve(0) on a spent budget"
            );
            // A cost of 0 stays a free look: charged nothing, admitted while the key is not
            // past its limit.
            let look = limiter.check(&key, 0).await.unwrap();
            assert!(
                look.is_allowed() && look.remaining() == 0,
                "{name} {algorithm}"
            );
            // A reservation of 0 that fits holds one unit until settled, and settling at 0
            // gives it back.
            let fresh = Key::new("user", format!("fresh-{algorithm}"));
            let r = limiter.reserve(&fresh, 0).await.unwrap();
            assert_eq!(r.decision().remaining(), 99, "{name} {algorithm}");
            r.settle(0).await.unwrap();
            assert_eq!(
                limiter.check(&fresh, 100).await.unwrap().remaining(),
                0,
                "{name} {algorithm}: settled at 0, nothing stays charged"
            );
        }
        // Over HTTP: 100 tokens spent, then estimates of 0.
        let tokens = policy(Algorithm::SlidingWindowCounter, 100, MINUTE);
        let addr = metered_app(store.clone(), &tokens).await;
        let res = send(addr, "/generate", r#"{"max_tokens":100}"#, 100).await;
        assert_eq!(res.status(), 200);
        for body in [
            r#"{"max_tokens":0}"#,
            r#"{"max_tokens":0,"max_tokens":0}"#,
            r#"{"max_tokens":1}"#,
            "{}",
        ] {
            for path in ["/generate", "/extension"] {
                let res = send(addr, path, body, 30).await;
                assert_eq!(res.status(), 429, "{name}: {path} {body} on a spent budget");
            }
        }
    }
}

/// One request reserved and settled at a time, above its estimate, in a loop over twelve
/// windows, for every algorithm: the units served up to the end of any window are at most
/// the windows' limits (plus the burst of the token bucket and GCRA, which start full) plus
/// the overshoot of one request, and no window serves more than its limit (twice it for the
/// buckets) plus that overshoot. Before, everything past the limit was forgiven at once, and
/// every window served a whole overshoot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_above_the_estimate_are_never_forgiven() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let windows = 12u64;
    for (name, store) in both(&server, &clock, "bound") {
        for algorithm in ALGORITHMS {
            for together in [1u64, 3] {
                let n = 10;
                let p = policy(algorithm, n, MINUTE);
                let limiter = limiter(&store, &p);
                let key = Key::new("user", format!("bound-{algorithm}-{together}"));
                let start = (T0 / 60_000 + 1) * 60_000; // a window start
                clock.set_millis(start);
                let mut served = vec![0u64; windows as usize];
                let mut overshoot = 0;
                let mut i = 0u64;
                while clock_now(&clock) < start + windows * 60_000 {
                    let w = ((clock_now(&clock) - start) / 60_000) as usize;
                    let mut held = vec![];
                    for _ in 0..together {
                        let estimate = i % 3; // 0, 1, 2
                        let actual = 25;
                        i += 1;
                        let r = limiter.reserve(&key, estimate).await.unwrap();
                        if r.decision().is_allowed() {
                            held.push((r, estimate.max(1), actual));
                        }
                    }
                    let mut batch = 0;
                    for (r, reserved, actual) in held {
                        r.settle(actual).await.unwrap();
                        served[w] += actual;
                        batch += actual - reserved;
                    }
                    overshoot = overshoot.max(batch);
                    clock.advance(Duration::from_secs(3));
                }
                let burst = if algorithm.has_burst() { n } else { 0 };
                let mut total = 0;
                for (k, &s) in served.iter().enumerate() {
                    total += s;
                    let k = k as u64 + 1;
                    assert!(
                        total <= k * n + burst + overshoot,
                        "{name} {algorithm} ×{together}: {total} units served in {k} windows \
                         (per window {served:?}) against {n} per window, overshoot {overshoot}"
                    );
                    assert!(
                        s <= n + burst + overshoot,
                        "{name} {algorithm} ×{together}: {s} units in window {k} ({served:?})"
                    );
                }
                assert!(
                    total >= 5 * n,
                    "{name} {algorithm}: served at all ({served:?})"
                );
            }
        }
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use tollgate::clock::Clock;
    clock.now_millis()
}

/// An override lowers a limit below a request's cost: the cost is refused as exceeding the
/// capacity in force (no retry time; no wait makes it fit), charging nothing, instead of an
/// underflow (the counter) or a refusal to retry forever. Through the direct API and HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_an_overrides_capacity_is_refused_as_such() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for (name, store) in both(&server, &clock, "ovr-cost") {
        for algorithm in ALGORITHMS {
            let p = policy(algorithm, 10, MINUTE);
            let limiter = limiter(&store, &p);
            let key = Key::new("user", format!("ovr-{algorithm}"));
            assert!(limiter.check(&key, 10).await.unwrap().is_allowed());
            limiter
                .set_override(&key, Override::new(p.name(), 1))
                .await
                .unwrap();
            for _ in 0..3 {
                match limiter.check(&key, 3).await {
                    Err(CheckError::CostExceedsCapacity {
                        policy,
                        cost,
                        capacity,
                    }) => {
                        assert_eq!((policy.as_str(), cost, capacity), (p.name(), 3, 1));
                    }
                    other => panic!("{name} {algorithm}: {other:?}"),
                }
            }
            match limiter.reserve(&key, 3).await {
                Err(CheckError::CostExceedsCapacity { capacity: 1, .. }) => {}
                other => panic!("{name} {algorithm}: reserve: {other:?}"),
            }
            // A cost that fits the override waits for the usage to be paid at its rate.
            let d = limiter.check(&key, 1).await.unwrap();
            assert!(!d.is_allowed(), "{name} {algorithm}");
            limiter.remove_override(&key, p.name()).await.unwrap();
            limiter.reset(&key).await.unwrap();
            assert!(limiter.check(&key, 3).await.unwrap().is_allowed());
        }

        // Over HTTP, a computed cost: 429 `cost_exceeds_capacity`, no Retry-After.
        let p = policy(Algorithm::SlidingWindowCounter, 10, MINUTE);
        let limiter = Limiter::builder()
            .store(store.clone())
            .route(
                "POST /batch",
                Route::new().policy(p.clone()).cost_fn(|req| {
                    req.headers()
                        .get("x-batch")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                }),
            )
            .default_route(Route::exempt())
            .extractor(Global::new())
            .build()
            .unwrap();
        let app = Router::new()
            .route("/batch", post(|| async { "done" }))
            .layer(RateLimitLayer::new(limiter.clone()));
        let addr = support::serve(app).await;
        let batch = |n: u64| {
            reqwest::Client::new()
                .post(format!("http://{addr}/batch"))
                .header("x-batch", n.to_string())
                .send()
        };
        assert_eq!(batch(10).await.unwrap().status(), 200);
        limiter
            .set_override(&Key::global("all"), Override::new(p.name(), 1))
            .await
            .unwrap();
        let res = batch(3).await.unwrap();
        assert_eq!(res.status(), 429, "{name}");
        assert!(res.headers().get("retry-after").is_none(), "{name}");
        let body = res.text().await.unwrap();
        assert!(body.contains("cost_exceeds_capacity"), "{name}: {body}");
        assert!(body.contains("capacity 1"), "{name}: {body}");
        let res = batch(1).await.unwrap();
        assert_eq!(res.status(), 429, "{name}: the usage carries on");
        assert!(res.headers().get("retry-after").is_some(), "{name}");
    }
}

/// GCRA after an override lowers its rate: a retry at exactly `retry_after` passes and one a
/// millisecond earlier does not, on both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_retries_are_exact_after_an_override_lowers_the_rate() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for (name, store) in both(&server, &clock, "gcra-ovr") {
        let p = policy(Algorithm::Gcra, 7, Duration::from_secs(1));
        let limiter = limiter(&store, &p);
        let one = std::slice::from_ref(&p);
        for (round, offset) in [0u64, 1, 2, 3, 5].into_iter().enumerate() {
            clock.set_millis(T0 + offset);
            let key = Key::new("user", format!("g{round}"));
            // A TAT that ends between milliseconds: 1/7 ms remainders.
            for _ in 0..round + 3 {
                limiter.check(&key, 1).await.unwrap();
                clock.advance(Duration::from_millis(31));
            }
            limiter
                .set_override(&key, Override::new(p.name(), 3).burst(3))
                .await
                .unwrap();
            let mut checked = 0;
            for _ in 0..40 {
                for cost in 1..=3 {
                    let d = store.peek(&key, one, &[cost]).await.unwrap();
                    if d.is_allowed() {
                        continue;
                    }
                    checked += 1;
                    let now = clock_now(&clock);
                    let retry = d.retry_after_millis();
                    clock.set_millis(now + retry - 1);
                    assert!(
                        !store.peek(&key, one, &[cost]).await.unwrap().is_allowed(),
                        "{name}: passes before retry_after ({retry} ms, cost {cost})"
                    );
                    clock.set_millis(now + retry);
                    assert!(
                        store.peek(&key, one, &[cost]).await.unwrap().is_allowed(),
                        "{name}: refused at retry_after ({retry} ms, cost {cost})"
                    );
                    clock.set_millis(now);
                }
                limiter.check(&key, 1).await.unwrap();
                clock.advance(Duration::from_millis(17));
            }
            assert!(checked > 20, "{name}: {checked} refusals checked");
        }
    }
}

/// One trace of a token bucket and its overrides, on both stores: the refill before an
/// override is set counts at the plan's rate, the refill under it at its rate, the refill
/// after its removal at the plan's again; the memory store forgetting an entry whose bucket
/// has refilled (its sweeper) changes nothing. Before, the new rate applied to the time
/// before the override, and the two stores answered differently once the memory store had
/// forgotten a bucket Redis still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_under_overrides_refills_at_the_rate_in_force_on_both_stores() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let swept = MemoryStore::builder()
        .clock(clock.clone())
        .background_sweep(false)
        .build()
        .unwrap();
    let stores = [
        ("memory", DynStore::new(swept.clone()), Some(swept)),
        ("redis", redis(&server, &clock, "bucket-ovr"), None),
    ];
    let p = Policy::builder("b", Rate::per_second(10))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    let slower = || Override::new("b", 1).burst(10);
    let expected = [
        (true, 0),
        (true, 4),
        (true, 5),
        (true, 5),
        (true, 0),
        (true, 0),
    ];
    for (name, store, memory) in stores {
        clock.set_millis(T0);
        let limiter = limiter(&store, &p);
        let key = Key::new("user", "b");
        let mut seen = vec![];
        let d = limiter.check(&key, 10).await.unwrap();
        seen.push((d.is_allowed(), d.remaining()));
        // Half a second at 10/s: 5 tokens back before the override.
        clock.advance(Duration::from_millis(500));
        limiter.set_override(&key, slower()).await.unwrap();
        let d = limiter.check(&key, 1).await.unwrap(); // 5 - 1
        seen.push((d.is_allowed(), d.remaining()));
        // Two seconds at 1/s: 2 tokens.
        clock.advance(Duration::from_secs(2));
        let d = limiter.check(&key, 1).await.unwrap(); // 4 + 2 - 1
        seen.push((d.is_allowed(), d.remaining()));
        // Removed: a tenth of a second at 10/s is one more token.
        limiter.remove_override(&key, "b").await.unwrap();
        clock.advance(Duration::from_millis(100));
        let d = limiter.check(&key, 1).await.unwrap(); // 5 + 1 - 1
        seen.push((d.is_allowed(), d.remaining()));
        // Another key: spent, then full again at the plan's rate a second later, which the
        // memory store's sweeper may notice before the override is set.
        let other = Key::new("user", "c");
        let d = limiter.check(&other, 10).await.unwrap();
        seen.push((d.is_allowed(), d.remaining()));
        clock.advance(Duration::from_millis(1_200));
        if let Some(memory) = &memory {
            memory.sweep();
            assert!(memory.len() <= 1, "the refilled bucket was forgotten");
        }
        limiter.set_override(&other, slower()).await.unwrap();
        let d = limiter.check(&other, 10).await.unwrap(); // full before the override
        seen.push((d.is_allowed(), d.remaining()));
        assert_eq!(seen, expected, "{name}");
    }
}

/// A xorshift generator: the random traces below are the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random traces of reservations settled one after another (estimates from 0 to the limit,
/// actual costs up to thirty limits, gaps from 0 to three windows), checked against the
/// bound each algorithm states (`Store::settle`): over `j` whole windows the fixed window and
/// the counter serve at most `j·N`, over any span of `j` windows the log at most `j·N`, the
/// fixed window and the counter `(j + 1)·N`, and the buckets `C + j·N`, each plus the
/// overshoot (actual cost less reservation) of the last request admitted in it.
async fn random_settlements_stay_within_the_stated_bounds(
    store: &DynStore,
    clock: &ManualClock,
    seeds: u64,
) {
    let w = 60_000u64;
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        for algorithm in ALGORITHMS {
            let n = 1 + rng.below(12);
            let p = policy(algorithm, n, Duration::from_millis(w));
            let limiter = limiter(store, &p);
            let key = Key::new("user", format!("random-{seed}-{algorithm}"));
            let mut t = T0 / w * w;
            // (time, actual, overshoot) of each admitted request.
            let mut served = vec![];
            for _ in 0..300 {
                t += match rng.below(4) {
                    0 => 0,
                    1 => rng.below(3_000),
                    2 => rng.below(30_000),
                    _ => rng.below(180_000),
                };
                clock.set_millis(t);
                let estimate = rng.below(n + 1);
                let actual = match rng.below(3) {
                    0 => rng.below(n + 1),
                    1 => rng.below(5 * n + 1),
                    _ => rng.below(30 * n + 1),
                };
                let r = limiter.reserve(&key, estimate).await.unwrap();
                if r.decision().is_allowed() {
                    r.settle(actual).await.unwrap();
                    served.push((t, actual, actual.saturating_sub(estimate.max(1))));
                }
            }
            assert!(served.len() > 5, "{algorithm}: {} admitted", served.len());
            let burst = if algorithm.has_burst() { n } else { 0 };
            let windowed = matches!(
                algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
            );
            for j in 1..=6u64 {
                for (i, &(at, _, _)) in served.iter().enumerate() {
                    // Spans starting at each admission, and at the start of its window.
                    for (from, limit) in [
                        (at, j * n + burst + if windowed { n } else { 0 }),
                        (at / w * w, j * n + burst),
                    ] {
                        let first = served[..=i].iter().position(|e| e.0 >= from).unwrap_or(i);
                        let (mut total, mut last) = (0, 0);
                        for &(t, actual, overshoot) in &served[first..] {
                            if t >= from + j * w {
                                break;
                            }
                            total += actual;
                            last = overshoot;
                        }
                        assert!(
                            total <= limit + last,
                            "{} seed {seed} {algorithm} N={n}: {total} units in {j} windows from \
                             {from} (bound {limit} + overshoot {last})",
                            store.name()
                        );
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn random_settlements_stay_within_the_stated_bounds_memory() {
    let clock = ManualClock::new(T0);
    random_settlements_stay_within_the_stated_bounds(&memory(&clock), &clock, 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_settlements_stay_within_the_stated_bounds_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let store = redis(&server, &clock, "random");
    random_settlements_stay_within_the_stated_bounds(&store, &clock, 8).await;
}

/// Over HTTP: settlements from a response header of any `u64` charge (the next request is
/// refused), and a client whose every answer costs one and a half limits is served, over any
/// run of whole windows, at most their limits plus one overshoot. Before, each window served
/// a whole answer, so the client got one and a half times its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_over_http_charge_in_full() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for (name, store) in both(&server, &clock, "http-settle") {
        for actual in [1u64 << 53, (1 << 63) + 10, u64::MAX] {
            clock.set_millis(T0);
            let tokens = policy(Algorithm::FixedWindow, 100, MINUTE);
            let addr = metered_app(store.clone(), &tokens).await;
            store
                .reset(&Key::global("all"), std::slice::from_ref(&tokens))
                .await
                .unwrap();
            let res = send(addr, "/generate", r#"{"max_tokens":10}"#, actual).await;
            assert_eq!(res.status(), 200);
            let res = send(addr, "/generate", r#"{"max_tokens":1}"#, 1).await;
            assert_eq!(
                res.status(),
                429,
                "{name}: settled at {actual}, then refused"
            );
            clock.advance(MINUTE * 100);
            let res = send(addr, "/generate", r#"{"max_tokens":1}"#, 1).await;
            assert_eq!(res.status(), 429, "{name}: {actual} is still owed");
        }
        for algorithm in ALGORITHMS {
            let tokens = policy(algorithm, 100, MINUTE);
            let addr = metered_app(store.clone(), &tokens).await;
            store
                .reset(&Key::global("all"), std::slice::from_ref(&tokens))
                .await
                .unwrap();
            let start = (T0 / 60_000 + 1) * 60_000;
            clock.set_millis(start);
            let mut served = [0u64; 8];
            for step in 0..served.len() * 4 {
                clock.set_millis(start + step as u64 * 15_000);
                let res = send(addr, "/extension", r#"{"max_tokens":1}"#, 150).await;
                if res.status() == 200 {
                    served[step / 4] += 150;
                }
            }
            let burst = if algorithm.has_burst() { 100 } else { 0 };
            let mut total = 0;
            for (k, s) in served.iter().enumerate() {
                total += s;
                assert!(
                    total <= (k as u64 + 1) * 100 + burst + 149,
                    "{name} {algorithm}: {total} served in {} windows ({served:?})",
                    k + 1
                );
            }
            assert!(total >= 300, "{name} {algorithm}: {served:?}");
        }
    }
}

/// Over HTTP, the token bucket trace of `a_bucket_under_overrides_refills_at_the_rate_in_force`:
/// the quota headers show the refill before an override at the plan's rate, on both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_override_shows_the_refill_in_force_over_http() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    for (name, store) in both(&server, &clock, "http-bucket") {
        clock.set_millis(T0);
        let p = Policy::builder("b", Rate::per_second(10))
            .algorithm(Algorithm::TokenBucket)
            .build()
            .unwrap();
        let limiter = Limiter::builder()
            .store(store.clone())
            .route(
                "POST /work",
                Route::new().policy(p.clone()).cost_fn(|req| {
                    req.headers()
                        .get("x-cost")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(1)
                }),
            )
            .default_route(Route::exempt())
            .extractor(Global::new())
            .build()
            .unwrap();
        let app = Router::new()
            .route("/work", post(|| async { "done" }))
            .layer(RateLimitLayer::new(limiter.clone()));
        let addr = support::serve(app).await;
        let work = |cost: u64| {
            reqwest::Client::new()
                .post(format!("http://{addr}/work"))
                .header("x-cost", cost.to_string())
                .send()
        };
        let remaining = |res: &reqwest::Response| {
            res.headers()["x-ratelimit-remaining"]
                .to_str()
                .unwrap()
                .to_owned()
        };
        let res = work(10).await.unwrap();
        assert_eq!((res.status().as_u16(), remaining(&res)), (200, "0".into()));
        clock.advance(Duration::from_millis(500));
        limiter
            .set_override(&Key::global("all"), Override::new("b", 1).burst(10))
            .await
            .unwrap();
        let res = work(1).await.unwrap();
        assert_eq!(
            (res.status().as_u16(), remaining(&res)),
            (200, "4".into()),
            "{name}: five tokens came back at 10/s before the override"
        );
        clock.advance(Duration::from_secs(2));
        let res = work(1).await.unwrap();
        assert_eq!(
            (res.status().as_u16(), remaining(&res)),
            (200, "5".into()),
            "{name}"
        );
    }
}
