//! The command line and envoyproxy/ratelimit's environment: every
//! variable its settings read is honoured, taken with no effect (said at
//! start, with the reason), or refused with its name.

use std::net::SocketAddr;
use std::path::PathBuf;

pub(crate) const HELP: &str = "\
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
  RUNTIME_IGNOREDOTFILES          true: skip files whose name starts with .
  RUNTIME_WATCH_ROOT              either way, a swap of the root and a write
                                  in the directory are both followed
  FORCE_START_WITHOUT_INITIAL_CONFIG
                                  true: start with no rules file
  MERGE_DOMAIN_CONFIG             true: files of one domain are merged
  HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
                                  true: not healthy until a rules file loads
  SHADOW_MODE                     true: every limit in shadow mode
  NEAR_LIMIT_RATIO                default 0.8: a share of the limit used,
                                  past which an allow counts as near_limit
  REDIS_URL                       host:port, a socket path, or a redis:// URL
  REDIS_SOCKET_TYPE               tcp or unix (default tcp here)
  REDIS_AUTH                      a password, or user:password
  REDIS_TLS                       true for rediss://, trusting the system's
                                  roots unless REDIS_TLS_CACERT is set
  REDIS_TLS_CACERT                a PEM file of the roots to trust instead
  REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY
                                  PEM files: a client certificate (mutual TLS)
  REDIS_TYPE                      single only (sentinel, cluster: refused)
  CACHE_KEY_PREFIX                the Redis keys' prefix
  LOG_LEVEL                       as RUST_LOG's level, when RUST_LOG is unset
  HOST, PORT                      HTTP: /healthcheck, /json and /metrics
                                  (default 0.0.0.0 and 8080)
  DEBUG_HOST, DEBUG_PORT          HTTP: /rlconfig, the limits as they run
                                  (default 0.0.0.0 and 6070)
  USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH
                                  /metrics also there (default :9090, /metrics)

taken with no effect, said at start: the pool, pipeline, timeout and
startup settings of Redis, statsd's and tracing's when off, xDS's when
CONFIG_TYPE is FILE, EXPIRATION_JITTER_MAX_SECONDS,
LOCAL_CACHE_SIZE_IN_BYTES, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
GRPC_MAX_CONNECTION_AGE(_GRACE), LOG_FORMAT=text.

refused at start, with their name: BACKEND_TYPE other than redis,
CONFIG_TYPE other than FILE, MEMCACHE_*, USE_STATSD=true,
USE_DOG_STATSD=true, TRACING_ENABLED=true, GRPC_SERVER_USE_TLS=true,
GRPC_UDS, REDIS_PERSECOND=true, REDIS_TYPE other than single,
REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true,
LIMIT_RESPONSE_HEADERS_ENABLED=true (the draft RateLimit headers are
always sent), RESPONSE_DYNAMIC_METADATA=true, QUOTA_MODE=true,
PROMETHEUS_MAPPER_YAML, LOG_FORMAT=json.
";

pub(crate) struct Args {
    pub(crate) listen: SocketAddr,
    /// `/healthcheck`, `/json` and `/metrics`.
    pub(crate) http: SocketAddr,
    /// `/rlconfig`.
    pub(crate) debug: SocketAddr,
    /// `USE_PROMETHEUS`: the metrics at this address and path too.
    pub(crate) prometheus: Option<(SocketAddr, String)>,
    /// The files, or the directory whose `*.yaml` files are the rules.
    pub(crate) configs: Rules,
    pub(crate) redis: Option<String>,
    /// `REDIS_TLS_CACERT`: the PEM roots a `rediss://` URL trusts.
    pub(crate) tls_roots: Option<PathBuf>,
    /// `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`.
    pub(crate) tls_client: Option<(PathBuf, PathBuf)>,
    pub(crate) prefix: Option<String>,
    pub(crate) shadow: bool,
    pub(crate) near_limit: Option<f64>,
    pub(crate) merge_domains: bool,
    pub(crate) force_start: bool,
    pub(crate) healthy_when_loaded: bool,
}

#[derive(Clone)]
pub(crate) enum Rules {
    Files(Vec<PathBuf>),
    Dir { path: PathBuf, dotfiles: bool },
}

fn usage() -> ! {
    eprint!("{HELP}");
    std::process::exit(2)
}

