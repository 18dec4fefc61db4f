//! Cancellation at every await point.
//!
//! Each public async operation that changes a store — `Limiter::check`, `acquire`,
//! `reserve`, `Reservation::settle`, `refund`, `set_override` / `remove_override`, the
//! `Store` operations themselves, a `LeasedStore`'s grants and returns, the layer's future and
//! its response body — is dropped at each point it can stop at: before its first poll, and
//! after each `Pending` (as it stopped, and once woken), until a run completes. After each
//! cancellation, and once the background work it leaves (a release, a settlement) has had
//! [`SETTLE`] to run, nothing is held or charged beyond the bound the code states, written
//! next to each assertion.
//!
//! * Memory: the memory store answers at once, so it sits behind a [`Gated`] wrapper that
//!   stops every call once before it reaches the store and (for rate operations) once after
//!   the store answered, before the caller sees the answer. In-flight runs stop only before:
//!   the memory store gives its answer in the call itself, so only a future dropped before
//!   its first poll can lose the answer of a memory call that took a slot (the
//!   `…_memory` store-operation and resilient-memory layer tests drive that point).
//! * Redis: a real `redis-server` behind a [`Proxy`] that delays every reply, a fresh store
//!   per run and the script cache flushed before the driven call, so the first call of a run
//!   also connects, meets `NOSCRIPT`, loads the script, sends it again and reads the
//!   server's `run_id`: every await the engine has. Calls dropped while the proxy holds
//!   their reply (executed, reply late), a queued decision dropped after its batch ran, 300
//!   HTTP requests given up after 0–3 ms, and calls given up by a `ResilientStore`'s timeout
//!   cover the network's own moments.
//!
//! Each loop asserts how many await points its completed run stopped at, so no test passes
//! without reaching the points it names; each lists every bound it found broken (set
//! `CANCEL_TRACE=1` to see every run).

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tollgate::store::StoreExt;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use tollgate::clock::ManualClock;
use tollgate::error::StoreError;
use tollgate::key::{Global, Key};
use tollgate::route::{Meter, Route};
use tollgate::store::leased::{LeaseBackend, LeasedStore, MemoryLedger};
use tollgate::store::{
    BoxFuture, DynStore, FailureMode, MemoryStore, RedisStore, ResilientStore, Store,
};
use tollgate::{Algorithm, Limiter, Override, Policy, Rate, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

use support::cancel::{settled, Findings, Moment, Points, Run, SETTLE};
use support::gated::{Gated, Stops};
use support::proxy::Proxy;
use support::RedisServer;

/// The in-flight limit of every case.
const SLOTS: u64 = 4;

/// How late the proxy makes every Redis reply.
const REPLY_DELAY: Duration = Duration::from_millis(2);

/// The key prefix of the Redis stores.
const PREFIX: &str = "cancel";

const MOMENTS: [Moment; 2] = [Moment::Reached, Moment::Woken];

fn running() -> Policy {
    Policy::in_flight("running", SLOTS).unwrap()
}

fn calls() -> Policy {
    Policy::new("calls", Rate::per_hour(1_000)).unwrap()
}

fn tokens() -> Policy {
    Policy::builder("tokens", Rate::per_hour(1_000))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap()
}

/// Where a case runs.
enum Bench {
    /// One memory store on a manual clock, behind a [`Gated`] wrapper; a case per key.
    Memory {
        store: MemoryStore,
        stops: Stops,
        clock: ManualClock,
    },
    /// The memory store itself: it acts when called, so a call has no await point and
    /// the one cancellation is a future dropped before its first poll.
    RawMemory {
        store: MemoryStore,
        clock: ManualClock,
    },
    /// The memory store behind a `ResilientStore`, whose check calls the memory store when
    /// the check is made, not when it is first polled.
    ResilientMemory {
        store: ResilientStore<MemoryStore>,
        clock: ManualClock,
    },
    /// A fresh `RedisStore` per case on a manual clock, reaching the server through a proxy
    /// that delays every reply by [`REPLY_DELAY`].
    Redis {
        server: RedisServer,
        proxy: Proxy,
        clock: ManualClock,
    },
}

impl Bench {
    fn memory(stops: Stops) -> Self {
        let clock = ManualClock::new(1_000_000_000);
        Bench::Memory {
            store: MemoryStore::builder().clock(clock.clone()).build().unwrap(),
            stops,
            clock,
        }
    }

    fn raw_memory() -> Self {
        let clock = ManualClock::new(1_000_000_000);
        Bench::RawMemory {
            store: MemoryStore::builder().clock(clock.clone()).build().unwrap(),
            clock,
        }
    }

    fn resilient_memory() -> Self {
        let clock = ManualClock::new(1_000_000_000);
        let memory = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        Bench::ResilientMemory {
            store: ResilientStore::builder(memory, FailureMode::FailClosed)
                .build()
                .unwrap(),
            clock,
        }
    }

    fn clock(&self) -> &ManualClock {
        match self {
            Bench::Memory { clock, .. }
            | Bench::RawMemory { clock, .. }
            | Bench::ResilientMemory { clock, .. }
            | Bench::Redis { clock, .. } => clock,
        }
    }

    async fn redis() -> Self {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port()).await;
        proxy.set_delay(REPLY_DELAY);
        Bench::Redis {
            server,
            proxy,
            clock: ManualClock::new(1_000_000_000),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Bench::Memory { .. } | Bench::RawMemory { .. } => "memory",
            Bench::ResilientMemory { .. } => "resilient memory",
            Bench::Redis { .. } => "redis",
        }
    }

    /// The store of one case: the shared memory store behind its gate, or a new Redis store
    /// (not yet connected) through the proxy.
    fn store(&self) -> DynStore {
        match self {
            Bench::Memory { store, stops, .. } => DynStore::new(Gated::new(store.clone(), *stops)),
            Bench::RawMemory { store, .. } => DynStore::new(store.clone()),
            Bench::ResilientMemory { store, .. } => DynStore::new(store.clone()),
            Bench::Redis { proxy, clock, .. } => DynStore::new(self::redis_store(proxy, clock)),
        }
    }

    /// Before the driven call: on Redis the script cache is emptied, so the call meets
    /// `NOSCRIPT`, loads the script and sends it again (three awaits instead of one).
    fn flush_scripts(&self) {
        if let Bench::Redis { server, .. } = self {
            let _: String = server.query(&["SCRIPT", "FLUSH"]).unwrap();
        }
    }

    /// Waits out a call that may still be on its way to the server (dropped as it was
    /// written): after this, what the server will execute of it, it has.
    async fn quiesce(&self) {
        match self {
            Bench::Memory { .. } | Bench::RawMemory { .. } | Bench::ResilientMemory { .. } => {
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
            }
            Bench::Redis { server, .. } => {
                // A store call finished in the background (a dropped refund's, a release)
                // must land before the state is read: wait until the server has processed
                // nothing but these queries for a while (2 s at most, on a busy machine).
                let processed = || {
                    let info: String = server.query(&["INFO", "stats"]).unwrap_or_default();
                    info.lines()
                        .find_map(|l| l.strip_prefix("total_commands_processed:"))
                        .and_then(|n| n.trim().parse::<u64>().ok())
                        .unwrap_or(0)
                };
                let deadline = std::time::Instant::now() + Duration::from_secs(2);
                let mut last = processed();
                loop {
                    tokio::time::sleep(REPLY_DELAY * 4 + Duration::from_millis(10)).await;
                    let now = processed();
                    if now <= last + 1 || std::time::Instant::now() > deadline {
                        break;
                    }
                    last = now;
                }
            }
        }
    }

    /// `ZCARD` of `key`'s slot set in Redis (its in-flight state key); `None` on memory.
    fn slots_in_redis(&self, key: &Key) -> Option<u64> {
        let Bench::Redis { server, .. } = self else {
            return None;
        };
        let state = format!("{PREFIX}:{{{}}}:running:inf", key.as_str());
        Some(server.query(&["ZCARD", &state]).unwrap())
    }

    /// The least number of pending polls of one store call on this bench: the gate's stops,
    /// or, on Redis with the script flushed, `NOSCRIPT`, the load and the call again (plus,
    /// on a new store, the connection and the `run_id` read).
    fn call_points(&self, stops: usize, first_call: bool) -> usize {
        match self {
            Bench::Memory { .. } => stops,
            Bench::RawMemory { .. } | Bench::ResilientMemory { .. } => 0,
            Bench::Redis { .. } if first_call => 5,
            Bench::Redis { .. } => 3,
        }
    }
}

