//! The Redis Cluster store against three real cluster-mode masters.

mod support;

use proptest::test_runner::{Config, TestRunner};
use support::scenarios::{self, Step};
use support::RedisCluster;
use tollgate::clock::ManualClock;
use tollgate::key::Key;
use tollgate::store::StoreExt;
use tollgate::store::{RedisClusterStore, Store};

/// One key per entry of `nodes`, each owned by that node.
fn keys_on(cluster: &RedisCluster, nodes: &[usize]) -> Vec<Key> {
    let mut candidates = (0..).map(|i| Key::new("tenant", format!("c{i}")));
    nodes
        .iter()
        .map(|&n| {
            candidates
                .by_ref()
                .find(|k| cluster.owner(k.as_str()) == n)
                .unwrap()
        })
        .collect()
}

fn cluster_pool(cluster: &RedisCluster) -> deadpool_redis::cluster::Pool {
    deadpool_redis::cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap()
}

/// Every test shares one cluster: starting three nodes and assigning slots takes a while.
#[test]
fn cluster_store_end_to_end() {
    let cluster = RedisCluster::start();
    let rt = support::runtime();
    differential_on_the_cluster(&cluster, &rt);
    aggregate_enforcement_on_the_cluster(&cluster, &rt);
    noscript_on_every_node(&cluster, &rt);
    a_silent_node_fails_calls_within_the_default_reply_timeout(&cluster, &rt);
}

fn differential_on_the_cluster(cluster: &RedisCluster, rt: &tokio::runtime::Runtime) {
    let policies = scenarios::mixed_policies();
    let mut runner = TestRunner::new(Config {
        cases: 2,
        max_shrink_iters: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&scenarios::trace(800..1_000, 3), |steps: Vec<Step>| {
        let clock = ManualClock::new(1_700_000_000_123);
        let store = RedisClusterStore::builder()
            .prefix(scenarios::unique_prefix("cdiff"))
            .clock(clock.clone())
            .build_cluster_with_urls(cluster.urls())
            .unwrap();
        rt.block_on(scenarios::run_differential(
            &store, &clock, &policies, &steps,
        ))
    });
    if let Err(e) = result {
        panic!("{}", e.to_string().chars().take(3_000).collect::<String>());
    }
}

fn aggregate_enforcement_on_the_cluster(cluster: &RedisCluster, rt: &tokio::runtime::Runtime) {
    let prefix = scenarios::unique_prefix("cagg");
    let stores: Vec<RedisClusterStore> = (0..4)
        .map(|i| {
            let b = RedisClusterStore::builder().prefix(prefix.clone());
            if i % 2 == 0 {
                b.build_cluster_with_pool(cluster_pool(cluster)).unwrap()
            } else {
                b.build_cluster_with_urls(cluster.urls()).unwrap()
            }
        })
        .collect();
    // The five keys land on nodes 0, 1, 2, 0, 1: different slots on every master.
    let keys = keys_on(cluster, &[0, 1, 2, 0, 1]);
    rt.block_on(scenarios::exactly_the_limit_in_aggregate(
        &stores,
        &keys,
        64,
        &cluster.nodes()[0],
    ));
    // Each master holds its share of the state, and every key has a TTL.
    for (i, node) in cluster.nodes().iter().enumerate() {
        let keys = node.scan(&format!("{prefix}:*"));
        assert!(!keys.is_empty(), "node {i} holds no state");
        for k in keys {
            let pttl: i64 = node.query(&["PTTL", &k]).unwrap();
            assert!(pttl > 0, "{k}: PTTL {pttl}");
        }
    }
}

fn noscript_on_every_node(cluster: &RedisCluster, rt: &tokio::runtime::Runtime) {
    let store = RedisClusterStore::builder()
        .prefix(scenarios::unique_prefix("cnoscript"))
        .build_cluster_with_urls(cluster.urls())
        .unwrap();
    let policies = scenarios::hourly_policies();
    let keys = keys_on(cluster, &[2, 1, 0, 2, 1]);
    rt.block_on(async {
        for round in 0..3u64 {
            for node in cluster.nodes() {
                let _: String = node.query(&["SCRIPT", "FLUSH"]).unwrap();
            }
            for (p, key) in policies.iter().zip(&keys) {
                for i in 0..5u64 {
                    let d = store
                        .check(key, std::slice::from_ref(p), &[1])
                        .await
                        .unwrap();
                    assert!(d.is_allowed());
                    assert_eq!(d.remaining(), 500 - (round * 5 + i + 1), "{}", p.name());
                }
            }
        }
        let p = &policies[..1];
        store.reset(&keys[0], p).await.unwrap();
        let d = store.check(&keys[0], p, &[1]).await.unwrap();
        assert_eq!(d.remaining(), 499);
        store.ping().await.unwrap();
        assert_eq!(store.name(), "redis-cluster");
    });
}

/// A node that stops answering (paused, its host gone without a reset) fails the calls for
/// its slots within the default reply timeout (500 ms) on a store built from URLs without a
/// timeout, rather than holding them until TCP gives up.
fn a_silent_node_fails_calls_within_the_default_reply_timeout(
    cluster: &RedisCluster,
    rt: &tokio::runtime::Runtime,
) {
    use std::time::{Duration, Instant};
    use tollgate::{Policy, Rate};
    let store = RedisClusterStore::builder()
        .prefix(scenarios::unique_prefix("silent"))
        .build_cluster_with_urls(cluster.urls())
        .unwrap();
    let key = keys_on(cluster, &[0]).remove(0);
    let policies = [Policy::new("api", Rate::per_minute(10)).unwrap()];
    rt.block_on(store.check(&key, &policies, &[1])).unwrap();
    cluster.nodes()[0].signal("STOP");
    let started = Instant::now();
    let answer = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), store.check(&key, &policies, &[1])).await
    });
    let took = started.elapsed();
    cluster.nodes()[0].signal("CONT");
    assert!(matches!(answer, Ok(Err(_))), "{answer:?}");
    assert!(took < Duration::from_secs(5), "the call waited {took:?}");
}
