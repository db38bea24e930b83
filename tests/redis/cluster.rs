//! The global backend on a real 3-master Redis Cluster started by the test.

use std::collections::{HashMap, HashSet};

use crate::coalesce::{coalescing, crowd_over};
use crate::support::{client, ok_app, serve, statuses};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::rule::LeasePolicy;
use keyed_rate_limit::{Algorithm, Key, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisCluster;

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

async fn backend(cluster: &RedisCluster, prefix: &str) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.urls())
        .prefix(prefix)
        .build()
        .await
        .unwrap()
}

/// A cluster keeps one multiplexed connection per node: a pool is a build
/// error that says so, not a connection to nowhere.
#[tokio::test]
async fn a_cluster_backend_refuses_a_pool_at_build_time() {
    let e = RedisBackend::cluster_builder(["redis://127.0.0.1:1"])
        .connection(keyed_rate_limit::backend::redis::ConnectionMode::Pool { max_size: 4 })
        .connect_lazily()
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no pool"), "{e}");
}

/// The hash tag of a key: the bytes between the first `{` and the next `}`.
fn tag(key: &[u8]) -> Vec<u8> {
    let open = key.iter().position(|b| *b == b'{').unwrap();
    let close = open + key[open..].iter().position(|b| *b == b'}').unwrap();
    key[open + 1..close].to_vec()
}

#[tokio::test]
async fn every_algorithm_is_exact_and_stays_on_one_slot_across_nodes() {
    let cluster = RedisCluster::start();
    let a = backend(&cluster, "exact").await;
    let b = backend(&cluster, "exact").await;
    let q = Quota::per_hour(3);
    for algo in ALL {
        let mut tasks = Vec::new();
        for k in 0..60u64 {
            for i in 0..5 {
                let be = if i % 2 == 0 { a.clone() } else { b.clone() };
                tasks.push(tokio::spawn(async move {
                    let d = be.check("r", &Key::from(k), algo, &q, 1).await.unwrap();
                    (k, d.is_allowed())
                }));
            }
        }
        let mut admitted: HashMap<u64, usize> = HashMap::new();
        for t in tasks {
            let (k, ok) = t.await.unwrap();
            *admitted.entry(k).or_default() += usize::from(ok);
        }
        assert!(admitted.values().all(|n| *n == 3), "{algo}: {admitted:?}");
    }
    let keys = cluster.keys();
    let nodes: HashSet<usize> = keys.iter().map(|(n, _)| *n).collect();
    assert_eq!(nodes.len(), 3, "60 keys spread over all three masters");
    // Every limit's keys (the sliding window writes two) sit on one node,
    // and no script hit CROSSSLOT.
    let mut node_of_tag: HashMap<Vec<u8>, usize> = HashMap::new();
    for (node, key) in &keys {
        let prev = node_of_tag.insert(tag(key), *node);
        assert!(
            prev.is_none_or(|p| p == *node),
            "tag split across nodes: {}",
            String::from_utf8_lossy(key)
        );
    }
    let sliding = keys
        .iter()
        .filter(|(_, k)| k.windows(4).any(|w| w == b":sw:"))
        .count();
    assert!(
        sliding >= 60,
        "sliding window keeps two windows per limit: {sliding}"
    );

    // Group commit over four gateways: 400 concurrent requests, for one key
    // and over 10 keys of several slots, admit exactly the quota.
    for (i, algo) in ALL.into_iter().enumerate() {
        let mut layers = Vec::new();
        for _ in 0..4 {
            let be = backend(&cluster, &format!("crowd{i}")).await;
            layers.push(coalescing(be, algo, Quota::per_hour(30)));
        }
        let hot = crowd_over(&layers, 400, |_| "hot".into()).await;
        let told: HashSet<u32> = hot.iter().filter_map(|(_, t)| *t).collect();
        let admitted = hot.iter().filter(|(_, t)| t.is_some()).count();
        assert_eq!((admitted, told), (30, (0..30).collect()), "{algo}, one key");
        let many = crowd_over(&layers, 400, |i| format!("m{}", i % 10)).await;
        let mut per_key: HashMap<&str, usize> = HashMap::new();
        for (key, told) in &many {
            *per_key.entry(key).or_default() += usize::from(told.is_some());
        }
        assert!(
            per_key.len() == 10 && per_key.values().all(|n| *n == 30),
            "{algo}, 10 keys: {per_key:?}"
        );
    }
}

