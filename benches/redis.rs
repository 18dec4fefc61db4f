//! The Redis path: decisions per second and p50/p99 latency for each algorithm's script at
//! concurrency 1, 16, 64 and 256, next to the ceiling measured in the same run; round trips
//! per decision; and a hot denied key with and without the local deny cache.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench redis --features redis
//! ```
//!
//! * **Ceiling**: a raw `EVALSHA` of a trivial script (`return 1`) over the same kind of
//!   connection (one multiplexed redis-rs `ConnectionManager`), with no tollgate code; and, for
//!   the default algorithm, a raw `EVALSHA` of tollgate's own script (what the Lua costs
//!   without the Rust around it). Where `redis-benchmark` is on the `PATH`, its `EVALSHA` of
//!   the trivial script at the same concurrency is printed too (a C client, pipelining
//!   nothing: the server's own ceiling).
//! * The sides run interleaved (the order reversed every other round) for `ROUNDS` rounds of
//!   `SPAN` each; a row gives the median with min–max of the rounds, the median p50 and p99
//!   latency, and the ratio to the trivial-script ceiling.
//! * **Round trips** come from the delta of `INFO commandstats` over a run of sequential
//!   decisions: the commands a client sends (`EVALSHA`, `EVAL`, `SCRIPT`, …); the commands the
//!   script runs inside Redis are listed too but cost no round trip. The counters are server-wide: on a Redis that others use at the same time the
//!   counts include their commands (run against a private `redis-server` for exact counts).
//!
//! `ONLY=64` runs one concurrency; `MAX_IN_FLIGHT` and `MAX_BATCH` set the store's
//! coalescing (defaults 2 and 128).
//!
//! Keys use a prefix unique to the run and expire by themselves within seconds; nothing is
//! flushed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::Script;
use tollgate::key::Key;
use tollgate::store::{FailureMode, RedisStore, ResilientStore, Store};
use tollgate::{Algorithm, Policy, Rate};

const ROUNDS: usize = 3;
const SPAN: Duration = Duration::from_millis(1_000);
const CONCURRENCY: [usize; 4] = [1, 16, 64, 256];
const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::Gcra,
];

/// One run of one side: operations per second and latency percentiles in microseconds.
struct Sample {
    ops: f64,
    /// Operations completed.
    count: usize,
    p50: f64,
    p99: f64,
}

/// Runs `op` on `concurrency` tasks for `SPAN`.
async fn measure<F, Fut>(concurrency: usize, op: F) -> Sample
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = Instant::now();
    let deadline = start + SPAN;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(4096);
                loop {
                    let t0 = Instant::now();
                    if t0 >= deadline {
                        break;
                    }
                    op(t).await;
                    lat.push(t0.elapsed().as_nanos() as u32);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a benchmark task panicked"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |&ns| ns as f64 / 1_000.0)
    };
    Sample {
        ops: all.len() as f64 / elapsed,
        count: all.len(),
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn span(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    (lo, hi)
}

async fn commandstats(conn: &mut ConnectionManager) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Commands the server counted between two snapshots, leaving out `INFO` itself.
fn commands_between(a: &HashMap<String, u64>, b: &HashMap<String, u64>) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = b
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, &calls)| (name.clone(), calls - a.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    out.sort();
    out
}

/// Commands a client sends; the rest in `INFO commandstats` ran inside the script.
const CLIENT_COMMANDS: [&str; 5] = ["evalsha", "eval", "script", "unlink", "ping"];

fn policy(algorithm: Algorithm) -> Policy {
    // The log keeps one entry per request and accepts at most 100 000 per window.
    let rate = if algorithm == Algorithm::SlidingWindowLog {
        Rate::per_second(100_000)
    } else {
        Rate::per_second(100_000_000)
    };
    Policy::builder("bench", rate)
        .algorithm(algorithm)
        .build()
        .expect("valid policy")
}

