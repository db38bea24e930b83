//! Redis backend throughput against the same server's pipelined ceiling, and
//! the deny cache's Redis calls per request for one abusive key.
//!
//! `cargo bench -p keyed-rate-limit-bench --bench redis --features redis-cluster` starts a private `redis-server` on a free port
//! (never the shared 6379) and, in one process, measures:
//!
//! - the ceiling: one connection sending batches of `PIPELINE` `EVALSHA` of
//!   the GCRA script (and `redis-benchmark -P` against the same server, when
//!   it is installed), before and after the backend runs;
//! - `RedisBackend::check` decisions/s with 1, 16, 64 and 256 tokio tasks on a
//!   multi-thread runtime, each looping on its own keys for `REDIS_BENCH_SECS`;
//! - `Multiplexed` against `Pool { max_size: 64 }` at concurrency 64;
//! - one key sent 100× its quota through the layer: `cmdstat_evalsha` calls
//!   per request;
//! - admitted / quota under a burst with the shipped defaults: four axum
//!   servers (four backends, 20 ms timeout, breaker, `LocalFallback`,
//!   `instances(4)`) on one busy 2-worker runtime, 400 concurrent HTTP
//!   requests for one key, quota 50 per 60 s, `BURSTS` bursts per algorithm
//!   (fresh key each), while `BUSY_TASKS` (default 4) other tasks keep that
//!   runtime busy, each running 2 ms of CPU between yields.
//!
//! - the fleet: four gateways with exact, coalesced and leased global rules
//!   beside the local rule, on this server and on a 3-master cluster; see
//!   `bench/src/fleet.rs` (`FLEET_ONLY=1` runs only that section,
//!   `FLEET_SECS` per run (default 2), `FLEET_ROUNDS` (default 3),
//!   `FLEET_CLUSTER=0` skips the cluster rows).
//!
//! - Redis CPU per decision, the way a fleet pays for it (`CPU_ONLY=1` runs
//!   only that section): the servers' `used_cpu_sys + used_cpu_user` over a
//!   run of four gateways, per decision, for envoyproxy/ratelimit's
//!   `INCRBY` + `PEXPIRE` pipeline (the baseline), this crate's exact rules
//!   (coalesced, each algorithm) and GCRA leases (per grant too), with
//!   10,000 keys or a hot key, at concurrency 1 and 64, on this server and
//!   the cluster; ratios to the same round's baseline. See
//!   `bench/src/cpu.rs` (`CPU_SECS` per row at most (default 2), 80,000
//!   decisions per gateway at most, `CPU_ROUNDS` (default 3),
//!   `CPU_CLUSTER=0` skips the cluster rows).
//!
//! Environment: `REDIS_BENCH_SECS` (default 2) per run, `REDIS_BENCH_ROUNDS`
//! (default 2, alternating order, medians reported), `DENY_SECS` (default 3),
//! `BURSTS` (default 5; `BURST_ONLY=1` runs only that section), `BUSY_TASKS` (default 4).
//! Machines are shared and noisy: read the ratios, not the absolute numbers.

