//! [`PolicyBuilder`]: a policy's settings, each checked when it is built.

use std::sync::Arc;
use std::time::Duration;

use super::{
    intern, Algorithm, FailureMode, Limits, Policy, PolicyInner, Rate, MAX_CAPACITY_WINDOW_PRODUCT,
    MAX_LOG_LIMIT, MIN_SLOT_LEASE,
};
use crate::error::ConfigError;

/// Builds a [`Policy`]; see the [module docs](crate::policy) for examples.
#[derive(Debug, Clone)]
#[must_use]
pub struct PolicyBuilder {
    pub(super) name: String,
    pub(super) rate: Rate,
    pub(super) algorithm: Algorithm,
    pub(super) cost: u64,
    pub(super) sensitive: bool,
    pub(super) max_delay: Option<Duration>,
    pub(super) shadow: bool,
    pub(super) penalty: Option<Duration>,
    pub(super) failure_mode: Option<FailureMode>,
}

impl PolicyBuilder {
    /// The algorithm (default: [`Algorithm::SlidingWindowCounter`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The cost of one request (default 1) when nothing else names it. It must not exceed the
    /// capacity. A route's [`cost`](crate::route::Route::cost) or
    /// [`cost_fn`](crate::route::Route::cost_fn) replaces it, and so does the cost given to
    /// [`Limiter::check`](crate::Limiter::check) and its kin (`check(&key, 1)` charges one
    /// unit, not this cost); the layer, [`Limiter::decide`](crate::Limiter::decide) and the
    /// login guard charge it.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Marks the policy sensitive: its 429 carries a generic message and no counts
    /// (`RateLimit-Remaining` and friends are left out). Use it for login and other auth routes.
    pub fn sensitive(mut self, sensitive: bool) -> Self {
        self.sensitive = sensitive;
        self
    }

