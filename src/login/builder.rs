//! The guard's settings: rates, names, store, client address source, username secret.

use std::fmt;
use std::sync::Arc;

use super::guard::GuardInner;
use super::{LoginGuard, LoginMode, IP, IP_USER, USER};
use crate::error::ConfigError;
use crate::key::{KeyExtractor, PeerIp};
use crate::limiter::Limiter;
use crate::policy::{Algorithm, Policy, Rate};
use crate::route::Route;
use crate::store::{FailureMode, Store};

/// Builds a [`LoginGuard`]; see [`LoginGuard::builder`].
#[must_use]
pub struct LoginGuardBuilder<S> {
    pub(super) store: Option<S>,
    pub(super) make_store: Option<fn() -> S>,
    pub(super) name: String,
    pub(super) rates: [Rate; 3],
    pub(super) algorithm: Algorithm,
    pub(super) mode: LoginMode,
    pub(super) ip_source: Option<Box<dyn KeyExtractor>>,
    pub(super) username_secret: Option<Box<[u8]>>,
    pub(super) failure_mode: Option<FailureMode>,
}

impl<S: fmt::Debug> fmt::Debug for LoginGuardBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginGuardBuilder")
            .field("store", &self.store)
            .field("name", &self.name)
            .field("rates", &self.rates)
            .field("algorithm", &self.algorithm)
            .field("mode", &self.mode)
            .field("ip_source", &self.ip_source)
            .field("username_secret", &self.username_secret.is_some())
            .field("failure_mode", &self.failure_mode)
            .finish()
    }
}

impl<S> LoginGuardBuilder<S> {
    /// The store (default: a new [`MemoryStore`](crate::store::MemoryStore)). Share one store between instances (e.g.
    /// Redis) so the limits hold across them.
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, store::MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let guard = LoginGuard::builder().store(store.clone()).build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn store<S2: Store>(self, store: S2) -> LoginGuardBuilder<S2> {
        LoginGuardBuilder {
            store: Some(store),
            make_store: None,
            name: self.name,
            rates: self.rates,
            algorithm: self.algorithm,
            mode: self.mode,
            ip_source: self.ip_source,
            username_secret: self.username_secret,
            failure_mode: self.failure_mode,
        }
    }

    /// The prefix of the policy names (default `login`, giving `login.ip-user`, `login.ip`
    /// and `login.user`). Give two guards sharing a store (login, password reset) different
    /// names so their counts stay apart.
    ///
    /// ```
    /// use tollgate::login::LoginGuard;
    ///
    /// let reset = LoginGuard::builder().name("password-reset").build()?;
    /// assert_eq!(reset.policies()[2].name(), "password-reset.user");
    /// assert_eq!(LoginGuard::builder().name("no spaces").build().unwrap_err().field(), "name");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Attempts per (client IP, username) (default 5 per 15 minutes).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_user_rate(Rate::per_hour(10)).build()?;
    /// assert_eq!(guard.policies()[0].limit(), 10);
    /// let err = LoginGuard::builder().ip_user_rate(Rate::per_hour(0)).build().unwrap_err();
    /// assert_eq!(err.field(), "ip_user_rate.limit");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ip_user_rate(mut self, rate: Rate) -> Self {
        self.rates[IP_USER] = rate;
        self
    }

    /// Attempts per client IP, whatever the username (default 50 per 15 minutes).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_rate(Rate::per_hour(100)).build()?;
    /// assert_eq!(guard.policies()[1].limit(), 100);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ip_rate(mut self, rate: Rate) -> Self {
        self.rates[IP] = rate;
        self
    }

    /// Attempts per username, from any client (default 20 per 15 minutes). Its window bounds
    /// how long an attacker can lock a user out; see the [login guide](crate::guide::login).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().user_rate(Rate::per_hour(30)).build()?;
    /// assert_eq!(guard.policies()[2].limit(), 30);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn user_rate(mut self, rate: Rate) -> Self {
        self.rates[USER] = rate;
        self
    }

    /// The algorithm of all three limits (default [`Algorithm::SlidingWindowLog`]: exact, so
    /// a lockout ends exactly one window after the last counted failure; its memory grows
    /// with the limit, which is small for logins).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Algorithm};
    ///
    /// let guard = LoginGuard::builder().algorithm(Algorithm::FixedWindow).build()?;
    /// assert_eq!(guard.policies()[0].algorithm(), Algorithm::FixedWindow);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Which attempts count (default [`LoginMode::FailuresOnly`]).
    ///
    /// See [`LoginMode`] for an example.
    pub fn mode(mut self, mode: LoginMode) -> Self {
        self.mode = mode;
        self
    }

    /// Where the client IP comes from (default [`PeerIp`]). Behind a proxy, use an
    /// extractor that trusts only your proxies' forwarding headers, such as
    /// [`ClientIp`](crate::key::ClientIp).
    ///
    /// ```
    /// use tollgate::key::{ClientIp, TrustedProxies};
    /// use tollgate::login::LoginGuard;
    ///
    /// let guard = LoginGuard::builder()
    ///     .ip_source(ClientIp::new(TrustedProxies::parse(["10.0.0.0/8"])?))
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ip_source(mut self, extractor: impl KeyExtractor) -> Self {
        self.ip_source = Some(Box::new(extractor));
        self
    }

    /// Keys the username digest with `secret`, so store keys cannot be reversed by guessing
    /// usernames. Every instance sharing a store must use the same secret, or their limits
    /// stop adding up; changing it resets every username count.
    ///
    /// ```
    /// use tollgate::{key::Key, login::LoginGuard};
    ///
    /// let plain = LoginGuard::builder().build()?;
    /// let keyed = LoginGuard::builder().username_secret(b"from the secret store").build()?;
    /// let ip = Key::new("ip", "192.0.2.1");
    /// assert_ne!(
    ///     plain.attempt_with_ip_key(ip.clone(), "alice").user_key(),
    ///     keyed.attempt_with_ip_key(ip, "alice").user_key(),
    /// );
    /// assert_eq!(LoginGuard::builder().username_secret(b"").build().unwrap_err().field(), "username_secret");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn username_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.username_secret = Some(secret.as_ref().into());
        self
    }
}

