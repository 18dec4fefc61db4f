//! The keys refused most often, in bounded memory: a Space-Saving sketch (Metwally, Agrawal
//! and El Abbadi, 2005) with a fixed number of slots, fed by every rate-limited refusal.
//!
//! Only refusals touch it (one short lock and, for a key not yet tracked in a full sketch, a
//! scan of the slots); allowed requests never do. Keys are shown as [`RefusedKey`]: a short
//! prefix and a digest, never the whole key.

use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::Mutex;

use super::Limiter;
use crate::key::Key;
use crate::store::Store;

/// The default number of slots of the sketch behind [`Limiter::top_refused`].
pub const DEFAULT_TOP_REFUSED_SLOTS: usize = 64;
/// The default period after which [`Limiter::top_refused`] starts counting afresh.
pub const DEFAULT_TOP_REFUSED_WINDOW: Duration = Duration::from_secs(300);

/// How many characters of a key's material [`RefusedKey::key`] shows.
const PREFIX_CHARS: usize = 8;

/// One of the keys refused most often (see [`Limiter::top_refused`]).
///
/// The true number of refusals lies between `count - error` and `count`.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::{key::Key, Limiter, Policy, Rate};
///
/// let limiter = Limiter::builder()
///     .policy(Policy::new("api", Rate::per_minute(1))?)
///     .build()?;
/// let key = Key::new("apikey", "ba7816bf8f01cfea414140de5dae2223");
/// for _ in 0..3 {
///     limiter.check(&key, 1).await?;
/// }
/// let top = limiter.top_refused(10);
/// assert_eq!(top[0].key, "apikey:ba7816bf…"); // a short prefix, never the whole key
/// assert_eq!(top[0].digest, tollgate::key::digest(&key));
/// assert_eq!((top[0].count, top[0].error), (2, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct RefusedKey {
    /// The key's source and the first 8 characters of its material, with `…` when cut.
    pub key: String,
    /// The key's digest, as in logs and spans ([`key::digest`](crate::key::digest)).
    pub digest: String,
    /// Refusals counted for the key: an upper bound.
    pub count: u64,
    /// How much `count` may overstate: the true count is at least `count - error`.
    pub error: u64,
}

impl RefusedKey {
    fn new(key: &Key, count: u64, error: u64) -> Self {
        Self {
            key: shown(key),
            digest: crate::key::digest(key),
            count,
            error,
        }
    }
}

/// `source:` and the first [`PREFIX_CHARS`] characters of the material, `…` when cut.
pub(crate) fn shown(key: &Key) -> String {
    let text = key.as_str();
    let (source, material) = text.split_once(':').unwrap_or((text, ""));
    let mut out = String::with_capacity(source.len() + 1 + PREFIX_CHARS + 3);
    out.push_str(source);
    out.push(':');
    let mut chars = material.chars();
    out.extend(chars.by_ref().take(PREFIX_CHARS));
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// One Space-Saving summary: at most `slots` counters.
struct SpaceSaving {
    slots: usize,
    index: HashMap<Key, usize, foldhash::fast::RandomState>,
    entries: Vec<Entry>,
}

struct Entry {
    key: Key,
    count: u64,
    error: u64,
}

impl SpaceSaving {
    fn new(slots: usize) -> Self {
        Self {
            slots,
            index: HashMap::with_hasher(foldhash::fast::RandomState::default()),
            entries: Vec::new(),
        }
    }

    /// Counts one occurrence of `key`: its counter, a free slot, or the smallest counter's
    /// slot (which it inherits, as error).
    fn add(&mut self, key: &Key) {
        if let Some(&i) = self.index.get(key) {
            self.entries[i].count += 1;
            return;
        }
        if self.entries.len() < self.slots {
            self.index.insert(key.clone(), self.entries.len());
            self.entries.push(Entry {
                key: key.clone(),
                count: 1,
                error: 0,
            });
            return;
        }
        let Some((i, min)) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.count)
            .map(|(i, e)| (i, e.count))
        else {
            return; // no slots at all
        };
        self.index.remove(&self.entries[i].key);
        self.index.insert(key.clone(), i);
        self.entries[i] = Entry {
            key: key.clone(),
            count: min + 1,
            error: min,
        };
    }

    /// What a key this summary does not hold may have been counted: the smallest counter
    /// when every slot is taken, else nothing.
    fn floor(&self) -> u64 {
        if self.entries.len() < self.slots {
            0
        } else {
            self.entries.iter().map(|e| e.count).min().unwrap_or(0)
        }
    }

    fn get(&self, key: &Key) -> Option<&Entry> {
        self.index.get(key).map(|&i| &self.entries[i])
    }
}

