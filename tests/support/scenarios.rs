//! Scenarios shared by the single-node and the cluster tests, generic over the store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::store::StoreExt;

use proptest::prelude::*;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Policy, Rate};

/// A prefix no other test uses.
pub fn unique_prefix(tag: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "tg-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn policy(name: &str, rate: Rate, algorithm: Algorithm) -> Policy {
    Policy::builder(name, rate)
        .algorithm(algorithm)
        .build()
        .unwrap()
}

pub const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::Gcra,
];

/// Policies for the differential test of one algorithm: a small one that is hit often, and
/// one at the 2^50 bound of capacity × window, so the Lua's exact division is exercised.
pub fn differential_policies(algorithm: Algorithm) -> Vec<Policy> {
    let ms = Duration::from_millis;
    match algorithm {
        Algorithm::SlidingWindowCounter => vec![
            policy("small", Rate::new(7, ms(1_000)), algorithm),
            policy("huge", Rate::new(13_000_000, ms(86_400_000)), algorithm),
        ],
        Algorithm::SlidingWindowLog => vec![policy("small", Rate::new(9, ms(700)), algorithm)],
        Algorithm::TokenBucket => vec![
            policy("small", Rate::new(3, ms(1_000)).with_burst(6), algorithm),
            policy(
                "huge",
                Rate::new(997, ms(86_400_000)).with_burst(13_000_000),
                algorithm,
            ),
        ],
        Algorithm::FixedWindow => vec![policy("small", Rate::new(6, ms(900)), algorithm)],
        Algorithm::InFlight => vec![policy("slots", Rate::new(3, ms(30_000)), algorithm)],
        Algorithm::Gcra => vec![
            Policy::builder("shaped", Rate::new(7, ms(1_000)).with_burst(3))
                .algorithm(algorithm)
                .shape(ms(400))
                .build()
                .unwrap(),
            policy("plain", Rate::new(5, ms(3_000)).with_burst(4), algorithm),
            policy(
                "huge",
                Rate::new(12_999_991, ms(86_400_000)).with_burst(13_000_000),
                algorithm,
            ),
        ],
        other => panic!("no differential policies for {other:?} yet"),
    }
}

/// One policy of every algorithm, decided together: 10/s next to a daily quota and friends.
pub fn mixed_policies() -> Vec<Policy> {
    let ms = Duration::from_millis;
    vec![
        policy(
            "burst",
            Rate::new(10, ms(1_000)),
            Algorithm::SlidingWindowCounter,
        ),
        policy(
            "daily",
            Rate::per_day(1_000),
            Algorithm::SlidingWindowCounter,
        ),
        policy("log", Rate::new(12, ms(1_500)), Algorithm::SlidingWindowLog),
        policy(
            "bucket",
            Rate::new(4, ms(1_000)).with_burst(8),
            Algorithm::TokenBucket,
        ),
        policy("fixed", Rate::new(15, ms(2_000)), Algorithm::FixedWindow),
        Policy::builder("gcra", Rate::new(9, ms(1_000)).with_burst(5))
            .algorithm(Algorithm::Gcra)
            .shape(ms(250))
            .build()
            .unwrap(),
    ]
}

/// One step of a trace.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub dt: u64,
    pub key: u8,
    pub cost: u64,
    /// 0..80 check, 80..90 refund, 90..97 peek, 97..100 reset.
    pub op: u8,
}

/// Random traces: mostly small steps in time, now and then a jump past every window.
pub fn trace(len: std::ops::Range<usize>, max_cost: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u64..250, 0u8..3, 1..=max_cost, 0u8..100, 0u8..100).prop_map(
            |(dt, key, cost, op, jump)| Step {
                dt: match jump {
                    0 => dt * 400,
                    1..=30 => 0,
                    _ => dt,
                },
                key,
                cost,
                op,
            },
        ),
        len,
    )
}

