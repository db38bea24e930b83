//! What a decision costs the shared Redis, in its CPU, the way a fleet pays
//! for it (`benches/redis.rs`, section `cpu`, `CPU_ONLY=1`).
//!
//! Four gateways (`fleet::GATEWAYS`) decide requests of a quota no run
//! reaches, so every decision is an allow that writes. The Redis CPU of a
//! run is `used_cpu_sys + used_cpu_user` (`INFO cpu`) read before and
//! after it, summed over the cluster's nodes; it is divided by the
//! decisions, and by the script calls.
//!
//! - **baseline**: what envoyproxy/ratelimit sends per decision, a pipeline
//!   `INCRBY key 1` + `PEXPIRE key 1000` (a fixed window, no script) on a
//!   key named after the window's second, as envoy names it, over one
//!   multiplexed connection per gateway;
//! - **exact**: this crate's default for an exact global rule
//!   (`Mode::Coalesced`), for each algorithm;
//! - **leased**: GCRA leases (`Mode::Leased`), whose script calls are grants.
//!
//! Each row starts on flushed servers with a fresh key prefix and new
//! connections, warms them (connections, SCRIPT LOAD), then runs until
//! `CPU_SECS` or `CAP` decisions per gateway. Rounds alternate the rows'
//! order; each ratio is to the same round's baseline, then the median.
//! Also printed: the cores Redis and this process kept busy, to tell a
//! rate Redis holds down from one the client does. On loopback the
//! kernel's delivery of a reply to the client can be charged to the
//! sender, so Redis's system time may include some of what the client's
//! host would pay over a network.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keyed_rate_limit::{Algorithm, Quota, RateLimitLayer};
use keyed_rate_limit_testing::rounds::{median, order};
use keyed_rate_limit_testing::{RedisCluster, RedisServer};

use crate::fleet::{self, Keys, Mode, Outcome, Target};

/// Decisions per gateway after which a run stops, whatever its time left:
/// a leased run is far faster than the rest.
const CAP: u64 = 80_000;
/// Warm-up (connections, SCRIPT LOAD), outside the measured window.
const WARM: Duration = Duration::from_millis(300);
const WARM_CAP: u64 = 1_000;

fn env<T: FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Baseline,
    Exact(Algorithm),
    Leased,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    scheme: Scheme,
    keys: Keys,
    tasks: usize,
    cluster: bool,
}

impl Row {
    fn cells(&self) -> [String; 5] {
        let (scheme, algorithm) = match self.scheme {
            Scheme::Baseline => ("baseline", "INCRBY+PEXPIRE"),
            Scheme::Exact(a) => ("exact", a.as_str()),
            Scheme::Leased => ("leased", Algorithm::Gcra.as_str()),
        };
        let keys = match self.keys {
            Keys::Hot => "hot key".to_owned(),
            Keys::Many(n) => format!("{n} keys"),
        };
        let target = if self.cluster { "cluster" } else { "1 server" };
        [
            scheme.into(),
            algorithm.into(),
            keys,
            self.tasks.to_string(),
            target.into(),
        ]
    }

    fn label(&self) -> String {
        let [s, a, k, c, t] = self.cells();
        format!("{s:<8} {a:<14} {k:<10} c{c:<3} {t}")
    }

    /// The row this one's ratio is taken to.
    fn baseline(&self) -> Row {
        Row {
            scheme: Scheme::Baseline,
            ..*self
        }
    }
}

/// The rows of one round: every scheme at concurrency 1 and 64, on one
/// server and on the cluster; leases at 64 on one server.
fn rows(with_cluster: bool) -> Vec<Row> {
    use Algorithm::*;
    let schemes = [
        Scheme::Baseline,
        Scheme::Exact(Gcra),
        Scheme::Exact(TokenBucket),
        Scheme::Exact(FixedWindow),
        Scheme::Exact(SlidingWindow),
    ];
    let targets: &[bool] = if with_cluster {
        &[false, true]
    } else {
        &[false]
    };
    let mut rows = Vec::new();
    for &cluster in targets {
        for keys in [Keys::Many(10_000), Keys::Hot] {
            for tasks in [1, 64] {
                for scheme in schemes {
                    rows.push(Row {
                        scheme,
                        keys,
                        tasks,
                        cluster,
                    });
                }
            }
            if !cluster {
                let scheme = Scheme::Leased;
                rows.push(Row {
                    scheme,
                    keys,
                    tasks: 64,
                    cluster,
                });
            }
        }
    }
    rows
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    decisions: u64,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us: f64,
    calls: u64,
    /// This process's CPU over the run: the gateways', the client's.
    client_cpu_us: f64,
}

