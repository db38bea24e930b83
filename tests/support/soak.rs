//! The chaos soak: four gateways on one private `redis-server`, on a
//! private 3-master cluster with a replica per master, or on a master, a
//! replica and three sentinels; a fixed offered rate over 200 keys and a
//! hot key, and a fault every few seconds: SIGKILL and restart (on the
//! cluster and under Sentinel: of a master, until its replica takes over),
//! SIGSTOP/SIGCONT (of a master), a sentinel killed and restarted,
//! `SCRIPT FLUSH`, `CLIENT KILL`. Run by `tests/redis/soak.rs` (short, or
//! long with `SOAK_SECS`). Every loop is bounded by count and time.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::{Extension, Router, routing::get};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, decision::RateLimitDecision};

#[cfg(feature = "redis-cluster")]
use keyed_rate_limit_testing::RedisCluster;
use keyed_rate_limit_testing::RedisServer;
#[cfg(feature = "redis-sentinel")]
use keyed_rate_limit_testing::{MASTER_NAME, SentinelGroup};

pub struct Config {
    pub duration: Duration,
    /// Requests per second offered, over all gateways.
    pub rate: u32,
    pub fault_every: Duration,
    pub keys: usize,
    pub topology: Topology,
}

/// What the gateways share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One server.
    Single,
    /// A 3-master cluster with a replica each (feature `redis-cluster`).
    Cluster,
    /// A master, a replica and three sentinels (feature `redis-sentinel`).
    Sentinel,
}

/// The Redis the gateways share, and the faults it takes.
enum Target {
    Single(RedisServer),
    #[cfg(feature = "redis-cluster")]
    Cluster(RedisCluster),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(SentinelGroup, usize),
}

impl Target {
    fn start(topology: Topology) -> Self {
        match topology {
            Topology::Single => Self::Single(RedisServer::start()),
            #[cfg(feature = "redis-cluster")]
            Topology::Cluster => Self::Cluster(RedisCluster::start_with_replicas(1)),
            #[cfg(feature = "redis-sentinel")]
            Topology::Sentinel => Self::Sentinel(SentinelGroup::start(), 0),
            #[allow(unreachable_patterns)]
            other => panic!("the {other:?} soak needs its feature"),
        }
    }

    fn kinds(&self) -> [&'static str; 4] {
        match self {
            Self::Single(_) => ["kill", "stop", "script_flush", "client_kill"],
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(_) => ["failover", "stop", "script_flush", "client_kill"],
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(..) => [
                "failover",
                "sentinel_restart",
                "script_flush",
                "client_kill",
            ],
        }
    }

    async fn backend(&self) -> RedisBackend {
        match self {
            Self::Single(s) => RedisBackend::builder(s.url()),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => RedisBackend::cluster_builder(c.urls()),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(g, _) => RedisBackend::sentinel_builder(g.sentinel_urls(), MASTER_NAME),
        }
        .prefix("soak")
        .connect_lazily()
        .build()
        .await
        .unwrap()
    }

    /// Every running server: a fault that hits "the server" hits all of them.
    fn servers(&self) -> Vec<&RedisServer> {
        match self {
            Self::Single(s) => vec![s],
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(c) => c.nodes.iter().filter(|n| n.is_running()).collect(),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(g, _) => g.servers.iter().filter(|n| n.is_running()).collect(),
        }
    }

