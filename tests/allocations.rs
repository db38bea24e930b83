//! Heap allocations the layer adds to an allowed request on the local path:
//! counted, so that a change that allocates again per request fails here
//! rather than in a noisy benchmark.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, headers::HeaderStyle};
use tower::{Service, service_fn};

/// Counts this thread's allocations, so tests running beside it don't count.
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations per call of `f`, after a warm-up call (first-use caches).
fn per_call(mut f: impl FnMut()) -> u64 {
    const N: u64 = 100;
    f();
    let before = ALLOCS.with(Cell::get);
    for _ in 0..N {
        f();
    }
    let total = ALLOCS.with(Cell::get) - before;
    assert_eq!(total % N, 0, "the same allocations on every request");
    total / N
}

/// What `svc` allocates per request beyond the bare service, with a key of
/// `key_len` bytes in `x-api-key`.
fn added(build: impl FnOnce(Rule) -> RateLimitLayer, key_len: usize) -> u64 {
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    });
    let huge = Quota::new(1_000_000_000, Duration::from_secs(1));
    let layer = build(Rule::new("a", KeyExtractor::header("x-api-key"), huge));
    let value = HeaderValue::try_from("k".repeat(key_len)).unwrap();
    let request = || {
        let mut req = Request::new(Full::<Bytes>::default());
        req.headers_mut().insert("x-api-key", value.clone());
        req
    };
    let mut bare = inner;
    let mut svc = layer.layer(inner);
    // The local path answers without awaiting, so no runtime is needed.
    let b = per_call(|| {
        let res = bare.call(request()).now_or_never().unwrap().unwrap();
        assert!(res.status().is_success());
    });
    let l = per_call(|| {
        let res = svc.call(request()).now_or_never().unwrap().unwrap();
        assert!(res.status().is_success());
    });
    l - b
}

#[test]
fn an_allowed_local_request_allocates_only_what_it_hands_out() {
    let defaults = |rule| RateLimitLayer::builder().rule(rule).build().unwrap();
    // The `RateLimit` value (1) and the response header map the bare
    // response did not have (2). The key is inline.
    assert_eq!(added(defaults, 16), 3);
    // A key longer than fits inline is copied to the heap once.
    assert_eq!(added(defaults, 64), 4);
    // The decision extension, opt-in: its box, and the extension map this
    // bare request did not have (3 more); the decisions list is inline.
    let extension = |rule| {
        RateLimitLayer::builder()
            .rule(rule)
            .decision_extension(true)
            .build()
            .unwrap()
    };
    assert_eq!(added(extension, 16), 6);

    let lean = |rule| {
        RateLimitLayer::builder()
            .rule(rule)
            .headers(HeaderStyle::None)
            .build()
            .unwrap()
    };
    assert_eq!(added(lean, 16), 0);
}

/// Allocations per call of an allowed request and of a local 429, each
/// with the default headers.
fn allowed_and_denied() -> (u64, u64) {
    let inner = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
    });
    let value = HeaderValue::from_static("kkkkkkkkkkkkkkkk");
    let request = || {
        let mut req = Request::new(Full::<Bytes>::default());
        req.headers_mut().insert("x-api-key", value.clone());
        req
    };
    let layer = |quota| {
        let rule = Rule::new("a", KeyExtractor::header("x-api-key"), quota);
        RateLimitLayer::builder().rule(rule).build().unwrap()
    };
    let mut open = layer(Quota::new(1_000_000_000, Duration::from_secs(1))).layer(inner);
    let mut closed = layer(Quota::per_hour(1)).layer(inner);
    let allowed = per_call(|| {
        let res = open.call(request()).now_or_never().unwrap().unwrap();
        assert!(res.status().is_success());
    });
    let res = closed.call(request()).now_or_never().unwrap().unwrap();
    assert!(res.status().is_success(), "the hour's one unit");
    // per_call's warm-up is the first 429, which writes the kept body.
    let denied = per_call(|| {
        let res = closed.call(request()).now_or_never().unwrap().unwrap();
        assert_eq!(res.status().as_u16(), 429);
    });
    (allowed, denied)
}

#[test]
fn a_local_429_allocates_no_more_than_an_allowed_request() {
    let (allowed, denied) = allowed_and_denied();
    println!("allocations per request: a 429 {denied}, an allowed request {allowed}");
    assert!(
        denied <= allowed,
        "a 429 allocates {denied}, an allowed request {allowed}"
    );
}

/// Counting a refusal (`outcome="deny"`) into a real recorder allocates
/// nothing either: its counter was resolved at build, as the allow's.
#[cfg(feature = "metrics")]
#[test]
fn counting_a_429_allocates_nothing() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let with = metrics::with_local_recorder(&recorder, allowed_and_denied);
    assert_eq!(with, allowed_and_denied(), "as without a recorder");
    assert!(
        handle
            .render()
            .contains(r#"rate_limit_decisions_total{rule="a",outcome="deny"} 101"#),
        "every 429 counted (100 with the warm-up):\n{}",
        handle.render()
    );
}

/// Counting an allowed decision (`outcome="allow"`) into a real recorder,
/// Prometheus's, allocates nothing: its counter was resolved at build.
#[cfg(feature = "metrics")]
#[test]
fn counting_an_allowed_request_allocates_nothing() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // This thread's recorder: the requests run on it, without a runtime.
    let (lean, defaults) = metrics::with_local_recorder(&recorder, || {
        let lean = |rule| {
            RateLimitLayer::builder()
                .rule(rule)
                .headers(HeaderStyle::None)
                .build()
                .unwrap()
        };
        let defaults = |rule| RateLimitLayer::builder().rule(rule).build().unwrap();
        (added(lean, 16), added(defaults, 16))
    });
    assert_eq!((lean, defaults), (0, 3), "as without a recorder");
    assert!(
        handle
            .render()
            .contains(r#"rate_limit_decisions_total{rule="a",outcome="allow"} 202"#),
        "every request counted (2 layers × 101 with the warm-up):\n{}",
        handle.render()
    );
}
