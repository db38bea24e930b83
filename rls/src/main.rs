//! `keyed-rls`: Envoy's rate-limit service over keyed-rate-limit's rules
//! (`cargo install keyed-rls`, or `cargo run -p keyed-rls -- …` in this
//! workspace).
//! `keyed-rls --help` lists the flags and the environment.
//!
//! Serves `envoy.service.ratelimit.v3.RateLimitService` and
//! `grpc.health.v1.Health` (`SERVING` once the rules are loaded). The
//! rules are envoyproxy/ratelimit's YAML files: the `--config` files, or,
//! without any, every `*.yaml` file of its runtime directory
//! (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`), read through
//! symlinks. They are read again when what they hold changes (checked
//! every second: a write, or the symlink swap of the root by which a
//! ConfigMap updates), and a set that does not load leaves the running
//! rules in place and is logged. SIGTERM or Ctrl-C stops accepting calls
//! and lets those in flight finish. HTTP on `HOST:PORT` (default
//! `0.0.0.0:8080`) answers `/healthcheck` and `/metrics` (Prometheus).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use keyed_rate_limit::RedisBackend;
use keyed_rls::{RateLimitServer, RlsConfig};

const HELP: &str = "\
keyed-rls: Envoy's rate-limit service (RLS v3) over keyed-rate-limit's rules

usage: keyed-rls [--listen ADDR] [--config FILE ...] [--redis URL]

  --listen ADDR   the gRPC address (else GRPC_HOST:GRPC_PORT)
  --config FILE   a domain's YAML file, repeatable (else the runtime directory)
  --redis URL     where every limit counts, but `scope: local` ones (else
                  REDIS_URL; without either, each instance counts alone)
  -h, --help      this text

environment, as envoyproxy/ratelimit reads it:
  GRPC_HOST, GRPC_PORT            default 0.0.0.0 and 8081
  RUNTIME_ROOT                    default /srv/runtime_data/current
  RUNTIME_SUBDIRECTORY            default none
  RUNTIME_APPDIRECTORY            default config
  REDIS_URL                       host:port, a socket path, or a redis:// URL
  REDIS_SOCKET_TYPE               tcp or unix (default tcp here)
  REDIS_AUTH                      a password, or user:password
  REDIS_TLS                       true for rediss://
  REDIS_TYPE                      single only (sentinel, cluster: refused)
  LOG_LEVEL                       as RUST_LOG's level, when RUST_LOG is unset
  HOST, PORT                      HTTP for /healthcheck and /metrics
                                  (default 0.0.0.0 and 8080)
  USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH
                                  /metrics also there (default :9090, /metrics)

refused at start, with their name: BACKEND_TYPE other than redis,
CONFIG_TYPE other than FILE, USE_STATSD=true, USE_DOG_STATSD=true,
MERGE_DOMAIN_CONFIG=true, GLOBAL_SHADOW_MODE=true, GRPC_SERVER_USE_TLS=true,
GRPC_UDS, REDIS_PERSECOND=true.
";

struct Args {
    listen: SocketAddr,
    /// `/healthcheck` and `/metrics`.
    http: SocketAddr,
    /// `USE_PROMETHEUS`: the metrics at this address and path too.
    prometheus: Option<(SocketAddr, String)>,
    /// The files, or the directory whose `*.yaml` files are the rules.
    configs: Rules,
    redis: Option<String>,
}

#[derive(Clone)]
enum Rules {
    Files(Vec<PathBuf>),
    Dir(PathBuf),
}

fn usage() -> ! {
    eprint!("{HELP}");
    std::process::exit(2)
}

/// An environment variable that is set and not empty.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn is_true(name: &str) -> bool {
    env(name).is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// What this server does not do of envoyproxy/ratelimit's settings: each
