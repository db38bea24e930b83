//! The quickstart: `GET /` limited to 5 requests per 10 s (burst 5) per
//! `x-api-key`, or per client IP when the header is missing.
//!
//! ```sh
//! cargo run --example quickstart            # 127.0.0.1:3000, or PORT=8080
//! for i in $(seq 6); do curl -si localhost:3000/ | head -1; done
//! ```
//! The 6th request gets `429 Too Many Requests` with `Retry-After: 2`.
//! At start it prints its limits as a Markdown table (`RateLimitLayer::describe`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Extension, Router, routing::get};
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, decision::RateLimitDecision};

async fn hello(Extension(decision): Extension<RateLimitDecision>) -> String {
    let left = decision
        .most_restrictive()
        .map_or(0, |r| r.decision.remaining());
    format!("hello! {left} requests left in this window\n")
}

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

    let limit = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "per-key",
                KeyExtractor::header("x-api-key"),
                Quota::new(5, Duration::from_secs(10)).with_burst(5),
            )
            .on_missing_key(OnMissingKey::Fallback(KeyExtractor::peer_ip())),
        )
        // `hello` reads the decision; the extension is opt-in.
        .decision_extension(true)
        .build()?;
    // The limits, as the layer enforces them.
    println!("{}", limit.describe().markdown());

    let app = Router::new().route("/", get(hello)).layer(limit);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!(
        "try: for i in $(seq 6); do curl -si http://{addr}/ | grep -iE '^(HTTP|retry-after|ratelimit)'; done"
    );
    // ConnectInfo gives the peer IP the fallback key needs.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
