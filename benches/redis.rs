//! Redis-store decisions per second at concurrency 1, 16 and 64, next to a baseline: a raw
//! `EVALSHA` of the same script with the same keys and arguments over the same connection type
//! (a redis-rs `ConnectionManager`), with no tollgate code around it.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench redis --features redis
//! ```
//!
//! The two sides run interleaved (alternating which goes first) for `ROUNDS` rounds of
//! `SPAN` each; the report gives the median with min–max per side and the ratio of medians.
//! Keys use a prefix unique to the run and expire by themselves within seconds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::Script;
use tollgate::key::Key;
use tollgate::store::{RedisStore, Store};
use tollgate::{Policy, Rate};

const ROUNDS: usize = 5;
const SPAN: Duration = Duration::from_millis(1_500);
const CONCURRENCY: [usize; 3] = [1, 16, 64];

/// Runs `op` on `concurrency` tasks for `SPAN`; returns completed operations per second.
async fn measure<F, Fut>(concurrency: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + SPAN;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let op = op.clone();
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let mut n = 0;
                while Instant::now() < deadline {
                    op(t).await;
                    n += 1;
                }
                done.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("a benchmark task panicked");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let run = format!("tg-bench-{}", std::process::id());
    let policy = Policy::new("bench", Rate::per_second(100_000_000)).expect("valid policy");
    let policies = Arc::new([policy.clone()]);

    let store = RedisStore::builder()
        .prefix(format!("{run}-tollgate"))
        .build_with_url(&url)
        .expect("valid URL");
    if let Err(e) = store.ping().await {
        eprintln!("cannot reach Redis at {url}: {e}");
        std::process::exit(1);
    }

    // The baseline: the same script text, keys and arguments, sent by redis-rs alone.
    let script = Arc::new(Script::new(tollgate::store::redis::script_source()));
    let conn: ConnectionManager = redis::Client::open(url.as_str())
        .expect("valid URL")
        .get_connection_manager()
        .await
        .expect("baseline connection");
    let keys: Arc<Vec<String>> = Arc::new(
        (0..64)
            .map(|t| format!("{run}-raw:{{user:{t}}}:bench:swc"))
            .collect(),
    );
    let user_keys: Arc<Vec<Key>> =
        Arc::new((0..64).map(|t| Key::new("user", t.to_string())).collect());

    let tollgate_op = {
        let store = store.clone();
        let policies = Arc::clone(&policies);
        let user_keys = Arc::clone(&user_keys);
        move |t: usize| {
            let fut = store.check(&user_keys[t], &policies[..], &[1]);
            async move {
                let d = fut.await.expect("store error");
                assert!(d.is_allowed());
            }
        }
    };
    let raw_op = {
        let script = Arc::clone(&script);
        let keys = Arc::clone(&keys);
        let (limit, window) = (policy.limit(), policy.window_millis());
        move |t: usize| {
            let script = Arc::clone(&script);
            let keys = Arc::clone(&keys);
            let mut conn = conn.clone();
            async move {
                let reply: Vec<i64> = script
                    .key(&keys[t])
                    .arg("")
                    .arg(1)
                    .arg(1) // sliding window counter
                    .arg(limit)
                    .arg(window)
                    .arg(limit)
                    .arg(0)
                    .arg(1)
                    .invoke_async(&mut conn)
                    .await
                    .expect("EVALSHA failed");
                assert_eq!(reply[0], 1);
            }
        }
    };

    // Warm up both sides (loads the script, opens connections).
    measure(16, tollgate_op.clone()).await;
    measure(16, raw_op.clone()).await;

    println!(
        "Redis store vs raw EVALSHA, {ROUNDS} interleaved rounds of {} ms, decisions/s",
        SPAN.as_millis()
    );
    println!(
        "{:>5} | {:>26} | {:>26} | {:>6}",
        "conc", "tollgate median (min-max)", "raw EVALSHA median (min-max)", "ratio"
    );
    for &c in &CONCURRENCY {
        let (mut ours, mut raw) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            if round % 2 == 0 {
                ours.push(measure(c, tollgate_op.clone()).await);
                raw.push(measure(c, raw_op.clone()).await);
            } else {
                raw.push(measure(c, raw_op.clone()).await);
                ours.push(measure(c, tollgate_op.clone()).await);
            }
        }
        let fmt = |v: &mut Vec<f64>| {
            let m = median(v);
            let (lo, hi) = (v[0], v[v.len() - 1]);
            (m, format!("{m:>8.0} ({lo:.0}-{hi:.0})"))
        };
        let (mo, so) = fmt(&mut ours);
        let (mr, sr) = fmt(&mut raw);
        println!("{c:>5} | {so:>26} | {sr:>26} | {:>5.3}x", mo / mr);
    }
}
