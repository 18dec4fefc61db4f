//! A ledger's reply: granted or refused, the lease, and each policy's answer.

use smallvec::SmallVec;

#[cfg(feature = "redis")]
use crate::error::StoreError;

use super::Kind;

/// One policy's answer from the ledger: units, its view, and the limit and capacity it
/// decided with (the plan's, or the key's override's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Answer {
    pub(crate) granted: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_after_ms: u64,
    pub(crate) retry_after_ms: u64,
    pub(crate) limit: u64,
    pub(crate) capacity: u64,
}

impl Answer {
    /// The limit a decision reports: the capacity for the token bucket and GCRA, the limit
    /// otherwise.
    pub(crate) fn reported_limit(&self, kind: Option<Kind>) -> u64 {
        if kind == Some(Kind::Bucket) {
            self.capacity
        } else {
            self.limit
        }
    }
}

/// A ledger's answer: whether it granted, for how long, at what time (the ledger's clock),
/// and each policy's units and view. A forced charge answers no views, and "granted" when
/// the key is within its limits afterwards (no debt stands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerReply {
    pub(crate) granted: bool,
    /// The lease of the block granted, in ms; 0 when the request was decided exactly.
    pub(crate) lease_ms: u64,
    pub(crate) now_ms: u64,
    pub(crate) answers: SmallVec<[Answer; 2]>,
}

impl LedgerReply {
    #[cfg(all(test, feature = "redis"))]
    /// Parses one call's reply, which must be all of `bytes`.
    pub(crate) fn parse(bytes: &[u8], policies: usize) -> Result<Self, StoreError> {
        let mut rest = bytes;
        let reply = Self::parse_next(&mut rest, policies)?;
        if !rest.is_empty() {
            return Err(Self::malformed(bytes));
        }
        Ok(reply)
    }

    #[cfg(feature = "redis")]
    /// Parses the call's reply at the start of `bytes` and moves `bytes` past it: four
    /// little-endian doubles (allowed, lease, now, the number of answers: 0 or `policies`),
    /// then six per answer (granted, remaining, reset after, retry after, the limit and the
    /// capacity in force). Every number is a whole, non-negative double below 2^53; anything
    /// else is a protocol error.
    pub(crate) fn parse_next(bytes: &mut &[u8], policies: usize) -> Result<Self, StoreError> {
        let whole = *bytes;
        let mut read = |out: &mut [u64]| -> Result<(), StoreError> {
            for o in out.iter_mut() {
                let Some((number, tail)) = bytes.split_first_chunk::<8>() else {
                    return Err(Self::malformed(whole));
                };
                let x = f64::from_le_bytes(*number);
                if !(0.0..=9_007_199_254_740_992.0).contains(&x) || x.fract() != 0.0 {
                    return Err(Self::malformed(whole));
                }
                // Whole and in range, so the conversion is exact.
                *o = x as u64;
                *bytes = tail;
            }
            Ok(())
        };
        let mut head = [0u64; 4];
        read(&mut head)?;
        let [allowed, lease_ms, now_ms, count] = head;
        if allowed > 1 || !(count == 0 || count == policies as u64) {
            return Err(Self::malformed(whole));
        }
        let mut answers = SmallVec::new();
        for _ in 0..count {
            let mut a = [0u64; 6];
            read(&mut a)?;
            let [granted, remaining, reset_after_ms, retry_after_ms, limit, capacity] = a;
            answers.push(Answer {
                granted,
                remaining,
                reset_after_ms,
                retry_after_ms,
                limit,
                capacity,
            });
        }
        Ok(Self {
            granted: allowed == 1,
            lease_ms,
            now_ms,
            answers,
        })
    }

    #[cfg(feature = "redis")]
    fn malformed(bytes: &[u8]) -> StoreError {
        StoreError::Protocol(crate::error::Cause::from(format!(
            "lease reply of {} bytes, starting {:02x?}",
            bytes.len(),
            &bytes[..bytes.len().min(32)]
        )))
    }
}
