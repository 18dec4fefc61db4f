//! Operations as values: [`Op`], [`Costs`] and [`Applied`].

use std::fmt;
use std::ops::Deref;

use smallvec::SmallVec;

use crate::decision::Decision;

/// Units per policy, in the order of the policies an operation names: `costs[i]` goes to
/// `policies[i]`.
///
/// Built from an array, a slice or a `Vec`; holds two without allocating.
///
/// ```
/// use tollgate::store::Costs;
///
/// let costs = Costs::from([1, 5]);
/// assert_eq!(&costs[..], &[1, 5]);
/// assert_eq!(Costs::from(&[3][..]).len(), 1);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Costs(SmallVec<[u64; 2]>);

impl Costs {
    /// `n` policies of one unit each.
    ///
    /// ```
    /// assert_eq!(&tollgate::store::Costs::ones(2)[..], &[1, 1]);
    /// ```
    pub fn ones(n: usize) -> Self {
        Self(SmallVec::from_elem(1, n))
    }

    /// The units, one per policy.
    pub fn as_slice(&self) -> &[u64] {
        &self.0
    }
}

impl fmt::Debug for Costs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl Deref for Costs {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        &self.0
    }
}

impl From<&[u64]> for Costs {
    fn from(costs: &[u64]) -> Self {
        Self(SmallVec::from_slice(costs))
    }
}

impl<const N: usize> From<[u64; N]> for Costs {
    fn from(costs: [u64; N]) -> Self {
        Self(costs.into_iter().collect())
    }
}

impl From<Vec<u64>> for Costs {
    fn from(costs: Vec<u64>) -> Self {
        Self(SmallVec::from_vec(costs))
    }
}

