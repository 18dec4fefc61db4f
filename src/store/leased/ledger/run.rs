//! One ledger call run over its policies' states: the Rust twin of `lua/lease.lua`.

use std::collections::BTreeMap;

use smallvec::SmallVec;

use super::state::{fits, limits, load, most, retry, view_of, LState, View};
use super::{Answer, Kind, LedgerCall, LedgerMode, LedgerReply, Part, Returned};
use crate::algorithm::{
    sliding_window_log, FixedWindow, FixedWindowState, LimitAlgorithm, SlidingWindowCounter,
    SlidingWindowCounterState, TokenBucket, TokenBucketState,
};

/// Charges `k` units used at most until `now + valid` into the state.
fn charge(
    part: &Part,
    v: &mut View,
    state: &mut Option<LState>,
    now: u64,
    k: u64,
    valid: u64,
    id: u64,
) {
    match part.kind {
        Kind::Counter => {
            v.cur = v.cur.saturating_add(k);
            *state = Some(LState::Counter {
                w: v.idx,
                c: v.cur,
                p: v.prev,
            });
        }
        Kind::Fixed => {
            v.cur = v.cur.saturating_add(k);
            *state = Some(LState::Fixed { w: v.idx, c: v.cur });
        }
        Kind::Bucket => {
            v.deficit = v
                .deficit
                .saturating_add(k.saturating_mul(part.window_ms))
                .saturating_add(part.limit.saturating_mul(valid));
            let u = match state {
                Some(LState::Bucket { u, .. }) => now.max(*u),
                _ => now,
            };
            *state = Some(LState::Bucket { d: v.deficit, u });
        }
        Kind::Log => {
            v.used = v.used.saturating_add(k);
            let log = match state {
                Some(LState::Log(log)) => log,
                other => {
                    *other = Some(LState::Log(BTreeMap::new()));
                    match other {
                        Some(LState::Log(log)) => log,
                        _ => return,
                    }
                }
            };
            log.retain(|_, (end, _)| end.saturating_add(part.window_ms) > now);
            log.insert(id, (now.saturating_add(valid), k));
        }
    }
}

/// Charges `extra` units whatever the state (a cost settled above its reservation), as the
/// exact algorithms' `overcharge` does, through their own arithmetic: in full, a debt the key
/// pays back at its limit's rate (the windows carry a count past the limit into the next
/// windows, the log dates an entry ahead, the bucket goes into deficit), saturating at
/// ⌊2^52 / W⌋ units ([`MAX_USAGE_WINDOW_PRODUCT`](crate::algorithm::MAX_USAGE_WINDOW_PRODUCT)).
/// A debt is never forgiven: grants see it as used (no block hands out units it owes).
fn force(part: &Part, state: &mut Option<LState>, now: u64, extra: u64, id: u64) {
    let limits = limits(part);
    match (part.kind, state.as_ref()) {
        (Kind::Bucket, s) => {
            let mut b = match s {
                Some(&LState::Bucket { d, u }) => TokenBucketState {
                    deficit: d,
                    updated_at: u,
                },
                _ => TokenBucketState::default(),
            };
            TokenBucket::overcharge(&mut b, now, &limits, extra);
            *state = Some(LState::Bucket {
                d: b.deficit,
                u: b.updated_at,
            });
        }
        (Kind::Counter, s) => {
            let mut c = match s {
                Some(&LState::Counter { w, c, p }) => SlidingWindowCounterState {
                    window: w,
                    current: c,
                    previous: p,
                },
                _ => SlidingWindowCounterState::default(),
            };
            SlidingWindowCounter::overcharge(&mut c, now, &limits, extra);
            *state = Some(LState::Counter {
                w: c.window,
                c: c.current,
                p: c.previous,
            });
        }
        (Kind::Fixed, s) => {
            let mut f = match s {
                Some(&LState::Fixed { w, c }) => FixedWindowState {
                    window: w,
                    count: c,
                },
                _ => FixedWindowState::default(),
            };
            FixedWindow::overcharge(&mut f, now, &limits, extra);
            *state = Some(LState::Fixed {
                w: f.window,
                c: f.count,
            });
        }
        (Kind::Log, s) => {
            let mut v = load(part, s, now);
            // The entry the exact log would write, dated as far ahead: it counts until `W`
            // after that, as a block's entry counts until `W` after its lease ends.
            if let Some((ahead, units)) = sliding_window_log::debt_entry(v.used, extra, &limits) {
                charge(part, &mut v, state, now, units, ahead, id);
            }
        }
    }
}