fn redis_store(proxy: &Proxy, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix(PREFIX)
        .clock(clock.clone())
        .build_with_url(&proxy.url())
        .unwrap()
}

/// The units `key` has used under `policy` (for an in-flight policy: the slots held): the
/// limit in force (an override's, if any) less what a look at no cost leaves.
async fn used<S: Store>(store: &S, key: &Key, policy: &Policy) -> u64 {
    let d = store
        .peek(key, std::slice::from_ref(policy), &[0])
        .await
        .unwrap();
    d.limit().saturating_sub(d.remaining())
}

fn key(what: &str, k: usize, moment: Moment) -> Key {
    Key::new("tenant", format!("{what}-{k}-{moment:?}"))
}

/// Bound: no slot is held. After background releases had [`SETTLE`] to run, the store counts
/// no slot for `key` (on Redis the slot set is empty), `SLOTS` acquisitions held at once are
/// all admitted and one more is refused (the limit is really enforced, so the check cannot
/// pass by accident).
async fn no_slot_held(
    bench: &Bench,
    limiter: &Limiter<DynStore>,
    key: &Key,
    ctx: &str,
) -> Result<(), String> {
    let store = limiter.store();
    let free = settled(async || {
        used(store, key, &running()).await == 0 && bench.slots_in_redis(key).unwrap_or(0) == 0
    })
    .await;
    if !free {
        let held = used(store, key, &running()).await;
        return Err(format!(
            "{ctx}: {held} slot(s) still held {SETTLE:?} after the cancellation \
             (Redis slot set: {:?})",
            bench.slots_in_redis(key)
        ));
    }
    let mut permits = vec![];
    for i in 0..SLOTS {
        let permit = limiter.acquire(key).await.unwrap();
        if !permit.is_allowed() {
            return Err(format!(
                "{ctx}: only {i} of {SLOTS} concurrent acquisitions admitted"
            ));
        }
        permits.push(permit);
    }
    assert!(
        !limiter.acquire(key).await.unwrap().is_allowed(),
        "{ctx}: more than {SLOTS} slots at once"
    );
    if let Some(set) = bench.slots_in_redis(key) {
        assert_eq!(set, SLOTS, "{ctx}: the slot set holds the {SLOTS} permits");
    }
    drop(permits);
    // Their releases are done before the next case starts (which flushes the script cache
    // and must not see a release load it again meanwhile).
    let back = settled(async || {
        used(store, key, &running()).await == 0 && bench.slots_in_redis(key).unwrap_or(0) == 0
    })
    .await;
    if !back {
        return Err(format!(
            "{ctx}: dropped permits did not give their slots back"
        ));
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Limiter::check

async fn check_charges_at_most_once(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        let mut points = Points::new(format!("Limiter::check on {}", bench.name()), moment);
        while let Some(k) = points.next_k() {
            let store = bench.store();
            let limiter = Limiter::builder()
                .store(store.clone())
                .policy(calls())
                .policy(tokens())
                .build()
                .unwrap();
            let key = key("check", k, moment);
            bench.flush_scripts();
            let run = points.drive(limiter.check(&key, 3)).await;
            let allowed = run.output().map(|d| d.unwrap().is_allowed());
            bench.quiesce().await;
            let (a, b) = (
                used(&store, &key, &calls()).await,
                used(&store, &key, &tokens()).await,
            );
            // Bound: a check is all or nothing across its policies, and charged at most once:
            // a completed check exactly its cost, a cancelled one its cost or nothing.
            assert_ne!(allowed, Some(false), "{points}: refused on a fresh key");
            findings.check(a == b && (a == 3 || (allowed.is_none() && a == 0)), || {
                format!("{points}: charged {a} and {b} for a cost of 3")
            });
        }
        points.assert_visited(bench.call_points(2, true));
    }
    findings.assert_none();
}

#[tokio::test]
async fn check_cancelled_anywhere_is_charged_at_most_once_memory() {
    check_charges_at_most_once(&Bench::memory(Stops::BeforeAndAfter)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_cancelled_anywhere_is_charged_at_most_once_redis() {
    check_charges_at_most_once(&Bench::redis().await).await;
}

/// A check on an in-flight policy takes a slot and answers once it is given back: dropped
/// anywhere, before its store call, while it waits for the answer, or while the release is
/// under way, it leaves no slot held.
async fn in_flight_check_holds_no_slot(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        let mut points = Points::new(
            format!("Limiter::check on an in-flight policy on {}", bench.name()),
            moment,
        );
        while let Some(k) = points.next_k() {
            let limiter = slot_limiter(bench.store());
            let key = key("in-flight-check", k, moment);
            bench.flush_scripts();
            let run = points.drive(limiter.check(&key, 1)).await;
            if let Some(decision) = run.output() {
                assert!(
                    decision.unwrap().is_allowed(),
                    "{points}: refused on a fresh key"
                );
            }
            bench.quiesce().await;
            findings.add(no_slot_held(bench, &limiter, &key, &points.to_string()).await);
        }
        // The check's call, then, on Redis, the release's reply (a gate's stop before the
        // release is passed by the first poll the check gives it before it waits).
        let release = usize::from(matches!(bench, Bench::Redis { .. }));
        points.assert_visited(bench.call_points(1, true) + release);
    }
    findings.assert_none();
}

#[tokio::test]
async fn in_flight_check_cancelled_anywhere_holds_no_slot_memory() {
    // As for `acquire`: a store that took a slot owns giving it back when its charge is
    // dropped unanswered (the Redis store does), so the gate stops only before the call.
    in_flight_check_holds_no_slot(&Bench::memory(Stops::Before)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_check_cancelled_anywhere_holds_no_slot_redis() {
    in_flight_check_holds_no_slot(&Bench::redis().await).await;
}

// ----------------------------------------------------------------------------------------
// Limiter::acquire

fn slot_limiter(store: DynStore) -> Limiter<DynStore> {
    Limiter::builder()
        .store(store)
        .policy(running())
        .policy(calls())
        .build()
        .unwrap()
}

async fn acquire_holds_no_slot(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        let mut points = Points::new(format!("Limiter::acquire on {}", bench.name()), moment);
        while let Some(k) = points.next_k() {
            let limiter = slot_limiter(bench.store());
            let key = key("acquire", k, moment);
            bench.flush_scripts();
            let run = points.drive(limiter.acquire(&key)).await;
            let completed = matches!(run, Run::Completed(..));
            if let Some(permit) = run.output() {
                let permit = permit.unwrap();
                assert!(permit.is_allowed(), "{points}: refused on a fresh key");
                drop(permit);
            }
            bench.quiesce().await;
            // Bound: the rate policy beside the slot is charged at most once.
            let charged = used(limiter.store(), &key, &calls()).await;
            findings.check(charged <= 1 && (!completed || charged == 1), || {
                format!("{points}: {charged} calls charged")
            });
            findings.add(no_slot_held(bench, &limiter, &key, &points.to_string()).await);
        }
        points.assert_visited(bench.call_points(1, true));
    }
    findings.assert_none();
}

#[tokio::test]
async fn acquire_cancelled_anywhere_holds_no_slot_memory() {
    acquire_holds_no_slot(&Bench::memory(Stops::Before)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_cancelled_anywhere_holds_no_slot_redis() {
    acquire_holds_no_slot(&Bench::redis().await).await;
}

// ----------------------------------------------------------------------------------------
// Limiter::reserve and Reservation::settle

const ESTIMATE: u64 = 100;

/// A route with an in-flight policy and a rate policy the estimate goes to.
fn reserving_limiter(store: DynStore) -> Limiter<DynStore> {
    Limiter::builder()
        .store(store)
        .policy(running())
        .policy(tokens())
        .build()
        .unwrap()
}

async fn reserve_charges_at_most_once(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        let mut points = Points::new(format!("Limiter::reserve on {}", bench.name()), moment);
        while let Some(k) = points.next_k() {
            let limiter = reserving_limiter(bench.store());
            let key = key("reserve", k, moment);
            bench.flush_scripts();
            let run = points.drive(limiter.reserve(&key, ESTIMATE)).await;
            let completed = matches!(run, Run::Completed(..));
            if let Some(reservation) = run.output() {
                let reservation = reservation.unwrap();
                assert!(reservation.decision().is_allowed(), "{points}: refused");
                // Dropped unsettled: the estimate stands, the slot comes back.
                drop(reservation);
            }
            bench.quiesce().await;
            let charged = used(limiter.store(), &key, &tokens()).await;
            // Bound: a reservation is charged at most once: its estimate, or nothing when it
            // was cancelled before the store took it.
            findings.check(charged == ESTIMATE || (!completed && charged == 0), || {
                format!("{points}: {charged} units charged for an estimate of {ESTIMATE}")
            });
            findings.add(no_slot_held(bench, &limiter, &key, &points.to_string()).await);
        }
        points.assert_visited(bench.call_points(1, true));
    }
    findings.assert_none();
}

#[tokio::test]
async fn reserve_cancelled_anywhere_is_charged_at_most_once_memory() {
    reserve_charges_at_most_once(&Bench::memory(Stops::Before)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_cancelled_anywhere_is_charged_at_most_once_redis() {
    reserve_charges_at_most_once(&Bench::redis().await).await;
}

async fn settle_applies_at_most_once(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        for actual in [30, 250] {
            let what = format!("Reservation::settle({actual}) on {}", bench.name());
            let mut points = Points::new(what, moment);
            while let Some(k) = points.next_k() {
                let limiter = reserving_limiter(bench.store());
                let key = key(&format!("settle{actual}"), k, moment);
                let reservation = limiter.reserve(&key, ESTIMATE).await.unwrap();
                assert!(reservation.decision().is_allowed());
                bench.flush_scripts();
                let run = points.drive(reservation.settle(actual)).await;
                let completed = matches!(run, Run::Completed(..));
                if let Some(result) = run.output() {
                    result.unwrap();
                }
                bench.quiesce().await;
                let charged = used(limiter.store(), &key, &tokens()).await;
                // Bound: a settlement is applied at most once: the estimate still stands, or
                // the actual cost replaced it (a completed one: the actual cost).
                findings.check(charged == actual || (!completed && charged == ESTIMATE), || {
                    format!("{points}: {charged} units charged (estimate {ESTIMATE}, actual {actual})")
                });
                // The reservation's slot goes with it, settled or not.
                findings.add(no_slot_held(bench, &limiter, &key, &points.to_string()).await);
            }
            points.assert_visited(bench.call_points(2, false));
        }
    }
    findings.assert_none();
}

#[tokio::test]
async fn settle_cancelled_anywhere_is_applied_at_most_once_memory() {
    settle_applies_at_most_once(&Bench::memory(Stops::BeforeAndAfter)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_cancelled_anywhere_is_applied_at_most_once_redis() {
    settle_applies_at_most_once(&Bench::redis().await).await;
}

// ----------------------------------------------------------------------------------------
// Limiter::refund

async fn refund_applies_at_most_once(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        let mut points = Points::new(format!("Limiter::refund on {}", bench.name()), moment);
        while let Some(k) = points.next_k() {
            let store = bench.store();
            let limiter = Limiter::builder()
                .store(store.clone())
                .policy(calls())
                .policy(tokens())
                .build()
                .unwrap();
            let key = key("refund", k, moment);
            assert!(limiter.check(&key, 5).await.unwrap().is_allowed());
            bench.flush_scripts();
            let run = points.drive(limiter.refund(&key, 5)).await;
            let completed = matches!(run, Run::Completed(..));
            if let Some(result) = run.output() {
                result.unwrap();
            }
            bench.quiesce().await;
            let (a, b) = (
                used(&store, &key, &calls()).await,
                used(&store, &key, &tokens()).await,
            );
            // Bound: a refund is applied at most once, to all its policies or none.
            findings.check(a == b && (a == 0 || (!completed && a == 5)), || {
                format!("{points}: {a} and {b} units left of 5 charged and 5 refunded")
            });
        }
        points.assert_visited(bench.call_points(2, false));
    }
    findings.assert_none();
}

#[tokio::test]
async fn refund_cancelled_anywhere_is_applied_at_most_once_memory() {
    refund_applies_at_most_once(&Bench::memory(Stops::BeforeAndAfter)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refund_cancelled_anywhere_is_applied_at_most_once_redis() {
    refund_applies_at_most_once(&Bench::redis().await).await;
}

// ----------------------------------------------------------------------------------------
// Limiter::set_override and remove_override

/// The limit a check of `key` is decided by, and the override the store lists for it; the
/// two must agree.
async fn override_in_force(limiter: &Limiter<DynStore>, key: &Key, ctx: &str) -> Option<u64> {
    let listed = limiter.overrides(key).await.unwrap();
    assert!(listed.len() <= 1, "{ctx}: {listed:?}");
    let listed = listed.first().map(|o| o.limit());
    let decided = limiter.peek(key).await.unwrap().limit();
    assert_eq!(
        decided,
        listed.unwrap_or(1_000),
        "{ctx}: the decision's limit and the listed override disagree"
    );
    listed
}

async fn overrides_are_set_or_not(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        for removing in [false, true] {
            let op = if removing {
                "remove_override"
            } else {
                "set_override"
            };
            let what = format!("Limiter::{op} on {}", bench.name());
            let mut points = Points::new(what, moment);
            while let Some(k) = points.next_k() {
                let limiter = Limiter::builder()
                    .store(bench.store())
                    .policy(calls())
                    .build()
                    .unwrap();
                let key = key(op, k, moment);
                let over = Override::new("calls", 50);
                if removing {
                    limiter.set_override(&key, over.clone()).await.unwrap();
                }
                bench.flush_scripts();
                let run = if removing {
                    points
                        .drive(limiter.remove_override(&key, "calls"))
                        .await
                        .output()
                } else {
                    points
                        .drive(limiter.set_override(&key, over))
                        .await
                        .output()
                };
                let completed = run.is_some();
                if let Some(result) = run {
                    result.unwrap();
                }
                bench.quiesce().await;
                let now = override_in_force(&limiter, &key, &points.to_string()).await;
                // Bound: an override is set (or removed) whole or not at all; a completed
                // call has taken effect.
                let done = if removing { None } else { Some(50) };
                let before = if removing { Some(50) } else { None };
                findings.check(now == done || (!completed && now == before), || {
                    format!("{points}: override in force {now:?}")
                });
            }
            points.assert_visited(match bench {
                Bench::Redis { .. } => 1,
                _ => bench.call_points(2, false),
            });
        }
    }
    findings.assert_none();
}

#[tokio::test]
async fn overrides_cancelled_anywhere_are_set_whole_or_not_memory() {
    overrides_are_set_or_not(&Bench::memory(Stops::BeforeAndAfter)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_cancelled_anywhere_are_set_whole_or_not_redis() {
    overrides_are_set_or_not(&Bench::redis().await).await;
}

// ----------------------------------------------------------------------------------------
// Store operations called directly

/// One `Store` operation, with the state it needs made first and what it may leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreOp {
    Check,
    Refund,
    Settle,
    Release,
    Reset,
    SetOverride,
}

// The check last: its failures (a slot left held) must not hide the others' results.
const STORE_OPS: [StoreOp; 6] = [
    StoreOp::Refund,
    StoreOp::Settle,
    StoreOp::Release,
    StoreOp::Reset,
    StoreOp::SetOverride,
    StoreOp::Check,
];

/// What the state of `key` shows after an operation: the units charged to `calls` and
/// `tokens`, the slots held, the override of `calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    calls: u64,
    tokens: u64,
    slots: u64,
    over: Option<u64>,
}

async fn seen<S: Store>(store: &S, key: &Key) -> Seen {
    let over = store
        .overrides(key, &[calls()])
        .await
        .unwrap()
        .first()
        .map(|o| o.limit());
    Seen {
        calls: used(store, key, &calls()).await,
        tokens: used(store, key, &tokens()).await,
        slots: used(store, key, &running()).await,
        over,
    }
}

impl StoreOp {
    /// Makes the state the operation acts on; the slot id to release, if any.
    async fn prepare<S: Store>(self, store: &S, key: &Key) -> u64 {
        match self {
            StoreOp::Check | StoreOp::SetOverride => 0,
            StoreOp::Refund | StoreOp::Reset => {
                let d = store.check(key, &[calls()], &[5]).await.unwrap();
                assert!(d.is_allowed());
                0
            }
            StoreOp::Settle => {
                let d = store.check(key, &[tokens()], &[ESTIMATE]).await.unwrap();
                assert!(d.is_allowed());
                0
            }
            StoreOp::Release => {
                let d = store.check(key, &[running()], &[1]).await.unwrap();
                assert!(d.is_allowed());
                d.slot()
            }
        }
    }

    /// The operation's future: `Ok` with the slot a completed check took (0 for the
    /// others), which the caller gives back; `Err` when the store failed.
    fn call(self, store: &DynStore, key: &Key, slot: u64) -> BoxFuture<Result<u64, StoreError>> {
        let done = |f: BoxFuture<Result<(), StoreError>>| -> BoxFuture<Result<u64, StoreError>> {
            Box::pin(async move { f.await.map(|()| 0) })
        };
        match self {
            StoreOp::Check => {
                let check = store.check(key, &[running(), calls()], &[1, 1]);
                Box::pin(async move {
                    let d = check.await?;
                    assert!(d.is_allowed());
                    Ok(d.slot())
                })
            }
            StoreOp::Refund => done(store.refund(key, &[calls()], &[5])),
            StoreOp::Settle => done(store.settle(key, &[tokens()], &[ESTIMATE], &[30])),
            StoreOp::Release => done(store.release(key, &[running()], slot)),
            StoreOp::Reset => done(store.reset(key, &[calls()])),
            StoreOp::SetOverride => {
                let over = Policy::new("calls", Rate::per_hour(50)).unwrap();
                done(store.set_override(key, &over, None))
            }
        }
    }

    /// Bound: the states `before` (the call never took effect) and `after` (it did, once)
    /// are the only ones a cancelled call may leave; a completed call leaves `after`.
    fn allowed(self, before: Seen) -> Seen {
        let mut after = before;
        match self {
            // A check's slot, taken or not, is never left held (its caller gives back the slot
            // of a completed check; a cancelled one's the store releases by the id it chose);
            // its rate unit counts at most once.
            StoreOp::Check => after.calls += 1,
            StoreOp::Refund | StoreOp::Reset => after.calls = 0,
            StoreOp::Settle => after.tokens = 30,
            StoreOp::Release => after.slots = 0,
            StoreOp::SetOverride => after.over = Some(50),
        }
        after
    }
}

impl StoreOp {
    /// The least number of pending polls of the operation on a warm Redis store with the
    /// script cache flushed (see [`Bench::call_points`]).
    fn redis_points(self) -> usize {
        match self {
            StoreOp::Check | StoreOp::Refund | StoreOp::Settle | StoreOp::Release => 3,
            // One `UNLINK`, one `SET`.
            StoreOp::Reset | StoreOp::SetOverride => 1,
        }
    }
}

async fn store_operations_stay_within_bounds(bench: &Bench) {
    let mut findings = Findings::default();
    for op in STORE_OPS {
        for moment in MOMENTS {
            let mut points = Points::new(format!("Store::{op:?} on {}", bench.name()), moment);
            while let Some(k) = points.next_k() {
                let store = bench.store();
                let key = key(&format!("store-{op:?}"), k, moment);
                let slot = op.prepare(&store, &key).await;
                let before = seen(&store, &key).await;
                let after = op.allowed(before);
                bench.flush_scripts();
                let run = points.drive(op.call(&store, &key, slot)).await;
                let completed = matches!(run, Run::Completed(..));
                if let Some(answer) = run.output() {
                    let slot = answer.unwrap_or_else(|e| panic!("{points}: {e}"));
                    if op == StoreOp::Check {
                        // A completed check's slot is its caller's to give back.
                        store.release(&key, &[running()], slot).await.unwrap();
                    }
                }
                bench.quiesce().await;
                let within = async || {
                    let now = seen(&store, &key).await;
                    now == after || (!completed && now == before)
                };
                let ok = settled(within).await;
                let now = seen(&store, &key).await;
                findings.check(ok, || {
                    format!(
                        "{points}: left {now:?}; only {before:?} (not applied) or {after:?} \
                         (applied once) may be left {SETTLE:?} after the cancellation"
                    )
                });
                if op == StoreOp::Release && now.slots > 0 {
                    // Bound: a release that never reached the store leaves the slot held
                    // until its lease ends, not longer.
                    bench
                        .clock()
                        .advance(Duration::from_millis(running().window_millis() + 1));
                    let slots = used(&store, &key, &running()).await;
                    findings.check(slots == 0, || {
                        format!("{points}: the slot outlived its lease")
                    });
                }
            }
            points.assert_visited(match bench {
                Bench::Redis { .. } => op.redis_points(),
                _ => bench.call_points(0, false),
            });
        }
    }
    findings.assert_none();
}

#[tokio::test]
async fn store_operations_dropped_before_their_first_poll_stay_within_bounds_memory() {
    store_operations_stay_within_bounds(&Bench::raw_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_operations_cancelled_anywhere_stay_within_bounds_redis() {
    store_operations_stay_within_bounds(&Bench::redis().await).await;
}

// ----------------------------------------------------------------------------------------
// A reply really late: sent, executed by Redis, held in the network when the caller goes

impl Bench {
    fn proxy(&self) -> &Proxy {
        match self {
            Bench::Redis { proxy, .. } => proxy,
            _ => panic!("only the Redis bench has a proxy"),
        }
    }
}

/// Polls `future` once (on a warm store that sends its call), waits until Redis has
/// executed the call while the proxy holds the reply, and drops the future; then lets the
/// reply through, to a caller that is gone.
async fn drop_while_reply_held<F: Future>(proxy: &Proxy, future: F, what: &str) {
    let mut future = Box::pin(future);
    let answered = proxy.answered();
    proxy.hold();
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(
        future.as_mut().poll(&mut cx).is_pending(),
        "{what}: answered without Redis"
    );
    let executed = proxy
        .wait_answered_beyond(answered, Duration::from_secs(2))
        .await;
    drop(future);
    proxy.release();
    assert!(executed, "{what}: the call never reached Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_dropped_while_their_reply_is_late_redis() {
    let bench = Bench::redis().await;
    let proxy = bench.proxy();
    let mut findings = Findings::default();
    let warm = async |limiter: &Limiter<DynStore>, key: &Key| {
        // Connected, the script loaded and the server's run_id read: the next call is one
        // EVALSHA, sent on its first poll.
        limiter.peek(key).await.unwrap();
    };

    // Bound: a check and a refund are each applied once.
    let limiter = Limiter::builder()
        .store(bench.store())
        .policy(calls())
        .build()
        .unwrap();
    let key = Key::new("tenant", "late-check");
    warm(&limiter, &key).await;
    drop_while_reply_held(proxy, limiter.check(&key, 3), "check").await;
    bench.quiesce().await;
    assert_eq!(used(limiter.store(), &key, &calls()).await, 3);
    drop_while_reply_held(proxy, limiter.refund(&key, 3), "refund").await;
    bench.quiesce().await;
    assert_eq!(used(limiter.store(), &key, &calls()).await, 0);

    // The connection survives replies nobody waits for: the next call is answered.
    assert!(limiter.check(&key, 1).await.unwrap().is_allowed());

    // Bound: a settlement is applied once (executed: the actual cost), and the
    // reservation's slot comes back with the dropped future.
    let limiter = reserving_limiter(bench.store());
    let key = Key::new("tenant", "late-settle");
    let reservation = limiter.reserve(&key, ESTIMATE).await.unwrap();
    drop_while_reply_held(proxy, reservation.settle(30), "settle").await;
    bench.quiesce().await;
    assert_eq!(used(limiter.store(), &key, &tokens()).await, 30);
    findings.add(no_slot_held(&bench, &limiter, &key, "settle, reply held").await);

    // Bound: a reservation is charged once (executed: its estimate) and holds no slot.
    let limiter = reserving_limiter(bench.store());
    let key = Key::new("tenant", "late-reserve");
    warm(&limiter, &key).await;
    drop_while_reply_held(proxy, limiter.reserve(&key, ESTIMATE), "reserve").await;
    bench.quiesce().await;
    assert_eq!(used(limiter.store(), &key, &tokens()).await, ESTIMATE);
    findings.add(no_slot_held(&bench, &limiter, &key, "reserve, reply held").await);

    // Bound: the slot an acquisition took is never left held.
    let limiter = slot_limiter(bench.store());
    let key = Key::new("tenant", "late-acquire");
    warm(&limiter, &key).await;
    drop_while_reply_held(proxy, limiter.acquire(&key), "acquire").await;
    bench.quiesce().await;
    assert_eq!(
        used(limiter.store(), &key, &calls()).await,
        1,
        "charged once"
    );
    findings.add(no_slot_held(&bench, &limiter, &key, "acquire, reply held").await);
    findings.assert_none();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquisition_dropped_after_its_batch_ran_holds_no_slot_redis() {
    let bench = Bench::redis().await;
    let proxy = bench.proxy();
    // One script call in flight at a time: a second decision queues behind the first and
    // leaves in the batch sent when the first comes back.
    let store = RedisStore::builder()
        .prefix(PREFIX)
        .clock(bench.clock().clone())
        .max_in_flight(1)
        .build_with_url(&proxy.url())
        .unwrap();
    let limiter = slot_limiter(DynStore::new(store));
    let key = Key::new("tenant", "queued");
    limiter.peek(&key).await.unwrap();
    let late = Duration::from_millis(60);
    proxy.set_delay(late);

    let before = proxy.answered();
    let first = tokio::spawn({
        let (limiter, key) = (limiter.clone(), key.clone());
        async move { limiter.acquire(&key).await.unwrap() }
    });
    assert!(
        proxy.wait_answered_beyond(before, late).await,
        "first call sent"
    );
    let first_answered = proxy.answered();
    // The first call's reply is on its way: the second decision queues.
    let mut second = Box::pin(limiter.acquire(&key));
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(second.as_mut().poll(&mut cx).is_pending());
    // Its batch leaves when the first reply arrives; once Redis executed it, its caller goes.
    let ran = proxy.wait_answered_beyond(first_answered, late * 3).await;
    drop(second);
    proxy.set_delay(REPLY_DELAY);
    assert!(ran, "the queued decision's batch never ran");
    let permit = first.await.unwrap();
    assert!(permit.is_allowed());
    drop(permit);
    bench.quiesce().await;
    // Bound: the queued acquisition's slot is not left held.
    let ctx = "queued acquisition, dropped after its batch ran";
    if let Err(finding) = no_slot_held(&bench, &limiter, &key, ctx).await {
        panic!("{finding}");
    }
}

// ----------------------------------------------------------------------------------------
// Leases: grants and returns

/// A leasable policy whose blocks are charged to the window they are spent in.
fn leased() -> Policy {
    Policy::builder("leased", Rate::per_hour(1_000))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap()
}

/// Long enough that the background sweep (every half lease time) never runs during a
/// test: blocks end when the manual clock says so, and only the call under test returns
/// them.
const LEASE: Duration = Duration::from_secs(10);

fn leased_store<S: LeaseBackend>(backend: S, clock: &ManualClock) -> LeasedStore<S> {
    LeasedStore::builder(backend)
        .clock(clock.clone())
        .lease_time(LEASE)
        .build()
        .unwrap()
}

/// Decides `key` until a block is in hand (and, with `spend`, used up); the requests
/// admitted.
async fn lease_a_block<S: LeaseBackend>(store: &LeasedStore<S>, key: &Key, spend: bool) -> u64 {
    let p = [leased()];
    let mut leased = false;
    for admitted in 0..500 {
        let held = store.stats().units_held;
        leased |= held > 0;
        if leased && (!spend || held == 0) {
            return admitted;
        }
        assert!(store.check(key, &p, &[1]).await.unwrap().is_allowed());
    }
    panic!("no block was leased in 500 decisions");
}

/// The units the ledger has charged `key`.
async fn ledger_used<S: LeaseBackend>(store: &LeasedStore<S>, key: &Key) -> u64 {
    let d = store.peek(key, &[leased()], &[0]).await.unwrap();
    d.limit().saturating_sub(d.remaining())
}

/// Where the leased cases run: a memory ledger behind a gate, or a fresh Redis store per
/// case through the proxy.
async fn leased_grant_costs_at_most_its_unit<S: LeaseBackend>(
    bench: &Bench,
    backend: impl Fn() -> S,
    points_at_least: usize,
) {
    let mut findings = Findings::default();
    for expired in [false, true] {
        for moment in MOMENTS {
            let block = if expired {
                "the block in hand ended unused"
            } else {
                "the block in hand used up"
            };
            let what = format!(
                "LeasedStore::check needing a grant ({block}) on {}",
                bench.name()
            );
            let mut points = Points::new(what, moment);
            while let Some(k) = points.next_k() {
                let store = leased_store(backend(), bench.clock());
                let key = key(if expired { "grant-ended" } else { "grant" }, k, moment);
                let mut admitted = lease_a_block(&store, &key, !expired).await;
                if expired {
                    // The block ends with units left: the grant gives them back in its call.
                    bench.clock().advance(LEASE + Duration::from_millis(1));
                }
                bench.flush_scripts();
                let run = points.drive(store.check(&key, &[leased()], &[1])).await;
                let completed = matches!(run, Run::Completed(..));
                if let Some(d) = run.output() {
                    assert!(d.unwrap().is_allowed(), "{points}: refused");
                    admitted += 1;
                }
                // What is still in hand goes back; what is left charged was spent, or lost.
                store.shutdown().await;
                bench.quiesce().await;
                let charged = ledger_used(&store, &key).await;
                // Bound (the lease invariant): a unit admitted is a unit charged.
                assert!(
                    charged >= admitted,
                    "{points}: {admitted} admitted, {charged} charged: over-admission"
                );
                // Bound: a cancelled grant costs at most the cancelled request's own unit;
                // the block it was granted, and the one it was giving back, are not lost.
                let lost = charged - admitted;
                findings.check(lost <= u64::from(!completed), || {
                    format!("{points}: {lost} units charged that no request was admitted for")
                });
            }
            points.assert_visited(points_at_least);
        }
    }
    findings.assert_none();
}

#[tokio::test]
async fn a_grant_cancelled_anywhere_loses_no_block_memory() {
    let bench = Bench::memory(Stops::BeforeAndAfter);
    let ledger = MemoryLedger::with_clock(bench.clock().clone());
    let backend = || Gated::new(ledger.clone(), Stops::BeforeAndAfter);
    leased_grant_costs_at_most_its_unit(&bench, backend, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_cancelled_anywhere_loses_no_block_redis() {
    let bench = Bench::redis().await;
    let backend = || redis_store(bench.proxy(), bench.clock());
    leased_grant_costs_at_most_its_unit(&bench, backend, 3).await;
}

async fn leased_shutdown_returns_at_most_once<S: LeaseBackend>(
    bench: &Bench,
    backend: impl Fn() -> S,
    points_at_least: usize,
) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        let what = format!("LeasedStore::shutdown on {}", bench.name());
        let mut points = Points::new(what, moment);
        while let Some(k) = points.next_k() {
            let store = leased_store(backend(), bench.clock());
            let key = key("return", k, moment);
            let admitted = lease_a_block(&store, &key, false).await;
            let in_hand = store.stats().units_held;
            bench.flush_scripts();
            let run = points.drive(store.shutdown()).await;
            let completed = matches!(run, Run::Completed(..));
            bench.quiesce().await;
            // Whatever the cancelled shutdown did not take, a second one gives back.
            store.shutdown().await;
            bench.quiesce().await;
            let charged = ledger_used(&store, &key).await;
            // Bound: a block is given back at most once: a unit admitted stays charged.
            assert!(
                charged >= admitted,
                "{points}: {admitted} admitted, {charged} charged: a block given back twice"
            );
            // Bound: a completed shutdown gives every unused unit back; a cancelled one loses
            // at most the units it held, as an instance dropped without a shutdown does.
            let lost = charged - admitted;
            let bound = if completed { 0 } else { in_hand };
            findings.check(lost <= bound, || {
                format!("{points}: {lost} units lost, {in_hand} were in hand")
            });
            if lost > 0 && std::env::var_os("CANCEL_TRACE").is_some() {
                eprintln!("{points}: {lost} of {in_hand} units in hand lost");
            }
        }
        points.assert_visited(points_at_least);
    }
    findings.assert_none();
}

#[tokio::test]
async fn a_shutdown_cancelled_anywhere_gives_back_at_most_once_memory() {
    let bench = Bench::memory(Stops::BeforeAndAfter);
    let ledger = MemoryLedger::with_clock(bench.clock().clone());
    let backend = || Gated::new(ledger.clone(), Stops::BeforeAndAfter);
    leased_shutdown_returns_at_most_once(&bench, backend, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_cancelled_anywhere_gives_back_at_most_once_redis() {
    let bench = Bench::redis().await;
    let backend = || redis_store(bench.proxy(), bench.clock());
    leased_shutdown_returns_at_most_once(&bench, backend, 3).await;
}

// ----------------------------------------------------------------------------------------
// The layer: RateLimitService's future, and a response body dropped before its end

const FRAMES: usize = 3;

/// What each frame of a response carries: ten units for a stream meter counting bytes.
const FRAME: &[u8] = b"0123456789";

/// The estimate of a stream-metered route, between one frame's count and two frames'.
const STREAM_ESTIMATE: u64 = 15;

/// A response body of [`FRAMES`] frames of [`FRAME`].
struct Frames {
    left: usize,
}

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(FRAME)))))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }
}

/// The inner service: one await (a yield), then a response of [`FRAMES`] frames.
async fn handler(_req: Request<()>) -> Result<Response<Frames>, Infallible> {
    tokio::task::yield_now().await;
    Ok(Response::new(Frames { left: FRAMES }))
}

fn tenant_request(material: &str) -> Request<()> {
    Request::get("/")
        .header("x-tenant", material)
        .body(())
        .unwrap()
}

fn layer_limiter(store: DynStore, route: Route) -> Limiter<DynStore> {
    Limiter::builder()
        .store(store)
        .default_route(route)
        .extractor(support::by_tenant())
        .build()
        .unwrap()
}

async fn layer_call_holds_nothing(bench: &Bench) {
    let mut findings = Findings::default();
    for moment in MOMENTS {
        let what = format!("RateLimitService::call on {}", bench.name());
        let mut points = Points::new(what, moment);
        while let Some(k) = points.next_k() {
            let route = Route::new().policy(running()).policy(calls());
            let limiter = layer_limiter(bench.store(), route);
            let mut service =
                RateLimitLayer::new(limiter.clone()).layer(tower::service_fn(handler));
            let material = format!("layer-{k}-{moment:?}");
            let key = Key::new("tenant", &material);
            bench.flush_scripts();
            ServiceExt::<Request<()>>::ready(&mut service)
                .await
                .unwrap();
            let run = points.drive(service.call(tenant_request(&material))).await;
            let completed = matches!(run, Run::Completed(..));
            if let Some(response) = run.output() {
                let response = response.unwrap();
                assert_eq!(response.status(), 200, "{points}");
                // The body, dropped unread: before its end.
                drop(response);
            }
            bench.quiesce().await;
            // Bound: the rate policy beside the slot is charged at most once.
            let charged = used(limiter.store(), &key, &calls()).await;
            findings.check(charged <= 1 && (!completed || charged == 1), || {
                format!("{points}: {charged} calls charged")
            });
            findings.add(no_slot_held(bench, &limiter, &key, &points.to_string()).await);
        }
        // The store's awaits, and the handler's own.
        points.assert_visited(bench.call_points(1, true) + 1);
    }
    findings.assert_none();
}

#[tokio::test]
async fn the_layer_cancelled_anywhere_holds_nothing_memory() {
    layer_call_holds_nothing(&Bench::memory(Stops::Before)).await;
}

/// The one await point of the store is the layer's future before its first poll: the check
/// has been made (in `call`), and with it the memory store's charge.
#[tokio::test]
async fn the_layer_cancelled_anywhere_holds_nothing_resilient_memory() {
    layer_call_holds_nothing(&Bench::resilient_memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_cancelled_anywhere_holds_nothing_redis() {
    layer_call_holds_nothing(&Bench::redis().await).await;
}

async fn a_body_dropped_before_its_end_settles_what_it_counted(bench: &Bench) {
    let mut findings = Findings::default();
    for read in 0..=FRAMES {
        let count = |frame: &Bytes| frame.len() as u64;
        let route = Route::new().policy(running()).metered(
            tokens(),
            Meter::fixed(STREAM_ESTIMATE).settle_from_stream(count),
        );
        let limiter = layer_limiter(bench.store(), route);
        let mut service = RateLimitLayer::new(limiter.clone()).layer(tower::service_fn(handler));
        let material = format!("body-{read}");
        let key = Key::new("tenant", &material);
        let ctx = format!(
            "a response body on {} dropped after {read} of {FRAMES} frames",
            bench.name()
        );
        let response = ServiceExt::<Request<()>>::ready(&mut service)
            .await
            .unwrap()
            .call(tenant_request(&material))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        for _ in 0..read {
            body.frame().await.unwrap().unwrap();
        }
        drop(body);
        bench.quiesce().await;
        // Bound: a stream is settled with what was counted: at its end, the count; dropped
        // before it, the count so far, and at least the estimate.
        let counted = (read * FRAME.len()) as u64;
        let due = if read == FRAMES {
            counted
        } else {
            counted.max(STREAM_ESTIMATE)
        };
        let store = limiter.store();
        let settled_right = settled(async || used(store, &key, &tokens()).await == due).await;
        let charged = used(store, &key, &tokens()).await;
        findings.check(settled_right, || {
            format!("{ctx}: {charged} units charged, {due} due ({counted} counted, estimate {STREAM_ESTIMATE})")
        });
        // Bound: the slot goes with the body.
        findings.add(no_slot_held(bench, &limiter, &key, &ctx).await);
    }
    findings.assert_none();
}

#[tokio::test]
async fn a_body_dropped_before_its_end_settles_what_it_counted_memory() {
    a_body_dropped_before_its_end_settles_what_it_counted(&Bench::memory(Stops::Before)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dropped_before_its_end_settles_what_it_counted_redis() {
    a_body_dropped_before_its_end_settles_what_it_counted(&Bench::redis().await).await;
}

// ----------------------------------------------------------------------------------------
// Over HTTP: 300 requests each given up after 0–3 ms

/// 300 requests, each wrapped in a timeout of 0 to 3 ms (what a timeout layer, an HTTP/2
/// reset or a proxy giving up does), against `in_flight("running", 4)` on a shared key;
/// afterwards every slot is free.
async fn three_hundred_given_up_requests<S: Store + Clone>(
    store: S,
    slots_in_redis: impl Fn() -> Option<u64>,
) where
    S::CheckFuture: Send,
{
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::in_flight("running", SLOTS).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                "done"
            }),
        )
        .route(
            "/hold",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "held"
            }),
        )
        .layer(RateLimitLayer::new(limiter.clone()));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300u64 {
        // Spread over 0 to 3 ms, in an order that mixes short and long ones.
        let patience = Duration::from_micros(i * 7_919 % 3_001);
        let (client, url) = (client.clone(), format!("http://{addr}/"));
        tasks.spawn(async move {
            let _ = tokio::time::timeout(patience, client.get(url).send()).await;
        });
        if tasks.len() >= 16 {
            tasks.join_next().await;
        }
    }
    while tasks.join_next().await.is_some() {}

    // Bound: every slot comes back within SETTLE of the last request given up.
    let global = Key::global("all");
    let store = limiter.store();
    let free = settled(async || {
        used(store, &global, &running()).await == 0 && slots_in_redis().unwrap_or(0) == 0
    })
    .await;
    assert!(
        free,
        "{} slot(s) held {SETTLE:?} after 300 given-up requests (Redis slot set: {:?})",
        used(store, &global, &running()).await,
        slots_in_redis()
    );
    // ... and SLOTS requests at once are all admitted, one more is refused.
    let held: Vec<_> = (0..SLOTS)
        .map(|_| tokio::spawn(client.get(format!("http://{addr}/hold")).send()))
        .collect();
    // Once all of them are in (a loaded machine may take a while to open the connections).
    let started = std::time::Instant::now();
    while used(store, &global, &running()).await < SLOTS
        && started.elapsed() < Duration::from_millis(1_500)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        used(store, &global, &running()).await,
        SLOTS,
        "all {SLOTS} in"
    );
    let over = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(
        over.status(),
        429,
        "the limit holds while {SLOTS} are in flight"
    );
    for h in held {
        let status = h.await.unwrap().unwrap().status();
        assert_eq!(
            status, 200,
            "{SLOTS} concurrent requests after the given-up ones"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_given_up_requests_leave_every_slot_free_memory() {
    three_hundred_given_up_requests(MemoryStore::new(), || None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_given_up_requests_leave_every_slot_free_redis() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .prefix("http300")
        .build_with_url(&server.url())
        .unwrap();
    let state = format!("http300:{{{}}}:running:inf", Key::global("all").as_str());
    let slots = || Some(server.query::<u64>(&["ZCARD", &state]).unwrap());
    three_hundred_given_up_requests(store, slots).await;
}

// ----------------------------------------------------------------------------------------
// ResilientStore: a call given up by its timeout

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_by_the_resilient_timeout_leaves_no_slot_redis() {
    let bench = Bench::redis().await;
    let proxy = bench.proxy();
    let mut findings = Findings::default();
    let modes = [
        FailureMode::FailOpen,
        FailureMode::FailClosed,
        FailureMode::LocalFallback { replicas: 1 },
    ];
    for mode in modes {
        let primary = redis_store(proxy, bench.clock());
        let store = ResilientStore::builder(primary.clone(), mode)
            .timeout(Duration::from_millis(20))
            .build()
            .unwrap();
        let limiter = slot_limiter(DynStore::new(store));
        let direct = slot_limiter(DynStore::new(primary));
        let key = Key::new("tenant", format!("resilient-{mode:?}"));
        // Connected, the script loaded, before the replies turn late.
        direct.peek(&key).await.unwrap();
        let late = Duration::from_millis(80);
        proxy.set_delay(late);
        let answered = proxy.answered();
        let permit = limiter.acquire(&key).await.unwrap();
        let decided_by = permit.decided_by();
        drop(permit);
        // The call reached Redis, which executed it; its reply came after the timeout.
        let executed = proxy.wait_answered_beyond(answered, late).await;
        proxy.set_delay(REPLY_DELAY);
        assert!(executed, "{mode:?}: the call never reached Redis");
        tokio::time::sleep(late).await;
        // Bound: a call given up by the timeout leaves no slot held in Redis (its slot id is
        // the client's, so it can be released without the reply).
        let free = settled(async || bench.slots_in_redis(&key) == Some(0)).await;
        findings.check(free, || {
            format!(
                "ResilientStore ({mode:?}, decided by {decided_by:?}) after a timed-out \
                 acquisition: {:?} slot(s) left in Redis {SETTLE:?} after its late reply",
                bench.slots_in_redis(&key)
            )
        });
        if free {
            // Direct to Redis, so the breaker the timeout fed plays no part.
            let ctx = format!("ResilientStore ({mode:?})");
            findings.add(no_slot_held(&bench, &direct, &key, &ctx).await);
        }
    }
    findings.assert_none();
}
