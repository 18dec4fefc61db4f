//! Limits shared across regions: three regions, each with its own Redis and two instances,
//! lending one limit kept in a home Redis behind a TCP proxy that adds 80 ms to every round
//! trip. Checked under 64 clients: the global limit in every window, through a partition of
//! the home (the proxy cut, then healed); hot keys decided without the home's round trip;
//! what crosses regions per second.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::proxy::Proxy;
use support::RedisServer;
use tollgate::key::Key;
use tollgate::store::leased::LeasedStore;
use tollgate::store::regions::{RegionStats, RegionalLedger};
use tollgate::store::{FailureMode, Op, RedisStore, ResilientStore, Store};
use tollgate::{Algorithm, Limiter, Policy, Rate};

const HOME_RTT: Duration = Duration::from_millis(80);
const REGIONS: usize = 3;
const INSTANCES_PER_REGION: usize = 2;
const CLIENTS: usize = 64;

type Instance<S> = Limiter<ResilientStore<LeasedStore<S>>>;

struct Fleet {
    _home: RedisServer,
    proxy: Proxy,
    _regions: Vec<RedisServer>,
    instances: Vec<Arc<Instance<RegionalLedger>>>,
    ledgers: Vec<RegionalLedger>,
}

fn home_store(url: &str) -> RedisStore {
    RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .build_with_url(url)
        .unwrap()
}

fn local_store(url: &str) -> RedisStore {
    RedisStore::builder()
        .timeout(Duration::from_millis(200))
        .build_with_url(url)
        .unwrap()
}

/// An instance of region `name`, whose Redis is `server`, over `home`, with the defaults.
fn regional(
    name: &str,
    server: &RedisServer,
    home: &RedisServer,
) -> LeasedStore<RegionalLedger<RedisStore>> {
    LeasedStore::new(
        RegionalLedger::builder(name, local_store(&server.url()), home_store(&home.url()))
            .build()
            .unwrap(),
    )
}

fn instance<S: tollgate::store::leased::LeaseBackend>(
    backend: S,
    policy: &Policy,
) -> Arc<Instance<S>> {
    let leased = LeasedStore::new(backend);
    // A call that needs the home takes its 80 ms: the default 50 ms timeout would fail it.
    let store = ResilientStore::builder(leased, FailureMode::FailClosed)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    Arc::new(
        Limiter::builder()
            .store(store)
            .policy(policy.clone())
            .build()
            .unwrap(),
    )
}

impl Fleet {
    async fn start(policy: &Policy, fraction: f64) -> Self {
        let home = RedisServer::start();
        let proxy = Proxy::start(home.port()).await;
        proxy.set_delay(HOME_RTT);
        home_store(&proxy.url()).ping().await.unwrap();
        let regions: Vec<RedisServer> = (0..REGIONS).map(|_| RedisServer::start()).collect();
        let mut instances = Vec::new();
        let mut ledgers = Vec::new();
        for (r, server) in regions.iter().enumerate() {
            for _ in 0..INSTANCES_PER_REGION {
                // Each instance is its own process in production: its own connections.
                let ledger = RegionalLedger::builder(
                    format!("r{r}"),
                    local_store(&server.url()),
                    home_store(&proxy.url()),
                )
                .max_deposit_fraction(fraction)
                .build()
                .unwrap();
                ledgers.push(ledger.clone());
                instances.push(instance(ledger, policy));
            }
        }
        Fleet {
            _home: home,
            proxy,
            _regions: regions,
            instances,
            ledgers,
        }
    }

    fn stats(&self) -> RegionStats {
        let mut sum = RegionStats::default();
        for s in self.ledgers.iter().map(RegionalLedger::stats) {
            sum.deposits += s.deposits;
            sum.units_deposited += s.units_deposited;
            sum.exact_at_home += s.exact_at_home;
            sum.refusals += s.refusals;
            sum.returns += s.returns;
            sum.units_returned += s.units_returned;
            sum.units_dropped += s.units_dropped;
            sum.errors += s.errors;
            sum.forwarded += s.forwarded;
        }
        sum
    }
}

