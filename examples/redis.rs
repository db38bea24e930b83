//! Global limits on a shared Redis, with a failure mode per rule.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example redis --features redis   # the default URL
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: k' localhost:3000/; done
//! ```
//!
//! Run it twice (`PORT=3001` for the second): both instances share the
//! same counters. Stop Redis and each rule follows its failure mode:
//! `per-key` falls back to its local share (10 / 2 instances), `payments`
//! fails closed with 429, and `reads` fails open, each with a warning.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get, routing::post};
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate's diagnostics are `tracing` events: INFO and up unless
    // RUST_LOG says otherwise (`fmt::init()` would show only errors once
    // tracing-subscriber's `env-filter` feature is on anywhere in the build).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redis = RedisBackend::builder(&url)
        .prefix("example-rl")
        .build()
        .await?;
    let key = || KeyExtractor::header("x-api-key").or(KeyExtractor::peer_ip());

    let api = RateLimitLayer::builder()
        .rule(
            Rule::new("per-key", key(), Quota::per_minute(10))
                .global(redis.clone())
                .algorithm(Algorithm::SlidingWindow)
                .on_redis_failure(FailureMode::LocalFallback)
                .redis_timeout(Duration::from_millis(20)),
        )
        .instances(2)
        .build()?;
    let reads = RateLimitLayer::builder()
        .rule(
            Rule::new("reads", key(), Quota::per_second(50).with_burst(100))
                .global(redis.clone())
                .on_redis_failure(FailureMode::FailOpen),
        )
        .build()?;
    let payments = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "payments",
                KeyExtractor::header("x-api-key"),
                Quota::per_minute(3),
            )
            .global(redis)
            .algorithm(Algorithm::TokenBucket)
            .on_missing_key(OnMissingKey::Reject(http::StatusCode::UNAUTHORIZED))
            .on_redis_failure(FailureMode::FailClosed),
        )
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }).route_layer(api))
        .route("/items", get(|| async { "[]\n" }).route_layer(reads))
        .route("/pay", post(|| async { "paid\n" }).route_layer(payments));

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{} (redis {url})",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
