//! Global limits on a Redis Cluster.
//!
//! ```sh
//! REDIS_CLUSTER_NODES=redis://127.0.0.1:7000,redis://127.0.0.1:7001 cargo run --example cluster --features redis-cluster
//! curl -i -H 'x-api-key: k' localhost:3000/
//! ```
//!
//! Any reachable node is enough; the client discovers the others, follows
//! `MOVED`/`ASK` during resharding and the new master after a failover.

use std::net::SocketAddr;

use axum::{Router, routing::get};
use keyed_rate_limit::RedisBackend;
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
    let nodes =
        std::env::var("REDIS_CLUSTER_NODES").unwrap_or_else(|_| "redis://127.0.0.1:7000".into());
    let redis = RedisBackend::cluster_builder(nodes.split(',').map(str::trim))
        .prefix("example-rl")
        .build()
        .await?;
    let limit = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "per-key",
                KeyExtractor::header("x-api-key").or(KeyExtractor::peer_ip()),
                Quota::per_minute(10),
            )
            .global(redis)
            .algorithm(Algorithm::SlidingWindow),
        )
        .build()?;
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(limit);
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{} (cluster {nodes})",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