/// One request as a client saw it: when it started and ended (µs since the epoch, the
/// clock Redis's `TIME` reads on this machine), and how it was answered.
#[derive(Debug, Clone, Copy)]
struct Sample {
    start_us: u64,
    end_us: u64,
    allowed: bool,
    error: bool,
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// `CLIENTS` clients spread over `instances`, each sending one request of `key` every
/// `pace` for `run`.
async fn load<S: tollgate::store::leased::LeaseBackend>(
    instances: &[Arc<Instance<S>>],
    key: &Key,
    pace: Duration,
    run: Duration,
) -> Vec<Sample> {
    let deadline = Instant::now() + run;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let limiter = Arc::clone(&instances[c % instances.len()]);
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut tick = tokio::time::interval(pace);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while Instant::now() < deadline {
                tick.tick().await;
                let start_us = epoch_us();
                let d = limiter.check(&key, 1).await;
                let end_us = epoch_us();
                out.push(Sample {
                    start_us,
                    end_us,
                    allowed: d.as_ref().is_ok_and(|d| d.is_allowed()),
                    error: d.is_err(),
                });
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn percentile(latencies: &mut [u64], p: f64) -> u64 {
    latencies.sort_unstable();
    let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
    latencies.get(i).copied().unwrap_or(0)
}

/// Admissions that started and ended inside each whole window of `window_us`: every unit
/// such a request took was charged to that window (a block ends at its window's end).
fn per_window(samples: &[Sample], window_us: u64) -> Vec<(u64, u64)> {
    let first = samples.iter().map(|s| s.start_us).min().unwrap_or(0) / window_us + 1;
    let last = samples.iter().map(|s| s.end_us).max().unwrap_or(0) / window_us;
    (first..last)
        .map(|w| {
            let (lo, hi) = (w * window_us, (w + 1) * window_us);
            let n = samples
                .iter()
                .filter(|s| s.allowed && s.start_us >= lo && s.end_us < hi)
                .count() as u64;
            (w, n)
        })
        .collect()
}

/// The fixed window's limit in every window, across three regions and a partition of the
/// home: 64 clients offer about ten times the limit; the home is cut for 1.5 s and healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_limit_holds_in_every_window_across_regions_and_a_partition() {
    const LIMIT: u64 = 600;
    let policy = Policy::builder("api", Rate::per_second(LIMIT))
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    let fleet = Fleet::start(&policy, 0.1).await;
    let key = Key::new("tenant", "global");
    let started = Instant::now();
    let partition = {
        let proxy = &fleet.proxy;
        async move {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            proxy.cut();
            let cut_at = epoch_us();
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            proxy.heal();
            (cut_at, epoch_us())
        }
    };
    let (samples, (cut_at, healed_at)) = tokio::join!(
        load(
            &fleet.instances,
            &key,
            Duration::from_millis(10),
            Duration::from_millis(7_500)
        ),
        partition
    );
    let elapsed = started.elapsed().as_secs_f64();
    let windows = per_window(&samples, 1_000_000);
    let admitted: u64 = samples.iter().filter(|s| s.allowed).count() as u64;
    let errors = samples.iter().filter(|s| s.error).count();
    let stats = fleet.stats();
    let t0 = samples.iter().map(|s| s.start_us).min().unwrap();
    let mut timeline = vec![0u64; 80];
    for s in samples.iter().filter(|s| s.allowed) {
        timeline[(((s.end_us - t0) / 100_000) as usize).min(79)] += 1;
    }
    eprintln!(
        "timeline per 100 ms: {timeline:?}; cut at +{} ms, healed at +{} ms",
        (cut_at - t0) / 1000,
        (healed_at - t0) / 1000
    );
    eprintln!(
        "regions: {} requests, {admitted} admitted, {errors} errors; per window {windows:?}; \
         home calls {} ({:.1}/s): {stats:?}",
        samples.len(),
        stats.home_calls(),
        stats.home_calls() as f64 / elapsed
    );
    for &(w, n) in &windows {
        assert!(n <= LIMIT, "window {w} admitted {n} > {LIMIT}: {windows:?}");
    }
    // Over the whole run too (every admission, whole windows or not).
    let touched = samples.iter().map(|s| s.end_us).max().unwrap() / 1_000_000
        - samples.iter().map(|s| s.start_us).min().unwrap() / 1_000_000
        + 1;
    assert!(
        admitted <= LIMIT * touched,
        "{admitted} > {LIMIT} × {touched}"
    );
    // During the cut the regions spend only what they hold: deposits end at the window's
    // end, so a window wholly inside the cut admits nothing.
    let inside_cut: Vec<_> = windows
        .iter()
        .filter(|(w, _)| w * 1_000_000 >= cut_at && (w + 1) * 1_000_000 <= healed_at)
        .collect();
    for (w, n) in &inside_cut {
        assert_eq!(*n, 0, "window {w} inside the partition admitted {n}");
    }
    // Windows before the cut and after the heal are used, not starved: at least half the
    // limit each (the rest is the 80 ms the first request of each window waits for).
    let busy: Vec<_> = windows
        .iter()
        .filter(|(w, _)| {
            let (lo, hi) = (w * 1_000_000, (w + 1) * 1_000_000);
            hi <= cut_at || lo >= healed_at + 1_000_000
        })
        .collect();
    assert!(!busy.is_empty(), "{windows:?}");
    for (w, n) in &busy {
        assert!(
            *n >= LIMIT / 2,
            "window {w} admitted only {n} of {LIMIT}: {windows:?}"
        );
    }
    assert!(stats.errors > 0, "the partition was not felt: {stats:?}");
}

/// A hot key under its limit: decided at the region's latency (the home's 80 ms off the
/// request path), nothing refused, compared with one region on its own Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_is_decided_at_region_latency_and_never_refused_under_its_limit() {
    let policy = Policy::builder("api", Rate::per_minute(900_000))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    let fleet = Fleet::start(&policy, 0.25).await;
    let single_redis = RedisServer::start();
    let single: Vec<_> = (0..REGIONS * INSTANCES_PER_REGION)
        .map(|_| instance(local_store(&single_redis.url()), &policy))
        .collect();
    let key = Key::new("tenant", "hot");
    let pace = Duration::from_millis(10);
    let run = Duration::from_secs(3);
    let mut report = Vec::new();
    // Interleaved rounds: the regional fleet, then one region, twice.
    for round in 0..2 {
        for regional in [true, false] {
            let (samples, steady) = if regional {
                // The home calls after the keys' cold start (the first second).
                let (samples, (at_1s, after)) =
                    tokio::join!(load(&fleet.instances, &key, pace, run), async {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        let at_1s = fleet.stats();
                        tokio::time::sleep(run - Duration::from_secs(1)).await;
                        (at_1s, fleet.stats())
                    });
                (samples, Some((at_1s, after)))
            } else {
                (load(&single, &key, pace, run).await, None)
            };
            if let Some((at_1s, after)) = steady {
                let exact = after.exact_at_home - at_1s.exact_at_home;
                let calls = after.home_calls() - at_1s.home_calls();
                report.push(format!(
                    "round {round}, after the first second: {exact} requests decided at the home, \
                     {calls} home calls ({:.1}/s)",
                    calls as f64 / (run.as_secs_f64() - 1.0)
                ));
                assert!(exact <= 6, "renewals fell behind: {report:?}");
            }
            let refused = samples.iter().filter(|s| !s.allowed).count();
            // The first 500 ms are the keys' cold start (a first home call per region).
            let from = samples.iter().map(|s| s.start_us).min().unwrap() + 500_000;
            let mut lat: Vec<u64> = samples
                .iter()
                .filter(|s| s.start_us >= from)
                .map(|s| s.end_us - s.start_us)
                .collect();
            let (p50, p99) = (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99));
            report.push(format!(
                "round {round} {}: {} requests, {refused} refused, p50 {p50} µs, p99 {p99} µs",
                if regional {
                    "3 regions, home +80 ms"
                } else {
                    "1 region"
                },
                samples.len()
            ));
            assert_eq!(
                refused,
                0,
                "a hot key under its limit was refused: {report:?} {:?}",
                fleet.stats()
            );
        }
    }
    let stats = fleet.stats();
    eprintln!("{report:#?}\nhome: {stats:?}");
    assert!(stats.deposits >= REGIONS as u64, "{stats:?}");
}

