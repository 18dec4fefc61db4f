//! A deposit: a block of one policy's units that a region took from the home ledger, kept in
//! the region's Redis (`lua/region.lua`) for the region's instances to take from; and the
//! region script's calls (take, install, give back, deny, drain, end) with their replies.

use smallvec::SmallVec;

use crate::error::{Cause, StoreError};
use crate::store::leased::{Answer, LedgerReply};
use crate::store::redis::{RegionMode, DEPOSIT_BYTES};
use crate::store::RedisStore;

/// Deposits end this many ms before the home's lease, for the rounding of both clocks to
/// whole milliseconds (as leased blocks do).
pub(super) const CLOCK_SLACK_MS: u64 = 2;

/// The doubles of one deposit.
const FIELDS: usize = DEPOSIT_BYTES / 8;

/// One policy's deposit in a region, as `lua/region.lua` keeps it. `granted_at` is on the
/// home's clock; every other time is the region's Redis's (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Deposit {
    /// Units left to lend.
    pub(super) left: u64,
    /// Until when it may be lent (the home block's lease, measured from before it was asked
    /// for).
    pub(super) ends: u64,
    /// When it was installed.
    pub(super) installed: u64,
    /// The home block it is (its id in the home ledger).
    pub(super) block: u64,
    /// The units the home granted.
    pub(super) granted: u64,
    /// When the home granted them, on the home's clock.
    pub(super) granted_at: u64,
    /// The home block's lease (ms).
    pub(super) lease: u64,
    /// The limit (refill rate) in force at the home when it was granted.
    pub(super) rate: u64,
    /// Units taken from it since it was installed (less those given back).
    pub(super) taken: u64,
    /// The latest end of a block lent from it: it goes back to the home only after that.
    pub(super) lent_until: u64,
    /// Until when a caller renews it (no other caller starts a renewal).
    pub(super) refill_until: u64,
    /// Until when the home refused the key: a request that does not fit is refused here.
    pub(super) denied_until: u64,
    /// The limit and capacity in force at the home.
    pub(super) limit: u64,
    pub(super) capacity: u64,
    /// What the home said was left for everyone when it granted the block.
    pub(super) home_remaining: u64,
    /// When the home's view of the window or bucket resets.
    pub(super) reset_at: u64,
    /// When the key's deposits were last drained (a reset, a debt): a renewal that began
    /// before then is not installed, since its block was granted against a count the reset
    /// erased, or before the debt. Carried from one deposit to the next.
    pub(super) drained_at: u64,
}

impl Deposit {
    fn fields(&self) -> [u64; FIELDS] {
        [
            self.left,
            self.ends,
            self.installed,
            self.block,
            self.granted,
            self.granted_at,
            self.lease,
            self.rate,
            self.taken,
            self.lent_until,
            self.refill_until,
            self.denied_until,
            self.limit,
            self.capacity,
            self.home_remaining,
            self.reset_at,
            self.drained_at,
        ]
    }

    fn from_fields(f: [u64; FIELDS]) -> Self {
        let [left, ends, installed, block, granted, granted_at, lease, rate, taken, lent_until, refill_until, denied_until, limit, capacity, home_remaining, reset_at, drained_at] =
            f;
        Self {
            left,
            ends,
            installed,
            block,
            granted,
            granted_at,
            lease,
            rate,
            taken,
            lent_until,
            refill_until,
            denied_until,
            limit,
            capacity,
            home_remaining,
            reset_at,
            drained_at,
        }
    }

    /// Whether it holds a home block (an empty record only keeps a refusal or a renewal).
    pub(super) fn holds_block(&self) -> bool {
        self.block != 0 && self.granted > 0
    }
}

