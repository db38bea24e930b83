//! Global limits through Redis Sentinel, on real processes: a master, a
//! replica and three sentinels (quorum 2, down after 1 s), started by the
//! test, which kills and restarts them.

use std::time::Duration;

use crate::support::gateway::{hit, layer_with, until_global};
use crate::support::source_app as app;
use crate::support::{client, serve};
use keyed_rate_limit::RedisBackend;
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

/// The sentinels' password rides in their URLs, the master's is its own.
#[tokio::test]
async fn sentinels_and_the_master_each_take_their_own_password() {
    let group = SentinelGroup::start_with_auth(Some(("data-pw", "sentinel-pw")));
    assert!(group.sentinel_urls()[0].contains(":sentinel-pw@"));
    let without = RedisBackend::sentinel_builder(group.sentinel_urls(), MASTER_NAME)
        .build()
        .await;
    assert!(
        without.is_err(),
        "the master refuses a client without its password"
    );
    let be = RedisBackend::sentinel_builder(group.sentinel_urls(), MASTER_NAME)
        .sentinel_master_auth(None, "data-pw")
        .prefix("auth")
        .live_instances(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let d = be
        .check("r", &Key::from("k"), Algorithm::Gcra, &yearly(3), 1)
        .await
        .unwrap();
    assert_eq!(d.remaining(), 2);
    assert_eq!(
        be.live_instances(),
        Some(1),
        "the live count reads through the master"
    );
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
    let e = RedisBackend::sentinel_builder(["redis://127.0.0.1:1"], MASTER_NAME)
        .connection(keyed_rate_limit::backend::redis::ConnectionMode::Pool { max_size: 4 })
        .connect_lazily()
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no pool"), "{e}");
}

/// SIGKILL of the master under traffic: the gateway follows the promotion,
/// keeps what was spent before the kill (the replica had it), answers by
/// its failure mode in the gap with no 5xx, and sends nothing to the old
/// master once it is back and still answers as a master.
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

    // Replication is asynchronous: a burst on another key is in flight when
    // the master dies, and what it loses is measured.
    let burst_key = Key::from("burst");
    let burst: Vec<_> = (0..16)
        .map(|_| {
            let (be, key) = (be.clone(), burst_key.clone());
            tokio::spawn(async move {
                let mut acked = 0u32;
                let start = tokio::time::Instant::now();
                while start.elapsed() < Duration::from_secs(5) {
                    match be.check("units", &key, Algorithm::Gcra, &q, 1).await {
                        Ok(d) if d.is_allowed() => acked += 1,
                        _ => break,
                    }
                }
                acked
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let old = group.master_port().expect("a master");
    group.server(old).kill();
    let mut acked = 0;
    for t in burst {
        acked += t.await.unwrap();
    }
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
    let kept = 10_000
        - 1
        - be.check("units", &burst_key, Algorithm::Gcra, &q, 1)
            .await
            .unwrap()
            .remaining();
    // At most the 16 calls in flight at the kill were applied unanswered.
    assert!(kept <= acked + 16, "{kept} kept of {acked} acknowledged");
    eprintln!(
        "sentinel failover under a 16-caller burst: {acked} units acknowledged before the kill, {kept} kept by the promoted replica ({} lost)",
        i64::from(acked) - i64::from(kept)
    );

    // The gateway's breaker probes again within its 200 ms.
    until_global(&c, &url).await;

    // The old master comes back empty and answers as a master until the
    // sentinels demote it (their next look at it, up to 10 s): the
    // dangerous window. Two seconds of decisions in it, none reaching it.
    group.server(old).restart();
    let restarted = tokio::time::Instant::now();
    let mut spent = 31;
    while restarted.elapsed() < Duration::from_secs(2) {
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
        "sentinel failover: {gap} requests in the gap, none 5xx; decisions on Redis {:?} after the promotion was seen; old master {:?} 2 s after its restart",
        recovered,
        role(&group.servers, old)
    );
    assert_eq!(
        group.server(old).script_calls(),
        0,
        "a script reached the old master"
    );
    assert_ne!(promoted, old);
}

/// TLS to the sentinels and to the master they name: `rediss://` sentinel
/// URLs, the data nodes reached over TLS too, with a private CA and a
/// client certificate for both.
#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn tls_reaches_the_sentinels_and_the_master() {
    let group = SentinelGroup::start_tls();
    let pem = |name| group.servers[0].pem(name);
    let urls = group.sentinel_urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let untrusted = RedisBackend::sentinel_builder(urls.clone(), MASTER_NAME)
        .build()
        .await;
    assert!(
        untrusted.is_err(),
        "the private CA is not trusted by default"
    );
    let be = RedisBackend::sentinel_builder(urls, MASTER_NAME)
        .tls_root_cert(pem("ca.pem"))
        .tls_client_cert(pem("cert.pem"), pem("key.pem"))
        .prefix("tls")
        .build()
        .await
        .expect("TLS to the sentinels and to the TLS-only master");
    let d = be
        .check("r", &Key::from("k"), Algorithm::Gcra, &yearly(3), 1)
        .await
        .unwrap();
    assert_eq!(d.remaining(), 2);
}
