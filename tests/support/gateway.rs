//! Gateways with one global rule, served over HTTP, that say which source
//! decided: what the failure tests over real `redis-server` processes share.

use std::time::Duration;

use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::{BreakerConfig, FailureMode};
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

/// Generous: a loaded 2-core CI box must not turn a healthy Redis into a failure.
pub const HEALTHY_TIMEOUT: Duration = Duration::from_millis(500);

/// Sends one request: (status, body).
pub async fn hit(c: &reqwest::Client, url: &str) -> (u16, String) {
    let res = c.get(url).send().await.unwrap();
    (res.status().as_u16(), res.text().await.unwrap())
}

/// Polls until the rule decides through Redis again.
pub async fn until_global(c: &reqwest::Client, url: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if hit(c, url).await == (200, "global".to_owned()) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "redis never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One global rule named `rule` on `backend`, keyed on nothing, with failure
/// mode `mode` and a breaker that probes every 200 ms.
pub fn layer_with(
    backend: RedisBackend,
    rule: &str,
    mode: FailureMode,
    quota: Quota,
) -> RateLimitLayer {
    RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new(rule, KeyExtractor::everyone(), quota)
                .global(backend)
                .on_redis_failure(mode)
                .redis_timeout(HEALTHY_TIMEOUT)
                .circuit_breaker(BreakerConfig::default().open_for(Duration::from_millis(200))),
        )
        .instances(2)
        .build()
        .unwrap()
}