/// Reads whole, non-negative doubles below 2^53 off the front of a reply.
struct Reader<'a> {
    rest: &'a [u8],
    whole: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            rest: bytes,
            whole: bytes.len(),
        }
    }

    fn number(&mut self) -> Result<u64, StoreError> {
        let Some((n, tail)) = self.rest.split_first_chunk::<8>() else {
            return Err(self.malformed());
        };
        let x = f64::from_le_bytes(*n);
        if !(0.0..=9_007_199_254_740_992.0).contains(&x) || x.fract() != 0.0 {
            return Err(self.malformed());
        }
        self.rest = tail;
        // Whole and in range: the conversion is exact.
        Ok(x as u64)
    }

    fn deposit(&mut self) -> Result<Deposit, StoreError> {
        let mut f = [0u64; FIELDS];
        for x in &mut f {
            *x = self.number()?;
        }
        Ok(Deposit::from_fields(f))
    }

    fn end(self) -> Result<(), StoreError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.malformed())
        }
    }

    fn malformed(&self) -> StoreError {
        StoreError::Protocol(Cause::from(format!(
            "region script reply of {} bytes is malformed",
            self.whole
        )))
    }
}

fn doubles(values: impl IntoIterator<Item = u64>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|x| (x as f64).to_le_bytes())
        .collect()
}

/// What a take asks of one policy's deposit.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ask {
    pub(super) cost: u64,
    /// The most units the caller's block may hold.
    pub(super) wanted: u64,
    /// The unused units of the caller's previous block, given back first, and when it was
    /// taken (the region's clock).
    pub(super) back: u64,
    pub(super) back_at: u64,
    /// Whether the deposit is renewed as its time runs out (not only as its units do).
    pub(super) timed: bool,
}

/// What the caller of a take does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Nothing: the deposit is well stocked, or someone renews it.
    Nothing,
    /// Renew the deposit in the background (it is running low; this caller holds the
    /// renewal).
    RenewLater,
    /// Renew it now: nothing fits and this caller holds the renewal.
    RenewNow,
    /// The home refused the key until the deposit's `denied_until`.
    Denied,
    /// Nothing fits and another caller renews it: ask the home for this request alone.
    AskHome,
}

/// A take's reply.
#[derive(Debug, Clone)]
pub(super) struct Took {
    pub(super) allowed: bool,
    /// The lease of the block taken (0: the request's cost only).
    pub(super) lease: u64,
    pub(super) now: u64,
    pub(super) next: Next,
    /// Per policy: the units granted and its deposit after the call.
    pub(super) parts: SmallVec<[(u64, Deposit); 2]>,
    /// Per policy: the units of the caller's previous block taken back.
    pub(super) kept: SmallVec<[u64; 2]>,
}

/// Takes a block (or a request's cost, `lease` 0) from `keys`' deposits, all or nothing.
pub(super) async fn take(
    region: &RedisStore,
    keys: &[String],
    lease: u64,
    renewal_ms: u64,
    asks: &[Ask],
) -> Result<Took, StoreError> {
    let blob = doubles(
        asks.iter()
            .flat_map(|a| [a.cost, a.wanted, a.back, a.back_at, u64::from(a.timed)]),
    );
    let (lease, renewal) = (lease.to_string(), renewal_ms.to_string());
    let bytes = region
        .deposits(
            RegionMode::Take,
            keys,
            &[lease.as_bytes(), renewal.as_bytes(), &blob],
        )
        .await?;
    let mut r = Reader::new(&bytes);
    let (allowed, lease, now, status) = (r.number()?, r.number()?, r.number()?, r.number()?);
    let next = match status {
        0 => Next::Nothing,
        1 => Next::RenewLater,
        2 => Next::RenewNow,
        3 => Next::Denied,
        4 => Next::AskHome,
        _ => return Err(r.malformed()),
    };
    let (mut parts, mut kept) = (SmallVec::new(), SmallVec::new());
    for _ in keys {
        let granted = r.number()?;
        kept.push(r.number()?);
        parts.push((granted, r.deposit()?));
    }
    r.end()?;
    Ok(Took {
        allowed: allowed == 1,
        lease,
        now,
        next,
        parts,
        kept,
    })
}

/// What an install did.
#[derive(Debug)]
pub(super) struct Installed {
    /// The region's time.
    pub(super) now: u64,
    /// False when the key's deposits were drained (a reset, a debt) after the renewal began
    /// (`started`): nothing was installed, and the new deposits' units are not to be lent.
    pub(super) installed: bool,
    /// The deposits replaced (zeros where there were none).
    pub(super) old: Vec<Deposit>,
}