impl Sample {
    fn per_decision(&self) -> f64 {
        self.cpu_us / self.decisions.max(1) as f64
    }
    fn calls_per_decision(&self) -> f64 {
        self.calls as f64 / self.decisions.max(1) as f64
    }
    /// Cores busy on average over the run: the wall time is decisions / rate.
    fn cores(&self, cpu_us: f64) -> f64 {
        cpu_us / 1e6 * self.rps / self.decisions.max(1) as f64
    }
    fn per_call(&self) -> f64 {
        if self.calls == 0 {
            f64::NAN
        } else {
            self.cpu_us / self.calls as f64
        }
    }
}

/// The baseline's connection of one gateway.
#[derive(Clone)]
enum Conn {
    One(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    async fn open(target: &Target) -> Conn {
        match target {
            Target::Server(url) => Conn::One(
                redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect"),
            ),
            Target::Cluster(urls) => Conn::Cluster(
                redis::cluster::ClusterClient::new(urls.clone())
                    .unwrap()
                    .get_async_connection()
                    .await
                    .expect("connect"),
            ),
        }
    }

    /// envoy's decision: the window's count after this hit.
    async fn hit(&mut self, key: &str) -> u64 {
        let mut pipe = redis::pipe();
        pipe.cmd("INCRBY").arg(key).arg(1);
        pipe.cmd("PEXPIRE").arg(key).arg(1000).ignore();
        let reply: redis::RedisResult<(u64,)> = match self {
            Conn::One(c) => pipe.query_async(c).await,
            Conn::Cluster(c) => pipe.query_async(c).await,
        };
        reply.expect("INCRBY + PEXPIRE").0
    }
}

/// `tasks` loops over `conns` (task `i` on `i % GATEWAYS`), each stopping
/// at `dur` or once its connection has made `cap` decisions.
async fn baseline_run(
    conns: &[Conn],
    prefix: &str,
    keys: Keys,
    tasks: usize,
    dur: Duration,
    cap: u64,
    limit: u32,
) -> Outcome {
    let counts: Arc<Vec<AtomicU64>> = Arc::new(conns.iter().map(|_| AtomicU64::new(0)).collect());
    let start = Instant::now();
    let deadline = start + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (g, counts) = (i % conns.len(), counts.clone());
            let (mut conn, prefix) = (conns[g].clone(), prefix.to_owned());
            tokio::spawn(async move {
                let mut next_key = keys.stream(i);
                let mut lat = Vec::new();
                while Instant::now() < deadline && counts[g].fetch_add(1, Ordering::Relaxed) < cap {
                    // envoy's key: the descriptor and the start of its window.
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                    let key = format!("{prefix}_{}_{}", next_key(), now.as_secs());
                    let t = Instant::now();
                    let count = conn.hit(&key).await;
                    assert!(
                        count <= u64::from(limit),
                        "an allow, as the crate's rows are"
                    );
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.await.unwrap());
    }
    Outcome::from_latencies(lat, start.elapsed())
}

enum Runner {
    Baseline(Vec<Conn>),
    Layers(Vec<RateLimitLayer>),
}

impl Runner {
    async fn new(row: &Row, target: &Target, prefix: &str, quota: Quota) -> Runner {
        match row.scheme {
            Scheme::Baseline => {
                let mut conns = Vec::new();
                for _ in 0..fleet::GATEWAYS {
                    conns.push(Conn::open(target).await);
                }
                Runner::Baseline(conns)
            }
            Scheme::Exact(a) => Runner::Layers(
                fleet::gateways_with(target, prefix, Mode::Coalesced, quota, a).await,
            ),
            Scheme::Leased => {
                Runner::Layers(fleet::gateways(target, prefix, Mode::Leased, quota).await)
            }
        }
    }

    async fn run(&self, row: &Row, prefix: &str, quota: Quota, dur: Duration, cap: u64) -> Outcome {
        match self {
            Runner::Baseline(conns) => {
                baseline_run(conns, prefix, row.keys, row.tasks, dur, cap, quota.limit()).await
            }
            Runner::Layers(layers) => {
                fleet::run_capped(layers, row.keys, row.tasks, dur, Some(cap), |t| t, false).await
            }
        }
    }
}

fn cpu_seconds(servers: &[&RedisServer]) -> f64 {
    servers.iter().map(|s| s.cpu_seconds()).sum()
}

/// This process's user + system CPU (`/proc/self/stat`, in ticks of
/// 10 ms): whether the client, not Redis, holds the rate down.
fn client_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command name's ')', utime and stime are the 12th and 13th fields.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks as f64 / 100.0
}