/// The sketch of a limiter: the current period's summary and the previous one's.
pub(crate) struct HeavyHitters {
    window_ms: u64,
    state: Mutex<Periods>,
}

struct Periods {
    /// When the current period started (store time, ms); `None` before the first refusal.
    started_ms: Option<u64>,
    current: SpaceSaving,
    previous: SpaceSaving,
}

impl HeavyHitters {
    /// `None` for 0 slots (the sketch is off).
    pub(crate) fn new(slots: usize, window: Duration) -> Option<Arc<Self>> {
        (slots > 0).then(|| {
            Arc::new(Self {
                window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1),
                state: Mutex::new(Periods {
                    started_ms: None,
                    current: SpaceSaving::new(slots),
                    previous: SpaceSaving::new(slots),
                }),
            })
        })
    }

    /// Starts a new period when the current one is over.
    fn rotate(&self, periods: &mut Periods, now: u64) {
        let Some(started) = periods.started_ms else {
            periods.started_ms = Some(now);
            return;
        };
        let elapsed = now.saturating_sub(started);
        if elapsed < self.window_ms {
            return;
        }
        let slots = periods.current.slots;
        let current = std::mem::replace(&mut periods.current, SpaceSaving::new(slots));
        // After two periods or more without a refusal, the last one is empty too.
        periods.previous = if elapsed < 2 * self.window_ms {
            current
        } else {
            SpaceSaving::new(slots)
        };
        periods.started_ms = Some(now - elapsed % self.window_ms);
    }

    pub(crate) fn record(&self, key: &Key, now: u64) {
        let mut periods = self.state.lock();
        self.rotate(&mut periods, now);
        periods.current.add(key);
    }

    /// The `n` keys with the most refusals over the current and previous periods, the most
    /// refused first.
    pub(crate) fn top(&self, n: usize, now: u64) -> Vec<RefusedKey> {
        let mut periods = self.state.lock();
        self.rotate(&mut periods, now);
        let (cur, prev) = (&periods.current, &periods.previous);
        let (cur_floor, prev_floor) = (cur.floor(), prev.floor());
        // A key missing from one summary may have been counted up to its floor there.
        let mut merged: Vec<(&Key, u64, u64)> = cur
            .entries
            .iter()
            .map(|e| match prev.get(&e.key) {
                Some(p) => (&e.key, e.count + p.count, e.error + p.error),
                None => (&e.key, e.count + prev_floor, e.error + prev_floor),
            })
            .collect();
        merged.extend(
            prev.entries
                .iter()
                .filter(|e| cur.get(&e.key).is_none())
                .map(|e| (&e.key, e.count + cur_floor, e.error + cur_floor)),
        );
        merged.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        merged.truncate(n);
        merged
            .into_iter()
            .map(|(key, count, error)| RefusedKey::new(key, count, error))
            .collect()
    }

    /// The key among those counted in the current and previous periods whose
    /// [digest](crate::key::digest) is `digest`.
    #[cfg(feature = "admin")]
    pub(crate) fn find(&self, digest: &str) -> Option<Key> {
        let periods = self.state.lock();
        periods
            .current
            .entries
            .iter()
            .chain(&periods.previous.entries)
            .map(|e| &e.key)
            .find(|key| crate::key::digest(key) == digest)
            .cloned()
    }
}

impl<S: Store> Limiter<S> {
    /// The key listed by [`top_refused`](Self::top_refused) with `digest`, if it is counted
    /// there still: how the admin API reaches a key it shows only as a prefix and a digest.
    #[cfg(feature = "admin")]
    pub(crate) fn refused_key(&self, digest: &str) -> Option<Key> {
        self.inner.common.top_refused.as_ref()?.find(digest)
    }

    /// Counts a rate-limited refusal of `key` in the top refused keys (when they are kept).
    #[inline]
    pub(crate) fn note_refused(&self, key: &Key) {
        if let Some(top) = &self.inner.common.top_refused {
            top.record(key, self.inner.common.store.now_millis());
        }
    }

