//! The numbers an algorithm reads from a policy.

/// The numbers an algorithm needs to decide: the limit, the window, the capacity and the
/// longest shaping delay, in integers and milliseconds.
///
/// A [`Policy`](crate::Policy) keeps one, built and checked with it, and lends it to the
/// [algorithms](crate::algorithm) with [`Policy::limits`](crate::Policy::limits): an
/// algorithm sees these four numbers and nothing else of the policy (not its name, cost,
/// failure mode or shadow flag).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Policy, Rate};
///
/// let policy = Policy::builder("api", Rate::per_second(10).with_burst(20))
///     .algorithm(Algorithm::Gcra)
///     .shape(Duration::from_millis(250))
///     .build()?;
/// let limits = policy.limits();
/// assert_eq!(limits.limit(), 10);
/// assert_eq!(limits.window_millis(), 1_000);
/// assert_eq!(limits.capacity(), 20);
/// assert_eq!(limits.max_delay_millis(), 250);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    pub(crate) limit: u64,
    pub(crate) window_ms: u64,
    pub(crate) capacity: u64,
    pub(crate) max_delay_ms: u64,
}

impl Limits {
    /// Units per window (`N`).
    #[inline]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window in milliseconds (`W`).
    #[inline]
    pub fn window_millis(&self) -> u64 {
        self.window_ms
    }

    /// The largest cost one request can be allowed: the burst for the token bucket and
    /// GCRA, the limit for the window algorithms.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// For shaping GCRA policies, the longest an allowed request may wait for its slot; 0
    /// otherwise.
    #[inline]
    pub fn max_delay_millis(&self) -> u64 {
        self.max_delay_ms
    }

    /// The units a shaping policy admits beyond its capacity by making a request wait its
    /// longest delay (0 without shaping): a cost up to `capacity + shaping_slack` can pass.
    #[inline]
    pub(crate) fn shaping_slack(&self) -> u64 {
        shaping_slack(self.limit, self.window_ms, self.max_delay_ms)
    }
}

/// The units `max_delay_ms` of waiting admits at `limit` per `window_ms`: what a shaping
/// policy's largest cost has beyond its capacity.
#[inline]
pub(crate) fn shaping_slack(limit: u64, window_ms: u64, max_delay_ms: u64) -> u64 {
    if max_delay_ms == 0 || window_ms == 0 {
        return 0;
    }
    let units = u128::from(max_delay_ms) * u128::from(limit) / u128::from(window_ms);
    u64::try_from(units).unwrap_or(u64::MAX)
}