impl<S: Store> LoginGuardBuilder<S> {
    /// What the three limits do while a [`ResilientStore`](crate::store::ResilientStore)'s
    /// store is unavailable, whatever that store's own mode. Unset, they follow the store's
    /// mode ([`Store::failure_mode`]), except that where the store fails open the guard fails
    /// closed (its layer then answers `503`): an outage, which an attacker can cause by
    /// overloading the store, must not open logins to guessing. Set
    /// [`FailureMode::FailOpen`] to keep logins open through an outage knowingly, or
    /// [`FailureMode::LocalFallback`] to keep limiting in process. Only a store that answers
    /// by failure modes reads it: on another, [`build`](Self::build) refuses it.
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, store::{FailureMode, MemoryStore, ResilientStore}};
    ///
    /// let store = ResilientStore::builder(MemoryStore::new(), FailureMode::FailOpen).build()?;
    /// let guard = LoginGuard::builder()
    ///     .store(store)
    ///     .failure_mode(FailureMode::FailClosed)
    ///     .build()?;
    /// # let _ = guard;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn failure_mode(mut self, mode: FailureMode) -> Self {
        self.failure_mode = Some(mode);
        self
    }

    /// Builds the guard.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field: `name`, `ip_user_rate.*`, `ip_rate.*`,
    /// `user_rate.*` (an invalid rate for the algorithm) or `username_secret` (empty).
    ///
    /// ```
    /// use tollgate::{login::LoginGuard, Rate};
    ///
    /// let err = LoginGuard::builder().user_rate(Rate::per_day(200_000)).build().unwrap_err();
    /// assert_eq!(err.field(), "user_rate.limit"); // too many for the sliding window log
    /// ```
    pub fn build(self) -> Result<LoginGuard<S>, ConfigError> {
        if self
            .username_secret
            .as_deref()
            .is_some_and(<[u8]>::is_empty)
        {
            return Err(ConfigError::new(
                "username_secret",
                "\"\"",
                "an empty secret keys nothing; leave it unset instead",
            ));
        }
        let name_ok = (1..=48).contains(&self.name.len())
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !name_ok {
            return Err(ConfigError::new(
                "name",
                format_args!("{:?}", self.name),
                "must be 1-48 ASCII letters, digits, '_', '-' or '.'",
            ));
        }
        if self.algorithm == crate::Algorithm::InFlight {
            return Err(ConfigError::new(
                "algorithm",
                "in_flight",
                "the login guard counts attempts over time: use a rate algorithm (a slot would \
                 never be given back)",
            ));
        }
        // Unset, the guard's limits fail closed where the store fails open: an outage (one an
        // attacker can cause by overloading the store) must not open logins to guessing. A
        // store that falls back locally keeps limiting; one that fails closed does.
        let store_mode = match (&self.store, &self.make_store) {
            (Some(store), _) => store.failure_mode(),
            _ => None,
        };
        let failure_mode = self.failure_mode.or(match store_mode {
            Some(FailureMode::FailOpen) => Some(FailureMode::FailClosed),
            _ => None,
        });
        let build = |suffix: &str, field: &str, rate: Rate| {
            let mut policy = Policy::builder(format!("{}.{suffix}", self.name), rate)
                .algorithm(self.algorithm)
                .sensitive(true);
            if let Some(mode) = failure_mode {
                policy = policy.failure_mode(mode);
            }
            policy.build().map_err(|e| e.within(field))
        };
        let policies = [
            build("ip-user", "ip_user_rate", self.rates[IP_USER])?,
            build("ip", "ip_rate", self.rates[IP])?,
            build("user", "user_rate", self.rates[USER])?,
        ];
        let store = match (self.store, self.make_store) {
            (Some(store), _) => store,
            (None, Some(make)) => make(),
            (None, None) => {
                return Err(ConfigError::new(
                    "store",
                    "none",
                    "a login guard needs a store",
                ));
            }
        };
        let [ip_user, ip, user] = policies;
        let base = Limiter::builder()
            .store(store)
            .extractor(self.ip_source.unwrap_or_else(|| Box::new(PeerIp::new())))
            .policy(ip_user.clone())
            .build()?;
        let ip_limiter = base.for_route(Route::new().policy(ip.clone()))?;
        let user_limiter = base.for_route(Route::new().policy(user.clone()))?;
        Ok(LoginGuard {
            inner: Arc::new(GuardInner {
                limiters: [base, ip_limiter, user_limiter],
                policies: Arc::from([ip_user, ip, user]),
                route: Arc::from(self.name.as_str()),
                metric_keys: crate::telemetry::DecisionKeys::new(3),
                mode: self.mode,
                username_secret: self.username_secret,
            }),
        })
    }
}
