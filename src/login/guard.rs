//! The guard: one attempt's three keys, checked and recorded on three limiters.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use smallvec::SmallVec;

use super::{normalise_username, LoginDecision, LoginGuardBuilder, LoginMode, IP, IP_USER, USER};
use crate::decision::{DecidedBy, Decision};
use crate::error::CheckError;
use crate::key::{Key, RequestView};
use crate::limiter::Limiter;
use crate::limiter::{Asker, Charge};
use crate::policy::{Algorithm, Policy, Rate};
use crate::store::{MemoryStore, Store};

/// Limits login attempts per (client IP, username), per client IP and per username at once.
///
/// Cheap to clone (clones share state). See the [module docs](crate::login) for examples
/// and the [login guide](crate::guide::login) for the trade-offs.
///
/// ```
/// use tollgate::login::LoginGuard;
///
/// let guard = LoginGuard::builder().build()?;
/// assert_eq!(guard.policies()[0].name(), "login.ip-user");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
pub struct LoginGuard<S = MemoryStore> {
    pub(super) inner: Arc<GuardInner<S>>,
}

pub(super) struct GuardInner<S> {
    /// One limiter per tuple, (IP, username), IP, username — in that order everywhere —
    /// sharing one store and the IP source: every attempt is decided by the limiter's one
    /// decision path.
    pub(super) limiters: [Limiter<S>; 3],
    /// The three limiters' policies, in the same order.
    pub(super) policies: Arc<[Policy]>,
    /// The `route` label of the attempt's one recorded decision: the guard's name.
    pub(super) route: Arc<str>,
    pub(super) metric_keys: crate::telemetry::DecisionKeys,
    pub(super) mode: LoginMode,
    pub(super) username_secret: Option<Box<[u8]>>,
}

impl<S> Clone for LoginGuard<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for LoginGuard<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginGuard")
            .field("limiter", &self.inner.limiters[IP_USER])
            .field("policies", &self.inner.policies)
            .field("mode", &self.inner.mode)
            .field("username_secret", &self.inner.username_secret.is_some())
            .finish()
    }
}

impl LoginGuard<MemoryStore> {
    /// A builder with the defaults: a fresh [`MemoryStore`], [`PeerIp`](crate::key::PeerIp), failures only, and
    /// 5 / 50 / 20 failures per 15 minutes for (IP, username) / IP / username.
    ///
    /// ```
    /// use tollgate::login::LoginGuard;
    ///
    /// let guard = LoginGuard::builder().build()?;
    /// assert_eq!(guard.policies()[1].limit(), 50);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn builder() -> LoginGuardBuilder<MemoryStore> {
        const WINDOW: Duration = Duration::from_secs(15 * 60);
        LoginGuardBuilder {
            store: None,
            make_store: Some(MemoryStore::new),
            name: "login".to_owned(),
            rates: [
                Rate::new(5, WINDOW),
                Rate::new(50, WINDOW),
                Rate::new(20, WINDOW),
            ],
            algorithm: Algorithm::SlidingWindowLog,
            mode: LoginMode::default(),
            ip_source: None,
            username_secret: None,
            failure_mode: None,
        }
    }
}

/// One login attempt's three keys, made by [`LoginGuard::attempt`].
///
/// ```
/// use tollgate::key::Key;
/// use tollgate::login::LoginGuard;
///
/// let guard = LoginGuard::builder().build()?;
/// let a = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "Alice");
/// let b = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "  alice");
/// assert_eq!(a, b);
/// assert!(a.ip_key().as_str().starts_with("login-ip:"));
/// assert!(!a.user_key().as_str().contains("alice")); // hashed
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LoginAttempt {
    keys: [Key; 3],
    /// Per limit, what its charge by [`LoginGuard::check`] may give back: 0 when nothing
    /// took it (not checked, refused, or let through by a failure mode), else 1 + the
    /// limiter's reset moment read before the charge, shifted left by one, with the low bit
    /// set when the local fallback took it rather than the store. A refund of a charge
    /// nothing took, or that a reset (an unlock) may have erased, would come off other
    /// attempts' counts. Shared by clones.
    charges: Arc<[AtomicU64; 3]>,
}