use keyed_rate_limit_bench::ceiling::{GCRA, PIPELINE, ceiling, redis_benchmark};
use keyed_rate_limit_bench::fleet;
use keyed_rate_limit_bench::gateway;
use keyed_rate_limit_testing as redis_cluster;
use keyed_rate_limit_testing as redis_server;
use keyed_rate_limit_testing::rounds;
use rounds::median;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway::gateway;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use keyed_rate_limit::failure::BreakerState;
use keyed_rate_limit::{Algorithm, Key, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit::{RedisBackend, backend::redis::ConnectionMode};
use redis_server::RedisServer;
use tower::{Service, ServiceExt, service_fn};

/// Keys each task cycles through.
const KEYS_PER_TASK: usize = 1024;

fn secs(var: &str, default: u64) -> Duration {
    let s = std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(default as f64);
    Duration::from_secs_f64(s)
}

/// A quota no run reaches, so every decision is an allow that writes.
fn huge() -> Quota {
    Quota::new(1_000_000_000, Duration::from_secs(1))
}

/// A quota no run reaches whose state still moves with each decision: at
/// `huge()`'s rate a GCRA arrival time advances 0.001 us, less than a
/// double resolves at today's clock (0.25 us), so GCRA would write nothing.
fn unreached() -> Quota {
    Quota::new(1_000_000, Duration::from_secs(1))
}

/// Decisions/s of `tasks` tokio tasks looping `check` on their own keys.
async fn backend_run(backend: &RedisBackend, tasks: usize, dur: Duration, tag: &str) -> f64 {
    let total = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let backend = backend.clone();
            let total = total.clone();
            let keys: Vec<Key> = (0..KEYS_PER_TASK)
                .map(|i| Key::from(format!("{tag}-t{t}-k{i}")))
                .collect();
            tokio::spawn(async move {
                let q = huge();
                let mut n = 0usize;
                while Instant::now() < deadline {
                    let d = backend
                        .check("bench", &keys[n % KEYS_PER_TASK], Algorithm::Gcra, &q, 1)
                        .await
                        .expect("redis check");
                    assert!(d.is_allowed());
                    n += 1;
                }
                total.fetch_add(n as u64, Ordering::Relaxed);
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

struct DenyRun {
    requests: u64,
    allowed: u64,
    calls: u64,
}

/// `senders` tasks together offer 100× a 10/s quota to one key through the layer.
async fn deny_run(server: &RedisServer, senders: u64, dur: Duration, key: &'static str) -> DenyRun {
    let backend = RedisBackend::builder(server.url())
        .prefix("deny")
        .build()
        .await
        .unwrap();
    let quota = Quota::per_second(10);
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("abuse", KeyExtractor::header("x-api-key"), quota)
                .global(backend)
                .redis_timeout(Duration::from_millis(500)),
        )
        .build()
        .unwrap();
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    });
    let svc = layer.layer(inner);
    // Load the script outside the measured window.
    let mut warm = svc.clone();
    let mut req = Request::new(Full::<Bytes>::default());
    req.headers_mut()
        .insert("x-api-key", HeaderValue::from_static("warm-up"));
    warm.ready().await.unwrap().call(req).await.unwrap();

    let offered_per_sec = 100 * u64::from(quota.limit());
    let period = Duration::from_secs_f64(senders as f64 / offered_per_sec as f64);
    let before = server.script_calls();
    let allowed = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + dur;
    let handles: Vec<_> = (0..senders)
        .map(|_| {
            let mut svc = svc.clone();
            let allowed = allowed.clone();
            let requests = requests.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                while Instant::now() < deadline {
                    tick.tick().await;
                    let mut req = Request::new(Full::<Bytes>::default());
                    req.headers_mut()
                        .insert("x-api-key", HeaderValue::from_static(key));
                    let res = svc.ready().await.unwrap().call(req).await.unwrap();
                    requests.fetch_add(1, Ordering::Relaxed);
                    if res.status() == StatusCode::OK {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    assert!(
        layer
            .breakers()
            .iter()
            .all(|b| b.state == BreakerState::Closed),
        "redis must have answered every call: {:?}",
        layer.breakers()
    );
    DenyRun {
        requests: requests.load(Ordering::Relaxed),
        allowed: allowed.load(Ordering::Relaxed),
        calls: server.script_calls() - before,
    }
}

const BURST: usize = 400;
const BURST_QUOTA: u32 = 50;

/// Admitted of `BURST` concurrent requests for one key per burst, over HTTP,
/// spread over four axum servers whose layers use the defaults. The servers
/// run on `rt`, which also reads their Redis replies (each backend connects
/// from it); the client runs on the caller's runtime.
fn burst_run(rt: &tokio::runtime::Runtime, url: &str, algo: Algorithm, bursts: usize) -> Vec<u32> {
    let gateways: Vec<String> = (0..4)
        .map(|_| {
            let (url, prefix) = (url.to_owned(), format!("burst-{algo}"));
            let quota = Quota::per_minute(BURST_QUOTA);
            rt.block_on(gateway(url, prefix, algo, quota, 4, rt.handle()))
        })
        .collect();
    // Other work of a busy process on the same runtime: tasks that each run
    // `BUSY_SLICE` of CPU between yields, while the bursts last.
    let busy = Arc::new(std::sync::atomic::AtomicBool::new(true));
    for _ in 0..busy_tasks() {
        let busy = busy.clone();
        rt.spawn(async move {
            while busy.load(Ordering::Relaxed) {
                let t = Instant::now();
                while t.elapsed() < BUSY_SLICE {
                    std::hint::spin_loop();
                }
                tokio::task::yield_now().await;
            }
        });
    }
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    client_rt.block_on(async move {
        let client = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(BURST)
            .build()
            .unwrap();
        let mut admitted = Vec::new();
        for b in 0..bursts {
            let key = format!("burst-key-{b}");
            let calls: Vec<_> = (0..BURST)
                .map(|i| {
                    let req = client
                        .get(&gateways[i % gateways.len()])
                        .header("x-api-key", &key)
                        .send();
                    tokio::spawn(
                        async move { req.await.unwrap().status() == reqwest::StatusCode::OK },
                    )
                })
                .collect();
            let mut n = 0;
            for c in calls {
                n += u32::from(c.await.unwrap());
            }
            admitted.push(n);
        }
        busy.store(false, Ordering::Relaxed);
        admitted
    })
}

const BUSY_SLICE: Duration = Duration::from_millis(2);

fn busy_tasks() -> usize {
    std::env::var("BUSY_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

fn burst_section(url: &str) {
    let bursts = std::env::var("BURSTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5usize);
    let shared = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "\nburst with the defaults: 4 axum servers on one 2-worker runtime kept busy by {} tasks, \
         {BURST} concurrent requests, quota {BURST_QUOTA}/60 s, {bursts} bursts each (admitted / quota)",
        busy_tasks()
    );
    for algo in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
    ] {
        let admitted = burst_run(&shared, url, algo, bursts);
        let worst = admitted.iter().max().copied().unwrap_or(0);
        println!(
            "  {:<15} admitted {admitted:?}, worst {:.2} of the quota",
            algo.as_str(),
            f64::from(worst) / f64::from(BURST_QUOTA)
        );
    }
    shared.shutdown_background();
}

#[derive(Debug, Clone, Copy)]
enum Run {
    Ceiling,
    Mux(usize),
    Pool(usize),
}

impl Run {
    fn label(&self) -> String {
        match self {
            Run::Ceiling => format!("ceiling (1 conn, pipelines of {PIPELINE} EVALSHA)"),
            Run::Mux(c) => format!("multiplexed, concurrency {c}"),
            Run::Pool(c) => format!("pool(max {c}), concurrency {c}"),
        }
    }
}

/// One fleet case: a mode, a key set, a concurrency, on a target.
#[derive(Clone, Copy)]
struct FleetCase {
    mode: fleet::Mode,
    keys: fleet::Keys,
    tasks: usize,
    cluster: bool,
    /// Every task on the first gateway.
    one: bool,
}

impl FleetCase {
    fn label(&self) -> String {
        let keys = match self.keys {
            fleet::Keys::Hot => "hot key".to_owned(),
            fleet::Keys::Many(n) => format!("{n} keys"),
        };
        let on = if self.cluster { "cluster" } else { "redis" };
        let spread = if self.one { "1 gw" } else { "4 gw" };
        format!(
            "{:<9} {keys:<11} c{:<3} {spread} {on}",
            self.mode.label(),
            self.tasks
        )
    }
}

/// The fleet section: cost (req/s, latency, script calls per request) and
/// accuracy (over- and under-admission); see `bench/src/fleet.rs`.
fn fleet_section(server: &RedisServer) {
    use fleet::{Keys, Mode, Target};
    let dur = secs("FLEET_SECS", 2);
    let rounds = std::env::var("FLEET_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3usize)
        .max(1);
    let with_cluster = std::env::var("FLEET_CLUSTER").as_deref() != Ok("0");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let cluster = with_cluster.then(redis_cluster::RedisCluster::start);
    rt.block_on(async {
        let single = Target::Server(server.url());
        let mut cases = Vec::new();
        for keys in [Keys::Hot, Keys::Many(10_000)] {
            for tasks in [1, 64] {
                for mode in [Mode::Local, Mode::Exact, Mode::Coalesced, Mode::Leased] {
                    cases.push(FleetCase { mode, keys, tasks, cluster: false, one: false });
                }
            }
        }
        // The coalescing case: concurrency 64 on one gateway.
        for mode in [Mode::Exact, Mode::Coalesced] {
            cases.push(FleetCase { mode, keys: Keys::Hot, tasks: 64, cluster: false, one: true });
        }
        if cluster.is_some() {
            for keys in [Keys::Hot, Keys::Many(10_000)] {
                for mode in [Mode::Exact, Mode::Coalesced, Mode::Leased] {
                    cases.push(FleetCase { mode, keys, tasks: 64, cluster: true, one: false });
                }
            }
        }
        let cluster_target = cluster.as_ref().map(|c| Target::Cluster(c.urls()));
        let servers = |case: &FleetCase| -> Vec<&RedisServer> {
            match (case.cluster, &cluster) {
                (true, Some(c)) => c.nodes.iter().collect(),
                _ => vec![server],
            }
        };
        let mut layers = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            let target = if case.cluster { cluster_target.as_ref().unwrap() } else { &single };
            let g = fleet::gateways(target, &format!("fleet{i}"), case.mode, huge()).await;
            // Warm: connections, scripts, the first leases.
            let pick = move |t: usize| if case.one { 0 } else { t };
            fleet::run(&g, case.keys, case.tasks, Duration::from_millis(200), pick, false).await;
            layers.push(g);
        }
        println!(
            "\nfleet: {} gateways, {dur:?} per run, {rounds} rounds in alternating order",
            fleet::GATEWAYS
        );
        let mut results: Vec<Vec<(f64, f64, f64, f64)>> = vec![Vec::new(); cases.len()];
        for round in 0..rounds {
            for i in rounds::order(round, cases.len()) {
                let case = cases[i];
                let before = fleet::script_calls(&servers(&case));
                let pick = move |t: usize| if case.one { 0 } else { t };
                let o = fleet::run(&layers[i], case.keys, case.tasks, dur, pick, false).await;
                let calls = fleet::script_calls(&servers(&case)) - before;
                let per = calls as f64 / o.requests.max(1) as f64;
                println!(
                    "round {round} {}: {:>8.0} req/s  p50 {:>6.0} us  p99 {:>6.0} us  {:.4} calls/request",
                    case.label(),
                    o.rps,
                    o.p50_us,
                    o.p99_us,
                    per
                );
                results[i].push((o.rps, o.p50_us, o.p99_us, per));
            }
        }
        // Paired: each run against the same round's local run of its key set
        // and concurrency (on the cluster or one gateway, the exact run).
        let partner = |i: usize| {
            let c = cases[i];
            let want = if c.cluster || c.one { Mode::Exact } else { Mode::Local };
            cases.iter().position(|o| {
                o.mode == want
                    && o.keys == c.keys
                    && o.tasks == c.tasks
                    && o.cluster == c.cluster
                    && o.one == c.one
            })
        };
        println!("\nfleet medians ({rounds} rounds); paired ratio to local (cluster, one gateway: to exact):");
        println!(
            "{:<38} {:>9} {:>7} {:>8} {:>8} {:>12}",
            "case", "req/s", "paired", "p50 us", "p99 us", "calls/req"
        );
        for (i, case) in cases.iter().enumerate() {
            let col = |f: fn(&(f64, f64, f64, f64)) -> f64| median(results[i].iter().map(f).collect());
            let paired = partner(i).map_or(f64::NAN, |p| {
                median(results[i].iter().zip(&results[p]).map(|(a, b)| a.0 / b.0).collect())
            });
            println!(
                "{:<38} {:>9.0} {:>7.2} {:>8.0} {:>8.0} {:>12.4}",
                case.label(),
                col(|r| r.0),
                paired,
                col(|r| r.1),
                col(|r| r.2),
                col(|r| r.3)
            );
        }

        // Accuracy: a hot key far over its quota.
        let q = Quota::per_second(2000).with_burst(400);
        let acc_dur = secs("FLEET_ACCURACY_SECS", 3);
        println!(
            "\nfleet accuracy: hot key, quota {q}, 64 tasks for {acc_dur:?}, lease ttl {:?}",
            fleet::LEASE_TTL
        );
        println!(
            "{:<10} {:<7} {:>9} {:>9} {:>9} {:>10} {:>11}",
            "mode", "spread", "offered", "exact", "admitted", "adm/exact", "over units"
        );
        for (s, spread) in ["even", "90% one"].into_iter().enumerate() {
            for mode in [Mode::Exact, Mode::Coalesced, Mode::Leased] {
                let g = fleet::gateways(&single, &format!("acc{s}-{}", mode.label()), mode, q).await;
                // 90 % of the tasks on gateway 0, the rest spread.
                let pick = move |t: usize| if s == 0 { t } else if t % 10 != 9 { 0 } else { 1 + t % 3 };
                let o = fleet::run(&g, Keys::Hot, 64, acc_dur, pick, true).await;
                let (exact, _) = fleet::gcra(q, &o.arrivals);
                let (_, over) = fleet::gcra(q, &o.admitted);
                println!(
                    "{:<10} {spread:<7} {:>9} {:>9} {:>9} {:>10.3} {:>11.2}",
                    mode.label(),
                    o.arrivals.len(),
                    exact,
                    o.admitted.len(),
                    o.admitted.len() as f64 / exact.max(1) as f64,
                    over
                );
            }
        }
    });
}

fn main() {
    // The harness ignores its arguments (`cargo bench` passes `--bench`).
    let dur = secs("REDIS_BENCH_SECS", 2);
    let deny_dur = secs("DENY_SECS", 3);
    let rounds = std::env::var("REDIS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2usize)
        .max(1);
    let server = RedisServer::start();
    let url = server.url();
    if std::env::var_os("CPU_ONLY").is_some() {
        keyed_rate_limit_bench::cpu::section(&server, unreached());
        return;
    }
    if std::env::var_os("FLEET_ONLY").is_some() {
        fleet_section(&server);
        return;
    }
    burst_section(&url);
    if std::env::var_os("BURST_ONLY").is_some() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mux = RedisBackend::builder(&url)
            .prefix("bench")
            .connection(ConnectionMode::Multiplexed)
            .build()
            .await
            .unwrap();
        let pool = RedisBackend::builder(&url)
            .prefix("bench")
            .connection(ConnectionMode::Pool { max_size: 64 })
            .build()
            .await
            .unwrap();
        // Warm both (script load, pool connections).
        backend_run(&mux, 64, Duration::from_millis(300), "warm").await;
        backend_run(&pool, 64, Duration::from_millis(300), "warm").await;

        println!(
            "redis-server {} (private), {dur:?} per run, {rounds} rounds in alternating order",
            server.port()
        );
        // Each round measures everything once; odd rounds run in reverse
        // order, and the medians across rounds are reported.
        let runs: Vec<Run> = vec![
            Run::Ceiling,
            Run::Mux(1),
            Run::Mux(16),
            Run::Mux(64),
            Run::Pool(64),
            Run::Mux(256),
        ];
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
        for round in 0..rounds {
            for i in rounds::order(round, runs.len()) {
                let tag = format!("r{round}-{i}");
                let r = match runs[i] {
                    Run::Ceiling => ceiling(&url, dur, huge(), KEYS_PER_TASK * 4).await,
                    Run::Mux(c) => backend_run(&mux, c, dur, &tag).await,
                    Run::Pool(c) => backend_run(&pool, c, dur, &tag).await,
                };
                println!("round {round} {:<44} {r:>9.0} decisions/s", runs[i].label());
                results[i].push(r);
            }
        }
        let med: Vec<f64> = results.into_iter().map(median).collect();
        let ceiling = med[0];
        let sha: String = {
            let mut c = server.connection().unwrap();
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(GCRA)
                .query(&mut c)
                .unwrap()
        };
        let rb = redis_benchmark(server.port(), &sha);

        println!("\nmedians, and ratios to the pipelined ceiling ({ceiling:.0}/s):");
        for (run, r) in runs.iter().zip(&med).skip(1) {
            let c = match run {
                Run::Mux(c) | Run::Pool(c) => *c,
                Run::Ceiling => unreachable!(),
            };
            println!(
                "  {:<44} {r:>9.0}/s = {:.3} of ceiling, mean latency {:.0} us (Little)",
                run.label(),
                r / ceiling,
                c as f64 / r * 1e6
            );
        }
        println!("  pool / multiplexed at 64 = {:.2}", med[4] / med[3]);
        match rb {
            Some(rb) => println!(
                "  redis-benchmark -P {PIPELINE} -c 4 EVALSHA: {rb:.0}/s; our ceiling / it = {:.2}",
                ceiling / rb
            ),
            None => println!("  redis-benchmark: not installed or unparsable"),
        }

        println!(
            "\ndeny cache: one key offered 100x its quota (10/s) for {deny_dur:?} through the layer"
        );
        for (senders, key) in [(1u64, "abuser-serial"), (8, "abuser-8-tasks")] {
            let r = deny_run(&server, senders, deny_dur, key).await;
            let denied = r.requests - r.allowed;
            println!(
                "  {senders} sender(s): {} requests, {} allowed, {} EVALSHA = {:.2}% calls/request \
                 (floor: allowed/requests = {:.2}%), deny-path calls per deny = {:.2}%",
                r.requests,
                r.allowed,
                r.calls,
                100.0 * r.calls as f64 / r.requests as f64,
                100.0 * r.allowed as f64 / r.requests as f64,
                100.0 * r.calls.saturating_sub(r.allowed) as f64 / denied.max(1) as f64,
            );
        }
    });
}
