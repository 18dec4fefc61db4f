//! The shards of the memory store: entries indexed by key, eviction at the key cap, and
//! sweeping of expired entries.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::states::{EntryState, EntryStates};
use super::{EVICTION_SAMPLE, MAX_KNOWN_POLICIES};
use crate::algorithm::AnyState;
use crate::error::StoreError;
use crate::key::Key;
use crate::policy::Policy;
use crate::telemetry;

pub(super) struct Shard {
    /// Positions in `entries`, hashed by key.
    pub(super) index: HashTable<u32>,
    pub(super) entries: Vec<Entry>,
    pub(super) next_sweep: u64,
    /// The policies this shard's entries were charged for (by id and algorithm), to measure
    /// how much of its limit an entry has used when choosing one to evict.
    pub(super) known: Vec<Policy>,
    /// The state of the generator that draws eviction samples (xorshift64*), seeded from the
    /// store's random hasher so that an attacker cannot predict which entries are sampled.
    pub(super) rng: u64,
}

pub(super) struct Entry {
    pub(super) key: Key,
    pub(super) expires_at: u64,
    pub(super) states: EntryStates,
}

#[inline]
pub(super) fn hash_key(hasher: &foldhash::fast::RandomState, key: &Key) -> u64 {
    hasher.hash_one(key.as_str())
}

/// `a == b`, without the call to `memcmp` that comparing slices makes: keys are mostly short
/// (a source and an address), and two or three overlapping word loads decide those.
#[inline]
pub(super) fn same_key(a: &Key, b: &Key) -> bool {
    let (a, b) = (a.as_str().as_bytes(), b.as_str().as_bytes());
    let len = a.len();
    if len != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    match len {
        8..=16 => word(a, 0) == word(b, 0) && word(a, len - 8) == word(b, len - 8),
        17..=24 => {
            word(a, 0) == word(b, 0)
                && word(a, 8) == word(b, 8)
                && word(a, len - 8) == word(b, len - 8)
        }
        _ => a == b,
    }
}

/// The hash of the entry a position points to, for the table to rehash with.
pub(super) fn rehash<'a>(
    entries: &'a [Entry],
    hasher: &'a foldhash::fast::RandomState,
) -> impl Fn(&u32) -> u64 + 'a {
    move |&j| hash_key(hasher, &entries[j as usize].key)
}

