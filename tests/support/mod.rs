//! Helpers shared by the integration tests, one module per concern.
//!
//! * [`http`]: an axum app served on a free loopback port, captured log lines, a tenant key.
//! * [`redis`]: real `redis-server` processes (one node, or a three-master cluster) on free
//!   loopback ports, stopped on drop.
//! * [`sentinel`]: a master, a replica and three sentinels watching them, stopped on drop.
//! * [`scenarios`]: policies, traces and checks shared by the tests of every store.
//! * [`cancel`]: dropping a future at each of its await points.
//! * [`gated`]: a store wrapper whose replies come late, so those points exist.
//! * [`proxy`]: a loopback TCP proxy that delays or holds a server's replies.
//! * `conformance.rs`: the conformance matrix's model, traces and harness; only
//!   `tests/conformance.rs` includes it (as its `matrix` module).
//!
//! Each test binary uses part of this, hence `dead_code` is allowed.

#![allow(dead_code, unused_imports)]

use tollgate::store::StoreExt;

pub mod cancel;
pub mod gated;
pub mod http;
pub mod proxy;
pub mod redis;
pub mod scenarios;
pub mod sentinel;

pub use self::http::{by_tenant, serve, serve_on, Logs};
pub use self::redis::{RedisCluster, RedisServer};

/// A loopback port that was free when asked (for a server to bind, or for a store that must
/// find nothing listening).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// A two-worker runtime, for tests that drive async stores from synchronous code (proptest).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A limiter's shadow counts as `(allowed, denied)`, for comparisons.
pub fn shadow_counts<S: tollgate::store::Store>(limiter: &tollgate::Limiter<S>) -> (u64, u64) {
    let counts = limiter.shadow_counts();
    (counts.allowed, counts.denied)
}

/// What a store that answers at once (the memory store) would answer now, charging
/// nothing: its `peek` future polled once.
pub fn peek_now<S: tollgate::store::Store>(
    store: &S,
    key: &tollgate::key::Key,
    policies: &[tollgate::Policy],
    costs: &[u64],
) -> Result<tollgate::Decision, tollgate::error::StoreError> {
    use std::task::{Context, Poll, Waker};
    let mut future = store.peek(key, policies, costs);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(answer) => answer,
        Poll::Pending => panic!("peek_now needs a store that answers at once"),
    }
}

/// Waits, when less than `margin` is left of the current window of length `window` (windows
/// start at multiples of it since the Unix epoch, as the algorithms' do), until the next one
/// has begun: a test that counts admissions against one window's limit must not straddle
/// two windows, where a sliding or fixed window rightly admits more.
pub async fn clear_of_a_window_end(window: std::time::Duration, margin: std::time::Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let left = window.as_micros() - now % window.as_micros();
    if left < margin.as_micros() {
        let left = u64::try_from(left).unwrap_or(u64::MAX);
        tokio::time::sleep(std::time::Duration::from_micros(left + 100_000)).await;
    }
}