impl FromIterator<u64> for Costs {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// One operation on a key's state under some of its policies, as a value: an `Op` names the operation and
/// carries its arguments, [`Store::apply`](super::Store::apply) carries it out and answers
/// [`Applied`].
///
/// Every operation is one atomic step over all the policies it names. The hot path's charge
/// has a method of its own, [`Store::check`](super::Store::check), whose future is a named
/// type; [`Op::Check`] is the same charge for code that handles operations as values (a
/// test's script, a replay of a log).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// use tollgate::key::Key;
/// use tollgate::store::{MemoryStore, Op, Store};
/// use tollgate::{Policy, Rate};
///
/// let store = MemoryStore::new();
/// let api = [Policy::new("api", Rate::per_minute(10))?];
/// let key = Key::new("user", "client-1");
/// let script = [Op::check([4]), Op::refund([1]), Op::peek([0])];
/// let mut last = None;
/// for op in script {
///     last = store.apply(&key, &api, op).await?.into_decision();
/// }
/// assert_eq!(last.expect("a peek answers a decision").remaining(), 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// Each variant's costs hold one number per policy the operation names, in order. What each
/// does to each algorithm's state is defined once, in [`crate::algorithm`], and every store
/// answers alike (the conformance matrix of the test suite holds every store to it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Decides a request of `costs[i]` units against each policy, charging all of them only
    /// if every one allows; an allowed request takes a slot of each
    /// [in-flight](crate::Algorithm::InFlight) policy, named by
    /// [`Decision::slot`]. Answers [`Applied::Decision`]. The same as
    /// [`Store::check`](super::Store::check).
    Check {
        /// Units per policy.
        costs: Costs,
    },
    /// What [`Op::Check`] would answer now, charging nothing. Answers
    /// [`Applied::Decision`].
    Peek {
        /// Units per policy.
        costs: Costs,
    },
    /// Gives back up to `costs[i]` units just charged to each policy: for a request that
    /// turned out not to count after it was charged (a login that succeeded).
    ///
    /// Each policy's state gets the refund its algorithm defines (see [`crate::algorithm`]):
    /// the units come off what is still counted, never more than `costs[i]` and never below
    /// a fresh state, so a refund cannot hand out more than a fresh client would get. A
    /// refund for a key with no state changes nothing; a refund never gives back an
    /// in-flight slot (that is [`Op::Release`]). A refund made long after its charge (past a
    /// window boundary, or after the state refilled) may give back less, or units of other
    /// requests; each algorithm states its bound. Apply it at most once per charge, and not
    /// for a charge made before a [reset](Op::Reset) of the key: a store cannot tell that
    /// charge from the ones made since, and the refund would come off those (a
    /// [`Limiter`](crate::Limiter)'s reservations and layer skip the refunds a reset through
    /// that limiter overtook). The same holds for the refund part of [`Op::Settle`].
    Refund {
        /// Units per policy.
        costs: Costs,
    },
    /// Settles costs known only after the response: `reserved[i]` units were charged to
    /// policy `i`, and the request turned out to cost `actual[i]`. The difference is
    /// refunded when the actual cost is lower or charged when it is higher, whether or not
    /// it fits, all in one atomic step. Any `u64` is taken, saturating.
    ///
    /// **An extra charge is never forgiven.** It is charged in full, even far past the
    /// limit: the excess is a debt the key pays back at its policy's rate (`N` units per
    /// window) before it is admitted again (each algorithm's
    /// [`overcharge`](crate::algorithm::LimitAlgorithm::overcharge) says how it keeps it). A
    /// debt saturates at ⌊2^52 / W⌋ units, W the window in ms
    /// ([`MAX_USAGE_WINDOW_PRODUCT`](crate::algorithm::MAX_USAGE_WINDOW_PRODUCT)).
    ///
    /// **The bound.** A reservation is admitted only with room for it (a
    /// [`Limiter`](crate::Limiter) reserves at least one unit, so a spent budget refuses an
    /// estimate of 0 too). So for a key whose requests are each settled before the next is
    /// reserved, the units served — the actual costs of its admitted requests — over a span
    /// are at most, with `N` the limit per window of `W` ms, `C` the capacity and `o` the
    /// overshoot (actual cost less reservation) of the last request admitted in the span:
    ///
    /// | algorithm | over `j` whole windows (aligned to the epoch) | over any `j·W` ms |
    /// |---|---|---|
    /// | fixed window | `j·N + o` | `(j + 1)·N + o` |
    /// | sliding window counter | `j·N + o` | `(j + 1)·N + o` |
    /// | sliding window log | `j·N + o` | `j·N + o` |
    /// | token bucket, GCRA | `C + j·N + o` | `C + j·N + o` (any `L` ms: `C + N·L/W + o`) |
    ///
    /// Requests reserved together (concurrent ones) are each admitted against the others'
    /// reservations only, so a span can serve the overshoots of all of them; the debt they
    /// leave is then paid back over the following windows, so over the long run a key is
    /// served at most `N` per window whatever it sends.
    Settle {
        /// Units charged per policy when the request was admitted.
        reserved: Costs,
        /// Units the request turned out to cost, per policy.
        actual: Costs,
    },
    /// Gives back the slot `slot` ([`Decision::slot`]) a request held under each of the
    /// [in-flight](crate::Algorithm::InFlight) policies named; every other policy named (a
    /// request's whole plan, say) is left as it is, on every store. A slot the store does
    /// not hold (already released, or taken before a [reset](Op::Reset)) gives back nothing
    /// on the Redis stores, which keep each slot's name. The memory store keeps a count and
    /// the name of the slot that started it: there a slot taken before a reset gives back
    /// nothing, but a second release of one slot, or the release of another key's slot
    /// taken since this key's count started, frees one of this key's slots. Release each
    /// slot once, under the key that took it, as a [`Permit`](crate::Permit) does.
    Release {
        /// The slot's name, [`Decision::slot`] of the request that took it.
        slot: u64,
    },
    /// Extends the lease of a held slot, for stores whose slots expire unless refreshed
    /// (Redis: [`Decision`]s that took one say so); a store whose slots never expire does
    /// nothing.
    Refresh {
        /// The slot's name, [`Decision::slot`] of the request that took it.
        slot: u64,
    },
    /// Forgets the key's state under the policies named: its next request starts afresh.
    Reset,
    /// The give-back (an [`Op::Refund`] or [`Op::Settle`]) of a request the local fallback
    /// of a [`ResilientStore`](super::ResilientStore) admitted while the store could not
    /// decide ([`DecidedBy::Fallback`](crate::DecidedBy)): the fallback charged it, the
    /// store never did. A `ResilientStore` gives it back to its fallback alone; every store
    /// applies to its own state only what a settlement charges above its reservation (a
    /// debt is never forgiven) and nothing of a refund, so a give-back made once the store
    /// is back does not come off other requests' units. A
    /// [`Limiter`](crate::Limiter) sends it by itself for such requests.
    Fallback {
        /// The give-back.
        op: Box<Op>,
    },
}

impl Op {
    /// [`Op::Check`] of these costs.
    pub fn check(costs: impl Into<Costs>) -> Self {
        Self::Check {
            costs: costs.into(),
        }
    }