#[tokio::test]
async fn limits_stay_exact_while_slots_move_between_nodes() {
    let cluster = RedisCluster::start();
    let be = backend(&cluster, "moved").await;
    let q = Quota::per_hour(3);
    let keys: Vec<Key> = (0..40u64).map(Key::from).collect();
    for k in &keys {
        for _ in 0..2 {
            assert!(
                be.check("r", k, Algorithm::Gcra, &q, 1)
                    .await
                    .unwrap()
                    .is_allowed()
            );
        }
    }
    // Node 0's slots move to node 1: the client's slot map is stale and
    // must follow MOVED; the migrated state must still count.
    cluster.reshard(0, 1, 5461);
    for k in &keys {
        assert!(
            be.check("r", k, Algorithm::Gcra, &q, 1)
                .await
                .unwrap()
                .is_allowed(),
            "third unit of {k:?}"
        );
        assert!(
            !be.check("r", k, Algorithm::Gcra, &q, 1)
                .await
                .unwrap()
                .is_allowed(),
            "fourth unit of {k:?}"
        );
    }
    let nodes: HashSet<usize> = cluster.keys().iter().map(|(n, _)| *n).collect();
    assert!(!nodes.contains(&0), "node 0 holds no slots any more");
}

#[tokio::test]
async fn the_layer_runs_global_rules_on_the_cluster() {
    let cluster = RedisCluster::start();
    let redis = backend(&cluster, "layer").await;
    let rule = |q| {
        Rule::new("cluster", KeyExtractor::header("x-api-key"), q)
            .global(redis.clone())
            .algorithm(Algorithm::SlidingWindow)
            .redis_timeout(std::time::Duration::from_millis(500))
            .on_quota_change(keyed_rate_limit::rule::QuotaChange::AsIs)
    };
    let layer = RateLimitLayer::builder()
        .rule(rule(Quota::per_hour(4)))
        .build()
        .unwrap();
    let url = serve(ok_app(layer.clone())).await;
    let c = client();
    for key in ["a", "b", "c"] {
        let mut got = Vec::new();
        for _ in 0..6 {
            got.push(
                c.get(&url)
                    .header("x-api-key", key)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16(),
            );
        }
        assert_eq!(got, [200, 200, 200, 200, 429, 429], "{key}");
    }
    // Keys without the header skip the rule.
    assert_eq!(statuses(&c, &url, 2).await, [200, 200]);
    // A raised quota keeps the 4 units each key used: the script reads
    // the old state beside the new, in one slot.
    layer.reload([rule(Quota::per_hour(8))]).unwrap();
    for key in ["a", "b"] {
        let mut got = Vec::new();
        for _ in 0..5 {
            let res = c.get(&url).header("x-api-key", key).send().await.unwrap();
            got.push(res.status().as_u16());
        }
        assert_eq!(got, [200, 200, 200, 200, 429], "{key} after the reload");
    }

    // A crowd of 200 concurrent HTTP requests for one key, over four
    // gateways each: coalesced (the default) admits the quota exactly,
    // leased never more.
    for (lease, prefix) in [(false, "crowd-coalesced"), (true, "crowd-leased")] {
        let mut urls = Vec::new();
        for _ in 0..4 {
            let rule = Rule::new(
                "crowd",
                KeyExtractor::header("x-api-key"),
                Quota::per_hour(30),
            )
            .global(backend(&cluster, prefix).await)
            .redis_timeout(std::time::Duration::from_secs(2));
            let rule = if lease {
                rule.lease(LeasePolicy::new(std::time::Duration::from_millis(200)))
            } else {
                rule
            };
            let layer = RateLimitLayer::builder().rule(rule).build().unwrap();
            urls.push(serve(ok_app(layer)).await);
        }
        let sends = (0..200).map(|i| {
            let (c, url) = (c.clone(), urls[i % 4].clone());
            async move {
                let res = c.get(&url).header("x-api-key", "hot").send().await.unwrap();
                res.status().as_u16()
            }
        });
        let got = futures_util::future::join_all(sends).await;
        let admitted = got.iter().filter(|s| **s == 200).count();
        assert_eq!(admitted + got.iter().filter(|s| **s == 429).count(), 200);
        if lease {
            // One unit of the burst is held back for the lease's ttl.
            assert!((20..=29).contains(&admitted), "leased: {admitted} of 30");
        } else {
            assert_eq!(admitted, 30, "coalesced");
        }
    }

    // Rules decided together (a rate-limit service's descriptors): on a
    // cluster each rule's call goes on its own, each exact.
    let rule = |name: &str, q| Rule::new(name, KeyExtractor::header("x"), q).global(redis.clone());
    let keyed = RateLimitLayer::builder()
        .rule(rule("one", Quota::per_hour(2)))
        .rule(rule("two", Quota::per_hour(3)))
        .build()
        .unwrap();
    let rules = keyed.keyed();
    let ask = |rule: &str| keyed_rate_limit::rate_limit::KeyedAsk {
        rule: rules.rule(rule).unwrap(),
        key: keyed_rate_limit::Key::from("k"),
        cost: std::num::NonZeroU32::MIN,
        quota: None,
    };
    let mut left = Vec::new();
    for _ in 0..3 {
        for d in rules.decide_all([ask("one"), ask("two")]).await {
            let d = d.unwrap().decision;
            left.push(d.is_allowed().then(|| d.remaining()));
        }
    }
    assert_eq!(left, [Some(1), Some(2), Some(0), Some(1), None, Some(0)]);
}