/// A region of one policy that cannot be leased is decided exactly at the home; a reset
/// empties the region's deposits; the builder names a bad value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_leased_is_decided_at_home_and_reset_empties_deposits() {
    let home = RedisServer::start();
    let local = RedisServer::start();
    let ledger = RegionalLedger::builder("eu", local_store(&local.url()), home_store(&home.url()))
        .build()
        .unwrap();
    let slots = Policy::in_flight("slots", 2).unwrap();
    let limiter = Limiter::builder()
        .store(LeasedStore::new(ledger.clone()))
        .policy(slots)
        .build()
        .unwrap();
    let key = Key::new("user", "1");
    let a = limiter.acquire(&key).await.unwrap();
    let b = limiter.acquire(&key).await.unwrap();
    assert!(a.decision().is_allowed() && b.decision().is_allowed());
    assert!(!limiter.acquire(&key).await.unwrap().decision().is_allowed());
    // The slots are held at the home, not in the region.
    assert!(!home.scan("*slots*").is_empty());
    assert!(local.scan("*slots*").is_empty());
    drop((a, b));

    let policy = Policy::new("api", Rate::per_minute(100)).unwrap();
    let limiter = Limiter::builder()
        .store(LeasedStore::new(ledger.clone()))
        .policy(policy.clone())
        .build()
        .unwrap();
    for _ in 0..30 {
        assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
    }
    assert!(!local.scan("*deposit*").is_empty());
    limiter.reset(&key).await.unwrap();
    // What is left of a deposit holds no unit (it keeps the reset's time for the renewals
    // under way).
    assert!(!local.scan("*deposit*").is_empty());
    assert_eq!(deposited_units(&local), 0, "{:?}", local.scan("*"));
    assert!(ledger.stats().deposits >= 1);
    assert_eq!(ledger.name(), "eu");
    assert!(ledger.now_millis() > 0);

    let err = RegionalLedger::builder("e u", local_store(&local.url()), home_store(&home.url()))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
    let err = RegionalLedger::builder("eu", local_store(&local.url()), home_store(&home.url()))
        .home_lease(Duration::from_millis(10))
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "home_lease");
}