fn tollgate_op<S: Store + Clone>(
    store: S,
    policies: Arc<[Policy; 1]>,
    keys: Arc<Vec<Key>>,
    hot: bool,
) -> impl Fn(usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
       + Clone
       + Send
       + 'static {
    move |t: usize| {
        let fut = store.check(&keys[if hot { 0 } else { t }], &policies[..], &[1]);
        Box::pin(async move {
            let d = fut.await.expect("store error");
            assert!(d.is_allowed());
        })
    }
}

/// Charge (1), one policy, state 1, cost 1.0: little-endian u8, u32, u32, f64.
const REQUEST: [u8; 17] = [1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let run = format!("tg-bench-{}", std::process::id());
    let client = redis::Client::open(url.as_str()).expect("valid URL");
    let mut conn: ConnectionManager = match client.get_connection_manager().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot reach Redis at {url}: {e}");
            std::process::exit(1);
        }
    };
    // MAX_IN_FLIGHT and MAX_BATCH override the store's coalescing settings, to compare them.
    let setting = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let store = RedisStore::builder()
        .prefix(format!("{run}-tollgate"))
        .max_in_flight(setting(
            "MAX_IN_FLIGHT",
            tollgate::store::redis::DEFAULT_MAX_IN_FLIGHT,
        ))
        .max_batch(setting(
            "MAX_BATCH",
            tollgate::store::redis::DEFAULT_MAX_BATCH,
        ))
        .build_with_url(&url)
        .expect("valid URL");
    // ONLY=64 runs one concurrency (and skips the rest), for quick comparisons.
    let only: Option<usize> = std::env::var("ONLY").ok().and_then(|v| v.parse().ok());
    store.ping().await.expect("Redis reachable");
    let max_c = *CONCURRENCY.iter().max().unwrap();
    let user_keys: Arc<Vec<Key>> = Arc::new(
        (0..max_c)
            .map(|t| Key::new("user", t.to_string()))
            .collect(),
    );

    // Round trips per decision.
    println!("Round trips: INFO commandstats delta over 1000 sequential decisions per algorithm");
    for algorithm in ALGORITHMS {
        let policies = [policy(algorithm)];
        let key = Key::new("user", format!("rt-{algorithm}"));
        store.check(&key, &policies, &[1]).await.expect("check");
        let before = commandstats(&mut conn).await;
        for _ in 0..1000 {
            store.check(&key, &policies, &[1]).await.expect("check");
        }
        let after = commandstats(&mut conn).await;
        let counted = commands_between(&before, &after);
        let trips: u64 = counted
            .iter()
            .filter(|(c, _)| CLIENT_COMMANDS.contains(&c.as_str()))
            .map(|(_, n)| n)
            .sum();
        let list: Vec<String> = counted.iter().map(|(c, n)| format!("{c}={n}")).collect();
        println!(
            "  {:<24} {:.3} round trips/decision (all commands counted: {})",
            algorithm.to_string(),
            trips as f64 / 1000.0,
            list.join(" ")
        );
    }

    // The ceilings.
    let trivial = Arc::new(Script::new("return 1"));
    let trivial_op = {
        let conn = conn.clone();
        move |_t: usize| {
            let trivial = Arc::clone(&trivial);
            let mut conn = conn.clone();
            Box::pin(async move {
                let one: i64 = trivial.invoke_async(&mut conn).await.expect("EVALSHA");
                assert_eq!(one, 1);
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }
    };
    let raw_keys: Arc<Vec<String>> = Arc::new(
        (0..max_c)
            .map(|t| format!("{run}-raw:{{user:{t}}}:bench:swc"))
            .collect(),
    );
    let script = Arc::new(Script::new(tollgate::store::redis::script_source()));
    let raw_op = {
        let conn = conn.clone();
        let (limit, window) = (100_000_000u64, 1_000u64);
        move |t: usize| {
            let script = Arc::clone(&script);
            let keys = Arc::clone(&raw_keys);
            let mut conn = conn.clone();
            Box::pin(async move {
                // One policy (the sliding window counter), one state of policy 1 and its
                // override key, one request charging 1 unit to state 1, as one binary
                // argument (the layout of src/store/redis/wire.rs for one policy and state).
                let mut one: Vec<u8> = [1, limit, window, limit, 0]
                    .iter()
                    .flat_map(|&x| (x as f64).to_le_bytes())
                    .collect();
                one.extend_from_slice(&1u32.to_le_bytes());
                one.extend_from_slice(&REQUEST);
                let reply: Vec<u8> = script
                    .key(&keys[t])
                    .key(format!("{}:ovr", keys[t]))
                    .arg("")
                    .arg(&one[..])
                    .invoke_async(&mut conn)
                    .await
                    .expect("EVALSHA failed");
                // Packed: allowed (i8), then the policy's allowed (i8) and four f64.
                assert_eq!((reply.len(), reply[0]), (34, 1));
            }) as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        }
    };

    type Op = Box<
        dyn Fn(usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            + Send
            + Sync,
    >;
    let mut sides: Vec<(String, Arc<Op>)> = vec![
        (
            "trivial EVALSHA".into(),
            Arc::new(Box::new(trivial_op) as Op),
        ),
        ("raw swc EVALSHA".into(), Arc::new(Box::new(raw_op) as Op)),
    ];
    for algorithm in ALGORITHMS {
        let op = tollgate_op(
            store.clone(),
            Arc::new([policy(algorithm)]),
            Arc::clone(&user_keys),
            false,
        );
        sides.push((
            format!("tollgate {algorithm}"),
            Arc::new(Box::new(op) as Op),
        ));
    }
    // The same without coalescing: one script call per decision.
    let single = RedisStore::builder()
        .prefix(format!("{run}-single"))
        .max_batch(1)
        .build_with_url(&url)
        .expect("valid URL");
    let counter = Arc::new([policy(Algorithm::SlidingWindowCounter)]);
    for (name, store, hot) in [
        ("tollgate swc, max_batch 1", &single, false),
        ("tollgate swc, one hot key", &store, true),
        ("tollgate swc, hot key, max_batch 1", &single, true),
    ] {
        let op = tollgate_op(
            store.clone(),
            Arc::clone(&counter),
            Arc::clone(&user_keys),
            hot,
        );
        sides.push((name.into(), Arc::new(Box::new(op) as Op)));
    }
    let call = |op: &Arc<Op>| {
        let op = Arc::clone(op);
        move |t: usize| op(t)
    };
    // Warm up (loads the scripts, opens connections).
    for (_, op) in &sides {
        measure(16, call(op)).await;
    }

    println!(
        "\nDecisions per second, {ROUNDS} interleaved rounds of {} ms; latency in µs",
        SPAN.as_millis()
    );
    println!(
        "{:>4} | {:<34} | {:>26} | {:>7} | {:>7} | {:>6} | {:>10}",
        "conc", "side", "ops/s median (min-max)", "p50", "p99", "ratio", "calls/dec."
    );
    for &c in CONCURRENCY.iter().filter(|&&c| only.is_none_or(|o| o == c)) {
        let mut samples: Vec<Vec<Sample>> = sides.iter().map(|_| Vec::new()).collect();
        let mut calls: Vec<Vec<f64>> = sides.iter().map(|_| Vec::new()).collect();
        for round in 0..ROUNDS {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..sides.len()).collect()
            } else {
                (0..sides.len()).rev().collect()
            };
            for i in order {
                let before = commandstats(&mut conn).await;
                let sample = measure(c, call(&sides[i].1)).await;
                let after = commandstats(&mut conn).await;
                let sent: u64 = commands_between(&before, &after)
                    .iter()
                    .filter(|(c, _)| CLIENT_COMMANDS.contains(&c.as_str()))
                    .map(|(_, n)| n)
                    .sum();
                calls[i].push(sent as f64 / sample.count.max(1) as f64);
                samples[i].push(sample);
            }
        }
        let ceiling = median(&samples[0].iter().map(|s| s.ops).collect::<Vec<_>>());
        for (((name, _), s), calls) in sides.iter().zip(&samples).zip(&calls) {
            let ops: Vec<f64> = s.iter().map(|s| s.ops).collect();
            let m = median(&ops);
            let (lo, hi) = span(&ops);
            let p50 = median(&s.iter().map(|s| s.p50).collect::<Vec<_>>());
            let p99 = median(&s.iter().map(|s| s.p99).collect::<Vec<_>>());
            println!(
                "{c:>4} | {name:<34} | {:>26} | {p50:>7.0} | {p99:>7.0} | {:>5.3}x | {:>10.3}",
                format!("{m:.0} ({lo:.0}-{hi:.0})"),
                m / ceiling,
                median(calls)
            );
        }
    }

    if only.is_none() {
        redis_benchmark(&url, &mut conn).await;
        hot_denied_key(&url, &run, &mut conn).await;
    }
}

