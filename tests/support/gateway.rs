//! A gateway as users deploy one: an axum server whose only rule is global,
//! with the shipped defaults (20 ms timeout, breaker, `LocalFallback`).
//! Used by the stress test and the burst bench.
#![allow(dead_code)]

use axum::{Router, routing::get};
use keyed_rate_limit::backend::redis::RedisBackend;
use keyed_rate_limit::{Algorithm, Quota, RateLimitLayer, Rule, key::KeyExtractor};

/// Starts a gateway on `rt` limiting `x-api-key` to `quota` with `algo`, as
/// one of `instances`; returns its URL. The backend connects from `rt`, so
/// its Redis replies are read there too, as in a real gateway.
pub async fn gateway(
    redis_url: String,
    prefix: String,
    algo: Algorithm,
    quota: Quota,
    instances: u32,
    rt: &tokio::runtime::Handle,
) -> String {
    rt.spawn(async move {
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
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}/")
    })
    .await
    .unwrap()
}

/// A 2-worker runtime, the size of the box the gateways share.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
