//! The RateLimit header fields to the letter of draft -10 on Redis: `t` on
//! every Redis algorithm, and on a 429 equal to `Retry-After` for the
//! global concurrency limiter and a fail-closed refusal.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::draft::{LIMIT, WINDOW, check, concurrency_deny, exchange, seen};
use crate::support::{client, ok_app, serve};
use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};

#[tokio::test]
async fn every_redis_algorithm_gives_t_per_the_draft() {
    use keyed_rate_limit::Algorithm;
    let server = keyed_rate_limit_testing::RedisServer::start();
    for (algo, t_max) in [
        // Smooth refill: a unit every 2 s.
        (Algorithm::Gcra, 2),
        (Algorithm::TokenBucket, 2),
        // Units come back when the window ends...
        (Algorithm::FixedWindow, 10),
        // ...or as the previous window's weight decays, up to two windows.
        (Algorithm::SlidingWindow, 20),
    ] {
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::new(
                    "global",
                    KeyExtractor::header("x-api-key"),
                    Quota::new(LIMIT, WINDOW),
                )
                .global(server.backend(&format!("draft-{algo}")).await)
                .algorithm(algo)
                .redis_timeout(Duration::from_millis(500)),
            )
            .instances(1)
            .build()
            .unwrap();
        let url = serve(ok_app(layer)).await;
        let seen = exchange(&format!("{url}/"), "k", "global").await;
        check(algo.as_str(), &seen, t_max);
    }
}

#[tokio::test]
async fn a_global_concurrency_deny_has_t_equal_to_retry_after() {
    let server = keyed_rate_limit_testing::RedisServer::start();
    let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-api-key"), 1)
        .global(server.backend("draft-lease").await)
        .redis_timeout(Duration::from_millis(500))
        .instances(1)
        .build()
        .unwrap();
    concurrency_deny(layer).await;
}

#[tokio::test]
async fn a_fail_closed_deny_has_t_equal_to_retry_after_the_breakers_wait() {
    use keyed_rate_limit::failure::BreakerConfig;
    use keyed_rate_limit::failure::FailureMode;
    let mut server = keyed_rate_limit_testing::RedisServer::start();
    let open_for = Duration::from_secs(30);
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "closed",
                KeyExtractor::header("x-api-key"),
                Quota::new(LIMIT, WINDOW),
            )
            .global(server.backend("draft-closed").await)
            .on_redis_failure(FailureMode::FailClosed)
            .redis_timeout(Duration::from_millis(500))
            .circuit_breaker(BreakerConfig::default().open_for(open_for)),
        )
        .instances(1)
        .build()
        .unwrap();
    let url = format!("{}/", serve(ok_app(layer.clone())).await);
    server.kill();
    for _ in 0..3 {
        let res = client()
            .get(&url)
            .header("x-api-key", "k")
            .send()
            .await
            .unwrap();
        let s = seen(res, "closed").await;
        assert_eq!(s.status, 429, "{s:?}");
        let retry = s.retry_after.unwrap();
        assert_eq!(s.state.int("t"), Some(retry as i64), "{s:?}");
        assert!((1..=30).contains(&retry), "the breaker's wait: {s:?}");
        if let Some(left) = layer.breakers()[0].reopens_in {
            assert!(
                retry >= left.as_secs(),
                "never earlier than the probe: {s:?} {left:?}"
            );
        }
    }
}
