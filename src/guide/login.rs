//! The login guard in depth: what it counts, how long a lockout lasts, what reaches the store.
//!
//! [`LoginGuard`](crate::login::LoginGuard) limits three tuples at once, (client IP,
//! username), client IP and username; the [`login`](crate::login) module has the table of
//! defaults and the examples. This guide is the reasoning behind them.
//!
//! # Counting failures only, or every attempt
//!
//! In both modes [`LoginGuard::check`](crate::login::LoginGuard::check) *reserves*: an allowed attempt is charged to all three
//! limits before the handler verifies the password, and a refused one is charged to none. So
//! attempts beyond a limit never reach verification, however many arrive at once: 100
//! parallel wrong passwords against a limit of 5 get at most 5 verifications.
//!
//! [`LoginMode::FailuresOnly`](crate::login::LoginMode::FailuresOnly) (the default, and the friendlier choice) counts failures only:
//! [`LoginGuard::record_success`](crate::login::LoginGuard::record_success) refunds the IP and username limits and clears the
//! (IP, username) tuple, so users who type their password right are not counted, and a busy
//! office behind one NAT address does not use up its IP limit by logging in. Concurrent
//! successes hold their places only while their passwords are verified.
//! [`LoginMode::EveryAttempt`](crate::login::LoginMode::EveryAttempt) counts successes too: `record_success` only clears the
//! (IP, username) tuple.
//!
//! **An attempt that is never recorded counts as a failure**: its reservation stays. That is
//! the case when the handler records nothing (it panicked, returned early, or the
//! [`LoginLayer`](crate::login::LoginLayer) classified its response as [`LoginOutcome::Unknown`](crate::login::LoginOutcome::Unknown), such as a `400` or a
//! `500`). Counting is the safe default: an attacker cannot escape the limits by making the
//! handler fail, at the price of one unit per server error for a real user.
//! [`LoginGuard::record_failure`](crate::login::LoginGuard::record_failure) changes nothing (the charge is already there).
//!
//! # The lockout trade-off
//!
//! The username limit is what stops a botnet rotating addresses, and it is also a lever for
//! anyone to lock a user out: `user` failed attempts from anywhere exhaust it for everyone,
//! the real user included. The guard bounds that lockout:
//!
//! * refused attempts are never counted, so hammering a locked account does not extend the
//!   lock, and
//! * the limits use the exact sliding window log by default, so an account is free again at
//!   most **one username window** (default 15 minutes) after the last *counted* failure. (A
//!   plan's `[login]` uses the algorithm of the policies it names: give them
//!   `algorithm = "sliding_window_log"` for this bound; with the default sliding window
//!   counter, failures at the start of a window keep the account locked up to one window
//!   longer.)
//!
//! To keep a user locked, an attacker must therefore keep spending `user` failures per
//! window, each of which also counts against the attacker's own IP and (IP, username) limits.
//! Choose the username rate with this in mind: higher or shorter means less lockout and more
//! guesses for a botnet. Every refusal is the same generic 429 — no remaining counts, no hint
//! of which tuple tripped (the policies are [sensitive](crate::PolicyBuilder::sensitive)) —
//! with a `Retry-After` that is the earliest moment every exhausted tuple allows again. (With
//! different windows per tuple, that value can still hint at which one tripped; give the
//! three rates one window if even that must not show.) While the store is down, the
//! guard's limits fail closed unless [`failure_mode`](crate::login::LoginGuardBuilder::failure_mode)
//! says otherwise (a store that fails open does not open logins to brute force; one with a
//! local fallback keeps it): a limit that fails closed refuses with the store's 503
//! (`rate_limiter_unavailable`), not a 429 the user did not earn, and the decision says which
//! mode decided it ([`DecidedBy`](crate::DecidedBy)).
//!
//! # Usernames never reach the store
//!
//! Key material for usernames is a SHA-256 digest (128 bits, hex) of the normalised name,
//! never the name itself: usernames are often e-mail addresses, and store keys end up in
//! places that personal data should not (Redis `MONITOR` and `KEYS` output, backups, metrics
//! labels). A plain digest of a guessable address can be reversed by guessing, so set
//! [`username_secret`](crate::login::LoginGuardBuilder::username_secret) — the same on every instance that
//! shares a store — to key the digest. Digests are fixed-length, so the (IP, username) tuple
//! is encoded injectively: `("a:b", "c")` and `("a", "b:c")` never share a key.
//!
//! # Stores
//!
//! A guard works with any [`Store`](crate::store::Store): the default in-process [`MemoryStore`](crate::store::MemoryStore), or a shared one
//! (such as the Redis store) so that every instance of the service enforces one limit.
