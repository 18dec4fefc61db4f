//! Settlements on leased policies. Below the reservation, the difference comes back as on
//! the exact stores, whether or not the instance holds a block. Above it, the extra charge is
//! a debt, never forgiven, as on the exact stores. Two `LeasedStore` instances share one ledger (the
//! in-process `MemoryLedger`, and a real `redis-server`); a key whose requests are settled far
//! above their estimate, every one of them or now and then, is served over every span no more
//! than the exact bound table of `Store::settle` allows. Manual clocks throughout (the Redis
//! stores pass the clock's time to the ledger script), so every bound is checked at exact
//! instants.

mod support;

use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::key::Key;
use tollgate::store::leased::{LeaseBackend, LeasedStore, MemoryLedger};
use tollgate::store::{RedisStore, Store, StoreExt};
use tollgate::{Algorithm, Limiter, Policy, Rate};

use support::RedisServer;

/// The limit per window (and the capacity), the window, the lease time, how long each
/// scenario runs.
const N: u64 = 100;
const W: u64 = 1_000;
const LEASE: u64 = 100;
const RUN: u64 = 8 * W;

const LEASED: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

/// How the admitted requests are settled.
#[derive(Debug, Clone, Copy)]
enum Pattern {
    /// Every admitted request (estimate 1) is settled at three windows' worth.
    AlwaysHigh,
    /// Most admitted requests cost what they reserved (so blocks are leased and in hand);
    /// every 20th is settled at two windows' worth and more, while both instances hold
    /// blocks.
    NowAndThen,
}

impl Pattern {
    /// The actual cost of the `i`-th admitted request.
    fn actual(self, i: u64) -> u64 {
        match self {
            Pattern::AlwaysHigh => 3 * N,
            Pattern::NowAndThen if i % 20 == 19 => 2 * N + 17,
            Pattern::NowAndThen => 1,
        }
    }
}

/// One admitted request: when, by which instance, the units served (its actual cost), its
/// overshoot.
#[derive(Debug, Clone, Copy)]
struct Served {
    at: u64,
    instance: usize,
    units: u64,
    over: u64,
}

