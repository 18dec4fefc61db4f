//! Rates, algorithms and named policies.
//!
//! A [`Rate`] says how much: `limit` units per `window`, plus a burst capacity for the
//! algorithms that have one. A [`Policy`] gives a rate a name and an [`Algorithm`]; the name is
//! what headers and stores use, so two routes that name the same policy share its quota.
//!
//! Every value is checked when the policy is built: a zero limit, a zero or sub-millisecond
//! window, a cost above the capacity, or a burst on an algorithm without one is a
//! [`ConfigError`] naming the field.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Algorithm, Policy, Rate};
//!
//! // 100 requests per minute, sliding window counter (the default algorithm).
//! let api = Policy::new("api", Rate::per_minute(100))?;
//! assert_eq!(api.capacity(), 100);
//!
//! // A token bucket refilling 10 tokens per second that holds at most 50; each call costs 5.
//! let llm = Policy::builder("llm", Rate::per_second(10).with_burst(50))
//!     .algorithm(Algorithm::TokenBucket)
//!     .cost(5)
//!     .build()?;
//! assert_eq!(llm.capacity(), 50);
//!
//! // Mistakes are caught at build time, naming the field.
//! let err = Policy::builder("login", Rate::per_minute(5)).cost(6).build().unwrap_err();
//! assert_eq!(err.field(), "cost");
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

mod builder;
mod limits;
mod rate;

pub use builder::PolicyBuilder;
#[cfg(feature = "redis")]
pub(crate) use limits::shaping_slack;
pub use limits::Limits;
pub use rate::Rate;

use crate::error::ConfigError;

/// The largest `capacity × window-in-milliseconds` a policy may have (2^50).
///
/// Every algorithm does exact integer arithmetic on values up to a few times this product, in
/// Rust and in the Redis Lua scripts alike; Lua numbers are doubles, exact only up to 2^53.
/// That still allows, for example, 13 million per day or 300 000 per second.
pub const MAX_CAPACITY_WINDOW_PRODUCT: u64 = 1 << 50;

/// How long a slot of an [in-flight](Policy::in_flight) policy held in a shared store lasts
/// without a refresh: slots held by an instance that crashed come back this long after its
/// last refresh. A holder refreshes every third of it.
pub const DEFAULT_SLOT_LEASE: Duration = Duration::from_secs(30);

/// The shortest lease of an [in-flight](Algorithm::InFlight) policy's slots (its window): a
/// held slot is renewed every third of its lease, and a renewal (a timer tick and a round
/// trip to the store) must arrive before the slot expires; on loopback, leases under about
/// 8 ms let slots expire while held and the limit stopped holding. A shorter window is
/// refused when the policy is built.
pub const MIN_SLOT_LEASE: Duration = Duration::from_millis(100);

/// The largest limit the sliding window log accepts: it keeps one entry per admitted request.
pub const MAX_LOG_LIMIT: u64 = 100_000;

/// Which algorithm decides.
///
/// | algorithm | memory per key | exact? | bursts |
/// |---|---|---|---|
/// | [`SlidingWindowCounter`](Algorithm::SlidingWindowCounter) (default) | O(1) | approximate, bounded | no 2× at window flips |
/// | [`SlidingWindowLog`](Algorithm::SlidingWindowLog) | O(limit) | exact | none |
/// | [`TokenBucket`](Algorithm::TokenBucket) | O(1) | exact | up to the capacity |
/// | [`FixedWindow`](Algorithm::FixedWindow) | O(1) | exact per window | **2× around a window flip** |
/// | [`Gcra`](Algorithm::Gcra) | O(1) | exact | up to the burst; can shape |
/// | [`InFlight`](Algorithm::InFlight) | O(1) (Redis: one entry per slot) | exact | counts requests in progress, not arrivals |
///
/// Each variant's module in [`crate::algorithm`] documents what `remaining`, `reset_after` and
/// `retry_after` mean for it and its accuracy bound.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Algorithm {
    /// Two adjacent fixed windows, the previous one weighted by how much of it still overlaps
    /// the sliding window. See [`crate::algorithm::sliding_window_counter`].
    #[default]
    SlidingWindowCounter,
    /// Every admitted request's timestamp, exact. See [`crate::algorithm::sliding_window_log`].
    SlidingWindowLog,
    /// A bucket of `capacity` tokens refilled at `limit` per `window`.
    /// See [`crate::algorithm::token_bucket`].
    TokenBucket,
    /// A counter per fixed, epoch-aligned window. See [`crate::algorithm::fixed_window`].
    FixedWindow,
    /// The generic cell rate algorithm: a leaky bucket as a meter.
    /// See [`crate::algorithm::gcra`].
    Gcra,
    /// Not a rate: at most `limit` requests of a key in progress at once; the window is the
    /// slot lease of shared stores. Build one with [`Policy::in_flight`]. See
    /// [`crate::algorithm::in_flight`].
    InFlight,
}