/// An environment variable that is set and not empty.
pub(crate) fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn is_true(name: &str) -> bool {
    env(name).is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// A variable set to something this server does not do: refused.
enum Refused {
    /// Refused when true.
    True,
    /// Refused when set at all.
    Set,
    /// Refused unless it equals this (in any case).
    Not(&'static str),
}

const REFUSED: &[(&str, Refused, &str)] = &[
    (
        "BACKEND_TYPE",
        Refused::Not("redis"),
        "only redis is supported (no memcache)",
    ),
    (
        "CONFIG_TYPE",
        Refused::Not("file"),
        "only FILE is supported (no xDS)",
    ),
    (
        "MEMCACHE_HOST_PORT",
        Refused::Set,
        "memcache is not supported",
    ),
    ("MEMCACHE_SRV", Refused::Set, "memcache is not supported"),
    (
        "USE_STATSD",
        Refused::True,
        "statsd is not supported; the metrics are Prometheus's (/metrics)",
    ),
    (
        "USE_DOG_STATSD",
        Refused::True,
        "statsd is not supported; the metrics are Prometheus's (/metrics)",
    ),
    (
        "TRACING_ENABLED",
        Refused::True,
        "OpenTelemetry tracing is not supported; logs carry the decisions",
    ),
    (
        "GRPC_SERVER_USE_TLS",
        Refused::True,
        "terminate TLS in front of the service",
    ),
    (
        "GRPC_UDS",
        Refused::Set,
        "listen on GRPC_HOST:GRPC_PORT instead",
    ),
    (
        "REDIS_PERSECOND",
        Refused::True,
        "one Redis serves every limit",
    ),
    (
        "REDIS_TYPE",
        Refused::Not("single"),
        "only single is supported by this binary (the library has Sentinel and Cluster)",
    ),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        Refused::True,
        "Redis TLS always verifies the host name",
    ),
    (
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        Refused::True,
        "the draft RateLimit-Policy and RateLimit headers are always sent",
    ),
    (
        "RESPONSE_DYNAMIC_METADATA",
        Refused::True,
        "no dynamic metadata is sent",
    ),
    (
        "QUOTA_MODE",
        Refused::True,
        "set quota_mode on the descriptors instead",
    ),
    (
        "PROMETHEUS_MAPPER_YAML",
        Refused::Set,
        "the metric names are the crate's (rate_limit_decisions_total, ...)",
    ),
    ("LOG_FORMAT", Refused::Not("text"), "logs are text"),
];

/// Settings of envoyproxy/ratelimit's that tune what this server does
/// another way: accepted, and said at start.
const NO_EFFECT: &[(&str, &str)] = &[
    (
        "REDIS_POOL_SIZE",
        "one multiplexed connection; concurrent decisions share calls",
    ),
    (
        "REDIS_PIPELINE_WINDOW",
        "concurrent decisions share calls by themselves",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "concurrent decisions share calls by themselves",
    ),
    ("REDIS_CLUSTER_PIPELINE_PARALLELISM", "REDIS_TYPE is single"),
    (
        "REDIS_TIMEOUT",
        "each limit has the crate's timeout, then its failure_mode",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "a circuit breaker and a pinger watch Redis",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "there is no pool to wait on",
    ),
    (
        "REDIS_POOL_ON_EMPTY_WAIT_DURATION",
        "there is no pool to wait on",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Redis is reconnected in the background",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "Redis is reconnected in the background",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "Redis is reconnected in the background",
    ),
    ("REDIS_SENTINEL_AUTH", "REDIS_TYPE is single"),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "a window's key expires a second after its end",
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "denies are cached per limit, bounded by its max_keys",
    ),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "a refused hit is never counted",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE",
        "connections live until the client closes them",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections live until the client closes them",
    ),
    ("STATSD_HOST", "statsd is off"),
    ("STATSD_PORT", "statsd is off"),
    ("EXTRA_TAGS", "statsd is off"),
    ("STATS_FLUSH_INTERVAL", "Prometheus scrapes /metrics"),
    ("DISABLE_STATS", "/metrics is always served"),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "no response-time histogram is kept",
    ),
];

