//! Which keys a limiter reset, and when: so that a give-back (a refund, a settlement below
//! its reservation) of a charge made before a reset of its key gives nothing back. The reset
//! may have erased the charge, and the give-back would come off units charged since.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::key::Key;

/// How many keys' last resets are kept exactly; a key reset longer ago than the last this
/// many resets is taken to have been reset as recently as the oldest of them (the safe way:
/// a give-back of a charge made before that is voided).
const KEPT: usize = 4_096;

/// The moments (a sequence shared by the limiter and every limiter made from it) at which
/// each recent reset of a key began and ended.
///
/// A charge reads [`now`](Self::now) before it is made; its give-back checks
/// [`untouched_since`](Self::untouched_since): whether no reset of the key began or ended
/// after that moment. Only resets of the same key count (a reset of another key voids
/// nothing), and the check costs the charge one atomic load.
pub(crate) struct ResetLog {
    moment: AtomicU64,
    recent: Mutex<Recent>,
}

#[derive(Default)]
struct Recent {
    last: HashMap<Key, u64>,
    order: VecDeque<(u64, Key)>,
    /// The latest moment of a reset no longer kept: a key not in `last` may have been reset
    /// then.
    floor: u64,
}

impl ResetLog {
    pub(crate) fn new() -> Self {
        Self {
            moment: AtomicU64::new(0),
            recent: Mutex::new(Recent::default()),
        }
    }

    /// The moment now, to read before a charge.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.moment.load(Ordering::Acquire)
    }

    /// Records that a reset of `key` begins or ends now.
    pub(crate) fn mark(&self, key: &Key) {
        let mut recent = self.recent.lock();
        let at = self.moment.fetch_add(1, Ordering::AcqRel) + 1;
        recent.last.insert(key.clone(), at);
        recent.order.push_back((at, key.clone()));
        while recent.last.len() > KEPT || recent.order.len() > 2 * KEPT {
            let Some((old, old_key)) = recent.order.pop_front() else {
                break;
            };
            if recent.last.get(&old_key) == Some(&old) {
                recent.last.remove(&old_key);
                recent.floor = recent.floor.max(old);
            }
        }
    }

    /// Whether no reset of `key` began or ended after `seen` (a [`now`](Self::now) read
    /// before a charge).
    pub(crate) fn untouched_since(&self, key: &Key, seen: u64) -> bool {
        // No reset of any key since: the common case, without the lock.
        if self.now() <= seen {
            return true;
        }
        let recent = self.recent.lock();
        recent.last.get(key).copied().unwrap_or(recent.floor) <= seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_reset_of_the_same_key_after_the_charge_voids_its_give_back() {
        let log = ResetLog::new();
        let (a, b) = (Key::new("t", "a"), Key::new("t", "b"));
        log.mark(&a);
        log.mark(&a);
        let seen = log.now();
        assert!(log.untouched_since(&a, seen), "a reset before the charge");
        log.mark(&b);
        assert!(log.untouched_since(&a, seen), "another key's reset");
        log.mark(&a);
        assert!(
            !log.untouched_since(&a, seen),
            "a reset begun after the charge"
        );
    }

    #[test]
    fn a_key_no_longer_kept_counts_as_reset_when_the_oldest_kept_was() {
        let log = ResetLog::new();
        let a = Key::new("t", "a");
        let seen = log.now();
        log.mark(&a);
        for i in 0..KEPT + 10 {
            log.mark(&Key::new("t", i.to_string()));
        }
        assert!(!log.untouched_since(&a, seen), "forgotten, not untouched");
        let later = log.now();
        assert!(log.untouched_since(&a, later));
        assert!(log.recent.lock().last.len() <= KEPT);
    }
}