/// Two attempts are the same attempt when they name the same keys.
impl PartialEq for LoginAttempt {
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys
    }
}

impl Eq for LoginAttempt {}

impl std::hash::Hash for LoginAttempt {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.keys.hash(state);
    }
}

impl LoginAttempt {
    /// The (client IP, username) key.
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn ip_user_key(&self) -> &Key {
        &self.keys[IP_USER]
    }

    /// The client IP key.
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn ip_key(&self) -> &Key {
        &self.keys[IP]
    }

    /// The username key.
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn user_key(&self) -> &Key {
        &self.keys[USER]
    }
}

impl<S: Store> LoginGuard<S> {
    /// The three policies: (IP, username), IP, username.
    ///
    /// See [`LoginGuard`] and [`LoginMode`] for examples.
    pub fn policies(&self) -> &[Policy] {
        &self.inner.policies
    }

    /// The counting mode.
    ///
    /// See [`LoginGuard`] and [`LoginMode`] for examples.
    pub fn mode(&self) -> LoginMode {
        self.inner.mode
    }

    /// The store.
    ///
    /// See [`LoginGuard`] and [`LoginMode`] for examples.
    pub fn store(&self) -> &S {
        self.inner.limiters[IP_USER].store()
    }

    /// The login keys refused most often lately, the most refused first, at most `n`: the
    /// guard's own count, kept as [`Limiter::top_refused`](crate::Limiter::top_refused) keeps
    /// a limiter's (the guard's limits are not a limiter's, so its refusals are not in that
    /// limiter's list, nor in the admin API's `GET /top`). Each key is shown as a prefix and a
    /// digest: `login-user:…` is a username under attack, `login-ip:…` a client guessing.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().user_rate(Rate::per_hour(1)).build()?;
    /// for from in ["192.0.2.1", "192.0.2.2"] {
    ///     let attempt = guard.attempt_with_ip_key(Key::new("ip", from), "alice");
    ///     let decision = guard.check(&attempt).await?;
    ///     if decision.is_allowed() {
    ///         guard.record_failure(&attempt).await?;
    ///     }
    /// }
    /// let top = guard.top_refused(10);
    /// assert!(top[0].key.starts_with("login-user:"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn top_refused(&self, n: usize) -> Vec<crate::RefusedKey> {
        self.inner.limiters[IP_USER].top_refused(n)
    }

    /// The attempt of `username` from the client of `request`, or `None` when the IP source
    /// finds no client address (with [`PeerIp`](crate::key::PeerIp) and axum: serve the app with
    /// `into_make_service_with_connect_info::<SocketAddr>()`).
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use tollgate::key::RequestView;
    /// use tollgate::login::LoginGuard;
    ///
    /// let guard = LoginGuard::builder().build()?;
    /// let mut req = http::Request::new(());
    /// assert!(guard.attempt(&RequestView::new(&req), "alice").is_none());
    /// req.extensions_mut().insert("192.0.2.7:5555".parse::<SocketAddr>().unwrap());
    /// let attempt = guard.attempt(&RequestView::new(&req), "alice").unwrap();
    /// assert_eq!(attempt.ip_key().as_str(), "login-ip:ip:192.0.2.7");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn attempt(&self, request: &RequestView<'_>, username: &str) -> Option<LoginAttempt> {
        let ip = self.inner.limiters[IP].key_for(request)?;
        Some(self.attempt_with_ip_key(ip, username))
    }

    /// The attempt of `username` from the client whose IP key is `ip` (for logins that do not
    /// arrive as HTTP requests). Use the same key form as the IP source, e.g.
    /// `Key::new("ip", "192.0.2.7")` for [`PeerIp`](crate::key::PeerIp).
    ///
    /// See [`LoginAttempt`] for an example.
    pub fn attempt_with_ip_key(&self, ip: Key, username: &str) -> LoginAttempt {
        let user = self.username_digest(username);
        let mut ip_user = Vec::with_capacity(user.len() + ip.as_str().len());
        // The digest has a fixed length, so this concatenation is injective.
        ip_user.extend_from_slice(&user);
        ip_user.extend_from_slice(ip.as_str().as_bytes());
        LoginAttempt {
            keys: [
                Key::new("login-ip+user", &ip_user),
                client_key(&ip),
                Key::new("login-user", user),
            ],
            charges: Arc::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    /// 128 bits of SHA-256 over the normalised username (keyed when a secret is set), in hex.
    fn username_digest(&self, username: &str) -> [u8; 32] {
        let normalised = normalise_username(username);
        let mut h = Sha256::new();
        h.update(b"tollgate login username\0");
        if let Some(secret) = &self.inner.username_secret {
            h.update((secret.len() as u64).to_be_bytes());
            h.update(secret);
        }
        h.update(normalised.as_bytes());
        crate::key::hex_128(&h.finalize())
    }

    /// Whether the attempt may go ahead. An allowed attempt is charged to all three limits,
    /// in both modes: it holds its place before the password is verified, so attempts beyond
    /// a limit never reach verification however many arrive at once. A refused attempt is
    /// charged to none (the limits charged before the refusing one are refunded). In
    /// [`LoginMode::FailuresOnly`] the charge is a reservation, refunded by
    /// [`record_success`](Self::record_success); an attempt that is never recorded keeps it,
    /// like a failure.
    ///
    /// Call it once per attempt, before verifying the password, and record the outcome once.
    ///
    /// See the [module docs](crate::login) for an example.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails; refuse the login then (fail closed).
    pub async fn check(&self, attempt: &LoginAttempt) -> Result<LoginDecision, CheckError> {
        // Three keys cannot be charged atomically in every store, so they are charged one by
        // one and a refusal refunds the ones before it. Meanwhile a concurrent attempt may
        // find a limit holding this attempt's charge and be refused: a race errs on the side
        // of refusing, never of verifying more passwords than the limits allow.
        let limiters = &self.inner.limiters;
        let mut decisions = Vec::with_capacity(3);
        // How the attempt was decided: by a failure mode if any of its limits was.
        let mut outcome = DecidedBy::Decided;
        for (i, (key, limiter)) in attempt.keys.iter().zip(limiters).enumerate() {
            let cost = self.inner.policies[i].cost();
            let resets = limiter.resets_seen();
            let d = match limiter.check_as(Asker::Guard, key, cost).await {
                Ok(d) => d,
                Err(e) => {
                    self.refund(attempt, 0..i).await;
                    return Err(e);
                }
            };
            let refused = !d.is_allowed();
            let mark = match limiter.charge_of(&d, resets) {
                _ if refused => 0,
                Charge::Store(seen) => seen.saturating_add(1) << 1,
                Charge::Fallback(seen) => (seen.saturating_add(1) << 1) | 1,
                Charge::Nowhere => 0,
            };
            attempt.charges[i].store(mark, Ordering::Release);
            outcome = most_degraded(outcome, d.decided_by());
            decisions.extend(d.policies().first().cloned());
            if refused {
                self.refund(attempt, 0..i).await;
                // The limits after the refusing one, as they stand, so that `retry_after`
                // covers every exhausted limit. They only inform: the refusal stands as
                // decided, so a look that fails, or that a failure mode answers (which says
                // nothing of the limit), ends the looking rather than turning an earned
                // lockout into an error or a 503.
                for (key, limiter) in attempt.keys.iter().zip(limiters).skip(i + 1) {
                    let informs = |d: &Decision| {
                        matches!(
                            d.decided_by(),
                            DecidedBy::Decided | DecidedBy::CachedDeny | DecidedBy::Fallback
                        )
                    };
                    match limiter.peek(key).await {
                        Ok(d) if informs(&d) && d.policies().len() == 1 => {
                            decisions.extend(d.policies().first().cloned());
                        }
                        _ => break,
                    }
                }
                break;
            }
        }
        let decision = Decision::from_policies(decisions).with_decided_by(outcome);
        self.record(attempt, &decision);
        Ok(self.decision(decision))
    }

    /// Records an attempt's one decision (each of the three limits' checks records none):
    /// one `tollgate_decisions_total` under the guard's name as the route and the governing
    /// limit as the policy, and the decision on the current span, keyed by the client IP
    /// (the key a refusal is logged with).
    fn record(&self, attempt: &LoginAttempt, decision: &Decision) {
        let inner = &self.inner;
        let store = inner.limiters[IP_USER].store().name();
        crate::telemetry::decision(
            decision,
            store,
            &inner.policies,
            &inner.route,
            &inner.metric_keys,
        );
        if let Some(span) = crate::telemetry::current_span() {
            let key = crate::telemetry::span_takes_key(&span)
                .then(|| crate::key::digest(&attempt.keys[IP]));
            let policy = inner
                .policies
                .get(decision.governing_index())
                .map(Policy::name);
            crate::telemetry::span_decision(&span, key.as_deref(), policy, Some(decision), None);
        }
    }

    /// Records a wrong password. The attempt was charged by [`check`](Self::check), so this
    /// changes nothing, in either mode: a failure keeps the charge, exactly like an attempt
    /// that is never recorded. It is kept so that handlers state every outcome.
    ///
    /// See the [module docs](crate::login) for an example.
    ///
    /// # Errors
    ///
    /// None today; the `Result` keeps room for stores that record failures.
    pub async fn record_failure(&self, attempt: &LoginAttempt) -> Result<(), CheckError> {
        let _ = attempt;
        Ok(())
    }

    /// Records a successful login: clears the (IP, username) tuple, so a user who mistyped
    /// a few times starts afresh. In [`LoginMode::FailuresOnly`] it also refunds the IP and
    /// username limits the attempt's [`check`](Self::check) charged, so successes are never
    /// counted against them (a busy office behind one NAT address does not use up its IP
    /// limit by logging in); the failures before it keep their counts (clearing them would
    /// let an attacker who owns one account reset their spraying budget). In
    /// [`LoginMode::EveryAttempt`] the IP and username limits keep the charge.
    ///
    /// Call it once per checked attempt: each call refunds one attempt's units, once (a
    /// second call refunds nothing). The refunds are made once the future is first polled,
    /// whether or not it is awaited to its end; the tuple is cleared only by a future
    /// awaited to its end ([`LoginLayer`](crate::login::LoginLayer) records in a task of its
    /// own, so a client that hangs up does not cut it short). Nothing is refunded for a limit whose charge the store
    /// did not take (a failure mode admitted the attempt while the store was down), nor
    /// after an [`unlock_user`](Self::unlock_user) or other reset of its key since the
    /// check: the refund would come off the failures counted since.
    ///
    /// See the [module docs](crate::login) for an example.
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails (the attempt then keeps its charge).
    pub async fn record_success(&self, attempt: &LoginAttempt) -> Result<(), CheckError> {
        // Both refunds are made whether or not they are awaited (each is finished if
        // dropped): a caller that stops waiting (a client that hangs up) leaves none of them
        // unmade.
        let refunds = if self.inner.mode == LoginMode::FailuresOnly {
            [self.refund_one(attempt, IP), self.refund_one(attempt, USER)]
        } else {
            [None, None]
        };
        let reset = self.inner.limiters[IP_USER]
            .reset(&attempt.keys[IP_USER])
            .await;
        let mut refunded = Ok(());
        for call in refunds.into_iter().flatten() {
            refunded = refunded.and(call.await);
        }
        refunded.and(reset)
    }

    /// Refunds the tuples `which` (charged by this attempt's `check` before it failed or
    /// was refused), each made whether or not it is awaited. A store that fails here
    /// leaves the charge, which errs on the side of counting; it is logged.
    async fn refund(&self, attempt: &LoginAttempt, which: std::ops::Range<usize>) {
        let calls: SmallVec<[_; 3]> = which.filter_map(|i| self.refund_one(attempt, i)).collect();
        for call in calls {
            if let Err(error) = call.await {
                tracing::warn!(%error, "tollgate: could not refund a refused login attempt's charge");
            }
        }
    }

    /// Starts the refund of limit `i`'s charge of `attempt`, once, if the store took it and
    /// no reset of its key (an unlock) has begun or ended since: otherwise the refund would
    /// come off the counts of other attempts (an attacker's failures since the unlock). The
    /// store call is made whether or not the answer is awaited.
    fn refund_one(
        &self,
        attempt: &LoginAttempt,
        i: usize,
    ) -> Option<impl std::future::Future<Output = Result<(), CheckError>> + Send + 'static> {
        let limiter = &self.inner.limiters[i];
        let key = &attempt.keys[i];
        let mark = attempt.charges[i].swap(0, Ordering::AcqRel);
        if mark == 0 || !limiter.untouched_since(key, (mark >> 1) - 1) {
            return None;
        }
        let fallback = mark & 1 == 1;
        Some(limiter.refund_to(key, self.inner.policies[i].cost(), fallback))
    }

    /// Clears the username limit of `username` (an administrator unlocking an account).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().user_rate(Rate::per_hour(1)).build()?;
    /// let attempt = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "bob");
    /// assert!(guard.check(&attempt).await?.is_allowed());
    /// guard.record_failure(&attempt).await?; // wrong password
    /// let other = guard.attempt_with_ip_key(Key::new("ip", "192.0.2.2"), "bob");
    /// assert!(!guard.check(&other).await?.is_allowed());
    /// guard.unlock_user("Bob").await?;
    /// assert!(guard.check(&other).await?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn unlock_user(&self, username: &str) -> Result<(), CheckError> {
        self.inner.limiters[USER]
            .reset(&self.user_key(username))
            .await
    }

    /// The key of `username`'s own limit.
    pub(crate) fn user_key(&self, username: &str) -> Key {
        Key::new("login-user", self.username_digest(username))
    }

    /// Clears the IP limit of the client whose IP key is `ip` (an administrator unblocking
    /// an office or a NAT that many users share), in the key form of the IP source, as
    /// [`attempt_with_ip_key`](Self::attempt_with_ip_key) takes it: `Key::new("ip",
    /// "192.0.2.7")` for [`PeerIp`](crate::key::PeerIp). The (IP, username) limits of that
    /// client stay: each is cleared by that username's next successful login, or where it
    /// expires.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use tollgate::{key::Key, login::LoginGuard, Rate};
    ///
    /// let guard = LoginGuard::builder().ip_rate(Rate::per_hour(1)).build()?;
    /// let office = Key::new("ip", "192.0.2.1");
    /// let attempt = guard.attempt_with_ip_key(office.clone(), "bob");
    /// assert!(guard.check(&attempt).await?.is_allowed());
    /// guard.record_failure(&attempt).await?;
    /// let other = guard.attempt_with_ip_key(office.clone(), "carol");
    /// assert!(!guard.check(&other).await?.is_allowed());
    /// guard.unlock_ip(&office).await?;
    /// assert!(guard.check(&other).await?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`CheckError::Store`] when the store fails.
    pub async fn unlock_ip(&self, ip: &Key) -> Result<(), CheckError> {
        self.inner.limiters[IP].reset(&client_key(ip)).await
    }

    fn decision(&self, decision: Decision) -> LoginDecision {
        LoginDecision {
            decision,
            policies: Arc::clone(&self.inner.policies),
            now_millis: self.store().now_millis(),
        }
    }
}