/// Refuses what this server does not do, naming the variable; says at
/// start which settings have no effect here.
fn refused() -> Result<(), String> {
    for (name, when, why) in REFUSED {
        let hit = match when {
            Refused::True => is_true(name),
            Refused::Set => env(name).is_some(),
            Refused::Not(ok) => env(name).is_some_and(|v| !v.eq_ignore_ascii_case(ok)),
        };
        if hit {
            return Err(format!("{name}: {why}"));
        }
    }
    for (name, why) in NO_EFFECT {
        if env(name).is_some() {
            tracing::info!(variable = name, "{name} has no effect here: {why}");
        }
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

fn addr(host: &str, port: &str, what: &str) -> Result<SocketAddr, String> {
    format!("{host}:{port}")
        .parse()
        .map_err(|_| format!("{what}: not an address: {host}:{port}"))
}

/// `HOST`-style and `PORT`-style variables, with their defaults.
fn env_addr(host: &str, port: &str, defaults: (&str, &str)) -> Result<SocketAddr, String> {
    let h = env(host).unwrap_or_else(|| defaults.0.into());
    let p = env(port).unwrap_or_else(|| defaults.1.into());
    addr(&h, &p, &format!("{host}:{port}"))
}

pub(crate) fn args() -> Result<Args, String> {
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
        None => env_addr("GRPC_HOST", "GRPC_PORT", ("0.0.0.0", "8081"))?,
    };
    let prometheus = if is_true("USE_PROMETHEUS") {
        let at = env("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        let (host, port) = at.rsplit_once(':').unwrap_or(("", &at));
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        let path = env("PROMETHEUS_PATH").unwrap_or_else(|| "/metrics".into());
        Some((addr(host, port, "PROMETHEUS_ADDR")?, path))
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
        Rules::Dir {
            path: dir,
            dotfiles: !is_true("RUNTIME_IGNOREDOTFILES"),
        }
    } else {
        Rules::Files(files)
    };
    let near_limit = env("NEAR_LIMIT_RATIO")
        .map(|r| share_left(&r))
        .transpose()?;
    Ok(Args {
        listen,
        http: env_addr("HOST", "PORT", ("0.0.0.0", "8080"))?,
        debug: env_addr("DEBUG_HOST", "DEBUG_PORT", ("0.0.0.0", "6070"))?,
        prometheus,
        configs,
        redis: redis.or_else(redis_from_env),
        tls_roots: env("REDIS_TLS_CACERT").map(PathBuf::from),
        tls_client: match (env("REDIS_TLS_CLIENT_CERT"), env("REDIS_TLS_CLIENT_KEY")) {
            (Some(cert), Some(key)) => Some((cert.into(), key.into())),
            (None, None) => None,
            _ => {
                return Err(
                    "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY: set both or neither".into(),
                );
            }
        },
        prefix: env("CACHE_KEY_PREFIX"),
        shadow: is_true("SHADOW_MODE") || is_true("GLOBAL_SHADOW_MODE"),
        near_limit,
        merge_domains: is_true("MERGE_DOMAIN_CONFIG"),
        force_start: is_true("FORCE_START_WITHOUT_INITIAL_CONFIG"),
        healthy_when_loaded: is_true("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"),
    })
}

/// `NEAR_LIMIT_RATIO`, the share of a limit used past which envoyproxy/ratelimit
/// counts a hit as near the limit, as the share left that
/// [`Rule::near_limit_ratio`](keyed_rate_limit::Rule::near_limit_ratio) takes.
fn share_left(used: &str) -> Result<f64, String> {
    used.parse::<f64>()
        .ok()
        .filter(|r| (0.0..1.0).contains(r))
        .map(|r| 1.0 - r)
        .ok_or_else(|| format!("NEAR_LIMIT_RATIO: not a ratio from 0 to below 1: {used}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn near_limit_ratio_is_the_share_used() {
        let left = |r| super::share_left(r).map(|l| (l * 100.0).round() / 100.0);
        assert_eq!(left("0.8"), Ok(0.2), "envoyproxy/ratelimit's default");
        assert_eq!(left("0.95"), Ok(0.05));
        assert_eq!(left("0"), Ok(1.0), "every allow is near the limit");
        for refused in ["1", "1.5", "-0.1", "x"] {
            assert!(super::share_left(refused).is_err(), "{refused}");
        }
    }
}