/// A plan names the region and the home: two instances of one region and one of another,
/// built from plans, share one limit kept at the home; a mistake names its field.
#[cfg(feature = "config")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_shares_a_limit_across_regions() {
    use tollgate::config::Plan;
    let home = RedisServer::start();
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let plan = |region: &str, url: &str, extra: &str| {
        format!(
            "failure_mode = \"fail_closed\"\n\
             [[policies]]\nname = \"api\"\nlimit = 40\nwindow = \"1h\"\n\
             [default]\npolicies = [\"api\"]\n\
             [store]\nkind = \"redis\"\nurl = \"{url}\"\nregion = \"{region}\"\n\
             home = \"{}\"\nhome_lease = \"2s\"\n{extra}",
            home.url()
        )
    };
    let limiters: Vec<_> = [("eu", eu.url()), ("eu", eu.url()), ("us", us.url())]
        .iter()
        .map(|(r, url)| {
            let text = plan(r, url, "");
            let p = Plan::from_toml(&text).unwrap();
            assert!(
                tollgate::audit::audit(&p).findings.is_empty(),
                "{:?}",
                tollgate::audit::audit(&p)
            );
            Limiter::from_config(&p).unwrap()
        })
        .collect();
    let key = Key::new("user", "plan");
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    let mut admitted = 0;
    for i in 0..120 {
        if limiters[i % 3].check(&key, 1).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert!(admitted <= 40, "{admitted} admitted of 40");
    assert!(admitted >= 20, "{admitted} admitted of 40");
    assert!(!eu.scan("*deposit*").is_empty());
    assert!(!us.scan("*deposit*").is_empty());
    assert!(!home.scan("*lease*").is_empty());

    let fails = |text: String| Limiter::from_config(&Plan::from_toml(&text).unwrap()).unwrap_err();
    let e = fails(plan("e u", &eu.url(), ""));
    assert_eq!(e.field(), "store.region", "{e}");
    let e = fails(plan("eu", &eu.url(), "deposit_max_percent = 0"));
    assert_eq!(e.field(), "store.deposit_max_percent", "{e}");
    for lease in ["5ms", "0s"] {
        let text = plan("eu", &eu.url(), "")
            .replace("home_lease = \"2s\"", &format!("home_lease = \"{lease}\""));
        let e = fails(text);
        assert_eq!(e.field(), "store.home_lease", "{e}");
        assert_eq!(e.value(), lease, "{e}");
    }
    let e = fails(plan("eu", &eu.url(), "").replace(&format!("home = \"{}\"\n", home.url()), ""));
    assert_eq!(e.field(), "store.home", "{e}");
    let e = fails(
        "failure_mode = \"fail_closed\"\n[[policies]]\nname = \"api\"\nlimit = 4\nwindow = \"1m\"\n\
         [default]\npolicies = [\"api\"]\n[store]\nkind = \"memory\"\nregion = \"eu\"\n"
            .to_owned(),
    );
    assert_eq!(e.field(), "store.region", "{e}");
    // Not fail-closed: the audit says what a partition would cost.
    let open =
        Plan::from_toml(&plan("eu", &eu.url(), "").replace("fail_closed", "fail_open")).unwrap();
    let report = tollgate::audit::audit(&open);
    assert_eq!(report.findings.len(), 1, "{report:?}");
    assert_eq!(report.findings[0].rule, "TG016");
}

