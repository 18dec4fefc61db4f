//! The policy states of one entry.
//!
//! Nearly every key is limited by one policy, so an entry holds its one state inline and only
//! keys with several policies allocate. This takes the place of a `SmallVec<[EntryState; 1]>`, which
//! spends a word on its capacity beside the state: here the state's own enum tag tells the two
//! forms apart (the list is laid out around it), which keeps an entry at 72 bytes instead of
//! 80 — about a tenth of what a live key costs.

use std::ops::{Deref, DerefMut};

use crate::algorithm::AnyState;

/// One policy's state within an entry: the policy's id and the state of its algorithm.
pub(super) struct EntryState {
    pub(super) policy: u32,
    pub(super) state: AnyState,
}

/// The states of an entry, one per policy it was charged for.
pub(super) enum EntryStates {
    /// The common case: one policy, no allocation.
    One(EntryState),
    /// None (a list that never allocated), or several.
    Many(Vec<EntryState>),
}

impl EntryStates {
    /// No states.
    pub(super) const fn new() -> Self {
        EntryStates::Many(Vec::new())
    }

    pub(super) fn push(&mut self, state: EntryState) {
        *self = match std::mem::replace(self, EntryStates::new()) {
            EntryStates::One(first) => EntryStates::Many(vec![first, state]),
            EntryStates::Many(list) if list.is_empty() => EntryStates::One(state),
            EntryStates::Many(mut list) => {
                list.push(state);
                EntryStates::Many(list)
            }
        };
    }

    /// Keeps the states for which `keep` is true.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&EntryState) -> bool) {
        match self {
            EntryStates::One(state) => {
                if !keep(state) {
                    *self = EntryStates::new();
                }
            }
            EntryStates::Many(list) => {
                list.retain(|s| keep(s));
                if list.len() == 1 {
                    // Back inline, so that the entry's list is not kept for one state.
                    if let Some(state) = list.pop() {
                        *self = EntryStates::One(state);
                    }
                }
            }
        }
    }
}

impl Deref for EntryStates {
    type Target = [EntryState];

    #[inline]
    fn deref(&self) -> &[EntryState] {
        match self {
            EntryStates::One(state) => std::slice::from_ref(state),
            EntryStates::Many(list) => list,
        }
    }
}

impl DerefMut for EntryStates {
    #[inline]
    fn deref_mut(&mut self) -> &mut [EntryState] {
        match self {
            EntryStates::One(state) => std::slice::from_mut(state),
            EntryStates::Many(list) => list,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;

    fn state(policy: u32) -> EntryState {
        EntryState {
            policy,
            state: AnyState::fresh(Algorithm::Gcra),
        }
    }

    fn ids(states: &EntryStates) -> Vec<u32> {
        states.iter().map(|s| s.policy).collect()
    }

    #[test]
    fn one_state_is_held_inline_and_more_in_a_list() {
        let mut states = EntryStates::new();
        assert!(states.is_empty());
        states.push(state(1));
        assert!(matches!(states, EntryStates::One(_)));
        states.push(state(2));
        states.push(state(3));
        assert_eq!(ids(&states), [1, 2, 3]);
        states[1].policy = 20;
        assert_eq!(ids(&states), [1, 20, 3]);
    }

    #[test]
    fn retain_goes_back_inline_and_to_empty() {
        let mut states = EntryStates::new();
        for id in 1..=3 {
            states.push(state(id));
        }
        states.retain(|s| s.policy != 2);
        assert_eq!(ids(&states), [1, 3]);
        states.retain(|s| s.policy == 3);
        assert!(matches!(states, EntryStates::One(_)));
        assert_eq!(ids(&states), [3]);
        states.retain(|_| false);
        assert!(states.is_empty());
        states.push(state(4));
        assert_eq!(ids(&states), [4]);
    }

    #[test]
    fn the_list_shares_the_space_of_the_inline_state() {
        // What keeps an entry small: no word beside the state to tell the two forms apart.
        assert_eq!(
            std::mem::size_of::<EntryStates>(),
            std::mem::size_of::<EntryState>()
        );
    }
}
