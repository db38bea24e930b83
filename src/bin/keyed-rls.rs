//! `keyed-rls`: Envoy's rate-limit service over keyed-rate-limit's rules
//! (feature `rls-server`: `cargo install keyed-rate-limit --features
//! rls-server`, or `cargo run --features rls-server --bin keyed-rls -- …`).
//!
//! ```text
//! keyed-rls --listen 127.0.0.1:8081 --config edge.yaml [--config more.yaml] [--redis redis://127.0.0.1:6379]
//! ```
//!
//! Serves `envoy.service.ratelimit.v3.RateLimitService` and
//! `grpc.health.v1.Health` (`SERVING` once the rules are loaded). Each
//! `--config` is one domain's envoyproxy/ratelimit YAML; the files are read
//! again when they change (checked every second), and a file that does not
//! load leaves the running rules in place and is logged. `--redis` is the
//! backend of `scope: global` limits. SIGTERM or Ctrl-C stops accepting
//! calls and lets those in flight finish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::rls::{RateLimitServer, RlsConfig};

struct Args {
    listen: SocketAddr,
    configs: Vec<PathBuf>,
    redis: Option<String>,
}

fn usage() -> ! {
    eprintln!("usage: keyed-rls --listen ADDR --config FILE [--config FILE ...] [--redis URL]");
    std::process::exit(2)
}

fn args() -> Args {
    let mut listen = None;
    let mut configs = Vec::new();
    let mut redis = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--listen" => listen = Some(value().parse().unwrap_or_else(|_| usage())),
            "--config" => configs.push(PathBuf::from(value())),
            "--redis" => redis = Some(value()),
            _ => usage(),
        }
    }
    match listen {
        Some(listen) if !configs.is_empty() => Args {
            listen,
            configs,
            redis,
        },
        _ => usage(),
    }
}

fn load(paths: &[PathBuf]) -> Result<RlsConfig, keyed_rate_limit::config::ConfigError> {
    let mut config = RlsConfig::default();
    for p in paths {
        config = config.merge(RlsConfig::from_path(p)?)?;
    }
    Ok(config)
}

fn modified(paths: &[PathBuf]) -> Vec<Option<SystemTime>> {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

async fn stopped() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping: calls in flight finish");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = args();
    let config = load(&args.configs)?;
    let mut builder = RateLimitServer::builder(config);
    if let Some(url) = &args.redis {
        builder = builder.redis(RedisBackend::builder(url.clone()).build().await?);
    }
    let server = builder.build()?;

    let reloading = server.clone();
    let paths = args.configs.clone();
    tokio::spawn(async move {
        let mut seen = modified(&paths);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let now = modified(&paths);
            if now == seen {
                continue;
            }
            seen = now;
            match load(&paths).and_then(|c| reloading.reload(c)) {
                Ok(()) => tracing::info!("rules reloaded"),
                Err(e) => tracing::error!(error = %e, "rules not reloaded; the running ones stay"),
            }
        }
    });

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<keyed_rate_limit::rls::RateLimitServiceServer<RateLimitServer>>()
        .await;
    tracing::info!(listen = %args.listen, "serving the rate-limit service");
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(server.into_service())
        .serve_with_shutdown(args.listen, stopped())
        .await?;
    Ok(())
}
