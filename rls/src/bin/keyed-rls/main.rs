//! `keyed-rls`: Envoy's rate-limit service over keyed-rate-limit's rules
//! (`cargo install keyed-rls`, or `cargo run -p keyed-rls -- …` in this
//! workspace). `keyed-rls --help` lists the flags and the environment.
//!
//! Serves `envoy.service.ratelimit.v3.RateLimitService` and
//! `grpc.health.v1.Health` (`SERVING` once the rules are loaded). The
//! rules are envoyproxy/ratelimit's YAML files: the `--config` files, or,
//! without any, every `*.yaml` file of its runtime directory
//! (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`), read through
//! symlinks and reloaded when what they hold changes (`rules.rs`). SIGTERM
//! or Ctrl-C stops accepting calls and lets those in flight finish. HTTP
//! on `HOST:PORT` (default `0.0.0.0:8080`) answers `/healthcheck`, `/json`
//! and `/metrics` (Prometheus), and `DEBUG_HOST:DEBUG_PORT` `/rlconfig`.

mod env;
mod http;
mod rules;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use keyed_rate_limit::RedisBackend;
use keyed_rls::{RateLimitServer, RateLimitServiceServer, RlsConfig};

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
    let level = env::env("LOG_LEVEL").map_or_else(|| "info".into(), |l| l.to_ascii_lowercase());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()),
        )
        .init();
    let args = match env::args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("keyed-rls: {e}");
            std::process::exit(2)
        }
    };
    // Before any rule is built, so that every count reaches it.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let seen = rules::contents(&args.configs);
    let (config, loaded) = match rules::load(&args.configs, &seen, args.merge_domains) {
        Ok(c) => (c, true),
        Err(e) if args.force_start => {
            tracing::warn!(error = %e, "starting without rules (FORCE_START_WITHOUT_INITIAL_CONFIG)");
            (RlsConfig::default(), false)
        }
        Err(e) => return Err(e.into()),
    };
    let mut builder = RateLimitServer::builder(config).shadow(args.shadow);
    if let Some(r) = args.near_limit {
        builder = builder.near_limit_ratio(r);
    }
    if let Some(url) = &args.redis {
        let mut redis = RedisBackend::builder(url.clone());
        if let Some(p) = &args.prefix {
            redis = redis.prefix(p.clone());
        }
        let pem = |path: &std::path::Path, name: &str| {
            std::fs::read(path).map_err(|e| format!("{name}: {}: {e}", path.display()))
        };
        if let Some(roots) = &args.tls_roots {
            redis = redis.tls_root_cert(pem(roots, "REDIS_TLS_CACERT")?);
        }
        if let Some((cert, key)) = &args.tls_client {
            let cert = pem(cert, "REDIS_TLS_CLIENT_CERT")?;
            redis = redis.tls_client_cert(cert, pem(key, "REDIS_TLS_CLIENT_KEY")?);
        }
        builder = builder.redis(redis.build().await?);
    }
    let server = builder.build()?;

    // Healthy from the start, unless asked to wait for the first rules.
    let healthy = Arc::new(AtomicBool::new(loaded || !args.healthy_when_loaded));
    let (reporter, health) = tonic_health::server::health_reporter();
    if healthy.load(Ordering::Acquire) {
        reporter
            .set_serving::<RateLimitServiceServer<RateLimitServer>>()
            .await;
    } else {
        reporter
            .set_not_serving::<RateLimitServiceServer<RateLimitServer>>()
            .await;
    }
    let on_load = {
        let healthy = healthy.clone();
        move || {
            if !healthy.swap(true, Ordering::AcqRel) {
                let reporter = reporter.clone();
                tokio::spawn(async move {
                    reporter
                        .set_serving::<RateLimitServiceServer<RateLimitServer>>()
                        .await;
                });
            }
        }
    };
    rules::spawn(
        server.clone(),
        args.configs.clone(),
        args.merge_domains,
        &seen,
        on_load,
    );
    http::serve(
        args.http,
        args.prometheus.as_ref(),
        server.clone(),
        healthy,
        metrics,
    )
    .await?;
    http::serve_debug(args.debug, server.clone()).await?;
    tracing::info!(listen = %args.listen, http = %args.http, debug = %args.debug, "serving the rate-limit service");
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(server.into_service())
        .serve_with_shutdown(args.listen, stopped())
        .await?;
    Ok(())
}