/// A region "eu" with its own Redis, lending from a home Redis 80 ms away; the servers
/// live as long as the first value.
async fn one_region_of_a_slow_home() -> ((RedisServer, Proxy, RedisServer), RegionalLedger) {
    let home = RedisServer::start();
    let proxy = Proxy::start(home.port()).await;
    proxy.set_delay(HOME_RTT);
    home_store(&proxy.url()).ping().await.unwrap();
    let local = RedisServer::start();
    let ledger = RegionalLedger::builder("eu", local_store(&local.url()), home_store(&proxy.url()))
        .build()
        .unwrap();
    ((home, proxy, local), ledger)
}

/// Requests given up at every moment of a cold key's renewal from an 80 ms home: nothing is
/// admitted beyond the limit, and what the cancellations cost is at most their own units (the
/// renewal and the grant run to their end without their caller), plus what the region counts
/// as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_given_up_during_a_renewal_lose_at_most_their_own_units() {
    const LIMIT: u64 = 60;
    let (_servers, ledger) = one_region_of_a_slow_home().await;
    let store = LeasedStore::new(ledger.clone());
    // One window for the whole test: units a deposit held for a window that ended are
    // neither admitted nor lost to a cancellation, and would be counted as lost.
    let policy = [Policy::new("api", Rate::per_hour(LIMIT)).unwrap()];
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    let (mut admitted, mut cancelled) = (0u64, 0u64);
    for k in 0..40u64 {
        let key = Key::new("user", format!("cancel-{}", k % 4));
        // Given up after 0 to 195 ms: before, during and after the home's answer.
        let wait = Duration::from_millis((k * 5) % 200);
        match tokio::time::timeout(wait, store.check(&key, &policy, &[1])).await {
            Ok(d) => admitted += u64::from(d.unwrap().is_allowed()),
            Err(_) => cancelled += 1,
        }
    }
    // Renewals, installs and returns land.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for k in 0..4 {
        let key = Key::new("user", format!("cancel-{k}"));
        let mut refused_in_a_row = 0;
        // Refused for longer than a home lease: no unit is still on its way back.
        while refused_in_a_row < 4 {
            if store.check(&key, &policy, &[1]).await.unwrap().is_allowed() {
                admitted += 1;
                refused_in_a_row = 0;
            } else {
                refused_in_a_row += 1;
                tokio::time::sleep(Duration::from_millis(350)).await;
            }
        }
    }
    store.shutdown().await;
    let lost = 4 * LIMIT - admitted.min(4 * LIMIT);
    let stats = ledger.stats();
    eprintln!(
        "4 keys × {LIMIT}: {admitted} admitted, {cancelled} requests given up, {lost} units lost; {stats:?}",
    );
    assert!(
        admitted <= 4 * LIMIT,
        "{admitted} admitted of {}",
        4 * LIMIT
    );
    assert!(cancelled > 0);
    // Besides the requests given up, units are lost only where the region says so: a block
    // given back after its deposit went home (a give-back delayed past the deposit's end,
    // as on a loaded machine), counted in `units_dropped`.
    assert!(
        lost <= cancelled + stats.units_dropped,
        "{lost} units lost for {cancelled} requests given up and {} dropped",
        stats.units_dropped
    );
}

