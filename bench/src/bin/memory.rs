//! Bytes per key in the local store, counted by a global allocator.
//!
//! ```sh
//! cargo run -p keyed-rate-limit-bench --bin memory --release
//! ```
//!
//! Sends `MEM_KEYS` (default 1,000,000) requests with distinct `x-api-key`
//! values through the layer's service, and prints the live heap bytes per key
//! they left behind, then again after `RateLimitLayer::cleanup()` once their
//! buckets are full again. The same keys in a raw `governor` keyed limiter are
//! the baseline. Then `MEM_FLOOD` (default 10,000,000) distinct keys hit a
//! rule with `max_keys(MEM_MAX_KEYS)` (default 100,000) whose buckets stay
//! owed: the peak live heap must stay under `max_keys` × the bytes per key
//! measured before, with ten known keys keeping their exact counts. The counts are requested bytes (`Layout::size`), so they don't
//! include the allocator's own rounding and bookkeeping; they are the same in
//! every run, unlike timings.

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use keyed_rate_limit::{Key, KeyExtractor, Quota, RateLimitLayer, Rule};
use tower::{Service, service_fn};

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to `System` unchanged and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn key_name(i: usize) -> String {
    format!("key-{i:07}")
}

fn main() {
    let n: usize = std::env::var("MEM_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    // 1000 per 10 ms: one cell refills in 10 µs, so every bucket is whole
    // again a moment after its only request.
    let quota = Quota::new(1000, Duration::from_millis(10));
    let per_key = |bytes: isize| bytes as f64 / n as f64;

    // Baseline: a raw governor keyed limiter holding the same `Key`s.
    let base = live();
    {
        let gq = governor::Quota::with_period(quota.emission_interval())
            .unwrap()
            .allow_burst(NonZeroU32::new(quota.burst()).unwrap());
        let raw = governor::RateLimiter::keyed(gq);
        for i in 0..n {
            // As the header extractor makes them: an exact copy of the bytes.
            let _ = raw.check_key(&Key::new(Bytes::copy_from_slice(key_name(i).as_bytes())));
        }
        let held = live() - base;
        std::thread::sleep(Duration::from_millis(50));
        raw.retain_recent();
        raw.shrink_to_fit();
        let after = live() - base;
        println!(
            "governor keyed, {n} keys: {:>6.1} B/key held, {after} B after retain_recent+shrink ({} keys left)",
            per_key(held),
            raw.len()
        );
    }

    // The layer, through its service, as a server would call it. No Tokio
    // runtime: the background sweep does not start and cannot interfere.
    let base = live();
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("mem", KeyExtractor::header("x-api-key"), quota))
        .build()
        .unwrap();
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    });
    let mut svc = layer.clone().layer(inner);
    let empty = live() - base;
    for i in 0..n {
        let mut req = Request::new(Full::<Bytes>::default());
        req.headers_mut()
            .insert("x-api-key", HeaderValue::from_str(&key_name(i)).unwrap());
        let res = svc
            .call(req)
            .now_or_never()
            .expect("local rules decide without awaiting")
            .unwrap();
        assert!(res.status().is_success());
    }
    let held = live() - base;
    let keys_held = layer.local_keys();
    std::thread::sleep(Duration::from_millis(50));
    layer.cleanup();
    let after = live() - base;
    println!(
        "layer local rule, {n} keys: {:>6.1} B/key held ({keys_held} keys), {after} B after cleanup() ({} keys left; empty layer+service {} B)",
        per_key(held),
        layer.local_keys(),
        empty
    );
    println!(
        "key: {} B each, the {} B of data inline (keys up to 38 B need no allocation of their own)",
        std::mem::size_of::<Key>(),
        key_name(0).len()
    );
    flood(per_key(held));
}

/// A flood of distinct keys against a rule bounded by `max_keys`, whose
/// buckets never refill during the run (nothing can be forgotten): the live
/// heap must stay under `max_keys` × the bytes a key costs, and ten known
/// keys, asked between the flood's requests, must keep their exact counts.
fn flood(bytes_per_key: f64) {
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let flood = env("MEM_FLOOD", 10_000_000);
    let max_keys = env("MEM_MAX_KEYS", 100_000);
    let quota = Quota::new(100, Duration::from_secs(86_400));
    let base = live();
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("flood", KeyExtractor::header("x-api-key"), quota).max_keys(max_keys))
        .build()
        .unwrap();
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    });
    let mut svc = layer.clone().layer(inner);
    let mut send = |key: &str| {
        let mut req = Request::new(Full::<Bytes>::default());
        req.headers_mut()
            .insert("x-api-key", HeaderValue::from_str(key).unwrap());
        svc.call(req)
            .now_or_never()
            .expect("local rules decide without awaiting")
            .unwrap()
    };
    let known: Vec<String> = (0..10).map(|i| format!("known-{i}")).collect();
    let mut asked = 0u32;
    let mut peak = 0isize;
    let started = std::time::Instant::now();
    for i in 0..flood {
        send(&format!("flood-{i:08}"));
        if i % 100_000 == 0 {
            asked += 1;
            for k in &known {
                let res = send(k);
                let left = res.headers()["ratelimit"].to_str().unwrap().to_owned();
                // One unit spent per ask; a day-long bucket returns none in a run.
                assert!(
                    left.contains(&format!(";r={};", 100 - asked)),
                    "{k}: {left} after {asked} asks"
                );
            }
            peak = peak.max(live() - base);
        }
    }
    let took = started.elapsed();
    peak = peak.max(live() - base);
    let bound = max_keys as f64 * bytes_per_key;
    println!(
        "flood: {flood} distinct keys in {:.1} s ({:.0}/s), max_keys {max_keys}: {} keys held, peak live heap {peak} B <= {max_keys} x {bytes_per_key:.1} B/key = {bound:.0} B: {}; 10 known keys exact after {asked} asks each",
        took.as_secs_f64(),
        flood as f64 / took.as_secs_f64(),
        layer.local_keys(),
        if (peak as f64) <= bound {
            "ok"
        } else {
            "EXCEEDED"
        },
    );
    assert!(peak as f64 <= bound, "peak {peak} B above {bound} B");
    assert!(layer.local_keys() <= max_keys + 10);
}
