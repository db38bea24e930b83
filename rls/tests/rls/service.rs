//! The service on the engine's keyed door: checks (`hits_addend: 0`) of
//! shadow, overridden and leased limits, several refusals that agree, a
//! failure mode's status without made-up numbers, reloads under
//! concurrent clients answered wholly by one configuration, and a
//! request's global limits decided in one Redis call.

use std::time::Duration;

use keyed_rate_limit_testing::RedisServer;
use keyed_rls::{RateLimitServer, RlsConfig};

use crate::support::Backend as _;
use crate::{OK, OVER, ask, client, codes, descriptor, header, local_server, serve};

fn check(
    mut d: keyed_rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
) -> keyed_rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    d.hits_addend = Some(0);
    d
}

#[tokio::test]
async fn a_check_reads_shadow_and_overridden_limits_without_counting() {
    let mut c = local_server().await;
    // An override of 1 an hour: checked whole, spent, then checked over.
    let overridden = || crate::one_an_hour("198.51.100.7");
    let r = ask(&mut c, vec![check(overridden())]).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 1));
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, 3),
        "the override's"
    );
    assert_eq!(codes(&ask(&mut c, vec![overridden()]).await), [OK]);
    let r = ask(&mut c, vec![check(overridden())]).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OVER], 0));
    // A shadow limit (1 a minute) spent twice: a check reads it spent, and
    // answers OK, as its decisions do.
    let trial = || descriptor(&[("trial", "t1")]);
    for _ in 0..2 {
        assert_eq!(codes(&ask(&mut c, vec![trial()]).await), [OK]);
    }
    let r = ask(&mut c, vec![check(trial())]).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 0));
}

#[tokio::test]
async fn a_check_reads_a_leased_limit_from_redis() {
    let redis = RedisServer::start();
    let server = RateLimitServer::builder(RlsConfig::from_yaml_str(crate::LEASED).unwrap())
        .redis(redis.backend("rls-check-lease").await)
        .build()
        .unwrap();
    let mut c = client(serve(server).await).await;
    let left = |r: &keyed_rls::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        assert_eq!(codes(r), [OK]);
        r.statuses[0].limit_remaining
    };
    let ann = || vec![descriptor(&[("user", "ann")])];
    let first = left(&ask(&mut c, vec![check(ann().remove(0))]).await);
    // Redis counts the lease's quota, whose burst is held back a little.
    assert!((18..=20).contains(&first), "{first}");
    let again = left(&ask(&mut c, vec![check(ann().remove(0))]).await);
    assert_eq!(again, first, "a check spends nothing");
    assert_eq!(codes(&ask(&mut c, ann()).await), [OK]);
    let after = left(&ask(&mut c, vec![check(ann().remove(0))]).await);
    assert!(
        after < first,
        "the lease taken shows in Redis: {after} of {first}"
    );
}

/// Two descriptors over their limits: one `Retry-After`, the longest wait,
/// the same in the status and the body, which names both limits.
#[tokio::test]
async fn several_refusals_agree_on_the_longest_wait_and_name_every_limit() {
    let mut c = local_server().await;
    let login = || descriptor(&[("path", "/login")]);
    let export = || descriptor(&[("path", "/export/all")]);
    for _ in 0..2 {
        assert_eq!(codes(&ask(&mut c, vec![login()]).await), [OK]);
    }
    assert_eq!(codes(&ask(&mut c, vec![export()]).await), [OK]);
    let r = ask(&mut c, vec![login(), export()]).await;
    assert_eq!(codes(&r), [OVER, OVER]);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    let waits: Vec<i64> = r
        .statuses
        .iter()
        .map(|s| s.duration_until_reset.as_ref().unwrap().seconds)
        .collect();
    // The hour's limit counts to the hour's end, whatever the minute's.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let to_hour = i64::try_from(3600 - now % 3600).unwrap();
    assert!(
        waits[1].abs_diff(to_hour) <= 1,
        "{waits:?}: {to_hour} s to the hour"
    );
    assert!(
        u64::try_from(*waits.iter().max().unwrap())
            .unwrap()
            .abs_diff(retry)
            <= 1,
        "{waits:?} against Retry-After {retry}"
    );
    let body = String::from_utf8(r.raw_body.clone()).unwrap();
    assert!(body.contains(&format!("\"retry_after\":{retry}")), "{body}");
    assert!(body.contains("login") && body.contains("export"), "{body}");
}