/// set one is an error naming it, not a silent difference.
fn refused() -> Result<(), String> {
    let not = |name: &str, why: &str| Err(format!("{name}: {why}"));
    match env("BACKEND_TYPE") {
        Some(b) if !b.eq_ignore_ascii_case("redis") => {
            return not("BACKEND_TYPE", "only redis is supported (no memcache)");
        }
        _ => {}
    }
    match env("CONFIG_TYPE") {
        Some(c) if !c.eq_ignore_ascii_case("file") => {
            return not("CONFIG_TYPE", "only FILE is supported (no xDS)");
        }
        _ => {}
    }
    for (name, why) in [
        (
            "USE_STATSD",
            "statsd is not supported; the metrics are the crate's",
        ),
        (
            "USE_DOG_STATSD",
            "statsd is not supported; the metrics are the crate's",
        ),
        ("MERGE_DOMAIN_CONFIG", "a domain is defined by one file"),
        (
            "GLOBAL_SHADOW_MODE",
            "set shadow_mode on the descriptors instead",
        ),
        (
            "GRPC_SERVER_USE_TLS",
            "terminate TLS in front of the service",
        ),
        ("REDIS_PERSECOND", "one Redis backend serves every limit"),
    ] {
        if is_true(name) {
            return not(name, why);
        }
    }
    if env("GRPC_UDS").is_some() {
        return not("GRPC_UDS", "listen on GRPC_HOST:GRPC_PORT instead");
    }
    match env("REDIS_TYPE") {
        Some(t) if !t.eq_ignore_ascii_case("single") => {
            return not("REDIS_TYPE", "only single is supported by this binary");
        }
        _ => {}
    }
    Ok(())
}

/// `REDIS_URL` and its companions as a `redis://` URL.
fn redis_from_env() -> Option<String> {
    let url = env("REDIS_URL")?;
    if url.contains("://") {
        return Some(url);
    }
    let auth = env("REDIS_AUTH").map(|a| match a.split_once(':') {
        Some((user, pass)) => format!("{user}:{pass}@"),
        None => format!(":{a}@"),
    });
    let auth = auth.unwrap_or_default();
    if env("REDIS_SOCKET_TYPE").is_some_and(|t| t.eq_ignore_ascii_case("unix")) {
        return Some(format!("unix://{url}"));
    }
    let scheme = if is_true("REDIS_TLS") {
        "rediss"
    } else {
        "redis"
    };
    Some(format!("{scheme}://{auth}{url}"))
}

fn args() -> Result<Args, String> {
    let mut listen = None;
    let mut files = Vec::new();
    let mut redis = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0)
            }
            "--listen" => listen = Some(value().parse().unwrap_or_else(|_| usage())),
            "--config" => files.push(PathBuf::from(value())),
            "--redis" => redis = Some(value()),
            _ => usage(),
        }
    }
    refused()?;
    let listen = match listen {
        Some(l) => l,
        None => {
            let host = env("GRPC_HOST").unwrap_or_else(|| "0.0.0.0".into());
            let port = env("GRPC_PORT").unwrap_or_else(|| "8081".into());
            format!("{host}:{port}")
                .parse()
                .map_err(|_| format!("GRPC_HOST:GRPC_PORT: not an address: {host}:{port}"))?
        }
    };
    let addr = |host: String, port: String, what: &str| {
        format!("{host}:{port}")
            .parse::<SocketAddr>()
            .map_err(|_| format!("{what}: not an address: {host}:{port}"))
    };
    let http = addr(
        env("HOST").unwrap_or_else(|| "0.0.0.0".into()),
        env("PORT").unwrap_or_else(|| "8080".into()),
        "HOST:PORT",
    )?;
    let prometheus = if is_true("USE_PROMETHEUS") {
        let at = env("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        let (host, port) = at.rsplit_once(':').unwrap_or(("", &at));
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        let path = env("PROMETHEUS_PATH").unwrap_or_else(|| "/metrics".into());
        Some((addr(host.into(), port.into(), "PROMETHEUS_ADDR")?, path))
    } else {
        None
    };
    let configs = if files.is_empty() {
        let mut dir = PathBuf::from(
            env("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into()),
        );
        if let Some(sub) = env("RUNTIME_SUBDIRECTORY") {
            dir.push(sub);
        }
        dir.push(env("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
        Rules::Dir(dir)
    } else {
        Rules::Files(files)
    };
    Ok(Args {
        listen,
        http,
        prometheus,
        configs,
        redis: redis.or_else(redis_from_env),
    })
}

/// The rules' files now: the given ones, or the directory's `*.yaml`
/// (and `*.yml`) files, by name.
fn files(source: &Rules) -> Vec<PathBuf> {
    match source {
        Rules::Files(f) => f.clone(),
        Rules::Dir(dir) => {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                        .collect()
                })
                .unwrap_or_default();
            found.sort();
            found
        }
    }
}

/// What the files hold, read through their symlinks: a change to it is a
/// change of rules, however it came.
fn contents(source: &Rules) -> Vec<(PathBuf, Option<String>)> {
    files(source)
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).ok();
            (p, text)
        })
        .collect()
}