/// `redis-benchmark`'s EVALSHA of the trivial script, where it is installed.
async fn redis_benchmark(url: &str, conn: &mut ConnectionManager) {
    let info = redis::parse_redis_url(url).expect("valid URL");
    let host = info.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = info.port().unwrap_or(6379).to_string();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(conn)
        .await
        .expect("SCRIPT LOAD");
    println!("\nredis-benchmark EVALSHA of the trivial script (-n 100000)");
    for &c in &CONCURRENCY {
        let out = std::process::Command::new("redis-benchmark")
            .args(["-h", &host, "-p", &port, "-c", &c.to_string()])
            .args(["-n", "100000", "-q", "EVALSHA", &sha, "0"])
            .output();
        match out {
            Ok(out) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout);
                let last = text.rsplit('\r').next().unwrap_or("").trim();
                println!("{c:>4} | {last}");
            }
            _ => {
                println!("  redis-benchmark is not installed or failed: skipped");
                return;
            }
        }
    }
}

/// One key over its limit, hammered by 16 tasks through a `ResilientStore`, with and without
/// the deny cache: decisions per second and the Redis commands they cost.
async fn hot_denied_key(url: &str, run: &str, conn: &mut ConnectionManager) {
    println!("\nHot denied key: 16 tasks, one key over its limit (1 per minute), {ROUNDS} rounds");
    println!(
        "{:<18} | {:>26} | {:>7} | {:>7} | {:>18}",
        "deny cache", "decisions/s (min-max)", "p50 µs", "p99 µs", "round trips/decision"
    );
    let policies = Arc::new([Policy::new("hot", Rate::per_minute(1)).expect("valid policy")]);
    for cache in [0usize, 10_000] {
        let redis = RedisStore::builder()
            .prefix(format!("{run}-hot{cache}"))
            .build_with_url(url)
            .expect("valid URL");
        let store = ResilientStore::builder(redis, FailureMode::FailClosed)
            .deny_cache(cache)
            .build()
            .unwrap();
        let key = Arc::new(Key::new("ip", "203.0.113.9"));
        assert!(store
            .check(&key, &policies[..], &[1])
            .await
            .expect("check")
            .is_allowed());
        let op = {
            let store = store.clone();
            let policies = Arc::clone(&policies);
            move |_t: usize| {
                let fut = store.check(&key, &policies[..], &[1]);
                async move {
                    let d = fut.await.expect("store error");
                    assert!(!d.is_allowed());
                }
            }
        };
        let (mut ops, mut p50, mut p99, mut per) = (vec![], vec![], vec![], vec![]);
        for _ in 0..ROUNDS {
            let before = commandstats(conn).await;
            let s = measure(16, op.clone()).await;
            let after = commandstats(conn).await;
            let total: u64 = commands_between(&before, &after)
                .iter()
                .filter(|(c, _)| CLIENT_COMMANDS.contains(&c.as_str()))
                .map(|(_, n)| n)
                .sum();
            per.push(total as f64 / s.count.max(1) as f64);
            ops.push(s.ops);
            p50.push(s.p50);
            p99.push(s.p99);
        }
        let (lo, hi) = span(&ops);
        println!(
            "{:<18} | {:>26} | {:>7.0} | {:>7.0} | {:>18.5}",
            if cache == 0 { "off" } else { "on (10 000)" },
            format!("{:.0} ({lo:.0}-{hi:.0})", median(&ops)),
            median(&p50),
            median(&p99),
            median(&per)
        );
    }
}
