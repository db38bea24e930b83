//! Request-time costs at and past the edges on Redis (each algorithm), and
//! each failure mode with Redis killed, over HTTP.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::cost::{BURST, app, edges, rule, send};
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit_testing::RedisServer;

#[tokio::test]
async fn every_redis_algorithm_refuses_costs_past_its_capacity() {
    let server = RedisServer::start();
    for algo in crate::support::ALGORITHMS {
        let redis = server.backend(&format!("cost-{algo}")).await;
        let url = app(rule()
            .global(redis)
            .algorithm(algo)
            .redis_timeout(Duration::from_millis(500)))
        .await;
        edges(&url, algo.as_str()).await;
    }
}

#[tokio::test]
async fn failure_modes_refuse_costs_past_the_burst() {
    let mut server = RedisServer::start();
    let mut urls = Vec::new();
    for mode in [
        FailureMode::LocalFallback,
        FailureMode::FailOpen,
        FailureMode::FailClosed,
    ] {
        let redis = server.backend(&format!("cost-{mode}")).await;
        let rule = rule().global(redis).on_redis_failure(mode);
        urls.push((mode, app(rule).await));
    }
    server.kill();
    for (mode, url) in &urls {
        let key = format!("down-{mode}");
        for cost in [u64::from(BURST) + 1, 1 << 31, u64::from(u32::MAX)] {
            let (status, retry, _) = send(url, &key, cost).await;
            assert_eq!((status, retry), (429, None), "{mode}: cost {cost}");
        }
    }
    // The fallback's own bucket is whole after the refusals.
    let (_, fallback) = &urls[0];
    let (status, _, _) = send(fallback, "down-local_fallback", u64::from(BURST)).await;
    assert_eq!(status, 200);
    let (status, retry, _) = send(fallback, "down-local_fallback", 1).await;
    assert_eq!(status, 429);
    assert!(retry.is_some());
}
