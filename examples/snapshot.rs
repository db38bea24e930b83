//! Local limits that survive a restart: counters restored at start from
//! `SNAPSHOT` (default `rate-limits.snapshot`) and saved there on SIGTERM
//! or Ctrl-C, after the server has drained.
//!
//! ```sh
//! cargo run --example snapshot &
//! for i in $(seq 4); do curl -s -H 'x-api-key: a' localhost:3000/; done
//! kill %1; cargo run --example snapshot &   # key `a` still has 6 of 10 left
//! ```

use std::net::SocketAddr;

use axum::{Router, routing::get};
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

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
    let path = std::env::var("SNAPSHOT").unwrap_or_else(|_| "rate-limits.snapshot".into());
    let mut builder = RateLimitLayer::builder().rule(Rule::new(
        "per-key",
        KeyExtractor::header("x-api-key"),
        Quota::per_hour(10),
    ));
    // A missing file is a first start; a corrupt one is an error worth stopping for.
    match std::fs::File::open(&path) {
        Ok(file) => builder = builder.restore(std::io::BufReader::new(file))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let limit = builder.build()?;
    let app = Router::new()
        .route("/", get(|| async { "ok\n" }))
        .layer(limit.clone());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown())
    .await?;

    // Written beside, then renamed: a crash mid-write leaves the old file.
    let tmp = format!("{path}.tmp");
    limit.snapshot(std::io::BufWriter::new(std::fs::File::create(&tmp)?))?;
    std::fs::rename(&tmp, &path)?;
    println!("counters saved to {path}");
    Ok(())
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
