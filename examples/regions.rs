//! One limit shared by three regions, on one machine: a home Redis behind a proxy that adds
//! 80 ms to every round trip (another continent), three region Redis servers, and two
//! instances per region, each a `LeasedStore` over its region's `RegionalLedger`.
//!
//! ```text
//! cargo run --example regions --features regions
//! ```
//!
//! It starts the four `redis-server`s itself (on free loopback ports; `redis-server` must be
//! on `PATH`) and stops them when it ends. 48 clients send one request each every 10 ms
//! (about 4 800 a second) to one key limited to 1 000 per second across all regions; once a
//! second it prints what each region admitted, the total against the limit, how long a
//! request took (p99), and the calls that crossed to the home. Half-way it cuts the home off
//! for two seconds: regions spend what they hold, then refuse (fail-closed), then resume.
//! `SECONDS` sets how long it runs (default 8).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::key::Key;
use tollgate::store::leased::LeasedStore;
use tollgate::store::regions::RegionalLedger;
use tollgate::store::{FailureMode, RedisStore, ResilientStore};
use tollgate::{Algorithm, Limiter, Policy, Rate};

#[path = "support/report.rs"]
mod report;

const LIMIT: u64 = 1_000;
const REGIONS: [&str; 3] = ["eu", "us", "ap"];

/// A `redis-server` on a free port, stopped on drop.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Result<Self, report::Report> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server (is it installed?): {e}"))?;
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(5) {
                return Err("redis-server did not start within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self { child, port })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A proxy in front of the home: every answer comes `delay` late; while `cut`, connections
/// are refused and closed.
async fn slow_link(
    upstream: u16,
    delay: Duration,
    cut: Arc<AtomicBool>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if cut.load(Ordering::SeqCst) {
                continue;
            }
            let cut = Arc::clone(&cut);
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = cr.read(&mut buf).await {
                        if sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let down = async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = sr.read(&mut buf).await {
                        let at = tokio::time::Instant::now() + delay;
                        tokio::time::sleep_until(at).await;
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let watch_cut = async {
                    while !cut.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                };
                tokio::select! {
                    _ = async { tokio::join!(up, down) } => {}
                    _ = watch_cut => {}
                }
            });
        }
    });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let seconds: u64 = std::env::var("SECONDS")
        .ok()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(8);
    let home = Redis::start()?;
    let cut = Arc::new(AtomicBool::new(false));
    let link = slow_link(home.port, Duration::from_millis(80), Arc::clone(&cut)).await?;
    let home_url = format!("redis://{link}");
    let region_servers = REGIONS
        .iter()
        .map(|_| Redis::start())
        .collect::<Result<Vec<_>, _>>()?;

    let policy = Policy::builder("api", Rate::per_second(LIMIT))
        .algorithm(Algorithm::FixedWindow)
        .build()?;
    let mut instances = Vec::new();
    let mut ledgers = Vec::new();
    for (r, server) in region_servers.iter().enumerate() {
        for _ in 0..2 {
            let home = RedisStore::builder()
                .timeout(Duration::from_millis(500))
                .build_with_url(&home_url)?;
            home.ping().await?;
            let local = RedisStore::from_url(&server.url())?;
            let ledger = RegionalLedger::builder(REGIONS[r], local, home).build()?;
            ledgers.push(ledger.clone());
            let store = ResilientStore::builder(LeasedStore::new(ledger), FailureMode::FailClosed)
                .timeout(Duration::from_millis(500))
                .build()?;
            let limiter = Limiter::builder()
                .store(store)
                .policy(policy.clone())
                .build()?;
            instances.push((r, Arc::new(limiter)));
        }
    }

    // Admissions by their window (the epoch second), per region.
    let admitted = Arc::new(parking_lot::Mutex::new(std::collections::BTreeMap::<
        u64,
        [u64; 3],
    >::new()));
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::<u64>::new()));
    let stop = Instant::now() + Duration::from_secs(seconds);
    let key = Key::new("tenant", "global");
    for c in 0..48 {
        let (region, limiter) = instances[c % instances.len()].clone();
        let (admitted, latencies, key) =
            (Arc::clone(&admitted), Arc::clone(&latencies), key.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while Instant::now() < stop {
                tick.tick().await;
                let (t, window) = (Instant::now(), epoch_seconds());
                let allowed = limiter.check(&key, 1).await.is_ok_and(|d| d.is_allowed());
                latencies.lock().push(t.elapsed().as_micros() as u64);
                // Counted in a window only when it started and ended there: its unit was
                // charged to that window (a block ends at its window's end).
                if allowed && epoch_seconds() == window {
                    admitted.lock().entry(window).or_default()[region] += 1;
                }
            }
        });
    }

    println!(
        "limit {LIMIT} per one-second window across {} regions; the home is 80 ms away",
        REGIONS.len()
    );
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    for s in 1..=seconds + 1 {
        tick.tick().await;
        if s == seconds / 2 {
            cut.store(true, Ordering::SeqCst);
            println!("       -- the home is cut off for 2 s --");
        }
        if s == seconds / 2 + 2 {
            cut.store(false, Ordering::SeqCst);
            println!("       -- the home is back --");
        }
        // Windows that have ended.
        let now = epoch_seconds();
        let done: Vec<(u64, [u64; 3])> = {
            let mut map = admitted.lock();
            let keep = map.split_off(&now);
            std::mem::replace(&mut *map, keep).into_iter().collect()
        };
        let mut lat = std::mem::take(&mut *latencies.lock());
        lat.sort_unstable();
        let p99 = lat
            .get(lat.len().saturating_sub(1) * 99 / 100)
            .copied()
            .unwrap_or(0);
        let home_calls: u64 = ledgers.iter().map(|l| l.stats().home_calls()).sum();
        for (window, per) in done {
            println!(
                "window {window}  {}  total {:>4} of {LIMIT}",
                REGIONS
                    .iter()
                    .zip(per)
                    .map(|(r, n)| format!("{r} {n:>4}"))
                    .collect::<Vec<_>>()
                    .join("  "),
                per.iter().sum::<u64>(),
            );
        }
        println!(
            "{:>5.1} s  p99 {:>6.2} ms  calls to the home so far {home_calls}",
            started.elapsed().as_secs_f64(),
            p99 as f64 / 1000.0,
        );
    }
    Ok(())
}

fn epoch_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