/// A reset while a renewal is on its way from an 80 ms home: the block the home granted
/// before the reset is not lent after it (the reset erased what it was charged against), so
/// after a reset and one request, a request of the whole limit is refused; for every
/// algorithm a region deposits, over several keys and moments, and with the reset given up
/// at several moments of its home call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_during_a_renewal_lends_nothing_charged_before_it() {
    const LIMIT: u64 = 200;
    let (_servers, ledger) = one_region_of_a_slow_home().await;
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    let mut over = Vec::new();
    for algorithm in [
        Algorithm::SlidingWindowCounter,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ] {
        let policy = Policy::builder("api", Rate::per_hour(LIMIT))
            .algorithm(algorithm)
            .build()
            .unwrap();
        let limiter = Limiter::builder()
            .store(LeasedStore::new(ledger.clone()))
            .policy(policy)
            .build()
            .unwrap();
        for k in 0..6u64 {
            let key = Key::new("user", format!("reset-{algorithm:?}-{k}"));
            // Enough requests that the deposit runs low and renews in the background.
            for _ in 0..(3 + 4 * k) {
                limiter.check(&key, 1).await.unwrap();
            }
            if k % 2 == 0 {
                limiter.reset(&key).await.unwrap();
            } else {
                // Given up before, during or after the home's reset: it runs to its end.
                let _ =
                    tokio::time::timeout(Duration::from_millis(20 * k), limiter.reset(&key)).await;
            }
            // Renewals under way at the reset land.
            tokio::time::sleep(3 * HOME_RTT).await;
            assert!(limiter.check(&key, 1).await.unwrap().is_allowed());
            if limiter.check(&key, LIMIT).await.unwrap().is_allowed() {
                over.push(format!("{algorithm:?} key {k}"));
            }
        }
        limiter.store().shutdown().await;
    }
    assert!(
        over.is_empty(),
        "the whole limit admitted after a reset and one request: {over:?}; {:?}",
        ledger.stats()
    );
}

/// Units of the deposits (current and set aside) in `region`'s Redis.
fn deposited_units(region: &RedisServer) -> u64 {
    let mut units = 0.0;
    for key in region.scan("*deposit*") {
        let bytes: Vec<u8> = region.query(&["GET", &key]).unwrap();
        for deposit in bytes.chunks_exact(17 * 8) {
            units += f64::from_le_bytes(deposit[..8].try_into().unwrap());
        }
    }
    units as u64
}