/// Runs one ledger call over `states` (one per part, in order) at `now`: the Rust twin of
/// `lua/lease.lua`. The call's parts already carry the overrides in force.
pub(super) fn run(call: &LedgerCall, states: &mut [Option<LState>], now: u64) -> LedgerReply {
    let done = |granted| LedgerReply {
        granted,
        lease_ms: 0,
        now_ms: now,
        answers: SmallVec::new(),
    };
    match call.mode {
        LedgerMode::Return => {
            for (part, state) in call.parts.iter().zip(states.iter_mut()) {
                give_back(part, &part.returned, state, now, call.block_id);
            }
            done(true)
        }
        LedgerMode::Force => {
            // Answers whether the key is within its limits afterwards: when a debt stands,
            // the caller gives back the block it holds, charged before the debt.
            let mut clear = true;
            for (part, state) in call.parts.iter().zip(states.iter_mut()) {
                if part.cost > 0 {
                    force(part, state, now, part.cost, call.block_id);
                }
                let v = load(part, state.as_ref(), now);
                clear &= most(part, &v, now, 0).is_some();
            }
            done(clear)
        }
        LedgerMode::Reset => {
            for state in states.iter_mut() {
                *state = None;
            }
            done(true)
        }
        // Nothing expires in process memory. A bucket's refill until now is taken at the
        // rate in force until now (an override about to change): from now on the new rate
        // refills, never the time before it.
        LedgerMode::Keep => {
            for (part, state) in call.parts.iter().zip(states.iter_mut()) {
                if let Some(LState::Bucket { d, u }) = state {
                    let elapsed = now.saturating_sub(*u);
                    *d = d.saturating_sub(elapsed.saturating_mul(part.limit));
                    *u = (*u).max(now);
                    if *d == 0 {
                        *state = None;
                    }
                }
            }
            done(true)
        }
        LedgerMode::Grant | LedgerMode::Peek => grant_or_peek(call, states, now),
    }
}

/// A grant (or a peek at what it would get): a block lent for the lease asked when every
/// policy has room for at least its cost, else the request decided exactly, else a refusal.
/// A grant gives the block in hand back first.
fn grant_or_peek(call: &LedgerCall, states: &mut [Option<LState>], now: u64) -> LedgerReply {
    if call.mode == LedgerMode::Grant && call.previous_block != 0 {
        for (part, state) in call.parts.iter().zip(states.iter_mut()) {
            give_back(part, &part.returned, state, now, call.previous_block);
        }
    }
    let mut views: SmallVec<[View; 2]> = call
        .parts
        .iter()
        .zip(states.iter())
        .map(|(p, s)| load(p, s.as_ref(), now))
        .collect();
    let Some((lease, granted)) = what_fits(call, &views, now) else {
        return refusal(call, &views, states, now);
    };
    let mut answers = SmallVec::new();
    for (i, part) in call.parts.iter().enumerate() {
        let v = &mut views[i];
        if call.mode == LedgerMode::Grant {
            charge(
                part,
                v,
                &mut states[i],
                now,
                granted[i],
                lease,
                call.block_id,
            );
        } else {
            match part.kind {
                Kind::Log => v.used += granted[i],
                Kind::Bucket => v.deficit += granted[i] * part.window_ms,
                _ => v.cur += granted[i],
            }
        }
        let (remaining, mut reset_after_ms) = view_of(part, v, states[i].as_ref(), now);
        if call.mode == LedgerMode::Peek && part.kind == Kind::Log && granted[i] > 0 {
            // The entry a peek does not write would count for a whole window.
            reset_after_ms = reset_after_ms.max(part.window_ms);
        }
        answers.push(Answer {
            granted: granted[i],
            remaining,
            reset_after_ms,
            retry_after_ms: 0,
            limit: part.limit,
            capacity: part.capacity,
        });
    }
    LedgerReply {
        granted: true,
        lease_ms: lease,
        now_ms: now,
        answers,
    }
}

/// The lease and each policy's units a grant or peek gets: a block when the call asks for a
/// lease and every policy has room for its cost over it (ending at a window's end for the
/// windows), else the cost alone with no lease; `None` when not even that fits.
fn what_fits(call: &LedgerCall, views: &[View], now: u64) -> Option<(u64, SmallVec<[u64; 2]>)> {
    if call.mode == LedgerMode::Grant
        && call.lease_ms > 0
        && call
            .parts
            .iter()
            .zip(views)
            .all(|(p, v)| fits(p, v, now, call.lease_ms, p.cost))
    {
        let mut lease = call.lease_ms;
        let mut granted = SmallVec::new();
        for (p, v) in call.parts.iter().zip(views) {
            let m = most(p, v, now, call.lease_ms).unwrap_or(0);
            granted.push(p.wanted.min(m).max(p.cost));
            if matches!(p.kind, Kind::Counter | Kind::Fixed) {
                lease = lease.min((v.idx + 1) * p.window_ms - now);
            }
        }
        return Some((lease, granted));
    }
    call.parts
        .iter()
        .zip(views)
        .all(|(p, v)| fits(p, v, now, 0, p.cost))
        .then(|| (0, call.parts.iter().map(|p| p.cost).collect()))
}

