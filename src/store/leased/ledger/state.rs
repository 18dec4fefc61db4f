//! A ledger state and what it allows: the view of a policy's state at an instant, the most
//! units a block may hold, and when a refused cost would fit.

use std::collections::BTreeMap;

use super::{Kind, Part};
use crate::algorithm::{
    fixed_window, sliding_window_counter, FixedWindow, FixedWindowState, LimitAlgorithm,
    SlidingWindowCounter, SlidingWindowCounterState,
};
use crate::policy::Limits;

/// One policy's ledger state.
#[derive(Debug, Clone)]
pub(super) enum LState {
    Counter {
        w: u64,
        c: u64,
        p: u64,
    },
    Fixed {
        w: u64,
        c: u64,
    },
    Bucket {
        d: u64,
        u: u64,
    },
    /// Entry id → (end of its lease, units).
    Log(BTreeMap<u64, (u64, u64)>),
}

/// The loaded view of one policy, as `lua/lease.lua` computes it.
pub(super) struct View {
    pub(super) idx: u64,
    pub(super) prev: u64,
    pub(super) cur: u64,
    pub(super) deficit: u64,
    pub(super) used: u64,
}

// The arithmetic below is the Lua's, in integers. A part's `n`, `w` and `cap` come from a
// validated policy or a usable override (`n × w`, `cap × w` ≤ 2^50); the states only grow by
// grants that fit and by overcharges (debts) saturating at ⌊2^52 / W⌋ units (a deficit of
// 2^52), so every product of a count and a window stays below 2^53 (exact in Lua's doubles).
// What a caller sends (costs, wants, settlements, refunds) can be any `u64`: every term it
// enters saturates, so a hostile number is refused or capped, never wrapped.

pub(super) fn load(part: &Part, state: Option<&LState>, now: u64) -> View {
    let idx = now / part.window_ms;
    let mut v = View {
        idx,
        prev: 0,
        cur: 0,
        deficit: 0,
        used: 0,
    };
    match state {
        // A count past the limit (a settlement's debt) is carried into the next windows, as
        // the algorithms carry it.
        Some(&LState::Counter { w, c, p }) => {
            let s = SlidingWindowCounterState {
                window: w,
                current: c,
                previous: p,
            };
            (v.prev, v.cur) = sliding_window_counter::counts(&s, idx, part.limit);
        }
        Some(&LState::Fixed { w, c }) => {
            let s = FixedWindowState {
                window: w,
                count: c,
            };
            v.cur = fixed_window::count_at(&s, idx, part.limit);
        }
        Some(LState::Bucket { d, u }) => {
            let elapsed = now.saturating_sub(*u);
            v.deficit = d.saturating_sub(elapsed.saturating_mul(part.limit));
        }
        Some(LState::Log(entries)) => {
            v.used = entries
                .values()
                .filter(|(end, _)| end.saturating_add(part.window_ms) > now)
                .fold(0u64, |sum, (_, u)| sum.saturating_add(*u));
        }
        None => {}
    }
    v
}

/// The algorithms' view of a part's numbers (a ledger part is never a shaping GCRA).
pub(super) fn limits(part: &Part) -> Limits {
    Limits {
        limit: part.limit,
        window_ms: part.window_ms,
        capacity: part.capacity,
        max_delay_ms: 0,
    }
}

/// The counter's state as the view `v` sees it at its window.
pub(super) fn counter_state(v: &View) -> SlidingWindowCounterState {
    SlidingWindowCounterState {
        window: v.idx,
        current: v.cur,
        previous: v.prev,
    }
}

/// The fixed window's state as the view `v` sees it at its window.
pub(super) fn fixed_state(v: &View) -> FixedWindowState {
    FixedWindowState {
        window: v.idx,
        count: v.cur,
    }
}

