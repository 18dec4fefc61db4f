//! Soak: 10 million distinct keys through a memory store capped at one million.
//!
//! Resident memory must stay under the cap's budget, every new client must be admitted (decided
//! by its policy, not refused for room), and heavy users must keep their state. Ignored by
//! default (about 15 s in release, minutes in debug); run it with
//!
//! ```text
//! cargo test --release --all-features --test memory_soak -- --ignored --nocapture
//! ```

mod support;

use std::time::Instant;

use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Policy, Rate};

const CAP: usize = 1_000_000;
const FLOOD: usize = 10_000_000;
/// What one held key may cost, everything included (entry, table, growth slack), and what
/// the process holds besides the store.
const BYTES_PER_KEY: u64 = 256;
const BASELINE: u64 = 64 << 20;

/// Resident set size in bytes, from `/proc/self/statm` (Linux).
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
#[ignore = "a soak test: run it by hand (see the module docs)"]
fn ten_million_keys_through_a_capped_store() {
    let store = MemoryStore::builder().max_keys(CAP).build().unwrap();
    let policies = [Policy::new("api", Rate::per_minute(100)).unwrap()];
    let heavy: Vec<Key> = (0..100)
        .map(|i| Key::new("user", format!("heavy{i}")))
        .collect();
    for k in &heavy {
        for _ in 0..80 {
            assert!(store
                .check_now(k, &policies, &[1])
                .expect("the memory store answers at once")
                .unwrap()
                .is_allowed());
        }
    }
    let budget = BASELINE + BYTES_PER_KEY * CAP as u64;
    let start_rss = rss();
    let started = Instant::now();
    let mut peak = 0;
    for i in 0..FLOOD {
        let key = Key::new(
            "ip",
            format!("2001:db8:{:x}:{:x}::/64", i >> 16, i & 0xffff),
        );
        let d = store
            .check_now(&key, &policies, &[1])
            .expect("the memory store answers at once")
            .unwrap();
        assert!(d.is_allowed(), "new client {i} refused");
        if (i + 1) % 1_000_000 == 0 {
            let now = rss().unwrap_or(0);
            peak = peak.max(now);
            eprintln!(
                "{:>2} M keys: {:>6} held, RSS {:>4} MiB (budget {} MiB), {:.1} s",
                (i + 1) / 1_000_000,
                store.len(),
                now >> 20,
                budget >> 20,
                started.elapsed().as_secs_f64()
            );
            assert!(store.len() <= CAP, "{} keys held", store.len());
            assert!(now <= budget, "RSS {} MiB over the budget", now >> 20);
        }
    }
    let mut kept = 0;
    for k in &heavy {
        // An evicted user would read as new (all 100 left); a kept one still carries its 80
        // units, decayed at most by the window's slide during the flood.
        let left = support::peek_now(&store, k, &policies, &[0])
            .unwrap()
            .remaining();
        kept += u32::from(left < 100);
    }
    eprintln!(
        "{FLOOD} keys in {:.1} s; RSS at start {} MiB, peak {} MiB; {kept} of 100 heavy users kept their state",
        started.elapsed().as_secs_f64(),
        start_rss.unwrap_or(0) >> 20,
        peak >> 20
    );
    assert_eq!(kept, 100);
}
