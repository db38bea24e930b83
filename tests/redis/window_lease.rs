//! Leased windows keep their whole quota when gateways go quiet: four
//! gateways on a leased fixed window (300 per second, leases of 50 ms),
//! three of them quiet for 250 ms phases and every one pausing 5 to 45 ms
//! at random, under a load far above the limit. Units a lease did not spend
//! go back to the window they were counted in when the lease ends, so each
//! whole window admits at least 0.95 of its limit, and never more.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::Backend as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use keyed_rate_limit::rule::LeasePolicy;
use keyed_rate_limit::{
    Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule, decision::RateLimitDecision,
    failure::FailureMode,
};
use keyed_rate_limit_testing::RedisServer;
use tower::{ServiceExt, service_fn};

const LIMIT: u32 = 300;
const RUN: Duration = Duration::from_millis(5_500);
/// Each task's most requests: the run is bounded in count as in time.
const MAX_REQUESTS: usize = 20_000;

/// When each admitted request's window ends, as its decision tells it.
type Ends = Arc<Mutex<Vec<Instant>>>;

async fn gateway_task(
    layer: RateLimitLayer,
    gateway: usize,
    task: usize,
    ends: Ends,
    start: Instant,
) {
    let svc = layer.layer(service_fn(move |req: Request<Full<Bytes>>| {
        let ends = ends.clone();
        async move {
            let reset = req
                .extensions()
                .get::<RateLimitDecision>()
                .and_then(|d| d.rules().first().map(|r| r.decision.reset()));
            ends.lock()
                .unwrap()
                .push(Instant::now() + reset.unwrap_or_default());
            Ok::<_, Infallible>(Response::new(Full::<Bytes>::default()))
        }
    }));
    let mut x = ((gateway * 16 + task) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..MAX_REQUESTS {
        let elapsed = start.elapsed();
        if elapsed >= RUN {
            break;
        }
        // Gateways 1 to 3 alternate 250 ms of traffic and 250 ms of quiet,
        // each out of step with the next.
        let phase = (elapsed.as_millis() / 250) as usize;
        if gateway > 0 && (phase + gateway).is_multiple_of(2) {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        // A few at once: the gateway's clients.
        let sends = (0..4).map(|_| {
            let req = Request::get("/")
                .header("x-key", "k")
                .body(Full::default())
                .unwrap();
            svc.clone().oneshot(req)
        });
        for res in futures_util::future::join_all(sends).await {
            let status = res.unwrap().status();
            assert!(status == 200 || status == 429, "{status}");
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // A pause of 5 to 45 ms now and then; otherwise about 1 ms between
        // requests: some 12,000 a second offered against 300.
        let pause = if x.is_multiple_of(10) { 5 + x % 41 } else { 1 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_gateways_strand_no_units_of_a_leased_window() {
    let server = RedisServer::start();
    let mut layers = Vec::new();
    for _ in 0..4 {
        let rule = Rule::new("w", KeyExtractor::header("x-key"), Quota::per_second(LIMIT))
            .global(server.backend("window-lease").await)
            .algorithm(Algorithm::FixedWindow)
            .lease(LeasePolicy::new(Duration::from_millis(50)))
            .redis_timeout(Duration::from_secs(1))
            .on_redis_failure(FailureMode::FailClosed);
        layers.push(
            RateLimitLayer::builder()
                .decision_extension(true)
                .rule(rule)
                .build()
                .unwrap(),
        );
    }
    let ends: Ends = Arc::default();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (gateway, layer) in layers.iter().enumerate() {
        for task in 0..1 {
            let (layer, ends) = (layer.clone(), ends.clone());
            tasks.push(tokio::spawn(gateway_task(
                layer, gateway, task, ends, start,
            )));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    // One window's admissions all tell its end, give or take the round
    // trips: cluster the ends.
    let mut ends = std::mem::take(&mut *ends.lock().unwrap());
    ends.sort();
    let mut windows: Vec<(Instant, u32)> = Vec::new();
    for end in ends {
        match windows.last_mut() {
            Some((first, n)) if end.duration_since(*first) < Duration::from_millis(200) => *n += 1,
            _ => windows.push((end, 1)),
        }
    }
    let counts: Vec<u32> = windows.iter().map(|(_, n)| *n).collect();
    assert!(counts.len() >= 4, "{counts:?}");
    // The first window began with the run and the last one ends after it.
    let whole = &counts[1..counts.len() - 1];
    eprintln!("admitted per window: {counts:?}");
    for n in whole {
        assert!(*n <= LIMIT, "over the limit: {counts:?}");
        assert!(
            f64::from(*n) >= 0.95 * f64::from(LIMIT),
            "units stranded: {counts:?}"
        );
    }
}