/// The most units a block valid `t` ms may hold now; `None` when not even one.
pub(super) fn most(part: &Part, v: &View, now: u64, t: u64) -> Option<u64> {
    match part.kind {
        Kind::Counter => {
            let w = part.window_ms;
            (part.limit * w)
                .checked_sub(sliding_window_counter::weighted(
                    v.prev,
                    v.cur,
                    now - v.idx * w,
                    w,
                ))
                .map(|room| room / w)
        }
        Kind::Log => part.limit.checked_sub(v.used),
        Kind::Fixed => part.limit.checked_sub(v.cur),
        Kind::Bucket => (part.capacity * part.window_ms)
            .checked_sub(v.deficit.saturating_add(part.limit.saturating_mul(t)))
            .map(|room| room / part.window_ms),
    }
}

pub(super) fn fits(part: &Part, v: &View, now: u64, t: u64, units: u64) -> bool {
    most(part, v, now, t).is_some_and(|m| m >= units)
}

pub(super) fn retry(part: &Part, v: &View, state: Option<&LState>, now: u64, cost: u64) -> u64 {
    match part.kind {
        Kind::Counter if cost > part.limit => {
            // Never passes; asked again once the counter has forgotten everything (its debt
            // paid), and no sooner than two windows.
            let clears = sliding_window_counter::clears_in(
                v.prev,
                v.cur,
                v.idx,
                now,
                part.limit,
                part.window_ms,
            );
            clears.max(2 * part.window_ms)
        }
        Kind::Counter => {
            SlidingWindowCounter::evaluate(&counter_state(v), now, &limits(part), cost)
                .retry_after_millis()
                .max(1)
        }
        Kind::Log => {
            let mut entries: Vec<(u64, u64)> = match state {
                Some(LState::Log(e)) => e
                    .values()
                    .filter(|(end, _)| end.saturating_add(part.window_ms) > now)
                    .copied()
                    .collect(),
                _ => Vec::new(),
            };
            entries.sort_unstable();
            let (mut freed, mut at) = (0u64, now + part.window_ms);
            for (end, units) in entries {
                freed = freed.saturating_add(units);
                at = end.saturating_add(part.window_ms);
                if v.used.saturating_sub(freed).saturating_add(cost) <= part.limit {
                    break;
                }
            }
            at.saturating_sub(now).max(1)
        }
        // Never passes; asked again once the window's count (its debt) is paid off.
        Kind::Fixed if cost > part.limit => {
            let windows = v.cur.div_ceil(part.limit).max(1);
            v.idx
                .saturating_add(windows)
                .saturating_mul(part.window_ms)
                .saturating_sub(now)
        }
        Kind::Fixed => FixedWindow::evaluate(&fixed_state(v), now, &limits(part), cost)
            .retry_after_millis()
            .max(1),
        // A cost above the capacity never passes: asked again once the bucket is full.
        Kind::Bucket if cost > part.capacity => v.deficit.div_ceil(part.limit).max(1),
        Kind::Bucket => (v.deficit + cost * part.window_ms)
            .saturating_sub(part.capacity * part.window_ms)
            .div_ceil(part.limit)
            .max(1),
    }
}

pub(super) fn view_of(part: &Part, v: &View, state: Option<&LState>, now: u64) -> (u64, u64) {
    match part.kind {
        Kind::Counter => {
            let d = SlidingWindowCounter::evaluate(&counter_state(v), now, &limits(part), 0);
            (d.remaining(), d.reset_after_millis())
        }
        Kind::Log => {
            let newest = match state {
                Some(LState::Log(e)) => e
                    .values()
                    .map(|(end, _)| end.saturating_add(part.window_ms).saturating_sub(now))
                    .max()
                    .unwrap_or(0),
                _ => 0,
            };
            (part.limit.saturating_sub(v.used), newest)
        }
        Kind::Fixed => {
            let d = FixedWindow::evaluate(&fixed_state(v), now, &limits(part), 0);
            (d.remaining(), d.reset_after_millis())
        }
        Kind::Bucket => (
            (part.capacity * part.window_ms).saturating_sub(v.deficit) / part.window_ms,
            v.deficit.div_ceil(part.limit),
        ),
    }
}