impl Shard {
    #[inline]
    pub(super) fn find(&self, hash: u64, key: &Key) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(hash, |&i| same_key(&entries[i as usize].key, key))
            .map(|&i| i as usize)
    }

    pub(super) fn insert(
        &mut self,
        hash: u64,
        entry: Entry,
        hasher: &foldhash::fast::RandomState,
    ) -> Result<(), StoreError> {
        let i = u32::try_from(self.entries.len()).map_err(|_| StoreError::Capacity)?;
        self.entries.push(entry);
        let entries = &self.entries;
        self.index.insert_unique(hash, i, rehash(entries, hasher));
        Ok(())
    }

    /// Notes the policies an entry was charged for (the plan's, never an override's), so that
    /// its usage can be measured when the shard must evict. A policy whose limits changed (a
    /// reload) is measured by its new limits from then on. A few comparisons: a shard sees
    /// few distinct policies.
    #[inline]
    pub(super) fn remember(&mut self, policies: &[Policy]) {
        for p in policies {
            let at = self
                .known
                .iter()
                .position(|k| k.id() == p.id() && k.algorithm() == p.algorithm());
            match at {
                Some(at) if self.known[at].limits() != p.limits() => self.known[at] = p.clone(),
                Some(_) => {}
                None if self.known.len() < MAX_KNOWN_POLICIES => self.known.push(p.clone()),
                None => {}
            }
        }
    }

    /// The next number of the shard's sampling sequence (xorshift64*).
    #[inline]
    pub(super) fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// How much of its limit the entry's client has used now, as a fraction `(used, limit)`:
    /// the largest over its policies. Policies this shard does not know count as unused.
    pub(super) fn usage(&self, entry: &Entry, now: u64) -> (u64, u64) {
        let mut share = (0u64, 1u64);
        for state in entry.states.iter() {
            let Some(policy) = self
                .known
                .iter()
                .find(|k| k.id() == state.policy && k.algorithm() == state.state.algorithm())
            else {
                continue;
            };
            if let AnyState::InFlight(held) = &state.state {
                // Forgetting slots in use would admit that many more: such an entry is kept
                // like a full one.
                if held.held() > 0 {
                    return (1, 1);
                }
            }
            let d = state.state.evaluate(now, policy.limits(), 0);
            let limit = d.limit().max(1);
            let used = limit.saturating_sub(d.remaining());
            if u128::from(used) * u128::from(share.1) > u128::from(share.0) * u128::from(limit) {
                share = (used, limit);
            }
        }
        share
    }

    /// Evicts the entry that carries the least information among [`EVICTION_SAMPLE`] drawn
    /// at random: an expired one, else the least used share of its limit, else the one that
    /// expires first. See [The key cap](self#the-key-cap).
    ///
    /// Returns the evicted entry's position, already out of the index, for the new entry to
    /// take ([`put_at`](Self::put_at)): writing there touches a line the sample just read,
    /// where removing would move the last entry and fix its position too.
    pub(super) fn evict_one(
        &mut self,
        now: u64,
        hasher: &foldhash::fast::RandomState,
    ) -> Option<usize> {
        let n = self.entries.len();
        if n == 0 {
            return None;
        }
        // Draw every index first and read every sampled entry's expiry in one pass: the
        // reads are independent, so their cache misses overlap instead of queueing.
        let mut sample = [0usize; EVICTION_SAMPLE];
        for pick in &mut sample {
            // A uniform index without a division (Lemire's multiply-shift).
            *pick = ((u128::from(self.next_random()) * n as u128) >> 64) as usize;
        }
        // An entry spans two cache lines: read from both (the expiry, the key's length, the
        // first state's policy) so that the usage pass below finds them cached.
        let mut expiries = [0u64; EVICTION_SAMPLE];
        let mut touched = 0usize;
        for (e, &i) in expiries.iter_mut().zip(&sample) {
            let entry = &self.entries[i];
            *e = entry.expires_at;
            touched = touched
                .wrapping_add(entry.key.as_str().len())
                .wrapping_add(entry.states.first().map_or(0, |s| s.policy as usize));
        }
        std::hint::black_box(touched);
        if let Some(k) = expiries.iter().position(|&e| e <= now) {
            self.unindex(sample[k], hasher);
            return Some(sample[k]);
        }
        let mut best: Option<(usize, (u64, u64), u64)> = None;
        for (&i, &expires_at) in sample.iter().zip(&expiries) {
            let share = self.usage(&self.entries[i], now);
            let lighter = best.is_none_or(|(_, b, expires)| {
                let (a, b) = (
                    u128::from(share.0) * u128::from(b.1),
                    u128::from(b.0) * u128::from(share.1),
                );
                a < b || (a == b && expires_at < expires)
            });
            if lighter {
                best = Some((i, share, expires_at));
            }
        }
        let (i, (used, limit), _) = best?;
        self.unindex(i, hasher);
        telemetry::memory_eviction(used as f64 / limit as f64);
        Some(i)
    }

    /// Removes the entry at `i` from the index only.
    pub(super) fn unindex(&mut self, i: usize, hasher: &foldhash::fast::RandomState) {
        let hash = hash_key(hasher, &self.entries[i].key);
        if let Ok(found) = self.index.find_entry(hash, |&j| j as usize == i) {
            found.remove();
        }
    }

    /// Puts `entry` at position `i`, whose previous entry [`evict_one`](Self::evict_one)
    /// took out of the index.
    pub(super) fn put_at(
        &mut self,
        i: usize,
        hash: u64,
        entry: Entry,
        hasher: &foldhash::fast::RandomState,
    ) {
        self.entries[i] = entry;
        let entries = &self.entries;
        self.index
            .insert_unique(hash, i as u32, rehash(entries, hasher));
    }

    /// Removes the entry at `i`, moving the last entry into its place.
    pub(super) fn remove_at(&mut self, i: usize, hasher: &foldhash::fast::RandomState) {
        let hash = hash_key(hasher, &self.entries[i].key);
        if let Ok(found) = self.index.find_entry(hash, |&j| j as usize == i) {
            found.remove();
        }
        let last = self.entries.len() - 1;
        if i != last {
            let moved = hash_key(hasher, &self.entries[last].key);
            if let Some(found) = self.index.find_mut(moved, |&j| j as usize == last) {
                *found = i as u32;
            }
        }
        self.entries.swap_remove(i);
    }

    pub(super) fn sweep(
        &mut self,
        now: u64,
        interval_ms: u64,
        hasher: &foldhash::fast::RandomState,
    ) {
        self.next_sweep = now.saturating_add(interval_ms);
        let expired = self.entries.iter().filter(|e| e.expires_at <= now).count();
        if expired == 0 {
            return;
        }
        if expired < self.entries.len() / 4 {
            // A few: move the last entries into their places, two table probes each.
            let mut i = 0;
            while i < self.entries.len() {
                if self.entries[i].expires_at <= now {
                    self.remove_at(i, hasher);
                } else {
                    i += 1;
                }
            }
        } else {
            // Many (a flood of keys that has passed): rehashing the survivors into a table
            // sized for them is cheaper than fixing positions one by one, and gives the
            // memory back.
            self.entries.retain(|e| e.expires_at > now);
            let entries = &self.entries;
            let mut index = HashTable::with_capacity(entries.len());
            for (i, e) in entries.iter().enumerate() {
                index.insert_unique(hash_key(hasher, &e.key), i as u32, rehash(entries, hasher));
            }
            self.index = index;
        }
        if self.entries.capacity() > 64 && self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2);
        }
        if self.index.capacity() > 64 && self.index.len() < self.index.capacity() / 4 {
            let entries = &self.entries;
            self.index
                .shrink_to(self.index.len() * 2, rehash(entries, hasher));
        }
    }
}

impl Entry {
    #[inline]
    pub(super) fn state_of(&self, policy: &Policy) -> Option<&EntryState> {
        self.states
            .iter()
            .find(|s| s.policy == policy.id() && s.state.algorithm() == policy.algorithm())
    }

    pub(super) fn charge(&mut self, now: u64, policies: &[Policy], costs: &[u64]) {
        for (p, &c) in policies.iter().zip(costs) {
            // A state is found by policy and algorithm, as every other path finds it (and as
            // Redis names its keys): after a reload changes a policy's algorithm, the old
            // state is left to expire rather than replaced under another path's feet.
            let idx = match self
                .states
                .iter()
                .position(|s| s.policy == p.id() && s.state.algorithm() == p.algorithm())
            {
                Some(i) => i,
                None => {
                    self.states.push(EntryState {
                        policy: p.id(),
                        state: AnyState::fresh(p.algorithm()),
                    });
                    self.states.len() - 1
                }
            };
            let state = &mut self.states[idx];
            state.state.commit(now, p.limits(), c);
            let expires = state.state.expires_at(p.limits());
            self.expires_at = self.expires_at.max(expires);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_fits_in_72_bytes() {
        // Entries are most of what a live key costs: a field added here is paid a million times.
        assert!(std::mem::size_of::<Entry>() <= 72);
    }
}
