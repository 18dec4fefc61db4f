//! The Sentinel store against a real master, replica and three sentinels: exact decisions on
//! the master Sentinel names, a plan that builds one, a demotion (`READONLY`) and a killed
//! master under load, with the time to resume and the over-admission measured.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::sentinel::{wait_until, SentinelSet, MASTER_NAME};
use tollgate::config::Plan;
use tollgate::key::Key;
use tollgate::store::{FailureMode, RedisSentinelStore, ResilientStore, Store, StoreExt};
use tollgate::{Algorithm, DecidedBy, Limiter, Policy, Rate, StoreError};

fn store(set: &SentinelSet) -> RedisSentinelStore {
    RedisSentinelStore::builder()
        .prefix("sentinel-test")
        .timeout(Duration::from_millis(500))
        .build_with_sentinel(set.urls(), MASTER_NAME)
        .unwrap()
}

/// Every test shares one set: starting it and letting the sentinels find each other takes a
/// few seconds.
#[test]
fn sentinel_store_end_to_end() {
    #[cfg(feature = "metrics")]
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let mut set = SentinelSet::start();
    let rt = support::runtime();
    rt.block_on(exact_on_the_resolved_master(&set));
    rt.block_on(a_plan_builds_a_sentinel_store(&set));
    rt.block_on(a_silent_sentinel_first_holds_up_nothing(&set));
    demotion_is_followed(&set, &rt);
    stalled_master_is_followed(&set, &rt);
    killed_master_under_load(&mut set, &rt);
    // One switch for the demotion's store, the stall's, and each of the failover's two.
    #[cfg(feature = "metrics")]
    {
        let text = prometheus.render();
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .map(str::to_owned)
        };
        assert_eq!(
            line("tollgate_sentinel_switches_total").as_deref(),
            Some("tollgate_sentinel_switches_total 4"),
            "{text}"
        );
        assert_eq!(
            line("tollgate_sentinel_failover_seconds_count").as_deref(),
            Some("tollgate_sentinel_failover_seconds_count 4"),
            "{text}"
        );
        eprintln!("{:?}", line("tollgate_sentinel_failover_seconds_sum"));
    }
}

