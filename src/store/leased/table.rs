//! The keys an instance tracks, and the filter that keeps one-off keys out of them.
//!
//! A key is tracked (an [`Entry`]: its observed rate, block and last refusal) from its second
//! decision within a short memory, not its first: under a flood of distinct keys, or simply
//! many cold ones, nothing is allocated for a key seen once, and the sweep has only keys that
//! came back to visit. The memory is a direct-mapped table of key hashes: a key's cell is
//! overwritten when another key lands on it, so "seen before" means "seen since the last
//! key that shared its cell". A key asking `r` times a second while `f` distinct others
//! arrive is tracked after about `1 + f / (r × cells)` decisions: with 65 536 cells, a key
//! at 100 requests a second is tracked on its second or third under a flood of a hundred
//! thousand new keys a second. Until then it is decided exactly, which is what a cold key
//! gets anyway.
//!
//! Lookups hash the key and the policies' names and algorithms in place, with a randomly
//! seeded hasher (key material is attacker-chosen), and allocate nothing.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;

use super::entries::Entry;
use crate::key::Key;
use crate::policy::Policy;

/// The fewest and the most cells the first-sighting filter has (8 bytes each).
const MIN_SEEN_CELLS: usize = 1 << 10;
const MAX_SEEN_CELLS: usize = 1 << 16;

/// The tracked keys of one store.
pub(super) struct EntryTable {
    hasher: foldhash::quality::RandomState,
    entries: parking_lot::Mutex<HashTable<Arc<Entry>>>,
    seen: Box<[AtomicU64]>,
}

/// Whether `entry` is the one of `key` and `policies`.
fn same(entry: &Entry, key: &Key, policies: &[Policy]) -> bool {
    entry.key == *key
        && entry.policies.len() == policies.len()
        && entry
            .policies
            .iter()
            .zip(policies)
            .all(|(a, b)| a.name() == b.name() && a.algorithm() == b.algorithm())
}

impl EntryTable {
    /// A table whose first-sighting filter has a cell per key of `max_keys` (1 024 to 65 536
    /// cells).
    pub(super) fn new(max_keys: usize) -> Self {
        let cells = max_keys
            .clamp(MIN_SEEN_CELLS, MAX_SEEN_CELLS)
            .next_power_of_two();
        Self {
            hasher: foldhash::quality::RandomState::default(),
            entries: parking_lot::Mutex::new(HashTable::new()),
            seen: (0..cells).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The hash of `key` with `policies` (never 0: 0 marks an empty filter cell).
    pub(super) fn hash(&self, key: &Key, policies: &[Policy]) -> u64 {
        let mut h = self.hasher.build_hasher();
        key.as_str().hash(&mut h);
        for p in policies {
            p.name().hash(&mut h);
            p.algorithm().as_str().hash(&mut h);
        }
        h.finish() | 1
    }

    /// The tracked entry of `key` and `policies`, if there is one.
    pub(super) fn get(&self, hash: u64, key: &Key, policies: &[Policy]) -> Option<Arc<Entry>> {
        self.entries
            .lock()
            .find(hash, |e| same(e, key, policies))
            .cloned()
    }

    /// Notes a sighting of the key whose hash is `hash`: whether it was seen before (since
    /// the last key that shared its cell).
    pub(super) fn seen_before(&self, hash: u64) -> bool {
        let cell = &self.seen[(hash >> 17) as usize & (self.seen.len() - 1)];
        cell.swap(hash, Ordering::Relaxed) == hash
    }

    /// The entry of `key` and `policies`, made and tracked if it is not there while fewer than
    /// `max_keys` are; `None` when the table is full.
    pub(super) fn get_or_insert(
        &self,
        hash: u64,
        key: &Key,
        policies: &[Policy],
        max_keys: usize,
    ) -> Option<Arc<Entry>> {
        let mut map = self.entries.lock();
        if let Some(e) = map.find(hash, |e| same(e, key, policies)) {
            return Some(e.clone());
        }
        if map.len() >= max_keys {
            return None;
        }
        let e = Arc::new(Entry::new(hash, key, policies));
        map.insert_unique(hash, e.clone(), |e| e.hash);
        Some(e)
    }

    /// Every tracked entry.
    pub(super) fn all(&self) -> Vec<Arc<Entry>> {
        self.entries.lock().iter().cloned().collect()
    }

    /// How many entries are tracked, and what `f` sums over them.
    pub(super) fn sum(&self, f: impl Fn(&Entry) -> u64) -> (usize, u64) {
        let map = self.entries.lock();
        (map.len(), map.iter().map(|e| f(e)).sum())
    }

    /// Keeps the entries `keep` says to keep.
    pub(super) fn retain(&self, mut keep: impl FnMut(&Arc<Entry>) -> bool) {
        self.entries.lock().retain(|e| keep(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rate;

    #[test]
    fn a_key_is_tracked_on_its_second_sighting_and_found_by_key_and_policies() {
        let table = EntryTable::new(4);
        let a = [Policy::new("a", Rate::per_minute(10)).unwrap()];
        let b = [Policy::new("b", Rate::per_minute(10)).unwrap()];
        let key = Key::new("ip", "10.0.0.1");
        let h = table.hash(&key, &a);
        assert_ne!(h, 0);
        assert_ne!(
            h,
            table.hash(&key, &b),
            "another policy set is another entry"
        );
        assert!(!table.seen_before(h));
        assert!(table.seen_before(h));
        let e = table.get_or_insert(h, &key, &a, 4).unwrap();
        assert!(Arc::ptr_eq(&e, &table.get(h, &key, &a).unwrap()));
        assert!(
            table.get(h, &key, &b).is_none(),
            "same hash, other policies: not this entry"
        );
        assert!(table.get(h, &Key::new("ip", "10.0.0.2"), &a).is_none());
        // Full: nothing new is tracked, what is tracked stays.
        for i in 0..3 {
            let k = Key::new("ip", format!("10.0.1.{i}"));
            assert!(table.get_or_insert(table.hash(&k, &a), &k, &a, 4).is_some());
        }
        let k = Key::new("ip", "10.0.2.1");
        assert!(table.get_or_insert(table.hash(&k, &a), &k, &a, 4).is_none());
        assert_eq!(table.sum(|_| 1), (4, 4));
        table.retain(|e| e.key != key);
        assert!(table.get(h, &key, &a).is_none());
    }
}