/// The key of the IP limit of the client whose IP key is `ip`.
pub(crate) fn client_key(ip: &Key) -> Key {
    Key::new("login-ip", ip.as_str())
}

/// The outcome of an attempt decided by `a` for some limits and `b` for another: a failure
/// mode's over the store's, failing closed over a local fallback over failing open (the one
/// an operator must hear of first).
fn most_degraded(a: DecidedBy, b: DecidedBy) -> DecidedBy {
    let rank = |d: DecidedBy| match d {
        DecidedBy::FailClosed => 4,
        DecidedBy::Fallback => 3,
        DecidedBy::FailOpen => 2,
        DecidedBy::CachedDeny => 1,
        _ => 0,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> LoginGuard {
        LoginGuard::builder().build().unwrap()
    }

    #[test]
    fn tuple_encoding_is_injective() {
        let g = guard();
        // The IP key material is attacker-influenced text; splitting it differently between
        // "username" and "ip" must never give the same key.
        let a = g.attempt_with_ip_key(Key::new("a:b", "c"), "x");
        let b = g.attempt_with_ip_key(Key::new("a", "b:c"), "x");
        assert_ne!(a.ip_user_key(), b.ip_user_key());
        let a = g.attempt_with_ip_key(Key::new("ip", "1"), "a:b");
        let b = g.attempt_with_ip_key(Key::new("ip", "1"), "a");
        assert_ne!(a.ip_user_key(), b.ip_user_key());
        assert_ne!(a.user_key(), b.user_key());
        assert_eq!(a.ip_key(), b.ip_key());
        // Sources keep the three tuples apart even for equal material.
        assert_ne!(a.ip_key().source(), a.user_key().source());
        assert_ne!(a.ip_user_key().source(), a.ip_key().source());
    }

    #[test]
    fn usernames_are_normalised_and_hashed() {
        let g = guard();
        let ip = Key::new("ip", "192.0.2.1");
        let a = g.attempt_with_ip_key(ip.clone(), "Alice@Example.com");
        let b = g.attempt_with_ip_key(ip.clone(), " alice@example.com\n");
        assert_eq!(a, b);
        assert!(!a.user_key().as_str().contains("alice"));
        assert!(!a.ip_user_key().as_str().contains("alice"));
        assert_eq!(a.user_key().as_str().len(), "login-user:".len() + 32);
    }

    #[tokio::test]
    async fn every_attempt_mode_charges_in_check() {
        let g = LoginGuard::builder()
            .mode(LoginMode::EveryAttempt)
            .ip_user_rate(Rate::per_minute(2))
            .build()
            .unwrap();
        let a = g.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "u");
        assert!(g.check(&a).await.unwrap().is_allowed());
        g.record_failure(&a).await.unwrap(); // no-op
        assert!(g.check(&a).await.unwrap().is_allowed());
        assert!(!g.check(&a).await.unwrap().is_allowed());
        // The refusal charged nothing: another user's attempt from the same IP is the IP
        // limit's third, not its fourth.
        let b = g.attempt_with_ip_key(Key::new("ip", "192.0.2.1"), "v");
        let third = g.check(&b).await.unwrap();
        assert_eq!(third.decision().policies()[IP].remaining(), 47);
        g.record_success(&a).await.unwrap();
        assert!(g.check(&a).await.unwrap().is_allowed());
    }

    #[test]
    fn bad_names_are_config_errors() {
        let err = LoginGuard::builder().name("").build().unwrap_err();
        assert_eq!(err.field(), "name");
        let err = LoginGuard::builder()
            .ip_rate(Rate::new(5, Duration::ZERO))
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "ip_rate.window");
    }
}
