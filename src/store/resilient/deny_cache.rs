//! The deny cache of a [`ResilientStore`](super::ResilientStore): denials the store gave,
//! answered again locally until they end, without a round trip; each answered only under
//! the store generation it was learned in, and confirmed by the store (a peek off the
//! request path) at most every `recheck` while it is answered.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::algorithm::PolicyDecision;
use crate::decision::{DecidedBy, Decision};
use crate::key::Key;
use crate::policy::Policy;

/// The most denials kept for one key (one per set of policies and costs).
const MAX_PER_KEY: usize = 4;

/// How many counters of forgotten keys there are: a key's is the one its hash picks. Keys
/// that share one only lose a denial to each other's forgets while a check is under way.
const FORGET_STRIPES: usize = 64;

/// Current denials from the store, keyed by (key, policies, costs), each until its moment
/// (at most `max_age_ms` after it was cached), grouped by key: forgetting a key touches its
/// own entries only, whatever else the cache holds.
pub(super) struct DenyCache {
    capacity: usize,
    max_age_ms: u64,
    /// How long a denial is answered before the store is asked to confirm it.
    recheck_ms: u64,
    hasher: foldhash::fast::RandomState,
    entries: Mutex<Entries>,
    /// The store's generation the entries were cached under.
    generation: AtomicU64,
    /// Bumped, under the entries' lock, by every [`forget`](Self::forget) of a key whose
    /// hash picks it: a denial the store gave a check of that key that began before (a reset
    /// or an override crossed it) is not cached.
    forgotten: [AtomicU64; FORGET_STRIPES],
}

/// The denials, by the key's hash, then by their entry.
#[derive(Default)]
struct Entries {
    by_key: HashMap<u64, SmallVec<[Cached; 1]>>,
    len: usize,
    /// While full: the earliest moment a scan for expired denials can free room (the
    /// soonest end among them, and at least [`FULL_RESCAN_MS`] after the last scan).
    full_until: u64,
}

/// The least time between two scans of a full cache for expired denials: a client that keeps
/// it full (thousands of live denials) must not make every new denial scan all of them under
/// the lock every check takes.
const FULL_RESCAN_MS: u64 = 100;

impl Entries {
    fn find(&mut self, entry: Entry) -> Option<&mut Cached> {
        self.by_key
            .get_mut(&entry.key)?
            .iter_mut()
            .find(|c| c.entry == entry.full)
    }

    fn remove(&mut self, entry: Entry) {
        self.remove_where(entry.key, |c| c.entry == entry.full);
    }

    /// Drops the denials under `key_hash` that `gone` picks.
    fn remove_where(&mut self, key_hash: u64, gone: impl Fn(&Cached) -> bool) {
        if let Some(list) = self.by_key.get_mut(&key_hash) {
            let before = list.len();
            list.retain(|c| !gone(c));
            self.len -= before - list.len();
            if list.is_empty() {
                self.by_key.remove(&key_hash);
            }
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&Cached) -> bool) {
        let mut len = 0;
        self.by_key.retain(|_, list| {
            list.retain(|c| keep(c));
            len += list.len();
            !list.is_empty()
        });
        self.len = len;
    }

    fn clear(&mut self) {
        self.by_key.clear();
        self.len = 0;
        self.full_until = 0;
    }
}

/// Where a request's denial is kept: its key's hash, and the hash of the key, policies and
/// costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    key: u64,
    full: u64,
}

struct Cached {
    entry: u64,
    key: Key,
    /// The request, to ask the store again.
    policies: SmallVec<[Policy; 2]>,
    costs: SmallVec<[u64; 2]>,
    /// The store's generation when the store gave the denial.
    generation: u64,
    at: u64,
    /// When the cache stops serving it: the store's moment, or the max age.
    until: u64,
    /// When the store said the request would be allowed.
    store_until: u64,
    /// When the store last said so (the denial, or a peek since).
    confirmed: u64,
    /// Whether a peek to confirm it is under way.
    checking: bool,
    decision: Decision,
}

