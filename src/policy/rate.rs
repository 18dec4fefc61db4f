//! [`Rate`]: how much, per how long.

use std::fmt;
use std::time::Duration;

/// How many units may pass per window.
///
/// `per_second(n)` means *n requests per second* (not one request every n seconds).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::Rate;
///
/// let r = Rate::per_second(10);
/// assert_eq!(r.limit(), 10);
/// assert_eq!(r.window(), Duration::from_secs(1));
/// assert_eq!(r.burst(), None);
///
/// let r = Rate::new(5, Duration::from_secs(10)).with_burst(8);
/// assert_eq!(r.burst(), Some(8));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub(super) limit: u64,
    pub(super) window: Duration,
    pub(super) burst: Option<u64>,
}

impl Rate {
    /// `limit` units per `window`.
    pub const fn new(limit: u64, window: Duration) -> Self {
        Self {
            limit,
            window,
            burst: None,
        }
    }

    /// `n` per second.
    pub const fn per_second(n: u64) -> Self {
        Self::new(n, Duration::from_secs(1))
    }

    /// `n` per minute.
    pub const fn per_minute(n: u64) -> Self {
        Self::new(n, Duration::from_secs(60))
    }

    /// `n` per hour.
    pub const fn per_hour(n: u64) -> Self {
        Self::new(n, Duration::from_secs(3_600))
    }

    /// `n` per day (24 hours).
    pub const fn per_day(n: u64) -> Self {
        Self::new(n, Duration::from_secs(86_400))
    }

    /// Sets the burst capacity for the token bucket and GCRA: how many units may pass at
    /// once from a full bucket. Without it the capacity equals the limit.
    pub const fn with_burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Units per window.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The window.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// The burst capacity, if one was set.
    pub const fn burst(&self) -> Option<u64> {
        self.burst
    }

    /// The window in whole milliseconds.
    pub fn window_millis(&self) -> u64 {
        self.window.as_millis() as u64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.window.as_millis();
        let (n, unit) = match ms {
            86_400_000 => (1, "day"),
            3_600_000 => (1, "hour"),
            60_000 => (1, "minute"),
            1_000 => (1, "second"),
            m if m % 1000 == 0 => (m / 1000, "seconds"),
            m => (m, "ms"),
        };
        if n == 1 {
            write!(f, "{} per {unit}", self.limit)
        } else {
            write!(f, "{} per {n} {unit}", self.limit)
        }
    }
}
