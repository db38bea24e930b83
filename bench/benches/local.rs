//! The per-decision cost of a local rule through the service, against raw
//! `governor::check_key` on the same keys: one hot key, and 100k distinct keys.
//!
//! `cargo bench -p keyed-rate-limit-bench --bench local` prints criterion's numbers, then the ratios.

use keyed_rate_limit_bench::criterion_ratios as support;

use std::convert::Infallible;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use governor::{Quota as GQuota, RateLimiter};
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use keyed_rate_limit::{Key, Quota, RateLimitLayer, Rule, key::KeyExtractor};
use tower::{Layer, Service, service_fn};

const KEYS: usize = 100_000;
const GROUP: &str = "local";

/// A quota no benchmark reaches: 1e9 per second.
fn huge() -> Quota {
    Quota::new(1_000_000_000, Duration::from_secs(1))
}

fn key_values() -> Vec<HeaderValue> {
    (0..KEYS)
        .map(|i| HeaderValue::from_str(&format!("key-{i}")).unwrap())
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group(GROUP);
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let values = key_values();
    let keys: Vec<Key> = values
        .iter()
        .map(|v| Key::new(Bytes::copy_from_slice(v.as_bytes())))
        .collect();

    let gq = GQuota::per_second(NonZeroU32::new(1_000_000_000).unwrap());
    let raw = RateLimiter::keyed(gq);
    g.bench_function("governor_hot", |b| {
        b.iter(|| black_box(raw.check_key(&keys[0]).is_ok()))
    });
    let raw = RateLimiter::keyed(gq);
    let mut i = 0;
    g.bench_function("governor_100k", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(raw.check_key(&keys[i]).is_ok())
        })
    });

    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    });
    let make = || {
        RateLimitLayer::builder()
            .rule(Rule::new(
                "bench",
                KeyExtractor::header("x-api-key"),
                huge(),
            ))
            .build()
            .unwrap()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let request = |v: &HeaderValue| {
        let mut r = Request::new(Full::<Bytes>::default());
        r.headers_mut().insert("x-api-key", v.clone());
        r
    };
    // The bare service with the same request construction: the baseline
    // that shows what the layer itself adds.
    let mut bare = inner;
    g.bench_function("bare_service", |b| {
        b.iter(|| {
            black_box(
                rt.block_on(bare.call(request(&values[0])))
                    .unwrap()
                    .status(),
            )
        })
    });
    let mut svc = make().layer(inner);
    g.bench_function("layer_hot", |b| {
        b.iter(|| black_box(rt.block_on(svc.call(request(&values[0]))).unwrap().status()))
    });
    let mut svc = make().layer(inner);
    let mut i = 0;
    g.bench_function("layer_100k", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(rt.block_on(svc.call(request(&values[i]))).unwrap().status())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
    support::print_ratios(
        GROUP,
        &[
            ("layer_hot", "governor_hot"),
            ("layer_100k", "governor_100k"),
            ("layer_hot", "bare_service"),
        ],
    );
}
