//! The cost of a new key at the memory store's key cap next to an ordinary insert, in the same
//! run.
//!
//! * `insert_below_cap`: a new key into a store half full (the table and entries grow as they
//!   would in service, amortised);
//! * `insert_at_cap`: a new key into a full store, which first evicts one of 8 sampled
//!   entries;
//! * `known_key_at_cap`: a key already held, in a full store (for scale).
//!
//! Caps of 100 000 keys (the working set fits in the caches of a small host) and 1 000 000
//! (the default: every sample is a cache miss). Each timed stretch starts from a freshly
//! filled store and its keys are built beforehand, so only decisions are timed; the clock is
//! a manual one, so no sweep runs inside a stretch. The sides run interleaved, `ROUNDS` times.
//!
//! ```text
//! cargo bench --bench key_cap
//! python3 benches/scripts/summarize.py key_cap
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Policy, Rate};

const ROUNDS: usize = 3;

fn key(i: usize) -> Key {
    Key::new(
        "ip",
        format!(
            "10.{}.{}.{}/{}",
            i >> 16 & 255,
            i >> 8 & 255,
            i & 255,
            i >> 24
        ),
    )
}

/// A store of `cap` keys holding `filled` of them.
fn store(cap: usize, filled: usize, policies: &[Policy]) -> MemoryStore {
    let store = MemoryStore::builder()
        .max_keys(cap)
        .background_sweep(false)
        .clock(ManualClock::new(1_700_000_000_000))
        .build()
        .unwrap();
    for i in 0..filled {
        let _ = store.check_now(&key(i), policies, &[1]);
    }
    store
}

/// Times `iters` decisions in stretches of at most `stretch`, each on a fresh store from
/// `make` and with keys from `keys(stretch index, n)` built before the clock starts.
fn timed(
    iters: u64,
    stretch: u64,
    make: impl Fn() -> MemoryStore,
    keys: impl Fn(usize, usize) -> Vec<Key>,
    policies: &[Policy],
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    let mut round = 0;
    while done < iters {
        let n = (iters - done).min(stretch) as usize;
        let store = make();
        let keys = keys(round, n);
        let start = Instant::now();
        for k in &keys {
            black_box(
                store
                    .check_now(k, policies, &[1])
                    .is_some_and(|d| d.is_ok()),
            );
        }
        total += start.elapsed();
        drop(store);
        done += n as u64;
        round += 1;
    }
    total
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_cap");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(10);
    let policies = [Policy::new("bench", Rate::per_minute(100)).unwrap()];
    for (scenario, cap) in [("100k", 100_000usize), ("1m", 1_000_000)] {
        // New keys never seen by the store: above every key used to fill it.
        let fresh = |round: usize, n: usize| -> Vec<Key> {
            (0..n).map(|i| key(2 * cap + round * cap + i)).collect()
        };
        let stretch = (cap / 4) as u64;
        for round in 0..ROUNDS {
            group.bench_function(format!("insert_below_cap/{scenario}/r{round}"), |b| {
                b.iter_custom(|iters| {
                    timed(
                        iters,
                        stretch,
                        || store(cap, cap / 2, &policies),
                        fresh,
                        &policies,
                    )
                })
            });
            group.bench_function(format!("insert_at_cap/{scenario}/r{round}"), |b| {
                b.iter_custom(|iters| {
                    // A tenth over the cap, so that every shard is full.
                    let full = cap + cap / 10;
                    timed(
                        iters,
                        stretch,
                        || store(cap, full, &policies),
                        fresh,
                        &policies,
                    )
                })
            });
            group.bench_function(format!("known_key_at_cap/{scenario}/r{round}"), |b| {
                b.iter_custom(|iters| {
                    timed(
                        iters,
                        stretch,
                        || store(cap, cap, &policies),
                        |round, n| {
                            (0..n)
                                .map(|i| key((round * 7919 + i * 13) % (cap / 2)))
                                .collect()
                        },
                        &policies,
                    )
                })
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // No plots: rendering them for every benchmark took minutes of `cargo bench` on a busy
    // machine; the numbers are in target/criterion and benches/scripts/summarize.py reads them.
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
