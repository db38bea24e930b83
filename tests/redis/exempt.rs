//! Exemptions and the near-limit signal on a global rule: an exempt
//! request never reaches Redis, and near-limit counts Redis's decisions.

use crate::support::gateway::HEALTHY_TIMEOUT;
use crate::support::metrics::{counter, snapshotter};
use crate::support::{Backend as _, client, ok_app, serve};
use keyed_rate_limit::{Quota, RateLimitLayer, Rule, key::KeyExtractor};
use keyed_rate_limit_testing::RedisServer;

const DECISIONS: &str = "rate_limit_decisions_total";

fn keys(server: &RedisServer) -> i64 {
    let mut c = server.connection().unwrap();
    redis::cmd("DBSIZE").query(&mut c).unwrap()
}

#[tokio::test]
async fn exempt_requests_leave_redis_alone_and_near_limit_counts_global_decisions() {
    snapshotter();
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
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