/// Three significant digits, for figures from 0.001 to 100,000.
fn sig(x: f64) -> String {
    if !x.is_finite() {
        return "-".to_owned();
    }
    let decimals = (2 - x.abs().max(1e-9).log10().floor() as i32).clamp(0, 5) as usize;
    format!("{x:.decimals$}")
}

/// Empties the servers, outside the measured window: keys an earlier row
/// left would otherwise expire, on Redis's CPU, during this one.
fn flush(servers: &[&RedisServer]) {
    for s in servers {
        let mut c = s.connection().expect("connect");
        redis::cmd("FLUSHALL")
            .query::<()>(&mut c)
            .expect("FLUSHALL");
    }
}

/// One row, fresh: flushed servers, new connections, a warm-up, then the
/// measured run between two reads of the servers' CPU and script calls.
async fn measure(
    row: &Row,
    target: &Target,
    servers: &[&RedisServer],
    prefix: &str,
    quota: Quota,
    dur: Duration,
) -> Sample {
    flush(servers);
    let runner = Runner::new(row, target, prefix, quota).await;
    runner.run(row, prefix, quota, WARM, WARM_CAP).await;
    let calls = fleet::script_calls(servers);
    let (cpu, client) = (cpu_seconds(servers), client_cpu_seconds());
    let o = runner.run(row, prefix, quota, dur, CAP).await;
    let (cpu, client) = (cpu_seconds(servers) - cpu, client_cpu_seconds() - client);
    let calls = fleet::script_calls(servers) - calls;
    Sample {
        decisions: o.requests,
        rps: o.rps,
        p50_us: o.p50_us,
        p99_us: o.p99_us,
        cpu_us: cpu * 1e6,
        calls,
        client_cpu_us: client * 1e6,
    }
}

