//! A gateway as users deploy one: an axum server whose only rule is global,
//! with the shipped defaults (20 ms timeout, breaker, `LocalFallback`).
//! Used by the stress test and the burst bench.

use axum::{Router, routing::get};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule};
pub use keyed_rate_limit_testing::runtime;

/// Starts a gateway on `rt` limiting `x-api-key` to `quota` with `algo`, as
/// one of `instances`; returns its URL.
pub async fn gateway(
    redis_url: String,
    prefix: String,
    algo: Algorithm,
    quota: Quota,
    instances: u32,
    rt: &tokio::runtime::Handle,
) -> String {
    keyed_rate_limit_testing::serve_on(rt, move || async move {
        let redis = RedisBackend::builder(redis_url)
            .prefix(prefix)
            .build()
            .await
            .unwrap();
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::new("burst", KeyExtractor::header("x-api-key"), quota)
                    .global(redis)
                    .algorithm(algo),
            )
            .instances(instances)
            .build()
            .unwrap();
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer)
    })
    .await
}
