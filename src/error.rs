//! Error types.

use std::fmt;

/// A configuration mistake, reported when a policy, limiter or layer is built.
///
/// The message names the offending field and the value it had, so a typo in a config file
/// can be found without reading the source.
///
/// # Examples
///
/// ```
/// use tollgate::{Policy, Rate};
///
/// let err = Policy::new("api", Rate::per_second(0)).unwrap_err();
/// assert_eq!(err.field(), "limit");
/// assert!(err.to_string().contains("limit"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    value: String,
    reason: String,
}

impl ConfigError {
    /// A new error for `field`, which had `value`, explaining `reason`.
    pub fn new(
        field: impl Into<String>,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        // Plans and builders hold URLs with passwords (`redis://:secret@host`), and errors
        // reach logs and consoles: no error repeats a URL's credentials.
        Self {
            field: field.into(),
            value: without_credentials(&value.to_string()),
            reason: without_credentials(&reason.into()),
        }
    }

    /// The name of the offending field (for example `limit` or `policies[2].window`).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The offending value, as written.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Why the value was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Prefixes the field with its parent, e.g. `limit` inside policy `login` becomes
    /// `policy "login".limit`.
    pub fn within(mut self, parent: impl fmt::Display) -> Self {
        self.field = format!("{parent}.{}", self.field);
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid `{}` = {}: {}",
            self.field, self.value, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}

/// Why a store could not decide.
///
/// A [`ResilientStore`](crate::store::ResilientStore)'s failure mode turns these into an
/// outcome; without one, the layer answers `503` (a [`Refusal`](crate::Refusal) of kind
/// [`StoreUnavailable`](crate::RefusalKind::StoreUnavailable)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached (connection refused, reset, DNS, pool exhausted).
    Connection(Cause),
    /// The store did not answer in time.
    Timeout,
    /// The store answered with an error (a failing script, a wrong-type key).
    Backend(Cause),
    /// The store answered, but not in the shape tollgate expects.
    Protocol(Cause),
    /// The circuit breaker is open: the store is being skipped for a cool-down.
    CircuitOpen,
    /// The memory store is at its key cap and the new key's shard has nothing expired to
    /// reclaim.
    Capacity,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Connection(m) => write!(f, "rate-limit store unreachable: {m}"),
            StoreError::Timeout => f.write_str("rate-limit store timed out"),
            StoreError::Backend(m) => write!(f, "rate-limit store error: {m}"),
            StoreError::Protocol(m) => write!(f, "unexpected rate-limit store reply: {m}"),
            StoreError::CircuitOpen => f.write_str("rate-limit store circuit is open"),
            StoreError::Capacity => f.write_str("rate-limit store is at its key cap"),
        }
    }
}

impl std::error::Error for StoreError {
    /// The client library's own error (a `redis::RedisError`, a pool error), when there
    /// is one: what [`Cause::with_source`] was given.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Connection(c) | StoreError::Backend(c) | StoreError::Protocol(c) => c
                .source
                .as_deref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

/// What a [`StoreError`] says happened: a message, and the underlying error when one caused
/// it (kept, as hyper's errors keep theirs, so that `source()` reaches the client library's
/// error). Compares by message.
#[derive(Clone)]
pub struct Cause {
    message: String,
    source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

impl Cause {
    /// A cause with `message` and the error behind it.
    ///
    /// ```
    /// use std::error::Error;
    /// use tollgate::{error::Cause, StoreError};
    ///
    /// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    /// let e = StoreError::Connection(Cause::with_source("redis at 10.0.0.5", io));
    /// assert_eq!(e.to_string(), "rate-limit store unreachable: redis at 10.0.0.5");
    /// assert_eq!(e.source().unwrap().to_string(), "refused");
    /// ```
    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            source: Some(std::sync::Arc::new(source)),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{:?} (caused by {source:?})", self.message),
            None => write!(f, "{:?}", self.message),
        }
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for Cause {}

impl From<String> for Cause {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
        }
    }
}

impl From<&str> for Cause {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// Why [`crate::Limiter::check`] gave no decision.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// The request's cost is larger than a policy's capacity: it could never be allowed, so it
    /// is refused outright instead of locking the key out.
    CostExceedsCapacity {
        /// The policy whose capacity is too small.
        policy: String,
        /// The cost asked for.
        cost: u64,
        /// The largest cost the policy can ever allow.
        capacity: u64,
    },
    /// The key is on the limiter's deny list
    /// ([`LimiterBuilder::deny_key`](crate::LimiterBuilder::deny_key),
    /// [`deny_cidr`](crate::LimiterBuilder::deny_cidr)); the layer answers such requests
    /// with `403 Forbidden`.
    Forbidden,
    /// The store failed; see [`StoreError`].
    Store(StoreError),
    /// What was asked is not valid (an [`Override`](crate::Override) of a policy the limiter
    /// does not have, or with a zero limit); the error names the field and the value.
    Invalid(ConfigError),
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::CostExceedsCapacity {
                policy,
                cost,
                capacity,
            } => write!(
                f,
                "cost {cost} exceeds the capacity {capacity} of policy \"{policy}\""
            ),
            CheckError::Forbidden => f.write_str("the key is on the deny list"),
            CheckError::Store(e) => e.fmt(f),
            CheckError::Invalid(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for CheckError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckError::Store(e) => Some(e),
            CheckError::Invalid(e) => Some(e),
            CheckError::CostExceedsCapacity { .. } | CheckError::Forbidden => None,
        }
    }
}

impl From<StoreError> for CheckError {
    fn from(e: StoreError) -> Self {
        CheckError::Store(e)
    }
}

/// `value` with the user and password of any URL in it (`redis://:secret@host`) replaced by
/// `***`.
pub(crate) fn without_credentials(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(scheme) = rest.find("://") {
        let (head, tail) = rest.split_at(scheme + 3);
        out.push_str(head);
        let authority_end = tail.find(['/', '"', ' ', ',']).unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(at) => {
                out.push_str("***");
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}
