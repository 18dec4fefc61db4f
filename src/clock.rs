//! Time sources for decisions.
//!
//! Every algorithm works on milliseconds since the Unix epoch (`u64`). Windows are aligned to
//! that epoch, so a memory store and a Redis store that read the same time agree on where a
//! fixed window starts.
//!
//! * [`SystemClock`] is the production clock: wall-clock time read once at start-up and then
//!   advanced with a monotonic timer, so it never goes backwards when NTP steps the system time.
//! * [`ManualClock`] is for tests: it stands still until you move it.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::{Clock, ManualClock};
//!
//! let clock = ManualClock::new(1_000);
//! assert_eq!(clock.now_millis(), 1_000);
//! clock.advance(Duration::from_millis(250));
//! assert_eq!(clock.now_millis(), 1_250);
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of time in milliseconds since the Unix epoch.
///
/// Implementations must be cheap: the clock is read once per decision.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> u64;

    /// Whether this is a test clock whose time a shared store must use instead of its own.
    ///
    /// Stores with a shared server clock (the Redis stores read Redis `TIME` inside their
    /// scripts, so instances with skewed clocks still agree) pass this clock's time along
    /// only when this is `true`. The default is `false`: a custom production clock leaves
    /// Redis on `TIME`. Only clocks made for tests, such as [`ManualClock`], say `true`.
    ///
    /// ```
    /// use tollgate::clock::{Clock, ManualClock, SystemClock};
    ///
    /// #[derive(Debug)]
    /// struct OffsetClock(SystemClock, u64);
    /// impl Clock for OffsetClock {
    ///     fn now_millis(&self) -> u64 { self.0.now_millis() + self.1 }
    /// }
    /// assert!(!OffsetClock(SystemClock::new(), 5).is_injected()); // Redis keeps its TIME
    /// assert!(ManualClock::new(0).is_injected());
    /// ```
    fn is_injected(&self) -> bool {
        false
    }
}

/// The real time: wall clock at start-up, advanced by a monotonic timer.
///
/// # Examples
///
/// ```
/// use tollgate::clock::{Clock, SystemClock};
///
/// let clock = SystemClock::new();
/// assert!(clock.now_millis() > 1_600_000_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin_raw: u64,
    origin_epoch_millis: u64,
}

impl SystemClock {
    /// Reads the wall clock once and anchors the monotonic timer to it.
    pub fn new() -> Self {
        let origin_epoch_millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        // quanta reads the CPU's time-stamp counter where it is reliable (and falls back to
        // the OS monotonic clock): a few nanoseconds instead of a clock_gettime call.
        let clock = quanta::Clock::new();
        let origin_raw = clock.raw();
        Self {
            clock,
            origin_raw,
            origin_epoch_millis,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_millis(&self) -> u64 {
        let nanos = self.clock.delta_as_nanos(self.origin_raw, self.clock.raw());
        self.origin_epoch_millis + nanos / 1_000_000
    }

    fn is_injected(&self) -> bool {
        false
    }
}

/// A clock that only moves when told to. Clones share one time.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new(0);
/// let same = clock.clone();
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(same.now_millis(), 1_000);
/// clock.set_millis(42);
/// assert_eq!(same.now_millis(), 42);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `epoch_millis`.
    pub fn new(epoch_millis: u64) -> Self {
        Self {
            millis: Arc::new(AtomicU64::new(epoch_millis)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.millis
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the clock to an absolute time (it may move backwards).
    pub fn set_millis(&self, epoch_millis: u64) {
        self.millis.store(epoch_millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.millis.load(Ordering::SeqCst)
    }

    /// A test clock: stores use its time, not their own.
    fn is_injected(&self) -> bool {
        true
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_millis(&self) -> u64 {
        (**self).now_millis()
    }
    fn is_injected(&self) -> bool {
        (**self).is_injected()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_monotonic_and_close_to_wall_time() {
        let clock = SystemClock::new();
        let a = clock.now_millis();
        let b = clock.now_millis();
        assert!(b >= a);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(wall.abs_diff(a) < 1_000);
        assert!(!clock.is_injected());
    }

    #[test]
    fn manual_clock_is_injected() {
        assert!(ManualClock::new(0).is_injected());
    }

    #[test]
    fn a_custom_clock_is_not_injected_by_default() {
        #[derive(Debug)]
        struct Custom;
        impl Clock for Custom {
            fn now_millis(&self) -> u64 {
                42
            }
        }
        assert!(!Custom.is_injected());
        assert!(!Arc::new(Custom).is_injected());
    }
}
