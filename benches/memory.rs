//! `Limiter::check` on the memory store next to governor's keyed GCRA limiter
//! (`check_key`), in the same run.
//!
//! Scenarios: one hot key and 10 000 keys, on 1 and 2 threads; tollgate's public
//! `Limiter::check` with GCRA and with the default sliding window counter (polled once: a
//! memory store answers at once), the same through the synchronous `Limiter::check_now`,
//! and the store's own decision alone (`store_counter`, what
//! the check adds to it is the difference). Both sides use string keys and a quota so large
//! that every check is allowed (the common path). The two sides run interleaved (A B A B …,
//! `ROUNDS` times) so host noise hits both alike; compare medians across rounds.
//!
//! With 2 threads each iteration is one check on each thread, and the time reported is the
//! wall time divided by 2: the aggregate cost per check.
//!
//! ```text
//! cargo bench --bench memory
//! ```

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Limiter, Policy, Rate};

const ROUNDS: usize = 3;

fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect()
}

fn run_threads(threads: usize, iters: u64, f: impl Fn(usize, u64) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || f(t, iters));
        }
    });
    start.elapsed() / threads as u32
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_decision");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);

    for &(scenario, nkeys) in &[("hot_key", 1usize), ("10k_keys", 10_000)] {
        let str_keys = keys(nkeys);
        let tg_keys: Vec<Key> = str_keys.iter().map(|k| Key::new("ip", k)).collect();
        for threads in [1usize, 2] {
            for round in 0..ROUNDS {
                for algorithm in [Algorithm::Gcra, Algorithm::SlidingWindowCounter] {
                    let policy = Policy::builder("bench", Rate::per_second(1_000_000_000))
                        .algorithm(algorithm)
                        .build()
                        .unwrap();
                    let limiter = Limiter::builder()
                        .store(
                            MemoryStore::builder()
                                .background_sweep(false)
                                .build()
                                .unwrap(),
                        )
                        .policy(policy)
                        .build()
                        .unwrap();
                    let name = format!("check_{algorithm}/{scenario}/{threads}t/r{round}");
                    group.bench_function(name, |b| {
                        b.iter_custom(|iters| {
                            run_threads(threads, iters, |t, iters| {
                                let mut cx = Context::from_waker(Waker::noop());
                                let mut i = t * 7919;
                                for _ in 0..iters {
                                    i = (i + 1) % nkeys;
                                    let fut = pin!(limiter.check(&tg_keys[i], 1));
                                    let Poll::Ready(d) = fut.poll(&mut cx) else {
                                        panic!("a memory check answers at once")
                                    };
                                    black_box(d.is_ok());
                                }
                            })
                        })
                    });
                    let name = format!("check_now_{algorithm}/{scenario}/{threads}t/r{round}");
                    group.bench_function(name, |b| {
                        b.iter_custom(|iters| {
                            run_threads(threads, iters, |t, iters| {
                                let mut i = t * 7919;
                                for _ in 0..iters {
                                    i = (i + 1) % nkeys;
                                    let d = limiter.check_now(&tg_keys[i], 1);
                                    black_box(d.is_some_and(|d| d.is_ok()));
                                }
                            })
                        })
                    });
                }
                let store = MemoryStore::builder()
                    .background_sweep(false)
                    .build()
                    .unwrap();
                let policies = [Policy::new("bench", Rate::per_second(1_000_000_000)).unwrap()];
                let name = format!("store_counter/{scenario}/{threads}t/r{round}");
                group.bench_function(name, |b| {
                    b.iter_custom(|iters| {
                        run_threads(threads, iters, |t, iters| {
                            let mut i = t * 7919;
                            for _ in 0..iters {
                                i = (i + 1) % nkeys;
                                let d = store
                                    .check_now(&tg_keys[i], &policies, &[1])
                                    .expect("answers at once");
                                black_box(d.is_ok());
                            }
                        })
                    })
                });
                let governor =
                    RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
                let name = format!("governor_gcra/{scenario}/{threads}t/r{round}");
                group.bench_function(name, |b| {
                    b.iter_custom(|iters| {
                        run_threads(threads, iters, |t, iters| {
                            let mut i = t * 7919;
                            for _ in 0..iters {
                                i = (i + 1) % nkeys;
                                black_box(governor.check_key(&str_keys[i]).is_ok());
                            }
                        })
                    })
                });
            }
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