impl Algorithm {
    /// Every algorithm, in a fixed order: for tests, benchmarks and anything that must cover
    /// them all (a store forgetting every state of a key).
    ///
    /// ```
    /// use tollgate::Algorithm;
    ///
    /// assert_eq!(Algorithm::ALL.len(), 6);
    /// assert!(Algorithm::ALL.contains(&Algorithm::default()));
    /// ```
    pub const ALL: [Algorithm; 6] = [
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
        Algorithm::InFlight,
    ];

    /// The rate algorithms: [`ALL`](Self::ALL) but [`InFlight`](Algorithm::InFlight).
    pub const RATES: [Algorithm; 5] = [
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ];

    /// The stable short name used in Redis keys, config files and logs.
    pub const fn as_str(&self) -> &'static str {
        match self {
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Gcra => "gcra",
            Algorithm::InFlight => "in_flight",
        }
    }

    /// Whether the algorithm has a burst capacity separate from its limit.
    pub const fn has_burst(&self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`ResilientStore`](crate::store::ResilientStore) does when its store cannot
/// decide, for all policies or (with [`PolicyBuilder::failure_mode`]) for one. It lives here,
/// beside the policies that name it, so that policies do not depend on the stores; it is also
/// `tollgate::store::FailureMode`. See the [`resilient` module docs](crate::store::resilient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureMode {
    /// Allow the request.
    FailOpen,
    /// Refuse it; the layer answers `503 Service Unavailable` with `Retry-After`.
    FailClosed,
    /// Decide with an in-memory limiter on this instance, each policy's limit (and burst)
    /// divided by `replicas` (rounded up, at least 1). A request costing more than that
    /// share is admitted only while the instance's share is untouched, and the rest of its
    /// cost is a debt the instance pays back at its share's rate before it admits again.
    LocalFallback {
        /// How many instances share the limit normally (at least 1: 0 is refused when the
        /// store or policy is built).
        replicas: u32,
    },
}

/// A named rate with an algorithm: the unit that stores keep state for.
///
/// Cheap to clone. Build one with [`Policy::new`] (the sliding window counter, a cost of 1)
/// or [`Policy::builder`]; every mistake fails at build, naming the field and the value.
///
/// ```
/// use tollgate::{Algorithm, Policy, Rate};
///
/// let api = Policy::new("api", Rate::per_minute(1000))?;
/// assert_eq!((api.name(), api.limit()), ("api", 1000));
///
/// let uploads = Policy::builder("uploads", Rate::per_hour(100).with_burst(10))
///     .algorithm(Algorithm::TokenBucket)
///     .cost(5)
///     .build()?;
/// assert_eq!(uploads.capacity(), 10);
///
/// let err = Policy::new("broken", Rate::per_minute(0)).unwrap_err();
/// assert_eq!(err.field(), "limit");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Policy {
    inner: Arc<PolicyInner>,
}

