//! Exemptions and the near-limit signal on a global rule: an exempt
//! request never reaches Redis, and near-limit counts Redis's decisions
//! and, by its share, the local fallback's.

use crate::support::gateway::{HEALTHY_TIMEOUT, hit};
use crate::support::metrics::{counter, snapshotter};
use crate::support::source_app as app;
use crate::support::{Backend as _, client, ok_app, serve};
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

const DECISIONS: &str = "rate_limit_decisions_total";

fn keys(server: &RedisServer) -> usize {
    crate::support::state_keys(server, "*").len()
}

#[tokio::test]
async fn exempt_requests_leave_redis_alone_and_near_limit_counts_global_decisions() {
    snapshotter();
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new(
                "g-exempt",
                KeyExtractor::header("x-api-key"),
                Quota::per_hour(5),
            )
            .global(server.backend("g-exempt").await)
            .redis_timeout(HEALTHY_TIMEOUT)
            .exempt(|p| p.headers.contains_key("x-internal")),
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let c = client();
    for _ in 0..10 {
        let res = c
            .get(&url)
            .header("x-api-key", "k")
            .header("x-internal", "1")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit").is_none());
    }
    assert_eq!(keys(&server), 0, "no counter was written");
    assert_eq!(counter(DECISIONS, "g-exempt", "exempt"), 10);

    let mut statuses = Vec::new();
    for _ in 0..6 {
        let res = c.get(&url).header("x-api-key", "k").send().await.unwrap();
        statuses.push(res.status().as_u16());
    }
    // The whole quota was left for counted requests.
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    assert!(keys(&server) > 0);
    // 5 and 0.2: the fifth left fewer than 1.
    assert_eq!(counter(DECISIONS, "g-exempt", "near_limit"), 1);
}

#[tokio::test]
async fn near_limit_on_the_local_fallback_is_by_the_share() {
    snapshotter();
    let mut server = RedisServer::start();
    // 100 an hour over 4 instances: the fallback share is 25, near below 5.
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new(
                "g-near-share",
                KeyExtractor::everyone(),
                Quota::per_hour(100),
            )
            .global(server.backend("g-near-share").await)
            .on_redis_failure(FailureMode::LocalFallback)
            .redis_timeout(HEALTHY_TIMEOUT),
        )
        .instances(4)
        .build()
        .unwrap();
    let url = serve(app(layer)).await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    server.kill();
    for _ in 0..10 {
        assert_eq!(hit(&c, &url).await, (200, "fallback".into()));
    }
    // Redis had counted 1 of 100, a quarter of a unit of the share,
    // rounded up: 23 down to 14 of 25 left, none near, though under a
    // fifth of 100.
    assert_eq!(counter(DECISIONS, "g-near-share", "near_limit"), 0);
    for _ in 0..14 {
        assert_eq!(hit(&c, &url).await.0, 200);
    }
    // 13 down to 0: the last five.
    assert_eq!(counter(DECISIONS, "g-near-share", "near_limit"), 5);
}