fn policy(a: Algorithm) -> Policy {
    Policy::builder("tokens", Rate::new(N, Duration::from_millis(W)))
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

/// One reservation (estimate 1) a millisecond for `RUN` ms, the instances taking turns,
/// each settled before the next is made.
async fn drive<S: Store>(
    limiters: &[Limiter<S>; 2],
    clock: &ManualClock,
    key: &Key,
    pattern: Pattern,
) -> Vec<Served> {
    let mut served = Vec::new();
    for i in 0..RUN {
        clock.advance(Duration::from_millis(1));
        let r = limiters[i as usize % 2].reserve(key, 1).await.unwrap();
        if r.decision().is_allowed() {
            let units = pattern.actual(served.len() as u64);
            r.settle(units).await.unwrap();
            served.push(Served {
                at: clock.now_millis(),
                instance: i as usize % 2,
                units,
                over: units.saturating_sub(1),
            });
        }
        // Lets the blocks' returns, spawned on this runtime, run.
        tokio::task::yield_now().await;
    }
    served
}

/// Whether `served` satisfies `a`'s row of the bound table in `Store::settle` (capacity
/// `N`): over `j` whole windows, `j·N + o` (fixed window, counter); over any `j·W` ms,
/// `j·N + o` (log); over any `L` ms, `N + N·L/W + o` (token bucket, GCRA). With `strict`, `o`
/// is the overshoot of the last request served in the span, as in the exact mode; otherwise
/// the leased bound: a block is units reserved together when it is granted, so `o` is, for
/// each instance, the largest overshoot it served in the span (see the leased module's
/// docs, "Debts").
fn check_bound(a: Algorithm, served: &[Served], strict: bool) -> Result<(), String> {
    for (i, first) in served.iter().enumerate() {
        let mut units = 0u64;
        let mut largest = [0u64; 2];
        for last in &served[i..] {
            units += last.units;
            largest[last.instance] = largest[last.instance].max(last.over);
            let o = if strict {
                last.over
            } else {
                largest.iter().sum()
            };
            let ok = match a {
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter => {
                    // Served within the whole windows from `first`'s to `last`'s.
                    let j = last.at / W - first.at / W + 1;
                    units <= j * N + o
                }
                Algorithm::SlidingWindowLog => {
                    let j = (last.at - first.at) / W + 1;
                    units <= j * N + o
                }
                _ => units.saturating_sub(N + o) * W <= N * (last.at - first.at),
            };
            if !ok {
                return Err(format!(
                    "{a:?}: {units} units served from {} to {} ms (overshoot {o}), over the bound",
                    first.at, last.at
                ));
            }
        }
    }
    Ok(())
}

/// Every pattern on two instances sharing one ledger; `stores` builds a fresh pair (sharing
/// its ledger) on `clock` for a scenario named `tag`.
async fn high_settlements_are_debts<S, F>(stores: F, label: &str)
where
    S: LeaseBackend,
    F: Fn(&ManualClock, &str) -> [LeasedStore<S>; 2],
{
    for a in LEASED {
        for pattern in [Pattern::AlwaysHigh, Pattern::NowAndThen] {
            let clock = ManualClock::new(1_700_000_000_000);
            let tag = format!("{label}-{}-{pattern:?}", a.as_str());
            let [s0, s1] = stores(&clock, &tag);
            let p = policy(a);
            let limiters = [s0.clone(), s1.clone()].map(|s| {
                Limiter::builder()
                    .store(s)
                    .policy(p.clone())
                    .build()
                    .unwrap()
            });
            let key = Key::new("tenant", tag.clone());
            let served = drive(&limiters, &clock, &key, pattern).await;
            // A key settled high on every request holds no block when its debt is charged:
            // the exact mode's bound, to the unit.
            let strict = matches!(pattern, Pattern::AlwaysHigh);
            if let Err(e) = check_bound(a, &served, strict) {
                panic!("{label} {pattern:?}: {e}");
            }
            // Over the whole run the key is served about `N` per window, whatever it sends: a
            // debt is paid, not forgiven (the largest overshoot of each instance at most).
            let total: u64 = served.iter().map(|s| s.units).sum();
            let largest = served.iter().map(|s| s.over).max().unwrap_or(0);
            let windows = RUN / W + 1;
            assert!(
                total <= windows * N + 2 * largest,
                "{label} {a:?} {pattern:?}: {total} units served in {windows} windows of {N}"
            );
            // And it is served: the debts are paid back, not kept forever.
            assert!(
                total >= (RUN / W - 4) * N,
                "{label} {a:?} {pattern:?}: only {total} units served"
            );
            if let Pattern::NowAndThen = pattern {
                for s in [&s0, &s1] {
                    assert!(s.stats().grants > 0, "{a:?}: not leased: {:?}", s.stats());
                }
            }
        }
    }
}

#[tokio::test]
async fn a_memory_ledger_never_forgives_a_settlements_debt() {
    high_settlements_are_debts(
        |clock, _| {
            let ledger = MemoryLedger::with_clock(clock.clone());
            [leased(ledger.clone(), clock), leased(ledger, clock)]
        },
        "memory",
    )
    .await;
}

fn redis_store(server: &RedisServer, prefix: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .clock(clock.clone())
        .build_with_url(&server.url())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_ledger_never_forgives_a_settlements_debt() {
    let server = RedisServer::start();
    high_settlements_are_debts(
        |clock, tag| {
            [
                leased(redis_store(&server, tag, clock), clock),
                leased(redis_store(&server, tag, clock), clock),
            ]
        },
        "redis",
    )
    .await;
}

/// Units a store admits `key` under `p` from now until it refuses (the clock stands still):
/// as many requests of 100 as fit, then of 1.
async fn units_left<S: Store>(store: &S, key: &Key, p: &[Policy]) -> u64 {
    let mut units = 0;
    for cost in [100, 1] {
        while store.check(key, p, &[cost]).await.unwrap().is_allowed() {
            units += cost;
        }
    }
    units
}

/// A settlement below its reservation gives the difference back, as the exact store does,
/// when the instance holds no block for the key (a cold key, or estimates too large for a
/// block, charged at the ledger): the units admitted after them are the exact store's to the
/// unit. With a block in hand, the difference goes into the block up to what was spent of
/// it and the rest is dropped: never more than the exact store admits.
async fn settlements_below_their_reservation_give_back<S: Store>(
    exact: impl Store,
    store: S,
    label: &str,
) {
    for a in LEASED {
        let p = [Policy::builder("tokens", Rate::per_minute(10_000))
            .algorithm(a)
            .build()
            .unwrap()];
        let key = Key::new("u", format!("below-{label}-{a}"));
        for (reserved, actual) in [(4_000, 1_500), (4_000, 0), (2_000, 1_999)] {
            assert!(exact
                .check(&key, &p, &[reserved])
                .await
                .unwrap()
                .is_allowed());
            exact
                .settle(&key, &p, &[reserved], &[actual])
                .await
                .unwrap();
            assert!(store
                .check(&key, &p, &[reserved])
                .await
                .unwrap()
                .is_allowed());
            store
                .settle(&key, &p, &[reserved], &[actual])
                .await
                .unwrap();
        }
        exact.check(&key, &p, &[3_000]).await.unwrap();
        exact.refund(&key, &p, &[3_000]).await.unwrap();
        store.check(&key, &p, &[3_000]).await.unwrap();
        store.refund(&key, &p, &[3_000]).await.unwrap();
        let want = units_left(&exact, &key, &p).await;
        let got = units_left(&store, &key, &p).await;
        assert_eq!(want, 10_000 - 1_500 - 1_999, "{label} {a}");
        if a == Algorithm::SlidingWindowLog {
            // The ledger's log names each charge by its call: a give-back of units charged at
            // the ledger cannot name it, and is lost (see `LeasedStore`'s "Settlements").
            assert!(got <= want, "{label} {a}: {got} admitted, {want} exact");
        } else {
            assert_eq!(
                got, want,
                "{label} {a}: units admitted after the settlements"
            );
        }
        // With a block in hand (the key's small requests): never more than the exact store.
        let key = Key::new("u", format!("block-{label}-{a}"));
        for (reserved, actual) in [(10, 3), (500, 499), (700, 0), (3, 0)] {
            exact.check(&key, &p, &[reserved]).await.unwrap();
            exact
                .settle(&key, &p, &[reserved], &[actual])
                .await
                .unwrap();
            store.check(&key, &p, &[reserved]).await.unwrap();
            store
                .settle(&key, &p, &[reserved], &[actual])
                .await
                .unwrap();
        }
        let want = units_left(&exact, &key, &p).await;
        let got = units_left(&store, &key, &p).await;
        assert!(got <= want, "{label} {a}: {got} admitted, {want} exact");
    }
}

#[tokio::test]
async fn settlements_below_their_reservation_give_back_on_a_memory_ledger() {
    let clock = ManualClock::new(1_000_000);
    let exact = tollgate::store::MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .unwrap();
    let store = leased(MemoryLedger::with_clock(clock.clone()), &clock);
    settlements_below_their_reservation_give_back(exact, store, "memory").await;
}

#[tokio::test]
async fn settlements_below_their_reservation_give_back_on_a_redis_ledger() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let exact = redis_store(&server, "exact", &clock);
    let store = leased(redis_store(&server, "leased", &clock), &clock);
    settlements_below_their_reservation_give_back(exact, store, "redis").await;
}
