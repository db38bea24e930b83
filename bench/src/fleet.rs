//! Four gateways on one Redis: exact, coalesced and leased global rules
//! beside the local rule, in one run (`benches/redis.rs`, section `fleet`).
//!
//! Each gateway is a `RateLimitLayer` with its own `RedisBackend` (its own
//! connection), all on one multi-thread runtime; requests go through the
//! layer in process, so the figures are the limiter's, not HTTP's.
//!
//! - **Cost**: a quota no run reaches, a hot key or 10,000 keys, at
//!   concurrency 1 and 64 spread evenly over the gateways: req/s, p50/p99
//!   latency, and Redis script calls per request.
//! - **Accuracy**: a hot key offered far above its quota (2,000/s, burst
//!   400) for a few seconds, spread evenly or 90 % on one gateway. Each
//!   admission is stamped when the inner service runs. *Over-admission* is
//!   the most units beyond `burst + rate × t` over any interval `t` among
//!   those stamps (a GCRA run over them); *under-admission* compares the
//!   admitted units with what an exact GCRA admits of the same arrivals
//!   (stamped before each call).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::rule::LeasePolicy;
use keyed_rate_limit::{
    Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule, failure::FailureMode,
};
use tower::{ServiceExt, service_fn};

pub const GATEWAYS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Local,
    Exact,
    Coalesced,
    Leased,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Exact => "exact",
            Self::Coalesced => "coalesced",
            Self::Leased => "leased",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    Hot,
    Many(u64),
}

impl Keys {
    /// Task `task`'s keys, in order: every scheme measured with the same
    /// task count draws the same sequence.
    pub fn stream(self, task: usize) -> impl FnMut() -> String {
        let mut x = (task as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || match self {
            Keys::Hot => "hot".to_owned(),
            Keys::Many(n) => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                format!("k{}", x % n)
            }
        }
    }
}

/// Where the gateways' backends connect.
#[derive(Clone)]
pub enum Target {
    Server(String),
    Cluster(Vec<String>),
}

impl Target {
    async fn backend(&self, prefix: &str) -> RedisBackend {
        let builder = match self {
            Self::Server(url) => RedisBackend::builder(url.clone()),
            Self::Cluster(urls) => RedisBackend::cluster_builder(urls.clone()),
        };
        builder.prefix(prefix).build().await.expect("connect")
    }
}

pub const LEASE_TTL: Duration = Duration::from_millis(50);

/// Four gateways' layers for `mode`, each with its own backend (GCRA).
pub async fn gateways(
    target: &Target,
    prefix: &str,
    mode: Mode,
    quota: Quota,
) -> Vec<RateLimitLayer> {
    gateways_with(target, prefix, mode, quota, Algorithm::Gcra).await
}

/// [`gateways`] counting with `algorithm`.
pub async fn gateways_with(
    target: &Target,
    prefix: &str,
    mode: Mode,
    quota: Quota,
    algorithm: Algorithm,
) -> Vec<RateLimitLayer> {
    let mut out = Vec::new();
    for _ in 0..GATEWAYS {
        let rule = Rule::new("fleet", KeyExtractor::header("x-key"), quota).algorithm(algorithm);
        let rule = match mode {
            Mode::Local => rule,
            _ => rule
                .global(target.backend(prefix).await)
                // Generous: a fallback answer would flatter the numbers.
                .redis_timeout(Duration::from_secs(1))
                .on_redis_failure(FailureMode::FailClosed),
        };
        let rule = match mode {
            Mode::Exact => rule.coalesce(false),
            Mode::Coalesced => rule.coalesce(true),
            Mode::Leased => rule.lease(LeasePolicy::new(LEASE_TTL)),
            Mode::Local => rule,
        };
        out.push(RateLimitLayer::builder().rule(rule).build().unwrap());
    }
    out
}

#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub requests: u64,
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Arrivals (before each call) and admissions (in the inner service).
    pub arrivals: Vec<Instant>,
    pub admitted: Vec<Instant>,
}