    /// Shadow mode: the policy's decisions are computed, logged (target `tollgate::shadow`) and
    /// counted ([`Limiter::shadow_counts`](crate::Limiter::shadow_counts)), but it never
    /// rejects and never holds back the route's other policies. Use it to roll out a new limit
    /// safely. Shadow policies cost one extra store call per request.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// A brute-force lockout: once this policy denies a key, the key is refused for
    /// `duration` (whatever the policy's own state says), counted from the denial. Costs one
    /// extra store call per request, and one more when a block starts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Policy, Rate};
    ///
    /// let login = Policy::builder("login", Rate::per_minute(5))
    ///     .penalty(Duration::from_secs(15 * 60))
    ///     .build()?;
    /// assert_eq!(login.penalty(), Some(Duration::from_secs(900)));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn penalty(mut self, duration: Duration) -> Self {
        self.penalty = Some(duration);
        self
    }

    /// What a [`ResilientStore`](crate::store::ResilientStore) does for this policy when its
    /// store is unavailable, overriding the store's own mode. Only a store that answers by
    /// failure modes reads it ([`Store::applies_failure_modes`](crate::store::Store::applies_failure_modes)):
    /// a limiter with such a policy on any other store is refused when built, naming
    /// `policies["<name>"].failure_mode`.
    ///
    /// ```
    /// use tollgate::{store::FailureMode, Policy, Rate};
    ///
    /// let payments = Policy::builder("payments", Rate::per_minute(30))
    ///     .failure_mode(FailureMode::FailClosed)
    ///     .build()?;
    /// assert_eq!(payments.failure_mode(), Some(FailureMode::FailClosed));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn failure_mode(mut self, mode: FailureMode) -> Self {
        self.failure_mode = Some(mode);
        self
    }

    /// Shapes instead of only policing (GCRA only): a request that would be rejected now but
    /// fits within `max_delay` takes the next free slot and is forwarded after waiting for it;
    /// one that would wait longer is rejected. The layer waits; on the direct API the
    /// caller does, for the allowed decision's [`delay`](crate::Decision::delay).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Policy, Rate};
    ///
    /// let smooth = Policy::builder("outbound", Rate::per_second(10).with_burst(1))
    ///     .algorithm(Algorithm::Gcra)
    ///     .shape(Duration::from_millis(500))
    ///     .build()?;
    /// assert_eq!(smooth.max_delay(), Some(Duration::from_millis(500)));
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn shape(mut self, max_delay: Duration) -> Self {
        self.max_delay = Some(max_delay);
        self
    }

    /// The rate's limit, window and burst, for this algorithm: the window in milliseconds and
    /// the capacity (the burst where the algorithm has one, else the limit).
    fn check_rate(&self) -> Result<(u64, u64), ConfigError> {
        let rate = self.rate;
        if rate.limit == 0 {
            return Err(ConfigError::new("limit", 0, "must be at least 1"));
        }
        if rate.window < Duration::from_millis(1) {
            return Err(ConfigError::new(
                "window",
                format_args!("{:?}", rate.window),
                "must be at least 1 ms",
            ));
        }
        if !rate.window.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(ConfigError::new(
                "window",
                format_args!("{:?}", rate.window),
                "must be a whole number of milliseconds",
            ));
        }
        let window_ms = u64::try_from(rate.window.as_millis()).unwrap_or(u64::MAX);
        if let Some(burst) = rate.burst {
            if !self.algorithm.has_burst() {
                return Err(ConfigError::new(
                    "burst",
                    burst,
                    format!(
                        "the {} algorithm has no burst; use token_bucket or gcra, or drop the burst",
                        self.algorithm
                    ),
                ));
            }
            if burst == 0 {
                return Err(ConfigError::new("burst", 0, "must be at least 1"));
            }
        }
        let capacity = if self.algorithm.has_burst() {
            rate.burst.unwrap_or(rate.limit)
        } else {
            rate.limit
        };
        let biggest = capacity.max(rate.limit);
        if biggest
            .checked_mul(window_ms)
            .is_none_or(|p| p > MAX_CAPACITY_WINDOW_PRODUCT)
        {
            let field = if capacity > rate.limit {
                "burst"
            } else {
                "limit"
            };
            return Err(ConfigError::new(
                field,
                biggest,
                format!(
                    "{field} × window ({window_ms} ms) must not exceed 2^50; use a shorter window or a smaller {field}"
                ),
            ));
        }
        if self.algorithm == Algorithm::SlidingWindowLog && rate.limit > MAX_LOG_LIMIT {
            return Err(ConfigError::new(
                "limit",
                rate.limit,
                format!(
                    "the sliding window log keeps one entry per request and accepts at most {MAX_LOG_LIMIT}; use the sliding window counter"
                ),
            ));
        }
        Ok((window_ms, capacity))
    }

    /// The cost: at least 1, at most the capacity.
    fn check_cost(&self, capacity: u64) -> Result<(), ConfigError> {
        if self.cost == 0 {
            return Err(ConfigError::new("cost", 0, "must be at least 1"));
        }
        if self.cost > capacity {
            return Err(ConfigError::new(
                "cost",
                self.cost,
                format!(
                    "must not exceed the capacity ({capacity}); such a request could never pass"
                ),
            ));
        }
        Ok(())
    }

    /// The longest delay of a shaping policy: GCRA only, whole milliseconds, at most an hour.
    fn check_shaping(&self) -> Result<(), ConfigError> {
        let Some(delay) = self.max_delay else {
            return Ok(());
        };
        if self.algorithm != Algorithm::Gcra {
            return Err(ConfigError::new(
                "max_delay",
                format_args!("{delay:?}"),
                format!(
                    "shaping needs the gcra algorithm (leaky bucket), not {}",
                    self.algorithm
                ),
            ));
        }
        if delay < Duration::from_millis(1) || !delay.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(ConfigError::new(
                "max_delay",
                format_args!("{delay:?}"),
                "must be a whole number of milliseconds, at least 1 ms",
            ));
        }
        if (delay.as_millis() as u64).saturating_mul(self.rate.limit) > MAX_CAPACITY_WINDOW_PRODUCT
        {
            return Err(ConfigError::new(
                "max_delay",
                format_args!("{delay:?}"),
                "max_delay in ms × limit must not exceed 2^50",
            ));
        }
        if delay > Duration::from_secs(3_600) {
            return Err(ConfigError::new(
                "max_delay",
                format_args!("{delay:?}"),
                "must not exceed one hour",
            ));
        }
        Ok(())
    }

    /// The penalty: whole milliseconds between 1 ms and 366 days, and not on a shadow policy.
    fn check_penalty(&self) -> Result<(), ConfigError> {
        let Some(penalty) = self.penalty else {
            return Ok(());
        };
        if penalty < Duration::from_millis(1)
            || !penalty.subsec_nanos().is_multiple_of(1_000_000)
            || penalty > Duration::from_secs(366 * 86_400)
        {
            return Err(ConfigError::new(
                "penalty",
                format_args!("{penalty:?}"),
                "must be a whole number of milliseconds between 1 ms and 366 days",
            ));
        }
        if self.shadow {
            return Err(ConfigError::new(
                "penalty",
                format_args!("{penalty:?}"),
                "a shadow policy never rejects, so it cannot block",
            ));
        }
        Ok(())
    }

    /// What an in-flight policy cannot have: each of these would be a setting nothing reads,
    /// or a slot that is never given back.
    fn check_in_flight(&self) -> Result<(), ConfigError> {
        if self.rate.window < MIN_SLOT_LEASE {
            return Err(ConfigError::new(
                "window",
                format_args!("{:?}", self.rate.window),
                format!(
                    "an in_flight policy's window is its slots' lease in a shared store, renewed every third of it while the request runs: at least {} ms, or a renewal can arrive after the slot expired and the limit stops holding",
                    MIN_SLOT_LEASE.as_millis()
                ),
            ));
        }
        if self.cost != 1 {
            return Err(ConfigError::new(
                "cost",
                self.cost,
                "an in_flight policy counts requests in progress: each takes one slot",
            ));
        }
        if self.shadow {
            return Err(ConfigError::new(
                "shadow",
                true,
                "an in_flight policy cannot run in shadow mode (its slots would never be given back)",
            ));
        }
        if let Some(penalty) = self.penalty {
            return Err(ConfigError::new(
                "penalty",
                format_args!("{penalty:?}"),
                "an in_flight policy has no penalty; pair it with a rate policy that has one",
            ));
        }
        Ok(())
    }

    /// Checks every value and builds the policy.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first invalid field: `name`, `limit`, `window`, `burst`,
    /// `cost`, `max_delay`, `penalty`, `shadow` or `failure_mode` (a local fallback of 0
    /// replicas).
    pub fn build(self) -> Result<Policy, ConfigError> {
        validate_name(&self.name)?;
        self.build_derived()
    }

    /// [`build`](Self::build) for a policy the crate derives from one already built (a local
    /// fallback's share, named after its policy with a suffix): every value is checked but
    /// the name, which may exceed the length a user's name is held to.
    pub(crate) fn build_derived(self) -> Result<Policy, ConfigError> {
        let (window_ms, capacity) = self.check_rate()?;
        self.check_cost(capacity)?;
        self.check_shaping()?;
        if self.algorithm == Algorithm::InFlight {
            self.check_in_flight()?;
        }
        self.check_penalty()?;
        if self.failure_mode == Some(FailureMode::LocalFallback { replicas: 0 }) {
            return Err(ConfigError::new(
                "failure_mode",
                "LocalFallback { replicas: 0 }",
                "replicas is how many instances share the limit: at least 1",
            ));
        }
        let rate = self.rate;
        let id = intern(&self.name);
        Ok(Policy {
            inner: Arc::new(PolicyInner {
                name: Arc::from(self.name.as_str()),
                id,
                rate,
                algorithm: self.algorithm,
                cost: self.cost,
                limits: Limits {
                    limit: rate.limit,
                    window_ms,
                    capacity,
                    max_delay_ms: self.max_delay.map_or(0, |d| d.as_millis() as u64),
                },
                sensitive: self.sensitive,
                max_delay: self.max_delay,
                shadow: self.shadow,
                penalty: self.penalty,
                failure_mode: self.failure_mode,
                plan_limits: None,
            }),
        })
    }
}

/// Policy names end up in store keys and header values, so they are kept to a safe alphabet.
fn validate_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new("name", "\"\"", "must not be empty"));
    }
    if name.len() > 64 {
        return Err(ConfigError::new(
            "name",
            format_args!("{name:?}"),
            "must be at most 64 characters",
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(ConfigError::new(
            "name",
            format_args!("{name:?}"),
            "may contain only ASCII letters, digits, '_', '-' and '.'",
        ));
    }
    Ok(())
}