/// A refusal: each policy's view, and when its cost would fit (0 for the policies it fits).
fn refusal(call: &LedgerCall, views: &[View], states: &[Option<LState>], now: u64) -> LedgerReply {
    let answers = call
        .parts
        .iter()
        .zip(views)
        .zip(states.iter())
        .map(|((p, v), s)| {
            let (remaining, reset_after_ms) = view_of(p, v, s.as_ref(), now);
            let retry_after_ms = if fits(p, v, now, 0, p.cost) {
                0
            } else {
                retry(p, v, s.as_ref(), now, p.cost)
            };
            Answer {
                granted: 0,
                remaining,
                reset_after_ms,
                retry_after_ms,
                limit: p.limit,
                capacity: p.capacity,
            }
        })
        .collect();
    LedgerReply {
        granted: false,
        lease_ms: 0,
        now_ms: now,
        answers,
    }
}

/// Gives back `units` charged outside blocks (a refund, a settlement below its reservation,
/// whose charge the give-back does not name): off the newest entries that still count and
/// whose lease has ended, as the exact log takes a refund off its newest entries. A live
/// block's entry, and a debt's (both dated ahead), keep their units. Entries ending at the
/// same moment are taken in the order Redis lists them (their ids as text, from the last).
fn untake_newest(log: &mut BTreeMap<u64, (u64, u64)>, window_ms: u64, now: u64, units: u64) {
    let mut ended: Vec<(u64, String, u64)> = log
        .iter()
        .filter(|(_, (end, _))| *end <= now && end.saturating_add(window_ms) > now)
        .map(|(&id, &(end, _))| (end, id.to_string(), id))
        .collect();
    ended.sort_unstable_by(|a, b| (b.0, &b.1).cmp(&(a.0, &a.1)));
    let mut left = units;
    for (_, _, id) in ended {
        if left == 0 {
            break;
        }
        if let Some((_, held)) = log.get_mut(&id) {
            let taken = (*held).min(left);
            *held -= taken;
            left -= taken;
            if *held == 0 {
                log.remove(&id);
            }
        }
    }
}

/// Gives back what `back` leaves unused of block `id` (for the bucket, also the refill
/// charged ahead for the rest of its lease; for the log, the time its entry still counts).
fn give_back(part: &Part, back: &Returned, state: &mut Option<LState>, now: u64, id: u64) {
    let Returned {
        granted: k,
        unused,
        granted_at: g,
        lease_ms: valid,
        rate,
    } = *back;
    // Never later than now on the ledger's clock (as `lease.lua` has it): a give-back no
    // charge names carries the instance's clock, which may run ahead.
    let g = g.min(now);
    if unused == 0 && !matches!(part.kind, Kind::Bucket | Kind::Log) {
        return;
    }
    let gidx = g / part.window_ms;
    match state {
        Some(LState::Counter { w, c, p }) => {
            if *w == gidx {
                *c = c.saturating_sub(unused);
            } else if *w == gidx.saturating_add(1) {
                *p = p.saturating_sub(unused);
            }
        }
        Some(LState::Fixed { w, c }) if *w == gidx => *c = c.saturating_sub(unused),
        Some(LState::Log(log)) => {
            if let Some((end, units)) = log.get(&id).copied() {
                if units <= unused {
                    log.remove(&id);
                } else if unused == 0 {
                    log.insert(id, (end.min(now), units));
                } else {
                    log.insert(id, (end.min(now), units - unused));
                }
            } else if valid == 0 && g.saturating_add(part.window_ms) > now {
                // A charge outside blocks still counting, whose entry is not known (named
                // afresh, or reset since): off the newest ended entries. One charged a
                // window ago or more no longer counts: nothing to give back.
                untake_newest(log, part.window_ms, now, unused);
            }
        }
        Some(LState::Bucket { .. }) => {
            let v = load(part, state.as_ref(), now);
            if v.deficit == 0 {
                return;
            }
            // The rate the block's refill was charged ahead at, and the one in force now: that
            // refill comes back at the lower, the block's weight decays at the higher.
            let at_grant = if rate > 0 { rate } else { part.limit };
            let (slow, fast) = (part.limit.min(at_grant), part.limit.max(at_grant));
            let end = g.saturating_add(valid);
            let back = unused
                .saturating_mul(part.window_ms)
                .min(
                    k.saturating_mul(part.window_ms)
                        .saturating_sub(fast.saturating_mul(now.saturating_sub(end))),
                )
                .saturating_add(slow.saturating_mul(end.saturating_sub(now)));
            let u = match state {
                Some(LState::Bucket { u, .. }) => now.max(*u),
                _ => now,
            };
            *state = Some(LState::Bucket {
                d: v.deficit.saturating_sub(back),
                u,
            });
        }
        _ => {}
    }
}