async fn exact_on_the_resolved_master(set: &SentinelSet) {
    // A caller that gives up at once does not stop the resolution it started.
    let early = store(set);
    let gave_up = tokio::time::timeout(Duration::from_micros(1), early.ping()).await;
    assert!(gave_up.is_err());
    let started = Instant::now();
    while early.master_address().is_none() {
        assert!(started.elapsed() < Duration::from_secs(5), "never resolved");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let store = store(set);
    assert_eq!(
        store.master_address(),
        None,
        "nothing is resolved before a call"
    );
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(Policy::new("exact", Rate::per_minute(20)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "exact");
    let mut allowed = 0;
    for _ in 0..30 {
        if limiter.check(&key, 1).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 20);
    assert_eq!(
        store.master_address().as_deref(),
        Some(format!("127.0.0.1:{}", set.master.port()).as_str())
    );
    assert_eq!(store.master_switches(), 0);
    assert_eq!(store.name(), "redis-sentinel");
}

/// A sentinel that takes connections and never answers (its host gone behind a firewall, a
/// hung process), listed first: the others' answer is taken at once. Asked in list order, the
/// silent one held up every resolution until its timeout, and no master was ever found.
async fn a_silent_sentinel_first_holds_up_nothing(set: &SentinelSet) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut urls = vec![format!("redis://{}", silent.local_addr().unwrap())];
    urls.extend(set.urls());
    let store = RedisSentinelStore::builder()
        .prefix("sentinel-silent")
        .timeout(Duration::from_millis(500))
        .build_with_sentinel(urls, MASTER_NAME)
        .unwrap();
    let policy = [Policy::new("api", Rate::per_minute(100)).unwrap()];
    let key = Key::new("user", "silent-first");
    let started = Instant::now();
    let mut answered = 0;
    while started.elapsed() < Duration::from_secs(2) {
        if store.check(&key, &policy, &[1]).await.is_ok() {
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        answered >= 20,
        "{answered} answers in 2 s with a silent first sentinel"
    );
    drop(silent);
}

async fn a_plan_builds_a_sentinel_store(set: &SentinelSet) {
    let sentinels: Vec<String> = set.urls().iter().map(|u| format!("{u:?}")).collect();
    // Exact, then through the lease ledger: both decide on the master Sentinel names.
    for (prefix, lease) in [("plan", ""), ("leased", "lease_time = \"250ms\"\n")] {
        let text = format!(
            "failure_mode = \"fail_closed\"\n\
             [[policies]]\nname = \"api\"\nlimit = 3\nwindow = \"1m\"\n\
             [default]\npolicies = [\"api\"]\n\
             [store]\nkind = \"sentinel\"\nsentinels = [{}]\nmaster = \"{MASTER_NAME}\"\n\
             prefix = \"{prefix}\"\n{lease}",
            sentinels.join(", ")
        );
        let plan = Plan::from_toml(&text).unwrap();
        let limiter = Limiter::from_config(&plan).unwrap();
        let key = Key::new("user", "plan");
        let mut answers = Vec::new();
        for _ in 0..4 {
            let d = limiter.check(&key, 1).await.unwrap();
            assert_eq!(d.decided_by(), DecidedBy::Decided);
            answers.push(d.is_allowed());
        }
        assert_eq!(answers, [true, true, true, false], "{text}");
        // The state is on the master, under the plan's prefix.
        assert!(
            !set.master.scan(&format!("{prefix}:*")).is_empty(),
            "{text}"
        );
    }
}

/// `SENTINEL FAILOVER`: the master becomes a replica and answers writes with `READONLY`; the
/// store finds the promoted one, and loses nothing (the failover waits for the replica).
fn demotion_is_followed(set: &SentinelSet, rt: &tokio::runtime::Runtime) {
    let store = store(set);
    let limiter = Limiter::builder()
        .store(store.clone())
        .policy(Policy::new("demotion", Rate::per_hour(100)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "demotion");
    rt.block_on(async {
        for _ in 0..10 {
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
        }
    });
    let generation = store.generation();
    let old = set.master_address().unwrap();
    let asked = Instant::now();
    set.failover();
    wait_until(
        "the sentinels name the replica",
        Duration::from_secs(20),
        || set.master_address().is_some_and(|a| a != old),
    );
    let named = asked.elapsed();
    // Until it is demoted, the old master still takes writes, which its demotion discards
    // (Sentinel's own window): no request is sent in it. The sentinels would send this
    // `REPLICAOF` on their next look at it (up to 10 s); sent now, the test need not wait.
    let promoted = set.replica.port().to_string();
    let _: String = set
        .master
        .query(&["REPLICAOF", "127.0.0.1", &promoted])
        .unwrap();
    wait_until("the old master is demoted", Duration::from_secs(20), || {
        set.master
            .query::<String>(&["INFO", "replication"])
            .is_ok_and(|i| i.contains("role:slave"))
    });
    let started = Instant::now();
    let mut refused = Vec::new();
    let remaining = rt.block_on(async {
        loop {
            match limiter.check(&key, 1).await {
                Ok(d) => break d.remaining(),
                Err(e) if started.elapsed() < Duration::from_secs(10) => {
                    refused.push(e.to_string());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("no decision on the promoted master: {e}"),
            }
        }
    });
    let resumed = started.elapsed();
    assert!(
        refused
            .first()
            .is_some_and(|e| e.contains("read only replica")),
        "the demoted master's first answer is READONLY: {refused:?}"
    );
    assert_eq!(remaining, 100 - 11, "the state survived the demotion");
    assert_eq!(store.master_address(), set.master_address());
    assert_eq!(store.master_switches(), 1);
    assert_eq!(
        store.generation(),
        generation + 1,
        "the promoted master's run_id is read and moves the generation"
    );
    set.wait_settled();
    eprintln!(
        "demotion: the sentinels named the replica {} ms after SENTINEL FAILOVER; the store \
         decided on it {} ms after the old master was demoted",
        named.as_millis(),
        resumed.as_millis()
    );
}

fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// The master stops (SIGSTOP): its connection stays open and no call fails, only times out,
/// and a `ResilientStore` gives up on each far sooner (50 ms) than the store's own timeout
/// (500 ms). Calls unanswered for longer than the timeout drop the master, so once Sentinel
/// has promoted the replica, the store decides on it.
fn stalled_master_is_followed(set: &SentinelSet, rt: &tokio::runtime::Runtime) {
    let store = store(set);
    let limiter = Limiter::builder()
        .store(
            ResilientStore::builder(store.clone(), FailureMode::FailClosed)
                .build()
                .unwrap(),
        )
        .policy(Policy::new("stall", Rate::per_hour(100_000)).unwrap())
        .build()
        .unwrap();
    let key = Key::new("user", "stall");
    let (stopped, other) = set.roles();
    let (stopped_pid, stopped_port) = (stopped.pid(), stopped.port().to_string());
    let other_address = format!("127.0.0.1:{}", other.port());
    let decided = |limiter: &Limiter<_>| {
        rt.block_on(async {
            let d = limiter.check(&key, 1).await.unwrap();
            d.decided_by() == DecidedBy::Decided
        })
    };
    assert!(decided(&limiter));
    let generation = store.generation();
    signal(stopped_pid, "-STOP");
    let stopped_at = Instant::now();
    let mut resumed = None;
    while stopped_at.elapsed() < Duration::from_secs(20) {
        if decided(&limiter) {
            resumed = Some(stopped_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(stopped_pid, "-CONT");
    let resumed = resumed.expect("no decision on the promoted master within 20 s");
    assert_eq!(store.master_address(), Some(other_address.clone()));
    assert_eq!(store.master_switches(), 1);
    // The promoted master's first answer, or the one after, reads its `run_id`.
    decided(&limiter);
    assert_eq!(
        store.generation(),
        generation + 1,
        "the promoted master's run_id is read and moves the generation"
    );
    // The sentinels would demote the old master on their next look at it; sent now, the test
    // need not wait.
    let (_, replica_port) = other_address.split_once(':').unwrap();
    let old = if set.master.port().to_string() == stopped_port {
        &set.master
    } else {
        &set.replica
    };
    let _: String = old
        .query(&["REPLICAOF", "127.0.0.1", replica_port])
        .unwrap();
    set.wait_settled();
    eprintln!(
        "stall: the master stopped (SIGSTOP); first decision by the promoted master {} ms later",
        resumed.as_millis()
    );
}

/// What one client saw: when each admission decided by the store came back.
#[derive(Default)]
struct Seen {
    admitted: Vec<Instant>,
    degraded: u64,
}

/// Kills the master with SIGKILL under 64 clients on one key across two limiters, each on
/// its own store behind a fail-closed `ResilientStore` (as a plan builds it). Measures the
/// time from the kill to the first admission by the new master, and checks admissions
/// against the limit plus the admissions of the last 100 ms before the kill (the bound on
/// what the replica can have missed).
fn killed_master_under_load(set: &mut SentinelSet, rt: &tokio::runtime::Runtime) {
    const LIMIT: u64 = 3000;
    const CLIENTS: usize = 64;
    let policy = Policy::builder("failover", Rate::per_day(LIMIT))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    let stores: Vec<RedisSentinelStore> = (0..2).map(|_| store(set)).collect();
    let limiters: Vec<_> = stores
        .iter()
        .map(|s| {
            let resilient = ResilientStore::builder(s.clone(), FailureMode::FailClosed)
                .build()
                .unwrap();
            Limiter::builder()
                .store(resilient)
                .policy(policy.clone())
                .build()
                .unwrap()
        })
        .collect();
    let key = Key::new("user", "failover");
    let stop = Arc::new(AtomicBool::new(false));
    let denied = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let limiter = limiters[i % 2].clone();
            let (key, stop, denied) = (key.clone(), Arc::clone(&stop), Arc::clone(&denied));
            rt.spawn(async move {
                let mut seen = Seen::default();
                while !stop.load(Ordering::Relaxed) {
                    let d = limiter.check(&key, 1).await.unwrap();
                    match d.decided_by() {
                        DecidedBy::Decided if d.is_allowed() => seen.admitted.push(Instant::now()),
                        DecidedBy::Decided => {
                            denied.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => seen.degraded += 1,
                    }
                    // About 3 000 requests a second in all: the limit lasts about a second
                    // on either side of the failover.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                seen
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let killed_address = set.master_address().unwrap();
    let killed = set.kill_master();
    // Run until the new master has refused requests for a while: the limit is spent.
    let deadline = killed + Duration::from_secs(20);
    let denied_before = denied.load(Ordering::Relaxed);
    wait_until(
        "the new master spends the limit",
        Duration::from_secs(25),
        || {
            set.master_address().is_some_and(|a| a != killed_address)
                && denied.load(Ordering::Relaxed) > denied_before + 500
                || Instant::now() > deadline
        },
    );
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = clients
        .into_iter()
        .map(|c| rt.block_on(c).unwrap())
        .collect();
    let mut admitted: Vec<Instant> = seen.iter().flat_map(|s| s.admitted.clone()).collect();
    admitted.sort();
    let degraded: u64 = seen.iter().map(|s| s.degraded).sum();
    // Replies of the old master still in a socket can be read just after the kill; 50 ms
    // later every admission is the new master's.
    let resumed = admitted
        .iter()
        .find(|t| **t > killed + Duration::from_millis(50))
        .copied()
        .expect("no admission after the failover");
    let in_lag_window = admitted
        .iter()
        .filter(|t| {
            **t + Duration::from_millis(100) > killed && **t <= killed + Duration::from_millis(50)
        })
        .count() as u64;
    let before_kill = admitted.iter().filter(|t| **t <= killed).count() as u64;
    let total = admitted.len() as u64;
    // What the new master recorded: the units it saw spent.
    let remaining = rt.block_on(async {
        stores[0]
            .peek(&key, std::slice::from_ref(&policy), &[1])
            .await
            .unwrap()
            .remaining()
    });
    let recorded = LIMIT - remaining;
    let lost = total.saturating_sub(recorded);
    eprintln!(
        "failover: {CLIENTS} clients on 2 limiters, limit {LIMIT}; {before_kill} admitted before \
         the kill; first admission by the new master {} ms after the kill; {degraded} decided \
         by the failure mode meanwhile; {total} admitted in all ({} over the limit), {lost} \
         admissions the new master never saw, {in_lag_window} admitted in the last 100 ms \
         before the kill; switches {} and {}",
        resumed.duration_since(killed).as_millis(),
        total.saturating_sub(LIMIT),
        stores[0].master_switches(),
        stores[1].master_switches(),
    );
    // The token bucket refills LIMIT a day: at most one unit over the run.
    assert!(
        total <= LIMIT + 1 + in_lag_window,
        "over-admission past the bound: {total} > {LIMIT} + 1 + {in_lag_window}"
    );
    assert!(
        lost <= in_lag_window + 1,
        "lost {lost} > {in_lag_window} + 1"
    );
    assert!(resumed.duration_since(killed) < Duration::from_secs(15));
    for s in &stores {
        assert_eq!(s.master_switches(), 1);
        assert_eq!(s.master_address(), set.master_address());
    }
}

#[test]
fn config_mistakes_name_the_field_and_value() {
    let build = |sentinels: &[&str], master: &str| {
        RedisSentinelStore::builder()
            .build_with_sentinel(sentinels, master)
            .unwrap_err()
    };
    let err = build(&[], "mymaster");
    assert_eq!((err.field(), err.value()), ("sentinels", "[]"));
    let err = build(&["redis://127.0.0.1:26379", "http://x"], "mymaster");
    assert_eq!((err.field(), err.value()), ("sentinels", "\"http://x\""));
    let err = build(&["redis://127.0.0.1:26379"], " ");
    assert_eq!((err.field(), err.value()), ("master", "\" \""));
    for odd in [" mymaster", "mymaster\r\nPING", "my master"] {
        let err = build(&["redis://127.0.0.1:26379"], odd);
        assert_eq!(err.field(), "master", "{odd:?}");
        assert!(err.reason().contains("one word"), "{err}");
    }
    let err = RedisSentinelStore::builder()
        .resolve_interval(Duration::ZERO)
        .build_with_sentinel(["redis://127.0.0.1:26379"], "m")
        .unwrap_err();
    assert_eq!(err.field(), "resolve_interval");

    let plan = |store: &str| {
        let text = format!(
            "failure_mode = \"fail_closed\"\n[[policies]]\nname = \"api\"\nlimit = 3\n\
             window = \"1m\"\n[default]\npolicies = [\"api\"]\n[store]\nkind = \"sentinel\"\n{store}"
        );
        let plan = Plan::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let err = Limiter::from_config(&plan).expect_err(&text);
        (err.field().to_owned(), err.value().to_owned())
    };
    let cases = [
        ("master = \"m\"", "store.sentinels", "[]"),
        (
            "sentinels = [\"redis://127.0.0.1:26379\"]",
            "store.master",
            "(missing)",
        ),
        (
            "sentinels = [\"redis://127.0.0.1:26379\"]\nmaster = \"\"",
            "store.master",
            "\"\"",
        ),
        (
            "sentinels = [\"nope://x\"]\nmaster = \"m\"",
            "store.sentinels",
            "\"nope://x\"",
        ),
        (
            "sentinels = [\"redis://127.0.0.1:26379\"]\nmaster = \"m\"\nurl = \"redis://x\"",
            "store.url",
            "\"redis://x\"",
        ),
    ];
    for (store, field, value) in cases {
        assert_eq!(plan(store), (field.to_owned(), value.to_owned()), "{store}");
    }
    // The other kinds do not read the sentinel settings.
    let text = "failure_mode = \"fail_closed\"\n[store]\nkind = \"redis\"\nurl = \"redis://x\"\nmaster = \"m\"";
    let err = Limiter::from_config(&Plan::from_toml(text).unwrap()).unwrap_err();
    assert_eq!((err.field(), err.value()), ("store.master", "\"m\""));
}

#[test]
fn a_dead_sentinel_list_fails_fast_and_is_asked_at_most_once_per_interval() {
    let port = support::free_port();
    let store = RedisSentinelStore::builder()
        .resolve_interval(Duration::from_millis(500))
        .build_with_sentinel([format!("redis://127.0.0.1:{port}")], "m")
        .unwrap();
    let rt = support::runtime();
    rt.block_on(async {
        let first = store.ping().await.unwrap_err();
        assert!(matches!(first, StoreError::Connection(_)), "{first}");
        // Within the interval: refused without asking (the message says when it will).
        let started = Instant::now();
        for _ in 0..1000 {
            let e = store.ping().await.unwrap_err();
            assert!(e.to_string().contains("asked again in"), "{e}");
        }
        assert!(started.elapsed() < Duration::from_millis(400));
    });
}
