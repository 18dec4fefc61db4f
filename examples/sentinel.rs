//! A limiter on the Redis master that Sentinel names, following a failover: every 10 ms it
//! checks one key against 50 requests per second, and once a second prints what it decided,
//! on which master, and how many failovers it followed.
//!
//! A master, a replica and three sentinels on one machine (each sentinel needs its own
//! writable config file):
//!
//! ```text
//! redis-server --port 7000 --save '' --daemonize yes
//! redis-server --port 7001 --save '' --replicaof 127.0.0.1 7000 --daemonize yes
//! for p in 27000 27001 27002; do
//!   printf 'port %s\nsentinel monitor mymaster 127.0.0.1 7000 2\nsentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n' $p > /tmp/sentinel-$p.conf
//!   redis-server /tmp/sentinel-$p.conf --sentinel --daemonize yes
//! done
//! SENTINELS=redis://127.0.0.1:27000,redis://127.0.0.1:27001,redis://127.0.0.1:27002 \
//!   cargo run --example sentinel --features sentinel
//! redis-cli -p 7000 DEBUG SLEEP 30    # or kill it: the sentinels promote 7001
//! ```
//!
//! While no master answers, the fail-closed mode refuses (counted as `degraded`); once the
//! sentinels have promoted the replica, the store finds it and the switch count goes up.
//! `MASTER` names the master (default `mymaster`); `SECONDS` stops the example after that
//! long (default: runs until Ctrl-C).

use std::time::{Duration, Instant};

use tollgate::key::Key;
use tollgate::store::{FailureMode, RedisSentinelStore, ResilientStore};
use tollgate::{DecidedBy, Limiter, Policy, Rate};

#[path = "support/report.rs"]
mod report;

#[tokio::main]
async fn main() -> Result<(), report::Report> {
    let sentinels = std::env::var("SENTINELS").unwrap_or_else(|_| {
        "redis://127.0.0.1:27000,redis://127.0.0.1:27001,redis://127.0.0.1:27002".into()
    });
    let master = std::env::var("MASTER").unwrap_or_else(|_| "mymaster".into());
    let seconds: Option<u64> = std::env::var("SECONDS")
        .ok()
        .map(|s| s.parse())
        .transpose()?;
    let store = RedisSentinelStore::builder()
        .prefix("sentinel-example")
        .timeout(Duration::from_millis(200))
        .build_with_sentinel(sentinels.split(','), &master)?;
    let limiter = Limiter::builder()
        .store(ResilientStore::builder(store.clone(), FailureMode::FailClosed).build()?)
        .policy(Policy::new("api", Rate::per_second(50))?)
        .build()?;
    let key = Key::new("user", "example");
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let (mut allowed, mut denied, mut degraded) = (0u64, 0u64, 0u64);
    let mut last_report = Instant::now();
    while seconds.is_none_or(|s| started.elapsed() < Duration::from_secs(s)) {
        tick.tick().await;
        let d = limiter.check(&key, 1).await?;
        match (d.decided_by(), d.is_allowed()) {
            (DecidedBy::Decided, true) => allowed += 1,
            (DecidedBy::Decided, false) => denied += 1,
            _ => degraded += 1,
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            last_report = Instant::now();
            println!(
                "{:>4} s  master {:<21} allowed {allowed:>3}  denied {denied:>3}  degraded {degraded:>3}  failovers followed {}",
                started.elapsed().as_secs(),
                store.master_address().unwrap_or_else(|| "(none)".into()),
                store.master_switches(),
            );
            (allowed, denied, degraded) = (0, 0, 0);
        }
    }
    Ok(())
}