/// Under `fail_open` with Redis gone, a status is `OK` and says nothing
/// of a quota nobody counted, as the layer's headers leave it out.
#[tokio::test]
async fn a_failure_modes_status_has_no_made_up_numbers() {
    let mut redis = RedisServer::start();
    let config = "domain: edge
descriptors:
  - key: user
    scope: global
    failure_mode: fail_open
    rate_limit: { unit: minute, requests_per_unit: 100 }
";
    let server = RateLimitServer::builder(RlsConfig::from_yaml_str(config).unwrap())
        .redis(redis.backend("rls-fail-open").await)
        .build()
        .unwrap();
    let mut c = client(serve(server).await).await;
    let r = ask(&mut c, vec![descriptor(&[("user", "u")])]).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 99));
    redis.kill();
    let r = ask(&mut c, vec![descriptor(&[("user", "u")])]).await;
    assert_eq!(codes(&r), [OK]);
    let s = &r.statuses[0];
    assert!(
        s.current_limit.is_none() && s.limit_remaining == 0 && s.duration_until_reset.is_none(),
        "{s:?}"
    );
    assert_eq!(
        header(&r, "ratelimit"),
        None,
        "{:?}",
        r.response_headers_to_add
    );
}

/// Reloads that rename, add and remove limits while 8 clients ask: never
/// an error, and each response is wholly the old configuration's or the
/// new one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_concurrent_clients_answers_from_one_configuration() {
    let old = "domain: edge
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 1000000 }
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 1000000 }
";
    let new = "domain: edge
descriptors:
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 2000000 }
  - key: c
    rate_limit: { unit: minute, requests_per_unit: 3000000, name: renamed }
";
    let server = RateLimitServer::builder(RlsConfig::from_yaml_str(old).unwrap())
        .build()
        .unwrap();
    let addr = serve(server.clone()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut clients = Vec::new();
    for i in 0..8 {
        let mut c = client(addr).await;
        clients.push(tokio::spawn(async move {
            let (mut seen, mut n) = (std::collections::BTreeSet::new(), 0u32);
            while tokio::time::Instant::now() < deadline {
                n += 1;
                let v = format!("{i}-{n}");
                let ds = ["a", "b", "c"].map(|k| descriptor(&[(k, &v)])).to_vec();
                let r = c
                    .should_rate_limit(crate::request(ds))
                    .await
                    .expect("no error while reloading")
                    .into_inner();
                let limits: Vec<u32> = r
                    .statuses
                    .iter()
                    .map(|s| s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit))
                    .collect();
                seen.insert(limits);
            }
            seen
        }));
    }
    let mut flip = false;
    while tokio::time::Instant::now() < deadline {
        flip = !flip;
        let text = if flip { new } else { old };
        server
            .reload(RlsConfig::from_yaml_str(text).unwrap())
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (whole_old, whole_new) = (vec![1_000_000, 1_000_000, 0], vec![0, 2_000_000, 3_000_000]);
    let mut both = (false, false);
    for c in clients {
        for limits in c.await.unwrap() {
            assert!(
                limits == whole_old || limits == whole_new,
                "a response mixing configurations: {limits:?}"
            );
            both.0 |= limits == whole_old;
            both.1 |= limits == whole_new;
        }
    }
    assert!(both.0 && both.1, "both configurations answered");
}

/// A request's descriptors are decided together: three global limits of
/// three ways of counting (envoyproxy/ratelimit's clock-aligned window,
/// GCRA, a sliding window) on one Redis cost one script call, each still
/// exact.
#[tokio::test]
async fn three_global_descriptors_cost_one_redis_call() {
    const THREE: &str = "domain: edge
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: b
    algorithm: gcra
    rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: c
    algorithm: sliding_window
    rate_limit: { unit: minute, requests_per_unit: 5 }
";
    let redis = RedisServer::start();
    let server = RateLimitServer::builder(RlsConfig::from_yaml_str(THREE).unwrap())
        .redis(redis.backend("rls-together").await)
        .build()
        .unwrap();
    let mut c = client(serve(server).await).await;
    let three = || ["a", "b", "c"].map(|k| descriptor(&[(k, "x")])).to_vec();
    // The first decisions also read each rule's record of quotas.
    let r = ask(&mut c, three()).await;
    let left: Vec<u32> = r.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(left, [2, 3, 4]);
    for want in [[1, 2, 3], [0, 1, 2]] {
        let calls = redis.script_calls();
        let r = ask(&mut c, three()).await;
        assert_eq!(redis.script_calls() - calls, 1, "one call for three limits");
        let left: Vec<u32> = r.statuses.iter().map(|s| s.limit_remaining).collect();
        assert_eq!(left, want);
    }
    let r = ask(&mut c, three()).await;
    assert_eq!(codes(&r), [OVER, OK, OK], "a's 3 spent, exactly");
}
