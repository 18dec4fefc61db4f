//! The policy states of one entry.
//!
//! Nearly every key is limited by one policy, so an entry holds its one state inline and only
//! keys with several policies allocate. This takes the place of a `SmallVec<[Slot; 1]>`, which
//! spends a word on its capacity beside the state: here the state's own enum tag tells the two
//! forms apart (the list is laid out around it), which keeps an entry at 72 bytes instead of
//! 80 — about a tenth of what a live key costs.

use std::ops::{Deref, DerefMut};

use crate::algorithm::AnyState;

/// One policy's state within an entry: the policy's id and the state of its algorithm.
pub(super) struct Slot {
    pub(super) policy: u32,
    pub(super) state: AnyState,
}

/// The states of an entry, one per policy it was charged for.
pub(super) enum Slots {
    /// The common case: one policy, no allocation.
    One(Slot),
    /// None (a list that never allocated), or several.
    Many(Vec<Slot>),
}

impl Slots {
    /// No states.
    pub(super) const fn new() -> Self {
        Slots::Many(Vec::new())
    }

    pub(super) fn push(&mut self, slot: Slot) {
        *self = match std::mem::replace(self, Slots::new()) {
            Slots::One(first) => Slots::Many(vec![first, slot]),
            Slots::Many(list) if list.is_empty() => Slots::One(slot),
            Slots::Many(mut list) => {
                list.push(slot);
                Slots::Many(list)
            }
        };
    }

    /// Keeps the states for which `keep` is true.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Slot) -> bool) {
        match self {
            Slots::One(slot) => {
                if !keep(slot) {
                    *self = Slots::new();
                }
            }
            Slots::Many(list) => {
                list.retain(|s| keep(s));
                if list.len() == 1 {
                    // Back inline, so that the entry's list is not kept for one state.
                    if let Some(slot) = list.pop() {
                        *self = Slots::One(slot);
                    }
                }
            }
        }
    }
}

impl Deref for Slots {
    type Target = [Slot];

    #[inline]
    fn deref(&self) -> &[Slot] {
        match self {
            Slots::One(slot) => std::slice::from_ref(slot),
            Slots::Many(list) => list,
        }
    }
}

impl DerefMut for Slots {
    #[inline]
    fn deref_mut(&mut self) -> &mut [Slot] {
        match self {
            Slots::One(slot) => std::slice::from_mut(slot),
            Slots::Many(list) => list,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;

    fn slot(policy: u32) -> Slot {
        Slot {
            policy,
            state: AnyState::fresh(Algorithm::Gcra),
        }
    }

    fn ids(slots: &Slots) -> Vec<u32> {
        slots.iter().map(|s| s.policy).collect()
    }

    #[test]
    fn one_state_is_held_inline_and_more_in_a_list() {
        let mut slots = Slots::new();
        assert!(slots.is_empty());
        slots.push(slot(1));
        assert!(matches!(slots, Slots::One(_)));
        slots.push(slot(2));
        slots.push(slot(3));
        assert_eq!(ids(&slots), [1, 2, 3]);
        slots[1].policy = 20;
        assert_eq!(ids(&slots), [1, 20, 3]);
    }

    #[test]
    fn retain_goes_back_inline_and_to_empty() {
        let mut slots = Slots::new();
        for id in 1..=3 {
            slots.push(slot(id));
        }
        slots.retain(|s| s.policy != 2);
        assert_eq!(ids(&slots), [1, 3]);
        slots.retain(|s| s.policy == 3);
        assert!(matches!(slots, Slots::One(_)));
        assert_eq!(ids(&slots), [3]);
        slots.retain(|_| false);
        assert!(slots.is_empty());
        slots.push(slot(4));
        assert_eq!(ids(&slots), [4]);
    }

    #[test]
    fn the_list_shares_the_space_of_the_inline_state() {
        // What keeps an entry small: no word beside the state to tell the two forms apart.
        assert_eq!(std::mem::size_of::<Slots>(), std::mem::size_of::<Slot>());
    }
}