#[derive(Debug)]
struct PolicyInner {
    name: Arc<str>,
    id: u32,
    rate: Rate,
    algorithm: Algorithm,
    cost: u64,
    limits: Limits,
    sensitive: bool,
    max_delay: Option<Duration>,
    shadow: bool,
    penalty: Option<Duration>,
    failure_mode: Option<FailureMode>,
    /// For a per-key override's policy ([`Policy::with_limit`]), the limits of the plan's
    /// policy it overrides.
    plan_limits: Option<Limits>,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.inner.name)
            .field("rate", &self.inner.rate)
            .field("algorithm", &self.inner.algorithm)
            .field("cost", &self.inner.cost)
            .field("sensitive", &self.inner.sensitive)
            .field("max_delay", &self.inner.max_delay)
            .field("shadow", &self.inner.shadow)
            .field("penalty", &self.inner.penalty)
            .finish()
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
            || (self.inner.name == other.inner.name
                && self.inner.rate == other.inner.rate
                && self.inner.algorithm == other.inner.algorithm
                && self.inner.cost == other.inner.cost
                && self.inner.sensitive == other.inner.sensitive
                && self.inner.max_delay == other.inner.max_delay
                && self.inner.shadow == other.inner.shadow
                && self.inner.penalty == other.inner.penalty
                && self.inner.failure_mode == other.inner.failure_mode)
    }
}

impl Eq for Policy {}

impl Policy {
    /// A policy with the default algorithm (sliding window counter) and cost 1.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when the name or rate is invalid.
    pub fn new(name: impl Into<String>, rate: Rate) -> Result<Self, ConfigError> {
        Self::builder(name, rate).build()
    }

    /// At most `max` requests of a key in progress at once (a concurrency limit), with the
    /// default slot lease ([`DEFAULT_SLOT_LEASE`]). A request takes its slot when admitted and
    /// gives it back when its response has been sent or dropped; see
    /// [`crate::algorithm::in_flight`]. Put it on a route beside rate policies: a request
    /// refused by either takes nothing from the other.
    ///
    /// A response that switches protocols (a WebSocket's `101`, an HTTP/2 extended
    /// `CONNECT`) has an empty body that the server drops as soon as the head is sent, so
    /// through the layer the slot is given back then: on such a route the policy limits
    /// handshakes in progress, not open sockets. To limit open sockets, take a
    /// [`Permit`](crate::Permit) with [`Limiter::acquire`](crate::Limiter::acquire) in the
    /// handler and move it into the socket's task, which gives it back when the socket ends.
    ///
    /// For another lease (how long a slot held in Redis by an instance that crashed stays
    /// taken), build it as `Policy::builder(name, Rate::new(max, lease)).algorithm(Algorithm::InFlight)`.
    ///
    /// ```
    /// use tollgate::{Algorithm, Policy};
    ///
    /// let uploads = Policy::in_flight("uploads", 20)?;
    /// assert_eq!(uploads.algorithm(), Algorithm::InFlight);
    /// assert_eq!(uploads.limit(), 20);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when the name is invalid or `max` is 0.
    pub fn in_flight(name: impl Into<String>, max: u64) -> Result<Self, ConfigError> {
        Self::builder(name, Rate::new(max, DEFAULT_SLOT_LEASE))
            .algorithm(Algorithm::InFlight)
            .build()
    }

    /// Whether the policy limits requests in progress rather than a rate.
    pub fn is_in_flight(&self) -> bool {
        self.inner.algorithm == Algorithm::InFlight
    }

    /// A builder for the other settings.
    pub fn builder(name: impl Into<String>, rate: Rate) -> PolicyBuilder {
        PolicyBuilder {
            name: name.into(),
            rate,
            algorithm: Algorithm::default(),
            cost: 1,
            sensitive: false,
            max_delay: None,
            shadow: false,
            penalty: None,
            failure_mode: None,
        }
    }

    /// The policy's name, as it appears in headers and store keys.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The name, shared (for metric labels and [`RateLimitInfo`](crate::RateLimitInfo)).
    pub(crate) fn shared_name(&self) -> &Arc<str> {
        &self.inner.name
    }

