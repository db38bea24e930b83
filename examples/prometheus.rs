//! Prometheus metrics beside a limited route: `GET /` allows 5 requests per
//! 10 s per client IP, `GET /metrics` is the scrape endpoint (not limited).
//!
//! ```sh
//! cargo run --example prometheus
//! for i in $(seq 7); do curl -s -o /dev/null localhost:3000/; done; curl -s localhost:3000/metrics
//! ```
//!
//! With `REDIS_URL` set and the `redis` feature, `GET /` is a global rule
//! instead, which adds the Redis latency histogram and the breaker gauge.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, observe};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

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
    // Buckets make the latency a histogram (a summary otherwise).
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(observe::BACKEND_SECONDS.to_owned()),
            &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1],
        )?
        .install_recorder()?;
    #[allow(unused_mut)]
    let mut rule = Rule::new(
        "per-ip",
        KeyExtractor::peer_ip(),
        Quota::new(5, Duration::from_secs(10)),
    );
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("REDIS_URL") {
        let redis = keyed_rate_limit::RedisBackend::builder(url)
            .prefix("prometheus-example")
            .build()
            .await?;
        rule = rule.global(redis);
    }
    let limit = RateLimitLayer::builder().rule(rule).instances(1).build()?;
    println!("{}", limit.describe().metrics());

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }).route_layer(limit))
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        );
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://127.0.0.1:{port}; scrape /metrics");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