    /// The keys the limiter's policies refused most often lately, the most refused first, at
    /// most `n` of them: for finding who is being rate limited (the admin API's `GET /top`).
    ///
    /// Every rate-limited refusal counts — from the layer, [`decide`](Self::decide),
    /// [`check`](Self::check) — including those of a deny cache (a login guard counts its
    /// own: [`LoginGuard::top_refused`](crate::login::LoginGuard::top_refused));
    /// failure modes, access lists and missing keys do not. Counts cover the current period
    /// and the previous one ([`LimiterBuilder::top_refused_window`], default 5 minutes) and
    /// are shared with every limiter made by [`for_route`](Self::for_route). Each key is
    /// shown as a prefix and a digest ([`RefusedKey`]).
    ///
    /// # Bounds
    ///
    /// A Space-Saving sketch with [`LimiterBuilder::top_refused`] slots (default 64) per
    /// period, two periods: memory is at most `2 × slots` keys (each at most 194 bytes) and
    /// their counters, whatever the traffic. Any key refused more than `N / slots` times in
    /// a period of `N` refusals is listed; each count overstates by at most its `error`, and
    /// `error ≤ N / slots`. Empty when the sketch is off (`top_refused(0)`).
    ///
    /// See [`RefusedKey`] for an example.
    ///
    /// [`LimiterBuilder::top_refused`]: crate::LimiterBuilder::top_refused
    /// [`LimiterBuilder::top_refused_window`]: crate::LimiterBuilder::top_refused_window
    pub fn top_refused(&self, n: usize) -> Vec<RefusedKey> {
        match &self.inner.common.top_refused {
            Some(top) => top.top(n, self.inner.common.store.now_millis()),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Key {
        Key::new("user", i.to_string())
    }

    #[test]
    fn counts_exactly_while_slots_remain() {
        let hh = HeavyHitters::new(4, Duration::from_secs(60)).unwrap();
        for (i, n) in [(1, 5), (2, 3), (3, 1)] {
            for _ in 0..n {
                hh.record(&key(i), 1_000);
            }
        }
        let top = hh.top(10, 1_000);
        let counts: Vec<_> = top
            .iter()
            .map(|k| (k.key.as_str(), k.count, k.error))
            .collect();
        assert_eq!(
            counts,
            [("user:1", 5, 0), ("user:2", 3, 0), ("user:3", 1, 0)]
        );
        assert_eq!(hh.top(1, 1_000).len(), 1);
    }

    #[test]
    fn a_heavy_key_survives_a_flood_of_distinct_keys() {
        let slots = 16;
        let hh = HeavyHitters::new(slots, Duration::from_secs(60)).unwrap();
        let mut total = 0u64;
        for round in 0..1_000u32 {
            hh.record(&key(0), 1_000);
            hh.record(&key(1 + round), 1_000); // each flooding key once
            total += 2;
        }
        let top = hh.top(1, 1_000);
        assert_eq!(top[0].key, "user:0");
        // The bound: the true count (1000) lies in [count - error, count], error ≤ N/slots.
        assert!(top[0].count - top[0].error <= 1_000 && 1_000 <= top[0].count);
        assert!(top[0].error <= total / slots as u64);
        let state = hh.state.lock();
        assert!(state.current.entries.len() <= slots && state.current.index.len() <= slots);
    }

    #[test]
    fn counts_cover_the_current_and_previous_periods_only() {
        let hh = HeavyHitters::new(4, Duration::from_secs(60)).unwrap();
        hh.record(&key(1), 1_000);
        hh.record(&key(1), 30_000);
        hh.record(&key(2), 70_000); // the second period
        let top = hh.top(10, 70_000);
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].key.as_str(), top[0].count), ("user:1", 2));
        // The third period: the first one is forgotten.
        assert_eq!(hh.top(10, 130_000).len(), 1);
        // Two idle periods later: nothing.
        assert!(hh.top(10, 400_000).is_empty());
    }

    #[test]
    fn keys_show_a_prefix_and_a_digest_only() {
        let k = Key::new("apikey", "0123456789abcdef0123456789abcdef");
        let shown = RefusedKey::new(&k, 1, 0);
        assert_eq!(shown.key, "apikey:01234567…");
        assert_eq!(shown.digest, crate::key::digest(&k));
        assert!(!shown.key.contains("89abcdef0123"));
        assert_eq!(
            RefusedKey::new(&Key::new("user", "42"), 1, 0).key,
            "user:42"
        );
    }

    #[test]
    fn no_slots_means_no_sketch() {
        assert!(HeavyHitters::new(0, Duration::from_secs(1)).is_none());
    }
}
