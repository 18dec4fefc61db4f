//! Instruction-count companion to `benches/memory.rs`: runs one side's checks in a loop so
//! `valgrind --tool=callgrind` can count instructions per check, which — unlike times — do not
//! change with host noise.
//!
//! ```text
//! cargo bench --bench decision_cost --no-run
//! BIN=$(ls -t target/release/deps/decision_cost-* | grep -v '\.d$' | head -1)
//! for side in tollgate_gcra tollgate_counter governor; do
//!   for n in 100000 200000; do
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null $BIN $side 10000 $n 2>&1 | grep refs
//!   done
//! done
//! ```
//!
//! Instructions per check = (refs at 200 000 − refs at 100 000) / 100 000, which cancels the
//! set-up cost.

use std::hint::black_box;
use std::num::NonZeroU32;

use governor::{Quota, RateLimiter};
use tollgate::key::Key;
use tollgate::store::MemoryStore;
use tollgate::{Algorithm, Policy, Rate};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 || args.iter().any(|a| a == "--bench") {
        // `cargo bench` runs every bench binary with `--bench`: nothing to do here.
        eprintln!("usage: decision_cost <tollgate_gcra|tollgate_counter|governor> <keys> <checks>");
        return;
    }
    let side = args[1].as_str();
    let nkeys: usize = args[2].parse().expect("keys");
    let checks: usize = args[3].parse().expect("checks");
    let strs: Vec<String> = (0..nkeys)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    match side {
        "governor" => {
            let limiter =
                RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
            for i in 0..checks {
                black_box(limiter.check_key(&strs[i % nkeys]).is_ok());
            }
        }
        "tollgate_gcra" | "tollgate_counter" => {
            let algorithm = if side == "tollgate_gcra" {
                Algorithm::Gcra
            } else {
                Algorithm::SlidingWindowCounter
            };
            let keys: Vec<Key> = strs.iter().map(|k| Key::new("ip", k)).collect();
            let store = MemoryStore::builder().background_sweep(false).build();
            let policies = [Policy::builder("bench", Rate::per_second(1_000_000_000))
                .algorithm(algorithm)
                .build()
                .unwrap()];
            for i in 0..checks {
                black_box(
                    store
                        .decide(&keys[i % nkeys], &policies, &[1], true)
                        .is_ok(),
                );
            }
        }
        other => panic!("unknown side {other}"),
    }
}