/// A reset made in one region holds there at once; another region spends what it holds of
/// the key — its deposits and its instance's block — and no more: after the reset the two
/// admit at most the limit plus that (the bound `store::regions` states).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_in_one_region_leaves_another_at_most_what_it_holds() {
    const LIMIT: u64 = 1_000;
    let home = RedisServer::start();
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let region = |name: &str, server: &RedisServer| regional(name, server, &home);
    let (a, b) = (region("eu", &eu), region("us", &us));
    let policy = [Policy::new("api", Rate::per_hour(LIMIT)).unwrap()];
    let key = Key::new("user", "reset-across-regions");
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    for _ in 0..200 {
        assert!(b.check(&key, &policy, &[1]).await.unwrap().is_allowed());
    }
    // Renewals under way land before what "us" holds is counted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = b.stats().units_held + deposited_units(&us);
    assert!(held > 0, "{:?}", b.stats());
    a.apply(&key, &policy, Op::Reset).await.unwrap();
    let mut after = 0;
    for store in [&b, &a] {
        while store.check(&key, &policy, &[1]).await.unwrap().is_allowed() {
            after += 1;
            assert!(after <= 2 * LIMIT, "no refusal after {after}");
        }
    }
    eprintln!("after a reset in eu: {after} admitted of {LIMIT}; us held {held}");
    assert!(
        after <= LIMIT + held,
        "{after} admitted after the reset, more than {LIMIT} + the {held} units us held"
    );
    a.shutdown().await;
    b.shutdown().await;
}