impl Outcome {
    /// Counts, rate and percentiles of `lat` (µs), taken over `elapsed`.
    pub fn from_latencies(mut lat: Vec<f64>, elapsed: Duration) -> Self {
        lat.sort_by(f64::total_cmp);
        let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p) as usize];
        Outcome {
            requests: lat.len() as u64,
            rps: lat.len() as f64 / elapsed.as_secs_f64(),
            p50_us: pct(0.5),
            p99_us: pct(0.99),
            ..Outcome::default()
        }
    }
}

/// Runs `tasks` loops for `dur`; task `i` uses gateway `pick(i)`.
/// `track` keeps every arrival and admission time (accuracy runs).
pub async fn run(
    layers: &[RateLimitLayer],
    keys: Keys,
    tasks: usize,
    dur: Duration,
    pick: impl Fn(usize) -> usize,
    track: bool,
) -> Outcome {
    run_capped(layers, keys, tasks, dur, None, pick, track).await
}

/// [`run`], stopping a gateway's tasks once it has decided `cap` requests
/// (a fast mode would otherwise make a slow one's figures from far more work).
pub async fn run_capped(
    layers: &[RateLimitLayer],
    keys: Keys,
    tasks: usize,
    dur: Duration,
    cap: Option<u64>,
    pick: impl Fn(usize) -> usize,
    track: bool,
) -> Outcome {
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let counts: Arc<Vec<AtomicU64>> = Arc::new(layers.iter().map(|_| AtomicU64::new(0)).collect());
    let start = Instant::now();
    let deadline = start + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let sink = admitted.clone();
            let (counts, g) = (counts.clone(), pick(i) % layers.len());
            let svc = layers[g].layer(service_fn(move |_req: Request<Full<Bytes>>| {
                let sink = sink.clone();
                async move {
                    if track {
                        sink.lock().unwrap().push(Instant::now());
                    }
                    Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
                }
            }));
            tokio::spawn(async move {
                let mut next_key = keys.stream(i);
                let (mut lat, mut arrivals) = (Vec::new(), Vec::new());
                while Instant::now() < deadline
                    && cap.is_none_or(|c| counts[g].fetch_add(1, Ordering::Relaxed) < c)
                {
                    let key = next_key();
                    let req = Request::get("/")
                        .header("x-key", key)
                        .body(Full::default())
                        .unwrap();
                    let t = Instant::now();
                    let res = svc.clone().oneshot(req).await.unwrap();
                    assert!(
                        res.status() == StatusCode::OK
                            || res.status() == StatusCode::TOO_MANY_REQUESTS
                    );
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                    if track {
                        arrivals.push(t);
                    }
                }
                (lat, arrivals)
            })
        })
        .collect();
    let (mut lat, mut arrivals) = (Vec::new(), Vec::new());
    for h in handles {
        let (l, a) = h.await.unwrap();
        lat.extend(l);
        arrivals.extend(a);
    }
    let elapsed = start.elapsed();
    let mut admitted = std::mem::take(&mut *admitted.lock().unwrap());
    admitted.sort();
    arrivals.sort();
    Outcome {
        arrivals,
        admitted,
        ..Outcome::from_latencies(lat, elapsed)
    }
}

/// GCRA over `times` for `q`: how many it admits, and the most units any
/// interval holds beyond `burst + rate × t` when all are admitted.
pub fn gcra(q: Quota, times: &[Instant]) -> (u64, f64) {
    let interval = q.window().as_secs_f64() / f64::from(q.limit());
    let tolerance = f64::from(q.burst()) * interval;
    let Some(&t0) = times.first() else {
        return (0, 0.0);
    };
    let (mut exact_tat, mut all_tat) = (0.0f64, 0.0f64);
    let (mut admits, mut over) = (0u64, 0.0f64);
    for t in times {
        let now = (*t - t0).as_secs_f64();
        // The exact limiter: admits when the unit fits.
        let next = exact_tat.max(now) + interval;
        if next - now <= tolerance + 1e-9 {
            exact_tat = next;
            admits += 1;
        }
        // Everything admitted: how far past the bound the units run.
        all_tat = all_tat.max(now) + interval;
        over = over.max((all_tat - now - tolerance) / interval);
    }
    (admits, over.max(0.0))
}

/// `INFO commandstats` script calls, summed over `servers`.
pub fn script_calls(servers: &[&keyed_rate_limit_testing::RedisServer]) -> u64 {
    servers.iter().map(|s| s.script_calls()).sum()
}