/// A cached denial the store should confirm: the request to peek, and which entry it is.
pub(super) struct Recheck {
    pub(super) entry: Entry,
    pub(super) key: Key,
    pub(super) policies: SmallVec<[Policy; 2]>,
    pub(super) costs: SmallVec<[u64; 2]>,
    at: u64,
}

impl DenyCache {
    pub(super) fn new(capacity: usize, max_age: Duration, recheck: Duration) -> Self {
        Self {
            capacity,
            max_age_ms: max_age.as_millis().try_into().unwrap_or(u64::MAX),
            recheck_ms: recheck.as_millis().try_into().unwrap_or(u64::MAX),
            hasher: foldhash::fast::RandomState::default(),
            entries: Mutex::new(Entries::default()),
            generation: AtomicU64::new(0),
            forgotten: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn key_hash(&self, key: &Key) -> u64 {
        self.hasher.hash_one(key)
    }

    pub(super) fn entry_of(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Entry {
        let key_hash = self.key_hash(key);
        let mut h = self.hasher.build_hasher();
        key_hash.hash(&mut h);
        for (p, c) in policies.iter().zip(costs) {
            p.name().hash(&mut h);
            c.hash(&mut h);
        }
        Entry {
            key: key_hash,
            full: h.finish(),
        }
    }

    fn stripe(&self, key_hash: u64) -> &AtomicU64 {
        // The high bits: the low ones also pick the map's buckets.
        &self.forgotten[(key_hash >> 58) as usize % FORGET_STRIPES]
    }

    /// Drops every entry when the store's generation moved: it lost the state they stand for.
    pub(super) fn sync(&self, generation: u64) {
        if self.generation.load(Ordering::Acquire) != generation
            && self.generation.swap(generation, Ordering::AcqRel) != generation
        {
            self.entries.lock().clear();
        }
    }

    /// The cached denial of this request, if one is in force at `now` and was learned under
    /// the store's current `generation`; with it, when the store last confirmed it `recheck`
    /// or more ago and no peek is under way, the peek to send (off the request path).
    pub(super) fn get(
        &self,
        entry: Entry,
        key: &Key,
        now: u64,
        generation: u64,
    ) -> Option<(Decision, Option<Recheck>)> {
        let mut entries = self.entries.lock();
        let cached = entries.find(entry)?;
        if cached.key != *key {
            return None;
        }
        // A denial from state the store has lost (it restarted, as far as it noticed) is
        // never answered, whatever its moment.
        if now >= cached.until || cached.generation != generation {
            entries.remove(entry);
            return None;
        }
        let decision = shift(
            &cached.decision,
            now.saturating_sub(cached.at),
            cached.store_until.saturating_sub(now),
        );
        let recheck = (!cached.checking && now >= cached.confirmed.saturating_add(self.recheck_ms))
            .then(|| {
                cached.checking = true;
                Recheck {
                    entry,
                    key: cached.key.clone(),
                    policies: cached.policies.clone(),
                    costs: cached.costs.clone(),
                    at: cached.at,
                }
            });
        Some((decision, recheck))
    }

    /// What the store said when asked to confirm a denial: `answer` is whether it would
    /// allow the request now and, if not, its `retry_after` (ms); `None` when it did not
    /// answer. An allowed request, or a store whose generation moved since the denial, drops
    /// it; a confirmed denial is answered for another `recheck` (and ends no later than the
    /// store now says).
    pub(super) fn rechecked(
        &self,
        job: &Recheck,
        answer: Option<(bool, u64)>,
        now: u64,
        generation: u64,
    ) {
        let mut entries = self.entries.lock();
        let Some(cached) = entries.find(job.entry) else {
            return;
        };
        if cached.key != job.key || cached.at != job.at {
            return; // replaced meanwhile
        }
        cached.checking = false;
        match answer {
            _ if cached.generation != generation => {
                entries.remove(job.entry);
            }
            Some((true, _)) => {
                entries.remove(job.entry);
            }
            Some((false, retry_after)) => {
                let store_until = now.saturating_add(retry_after);
                cached.confirmed = now;
                cached.store_until = cached.store_until.min(store_until);
                cached.until = cached.until.min(store_until);
            }
            None => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn insert(
        &self,
        entry: Entry,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
        decision: Decision,
        now: u64,
        generation: u64,
        forgotten: u64,
    ) {
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        // A slot given back on any instance frees it at once: an in-flight refusal has no
        // moment it lasts until, only a hint when to try again.
        // A cost above the capacity in force is refused as such (no wait makes it fit, and it
        // must not read as a rate-limit denial, which a penalty would punish): asked of the
        // store each time, at no charge.
        if policies
            .iter()
            .zip(decision.policies())
            .any(|(p, d)| (p.is_in_flight() && !d.is_allowed()) || d.exceeds_capacity())
        {
            return;
        }
        let store_until = now.saturating_add(decision.retry_after_millis());
        let until = store_until.min(now.saturating_add(self.max_age_ms));
        let mut entries = self.entries.lock();
        if self.stripe(entry.key).load(Ordering::Acquire) != forgotten {
            return;
        }
        entries.remove(entry);
        // A key's denials are few (a cost or two per route); a client that sends a new cost
        // each time replaces its own oldest rather than lengthening the list every lookup
        // of the key scans.
        if let Some(list) = entries.by_key.get_mut(&entry.key) {
            if list.len() >= MAX_PER_KEY {
                list.remove(0);
                entries.len -= 1;
            }
        }
        if entries.len >= self.capacity {
            if now < entries.full_until {
                return;
            }
            let mut soonest = u64::MAX;
            entries.retain(|c| {
                let keep = c.until > now && c.generation == generation;
                if keep {
                    soonest = soonest.min(c.until);
                }
                keep
            });
            if entries.len >= self.capacity {
                entries.full_until = soonest.max(now.saturating_add(FULL_RESCAN_MS));
                return;
            }
        }
        entries.len += 1;
        entries.by_key.entry(entry.key).or_default().push(Cached {
            entry: entry.full,
            key: key.clone(),
            policies: policies.iter().cloned().collect(),
            costs: costs.iter().copied().collect(),
            generation,
            at: now,
            until,
            store_until,
            confirmed: now,
            checking: false,
            decision,
        });
    }

    /// Drops `key`'s denials: its own entries only, in time independent of the cache's size.
    pub(super) fn forget(&self, key: &Key) {
        let key_hash = self.key_hash(key);
        let mut entries = self.entries.lock();
        entries.remove_where(key_hash, |c| c.key == *key);
        self.stripe(key_hash).fetch_add(1, Ordering::AcqRel);
    }

    /// How many times keys that share `entry`'s counter were forgotten: read when a check
    /// begins, and given to [`insert`](Self::insert).
    pub(super) fn forgotten(&self, entry: Entry) -> u64 {
        self.stripe(entry.key).load(Ordering::Acquire)
    }
}

/// A cached denial as seen `elapsed` ms after it was cached, `left` ms before it ends.
pub(super) fn shift(decision: &Decision, elapsed: u64, left: u64) -> Decision {
    let policies: SmallVec<[PolicyDecision; 2]> = decision
        .policies()
        .iter()
        .map(|d| {
            PolicyDecision::from_parts(
                d.is_allowed(),
                d.limit(),
                d.remaining(),
                d.reset_after_millis().saturating_sub(elapsed),
                if d.is_allowed() {
                    0
                } else {
                    d.retry_after_millis().saturating_sub(elapsed).min(left)
                },
                0,
            )
        })
        .collect();
    Decision::from_policies(policies).with_decided_by(DecidedBy::CachedDeny)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied() -> Decision {
        Decision::single(PolicyDecision::from_parts(false, 5, 0, 90_000, 90_000, 0))
    }

    /// Caches a denial of `key` given at `now` under `generation`, by a check no forget crossed.
    fn cache_denial(
        cache: &DenyCache,
        entry: Entry,
        key: &Key,
        policies: &[Policy],
        now: u64,
        generation: u64,
    ) {
        let forgotten = cache.forgotten(entry);
        cache.insert(
            entry,
            key,
            policies,
            &[1],
            denied(),
            now,
            generation,
            forgotten,
        );
    }

    /// A cache that rechecks every `recheck`, a key, its one policy and its entry.
    fn one_entry(recheck: Duration) -> (DenyCache, Key, [Policy; 1], Entry) {
        let cache = DenyCache::new(10, Duration::from_secs(600), recheck);
        let key = Key::new("user", "1");
        let policies = [Policy::new("p", crate::Rate::per_hour(5)).unwrap()];
        let entry = cache.entry_of(&key, &policies, &[1]);
        (cache, key, policies, entry)
    }

    /// A full cache takes no new denial while its own are live, and takes them again as soon
    /// as they end (it scans for ended ones at most every `FULL_RESCAN_MS`, not per denial).
    #[test]
    fn a_full_cache_takes_denials_again_once_its_own_end() {
        let (cache, _, policies, _) = one_entry(Duration::from_secs(600));
        let key = |i: usize| Key::new("user", format!("k{i}"));
        for i in 0..10 {
            let entry = cache.entry_of(&key(i), &policies, &[1]);
            cache_denial(&cache, entry, &key(i), &policies, 1_000, 0);
        }
        let late = key(10);
        let entry = cache.entry_of(&late, &policies, &[1]);
        for now in [1_001, 1_050, 50_000, 90_999] {
            cache_denial(&cache, entry, &late, &policies, now, 0);
            assert!(
                cache.get(entry, &late, now + 1, 0).is_none(),
                "full at {now}"
            );
        }
        // The first ten end at 91 000 (a 90 s retry): room again.
        cache_denial(&cache, entry, &late, &policies, 91_000, 0);
        assert!(cache.get(entry, &late, 91_001, 0).is_some());
    }

    #[test]
    fn a_denial_from_a_check_a_forget_crossed_is_not_cached() {
        let (cache, key, policies, entry) = one_entry(Duration::from_secs(600));
        // The check began; a reset or an override of a key landed; then the store said no.
        let began = cache.forgotten(entry);
        cache.forget(&key);
        cache.insert(entry, &key, &policies, &[1], denied(), 1_000, 0, began);
        assert!(cache.get(entry, &key, 1_001, 0).is_none());
        cache_denial(&cache, entry, &key, &policies, 1_000, 0);
        assert!(cache.get(entry, &key, 1_001, 0).is_some());
    }

    #[test]
    fn forgetting_a_key_leaves_other_keys_alone() {
        let (cache, key, policies, entry) = one_entry(Duration::from_secs(600));
        // Another key, whose forgets are counted apart from this key's.
        let other = (0..)
            .map(|i| Key::new("user", format!("other-{i}")))
            .find(|k| {
                !std::ptr::eq(
                    cache.stripe(cache.key_hash(k)),
                    cache.stripe(cache.key_hash(&key)),
                )
            })
            .unwrap();
        let other_entry = cache.entry_of(&other, &policies, &[1]);
        cache_denial(&cache, other_entry, &other, &policies, 1_000, 0);
        // A check of `key` began; `other` was given units back (a refund, a settlement)
        // meanwhile; then the store said no to `key`: that denial is cached.
        let began = cache.forgotten(entry);
        cache.forget(&other);
        cache.insert(entry, &key, &policies, &[1], denied(), 1_000, 0, began);
        assert!(cache.get(entry, &key, 1_001, 0).is_some());
        assert!(cache.get(other_entry, &other, 1_001, 0).is_none());
        // Forgetting `key` drops its denial and no other.
        cache_denial(&cache, other_entry, &other, &policies, 1_002, 0);
        cache.forget(&key);
        assert!(cache.get(entry, &key, 1_003, 0).is_none());
        assert!(cache.get(other_entry, &other, 1_003, 0).is_some());
        assert_eq!(cache.entries.lock().len, 1);
    }

    #[test]
    fn a_key_keeps_its_latest_few_denials_only() {
        let (cache, key, policies, _) = one_entry(Duration::from_secs(600));
        let entries: Vec<Entry> = (1..=10)
            .map(|cost| {
                let entry = cache.entry_of(&key, &policies, &[cost]);
                let forgotten = cache.forgotten(entry);
                cache.insert(
                    entry,
                    &key,
                    &policies,
                    &[cost],
                    denied(),
                    1_000,
                    0,
                    forgotten,
                );
                entry
            })
            .collect();
        assert_eq!(cache.entries.lock().len, MAX_PER_KEY);
        assert!(cache.get(entries[0], &key, 1_001, 0).is_none());
        assert!(cache.get(entries[9], &key, 1_001, 0).is_some());
        assert!(cache
            .get(entries[10 - MAX_PER_KEY], &key, 1_001, 0)
            .is_some());
    }

    #[test]
    fn a_denial_is_never_answered_under_another_generation() {
        let (cache, key, policies, entry) = one_entry(Duration::from_secs(600));
        cache.sync(3);
        cache_denial(&cache, entry, &key, &policies, 1_000, 3);
        assert!(cache.get(entry, &key, 1_001, 3).is_some());
        // The store noticed it lost its state: the entry is gone, not merely skipped.
        assert!(cache.get(entry, &key, 1_002, 4).is_none());
        assert!(cache.get(entry, &key, 1_003, 3).is_none());
        // A denial learned under a generation the cache has left is not kept.
        cache.sync(5);
        cache_denial(&cache, entry, &key, &policies, 1_004, 4);
        assert!(cache.get(entry, &key, 1_005, 4).is_none());
        assert!(cache.get(entry, &key, 1_005, 5).is_none());
    }

    #[test]
    fn a_denial_is_confirmed_by_the_store_every_recheck() {
        let (cache, key, policies, entry) = one_entry(Duration::from_millis(100));
        cache_denial(&cache, entry, &key, &policies, 1_000, 0);
        assert!(cache.get(entry, &key, 1_099, 0).unwrap().1.is_none());
        let (_, job) = cache.get(entry, &key, 1_100, 0).unwrap();
        let job = job.expect("a recheck is due");
        assert_eq!(
            (job.key.clone(), job.costs.as_slice()),
            (key.clone(), &[1][..])
        );
        // One peek at a time: later hits are answered without asking again.
        assert!(cache.get(entry, &key, 1_150, 0).unwrap().1.is_none());
        // The store still refuses, for 30 s more: answered until the next recheck, and
        // never past the store's new moment.
        cache.rechecked(&job, Some((false, 30_000)), 1_160, 0);
        assert!(cache.get(entry, &key, 1_259, 0).unwrap().1.is_none());
        let (d, job) = cache.get(entry, &key, 1_260, 0).unwrap();
        assert!(d.retry_after_millis() <= 30_000 - 100);
        // Now the store would allow it (its state was lost, or refunded elsewhere): gone.
        cache.rechecked(&job.unwrap(), Some((true, 0)), 1_270, 0);
        assert!(cache.get(entry, &key, 1_271, 0).is_none());
        // A store that did not answer leaves the entry, to be asked again at the next hit.
        cache_denial(&cache, entry, &key, &policies, 2_000, 0);
        let (_, job) = cache.get(entry, &key, 2_100, 0).unwrap();
        cache.rechecked(&job.unwrap(), None, 2_150, 0);
        let (_, job) = cache.get(entry, &key, 2_151, 0).unwrap();
        // And a store whose generation moved meanwhile drops it whatever it answered.
        cache.rechecked(&job.expect("asked again"), Some((false, 9_000)), 2_160, 1);
        assert!(cache.get(entry, &key, 2_161, 0).is_none());
    }

    #[test]
    fn cached_denials_count_down() {
        let d = Decision::single(PolicyDecision::from_parts(false, 5, 0, 900, 700, 0));
        let later = shift(&d, 200, 500);
        assert_eq!(later.decided_by(), DecidedBy::CachedDeny);
        assert!(!later.is_allowed());
        assert_eq!(later.retry_after_millis(), 500);
        assert_eq!(later.reset_after().as_millis(), 700);
    }
}
