//! The Redis store: limits shared by every instance of a service.
//!
//! **One round trip per decision, or fewer.** [`check`](crate::store::Store::check) and
//! [`peek`](crate::store::Op::Peek) send a single `EVALSHA` of one Lua script that decides the request
//! against *all* its policies. If Redis has forgotten the script (`NOSCRIPT`, after a restart
//! or `SCRIPT FLUSH`), it is loaded and the call retried once, so that one decision costs
//! three round trips. The first decision of a store built from a URL also opens its
//! connection. [`refund`](crate::store::Op::Refund) is a request of the same script (in refund mode),
//! so one atomic call too; [`reset`](crate::store::Op::Reset) is one `UNLINK`.
//!
//! # Coalescing
//!
//! Under load, concurrent decisions share script calls. A decision is sent at once while
//! fewer than [`max_in_flight`](RedisStoreBuilder::max_in_flight) calls are in flight (so at
//! low load nothing waits); otherwise it queues, and when a call comes back everything that
//! queued meanwhile leaves as the next call, up to [`max_batch`](RedisStoreBuilder::max_batch)
//! decisions in arrival order. That call reads each state once, decides the requests one
//! after another against the state as the earlier ones left it, and writes each state once:
//! exactly the answers the same requests would get one call at a time, but a hot key costs
//! one read and one write per batch instead of per request, and the per-call cost of Redis
//! (parsing, dispatch, the script's set-up) is paid once per batch. A key holding a value of
//! another type fails its own requests only. A caller that gives up (a timeout) before its
//! batch is sent is left out of it. `max_batch(1)` turns coalescing off.

//! # What the script guarantees
//!
//! * **Atomic, all or nothing**: every read-modify-write happens inside the script. All
//!   policies are evaluated first; only if every one allows is any of them charged, so a
//!   denied request consumes nothing anywhere.
//! * **The same answers as the memory store**: the Lua is the arithmetic of
//!   [`crate::algorithm`], in integers (exact below 2^53, which policies guarantee); a
//!   differential test runs random traces through both.
//! * **One clock**: the script reads the Redis server's `TIME`, so instances with skewed clocks
//!   agree. A store given an injected clock (a [`ManualClock`](crate::clock::ManualClock) in
//!   tests) passes that clock's time instead. ([`Store::now_millis`](crate::store::Store::now_millis), used only to render
//!   absolute reset times in headers, reads the local clock.)
//! * **Nothing left behind**: every key it writes gets a TTL that ends
//!   [`TTL_MARGIN_MS`] after its state stops mattering, rounded up to a grid of
//!   [`TTL_GRID_MS`] for the string states below: never before the state stops mattering
//!   (488 ms after it at the earliest), and at most `TTL_MARGIN_MS + TTL_GRID_MS` (1 512 ms)
//!   after it, as the state was last written (see [`TTL_MARGIN_MS`] for a token bucket
//!   whose limit an override or a reload changes).
//! * **Compact state**: a counter, bucket, fixed window or GCRA state is one string of
//!   little-endian doubles (16 or 24 bytes, and one byte more, `N`, when it was written with no
//!   per-key override in force: a lone decision then reads the state alone, not its override
//!   key), read for a whole batch with one `MGET` and written
//!   with one `SET … PX`, or `SET … KEEPTTL` (Redis 6.0 or later) when its expiry stays in the
//!   same cell of the grid (for GCRA while a request's emission interval is under half a
//!   second, for the token bucket while its deficit refills in about that); the sliding
//!   window log is a sorted set.
//! * **Cluster-safe keys**: `<prefix>:{<key>}:<policy>:<algorithm>`; one principal's keys
//!   share a hash tag, so the same script runs unchanged on
//!   [`RedisClusterStore`].
//!
//! Connection failures, timeouts and script errors are [`StoreError`](crate::StoreError)s (keeping the redis-rs
//! error as their source); wrapped in a [`ResilientStore`](crate::store::ResilientStore), its
//! failure mode decides what a request gets then.
//!
//! # Examples
//!
//! With the `deadpool-redis` pool the application already has:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate::{key::Key, store::RedisStore, Limiter, Policy, Rate};
//!
//! let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
//!     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
//! let limiter = Limiter::builder()
//!     .store(RedisStore::from_pool(pool))
//!     .policy(Policy::new("burst", Rate::per_second(10))?)
//!     .policy(Policy::new("daily", Rate::per_day(1000))?)
//!     .build()?;
//! let d = limiter.check(&Key::new("user", "42"), 1).await?;
//! assert!(d.is_allowed());
//! # Ok(()) }
//! ```
//!
//! From a URL, over one multiplexed connection that reconnects by itself, with a custom key
//! prefix and timeout:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::store::RedisStore;
//!
//! let store = RedisStore::builder()
//!     .prefix("myapp:rl")
//!     .timeout(Duration::from_millis(200))
//!     .build_with_url("redis://127.0.0.1:6379")?;
//! store.ping().await?;
//! # Ok(()) }
//! ```

mod batch;
mod builder;
#[cfg(feature = "cluster")]
pub mod cluster;
mod connector;
#[cfg(feature = "regions")]
mod deposits;
mod engine;
mod keys;
mod lease;
mod ledger_call;
mod lua_constants;
mod ops;
mod overrides;
mod request;
mod script;
mod script_call;
#[cfg(feature = "sentinel")]
pub mod sentinel;
mod single;
mod store_impl;
mod ttl;
mod wire;
#[cfg(feature = "regions")]
pub(crate) use wire::{RegionMode, DEPOSIT_BYTES};

pub use builder::RedisStoreBuilder;
#[cfg(feature = "cluster")]
pub use cluster::RedisClusterStore;
#[cfg(feature = "regions")]
pub use deposits::region_script_source;
pub use engine::{DEFAULT_MAX_BATCH, DEFAULT_MAX_IN_FLIGHT};
pub use keys::DEFAULT_PREFIX;
pub use ledger_call::lease_script_source;
pub use script::script_source;
#[cfg(feature = "sentinel")]
pub use sentinel::{RedisSentinelStore, DEFAULT_RESOLVE_INTERVAL};
pub use single::RedisStore;
pub use ttl::{TTL_GRID_MS, TTL_MARGIN_MS};
