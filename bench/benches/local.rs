//! The per-decision cost of a local rule through the service, against raw
//! `governor::check_key` on the same keys: one hot key, and 100k distinct keys.
//!
//! `cargo bench -p keyed-rate-limit-bench --bench local` times every variant
//! in interleaved rounds (`LOCAL_ROUNDS`, default 15, each `LOCAL_OPS`
//! operations, default 200,000) and prints the median time per operation
//! and the median over rounds of each paired ratio, measured in the same
//! round. On a shared machine read the ratios, not the times; instruction
//! counts (`--bin instructions`) steer CPU cost.

use std::convert::Infallible;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use bytes::Bytes;
use governor::{Quota as GQuota, RateLimiter};
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use keyed_rate_limit::{Key, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::rounds::{median, order};
use tower::{Service, service_fn};

const KEYS: usize = 100_000;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A quota no benchmark reaches: 1e9 per second.
fn huge() -> Quota {
    Quota::new(1_000_000_000, Duration::from_secs(1))
}

fn request(v: &HeaderValue) -> Request<Full<Bytes>> {
    let mut r = Request::new(Full::<Bytes>::default());
    r.headers_mut().insert("x-api-key", v.clone());
    r
}

fn main() {
    let (rounds, ops) = (env("LOCAL_ROUNDS", 15), env("LOCAL_OPS", 200_000));
    let values: Vec<HeaderValue> = (0..KEYS)
        .map(|i| HeaderValue::from_str(&format!("key-{i}")).unwrap())
        .collect();
    let keys: Vec<Key> = values
        .iter()
        .map(|v| Key::new(Bytes::copy_from_slice(v.as_bytes())))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    });
    let layer = || {
        let rule = Rule::new("bench", KeyExtractor::header("x-api-key"), huge());
        RateLimitLayer::builder().rule(rule).build().unwrap()
    };
    let gq = GQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let (raw_hot, raw_many) = (RateLimiter::keyed(gq), RateLimiter::keyed(gq));
    let (mut hot, mut many, mut bare) = (layer().layer(inner), layer().layer(inner), inner);

    // One operation of each variant; `i` walks the keys.
    let mut run = |variant: usize, i: usize| match variant {
        0 => black_box(raw_hot.check_key(&keys[0]).is_ok()),
        1 => black_box(raw_many.check_key(&keys[i % KEYS]).is_ok()),
        2 => black_box(rt.block_on(bare.call(request(&values[0]))).is_ok()),
        3 => black_box(rt.block_on(hot.call(request(&values[0]))).is_ok()),
        _ => black_box(rt.block_on(many.call(request(&values[i % KEYS]))).is_ok()),
    };
    const NAMES: [&str; 5] = [
        "governor_hot",
        "governor_100k",
        "bare_service",
        "layer_hot",
        "layer_100k",
    ];
    // (variant, its reference) pairs whose ratio each round reports.
    const PAIRS: [(usize, usize); 3] = [(3, 0), (4, 1), (3, 2)];
    for v in 0..NAMES.len() {
        for i in 0..ops / 10 {
            run(v, i);
        }
    }
    let mut ns = vec![Vec::new(); NAMES.len()];
    let mut ratios = vec![Vec::new(); PAIRS.len()];
    for round in 0..rounds {
        let mut this = [0.0; NAMES.len()];
        for v in order(round, NAMES.len()) {
            let start = Instant::now();
            for i in 0..ops {
                run(v, i);
            }
            this[v] = start.elapsed().as_nanos() as f64 / ops as f64;
            ns[v].push(this[v]);
        }
        for (p, (a, b)) in PAIRS.iter().enumerate() {
            ratios[p].push(this[*a] / this[*b]);
        }
    }
    println!("local: {rounds} interleaved rounds of {ops} operations; medians");
    for (v, name) in NAMES.iter().enumerate() {
        println!("  {name:>14}: {:8.1} ns/op", median(ns[v].clone()));
    }
    for (p, (a, b)) in PAIRS.iter().enumerate() {
        let r = median(ratios[p].clone());
        println!("  {} / {} = {r:.2} (paired)", NAMES[*a], NAMES[*b]);
    }
}
