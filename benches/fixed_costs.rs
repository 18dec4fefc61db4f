//! The costs every keyed in-memory check pays whatever the limiter: reading the clock and
//! taking a lock (or an atomic read-modify-write), next to one whole check of tollgate's
//! memory store and of governor's keyed limiter on one hot key, in the same run.
//!
//! tollgate's memory store reads the clock once (quanta's TSC read, through
//! [`SystemClock`]) and takes and releases one `parking_lot` mutex: two atomic
//! read-modify-writes. governor's keyed check reads the same clock and makes three (the
//! `DashMap` shard's read lock, its release, and the compare-and-swap of the state). Whatever
//! is left of a check's time after these is the part an implementation can still shrink.
//!
//! Sides run interleaved (A B C … A B C …, `ROUNDS` times); compare medians across rounds
//! with `python3 benches/scripts/summarize.py fixed_costs`.
//!
//! ```text
//! cargo bench --bench fixed_costs
//! ```

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use tollgate::clock::{Clock, SystemClock};
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Policy, Rate};

const ROUNDS: usize = 3;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("fixed_costs");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);

    let clock = SystemClock::new();
    let mutex = parking_lot::Mutex::new(0u64);
    let counter = AtomicU64::new(0);
    let store = MemoryStore::builder()
        .background_sweep(false)
        .build()
        .unwrap();
    let policies = [Policy::builder("bench", Rate::per_second(1_000_000_000))
        .algorithm(Algorithm::Gcra)
        .build()
        .unwrap()];
    let key = Key::new("ip", "10.0.0.1");
    let governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
    let governor_key = String::from("10.0.0.1");

    for round in 0..ROUNDS {
        group.bench_function(format!("clock_read/one_key/r{round}"), |b| {
            b.iter(|| black_box(black_box(&clock).now_millis()))
        });
        group.bench_function(format!("mutex_lock_unlock/one_key/r{round}"), |b| {
            b.iter(|| *black_box(&mutex).lock() += 1)
        });
        group.bench_function(format!("atomic_rmw/one_key/r{round}"), |b| {
            b.iter(|| black_box(&counter).fetch_add(1, Ordering::AcqRel))
        });
        group.bench_function(format!("tollgate_gcra_check/one_key/r{round}"), |b| {
            b.iter(|| {
                black_box(
                    store
                        .check_now(&key, &policies, &[1])
                        .is_some_and(|d| d.is_ok()),
                )
            })
        });
        group.bench_function(format!("governor_check/one_key/r{round}"), |b| {
            b.iter(|| black_box(governor.check_key(&governor_key).is_ok()))
        });
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
