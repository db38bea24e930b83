//! Global limits through Redis Sentinel, on real processes: a master, a
//! replica and three sentinels (quorum 2, down after 1 s), started by the
//! test, which kills and restarts them.

use std::time::Duration;

use crate::support::gateway::{app, hit, layer_with};
use crate::support::{client, serve};
use keyed_rate_limit::backend::redis::RedisBackend;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{Algorithm, Key, Quota};
use keyed_rate_limit_testing::{MASTER_NAME, SentinelGroup, role};

async fn backend(group: &SentinelGroup, prefix: &str) -> RedisBackend {
    RedisBackend::sentinel_builder(group.sentinel_urls(), MASTER_NAME)
        .prefix(prefix)
        .build()
        .await
        .expect("the sentinels name a master")
}

/// A quota whose units come back over a year: what a test spends stays
/// spent for its length.
fn yearly(units: u32) -> Quota {
    Quota::new(units, Duration::from_secs(365 * 86_400))
}

#[tokio::test]
async fn four_gateways_are_exact_through_the_sentinels() {
    let group = SentinelGroup::start();
    let mut gateways = Vec::new();
    for _ in 0..4 {
        gateways.push(backend(&group, "exact").await);
    }
    let q = Quota::per_hour(5);
    let mut tasks = Vec::new();
    for k in 0..20u64 {
        for i in 0..8 {
            let be = gateways[i % 4].clone();
            tasks.push(tokio::spawn(async move {
                let d = be
                    .check("r", &Key::from(k), Algorithm::Gcra, &q, 1)
                    .await
                    .unwrap();
                (k, d.is_allowed())
            }));
        }
    }
    let mut admitted = [0u32; 20];
    for t in tasks {
        let (k, ok) = t.await.unwrap();
        admitted[k as usize] += u32::from(ok);
    }
    assert_eq!(admitted, [5; 20]);
}

#[tokio::test]
async fn discovery_goes_on_through_the_other_sentinels_when_one_is_down() {
    let mut group = SentinelGroup::start();
    group.sentinels[0].kill();
    let be = backend(&group, "one-down").await;
    let d = be
        .check("r", &Key::from("k"), Algorithm::Gcra, &yearly(3), 1)
        .await
        .unwrap();
    assert_eq!(d.remaining(), 2);
}

#[tokio::test]
async fn master_auth_and_a_builder_option_that_does_not_apply() {
    let e = RedisBackend::builder("redis://127.0.0.1:1")
        .sentinel_master_auth(None, "pw")
        .connect_lazily()
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("sentinel_builder"), "{e}");
    let e = RedisBackend::sentinel_builder(["redis://127.0.0.1:1"], "")
        .connect_lazily()
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("master's name"), "{e}");
}

/// SIGKILL of the master under traffic: the gateway follows the promotion,
/// keeps what was spent before the kill (the replica had it), answers by
/// its failure mode in the gap with no 5xx, and sends nothing to the old
/// master once it is back, as a replica.
#[tokio::test]
async fn a_killed_master_is_followed_and_its_units_are_kept() {
    let mut group = SentinelGroup::start();
    let be = backend(&group, "failover").await;
    let key = Key::from("k");
    let q = yearly(10_000);
    for _ in 0..30 {
        let d = be
            .check("units", &key, Algorithm::Gcra, &q, 1)
            .await
            .unwrap();
        assert!(d.is_allowed());
    }
    // A gateway over HTTP on the same backend, failing open in the gap.
    let url = serve(app(layer_with(
        be.clone(),
        "http",
        FailureMode::FailOpen,
        Quota::per_hour(100_000),
    )))
    .await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".to_owned()));
    group.wait_synced(Duration::from_secs(5));

    let old = group.master_port().expect("a master");
    group.server(old).kill();
    // Traffic through the gap, bounded: fail-open answers, never a 5xx.
    let mut sources = Vec::new();
    let promoted = loop {
        let (status, source) = hit(&c, &url).await;
        assert!(status < 500, "{status} in the failover gap");
        sources.push(source);
        if let Some(p) = group.master_port().filter(|p| *p != old)
            && role(&group.servers, p).as_deref() == Some("master")
        {
            break p;
        }
        assert!(sources.len() < 2_000, "no promotion within the bound");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(sources.iter().any(|s| s == "fail_open"), "{sources:?}");
    // Decisions on Redis again within 10 s of the promotion.
    let back = tokio::time::Instant::now();
    let gap = sources.len();
    let d = loop {
        match be.check("units", &key, Algorithm::Gcra, &q, 1).await {
            Ok(d) => break d,
            Err(_) => {
                assert!(
                    back.elapsed() < Duration::from_secs(10),
                    "not back within 10 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let recovered = back.elapsed();
    assert_eq!(
        d.remaining(),
        10_000 - 31,
        "the 30 units spent before the kill are kept"
    );

    // The old master comes back empty, as a master, until the sentinels
    // demote it: no decision may reach it.
    group.server(old).restart();
    let restarted = tokio::time::Instant::now();
    let mut spent = 31;
    while role(&group.servers, old).as_deref() != Some("slave") {
        assert!(
            restarted.elapsed() < Duration::from_secs(20),
            "never demoted"
        );
        let d = be
            .check("units", &key, Algorithm::Gcra, &q, 1)
            .await
            .unwrap();
        spent += 1;
        assert_eq!(d.remaining(), 10_000 - spent, "decided on the new master");
        assert_eq!(hit(&c, &url).await, (200, "global".to_owned()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "sentinel failover: {gap} requests in the gap, none 5xx; decisions on Redis {:?} after the promotion was seen; old master demoted {:?} after its restart",
        recovered,
        restarted.elapsed()
    );
    assert_eq!(
        group.server(old).script_calls(),
        0,
        "a script reached the old master"
    );
    assert_ne!(promoted, old);
}