/// Runs `steps` through a fresh memory store and `store` (both on `clock`) and requires equal
/// decisions step by step. A refund is followed by a peek of both stores, which must agree.
pub async fn run_differential<S: Store>(
    store: &S,
    clock: &ManualClock,
    policies: &[Policy],
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let memory = MemoryStore::builder()
        .clock(clock.clone())
        .background_sweep(false)
        .build()
        .unwrap();
    let keys: Vec<Key> = (0..3).map(|i| Key::new("user", format!("u{i}"))).collect();
    for (i, step) in steps.iter().enumerate() {
        clock.advance(Duration::from_millis(step.dt));
        let key = &keys[usize::from(step.key)];
        let costs: Vec<u64> = policies.iter().map(|_| step.cost).collect();
        if step.op >= 97 {
            memory.reset(key, policies).await.unwrap();
            store.reset(key, policies).await.unwrap();
            continue;
        }
        let refund = (80..90).contains(&step.op);
        if refund {
            memory.refund(key, policies, &costs).await.unwrap();
            store.refund(key, policies, &costs).await.unwrap();
        }
        let (m, r) = if refund || step.op >= 90 {
            (
                memory.peek(key, policies, &costs).await,
                store.peek(key, policies, &costs).await,
            )
        } else {
            (
                memory.check(key, policies, &costs).await,
                store.check(key, policies, &costs).await,
            )
        };
        let (m, r) = (m.unwrap(), r.unwrap());
        prop_assert_eq!(
            &m,
            &r,
            "step {} ({:?}) at {} ms: memory vs {}",
            i,
            step,
            clock_now(clock),
            store.name()
        );
    }
    Ok(())
}

fn clock_now(clock: &ManualClock) -> u64 {
    use tollgate::clock::Clock;
    clock.now_millis()
}

/// `tasks` concurrent tasks per store, each checking `policies[a]` on `keys[a]` for every `a` in
/// turn until `span` has passed; returns how many were admitted per policy.
pub async fn hammer<S: Store + Clone>(
    stores: &[S],
    policies: &[Policy],
    keys: &[Key],
    tasks: usize,
    span: Duration,
) -> Vec<u64> {
    let admitted: Arc<Vec<AtomicU64>> =
        Arc::new(policies.iter().map(|_| AtomicU64::new(0)).collect());
    let deadline = Instant::now() + span;
    let mut handles = Vec::new();
    for store in stores {
        for t in 0..tasks {
            let store = store.clone();
            let policies = policies.to_vec();
            let keys = keys.to_vec();
            let admitted = Arc::clone(&admitted);
            handles.push(tokio::spawn(async move {
                let mut a = t % policies.len();
                while Instant::now() < deadline {
                    let p = std::slice::from_ref(&policies[a]);
                    let d = store.check(&keys[a], p, &[1]).await.expect("store error");
                    if d.is_allowed() {
                        admitted[a].fetch_add(1, Ordering::Relaxed);
                    }
                    a = (a + 1) % policies.len();
                }
            }));
        }
    }
    for h in handles {
        h.await.unwrap();
    }
    admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

/// 500 per hour in every algorithm (burst 500 for the buckets).
pub fn hourly_policies() -> Vec<Policy> {
    ALGORITHMS
        .iter()
        .map(|&a| {
            let rate = if a.has_burst() {
                Rate::per_hour(500).with_burst(500)
            } else {
                Rate::per_hour(500)
            };
            policy(&format!("hourly-{}", a.as_str().replace('_', "-")), rate, a)
        })
        .collect()
}

/// Hammers 500-per-hour policies of every algorithm (one key each) from every store with
/// `tasks` concurrent tasks for 2 s, and requires exactly 500 admissions per policy.
pub async fn exactly_the_limit_in_aggregate<S: Store + Clone>(
    stores: &[S],
    keys: &[Key],
    tasks: usize,
    server: &super::RedisServer,
) {
    let policies = hourly_policies();
    avoid_window_flip(
        || server.now_millis(),
        Duration::from_secs(3_600),
        Duration::from_secs(10),
    )
    .await;
    let admitted = hammer(stores, &policies, keys, tasks, Duration::from_secs(2)).await;
    for (p, n) in policies.iter().zip(&admitted) {
        assert_eq!(*n, 500, "{}: admitted {n}, expected exactly 500", p.name());
    }
}

/// Waits, if needed, until the server's clock is at least `margin` away from the next
/// multiple of `window`, so a short run sees no window flip.
pub async fn avoid_window_flip(
    server_now_ms: impl Fn() -> u64,
    window: Duration,
    margin: Duration,
) {
    let w = window.as_millis() as u64;
    let m = margin.as_millis() as u64;
    let into = server_now_ms() % w;
    if into + m >= w {
        tokio::time::sleep(Duration::from_millis(w - into + 10)).await;
    }
}
