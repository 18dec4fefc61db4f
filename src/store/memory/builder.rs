//! [`MemoryStoreBuilder`]: every setting checked at build time, and the sweeper thread.

use std::hash::BuildHasher;
use std::sync::{Arc, Weak};
use std::time::Duration;

use hashbrown::HashTable;
use parking_lot::Mutex;

use super::overrides::Overrides;
use super::shard::Shard;
use super::{CachePadded, Inner, MemoryStore, StoreClock};
use crate::clock::Clock;
use crate::error::ConfigError;

/// Builds a [`MemoryStore`].
#[derive(Debug)]
#[must_use]
pub struct MemoryStoreBuilder {
    pub(super) shards: Option<usize>,
    pub(super) max_keys: usize,
    pub(super) sweep_interval: Duration,
    pub(super) background_sweep: bool,
    pub(super) clock: StoreClock,
}

impl MemoryStoreBuilder {
    /// The number of shards, rounded up to a power of two (default: four per core, at least
    /// 16). 1 to 65 536; [`build`](Self::build) refuses anything else.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The cap on live keys (default 1 000 000), at least 1; see the
    /// [module docs](crate::store::memory).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How often expired entries are reclaimed (default 1 s, the first time one interval
    /// after the store is built), at least 1 ms.
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Whether a background thread sweeps idle shards (default `true`). Without it, expired
    /// entries are reclaimed only when their shard is used or [`MemoryStore::sweep`] is called.
    pub fn background_sweep(mut self, enabled: bool) -> Self {
        self.background_sweep = enabled;
        self
    }

    /// The clock (default [`SystemClock`](crate::clock::SystemClock)); tests use a
    /// [`ManualClock`](crate::clock::ManualClock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = StoreClock::new(clock);
        self
    }

    /// Builds the store (and starts its sweeper thread, if enabled).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting when `shards` is 0 or above 65 536, `max_keys`
    /// is 0, or `sweep_interval` is under 1 ms.
    pub fn build(self) -> Result<MemoryStore, ConfigError> {
        if let Some(n) = self.shards {
            if !(1..=MAX_SHARDS).contains(&n) {
                return Err(ConfigError::new(
                    "shards",
                    n,
                    format!("between 1 and {MAX_SHARDS}"),
                ));
            }
        }
        if self.max_keys == 0 {
            return Err(ConfigError::new("max_keys", 0, "at least 1"));
        }
        if self.sweep_interval < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "sweep_interval",
                format_args!("{:?}", self.sweep_interval),
                "at least 1 ms",
            ));
        }
        let shards = self
            .shards
            .unwrap_or_else(|| {
                let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
                (cores * 4).max(16)
            })
            .next_power_of_two();
        let sweep_interval_ms = u64::try_from(self.sweep_interval.as_millis()).unwrap_or(u64::MAX);
        // Nothing can have expired before one interval has passed.
        let first_sweep = self.clock.now_millis().saturating_add(sweep_interval_ms);
        let hasher = foldhash::fast::RandomState::default();
        let inner = Arc::new(Inner {
            shards: (0..shards)
                .map(|i| {
                    CachePadded(Mutex::new(Shard {
                        index: HashTable::new(),
                        entries: Vec::new(),
                        next_sweep: first_sweep,
                        known: Vec::new(),
                        rng: hasher.hash_one(i) | 1,
                    }))
                })
                .collect(),
            shard_mask: shards as u64 - 1,
            hasher,
            clock: self.clock,
            max_keys_per_shard: self.max_keys.div_ceil(shards).max(1),
            sweep_interval_ms,
            overrides: Overrides::default(),
        });
        if self.background_sweep {
            spawn_sweeper(Arc::downgrade(&inner), self.sweep_interval);
        }
        Ok(MemoryStore { inner })
    }
}

/// The most shards a store may have.
const MAX_SHARDS: usize = 1 << 16;

fn spawn_sweeper(weak: Weak<Inner>, interval: Duration) {
    let spawned = std::thread::Builder::new()
        .name("tollgate-sweeper".into())
        .spawn(move || loop {
            std::thread::sleep(interval);
            let Some(inner) = weak.upgrade() else { break };
            inner.sweep_all();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "tollgate: could not start the memory store sweeper; expired keys are reclaimed on access only");
    }
}