/// The rules in what `contents` read of `source`: what the reload loop
/// compares is what it loads, read once.
fn load(source: &Rules, read: &[(PathBuf, Option<String>)]) -> Result<RlsConfig, String> {
    if read.is_empty() {
        let dir = match source {
            Rules::Dir(d) => d.display().to_string(),
            Rules::Files(_) => String::new(),
        };
        return Err(format!("{dir}: no *.yaml rules file"));
    }
    let mut config = RlsConfig::default();
    for (path, text) in read {
        let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let text = text.as_deref().ok_or_else(|| at(&"cannot be read"))?;
        let file = RlsConfig::from_yaml_str(text).map_err(|e| at(&e))?;
        config = config.merge(file).map_err(|e| e.to_string())?;
    }
    Ok(config)
}

/// `/healthcheck` (`OK`, as envoyproxy/ratelimit answers it once its
/// rules are loaded, which they are before this listens) and the metrics
/// at `path`, in Prometheus's text format.
async fn serve_http(
    addr: SocketAddr,
    path: &str,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/healthcheck", get(|| async { "OK" }))
        .route(path, get(move || async move { metrics.render() }));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the HTTP endpoints stopped");
        }
    });
    Ok(())
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
    let level = env("LOG_LEVEL").map_or_else(|| "info".into(), |l| l.to_ascii_lowercase());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()),
        )
        .init();
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("keyed-rls: {e}");
            std::process::exit(2)
        }
    };
    // Before any rule is built, so that every count reaches it.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let mut seen = contents(&args.configs);
    let config = load(&args.configs, &seen)?;
    let mut builder = RateLimitServer::builder(config);
    if let Some(url) = &args.redis {
        builder = builder.redis(RedisBackend::builder(url.clone()).build().await?);
    }
    let server = builder.build()?;

    let reloading = server.clone();
    let source = args.configs.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let now = contents(&source);
            if now == seen {
                continue;
            }
            seen = now;
            let reloaded =
                load(&source, &seen).and_then(|c| reloading.reload(c).map_err(|e| e.to_string()));
            match reloaded {
                Ok(()) => tracing::info!("rule files reloaded"),
                Err(e) => tracing::error!(error = %e, "rules not reloaded; the running ones stay"),
            }
        }
    });

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<keyed_rls::RateLimitServiceServer<RateLimitServer>>()
        .await;
    serve_http(args.http, "/metrics", metrics.clone()).await?;
    if let Some((addr, path)) = &args.prometheus {
        serve_http(*addr, path, metrics).await?;
    }
    tracing::info!(listen = %args.listen, http = %args.http, "serving the rate-limit service");
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(server.into_service())
        .serve_with_shutdown(args.listen, stopped())
        .await?;
    Ok(())
}