    /// [`Op::Peek`] of these costs.
    pub fn peek(costs: impl Into<Costs>) -> Self {
        Self::Peek {
            costs: costs.into(),
        }
    }

    /// [`Op::Refund`] of these costs.
    pub fn refund(costs: impl Into<Costs>) -> Self {
        Self::Refund {
            costs: costs.into(),
        }
    }

    /// [`Op::Settle`] of these reservations and actual costs.
    pub fn settle(reserved: impl Into<Costs>, actual: impl Into<Costs>) -> Self {
        Self::Settle {
            reserved: reserved.into(),
            actual: actual.into(),
        }
    }

    /// A short name for logs and metrics: `check`, `peek`, `refund`, `settle`, `release`,
    /// `refresh` or `reset`.
    ///
    /// ```
    /// assert_eq!(tollgate::store::Op::Reset.name(), "reset");
    /// ```
    pub fn name(&self) -> &'static str {
        match self {
            Self::Check { .. } => "check",
            Self::Peek { .. } => "peek",
            Self::Refund { .. } => "refund",
            Self::Settle { .. } => "settle",
            Self::Release { .. } => "release",
            Self::Refresh { .. } => "refresh",
            Self::Reset => "reset",
            Self::Fallback { op } => op.name(),
        }
    }

    /// What a store applies to its own state of an [`Op::Fallback`] (the part of a
    /// settlement above its reservation), or of any other operation (all of it); `None`
    /// when nothing.
    pub(crate) fn store_part(self) -> Option<Op> {
        match self {
            Self::Fallback { op } => match *op {
                Self::Settle { reserved, actual } => {
                    let raised: Costs = reserved
                        .iter()
                        .zip(actual.iter())
                        .map(|(&r, &a)| a.max(r))
                        .collect();
                    (raised != reserved).then_some(Self::Settle {
                        reserved,
                        actual: raised,
                    })
                }
                _ => None,
            },
            op => Some(op),
        }
    }

    /// Whether the operation answers a [`Decision`] ([`Op::Check`], [`Op::Peek`]).
    pub fn decides(&self) -> bool {
        matches!(self, Self::Check { .. } | Self::Peek { .. })
    }

    /// Whether the operation can give back what a key was charged ([`Op::Refund`],
    /// [`Op::Settle`], [`Op::Release`], [`Op::Reset`]): a key it refused may now be allowed.
    pub fn gives_back(&self) -> bool {
        matches!(
            self,
            Self::Refund { .. }
                | Self::Settle { .. }
                | Self::Release { .. }
                | Self::Reset
                | Self::Fallback { .. }
        )
    }

    /// Whether the operation's numbers fit the `n` policies it names: one cost per policy
    /// (both lists of a settlement). Stores answer an operation that does not fit with an
    /// error rather than guess.
    pub fn fits(&self, n: usize) -> bool {
        match self {
            Self::Check { costs } | Self::Peek { costs } | Self::Refund { costs } => {
                costs.len() == n
            }
            Self::Settle { reserved, actual } => reserved.len() == n && actual.len() == n,
            Self::Release { .. } | Self::Refresh { .. } | Self::Reset => true,
            Self::Fallback { op } => op.fits(n),
        }
    }
}

/// What [`Store::apply`](super::Store::apply) answers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Applied {
    /// The decision of an [`Op::Check`] or [`Op::Peek`].
    Decision(Decision),
    /// Any other operation, done.
    Done,
}

impl Applied {
    /// The decision, for an operation that answers one.
    ///
    /// ```
    /// use tollgate::store::Applied;
    ///
    /// assert!(Applied::Done.into_decision().is_none());
    /// ```
    pub fn into_decision(self) -> Option<Decision> {
        match self {
            Self::Decision(d) => Some(d),
            Self::Done => None,
        }
    }
}

/// The error of an operation whose numbers do not fit its policies (see [`Op::fits`]).
pub(crate) fn misfit(op: &Op, n: usize) -> crate::error::StoreError {
    crate::error::StoreError::Protocol(crate::error::Cause::from(format!(
        "a {} for {n} policies carries costs for a different number",
        op.name()
    )))
}

/// An operation refused before it reaches the state: numbers that do not fit its policies.
pub(crate) fn refused_misfit(op: &Op, n: usize) -> Option<super::ApplyFuture> {
    (!op.fits(n)).then(|| {
        let error = misfit(op, n);
        Box::pin(std::future::ready(Err(error))) as super::BoxFuture<_>
    })
}