    /// A process-wide number for the name: policies with the same name share an id.
    pub(crate) fn id(&self) -> u32 {
        self.inner.id
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        self.inner.rate
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// The default cost of one request.
    pub fn cost(&self) -> u64 {
        self.inner.cost
    }

    /// The largest cost a single request can ever be allowed: the burst for the token bucket
    /// and GCRA, the limit for the window algorithms.
    pub fn capacity(&self) -> u64 {
        self.inner.limits.capacity
    }

    /// `limit` (units per window).
    pub fn limit(&self) -> u64 {
        self.inner.rate.limit
    }

    /// The window in milliseconds.
    pub fn window_millis(&self) -> u64 {
        self.inner.limits.window_ms
    }

    /// The numbers the [algorithms](crate::algorithm) decide with (limit, window, capacity,
    /// longest delay). See [`Limits`] for an example.
    #[inline]
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Whether rejections must not reveal counts (login and other auth endpoints).
    pub fn is_sensitive(&self) -> bool {
        self.inner.sensitive
    }

    /// For shaping GCRA policies: the longest a request may be delayed instead of rejected.
    pub fn max_delay(&self) -> Option<Duration> {
        self.inner.max_delay
    }

    /// Whether the policy only observes (shadow mode): its decisions are computed, logged
    /// and counted, but it never rejects.
    pub fn is_shadow(&self) -> bool {
        self.inner.shadow
    }

    /// How long a key is blocked after this policy denies it, if a penalty is set.
    pub fn penalty(&self) -> Option<Duration> {
        self.inner.penalty
    }

    /// The hidden policy that records a penalty block: one unit per penalty duration, so a
    /// charge blocks the key for exactly that long.
    pub(crate) fn penalty_policy(&self) -> Option<Policy> {
        let penalty = self.inner.penalty?;
        let name = format!("{}~penalty", self.inner.name);
        let window_ms = penalty.as_millis() as u64;
        Some(Policy {
            inner: Arc::new(PolicyInner {
                id: intern(&name),
                name: Arc::from(name.as_str()),
                rate: Rate::new(1, penalty).with_burst(1),
                algorithm: Algorithm::Gcra,
                cost: 1,
                limits: Limits {
                    limit: 1,
                    window_ms,
                    capacity: 1,
                    max_delay_ms: 0,
                },
                sensitive: self.inner.sensitive,
                max_delay: None,
                shadow: false,
                penalty: None,
                failure_mode: self.inner.failure_mode,
                plan_limits: None,
            }),
        })
    }

    /// The policy's own failure mode, if it overrides the store's.
    pub fn failure_mode(&self) -> Option<FailureMode> {
        self.inner.failure_mode
    }

    /// The same policy (name, algorithm, window, cost, every setting) with another limit and
    /// burst: what a per-key [override](crate::Override) applies. Checked like any policy.
    pub(crate) fn with_limit(&self, limit: u64, burst: Option<u64>) -> Result<Policy, ConfigError> {
        // Without a burst of its own, the override's capacity is its limit.
        let mut rate = Rate::new(limit, self.inner.rate.window);
        if let Some(b) = burst {
            rate = rate.with_burst(b);
        }
        let mut b = Policy::builder(self.name(), rate)
            .algorithm(self.inner.algorithm)
            .cost(self.inner.cost)
            .sensitive(self.inner.sensitive)
            .shadow(self.inner.shadow);
        if let Some(d) = self.inner.max_delay {
            b = b.shape(d);
        }
        if let Some(p) = self.inner.penalty {
            b = b.penalty(p);
        }
        if let Some(m) = self.inner.failure_mode {
            b = b.failure_mode(m);
        }
        // The name is the overridden policy's (a local fallback's share may pass the length a
        // user's name is held to); every value is checked.
        let mut overriding = b.build_derived()?;
        if let Some(inner) = Arc::get_mut(&mut overriding.inner) {
            inner.plan_limits = Some(self.plan_limits());
        }
        Ok(overriding)
    }

    /// The limits of the plan's policy: for a per-key override's policy
    /// ([`with_limit`](Self::with_limit)) those of the policy it overrides, otherwise its own.
    /// A store that changes the rate a state is read under (a token bucket's, when an override
    /// is set or removed) brings the state up to date under the rate in force before.
    pub(crate) fn plan_limits(&self) -> Limits {
        self.inner.plan_limits.unwrap_or(self.inner.limits)
    }
}

fn intern(name: &str) -> u32 {
    static NAMES: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let next = names.len() as u32;
    *names.entry(name.to_owned()).or_insert(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_constructors_mean_n_per_unit() {
        assert_eq!(Rate::per_second(3).window(), Duration::from_secs(1));
        assert_eq!(Rate::per_minute(3).window(), Duration::from_secs(60));
        assert_eq!(Rate::per_hour(3).window(), Duration::from_secs(3600));
        assert_eq!(Rate::per_day(3).window(), Duration::from_secs(86400));
        assert_eq!(Rate::per_day(3).limit(), 3);
        assert_eq!(Rate::per_minute(100).to_string(), "100 per minute");
        assert_eq!(
            Rate::new(5, Duration::from_secs(10)).to_string(),
            "5 per 10 seconds"
        );
    }

    #[test]
    fn invalid_values_name_their_field() {
        let cases: Vec<(PolicyBuilder, &str)> = vec![
            (Policy::builder("p", Rate::per_second(0)), "limit"),
            (Policy::builder("p", Rate::new(1, Duration::ZERO)), "window"),
            (
                Policy::builder("p", Rate::new(1, Duration::from_micros(999))),
                "window",
            ),
            (
                Policy::builder("p", Rate::new(1, Duration::from_micros(1500))),
                "window",
            ),
            (Policy::builder("p", Rate::per_second(5)).cost(6), "cost"),
            (Policy::builder("p", Rate::per_second(5)).cost(0), "cost"),
            (
                Policy::builder("p", Rate::per_second(5).with_burst(2)),
                "burst",
            ),
            (
                Policy::builder("p", Rate::per_second(5).with_burst(0)).algorithm(Algorithm::Gcra),
                "burst",
            ),
            (
                Policy::builder("p", Rate::per_second(5).with_burst(2))
                    .algorithm(Algorithm::TokenBucket)
                    .cost(3),
                "cost",
            ),
            (
                Policy::builder("p", Rate::per_second(5)).shape(Duration::from_secs(1)),
                "max_delay",
            ),
            (Policy::builder("", Rate::per_second(5)), "name"),
            (Policy::builder("a b", Rate::per_second(5)), "name"),
            (Policy::builder("{x}", Rate::per_second(5)), "name"),
            (Policy::builder("p", Rate::per_day(u64::MAX)), "limit"),
            (
                Policy::builder("p", Rate::per_second(200_000))
                    .algorithm(Algorithm::SlidingWindowLog),
                "limit",
            ),
        ];
        for (builder, field) in cases {
            let dbg = format!("{builder:?}");
            let err = builder.build().expect_err(&dbg);
            assert_eq!(err.field(), field, "{dbg}: {err}");
            assert!(err.to_string().contains(field));
        }
    }

    #[test]
    fn capacity_is_burst_for_buckets_and_limit_for_windows() {
        let p = Policy::builder("b", Rate::per_second(5).with_burst(20))
            .algorithm(Algorithm::TokenBucket)
            .build()
            .unwrap();
        assert_eq!(p.capacity(), 20);
        let p = Policy::new("w", Rate::per_second(5)).unwrap();
        assert_eq!(p.capacity(), 5);
        assert_eq!(p.algorithm(), Algorithm::SlidingWindowCounter);
    }

    #[test]
    fn same_name_same_id() {
        let a = Policy::new("shared-name", Rate::per_second(5)).unwrap();
        let b = Policy::new("shared-name", Rate::per_minute(5)).unwrap();
        let c = Policy::new("other-name", Rate::per_minute(5)).unwrap();
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), c.id());
    }
}