/// The section: `CPU_SECS` (default 2) per row at most, `CPU_ROUNDS`
/// (default 3) interleaved rounds, `CPU_CLUSTER=0` skips the cluster rows.
/// `quota` is one no run reaches.
pub fn section(server: &RedisServer, quota: Quota) {
    let began = Instant::now();
    let secs: f64 = env("CPU_SECS", 2.0);
    let dur = Duration::from_secs_f64(secs);
    let rounds = env("CPU_ROUNDS", 3usize).max(1);
    let with_cluster = std::env::var("CPU_CLUSTER").as_deref() != Ok("0");
    let cluster = with_cluster.then(RedisCluster::start);
    let rows = rows(with_cluster);
    let single = Target::Server(server.url());
    let cluster_target = cluster.as_ref().map(|c| Target::Cluster(c.urls()));
    let target = |row: &Row| {
        if row.cluster {
            cluster_target.as_ref().unwrap()
        } else {
            &single
        }
    };
    let servers = |row: &Row| -> Vec<&RedisServer> {
        match (&cluster, row.cluster) {
            (Some(c), true) => c.nodes.iter().collect(),
            _ => vec![server],
        }
    };

    // What the servers burn doing nothing (cron, the cluster bus): a floor
    // each row's figure includes over its seconds.
    let idle = |servers: &[&RedisServer]| {
        let before = cpu_seconds(servers);
        std::thread::sleep(Duration::from_secs(1));
        (cpu_seconds(servers) - before) * 1e6
    };
    let version: String = {
        let mut c = server.connection().expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut c)
            .expect("INFO");
        // Valkey answers `redis_version` with the Redis it is compatible with.
        let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name));
        match field("valkey_version:") {
            Some(v) => format!("valkey-server {}", v.trim()),
            None => format!(
                "redis-server {}",
                field("redis_version:").unwrap_or("?").trim()
            ),
        }
    };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "\nredis cpu: {version}, {cpus} CPUs shared by client and servers; \
         {} gateways, quota {quota} (never reached), at most {dur:?} or {CAP} decisions per gateway \
         per row, {rounds} rounds in alternating order, warm-up {WARM:?}",
        fleet::GATEWAYS
    );
    print!("idle Redis CPU: 1 server {:.0} us/s", idle(&[server]));
    if let Some(c) = &cluster {
        print!(
            ", cluster (3 masters) {:.0} us/s",
            idle(&c.nodes.iter().collect::<Vec<_>>())
        );
    }
    println!();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut results: Vec<Vec<Sample>> = vec![Vec::new(); rows.len()];
    rt.block_on(async {
        for round in 0..rounds {
            for i in order(round, rows.len()) {
                let row = &rows[i];
                // Fresh keys per row and round: no state of one helps another.
                let prefix = format!("cpu-r{round}-{i}");
                let s = measure(row, target(row), &servers(row), &prefix, quota, dur).await;
                println!(
                    "round {round} {}: {:>7} decisions {:>8.0}/s {:>6} us Redis CPU/decision \
                     p50 {:>5.0} us p99 {:>6.0} us {:.4} calls/decision; cores: Redis {:.2}, \
                     client {:.2}",
                    row.label(),
                    s.decisions,
                    s.rps,
                    sig(s.per_decision()),
                    s.p50_us,
                    s.p99_us,
                    s.calls_per_decision(),
                    s.cores(s.cpu_us),
                    s.cores(s.client_cpu_us),
                );
                results[i].push(s);
            }
        }
    });

    println!(
        "\nRedis CPU per decision, medians of {rounds} rounds; x baseline is the median of \
         each round's ratio to that round's baseline of the same keys, concurrency and target:\n"
    );
    println!(
        "| scheme | algorithm | keys | concurrency | target | decisions | decisions/s \
         | Redis CPU us/decision | x baseline | p50 us | p99 us | script calls/decision \
         | Redis CPU us/script call | Redis cores | client cores |"
    );
    println!("|---|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for (i, row) in rows.iter().enumerate() {
        let col = |f: fn(&Sample) -> f64| median(results[i].iter().map(f).collect());
        let base = rows.iter().position(|r| {
            let b = row.baseline();
            r.scheme == b.scheme && r.keys == b.keys && r.tasks == b.tasks && r.cluster == b.cluster
        });
        let ratio = base.map_or(f64::NAN, |b| {
            let pairs = results[i].iter().zip(&results[b]);
            median(
                pairs
                    .map(|(s, b)| s.per_decision() / b.per_decision())
                    .collect(),
            )
        });
        let [s, a, k, c, t] = row.cells();
        println!(
            "| {s} | {a} | {k} | {c} | {t} | {:.0} | {:.0} | {} | {} | {:.0} | {:.0} | {:.4} \
             | {} | {:.2} | {:.2} |",
            col(|s| s.decisions as f64),
            col(|s| s.rps),
            sig(col(Sample::per_decision)),
            sig(ratio),
            col(|s| s.p50_us),
            col(|s| s.p99_us),
            col(Sample::calls_per_decision),
            sig(col(Sample::per_call)),
            col(|s| s.cores(s.cpu_us)),
            col(|s| s.cores(s.client_cpu_us)),
        );
    }
    let skip = if with_cluster { "" } else { " CPU_CLUSTER=0" };
    println!(
        "\ncommand: CPU_ONLY=1 CPU_ROUNDS={rounds} CPU_SECS={secs}{skip} cargo bench \
         -p keyed-rate-limit-bench --bench redis --features redis-cluster"
    );
    println!("section took {:.0} s", began.elapsed().as_secs_f64());
}