/// Installs `new` in place of `keys`' deposits, unless they were drained at or after
/// `started`, the region's time when the renewal that brings `new` began.
pub(super) async fn install(
    region: &RedisStore,
    keys: &[String],
    new: &[Deposit],
    started: u64,
) -> Result<Installed, StoreError> {
    let blob = doubles(new.iter().flat_map(Deposit::fields));
    let started = started.to_string();
    let bytes = region
        .deposits(RegionMode::Install, keys, &[&blob, started.as_bytes()])
        .await?;
    let mut r = Reader::new(&bytes);
    let (now, installed) = (r.number()?, r.number()?);
    let old = (0..keys.len())
        .map(|_| r.deposit())
        .collect::<Result<Vec<_>, _>>()?;
    r.end()?;
    Ok(Installed {
        now,
        installed: installed == 1,
        old,
    })
}

/// Removes `keys`' deposits, leaving the time of the drain (see [`Deposit::drained_at`]);
/// `set_aside` (a debt) keeps them to go home (see [`retire`]), otherwise (a reset) they and
/// those set aside before are dropped. The region's time, and the deposits removed.
pub(super) async fn drain(
    region: &RedisStore,
    keys: &[String],
    set_aside: bool,
) -> Result<(u64, Vec<Deposit>), StoreError> {
    let keep: &[u8] = if set_aside { b"1" } else { b"" };
    let bytes = region.deposits(RegionMode::Drain, keys, &[keep]).await?;
    replaced_deposits(&bytes, keys.len())
}

/// Removes `keys`' deposits that are still the home block `block` and have ended: the
/// region's time, and the deposits removed (empty ones where nothing was).
pub(super) async fn end(
    region: &RedisStore,
    keys: &[String],
    block: u64,
) -> Result<(u64, Vec<Deposit>), StoreError> {
    let blob = doubles(keys.iter().map(|_| block));
    let bytes = region.deposits(RegionMode::End, keys, &[&blob]).await?;
    replaced_deposits(&bytes, keys.len())
}

fn replaced_deposits(bytes: &[u8], n: usize) -> Result<(u64, Vec<Deposit>), StoreError> {
    let mut r = Reader::new(bytes);
    let now = r.number()?;
    let old = (0..n).map(|_| r.deposit()).collect::<Result<Vec<_>, _>>()?;
    r.end()?;
    Ok((now, old))
}

/// Gives unused units of blocks taken at the given times back to `keys`' deposits (each
/// only to the deposit it came from: the current one while it may still be lent, or one a
/// renewal replaced that has yet to go home). The units taken back, per policy.
pub(super) async fn give_back(
    region: &RedisStore,
    keys: &[String],
    back: &[(u64, u64)],
) -> Result<SmallVec<[u64; 2]>, StoreError> {
    let blob = doubles(back.iter().flat_map(|&(units, at)| [units, at]));
    let bytes = region
        .deposits(RegionMode::GiveBack, keys, &[&blob])
        .await?;
    let mut r = Reader::new(&bytes);
    r.number()?;
    let kept = keys
        .iter()
        .map(|_| r.number())
        .collect::<Result<SmallVec<_>, _>>()?;
    r.end()?;
    Ok(kept)
}

/// What a retire found.
#[derive(Debug)]
pub(super) struct Retired {
    /// The region's time.
    pub(super) now: u64,
    /// Per policy, what the deposit holds now (blocks given back since it was set aside),
    /// zeros where it is gone.
    pub(super) deposits: Vec<Deposit>,
    /// Per policy, whether it was gone for another reason than a reset (its units lost).
    pub(super) lost: Vec<bool>,
}

/// Takes the deposits `set_aside` (as an install or a drain answered them) out of `keys`,
/// once their last block has ended.
pub(super) async fn retire(
    region: &RedisStore,
    keys: &[String],
    set_aside: &[Deposit],
) -> Result<Retired, StoreError> {
    let blob = doubles(set_aside.iter().flat_map(|d| [d.block, d.installed]));
    let bytes = region.deposits(RegionMode::Retire, keys, &[&blob]).await?;
    let mut r = Reader::new(&bytes);
    let now = r.number()?;
    let (mut deposits, mut lost) = (Vec::new(), Vec::new());
    for d in set_aside {
        let status = r.number()?;
        lost.push(status == 2 && d.holds_block());
        deposits.push(r.deposit()?);
    }
    r.end()?;
    Ok(Retired {
        now,
        deposits,
        lost,
    })
}

