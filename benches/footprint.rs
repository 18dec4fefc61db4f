//! Resident memory of the memory store holding 1 000 000 active keys (or `FOOTPRINT_KEYS`),
//! and after they expire and are swept; governor's keyed limiter with the same keys for
//! comparison.
//!
//! Each side runs in a child process of its own (so one side's freed memory cannot flatter the
//! other) and reads its resident set size (`VmRSS` in `/proc/self/status`, Linux only) before
//! inserting, with every key live, and after expiry. Keys are `ip:10.x.y.z` strings; one policy
//! (the default sliding window counter, 10 per second). The store uses a manual clock, so
//! "expire" is a clock jump, not a wait.
//!
//! ```text
//! cargo bench --bench footprint
//! FOOTPRINT_KEYS=2000000 cargo bench --bench footprint
//! ```
//!
//! The figure moves with the key count: the store's tables double, so at some counts they are
//! half empty and at others nearly full.

use std::num::NonZeroU32;
use std::process::Command;
use std::time::{Duration, Instant};

use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Policy, Rate};

/// How many keys each side fills: `FOOTPRINT_KEYS`, default 1 000 000.
fn keys() -> usize {
    std::env::var("FOOTPRINT_KEYS").ok().map_or(1_000_000, |n| {
        n.parse().expect("FOOTPRINT_KEYS is a number")
    })
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

fn delta(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!(
            "{:+.1} MiB ({:.0} B/key)",
            (b as f64 - a as f64) / 1024.0,
            (b as f64 - a as f64) * 1024.0 / keys() as f64
        ),
        _ => "n/a".into(),
    }
}

fn material(i: usize) -> String {
    format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)
}

fn tollgate_side(algorithm: Algorithm) {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = MemoryStore::builder()
        .max_keys(2 * keys())
        .background_sweep(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    let policies = [Policy::builder("footprint", Rate::per_second(10))
        .algorithm(algorithm)
        .build()
        .unwrap()];
    let before = rss_kib();
    let start = Instant::now();
    for i in 0..keys() {
        let key = Key::new("ip", material(i));
        assert!(store
            .check_now(&key, &policies, &[1])
            .expect("answers at once")
            .unwrap()
            .is_allowed());
    }
    let filled = start.elapsed();
    let live = rss_kib();
    let len = store.len();
    clock.advance(Duration::from_secs(3_600));
    store.sweep();
    let after = rss_kib();
    println!(
        "tollgate {:<22} | {len:>8} keys | before {:>10} | live {:>10} ({}) | swept ({} keys) {:>10} | fill {:.2} s",
        algorithm.to_string(),
        mib(before),
        mib(live),
        delta(before, live),
        store.len(),
        mib(after),
        filled.as_secs_f64()
    );
}

fn governor_side() {
    let limiter =
        governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::new(10).unwrap()));
    let before = rss_kib();
    let start = Instant::now();
    for i in 0..keys() {
        assert!(limiter.check_key(&material(i)).is_ok());
    }
    let filled = start.elapsed();
    let live = rss_kib();
    let len = limiter.len();
    // governor has no expiry of its own: `retain_recent` drops keys whose state is
    // indistinguishable from fresh, which takes real time to come.
    println!(
        "governor {:<22} | {len:>8} keys | before {:>10} | live {:>10} ({}) | swept: n/a (needs real time) | fill {:.2} s",
        "gcra",
        mib(before),
        mib(live),
        delta(before, live),
        filled.as_secs_f64()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("tollgate_counter") => tollgate_side(Algorithm::SlidingWindowCounter),
        Some("tollgate_gcra") => tollgate_side(Algorithm::Gcra),
        Some("governor") => governor_side(),
        _ => {
            // `cargo bench` passes `--bench`: run every side, each in a fresh process.
            println!("resident memory, {} keys, one policy", keys());
            let exe = std::env::current_exe().expect("own path");
            for side in ["tollgate_counter", "tollgate_gcra", "governor"] {
                let status = Command::new(&exe).arg(side).status().expect("child");
                assert!(status.success(), "{side} failed");
            }
        }
    }
}
