//! Request-time costs at and past the edges, over HTTP, on every path a
//! rule can take: local, Redis (each algorithm), and each failure mode with
//! Redis killed. An unchecked cost used to overflow inside governor: a
//! panic here in debug builds, a silent admit in release ones.

#[cfg(feature = "redis")]
use crate::support::Backend as _;
use crate::support::{client, header, ok_app, serve};
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
#[cfg(feature = "redis")]
use {
    keyed_rate_limit::failure::FailureMode, keyed_rate_limit_testing::RedisServer,
    std::time::Duration,
};

const BURST: u32 = 10;

fn rule() -> Rule {
    Rule::new(
        "cost",
        KeyExtractor::header("x-api-key"),
        Quota::per_hour(BURST),
    )
    .cost_fn(|p| {
        p.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
}

async fn app(rule: Rule) -> String {
    let layer = RateLimitLayer::builder()
        .rule(rule)
        .instances(1)
        .build()
        .unwrap();
    format!("{}/", serve(ok_app(layer)).await)
}

/// (status, Retry-After, RateLimit) for one request of `cost` units.
async fn send(url: &str, key: &str, cost: u64) -> (u16, Option<String>, Option<String>) {
    let res = client()
        .get(url)
        .header("x-api-key", key)
        .header("x-cost", cost.to_string())
        .send()
        .await
        .unwrap();
    (
        res.status().as_u16(),
        header(&res, "retry-after"),
        header(&res, "ratelimit"),
    )
}

/// Costs past the capacity are refused without `Retry-After` and spend
/// nothing; 0 skips the rule; the burst itself fits once.
async fn edges(url: &str, path: &str) {
    let key = format!("key-{path}");
    for cost in [u64::from(BURST) + 1, 1 << 31, u64::from(u32::MAX)] {
        let (status, retry, _) = send(url, &key, cost).await;
        assert_eq!(status, 429, "{path}: cost {cost}");
        assert_eq!(retry, None, "{path}: waiting never helps a cost of {cost}");
    }
    let (status, _, limit) = send(url, &key, 0).await;
    assert_eq!(
        (status, limit),
        (200, None),
        "{path}: cost 0 skips the rule"
    );
    let (status, _, _) = send(url, &key, u64::from(BURST)).await;
    assert_eq!(status, 200, "{path}: the refused costs spent nothing");
    let (status, retry, _) = send(url, &key, 1).await;
    assert_eq!(status, 429, "{path}: the burst is spent");
    assert!(retry.is_some(), "{path}: one unit comes back");
}

#[tokio::test]
async fn local_rules_refuse_costs_past_the_burst() {
    edges(&app(rule()).await, "local").await;
}

#[cfg(feature = "redis")]
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

#[cfg(feature = "redis")]
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
