//! The cost of the layer in an in-process `tower::Service` stack: a no-op inner service bare,
//! behind tollgate's `RateLimitLayer` (memory store, peer-IP keys, with and without the quota
//! headers on success), and behind tower_governor's `GovernorLayer` (peer-IP keys, with and
//! without its `x-ratelimit-*` headers), in the same run.
//!
//! Each iteration builds a request carrying a peer address (`ConnectInfo`), waits for
//! readiness, calls the service and polls the response future once (every side answers
//! without waiting, so no runtime is involved) and drops the response. Scenarios: one peer
//! and 10 000 peers, quotas so large that every request is allowed. The sides run interleaved
//! (A B C … A B C …, `ROUNDS` times); `benches/scripts/summarize.py` prints medians across rounds and
//! ratios.
//!
//! ```text
//! cargo bench --bench layer
//! python3 benches/scripts/summarize.py layer
//! ```

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

const ROUNDS: usize = 3;

fn peers(n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| {
            let ip = Ipv4Addr::new(10, (i >> 16) as u8, (i >> 8) as u8, i as u8);
            SocketAddr::new(IpAddr::V4(ip), 40_000)
        })
        .collect()
}

async fn hello(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

/// Calls `svc` once per iteration with the next peer; every future must be ready at once.
fn drive<S, B>(b: &mut criterion::Bencher<'_>, mut svc: S, peers: &[SocketAddr])
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut i = 0;
    b.iter(|| {
        i = (i + 1) % peers.len();
        let req = Request::builder()
            .uri("/")
            .extension(ConnectInfo(peers[i]))
            .body(Body::empty())
            .unwrap();
        let ready = pin!(svc.ready());
        let Poll::Ready(Ok(svc)) = ready.poll(&mut cx) else {
            panic!("service not ready")
        };
        let fut = pin!(svc.call(req));
        let Poll::Ready(Ok(res)) = fut.poll(&mut cx) else {
            panic!("response not ready")
        };
        black_box(res);
    });
}

fn tollgate_layer(headers: bool) -> RateLimitLayer {
    let limiter = Limiter::builder()
        .policy(Policy::new("bench", Rate::per_second(1_000_000_000)).unwrap())
        .build()
        .unwrap();
    RateLimitLayer::new(limiter).quota_headers_on_success(headers)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    let inner = tower::service_fn(hello);

    for &(scenario, n) in &[("1_peer", 1usize), ("10k_peers", 10_000)] {
        let peers = peers(n);
        for round in 0..ROUNDS {
            group.bench_function(format!("bare/{scenario}/r{round}"), |b| {
                drive(b, inner, &peers)
            });
            let layer = tollgate_layer(true);
            group.bench_function(format!("tollgate_headers/{scenario}/r{round}"), |b| {
                drive(b, layer.layer(inner), &peers)
            });
            let layer = tollgate_layer(false);
            group.bench_function(format!("tollgate_no_headers/{scenario}/r{round}"), |b| {
                drive(b, layer.layer(inner), &peers)
            });
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000_000)
                .finish()
                .unwrap();
            let layer = GovernorLayer::new(config);
            group.bench_function(format!("tower_governor/{scenario}/r{round}"), |b| {
                drive(b, layer.layer(inner), &peers)
            });
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000_000)
                .use_headers()
                .finish()
                .unwrap();
            let layer = GovernorLayer::new(config);
            group.bench_function(format!("tower_governor_headers/{scenario}/r{round}"), |b| {
                drive(b, layer.layer(inner), &peers)
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // No plots: rendering them for every benchmark took minutes of `cargo bench` on a busy
    // machine; the numbers are in target/criterion and benches/scripts/summarize.py reads them.
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