    /// Injects one fault; returns when it is over (the server answers again).
    async fn inject(&mut self, kind: &str) {
        match (self, kind) {
            (Self::Single(s), "kill") => {
                s.kill();
                tokio::time::sleep(Duration::from_secs(1)).await;
                s.restart();
            }
            (Self::Single(s), "stop") => {
                s.pause();
                tokio::time::sleep(Duration::from_secs(1)).await;
                s.resume();
            }
            // A master dies; the fault lasts until its replica has taken
            // over. The old master then comes back as a replica.
            #[cfg(feature = "redis-cluster")]
            (Self::Cluster(c), "failover") => {
                let master = c.a_master();
                c.nodes[master].kill();
                // Polled between sleeps: a worker blocked for the whole
                // failover would stall the gateways' requests behind it.
                let deadline = Instant::now() + Duration::from_secs(15);
                loop {
                    // Blocking queries, off the workers that serve the gateways.
                    let urls = c.urls_but(master);
                    let done = tokio::task::spawn_blocking(move || RedisCluster::promoted(&urls));
                    if done.await.unwrap() {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "no replica took over from node {master}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::task::block_in_place(|| c.nodes[master].restart());
            }
            // The master dies; the fault lasts until the sentinels have
            // promoted the replica. The old master then comes back, and the
            // sentinels demote it.
            #[cfg(feature = "redis-sentinel")]
            (Self::Sentinel(g, _), "failover") => {
                let old = tokio::task::block_in_place(|| g.master_port()).expect("a master");
                g.server(old).kill();
                let deadline = Instant::now() + Duration::from_secs(15);
                loop {
                    let promoted = tokio::task::block_in_place(|| {
                        g.master_port().filter(|p| {
                            *p != old
                                && keyed_rate_limit_testing::role(&g.servers, *p).as_deref()
                                    == Some("master")
                        })
                    });
                    if promoted.is_some() {
                        break;
                    }
                    assert!(Instant::now() < deadline, "no promotion within 15 s");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::task::block_in_place(|| g.server(old).restart());
            }
            // One sentinel at a time, in turn: the others keep answering.
            #[cfg(feature = "redis-sentinel")]
            (Self::Sentinel(g, next), "sentinel_restart") => {
                let i = *next % g.sentinels.len();
                *next += 1;
                g.sentinels[i].kill();
                tokio::time::sleep(Duration::from_secs(1)).await;
                tokio::task::block_in_place(|| g.sentinels[i].restart());
            }
            // Shorter than the node timeout: a stall, not a failover.
            #[cfg(feature = "redis-cluster")]
            (Self::Cluster(c), "stop") => {
                let master = c.a_master();
                c.nodes[master].pause();
                tokio::time::sleep(Duration::from_millis(500)).await;
                c.nodes[master].resume();
            }
            (target, "script_flush") => {
                for s in target.servers() {
                    s.flush_scripts();
                }
            }
            (target, _) => {
                for s in target.servers() {
                    let mut c = s.connection().unwrap();
                    let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
                        .query(&mut c);
                }
            }
        }
    }
}

/// After a fault ends, the breaker may stay open this long (its 1 s
/// `open_for`, then a probe): failure-mode decisions are expected until then.
pub const RECOVERY: Duration = Duration::from_secs(2);
pub const GATEWAYS: usize = 4;
/// Seconds of load before recording and the first fault; RSS is taken then.
const WARMUP: f64 = 2.0;
pub const TIMEOUT: Duration = Duration::from_millis(20);
const QUOTA: u32 = 20;

struct Sample {
    sent: f64,
    done: f64,
    key: u32,
    status: u16,
    /// A 200 decided by Redis (not by a failure mode).
    global: bool,
}

struct Fault {
    kind: &'static str,
    start: f64,
    end: f64,
}

pub struct Report {
    pub requests: usize,
    pub errors: usize,
    pub server_errors: usize,
    pub faults: Vec<(&'static str, f64, f64)>,
    pub p50_healthy_ms: f64,
    pub p99_healthy_ms: f64,
    pub p99_fault_ms: f64,
    /// p99 of the requests sent during each kind of fault.
    pub p99_by_fault_ms: Vec<(&'static str, f64)>,
    /// Requests sent from 200 ms into a fault on: the breaker is open.
    pub p99_breaker_open_ms: f64,
    pub over_admissions: Vec<String>,
    pub failure_mode_outside_faults: usize,
    pub slowest_recovery: f64,
    pub tasks: (usize, usize),
    pub rss_kb: (u64, u64),
    pub admitted: usize,
}

impl Report {
    /// Everything the soak promises that did not hold; latency is reported,
    /// not judged (timing belongs to benchmarks on a shared box).
    pub fn violations(&self) -> Vec<String> {
        let mut v = self.over_admissions.clone();
        if self.errors > 0 {
            v.push(format!(
                "{} requests failed (connection or panic)",
                self.errors
            ));
        }
        if self.server_errors > 0 {
            v.push(format!("{} responses were 5xx", self.server_errors));
        }
        if self.failure_mode_outside_faults > 0 {
            v.push(format!(
                "{} failure-mode decisions outside faults",
                self.failure_mode_outside_faults
            ));
        }
        if self.slowest_recovery > RECOVERY.as_secs_f64() {
            v.push(format!("recovery took {:.2} s", self.slowest_recovery));
        }
        // A cluster client opens a connection (two tasks) to each new
        // master, a sentinel backend one to the promoted master: growth
        // with failovers, not with requests. In a cluster, a master killed
        // or stopped past the node timeout is failed over too.
        let failovers = self
            .faults
            .iter()
            .filter(|f| matches!(f.0, "failover" | "kill" | "stop"))
            .count();
        if self.tasks.1 > self.tasks.0 + 2 * GATEWAYS * failovers {
            v.push(format!("tasks {} -> {}", self.tasks.0, self.tasks.1));
        }
        // From the warmed-up load to after the run: a leak grows with the run.
        if self.rss_kb.1 > self.rss_kb.0 + 8 * 1024 {
            v.push(format!("RSS {} kB -> {} kB", self.rss_kb.0, self.rss_kb.1));
        }
        v
    }

    pub fn print(&self) {
        println!(
            "requests: {} ({} admitted), faults injected: {}, violations: {}",
            self.requests,
            self.admitted,
            self.faults.len(),
            self.violations().len()
        );
        for (kind, start, end) in &self.faults {
            println!(
                "  fault {kind:<12} at {start:>6.2} s for {:.2} s",
                end - start
            );
        }
        println!(
            "latency: healthy p50 {:.2} ms p99 {:.2} ms; during faults p99 {:.2} ms (target: Redis timeout {} ms + 10 ms), from 200 ms into a fault (breaker open) p99 {:.2} ms",
            self.p50_healthy_ms,
            self.p99_healthy_ms,
            self.p99_fault_ms,
            TIMEOUT.as_millis(),
            self.p99_breaker_open_ms
        );
        for (kind, p99) in &self.p99_by_fault_ms {
            println!("  p99 during {kind} (instant faults: their first 100 ms): {p99:.2} ms");
        }
        println!(
            "5xx: {}, failed requests: {}, over-admissions while healthy: {}, failure-mode decisions outside faults: {}, slowest recovery: {:.2} s",
            self.server_errors,
            self.errors,
            self.over_admissions.len(),
            self.failure_mode_outside_faults,
            self.slowest_recovery
        );
        println!(
            "tasks {} -> {}, RSS {} kB -> {} kB",
            self.tasks.0, self.tasks.1, self.rss_kb.0, self.rss_kb.1
        );
        for v in self.violations() {
            println!("VIOLATION: {v}");
        }
    }
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

/// One gateway as users deploy one, with the shipped defaults but for a
/// split local fallback; its handler names the decision's source.
async fn gateway(redis: RedisBackend) -> String {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .instances(GATEWAYS as u32)
        .rule(
            Rule::new(
                "soak",
                KeyExtractor::header("x-key"),
                Quota::per_second(QUOTA),
            )
            .global(redis)
            .redis_timeout(TIMEOUT),
        )
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<RateLimitDecision>| async move {
                d.rules()[0].source.as_str().to_owned()
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/")
}

pub async fn run(cfg: Config) -> Report {
    let mut target = Target::start(cfg.topology);
    let metrics = tokio::runtime::Handle::current().metrics();
    let mut urls = Vec::new();
    for _ in 0..GATEWAYS {
        urls.push(gateway(target.backend().await).await);
    }
    // Warm up (each gateway's sweep task starts with its first request,
    // pools fill), then take the baseline the run must come back to.
    let warm = reqwest::Client::builder().no_proxy().build().unwrap();
    for _ in 0..50 {
        for url in &urls {
            let _ = warm.get(url).header("x-key", "warmup").send().await;
        }
    }
    drop(warm);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tasks_before = metrics.num_alive_tasks();
    let t0 = Instant::now();
    let now = move || t0.elapsed().as_secs_f64();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let next = Arc::new(AtomicU64::new(0));
    let total = ((WARMUP + cfg.duration.as_secs_f64()) * f64::from(cfg.rate)) as u64;
    let mut workers = Vec::new();
    for w in 0..32 {
        let (urls, samples, next) = (urls.clone(), samples.clone(), next.clone());
        let keys = cfg.keys as u64;
        let rate = f64::from(cfg.rate);
        workers.push(tokio::spawn(async move {
            let client = reqwest::Client::builder().no_proxy().build().unwrap();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= total {
                    return;
                }
                let at = t0 + Duration::from_secs_f64(k as f64 / rate);
                tokio::time::sleep_until(at.into()).await;
                // Half the traffic on the hot key 0, the rest spread.
                let key = if k % 2 == 0 { 0 } else { 1 + (k * 7919) % keys };
                let url = &urls[(k as usize + w) % urls.len()];
                let sent = now();
                let res = client
                    .get(url)
                    .header("x-key", key.to_string())
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                let (status, global) = match res {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        (s, r.text().await.is_ok_and(|b| b == "global"))
                    }
                    Err(_) => (0, false),
                };
                // The first seconds warm the pools up, unrecorded.
                if sent >= WARMUP {
                    samples.lock().unwrap().push(Sample {
                        sent,
                        done: now(),
                        key: key as u32,
                        status,
                        global,
                    });
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(WARMUP)).await;
    let rss_before = rss_kb();
    // Faults, in turn, until the load ends.
    let mut faults = Vec::new();
    let kinds = target.kinds();
    let mut i = 0;
    loop {
        tokio::time::sleep(cfg.fault_every).await;
        if now() + 1.5 > WARMUP + cfg.duration.as_secs_f64() {
            break;
        }
        let kind = kinds[i % kinds.len()];
        i += 1;
        let start = now();
        target.inject(kind).await;
        faults.push(Fault {
            kind,
            start,
            end: now(),
        });
    }
    for w in workers {
        w.await.unwrap();
    }
    // Idle connections close; the runtime settles.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let tasks_after = metrics.num_alive_tasks();
    analyse(
        samples,
        faults,
        (tasks_before, tasks_after),
        (rss_before, rss_kb()),
    )
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn analyse(
    samples: Vec<Sample>,
    faults: Vec<Fault>,
    tasks: (usize, usize),
    rss_kb: (u64, u64),
) -> Report {
    let recovery = RECOVERY.as_secs_f64();
    let in_fault = |t: f64| faults.iter().any(|f| t >= f.start && t <= f.end);
    let near_fault = |t: f64| faults.iter().any(|f| t >= f.start && t <= f.end + recovery);
    let ms = |s: &Sample| (s.done - s.sent) * 1000.0;
    let healthy: Vec<f64> = samples
        .iter()
        .filter(|s| !near_fault(s.sent))
        .map(ms)
        .collect();
    let faulty: Vec<f64> = samples
        .iter()
        .filter(|s| in_fault(s.sent))
        .map(ms)
        .collect();
    let mut p99_by_fault_ms = Vec::new();
    for kind in ["kill", "failover", "stop", "script_flush", "client_kill"] {
        let of_kind: Vec<f64> = samples
            .iter()
            .filter(|s| {
                faults.iter().any(|f| {
                    f.kind == kind && s.sent >= f.start && s.sent <= f.end.max(f.start + 0.1)
                })
            })
            .map(ms)
            .collect();
        if !of_kind.is_empty() {
            p99_by_fault_ms.push((kind, percentile(of_kind, 0.99)));
        }
    }
    let open: Vec<f64> = samples
        .iter()
        .filter(|s| {
            faults
                .iter()
                .any(|f| s.sent >= f.start + 0.2 && s.sent <= f.end)
        })
        .map(ms)
        .collect();
    let admitted: Vec<&Sample> = samples.iter().filter(|s| s.status == 200).collect();
    let failure_mode_outside_faults = admitted
        .iter()
        .filter(|s| !s.global && !near_fault(s.sent) && !near_fault(s.done))
        .count();
    // Per fault: the last failure-mode admission after it ended.
    let slowest_recovery = faults
        .iter()
        .map(|f| {
            admitted
                .iter()
                .filter(|s| !s.global && s.sent >= f.start)
                .filter(|s| {
                    faults
                        .iter()
                        .all(|g| g.start <= f.start || s.done < g.start)
                })
                .map(|s| s.sent - f.end)
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max);
    // GCRA between any two global admissions of a key within one healthy
    // stretch: at most burst + gap / interval, the gap at its longest.
    let interval = 1.0 / f64::from(QUOTA);
    let segment = |t: f64| faults.iter().filter(|f| f.start <= t).count();
    let mut by_key: HashMap<(u32, usize), Vec<&Sample>> = HashMap::new();
    for s in admitted.iter().filter(|s| s.global && !near_fault(s.sent)) {
        by_key.entry((s.key, segment(s.sent))).or_default().push(s);
    }
    let mut over_admissions = Vec::new();
    for ((key, seg), mut v) in by_key {
        v.sort_by(|a, b| a.sent.total_cmp(&b.sent));
        'outer: for i in 0..v.len() {
            for j in i..v.len() {
                let units = (j - i + 1) as f64;
                let most = f64::from(QUOTA) + (v[j].done - v[i].sent) / interval + 1e-6;
                if units > most {
                    over_admissions.push(format!(
                        "key {key} (stretch {seg}): {units} admitted in {:.3} s",
                        v[j].done - v[i].sent
                    ));
                    break 'outer;
                }
            }
        }
    }
    Report {
        requests: samples.len(),
        errors: samples.iter().filter(|s| s.status == 0).count(),
        server_errors: samples.iter().filter(|s| s.status >= 500).count(),
        faults: faults.iter().map(|f| (f.kind, f.start, f.end)).collect(),
        p50_healthy_ms: percentile(healthy.clone(), 0.5),
        p99_healthy_ms: percentile(healthy, 0.99),
        p99_fault_ms: percentile(faulty, 0.99),
        p99_breaker_open_ms: percentile(open, 0.99),
        p99_by_fault_ms,
        over_admissions,
        failure_mode_outside_faults,
        slowest_recovery,
        tasks,
        rss_kb,
        admitted: admitted.len(),
    }
}