// A home that restarts forgets every deposit it granted. A region that gave one back after
// the restart took its unused units off what the fresh home had counted since, and another
// region admitted them again: 130 of a limit of 100. They are dropped now, and counted so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deposits_granted_before_the_home_restarted_are_not_given_back() {
    let mut home = RedisServer::start();
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let region = |name: &str, server: &RedisServer, home: &RedisServer| {
        RegionalLedger::builder(name, local_store(&server.url()), home_store(&home.url()))
            .home_lease(Duration::from_millis(500))
            .max_deposit_fraction(1.0)
            .build()
            .unwrap()
    };
    let ledger_a = region("eu", &eu, &home);
    let a = LeasedStore::new(ledger_a.clone());
    let policy = [Policy::builder("api", Rate::per_hour(100))
        .algorithm(tollgate::Algorithm::FixedWindow)
        .build()
        .unwrap()];
    let key = Key::new("user", "restarted-home");
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    assert!(a.check(&key, &policy, &[10]).await.unwrap().is_allowed());
    home.kill();
    home.restart();
    // The region's connection to the home finds the new server (its generation moves).
    let other = Key::new("user", "restarted-home-other");
    for _ in 0..20 {
        let _ = a.check(&other, &policy, &[1]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = LeasedStore::new(region("us", &us, &home));
    let mut admitted = 0;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        if b.check(&key, &policy, &[1]).await.unwrap().is_allowed() {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let stats = ledger_a.stats();
    eprintln!("after the home's restart: {admitted} admitted; eu {stats:?}");
    assert!(
        admitted <= 100,
        "{admitted} admitted of 100 after the restart"
    );
    assert!(stats.units_dropped > 0, "{stats:?}");
    a.shutdown().await;
    b.shutdown().await;
}

// The home refusing one request for its size must not refuse the smaller ones after it: a
// region kept the refusal for the key, so one oversized request a lease blocked the key for
// the whole region, with errors and a limit of 0 in the answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_for_its_size_does_not_block_the_key_in_the_region() {
    let home = RedisServer::start();
    let (eu, us) = (RedisServer::start(), RedisServer::start());
    let region = |name: &str, server: &RedisServer| regional(name, server, &home);
    let (a, b) = (region("eu", &eu), region("us", &us));
    let fixed = |n: u64| {
        [Policy::builder("api", Rate::per_hour(n))
            .algorithm(tollgate::Algorithm::FixedWindow)
            .build()
            .unwrap()]
    };
    support::clear_of_a_window_end(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    let policy = fixed(100);
    let key = Key::new("user", "oversized");
    assert!(b.check(&key, &policy, &[10]).await.unwrap().is_allowed());
    let big = a.check(&key, &policy, &[95]).await.unwrap();
    assert!(!big.is_allowed(), "90 are left");
    let mut admitted = 0;
    for _ in 0..20 {
        if a.check(&key, &policy, &[1]).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 20, "smaller requests fit what is left");

    // A key the home has nothing left of is refused, with the policy's numbers.
    let policy = fixed(20);
    let key = Key::new("user", "spent-elsewhere");
    assert!(b.check(&key, &policy, &[20]).await.unwrap().is_allowed());
    for _ in 0..4 {
        let d = a.check(&key, &policy, &[1]).await.unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.policies()[0].limit(), 20, "{d:?}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// The operator tools act where a regional plan's instances read: `tollgate override set`
/// and `reset` on a plan with `region` and `home` reach the home ledger (they once went to
/// the region's Redis as a plain store, where nothing reads overrides and no regional state
/// lives, and still said they were done).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_overrides_and_resets_a_regional_plan_at_home() {
    use tollgate::config::Plan;
    let home = RedisServer::start();
    let eu = RedisServer::start();
    let text = format!(
        "failure_mode = \"fail_closed\"\n\
         [[policies]]\nname = \"api\"\nlimit = 40\nwindow = \"1h\"\n\
         [default]\npolicies = [\"api\"]\n\
         [store]\nkind = \"redis\"\nurl = \"{}\"\nregion = \"eu\"\n\
         home = \"{}\"\nhome_lease = \"200ms\"\n",
        eu.url(),
        home.url()
    );
    let dir = std::env::temp_dir().join(format!("tollgate-region-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.toml");
    std::fs::write(&path, &text).unwrap();
    let path = path.to_str().unwrap().to_owned();
    let tollgate = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .output()
            .unwrap();
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {shown}");
        shown
    };
    let app = Limiter::from_config(&Plan::from_toml(&text).unwrap()).unwrap();
    let key = Key::new("user", "cli");

    tollgate(&["override", "set", &path, "user:cli", "api", "5"]);
    let seen = app.overrides(&key).await.unwrap();
    assert_eq!(
        seen.len(),
        1,
        "the application reads the override: {seen:?}"
    );
    assert_eq!(seen[0].limit(), 5);
    let listed = tollgate(&["override", "list", &path, "user:cli"]);
    assert!(listed.contains("api"), "{listed}");

    let mut admitted = 0;
    for _ in 0..20 {
        if app.check(&key, 1).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert!(admitted <= 5, "{admitted} admitted under an override of 5");
    tollgate(&["reset", &path, "user:cli"]);
    tollgate(&["override", "remove", &path, "user:cli", "api"]);
    // The reset and the removal reach this instance within its leases.
    let mut after = 0;
    for _ in 0..40 {
        if app.check(&key, 1).await.unwrap().is_allowed() {
            after += 1;
        }
        if after >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        after >= 10,
        "{after} admitted after the reset and the removal"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A key held at its limit in every region: a renewal that runs ahead of need and finds room
/// at the home for one request but not a block is decided exactly there, one unit charged.
/// That unit goes back home: it was dropped (14 in a run of this test before), and every
/// renewal in that band ate a unit of the key's refill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_ahead_of_need_do_not_eat_a_limited_keys_refill() {
    let policy = Policy::builder("api", Rate::per_minute(12_000))
        .algorithm(Algorithm::TokenBucket)
        .build()
        .unwrap();
    let fleet = Fleet::start(&policy, 0.25).await;
    let key = Key::new("tenant", "at-limit");
    let run = Duration::from_secs(4);
    let samples = load(&fleet.instances, &key, Duration::from_millis(5), run).await;
    let admitted = samples.iter().filter(|s| s.allowed).count();
    let stats = fleet.stats();
    let errors = samples.iter().filter(|s| s.error).count();
    let t0 = samples.iter().map(|s| s.start_us).min().unwrap();
    let mut per_s = [0usize; 6];
    for s in samples.iter().filter(|s| s.allowed) {
        per_s[(((s.start_us - t0) / 1_000_000) as usize).min(5)] += 1;
    }
    eprintln!(
        "admitted {admitted} of {} in {run:?} ({errors} errors, per second {per_s:?}); {stats:?}",
        samples.len()
    );
    // The burst (12 000), less what the regions hold unspent at the end.
    assert!(admitted >= 9_000, "admitted {admitted}: {stats:?}");
    // Every unit charged at the home went to a request or back home.
    assert_eq!(stats.units_dropped, 0, "{stats:?}");
}
