//! What operators count on, against a private `redis-server`: every
//! decision counted under concurrent load, and the partial fail-closed
//! mode's exact share during an outage, over HTTP.

use crate::support::Backend as _;
use crate::support::gateway::{HEALTHY_TIMEOUT, hit, layer_with};
use crate::support::load::spread;
use crate::support::metrics::{counter, snapshotter};
use crate::support::source_app as app;
use crate::support::{client, header, ok_app, serve};
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

const DECISIONS: &str = "rate_limit_decisions_total";

#[tokio::test]
async fn global_rules_count_every_decision_under_concurrent_load() {
    snapshotter(); // installed before the layer resolves its counters
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new(
                "counted-redis-wide",
                KeyExtractor::everyone(),
                Quota::per_hour(1_000_000),
            )
            .global(server.backend("counted").await)
            .coalesce(true)
            .redis_timeout(HEALTHY_TIMEOUT),
        )
        .rule(
            Rule::new(
                "counted-redis-client",
                KeyExtractor::header("x-client"),
                Quota::per_hour(50),
            )
            .global(server.backend("counted").await)
            .redis_timeout(HEALTHY_TIMEOUT),
        )
        .instances(1)
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let (ok, denied) = spread(&url, 1000, 8).await;
    assert_eq!((ok, denied), (400, 600), "8 clients × 50 admitted");
    for (rule, allow, deny) in [
        ("counted-redis-wide", 1000, 0),
        ("counted-redis-client", ok, denied),
    ] {
        assert_eq!(counter(DECISIONS, rule, "allow"), allow, "{rule}");
        assert_eq!(counter(DECISIONS, rule, "deny"), deny, "{rule}");
        for failure in [
            "fail_open",
            "fail_closed",
            "local_fallback",
            "refuse_percent",
        ] {
            assert_eq!(
                counter(DECISIONS, rule, failure),
                0,
                "{rule}: redis was healthy"
            );
        }
    }
}

#[tokio::test]
async fn refuse_percent_refuses_its_exact_share_of_an_outage_with_retry_after() {
    snapshotter();
    let mut server = RedisServer::start();
    let rule = "partial-25";
    let url = serve(app(layer_with(
        server.backend("partial").await,
        rule,
        FailureMode::RefusePercent(25),
        Quota::per_hour(1_000),
    )))
    .await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    server.kill(); // SIGKILL
    // 48 requests from 8 concurrent clients: the share is counted, not
    // drawn, so exactly a quarter of them are refused.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut seen = Vec::new();
            for _ in 0..6 {
                let res = c.get(&url).send().await.unwrap();
                let status = res.status().as_u16();
                let retry_after = header(&res, "retry-after");
                let ratelimit = header(&res, "ratelimit");
                seen.push((status, retry_after, ratelimit, res.text().await.unwrap()));
            }
            seen
        }));
    }
    let (mut refused, mut admitted) = (0, 0);
    for t in tasks {
        for (status, retry_after, ratelimit, body) in t.await.unwrap() {
            match status {
                429 => {
                    refused += 1;
                    let wait: u64 = retry_after
                        .expect("a refusal says when to retry")
                        .parse()
                        .unwrap();
                    assert!(
                        (1..=2).contains(&wait),
                        "the breaker's open time, at least 1 s: {wait}"
                    );
                }
                200 => {
                    admitted += 1;
                    assert_eq!(body, "fail_open", "an admit is a fail-open decision");
                    assert_eq!(ratelimit, None, "no made-up numbers");
                }
                other => panic!("status {other}: never a 5xx"),
            }
        }
    }
    assert_eq!((refused, admitted), (12, 36));
    assert_eq!(counter(DECISIONS, rule, "refuse_percent"), 48);
    assert_eq!(counter(DECISIONS, rule, "deny"), 12);
    assert_eq!(counter(DECISIONS, rule, "allow"), 1 + 36);
    // Spread evenly, not in runs: requests 48 to 55 of the outage.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(hit(&c, &url).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 429, 200, 200, 200, 429]);
}
