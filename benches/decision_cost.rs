//! Instruction-count companion to `benches/memory.rs`: runs one side's checks in a loop so
//! `valgrind --tool=callgrind` can count instructions per check, which — unlike times — do not
//! change with host noise.
//!
//! ```text
//! cargo bench --bench decision_cost --no-run
//! BIN=$(ls -t target/release/deps/decision_cost-* | grep -v '\.d$' | head -1)
//! for side in tollgate_gcra tollgate_counter governor; do
//!   for n in 100000 200000; do
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null $BIN $side 10000 $n 2>&1 | grep refs
//!   done
//! done
//! ```
//!
//! Instructions per check = (refs at 200 000 − refs at 100 000) / 100 000, which cancels the
//! set-up cost. `benches/scripts/callgrind.sh` also counts only inside [`measured`]
//! (`--toggle-collect`), because start-up work such as the clock's calibration runs for a
//! stretch of time rather than a number of instructions, and under valgrind that moved the
//! difference by ±50 instructions per check.
//!
//! The `layer_*` sides count a whole request through an in-process `tower::Service` stack as
//! in `benches/layer.rs` (build the request, call, poll once, drop the response), bare or
//! behind tollgate's or tower_governor's layer, with `<keys>` distinct peer addresses.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use std::num::NonZeroU32;

use governor::{Quota, RateLimiter};
use tollgate::key::Key;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Policy, Rate};

/// The no-op inner service.
#[derive(Clone, Copy)]
struct Hello;

impl tower::Service<Request<Body>> for Hello {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
}

fn layer_with<L>(layer: L, nkeys: usize, checks: usize)
where
    L: tower::Layer<Hello>,
    L::Service: tower::Service<Request<Body>>,
    <L::Service as tower::Service<Request<Body>>>::Error: std::fmt::Debug,
{
    drive(layer.layer(Hello), nkeys, checks);
}

/// Sends `checks` requests through `svc`, each polled once (every side answers at once).
fn drive<S>(mut svc: S, nkeys: usize, checks: usize)
where
    S: tower::Service<Request<Body>>,
    S::Error: std::fmt::Debug,
{
    let peers: Vec<SocketAddr> = (0..nkeys)
        .map(|i| SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 40_000)))
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    measured(checks, |i| {
        let req = Request::builder()
            .uri("/")
            .extension(ConnectInfo(peers[i % nkeys]))
            .body(Body::empty())
            .unwrap();
        let Poll::Ready(Ok(())) = svc.poll_ready(&mut cx) else {
            panic!("service not ready")
        };
        let fut = pin!(svc.call(req));
        let Poll::Ready(Ok(res)) = fut.poll(&mut cx) else {
            panic!("response not ready")
        };
        black_box(res);
    });
}

/// Runs `check` for `0..checks`; the only code callgrind counts.
#[inline(never)]
fn measured(checks: usize, check: impl FnMut(usize)) {
    (0..checks).for_each(check);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 || args.iter().any(|a| a == "--bench") {
        // `cargo bench` runs every bench binary with `--bench`: nothing to do here.
        eprintln!("usage: decision_cost <side> <keys> <checks>");
        return;
    }
    let side = args[1].as_str();
    let nkeys: usize = args[2].parse().expect("keys");
    let checks: usize = args[3].parse().expect("checks");
    let strs: Vec<String> = (0..nkeys)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    match side {
        "governor" => {
            let limiter =
                RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
            measured(checks, |i| {
                black_box(limiter.check_key(&strs[i % nkeys]).is_ok());
            });
        }
        "tollgate_gcra" | "tollgate_counter" => {
            let algorithm = if side == "tollgate_gcra" {
                Algorithm::Gcra
            } else {
                Algorithm::SlidingWindowCounter
            };
            let keys: Vec<Key> = strs.iter().map(|k| Key::new("ip", k)).collect();
            // No sweep within the run: under valgrind a run lasts long enough for the on-access
            // sweep (once a second per shard) to fire many times and drown the count; at full
            // speed it is once per several million checks.
            let store = MemoryStore::builder()
                .background_sweep(false)
                .sweep_interval(std::time::Duration::from_secs(3_600))
                .build()
                .unwrap();
            let policies = [Policy::builder("bench", Rate::per_second(1_000_000_000))
                .algorithm(algorithm)
                .build()
                .unwrap()];
            measured(checks, |i| {
                black_box(
                    store
                        .check_now(&keys[i % nkeys], &policies, &[1])
                        .is_some_and(|d| d.is_ok()),
                );
            });
        }
        "check_gcra" | "check_counter" | "check_now_gcra" | "check_now_counter" => {
            // The public path: `Limiter::check` on a memory store, polled once (a memory
            // store answers at once), or `Limiter::check_now`, which needs no future.
            let algorithm = if side.ends_with("gcra") {
                Algorithm::Gcra
            } else {
                Algorithm::SlidingWindowCounter
            };
            let keys: Vec<Key> = strs.iter().map(|k| Key::new("ip", k)).collect();
            let store = MemoryStore::builder()
                .background_sweep(false)
                .sweep_interval(std::time::Duration::from_secs(3_600))
                .build()
                .unwrap();
            let limiter = tollgate::Limiter::builder()
                .store(store)
                .policy(
                    Policy::builder("bench", Rate::per_second(1_000_000_000))
                        .algorithm(algorithm)
                        .build()
                        .unwrap(),
                )
                .build()
                .unwrap();
            if side.starts_with("check_now") {
                measured(checks, |i| {
                    let decision = limiter.check_now(&keys[i % nkeys], 1);
                    black_box(decision.is_some_and(|d| d.is_ok_and(|d| d.is_allowed())));
                });
                return;
            }
            let mut cx = Context::from_waker(Waker::noop());
            measured(checks, |i| {
                let fut = pin!(limiter.check(&keys[i % nkeys], 1));
                let Poll::Ready(decision) = fut.poll(&mut cx) else {
                    panic!("a memory check answers at once")
                };
                black_box(decision.is_ok());
            });
        }
        "layer_bare" => drive(Hello, nkeys, checks),
        "layer_tollgate" | "layer_tollgate_no_headers" => {
            let limiter = tollgate::Limiter::builder()
                .policy(Policy::new("bench", Rate::per_second(1_000_000_000)).unwrap())
                .build()
                .unwrap();
            let layer = tollgate::RateLimitLayer::new(limiter)
                .quota_headers_on_success(side == "layer_tollgate");
            layer_with(layer, nkeys, checks);
        }
        "layer_tower_governor" | "layer_tower_governor_headers" => {
            use tower_governor::governor::GovernorConfigBuilder;
            let mut builder = GovernorConfigBuilder::default();
            builder.per_nanosecond(1).burst_size(1_000_000_000);
            if side == "layer_tower_governor" {
                layer_with(
                    tower_governor::GovernorLayer::new(builder.finish().unwrap()),
                    nkeys,
                    checks,
                );
            } else {
                layer_with(
                    tower_governor::GovernorLayer::new(builder.use_headers().finish().unwrap()),
                    nkeys,
                    checks,
                );
            }
        }
        other => panic!("unknown side {other}"),
    }
}