/// Records that the home refused `keys` until the given times (the region's clock), and
/// ends any renewal.
pub(super) async fn deny(
    region: &RedisStore,
    keys: &[String],
    until: &[u64],
) -> Result<(), StoreError> {
    let blob = doubles(until.iter().copied());
    region
        .deposits(RegionMode::Deny, keys, &[&blob])
        .await
        .map(drop)
}

/// A reply that decided nothing (a give-back's).
pub(super) fn done(now_ms: u64) -> LedgerReply {
    LedgerReply {
        granted: true,
        lease_ms: 0,
        now_ms,
        answers: SmallVec::new(),
    }
}

/// A request's answer from deposit `d` (its units, the home's view of the rest).
pub(super) fn answer(granted: u64, d: &Deposit, now: u64, retry_after_ms: u64) -> Answer {
    Answer {
        granted,
        remaining: d.left.saturating_add(d.home_remaining),
        reset_after_ms: d.reset_at.saturating_sub(now),
        retry_after_ms,
        limit: d.limit,
        capacity: d.capacity,
    }
}

/// The deposits a home grant makes, one per policy: the block less what the waiting request
/// takes (`taken(i)`), lent until the home's lease ends as measured from `region_now`, the
/// region's time before the home was asked.
pub(super) fn deposits(
    reply: &LedgerReply,
    region_now: u64,
    id: u64,
    taken: impl Fn(usize) -> u64,
) -> Vec<Deposit> {
    reply
        .answers
        .iter()
        .enumerate()
        .map(|(i, a)| Deposit {
            left: a.granted.saturating_sub(taken(i)),
            ends: (region_now + reply.lease_ms).saturating_sub(CLOCK_SLACK_MS),
            block: id,
            granted: a.granted,
            granted_at: reply.now_ms,
            lease: reply.lease_ms,
            rate: a.limit,
            limit: a.limit,
            capacity: a.capacity,
            home_remaining: a.remaining,
            reset_at: region_now + a.reset_after_ms,
            ..Deposit::default()
        })
        .collect()
}

/// The answer to the request that waited for a renewal: its costs granted, and what is left
/// for it (the home's, plus the new deposit's when it was installed).
pub(super) fn waiting_request(
    reply: &LedgerReply,
    new: &[Deposit],
    costs: &[u64],
    installed: bool,
    region_now: u64,
) -> LedgerReply {
    let answers = reply
        .answers
        .iter()
        .zip(new)
        .zip(costs)
        .map(|((a, d), &cost)| Answer {
            granted: cost,
            remaining: if installed {
                d.left.saturating_add(a.remaining)
            } else {
                a.remaining
            },
            ..*a
        })
        .collect();
    LedgerReply {
        granted: true,
        lease_ms: 0,
        now_ms: region_now,
        answers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deposit_survives_its_wire_form() {
        let d = Deposit {
            left: 1,
            ends: 2,
            installed: 3,
            block: 4,
            granted: 5,
            granted_at: 6,
            lease: 7,
            rate: 8,
            taken: 9,
            lent_until: 10,
            refill_until: 11,
            denied_until: 12,
            limit: 13,
            capacity: 14,
            home_remaining: 15,
            reset_at: 16,
            drained_at: 17,
        };
        let bytes = doubles(d.fields());
        let mut r = Reader::new(&bytes);
        assert_eq!(r.deposit().unwrap(), d);
        r.end().unwrap();
    }

    #[test]
    fn a_short_or_fractional_reply_is_an_error_not_a_panic() {
        assert!(Reader::new(&[0u8; 7]).number().is_err());
        assert!(Reader::new(&0.5f64.to_le_bytes()).number().is_err());
        assert!(Reader::new(&(-1.0f64).to_le_bytes()).number().is_err());
        assert!(replaced_deposits(&doubles([1, 2]), 1).is_err());
    }
}