#[tokio::test]
async fn a_master_failover_keeps_the_limits() {
    let mut cluster = RedisCluster::start_with_replicas(1);
    let be = backend(&cluster, "failover").await;
    let q = Quota::per_hour(3);
    for k in 0..30u64 {
        for _ in 0..2 {
            assert!(
                be.check("r", &Key::from(k), Algorithm::Gcra, &q, 1)
                    .await
                    .unwrap()
                    .is_allowed()
            );
        }
    }
    // The keys one master holds, replicated before it dies.
    let master = cluster.a_master();
    let on_master0: Vec<u64> = crate::support::state_keys(&cluster.nodes[master], "*")
        .iter()
        .map(|k| {
            let t = tag(k);
            let key = &t[t.iter().rposition(|b| *b == b':').unwrap() + 1..];
            std::str::from_utf8(key).unwrap().parse().unwrap()
        })
        .collect();
    assert!(!on_master0.is_empty());
    let mut c = cluster.nodes[master].connection().unwrap();
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(2000).query(&mut c).unwrap();
    assert_eq!(acked, 1, "the replica has the writes");
    cluster.nodes[master].kill();

    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let k = Key::from(on_master0[0]);
    let third = loop {
        match be.check("r", &k, Algorithm::Gcra, &q, 1).await {
            Ok(d) => break d,
            Err(_) => {
                assert!(tokio::time::Instant::now() < deadline, "no failover");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    };
    assert!(third.is_allowed(), "the promoted replica kept 2 of 3 spent");
    for key in &on_master0 {
        let d = be
            .check("r", &Key::from(*key), Algorithm::Gcra, &q, 1)
            .await
            .unwrap();
        if *key == on_master0[0] {
            assert!(!d.is_allowed(), "fourth unit of {key}");
        } else {
            assert!(d.is_allowed() && d.remaining() == 0, "third unit of {key}");
        }
    }
}
